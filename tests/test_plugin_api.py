"""The plugin API through a real router, in memory (conductor.testing)."""

from __future__ import annotations

import functools
import json
import weakref
from typing import TYPE_CHECKING, Any, cast

import anyio
import pytest
from msgspec import Raw

from acp_conductor_proxies.passthrough import Passthrough
from conductor.errors import RpcError
from conductor.jsonrpc.codes import ErrorCode
from conductor.plugins import Proxy, ProxyContext, SessionScope, Side, on, watch
from conductor.testing import ScriptedAgent, open_test_chain, says

if TYPE_CHECKING:
    from conductor.jsonrpc.message import Message, Request
    from conductor.plugins.host import ProxyHost

ODD = (b'{ "sessionId":"session-1",  "prompt":[{"type":"text","text":"caf\\u00e9"}],'
       b'"_meta":{"x":null},"unknown":[1.50, 1e3]}')


async def test_unhandled_traffic_crosses_every_in_process_proxy_byte_identical() -> None:
    agent = ScriptedAgent(replies={"_ext/echo": {"keep": None}})
    async with open_test_chain([Passthrough(), Passthrough(), Passthrough()], agent) as client:
        with anyio.fail_after(5):
            await client.request("session/prompt", Raw(ODD))
            await client.notify("_ext/note", Raw(b'{"a" : [ ]}'))
            answer = await client.request("_ext/echo", Raw(b"[1,2]"))
            await agent.wait_for("_ext/note")
    prompt = next(m for m in agent.received if m.method == "session/prompt")
    assert bytes(prompt.params) == ODD  # type: ignore[arg-type]
    note = next(m for m in agent.received if m.method == "_ext/note")
    assert bytes(note.params) == b'{"a" : [ ]}'  # type: ignore[arg-type]
    assert bytes(answer.result) == b'{"keep":null}'  # type: ignore[arg-type]


class Shout(Proxy):
    """Upper-cases prompts and marks the answer."""

    @on("session/prompt")
    async def prompt(self, ctx: ProxyContext, message: Message) -> object:
        params = message.params_value()
        params["prompt"][0]["text"] = params["prompt"][0]["text"].upper()
        answer = await ctx.forward(message.with_params(params))
        assert answer is not None
        return answer.with_result({**answer.result_value(), "_meta": {"shouted": True}})


async def test_a_handler_changes_what_it_forwards_and_the_answer_it_returns() -> None:
    agent = ScriptedAgent()
    async with open_test_chain([Shout()], agent) as client:
        with anyio.fail_after(5):
            sid = await client.new_session()
            result = await client.prompt(sid, "hello")
    assert agent.received_params("session/prompt")[0]["prompt"][0]["text"] == "HELLO"
    assert result == {"stopReason": "end_turn", "_meta": {"shouted": True}}


class Answers(Proxy):
    """Answers `_ext/ping` itself, after asking the editor a question of its own."""

    @on("_ext/ping")
    async def ping(self, ctx: ProxyContext, message: Message) -> object:
        asked = await ctx.request("_ext/question", {"q": 1}, to="predecessor")
        return {"pong": True, "editor_said": asked.result_value()}


async def test_a_handler_answers_without_forwarding_using_its_own_request_upstream() -> None:
    agent = ScriptedAgent()
    async with open_test_chain([Answers()], agent) as client:
        client.replies["_ext/question"] = {"a": 42}
        with anyio.fail_after(5):
            result = await client.call("_ext/ping", {})
    assert result == {"pong": True, "editor_said": {"a": 42}}
    assert not [m for m in agent.received if m.method == "_ext/ping"]


class Crashes(Proxy):
    """Fails on purpose."""

    @on("session/prompt")
    async def prompt(self, ctx: ProxyContext, message: Message) -> object:
        raise KeyError("boom")

    @on("_ext/refuse")
    async def refuse(self, ctx: ProxyContext, message: Message) -> object:
        raise RpcError(-32042, "not today", {"why": "policy"})


async def test_a_crashing_handler_answers_with_an_error_naming_the_plugin_and_the_chain_lives_on(
) -> None:
    crashes = Crashes()
    crashes.rename("crashy")
    async with open_test_chain([crashes]) as client:
        with anyio.fail_after(5):
            sid = await client.new_session()
            answer = await client.request("session/prompt", {"sessionId": sid, "prompt": []})
            refused = await client.request("_ext/refuse", {})
            still = await client.call("session/new", {"cwd": "/", "mcpServers": []})
    error = answer.error_value()
    assert error["code"] == ErrorCode.HANDLER_FAILED
    assert "crashy" in error["message"] and "KeyError" in error["message"]
    assert error["data"] == {"component": "crashy", "method": "session/prompt"}
    assert refused.error_value() == {"code": -32042, "message": "not today",
                                     "data": {"why": "policy"}}
    assert "sessionId" in still


class ForgetsReturn(Proxy):
    """Forwards the prompt and drops the answer: the `return` is missing."""

    @on("session/prompt")
    async def prompt(self, ctx: ProxyContext, message: Message) -> object:
        await ctx.forward()
        return None

    @on("_ext/nothing")
    async def nothing(self, ctx: ProxyContext, message: Message) -> object:
        return None  # answered without forwarding: null is its answer


async def test_a_request_handler_that_forwards_and_returns_none_is_answered_an_error_saying_so(
) -> None:
    agent = ScriptedAgent(replies={"session/prompt": {"stopReason": "end_turn"}})
    async with open_test_chain([ForgetsReturn()], agent) as client:
        with anyio.fail_after(5):
            sid = await client.new_session()
            answer = await client.request("session/prompt", {"sessionId": sid, "prompt": []})
            nothing = await client.call("_ext/nothing", {})
    error = answer.error_value()
    assert error["code"] == ErrorCode.HANDLER_FAILED
    assert error["data"] == {"component": "forgetsreturn", "method": "session/prompt"}
    assert ("ForgetsReturn.prompt forwarded session/prompt and returned None: return the "
            "answer (`return await ctx.forward()`)") in error["message"]
    assert nothing is None


class AnswersNothing(Proxy):
    """Answers the prompt itself, without forwarding, and forgets to return the result."""

    @on("session/prompt")
    async def prompt(self, ctx: ProxyContext, message: Message) -> object:
        return None


async def test_a_request_handler_that_returns_none_for_an_acp_method_is_answered_an_error(
) -> None:
    # Every ACP method's result is an object: a null answer is a missing `return`, and an
    # editor reading it as a PromptResponse fails without knowing which proxy to blame.
    async with open_test_chain([AnswersNothing()]) as client:
        with anyio.fail_after(5):
            sid = await client.new_session()
            answer = await client.request("session/prompt", {"sessionId": sid, "prompt": []})
    error = answer.error_value()
    assert error["code"] == ErrorCode.HANDLER_FAILED
    assert error["data"] == {"component": "answersnothing", "method": "session/prompt"}
    assert ("AnswersNothing.prompt answered session/prompt with None, and an ACP answer is "
            "an object") in error["message"]


class AnswersWith(Proxy):
    """Answers the prompt itself with whatever it was given."""

    def __init__(self, answer: object) -> None:
        super().__init__()
        self.answer = answer

    @on("session/prompt")
    async def prompt(self, ctx: ProxyContext, message: Message) -> object:
        return self.answer


@pytest.mark.parametrize(("answer", "says"), [
    ("ok", "with a str ('ok')"), (["end_turn"], "with a list (['end_turn'])"),
    (0, "with an int (0)"),
])
async def test_a_request_handler_that_answers_an_acp_method_with_no_object_is_answered_an_error(
        answer: object, says: str) -> None:
    # It reached the editor as the result ("ok"), and `run` blamed the agent's answer.
    async with open_test_chain([AnswersWith(answer)]) as client:
        with anyio.fail_after(5):
            sid = await client.new_session()
            error = (await client.request("session/prompt",
                                          {"sessionId": sid, "prompt": []})).error_value()
    assert error["code"] == ErrorCode.HANDLER_FAILED
    assert error["data"] == {"component": "answerswith", "method": "session/prompt"}
    assert (f"AnswersWith.prompt answered session/prompt {says}, and an ACP answer is an "
            "object: return a dict") in error["message"]


class BrokenHook(Proxy):
    """Its session_opened hook raises."""

    async def session_opened(self, session: SessionScope) -> None:
        raise RuntimeError("hook broke")


async def test_a_failing_session_hook_still_answers_session_new_naming_the_plugin() -> None:
    broken = BrokenHook()
    broken.rename("broken")
    async with open_test_chain([broken]) as client:
        with anyio.fail_after(5):
            answer = await client.request("session/new", {"cwd": "/", "mcpServers": []})
            later = await client.request("_ext/anything", {})
    error = answer.error_value()
    assert error["code"] == ErrorCode.HANDLER_FAILED
    assert error["data"]["component"] == "broken"
    assert "RuntimeError: hook broke" in error["message"]
    assert later.error_value()["code"] == -32601  # the chain lives on (the agent's answer)


async def test_a_session_load_a_failing_hook_refuses_leaves_no_open_request_in_the_proxy(
        ) -> None:
    # The hook runs before the load is passed on: it is answered as failed, and must not stay
    # tracked as open in the proxy's host (its table of open requests would only grow).
    hosts: list[ProxyHost] = []

    class BrokenOnLoad(Proxy):
        async def session_opened(self, session: SessionScope) -> None:
            assert session.host is not None
            hosts.append(session.host)  # type: ignore[arg-type]
            raise RuntimeError("hook broke")

    broken = BrokenOnLoad()
    broken.rename("broken")
    async with open_test_chain([broken]) as client:
        with anyio.fail_after(5):
            answer = await client.request("session/load", {"sessionId": "s-1", "cwd": "/",
                                                           "mcpServers": []})
    assert answer.error_value()["data"]["component"] == "broken"
    assert hosts and hosts[0].endpoint.inbound == {}


class Slow(Proxy):
    """Works locally on one method, forwards another after a pause it can be cancelled in."""

    def __init__(self) -> None:
        super().__init__()
        self.started = anyio.Event()

    @on("_ext/local")
    async def local(self, ctx: ProxyContext, message: Message) -> object:
        ctx.release()  # long work of its own: let the proxy go on dispatching meanwhile
        self.started.set()
        await anyio.sleep_forever()

    @on("_ext/remote")
    async def remote(self, ctx: ProxyContext, message: Message) -> object:
        return await ctx.forward()


async def test_cancelling_a_request_cancels_local_work_or_reaches_the_far_end_once() -> None:
    agent_waiting = anyio.Event()

    async def remote(agent: ScriptedAgent, message: Message) -> object:
        agent_waiting.set()
        await agent.wait_for("$/cancel_request")
        raise RpcError(-32800, "cancelled by the agent")

    agent = ScriptedAgent(replies={"_ext/remote": remote})
    slow = Slow()
    async with open_test_chain([slow], agent) as client:
        with anyio.fail_after(5):
            answers: dict[str, Message] = {}
            async with anyio.create_task_group() as tg:
                async def ask(method: str, ident: int) -> None:
                    answers[method] = await client.request(method, {}, ident=ident)
                tg.start_soon(ask, "_ext/local", 901)
                await slow.started.wait()
                await client.cancel(901)
                tg.start_soon(ask, "_ext/remote", 902)
                await agent_waiting.wait()
                await client.cancel(902)
    assert answers["_ext/local"].error_value()["code"] == -32800
    assert answers["_ext/remote"].error_value()["message"] == "cancelled by the agent"
    cancels = agent.received_params("$/cancel_request")
    assert len(cancels) == 1


# -- session scope ---------------------------------------------------------------------------

class Watcher(Proxy):
    """Counts updates per session with a per-session handler installed when the route is."""

    def __init__(self) -> None:
        super().__init__()
        self.opened: list[tuple[str, str]] = []
        self.counted: list[str] = []  # session ids, one per update the session handler saw

    async def session_opened(self, session: SessionScope) -> None:
        self.opened.append((session.session_id, session.how))
        session.state["updates"] = 0

        async def count(ctx: ProxyContext, message: Message) -> None:
            assert ctx.session is session
            session.state["updates"] += 1
            self.counted.append(session.session_id)
            await ctx.forward()
        session.on("session/update", count)

    async def session_closed(self, session: SessionScope) -> None:
        self.opened.remove((session.session_id, session.how))


def update(sid: str, text: str) -> dict[str, object]:
    return {"sessionId": sid, "update": {"sessionUpdate": "agent_message_chunk",
                                         "content": {"type": "text", "text": text}}}


async def test_an_update_right_after_the_session_new_answer_reaches_the_sessions_handler() -> None:
    async def new_session(agent: ScriptedAgent, message: Message) -> object:
        agent.after_reply("session/update", update("s-fast", "first"))
        agent.after_reply("session/update", update("s-fast", "second"))
        return {"sessionId": "s-fast"}

    watcher = Watcher()
    async with open_test_chain([watcher], ScriptedAgent({"session/new": new_session})) as client:
        with anyio.fail_after(5):
            await client.new_session()
            await client.wait_for("session/update", 2)
        assert watcher.opened == [("s-fast", "session/new")]  # until the chain stops
    assert client.agent_text("s-fast") == "firstsecond"
    assert watcher.counted == ["s-fast", "s-fast"]  # nothing slipped past the route


async def test_updates_replayed_during_session_load_are_routed_before_the_answer() -> None:
    seen_before_answer: list[int] = []
    watcher = Watcher()

    async def load(agent: ScriptedAgent, message: Message) -> object:
        sid = message.params_value()["sessionId"]
        await agent.notify("session/update", update(sid, "old 1 "))
        await agent.notify("session/update", update(sid, "old 2"))
        await client.wait_for("session/update", 2)
        seen_before_answer.append(len(client.received_params("session/update")))
        return None

    async with open_test_chain([watcher], ScriptedAgent({"session/load": load})) as client:
        with anyio.fail_after(5):
            await client.call("session/load", {"sessionId": "s-old", "cwd": "/",
                                               "mcpServers": []})
        assert watcher.opened == [("s-old", "session/load")]
    assert seen_before_answer == [2]
    assert watcher.counted == ["s-old", "s-old"]
    assert client.agent_text("s-old") == "old 1 old 2"


async def test_the_per_session_handler_counts_only_its_sessions_updates_and_close_removes_it(
) -> None:
    counts: dict[str, int] = {}

    class Counting(Watcher):
        async def session_closed(self, session: SessionScope) -> None:
            counts[session.session_id] = session.state["updates"]
            await super().session_closed(session)

    async def prompt(agent: ScriptedAgent, message: Message) -> object:
        sid = message.params_value()["sessionId"]
        for word in ("a", "b", "c")[: 1 if sid == "session-1" else 3]:
            await agent.notify("session/update", update(sid, word))
        return {"stopReason": "end_turn"}

    watcher = Counting()
    async with open_test_chain([watcher], ScriptedAgent({"session/prompt": prompt})) as client:
        with anyio.fail_after(5):
            one, two = await client.new_session(), await client.new_session()
            await client.prompt(one, "x")
            await client.prompt(two, "y")
            await client.wait_for("session/update", 4)
            await client.call("session/close", {"sessionId": one})
            await client.call("session/close", {"sessionId": two})
    assert counts == {"session-1": 1, "session-2": 3}
    assert watcher.opened == []


class KeepsItsOwnAttributes(Proxy):
    """Keeps per-session data as attributes of the scope, and the open scopes in a WeakSet:
    what a plugin could do while `SessionScope` was a plain (unslotted) dataclass."""

    def __init__(self) -> None:
        super().__init__()
        self.live: weakref.WeakSet[SessionScope] = weakref.WeakSet()
        self.seen: list[tuple[str, int]] = []

    async def session_opened(self, session: SessionScope) -> None:
        session.chunks = 0  # type: ignore[attr-defined]
        self.live.add(session)

    @on("session/update", source="successor")
    async def update(self, ctx: ProxyContext, message: Message) -> None:
        assert ctx.session is not None and ctx.session in self.live
        ctx.session.chunks += 1  # type: ignore[attr-defined]
        self.seen.append((ctx.session.session_id, ctx.session.chunks))  # type: ignore[attr-defined]
        await ctx.forward()


async def test_a_plugin_may_keep_its_own_attributes_on_a_session_scope_and_refer_to_it_weakly(
) -> None:
    async def prompt(agent: ScriptedAgent, message: Message) -> object:
        sid = message.params_value()["sessionId"]
        for word in ("a", "b"):
            await agent.notify("session/update", update(sid, word))
        return {"stopReason": "end_turn"}

    proxy = KeepsItsOwnAttributes()
    async with open_test_chain([proxy], ScriptedAgent({"session/prompt": prompt})) as client:
        with anyio.fail_after(5):
            sid = await client.new_session()
            await client.prompt(sid, "x")
            await client.wait_for("session/update", 2)
    assert proxy.seen == [(sid, 1), (sid, 2)]


class Judge(Proxy):
    """Opens its own session downstream and asks it to judge each prompt."""

    def __init__(self) -> None:
        super().__init__()
        self.verdicts: list[str] = []
        self.asked: list[str] = []

    @on("session/prompt")
    async def prompt(self, ctx: ProxyContext, message: Message) -> object:
        judge = await ctx.open_session({"cwd": "/judge", "mcpServers": []})
        heard: list[str] = []

        async def collect(c: ProxyContext, m: Message) -> None:
            heard.append(m.params_value()["update"].get("content", {}).get("text", ""))

        async def permission(c: ProxyContext, m: Message) -> object:
            self.asked.append(m.params_value()["sessionId"])
            return {"outcome": {"outcome": "selected", "optionId": "allow"}}

        judge.on("session/update", collect)
        judge.on("session/request_permission", permission)
        await judge.prompt("is this prompt fine?")
        self.verdicts.append("".join(heard))
        await judge.close()
        return await ctx.forward()


async def test_a_proxy_owned_sub_session_is_never_seen_by_the_editor() -> None:
    async def prompt(agent: ScriptedAgent, message: Message) -> object:
        sid = message.params_value()["sessionId"]
        await agent.notify("session/update", update(sid, f"reply in {sid}"))
        await agent.request("session/request_permission", {
            "sessionId": sid, "toolCall": {"toolCallId": "t", "title": "x"},
            "options": [{"optionId": "allow", "name": "Allow", "kind": "allow_once"}]})
        return {"stopReason": "end_turn"}

    judge = Judge()
    agent = ScriptedAgent({"session/prompt": prompt})
    async with open_test_chain([judge], agent) as client:
        with anyio.fail_after(5):
            sid = await client.new_session()
            await client.prompt(sid, "hello")
    assert judge.verdicts == ["reply in session-2"]
    assert judge.asked == ["session-2"]
    assert client.agent_text() == f"reply in {sid}"
    editor_sessions = {p["sessionId"] for p in client.received_params("session/update")}
    editor_sessions |= {p["sessionId"] for p in client.received_params(
        "session/request_permission")}
    assert editor_sessions == {sid}
    assert agent.received_params("session/close") == [{"sessionId": "session-2"}]


async def test_a_proxy_prompting_its_own_v2_session_gets_the_whole_turn() -> None:
    # v2 answers a prompt when it accepts it: `prompt()` returned then, before the turn
    # said anything, and the judge's verdict was empty.
    judge = Judge()
    agent = ScriptedAgent({"session/prompt": says("looks fine")})
    async with open_test_chain([judge], agent, initialize=False) as client:
        with anyio.fail_after(5):
            await client.initialize(2)
            sid = await client.new_session()
            await client.prompt(sid, "hello")
    assert judge.verdicts == ["looks fine"]
    assert agent.received_params("session/close") == [{"sessionId": "session-2"}]


async def test_two_prompts_a_proxy_sends_its_own_v2_session_both_return_at_its_idle() -> None:
    # One waiting slot a session: the second prompt took the first one's, which then
    # waited for ever though the agent said the session was idle.
    done: list[str] = []

    class TwoAtOnce(Proxy):
        @on("_ext/judge")
        async def judge(self, ctx: ProxyContext, message: Message) -> object:
            scope = await ctx.open_session({"cwd": "/", "mcpServers": []})

            async def one(text: str) -> None:
                await scope.prompt(text)
                done.append(text)
            async with anyio.create_task_group() as tg:
                tg.start_soon(one, "a")
                await anyio.wait_all_tasks_blocked()
                tg.start_soon(one, "b")
            return {}

    async def prompt(agent: ScriptedAgent, message: Message) -> object:
        if len(agent.received_params("session/prompt")) == 2:  # one idle ends both turns
            agent.after_reply("session/update", {
                "sessionId": message.params_value()["sessionId"],  # type: ignore[index]
                "update": {"sessionUpdate": "state_update", "state": "idle",
                           "stopReason": "end_turn"}})
        return {}
    async with open_test_chain([TwoAtOnce()], ScriptedAgent({"session/prompt": prompt}),
                               initialize=False) as client:
        with anyio.fail_after(5):
            await client.initialize(2)
            await client.call("_ext/judge", {})
    assert sorted(done) == ["a", "b"]


async def test_typed_views_read_params_through_the_acp_sdk_models() -> None:
    from acp.schema import PromptRequest

    seen: list[PromptRequest] = []

    class Typed(Proxy):
        @on("session/prompt")
        async def prompt(self, ctx: ProxyContext, message: Message) -> object:
            seen.append(message.params_as(PromptRequest))
            return await ctx.forward()

    agent = ScriptedAgent()
    async with open_test_chain([Typed()], agent) as client:
        with anyio.fail_after(5):
            await client.request("session/prompt", Raw(ODD))
    assert seen[0].session_id == "session-1"
    prompt = next(m for m in agent.received if m.method == "session/prompt")
    assert bytes(prompt.params) == ODD  # type: ignore[arg-type]


def test_handlers_must_be_async() -> None:
    with pytest.raises(TypeError, match="async def"):
        class Bad(Proxy):
            @on("session/prompt")
            def prompt(self, ctx: ProxyContext, message: Message) -> None:  # type: ignore[misc]
                pass


@pytest.mark.parametrize(("method", "source", "says"), [
    ("session/promt", "predecessor",
     "@on('session/promt') on Typo.handler: not an ACP method (did you mean 'session/prompt'?"),
    ("session/update", "predecessor",
     "@on('session/update') on Typo.handler: session/update comes from the successor "
     "(the agent side): write @on('session/update', source='successor')"),
    ("session/prompt", "successor",
     "@on('session/prompt', source='successor') on Typo.handler: session/prompt comes from "
     "the predecessor (the editor side): write @on('session/prompt')"),
])
def test_a_handler_for_a_method_that_never_arrives_from_its_side_is_warned_about_where_written(
        method: str, source: str, says: str) -> None:
    with pytest.warns(UserWarning, match="never be called") as caught:
        class Typo(Proxy):
            @on(method, source=source)
            async def handler(self, ctx: ProxyContext, message: Message) -> object:
                return None
    (warning,) = caught
    assert says in str(warning.message) and "never be called" in str(warning.message)
    assert warning.filename == __file__


@pytest.mark.parametrize(("method", "source", "says"), [
    ("session/prompt", "successor",
     "session.on('session/prompt', ...): session/prompt comes from the predecessor (the "
     "editor side): write session.on('session/prompt', handler, source='predecessor')"),
    ("session/update", "predecessor",
     "session.on('session/update', ..., source='predecessor'): session/update comes from "
     "the successor (the agent side): write session.on('session/update', handler)"),
    ("session/updte", "successor",
     "session.on('session/updte', ...): not an ACP method (did you mean 'session/update'?"),
])
def test_a_per_session_handler_that_never_arrives_is_warned_about_as_at_on(
        method: str, source: str, says: str) -> None:
    # `session.on` defaults to the successor, `@on` to the predecessor: the easy mistake
    # (a per-session prompt handler) must not be silent where the decorator warns.
    scope = SessionScope("s-1", "session/new", owned=False)

    async def handler(ctx: ProxyContext, message: Message) -> None:
        pass
    with pytest.warns(UserWarning, match="never be called") as caught:
        scope.on(method, handler, source=source)
    assert says in str(caught[0].message)
    assert caught[0].filename == __file__  # at the line that registers it


def test_on_written_without_its_method_is_an_error_where_written() -> None:
    # `@on` bare made the handler the decorator's inner function: never called, silently.
    with pytest.raises(TypeError, match=r"@on needs the method it handles: "
                                        r"@on\("):
        class Bare(Proxy):
            @on  # type: ignore[arg-type]
            async def handler(self, ctx: ProxyContext, message: Message) -> object:
                return None
    with pytest.raises(TypeError, match=r"@watch needs the method it watches"):
        watch(["session/update"])  # type: ignore[arg-type]


@pytest.mark.parametrize("register", [
    lambda: on("session/prompt", source="agent"),
    lambda: watch("session/update", source="agent"),
])
def test_a_source_that_is_no_side_says_which_sides_there_are(register: Any) -> None:
    # It was "'agent' is not a valid Side", naming neither the argument nor the choices.
    with pytest.raises(ValueError, match="'agent' is not a side: use 'predecessor' "
                                         r"\(the editor side\) or 'successor'"):
        register()


def test_two_handlers_in_one_class_for_the_same_method_are_warned_about() -> None:
    # The later one silently won: the first was never called.
    with pytest.warns(UserWarning, match="Twice: @on\\('session/prompt'\\) marks both "
                                         "first and second; only second is called"):
        class Twice(Proxy):
            @on("session/prompt")
            async def first(self, ctx: ProxyContext, message: Message) -> object:
                return None

            @on("session/prompt")
            async def second(self, ctx: ProxyContext, message: Message) -> object:
                return None


def test_handlers_for_acp_extension_and_wildcard_methods_are_not_warned_about() -> None:
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("error")

        class Fine(Proxy):
            @on("session/prompt")
            @on("_ext/mine")
            @on("*", source="successor")
            @on("session/request_permission", source="successor")
            @on("mcp/message", source="successor")
            @on("mcp/message")
            async def handler(self, ctx: ProxyContext, message: Message) -> object:
                return None


def test_the_methods_the_warning_knows_include_every_one_the_acp_sdk_names() -> None:
    from acp.meta import AGENT_METHODS, CLIENT_METHODS

    from conductor import acp as ours

    assert set(AGENT_METHODS.values()) <= ours.AGENT_METHODS
    assert set(CLIENT_METHODS.values()) <= ours.CLIENT_METHODS


class HopRecorder:
    """A TraceSink that keeps (hop, direction, method) for every message."""

    def __init__(self) -> None:
        self.seen: list[tuple[str, str, object]] = []

    def message(self, hop: str, direction: str, message: Message | list[Message], *,
                peer: str | None = None, origin: object = None) -> None:
        for one in message if isinstance(message, list) else [message]:
            self.seen.append((hop, direction, getattr(one, "method", None)))

    def lifecycle(self, component: str, event: str, **fields: object) -> None:
        pass

    def hops_for(self, method: str) -> set[str]:
        return {hop for hop, _, m in self.seen if m == method}


class PromptCounter(Proxy):
    """Handles prompts only; everything else is none of its business."""

    def __init__(self) -> None:
        super().__init__()
        self.prompts = 0

    @on("session/prompt")
    async def prompt(self, ctx: ProxyContext, message: Message) -> object:
        self.prompts += 1
        return await ctx.forward()


async def test_traffic_an_in_process_proxy_has_no_handler_for_is_routed_past_it_unchanged(
) -> None:
    async def prompt(agent: ScriptedAgent, message: Message) -> object:
        await agent.notify("session/update", update("session-1", "hi"))
        return {"stopReason": "end_turn"}

    counter, trace = PromptCounter(), HopRecorder()
    async with open_test_chain([counter, Passthrough()],
                               ScriptedAgent({"session/prompt": prompt}),
                               tracer=trace) as client:
        with anyio.fail_after(5):
            sid = await client.new_session()
            answer = await client.prompt(sid, "hello")
    assert answer == {"stopReason": "end_turn"}
    assert client.agent_text(sid) == "hi"
    assert counter.prompts == 1
    # The prompt visits the proxy that handles it; the passthrough is routed past. The update
    # crosses only the hops it must: no in-process proxy handles it.
    assert trace.hops_for("session/update") == {"agent", "client"}
    assert trace.hops_for("session/prompt") == {"client", "promptcounter", "agent"}
    assert "passthrough" in trace.hops_for("session/new")  # set-up always visits


class HoldsPermissions(Proxy):
    """Holds every permission request until `gate` opens, without releasing dispatch."""

    def __init__(self) -> None:
        super().__init__()
        self.gate = anyio.Event()

    @on("session/request_permission", source="successor")
    async def permission(self, ctx: ProxyContext, message: Message) -> object:
        await self.gate.wait()
        return await ctx.forward()


async def test_a_message_routed_past_a_proxy_never_overtakes_one_it_is_still_handling() -> None:
    holder = HoldsPermissions()

    async def prompt(agent: ScriptedAgent, message: Message) -> object:
        assert agent.tg is not None
        agent.tg.start_soon(agent.request, "session/request_permission",
                            {"sessionId": "session-1", "toolCall": {"toolCallId": "t"},
                             "options": []})
        await anyio.wait_all_tasks_blocked()
        await agent.notify("session/update", update("session-1", "after"))
        return {"stopReason": "end_turn"}

    client_replies = {"session/request_permission": {"outcome": {"outcome": "cancelled"}}}
    from conductor.testing import TestClient

    async with open_test_chain([holder], ScriptedAgent({"session/prompt": prompt}),
                               client=TestClient(client_replies)) as client:
        with anyio.fail_after(5):
            sid = await client.new_session()
            async with anyio.create_task_group() as tg:
                tg.start_soon(client.prompt, sid, "go")
                await anyio.wait_all_tasks_blocked()
                # The proxy still holds the permission request: the update must wait behind it.
                assert client.received_params("session/update") == []
                holder.gate.set()
            await client.wait_for("session/update")
    order = [m.method for m in client.received
             if m.method in ("session/request_permission", "session/update")]
    assert order == ["session/request_permission", "session/update"]


async def test_a_stand_alone_proxy_answers_requests_it_cannot_read_by_id() -> None:
    from conductor.plugins.host import serve_proxy
    from conductor.transport.memory import memory_pipe

    to_proxy, proxy_in = memory_pipe()
    proxy_out, from_proxy = memory_pipe()
    deep = b"[" * 5000 + b"]" * 5000
    with anyio.fail_after(5):
        async with to_proxy, proxy_in, proxy_out, from_proxy, anyio.create_task_group() as tg:
            tg.start_soon(lambda: serve_proxy(Passthrough(), proxy_in, proxy_out,
                                              max_frame_bytes=65536))
            await to_proxy.send(b'{"jsonrpc":"2.0","method":"x","params":' + deep
                                + b',"id":"deep"}\n')
            await to_proxy.send(b'{"jsonrpc":"2.0","method":"x","params":{"d":"'
                                + b"o" * 100_000 + b'"},"id":"big"}\n')
            await to_proxy.send(b'{"jsonrpc":"2.0","id":"bad","method":"x","params":"\xff"}\n')
            out = b""
            while out.count(b"\n") < 3:  # writes may be coalesced: count lines, not chunks
                out += await from_proxy.receive()
            answers = [json.loads(line) for line in out.splitlines()]
            tg.cancel_scope.cancel()
    assert [(a["id"], a["error"]["code"]) for a in answers] == [
        ("deep", -32600), ("big", ErrorCode.FRAME_TOO_LARGE), ("bad", -32700)]


class PeerRecorder:
    """A TraceSink that keeps (hop, direction, method, peer) for every message."""

    def __init__(self) -> None:
        self.seen: list[tuple[str, str, object, str | None]] = []

    def message(self, hop: str, direction: str, message: Message | list[Message], *,
                peer: str | None = None, origin: object = None) -> None:
        for one in message if isinstance(message, list) else [message]:
            self.seen.append((hop, direction, getattr(one, "method", None), peer))

    def lifecycle(self, component: str, event: str, **fields: object) -> None:
        pass


async def test_a_cancel_an_in_process_proxy_sends_is_traced_to_the_proxy_after_it() -> None:
    # Issue 10: the trace said `redact -> permissions` for a cancel that went to transcript.
    never = anyio.Event()

    async def hang(agent: ScriptedAgent, message: Message) -> object:
        await never.wait()
        return None

    from conductor.testing import TestClient

    proxies = [PromptCounter(), PromptCounter(), PromptCounter()]
    for proxy, name in zip(proxies, ("permissions", "redact", "transcript"), strict=True):
        proxy.rename(name)
    agent, trace = ScriptedAgent({"session/prompt": hang}), PeerRecorder()
    async with open_test_chain(proxies, agent, client=TestClient(timeout=0.3),
                               tracer=trace) as client:
        with anyio.fail_after(5):
            sid = await client.new_session()
            with pytest.raises(TimeoutError):  # the client gives up and cancels the prompt
                await client.prompt(sid, "hello")
            await agent.wait_for("$/cancel_request")
    sent = {hop: peer for hop, direction, method, peer in trace.seen
            if method == "$/cancel_request" and direction == "in"}
    assert sent == {"client": "permissions", "permissions": "redact",
                    "redact": "transcript", "transcript": "agent"}
    assert len(agent.received_params("$/cancel_request")) == 1


@pytest.mark.parametrize("line", [
    b'{"jsonrpc":"2.0","id":"c","method":"$/cancel_request","params":{"requestId":1}}\n',
    b'{"jsonrpc":"2.0","id":"c","method":"_proxy/successor","params":'
    b'{"method":"$/cancel_request","params":{"requestId":1}}}\n'])
async def test_a_stand_alone_proxy_answers_a_cancel_sent_as_a_request(line: bytes) -> None:
    # `$/cancel_request` is a notification; sent with an id, nobody else would answer it.
    from conductor.plugins.host import serve_proxy
    from conductor.transport.memory import memory_pipe

    to_proxy, proxy_in = memory_pipe()
    proxy_out, from_proxy = memory_pipe()
    with anyio.fail_after(5):
        async with to_proxy, proxy_in, proxy_out, from_proxy, anyio.create_task_group() as tg:
            tg.start_soon(serve_proxy, Passthrough(), proxy_in, proxy_out)
            await to_proxy.send(line)
            out = b""
            while not out.endswith(b"\n"):
                out += await from_proxy.receive()
            tg.cancel_scope.cancel()
    answer = json.loads(out)
    assert (answer["id"], answer["error"]["code"]) == ("c", -32600)
    assert "notification" in answer["error"]["data"]


class Pretty(Proxy):
    """Answers, and forwards, JSON it wrote pretty: line breaks between its members."""

    @on("_ext/pretty")
    async def pretty(self, ctx: ProxyContext, message: Request) -> object:
        return Raw(json.dumps({"a": [1, 2], "b": "x"}, indent=2).encode())

    @on("_ext/forward-pretty")
    async def forward_pretty(self, ctx: ProxyContext, message: Request) -> object:
        return await ctx.request("_ext/forward-pretty", Raw(b'{\r\n  "q": 1\n}'))


async def test_a_payload_a_plugin_wrote_over_several_lines_crosses_a_line_framed_hop_whole(
        ) -> None:
    # JSON allows line breaks as whitespace, but one on a stdio hop would cut the frame in
    # two (two unreadable lines, and an asker waiting for ever).
    agent = ScriptedAgent({"_ext/forward-pretty": lambda agent, message: _echo(message)})
    async with open_test_chain([Pretty()], agent, transport="pipes") as client:
        with anyio.fail_after(5):
            assert await client.call("_ext/pretty") == {"a": [1, 2], "b": "x"}
            assert await client.call("_ext/forward-pretty") == {"q": 1}


async def _echo(message: Request) -> object:
    return message.params_value()


class Unawaited(Proxy):
    """Returns what it forgot to await: `return ctx.forward()`."""

    @on("_ext/forgot")
    async def forgot(self, ctx: ProxyContext, message: Request) -> object:
        return ctx.forward()


async def test_a_handler_that_returns_an_unawaited_coroutine_is_told_it_forgot_await(
        ) -> None:
    # It was "TypeError: Encoding objects of type coroutine is unsupported", and the
    # coroutine, never awaited nor closed, a RuntimeWarning that fails a pytest run.
    async with open_test_chain([Unawaited()], ScriptedAgent()) as client:
        with anyio.fail_after(5), pytest.raises(RpcError) as failed:
            await client.call("_ext/forgot")
    assert failed.value.code == ErrorCode.HANDLER_FAILED
    assert "unawaited" in failed.value.message
    assert "missing `await`" in failed.value.message


class ScalarParams(Proxy):
    """Sends its own messages with params JSON-RPC does not allow (a string, a number)."""

    @on("_ext/go")
    async def go(self, ctx: ProxyContext, message: Request) -> object:
        to = message.params_value()["to"]
        try:
            await ctx.notify("_ext/note", "hello", to=to)
        except TypeError as e:
            return {"refused": str(e)}
        return {"sent": True}


@pytest.mark.parametrize("to", ["predecessor", "successor"])
async def test_own_params_that_are_neither_object_nor_array_are_refused_at_the_call(
        to: str) -> None:
    # Toward the editor it went out as is (a message JSON-RPC forbids); toward the agent
    # the conductor dropped it with a warning while the handler carried on as if sent.
    agent = ScriptedAgent()
    async with open_test_chain([ScalarParams()], agent) as client:
        with anyio.fail_after(5):
            answer = await client.call("_ext/go", {"to": to})
    assert answer == {"refused": "params must be an object or an array (JSON-RPC), "
                                 "not 'hello'"}
    assert "_ext/note" not in client.received_methods() + agent.received_methods()


class ForwardsOdd(Proxy):
    """Forwards a changed copy with scalar params, or something that is not a message."""

    @on("_ext/scalar")
    async def scalar(self, ctx: ProxyContext, message: Request) -> object:
        return await ctx.forward(message.with_params("hello"))

    @on("_ext/text")
    async def text(self, ctx: ProxyContext, message: Request) -> object:
        return await ctx.forward("hello")  # type: ignore[arg-type]


async def test_forwarding_params_neither_object_nor_array_or_a_non_message_names_the_mistake(
        ) -> None:
    # The scalar copy was sent as is (the conductor refused it as a malformed envelope,
    # the handler saw an unexplained -32602); a str, "'str' object has no attribute 'method'".
    agent = ScriptedAgent()
    async with open_test_chain([ForwardsOdd()], agent) as client:
        with anyio.fail_after(5):
            for method, says in [
                    ("_ext/scalar", "params must be an object or an array (JSON-RPC), not "),
                    ("_ext/text", "ctx.forward() takes the message to forward (a Request "
                                  "or Notification), not 'hello'")]:
                with pytest.raises(RpcError) as failed:
                    await client.call(method, {})
                assert failed.value.code == ErrorCode.HANDLER_FAILED
                assert says in failed.value.message
    assert not [m for m in agent.received if m.method.startswith("_ext/")]


class NotJson(Proxy):
    """Answers, and notifies the editor, with a Raw that is not JSON (a plugin's typo)."""

    @on("_ext/answer")
    async def answer(self, ctx: ProxyContext, message: Request) -> object:
        return Raw(b'{"a": 1')

    @on("_ext/notify")
    async def notify(self, ctx: ProxyContext, message: Request) -> object:
        await ctx.notify("_ext/note", Raw(b"not json"), to="predecessor")
        return {}


async def test_a_raw_payload_a_plugin_wrote_that_is_not_json_is_an_error_naming_the_proxy(
        ) -> None:
    # Raw is sent as is: unchecked, it reached the editor as a frame it cannot read (and
    # the request it answered was never answered).
    async with open_test_chain([NotJson()], ScriptedAgent(), transport="pipes") as client:
        with anyio.fail_after(5):
            for method in ("_ext/answer", "_ext/notify"):
                with pytest.raises(RpcError) as failed:
                    await client.call(method)
                assert failed.value.code == ErrorCode.HANDLER_FAILED
                assert "notjson" in failed.value.message
                assert "not JSON" in failed.value.message
    assert not [m for m in client.received if m.method == "_ext/note"]


async def test_a_stand_alone_proxy_initialized_in_the_legacy_dialect_accepts_the_proxy_role(
        ) -> None:
    # @thinkwell/conductor initializes proxies with `initialize` + `_meta.proxy: true` and
    # fails the editor's initialize unless the proxy's answer says `_meta.proxy: true` too.
    from conductor.plugins.host import serve_proxy
    from conductor.transport.memory import memory_pipe

    to_proxy, proxy_in = memory_pipe()
    proxy_out, from_proxy = memory_pipe()

    async def line() -> dict[str, Any]:
        return cast("dict[str, Any]", json.loads(await from_proxy.receive()))

    with anyio.fail_after(5):
        async with to_proxy, proxy_in, proxy_out, from_proxy, anyio.create_task_group() as tg:
            tg.start_soon(serve_proxy, Passthrough(), proxy_in, proxy_out)
            await to_proxy.send(b'{"jsonrpc":"2.0","id":7,"method":"initialize","params":'
                                b'{"protocolVersion":1,"_meta":{"proxy":true}}}\n')
            wrapped = await line()
            assert wrapped["method"] == "_proxy/successor/request"
            await to_proxy.send(json.dumps({
                "jsonrpc": "2.0", "id": wrapped["id"],
                "result": {"protocolVersion": 1, "_meta": {"x": 1}}}).encode() + b"\n")
            answer = await line()
            tg.cancel_scope.cancel()
    assert answer["id"] == 7
    assert answer["result"] == {"protocolVersion": 1, "_meta": {"x": 1, "proxy": True}}


@pytest.mark.parametrize(("decorate", "define", "says"), [
    (on("session/prompt"), "async def prompt(self, ctx): ...",
     "handler Bad.prompt for session/prompt takes (self, ctx, message), not (self, ctx): "
     "write `async def prompt(self, ctx, message)`"),
    (on("session/prompt"), "async def prompt(self, message): ...",
     "takes (self, ctx, message), not (self, message)"),
    (on("session/prompt"), "async def prompt(self, ctx, message, extra): ...",
     "takes (self, ctx, message), not (self, ctx, message, extra)"),
    (watch("session/update", source="successor"), "def seen(self, message): ...",
     "watcher Bad.seen for session/update takes (self, ctx, message), not (self, message): "
     "write `def seen(self, ctx, message)`"),
])
def test_a_handler_with_the_wrong_parameters_is_an_error_where_written(
        decorate: Any, define: str, says: str) -> None:
    # It was a TypeError at the first message ("takes 2 positional arguments but 3 were
    # given"), answered to the editor, and `acp-conductor check` found nothing wrong.
    namespace: dict[str, Any] = {}
    exec(define, namespace)  # the function as a newcomer writes it
    func = next(v for k, v in namespace.items() if k != "__builtins__")
    func.__qualname__ = f"Bad.{func.__name__}"
    with pytest.raises(TypeError) as caught:
        decorate(func)
    assert says in str(caught.value)


def test_handlers_taking_extra_arguments_with_defaults_or_star_args_are_accepted() -> None:
    class Fine(Proxy):
        @on("session/prompt")
        async def prompt(self, ctx: ProxyContext, message: Message, extra: int = 0) -> object:
            return await ctx.forward()

        @on("session/cancel")
        async def cancel(self, *args: Any) -> None:
            pass
    assert set(Fine().handlers()) == {(Side.PREDECESSOR, "session/prompt"),
                                      (Side.PREDECESSOR, "session/cancel")}


def test_a_proxy_whose_init_forgets_super_init_is_refused_when_made_saying_so() -> None:
    # It was an AttributeError ('_Proxy__options') at its first message, or its options
    # silently unread: `acp-conductor check` passed, the turn failed.
    class Forgetful(Proxy):
        def __init__(self, options: Any = None) -> None:
            self.count = 0

    class Careful(Forgetful):
        def __init__(self, options: Any = None) -> None:
            Proxy.__init__(self, options)

    with pytest.raises(TypeError, match=r"Forgetful.__init__ \(.*test_plugin_api.py, line "
                       r"\d+\) did not call super\(\).__init__\(options\): add it"):
        Forgetful()
    assert Careful().options is not None

    class Base(Proxy):
        def __init__(self) -> None:
            self.ready = True

    class CallsBaseFirst(Base):  # Base's __init__, then Proxy's: the outermost one's to check
        def __init__(self, options: Any = None) -> None:
            Base.__init__(self)
            Proxy.__init__(self, options)

    assert CallsBaseFirst().ready


def test_a_session_handler_given_as_a_lambda_or_through_a_plain_decorator_is_taken() -> None:
    # The check for `async def` refused both, though each is awaited as it should be.
    def logged(handler: Any) -> Any:
        @functools.wraps(handler)
        def wrapper(*args: Any) -> Any:
            return handler(*args)
        return wrapper

    async def collect(ctx: Any, message: Any) -> None:
        pass
    session = SessionScope("s", "session/new", owned=False)
    session.on("session/update", lambda ctx, message: collect(ctx, message))
    session.on("session/update", logged(collect))
    with pytest.raises(TypeError, match="the handler must be `async def`"):
        session.on("session/update", lambda_free_plain_def)


def lambda_free_plain_def(ctx: Any, message: Any) -> None:
    """A handler a newcomer writes without `async`: still refused."""


@pytest.mark.parametrize(("define", "says"), [
    ("def session_opened(self, session): ...",
     "Bad.session_opened must be `async def session_opened(self, session)`: the conductor "
     "awaits it"),
    ("def chain_started(self): ...",
     "Bad.chain_started must be `async def chain_started(self)`"),
    ("async def session_closed(self): ...",
     "Bad.session_closed must be `async def session_closed(self, session)`"),
    ("async def chain_stopped(self, reason): ...",
     "Bad.chain_stopped must be `async def chain_stopped(self)`"),
])
def test_a_hook_that_is_not_async_or_takes_other_parameters_is_an_error_where_defined(
        define: str, says: str) -> None:
    # It failed at the hook's moment ("object NoneType can't be used in 'await'
    # expression", "takes 1 positional argument but 2 were given"): at the first session.
    namespace: dict[str, Any] = {}
    exec(define, namespace)  # the hook as a newcomer writes it
    hook = next(v for k, v in namespace.items() if k != "__builtins__")
    with pytest.raises(TypeError) as caught:
        type("Bad", (Proxy,), {hook.__name__: hook})
    assert says in str(caught.value)


def test_a_per_session_handler_that_is_not_async_or_takes_other_parameters_is_refused_at_the_call(
) -> None:
    # As at `@on`: it failed at the session's first update, answered as the proxy's failure.
    scope = SessionScope("s-1", "session/new", owned=False)

    def plain(ctx: ProxyContext, message: Message) -> None:
        pass

    async def one(message: Message) -> None:
        pass

    with pytest.raises(TypeError, match=r"session.on\('session/update', plain\): the handler "
                                        r"must be `async def`, called with \(ctx, message\)"):
        scope.on("session/update", plain)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match=r"session.on\('session/update', one\): the handler is "
                                        r"called with \(ctx, message\), not \(message\)"):
        scope.on("session/update", one)  # type: ignore[arg-type]
    assert scope.handlers == {}


def test_a_hook_wrapped_by_a_decorator_of_the_authors_is_accepted() -> None:
    import functools

    def traced(hook: Any) -> Any:
        @functools.wraps(hook)
        def wrapper(*args: Any) -> Any:
            return hook(*args)  # the coroutine, awaited by the conductor
        return wrapper

    class Traced(Proxy):
        @traced
        async def session_opened(self, session: SessionScope) -> None:
            pass
    assert Traced.session_opened.__wrapped__  # type: ignore[attr-defined]
