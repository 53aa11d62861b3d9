"""request_timeout and prompt_timeout: nobody waits forever for a component that is stuck.

Driven in memory through the real router; the timeouts are a fraction of a second and every
wait is for an event (the answer), bounded by fail_after.
"""

from __future__ import annotations

import gc
import tracemalloc
from typing import TYPE_CHECKING

import anyio
from msgspec import Raw

from conductor.jsonrpc.codes import ErrorCode
from conductor.jsonrpc.message import Batch, Message, Response, decode
from conductor.plugins import Proxy, ProxyContext, on
from conductor.plugins.host import INBOX_SIZE
from conductor.routing.chain import Chain
from conductor.routing.deadlines import Deadlines, Timeouts
from conductor.routing.roles import Role
from conductor.routing.topology import ComponentLink, Hop
from conductor.rpc.endpoint import Endpoint
from conductor.testing import ScriptedAgent, TestClient, open_test_chain

if TYPE_CHECKING:
    from conductor.jsonrpc.message import Request
    from conductor.transport.base import Incoming

# What must fire fires at this; it also bounds the initialize the chain starts with, which a
# loaded machine's event loop must never miss (0.1 s once did, under a full suite).
TIMEOUT = 0.5


class CountingClient(TestClient):
    """Counts every answer that arrives, by id: each request must get exactly one."""

    def __init__(self) -> None:
        super().__init__()
        self.answers: dict[bytes, int] = {}

    async def deliver(self, item: Incoming) -> None:
        for message in item.items if isinstance(item, Batch) else [item]:
            if isinstance(message, Response):
                key = bytes(message.id)
                self.answers[key] = self.answers.get(key, 0) + 1
        await super().deliver(item)


async def hang(agent: ScriptedAgent, message: Request) -> object:
    await anyio.sleep_forever()  # until cancelled by $/cancel_request
    raise AssertionError("unreachable")


def error_of(answer: Response) -> dict[str, object]:
    error = answer.error_value()
    assert isinstance(error, dict)
    return error


async def test_a_request_the_agent_never_answers_gets_a_timeout_naming_it_and_is_cancelled(
) -> None:
    agent = ScriptedAgent({"session/new": hang})
    client = CountingClient()
    async with open_test_chain([], agent, client=client, initialize=False,
                               timeouts=Timeouts(request=TIMEOUT)) as client:
        with anyio.fail_after(5):
            await client.initialize(2)  # $/cancel_request is in v2's stable protocol
            answer = await client.request("session/new", {"cwd": "/", "mcpServers": []})
            await agent.wait_for("$/cancel_request")
    error = error_of(answer)
    assert error["code"] == ErrorCode.REQUEST_TIMEOUT
    assert error["message"] == f"agent did not answer session/new within {TIMEOUT:g}s"
    assert error["data"] == {"component": "agent", "method": "session/new", "timeout": TIMEOUT}
    asked = next(m for m in agent.received if m.method == "session/new")
    assert agent.received_params("$/cancel_request") == [
        {"requestId": int(bytes(asked.id))}]
    assert set(client.answers.values()) == {1}  # the agent's late -32800 never arrives


async def test_a_v1_agent_is_not_sent_a_cancel_request_for_a_request_it_never_answered(
) -> None:
    # v1 lets a peer ignore $/cancel_request (a `$/` notification), and the SDKs' v1 agents
    # print a traceback for it (issue 10.13): the request is answered for it, nothing more.
    agent = ScriptedAgent({"session/new": hang})
    async with open_test_chain([], agent, timeouts=Timeouts(request=TIMEOUT)) as client:
        with anyio.fail_after(5):
            answer = await client.request("session/new", {"cwd": "/", "mcpServers": []})
            await anyio.wait_all_tasks_blocked()  # the cancel would be written by now
    assert error_of(answer)["code"] == ErrorCode.REQUEST_TIMEOUT
    assert agent.received_params("$/cancel_request") == []


class Forwarding(Proxy):
    """Handles session/new by forwarding it (so the router cannot route past it)."""

    @on("session/new")
    async def new(self, ctx: ProxyContext, message: Request) -> object:
        return await ctx.forward()


class Holding(Proxy):
    """Never answers session/new."""

    @on("session/new")
    async def new(self, ctx: ProxyContext, message: Request) -> object:
        await anyio.sleep_forever()
        raise AssertionError("unreachable")


async def test_behind_a_proxy_the_timeout_names_the_agent_that_holds_the_request() -> None:
    agent = ScriptedAgent({"session/new": hang})
    async with open_test_chain([Forwarding()], agent, timeouts=Timeouts(request=0.4)) as client:
        with anyio.fail_after(5):
            answer = await client.request("session/new", {"cwd": "/", "mcpServers": []})
    assert error_of(answer)["data"] == {"component": "agent", "method": "session/new",
                                        "timeout": 0.4}


async def test_a_proxy_that_holds_a_request_itself_is_the_one_named() -> None:
    holding = Holding()
    holding.rename("holder")
    async with open_test_chain([holding], timeouts=Timeouts(request=TIMEOUT)) as client:
        with anyio.fail_after(5):
            answer = await client.request("session/new", {"cwd": "/", "mcpServers": []})
    error = error_of(answer)
    assert error["code"] == ErrorCode.REQUEST_TIMEOUT
    assert error["message"] == f"holder did not answer session/new within {TIMEOUT:g}s"


async def test_a_turn_past_prompt_timeout_is_answered_and_the_agent_gets_only_session_cancel(
) -> None:
    # ACP's turn cancel is what every agent understands; $/cancel_request is not in v1's
    # stable protocol and SDK agents print a traceback for it (issue 10.13).
    agent = ScriptedAgent({"session/prompt": hang})
    async with open_test_chain([], agent, timeouts=Timeouts(prompt=0.1)) as client:
        with anyio.fail_after(5):
            sid = await client.new_session()
            answer = await client.request("session/prompt", {
                "sessionId": sid, "prompt": [{"type": "text", "text": "hi"}]})
            await agent.wait_for("session/cancel")
    assert error_of(answer)["message"] == "agent did not answer session/prompt within 0.1s"
    assert agent.received_params("session/cancel") == [{"sessionId": sid}]
    assert agent.received_params("$/cancel_request") == []


async def test_request_timeout_leaves_turns_and_requests_to_the_editor_alone() -> None:
    """A turn outlives request_timeout, and so does the permission request inside it:
    the turn waits for a session/new sent after it to time out first."""
    new_timed_out = anyio.Event()

    async def prompt(agent: ScriptedAgent, message: Request) -> object:
        asked = await agent.request("session/request_permission", {
            "sessionId": message.params_value()["sessionId"], "toolCall": {"toolCallId": "t"},
            "options": [{"optionId": "allow", "name": "Allow", "kind": "allow_once"}]})
        assert not asked.is_error
        return {"stopReason": "end_turn"}

    async def permission(message: Request) -> object:
        await new_timed_out.wait()
        return {"outcome": {"outcome": "selected", "optionId": "allow"}}

    async def new_session(agent: ScriptedAgent, message: Request) -> object:
        if message.params_value()["cwd"] == "/hang":
            await anyio.sleep_forever()
        return {"sessionId": "s1"}

    agent = ScriptedAgent({"session/prompt": prompt, "session/new": new_session})
    client = TestClient({"session/request_permission": permission})
    async with open_test_chain([], agent, client=client,
                               timeouts=Timeouts(request=TIMEOUT)) as client:
        with anyio.fail_after(5):
            sid = await client.new_session()
            async with anyio.create_task_group() as tg:
                result: list[object] = []

                async def turn() -> None:
                    result.append(await client.prompt(sid, "hi"))
                tg.start_soon(turn)
                await client.wait_for("session/request_permission")
                late = await client.request("session/new", {"cwd": "/hang", "mcpServers": []})
                assert error_of(late)["code"] == ErrorCode.REQUEST_TIMEOUT
                new_timed_out.set()
    assert result == [{"stopReason": "end_turn"}]


class FakeHop(Endpoint):
    def __init__(self) -> None:
        super().__init__("agent", sink=None)  # type: ignore[arg-type]  # never sends


def test_answered_requests_do_not_pile_up_in_the_deadline_heap() -> None:
    hop = FakeHop()
    deadlines = Deadlines(Timeouts(request=600))
    for _ in range(10_000):
        outgoing, _request = hop.open_request("session/new")
        deadlines.add(hop, outgoing, prompt=False, after=0)  # type: ignore[arg-type]
        hop.take(outgoing.id)  # answered at once
    assert len(deadlines) <= 1025
    assert deadlines.due() == []


class Downgrading(Proxy):
    """Speaks v2 to its editor and v1 to the agent (a version adapter)."""

    @on("initialize")
    async def initialize(self, ctx: ProxyContext, message: Request) -> object:
        params = message.params_value()
        assert isinstance(params, dict)
        answer = await ctx.forward(message.with_params({**params, "protocolVersion": 1}))
        assert answer is not None
        result = answer.result_value()
        assert isinstance(result, dict)
        return {**result, "protocolVersion": 2}


async def test_a_v1_agent_behind_a_version_adapter_is_not_sent_a_cancel_request() -> None:
    # The agent's protocol is the one its own initialize named, not the editor's.
    agent = ScriptedAgent({"session/new": hang})
    async with open_test_chain([Downgrading()], agent, initialize=False,
                               timeouts=Timeouts(request=TIMEOUT)) as client:
        with anyio.fail_after(5):
            assert (await client.initialize(2) or {}).get("protocolVersion") == 2  # type: ignore[union-attr]
            answer = await client.request("session/new", {"cwd": "/", "mcpServers": []})
            await anyio.wait_all_tasks_blocked()  # the cancel would be written by now
    assert error_of(answer)["code"] == ErrorCode.REQUEST_TIMEOUT
    assert agent.received_params("initialize")[0]["protocolVersion"] == 1  # type: ignore[index]
    assert agent.received_params("$/cancel_request") == []


class Wedging(Proxy):
    """Forwards session/new; `_test/wedge` holds its dispatch for ever, so what is sent to
    it piles up until its inbox is full and every write to it waits, as a stand-alone
    proxy that stopped reading its stdin does."""

    @on("session/new")
    async def new(self, ctx: ProxyContext, message: Request) -> object:
        return await ctx.forward()

    @on("_test/wedge")
    async def wedge(self, ctx: ProxyContext, message: object) -> None:
        await anyio.sleep_forever()


async def test_a_timeout_owed_to_a_proxy_that_stopped_reading_does_not_stall_the_others(
) -> None:
    # The agent's timeout is answered to the proxy, which cannot take it: that answer waits
    # for the proxy. The proxy's own timeout, the editor's answer, must still come.
    wedging = Wedging()
    wedging.rename("wedged")
    agent = ScriptedAgent({"session/new": hang})
    async with open_test_chain([wedging], agent, timeouts=Timeouts(request=TIMEOUT)) as client:
        with anyio.fail_after(5):
            async with anyio.create_task_group() as tg:
                answers: list[Response] = []
                answered = anyio.Event()

                async def new_session() -> None:
                    answers.append(await client.request(
                        "session/new", {"cwd": "/", "mcpServers": []}))
                    answered.set()
                tg.start_soon(new_session)
                await agent.wait_for("session/new")

                async def flood() -> None:  # fills the wedged proxy's inbox, then waits
                    for _ in range(INBOX_SIZE + 2):
                        await client.notify("_test/wedge", {})
                tg.start_soon(flood)
                await answered.wait()
                tg.cancel_scope.cancel()
    error = error_of(answers[0])
    assert error["code"] == ErrorCode.REQUEST_TIMEOUT
    assert error["data"] == {"component": "wedged", "method": "session/new",
                             "timeout": TIMEOUT}


class Forgetting(ScriptedAgent):
    """Keeps nothing of what it received: what stays in memory is the conductor's."""

    async def deliver(self, item: Incoming) -> None:
        await super().deliver(item)
        self.received.clear()


async def test_an_answered_prompt_does_not_keep_its_payload_until_its_deadline() -> None:
    # Its deadline stays in the heap until it comes due (or a rebuild): it must not hold
    # the request, whose prompt may carry megabytes of images, for a whole prompt_timeout.
    prompt = [{"type": "text", "text": "x" * 100_000}]
    async with open_test_chain([], Forgetting(), transport="pipes",
                               timeouts=Timeouts(prompt=600)) as client:
        # a hang guard, not a time limit: 200 traced 100 KB prompts take seconds on a
        # loaded machine (it failed there at 5 s)
        with anyio.fail_after(60):
            sid = await client.new_session()
            tracemalloc.start()
            try:
                gc.collect()
                before = tracemalloc.get_traced_memory()[0]
                for _ in range(200):
                    await client.request("session/prompt", {"sessionId": sid,
                                                            "prompt": prompt})
                gc.collect()
                kept = tracemalloc.get_traced_memory()[0] - before
            finally:
                tracemalloc.stop()
    assert kept < 2_000_000, f"{kept} bytes kept for 200 answered 100 KB prompts"


class _Wire:
    """A MessageSink that keeps what the router sent."""

    def __init__(self) -> None:
        self.sent: list[Message] = []

    async def send(self, item: Message | list[Message]) -> None:
        self.sent.extend(item if isinstance(item, list) else [item])

    async def aclose(self) -> None:
        pass


async def test_an_answer_that_arrives_as_its_timeout_comes_up_is_still_the_components_own(
) -> None:
    # The scan finds the request due and answers it in a task of its own; the component's
    # answer may arrive first and be on its way (a hook awaiting) when that task runs. The
    # timeout then answers nothing, and must not relabel that answer as the conductor's:
    # the conductor's own answers skip the order in-process proxies keep (_routed_past).
    editor = _Wire()
    wires = {"client": Hop("client", editor), "agent": Hop("agent", _Wire())}

    async def starter() -> list[ComponentLink]:
        return [ComponentLink("agent", Role.AGENT, wires["agent"])]

    now = [0.0]
    chain = Chain(wires["client"], starter, timeouts=Timeouts(request=TIMEOUT))
    assert chain._deadlines is not None
    chain._deadlines.clock = lambda: now[0]
    client, agent = wires["client"], wires["agent"]
    sources: list[str] = []
    client.observe = lambda message, source, origin: sources.append(source)
    with anyio.fail_after(5):
        await chain.receive(client, decode(b'{"jsonrpc":"2.0","id":0,"method":"initialize",'
                                           b'"params":{"protocolVersion":1}}'))
        [init] = agent.pending.values()
        await chain.receive(agent, Response(id=init.id, result=Raw(b'{"protocolVersion":1}')))
        await chain.receive(client, decode(b'{"jsonrpc":"2.0","id":1,"method":"_x/slow",'
                                           b'"params":{}}'))
        [outgoing] = agent.pending.values()
        forward = outgoing.context
        on_its_way, go_on = anyio.Event(), anyio.Event()

        async def hook(answer: Response) -> Response:  # the answer's hooks are awaiting
            on_its_way.set()
            await go_on.wait()
            return answer
        forward.hook = hook
        now[0] += 2 * TIMEOUT
        [expired] = chain._deadlines.due()  # the scan saw it due; its task runs later
        async with anyio.create_task_group() as tg:
            tg.start_soon(chain.receive, agent,
                          Response(id=outgoing.id, result=Raw(b'{"ok":true}')))
            await on_its_way.wait()
            await chain._timed_out(expired)  # the timeout's task: nothing left to answer
            go_on.set()
    answers = [m for m in editor.sent if isinstance(m, Response) and bytes(m.id) == b"1"]
    assert [a.result for a in answers] == [Raw(b'{"ok":true}')]
    assert sources[-1] == "agent"
