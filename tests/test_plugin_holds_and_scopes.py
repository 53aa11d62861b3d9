"""A held message stays held until its own handler forwards it, and a session whose
opened hook failed leaves no scope behind."""

from __future__ import annotations

from contextlib import asynccontextmanager
from typing import TYPE_CHECKING, Any

import anyio
import msgspec
import pytest

import conductor.plugins.host as host_module
from conductor.errors import RpcError
from conductor.jsonrpc.message import Notification
from conductor.plugins import CloseReason, Proxy, ProxyContext, SessionScope, on
from conductor.testing import ScriptedAgent, TestClient, open_test_chain

if TYPE_CHECKING:
    from collections.abc import AsyncIterator

    from conductor.jsonrpc.message import Message
    from conductor.transport.base import Incoming


def update(sid: str, text: str) -> dict[str, object]:
    return {"sessionId": sid, "update": {"sessionUpdate": "agent_message_chunk",
                                         "content": {"type": "text", "text": text}}}


class HoldsWhileAnotherAsks(Proxy):
    """Holds permission requests (no release) while another handler, already released,
    sends a request of its own."""

    def __init__(self) -> None:
        super().__init__()
        self.gate, self.holding = anyio.Event(), anyio.Event()

    @on("_ext/tick")
    async def tick(self, ctx: ProxyContext, message: Message) -> object:
        ctx.release()
        await self.holding.wait()
        await ctx.request("_ext/ping", {}, to="predecessor")
        return {}

    @on("session/request_permission", source="successor")
    async def permission(self, ctx: ProxyContext, message: Message) -> object:
        self.holding.set()
        await self.gate.wait()
        return await ctx.forward()


async def test_another_handler_waiting_for_an_answer_does_not_release_a_held_message(
) -> None:
    proxy, pinged = HoldsWhileAnotherAsks(), anyio.Event()

    async def prompt(agent: ScriptedAgent, message: Message) -> object:
        assert agent.tg is not None
        agent.tg.start_soon(agent.request, "session/request_permission",
                            {"sessionId": "session-1", "toolCall": {"toolCallId": "t"},
                             "options": []})
        await pinged.wait()  # the permission request is held, the other handler asked
        await agent.notify("session/update", update("session-1", "after"))
        return {"stopReason": "end_turn"}

    client = TestClient({"session/request_permission": {"outcome": {"outcome": "cancelled"}},
                         "_ext/ping": {}})
    async with open_test_chain([proxy], ScriptedAgent({"session/prompt": prompt}),
                               client=client) as client:
        with anyio.fail_after(5):
            sid = await client.new_session()
            async with anyio.create_task_group() as tg:
                tg.start_soon(client.call, "_ext/tick", {})
                await anyio.wait_all_tasks_blocked()
                tg.start_soon(client.prompt, sid, "go")
                await client.wait_for("_ext/ping")
                pinged.set()
                await anyio.wait_all_tasks_blocked()
                # The permission request is still held: nothing after it may overtake it.
                assert client.received_params("session/update") == []
                proxy.gate.set()
            await client.wait_for("session/update")
    order = [m.method for m in client.received
             if m.method in ("session/request_permission", "session/update")]
    assert order == ["session/request_permission", "session/update"]


class ForwardsThroughAWorker(Proxy):
    """Hands each prompt to a task of its own and polls for the answer, without
    `ctx.release()`: the worker's wait must still let the answer in."""

    def __init__(self) -> None:
        super().__init__()
        self.jobs, self.inbox = anyio.create_memory_object_stream[
            tuple[ProxyContext, list[object], anyio.Event]](8)

    async def work(self) -> None:
        async with self.inbox:
            async for ctx, box, done in self.inbox:
                box.append(await ctx.forward())
                done.set()

    @on("session/prompt")
    async def prompt(self, ctx: ProxyContext, message: Message) -> object:
        box: list[object] = []
        done = anyio.Event()
        await self.jobs.send((ctx, box, done))
        await done.wait()  # not an answer's wait: it does not release dispatch
        return box[0]


async def test_a_holding_handler_whose_forward_a_task_of_the_plugin_makes_is_answered(
) -> None:
    proxy = ForwardsThroughAWorker()
    agent = ScriptedAgent({"session/prompt": {"stopReason": "end_turn"}})
    async with anyio.create_task_group() as tg, proxy.jobs:
        tg.start_soon(proxy.work)
        async with open_test_chain([proxy], agent) as client:
            with anyio.fail_after(5):
                sid = await client.new_session()
                assert await client.prompt(sid, "go") == {"stopReason": "end_turn"}


class FailsFirstOpen(Proxy):
    """session_opened raises for the first session only."""

    def __init__(self) -> None:
        super().__init__()
        self.events: list[str] = []

    async def session_opened(self, session: SessionScope) -> None:
        if not self.events:
            self.events.append(f"failed {session.session_id}")
            raise RuntimeError("no room")
        self.events.append(f"opened {session.session_id}")

    async def session_closed(self, session: SessionScope) -> None:
        self.events.append(f"closed {session.session_id}: {session.closed_reason}")


async def test_a_session_whose_opened_hook_failed_leaves_no_scope_behind() -> None:
    proxy = FailsFirstOpen()
    async with open_test_chain([proxy], ScriptedAgent()) as client:
        with anyio.fail_after(5):
            refused = await client.request("session/new", {"cwd": "/", "mcpServers": []})
            assert refused.is_error
            sid = await client.new_session()
    # The editor never got the first session: no scope kept for it, no close for it.
    assert proxy.events == ["failed session-1", f"opened {sid}", f"closed {sid}: stopped"]


class RelaysUpdates(Proxy):
    """Handles the agent's updates (forwarding each): they go through its dispatch, while
    the prompt and its answer, which it has no handler for, are routed past it."""

    @on("session/update", source="successor")
    async def relay(self, ctx: ProxyContext, message: Message) -> None:
        await ctx.forward()


@pytest.mark.parametrize("transport", ["memory", "pipes"])
async def test_a_turns_answer_routed_past_a_proxy_does_not_overtake_updates_in_its_dispatch(
        transport: Any) -> None:
    async def prompt(agent: ScriptedAgent, message: Message) -> object:
        sid = message.params_value()["sessionId"]
        for i in range(3):
            await agent.notify("session/update", update(sid, str(i)))
        return {"stopReason": "end_turn"}

    async with open_test_chain([RelaysUpdates()], ScriptedAgent({"session/prompt": prompt}),
                               transport=transport) as client:
        with anyio.fail_after(5):
            sid = await client.new_session()
            turn = await client.prompt(sid, "go")
    assert turn.text == "012"  # all of the turn's updates arrived before its answer


class HandlesCancels(Proxy):
    """Handles the editor's session/cancel (forwarding it) while the agent's permission
    requests and their answers are routed past it."""

    @on("session/cancel")
    async def cancel(self, ctx: ProxyContext, message: Message) -> None:
        await ctx.forward()


async def test_an_answer_to_the_agent_does_not_overtake_the_editors_cancel_in_a_proxys_dispatch(
) -> None:
    order: list[str] = []

    async def prompt(agent: ScriptedAgent, message: Message) -> object:
        sid = message.params_value()["sessionId"]
        await agent.request("session/request_permission",
                            {"sessionId": sid, "toolCall": {"toolCallId": "t"}, "options": []})
        order.append("answered")
        return {"stopReason": "end_turn"}

    class Agent(ScriptedAgent):
        async def deliver(self, item: Any) -> None:
            if getattr(item, "method", None) == "session/cancel":
                order.append("cancel")
            await super().deliver(item)

    async def permission(message: Message) -> object:
        await client.notify("session/cancel", {"sessionId": "session-1"})
        return {"outcome": {"outcome": "cancelled"}}

    client = TestClient({"session/request_permission": permission})
    async with open_test_chain([HandlesCancels()], Agent({"session/prompt": prompt}),
                               client=client):
        with anyio.fail_after(5):
            sid = await client.new_session()
            await client.prompt(sid, "go")
            await anyio.wait_all_tasks_blocked()
    assert order == ["cancel", "answered"]  # sent in that order by the editor


class Floods(Proxy):
    """On `_ext/flood`, sends the agent notifications from a released handler: they stall,
    holding the agent's connection, when the agent stops reading."""

    @on("_ext/flood")
    async def flood(self, ctx: ProxyContext, message: Message) -> None:
        ctx.release()
        for i in range(300):
            await ctx.notify("_ext/note", {"i": i})


class ForwardsReleased(Proxy):
    """Lets dispatch go on, then forwards the prompt."""

    @on("session/prompt")
    async def prompt(self, ctx: ProxyContext, message: Message) -> object:
        ctx.release()
        return await ctx.forward()


@asynccontextmanager
async def prompt_cancelled_while_routed() -> AsyncIterator[tuple[Any, str, list[Any]]]:
    """A prompt cancelled while the router waits to write it to a busy agent, its forward
    routed in the handler's task: (the chain, the session, the prompt's answer), once the
    agent has caught up, while the chain still runs."""
    forwards, reading = ForwardsReleased(), anyio.Event()

    class StallingAgent(ScriptedAgent):
        async def deliver(self, item: Any) -> None:
            if getattr(item, "method", None) == "_ext/note":
                await reading.wait()
            await super().deliver(item)

    agent = StallingAgent()
    answers: list[Any] = []
    async with open_test_chain([forwards, Floods()], agent) as client:
        chain = forwards.chain_status.__self__  # type: ignore[union-attr]
        with anyio.fail_after(5):
            sid = await client.new_session()
            await client.notify("_ext/flood", {})
            await anyio.wait_all_tasks_blocked()  # the agent's connection is full
            async with anyio.create_task_group() as tg:
                async def prompt() -> None:
                    answers.append(await client.request("session/prompt", {
                        "sessionId": sid, "prompt": []}, ident=99))
                tg.start_soon(prompt)
                await anyio.wait_all_tasks_blocked()  # routed, waiting for the agent's pipe
                await client.cancel(99)
                await anyio.wait_all_tasks_blocked()
                reading.set()
            await agent.wait_for("_ext/note", 300)
            await anyio.wait_all_tasks_blocked()
            yield chain, sid, answers


async def test_a_prompt_cancelled_while_the_router_forwards_it_leaves_nothing_pending() -> None:
    # A handler's forward is routed in the handler's task: a cancel landing while the
    # router waits to write the request to a busy agent must not cut the routing in half
    # (the id allocated on the agent's hop, never written, pending for ever).
    async with prompt_cancelled_while_routed() as (chain, _, [answer]):
        assert answer.is_error and answer.error_value()["code"] == -32800
        hops = chain.topology.hops()
        assert [(h.name, h.pending, h.inbound) for h in hops] == \
            [(h.name, {}, {}) for h in hops]


class ForwardsAfterShieldedWork(Proxy):
    """Does some work that cannot be interrupted, then forwards the prompt."""

    def __init__(self) -> None:
        super().__init__()
        self.working, self.gate = anyio.Event(), anyio.Event()

    @on("session/prompt")
    async def prompt(self, ctx: ProxyContext, message: Message) -> object:
        ctx.release()
        self.working.set()
        with anyio.CancelScope(shield=True):  # e.g. writing a file: the cancel lands meanwhile
            await self.gate.wait()
        return await ctx.forward()


class HandlesPrompts(Proxy):
    """Forwards prompts from a handler."""

    @on("session/prompt")
    async def prompt(self, ctx: ProxyContext, message: Message) -> object:
        return await ctx.forward()


async def test_a_cancelled_handlers_answer_waits_for_the_far_end_so_no_update_trails_it() -> None:
    proxy = ForwardsAfterShieldedWork()

    async def prompt(agent: ScriptedAgent, message: Message) -> object:
        sid = message.params_value()["sessionId"]
        with anyio.CancelScope(shield=True):  # a cancel ends the turn, with one last update
            await agent.wait_for("$/cancel_request")
            await agent.notify("session/update", update(sid, "last words"))
        return {"stopReason": "cancelled"}

    # The forward goes into the next proxy's queue at once: it leaves even though the
    # handler was cancelled meanwhile.
    async with open_test_chain([proxy, HandlesPrompts()],
                               ScriptedAgent({"session/prompt": prompt})) as client:
        with anyio.fail_after(5):
            sid = await client.new_session()
            async with anyio.create_task_group() as tg:
                async def turn() -> None:
                    answer = await client.request("session/prompt", {
                        "sessionId": sid, "prompt": []}, ident=99)
                    assert answer.is_error
                    # Everything the agent streamed for the turn came before its answer.
                    assert client.received_params("session/update") != []
                tg.start_soon(turn)
                await proxy.working.wait()
                await client.cancel(99)
                await anyio.wait_all_tasks_blocked()
                proxy.gate.set()



class DeafAgent(ScriptedAgent):
    """Never hears a cancel: a prompt is answered never."""

    def __init__(self) -> None:
        self.prompted = anyio.Event()
        super().__init__({"session/prompt": self._never})

    async def _never(self, agent: ScriptedAgent, message: Message) -> object:
        self.prompted.set()
        await anyio.sleep_forever()
        return {}

    async def deliver(self, item: Incoming) -> None:
        if not (isinstance(item, Notification) and item.method == "$/cancel_request"):
            await super().deliver(item)


async def test_a_chain_stopped_mid_turn_does_not_wait_for_an_agent_that_never_answers(
        monkeypatch: pytest.MonkeyPatch) -> None:
    # A handler cancelled because the chain stops (Ctrl-C twice, SIGTERM twice, EOF) has
    # nobody left to deliver the far end's answer: its dispatch is stopping too. The
    # cancelled-answer grace must not hold the chain's exit (it held it 5 s per proxy).
    monkeypatch.setattr("conductor.plugins.host.CANCELLED_ANSWER_GRACE", 30.0)
    agent = DeafAgent()
    async with anyio.create_task_group() as outer:
        with anyio.fail_after(5):
            async with open_test_chain([HandlesPrompts()], agent) as client:
                sid = await client.new_session()
                outer.start_soon(client.prompt, sid, "hang")
                await agent.prompted.wait()
        outer.cancel_scope.cancel()


async def test_a_prompt_cancelled_while_the_router_forwards_it_leaves_its_session_idle() -> None:
    # The turn the router forgot (see above) is over: its session must not stay
    # "prompting" for ever, which idle expiry never ends and the status tool shows.
    async with prompt_cancelled_while_routed() as (chain, sid, _):
        assert [(s["sessionId"], s["state"]) for s in chain.status()["sessions"]] == \
            [(sid, "idle")]


class TimesOutItself(Proxy):
    """Gives the agent 0.1 s to answer its own question, then answers the prompt anyway."""

    @on("session/prompt")
    async def prompt(self, ctx: ProxyContext, message: Message) -> object:
        with anyio.move_on_after(0.1):
            await ctx.request("_ext/slow", {})
        return {"stopReason": "end_turn"}


async def test_a_handlers_own_timeout_on_its_request_ends_the_wait_at_once(
        monkeypatch: pytest.MonkeyPatch) -> None:
    # The grace a cancelled handler gives the far end is for its request's cancel only.
    monkeypatch.setattr("conductor.plugins.host.CANCELLED_ANSWER_GRACE", 30.0)
    never = anyio.Event()

    async def slow(agent: ScriptedAgent, message: Message) -> object:
        with anyio.CancelScope(shield=True):  # an agent that does not take cancels
            await never.wait()
        return {}

    async with open_test_chain([TimesOutItself()], ScriptedAgent({"_ext/slow": slow})) as client:
        try:
            with anyio.fail_after(10):
                sid = await client.new_session()
                answer = await client.prompt(sid, "go")
        finally:
            never.set()
    assert answer == {"stopReason": "end_turn"}


class SeesSessions(Proxy):
    """Records each session's opening and end, as a plugin keeping per-session state does."""

    def __init__(self) -> None:
        super().__init__()
        self.events: list[tuple[str, str, object]] = []

    async def session_opened(self, session: SessionScope) -> None:
        self.events.append(("opened", session.session_id, session.how))

    async def session_closed(self, session: SessionScope) -> None:
        self.events.append(("closed", session.session_id, session.closed_reason))


@pytest.mark.parametrize("second", ["accepted", "refused"])
async def test_a_session_two_loads_race_for_is_refused_only_when_both_are(
        second: str) -> None:
    # An editor's retry (or two windows) may have the first load refused ("busy") and the
    # second succeed: the session is open at the agent, so the proxy must not be told it
    # was refused, nor lose the scope (its state, its per-session handlers).
    proxy, first_answered = SeesSessions(), anyio.Event()
    first_arrived, second_arrived = anyio.Event(), anyio.Event()
    loads = 0

    async def load(agent: ScriptedAgent, message: Message) -> object:
        nonlocal loads
        loads += 1
        if loads == 1:
            first_arrived.set()
            await second_arrived.wait()
            raise RpcError(-32000, "busy loading")
        second_arrived.set()
        await first_answered.wait()
        if second == "refused":
            raise RpcError(-32000, "no such session")
        return {}

    agent = ScriptedAgent({"session/load": load})
    params = {"sessionId": "S", "cwd": "/", "mcpServers": []}
    async with open_test_chain([proxy], agent) as client:
        with anyio.fail_after(5):
            answers: list[Any] = []

            async def send() -> None:
                answers.append(await client.request("session/load", params))
                first_answered.set()

            async with anyio.create_task_group() as tg:
                tg.start_soon(send)
                await first_arrived.wait()  # (so the first is the one refused)
                tg.start_soon(send)
            assert [a.is_error for a in answers] == [True, second == "refused"]
    refused = [e for e in proxy.events if e[0] == "closed" and e[2] is CloseReason.REFUSED]
    assert refused == ([("closed", "S", CloseReason.REFUSED)] if second == "refused" else [])


class WorksOnTheFirstUpdate(Proxy):
    """Handles the agent's updates; on the first it lets dispatch go on and works (as a
    handler doing blocking work in a thread does) until nothing else can move, or asks the
    editor something (`asks`), then forwards it."""

    def __init__(self, *, asks: bool = False) -> None:
        super().__init__()
        self.seen, self.asks = 0, asks

    @on("session/update", source="successor")
    async def relay(self, ctx: ProxyContext, message: Message) -> None:
        self.seen += 1
        if self.seen == 1 and self.asks:
            await ctx.request("_ext/ask", {}, to="predecessor")
        elif self.seen == 1:
            ctx.release()
            await anyio.wait_all_tasks_blocked()  # whatever could overtake it has, by now
        await ctx.forward()


async def streams_three_updates(agent: ScriptedAgent, message: Message) -> object:
    sid = message.params_value()["sessionId"]
    for i in range(3):
        await agent.notify("session/update", update(sid, str(i)))
    return {"stopReason": "end_turn"}


@pytest.mark.parametrize(("in_front", "asks"), [(False, False), (True, False), (False, True)])
async def test_a_released_update_handler_keeps_the_updates_and_the_turns_answer_in_order(
        in_front: bool, asks: bool) -> None:
    # `in_front`: a proxy handling prompts sits before it, so the answer is a handler's
    # (through its forward), not one routed past. `asks`: the handler waits for an answer
    # of its own (which must get through, or it would wait for ever).
    proxies: list[Proxy[Any]] = [HandlesPrompts()] if in_front else []
    async with open_test_chain([*proxies, WorksOnTheFirstUpdate(asks=asks)],
                               ScriptedAgent({"session/prompt": streams_three_updates}),
                               client=TestClient({"_ext/ask": {}})) as client:
        with anyio.fail_after(5):
            sid = await client.new_session()
            turn = await client.prompt(sid, "go")
            await anyio.wait_all_tasks_blocked()
    assert turn.text == "012"  # in the agent's order, all before the answer
    assert client.agent_text(sid) == "012"


@asynccontextmanager
async def stand_alone(proxy: Proxy[Any]) -> AsyncIterator[tuple[Any, Any]]:
    """`proxy` served as a stdio program (`serve_proxy`) over in-memory pipes: yields
    (what writes its stdin, what reads its stdout); stopped on exit."""
    from conductor.plugins.host import serve_proxy
    from conductor.transport.memory import memory_pipe

    to_proxy, proxy_in = memory_pipe()
    proxy_out, from_proxy = memory_pipe()
    async with to_proxy, proxy_in, proxy_out, from_proxy, anyio.create_task_group() as tg:
        tg.start_soon(serve_proxy, proxy, proxy_in, proxy_out)
        yield to_proxy, from_proxy
        tg.cancel_scope.cancel()


def successor(message: dict[str, Any]) -> dict[str, Any]:
    """`message` as the conductor hands a stand-alone proxy what its successor sent."""
    envelope = {"method": message.pop("method"), "params": message.pop("params")}
    return {**message, "method": "_proxy/successor", "params": envelope}


async def test_a_stand_alone_proxys_released_update_handler_keeps_the_turn_in_order() -> None:
    lines: list[dict[str, Any]] = []
    with anyio.fail_after(5):
        async with stand_alone(WorksOnTheFirstUpdate()) as (stdin, stdout):
            prompt = {"jsonrpc": "2.0", "id": 1, "method": "session/prompt",
                      "params": {"sessionId": "s", "prompt": []}}
            await stdin.send(msgspec.json.encode(prompt) + b"\n")
            forwarded = msgspec.json.decode(await stdout.receive())
            turn = [successor({"jsonrpc": "2.0", "method": "session/update",
                               "params": update("s", str(i))}) for i in range(3)]
            turn.append({"jsonrpc": "2.0", "id": forwarded["id"],
                         "result": {"stopReason": "end_turn"}})
            await stdin.send(b"".join(msgspec.json.encode(m) + b"\n" for m in turn))
            out = b""
            while out.count(b"\n") < 4:  # writes may be coalesced: count lines
                out += await stdout.receive()
            lines = [msgspec.json.decode(line) for line in out.splitlines()]
    assert [m.get("params", {}).get("update", {}).get("content", {}).get("text", m.get("id"))
            for m in lines] == ["0", "1", "2", 1]


class AsksAJudgeFirst(Proxy):
    """On the first update of the editor's session, asks a judge session of its own (whose
    agent asks it a permission question meanwhile) before forwarding it."""

    def __init__(self) -> None:
        super().__init__()
        self.verdicts: list[str] = []

    @on("session/update", source="successor")
    async def relay(self, ctx: ProxyContext, message: Message) -> None:
        if not self.verdicts:
            judge = await ctx.open_session({"cwd": "/", "mcpServers": []})

            async def decide(ctx: ProxyContext, message: Message) -> object:
                return {"outcome": {"outcome": "selected", "optionId": "allow"}}
            judge.on("session/request_permission", decide)
            answer = await judge.prompt("safe?")
            self.verdicts.append(answer.result_value()["stopReason"])
        await ctx.forward()


async def test_an_update_handler_asking_its_own_session_is_not_held_behind_itself() -> None:
    # The judge's messages come from the agent side too, after the update being handled:
    # held behind it, they would wait for it, and it for them.
    async def prompt(agent: ScriptedAgent, message: Message) -> object:
        params = message.params_value()
        if params["prompt"][0]["text"] == "safe?":
            await agent.request("session/request_permission", {
                "sessionId": params["sessionId"], "toolCall": {"toolCallId": "t"},
                "options": []})
            return {"stopReason": "end_turn"}
        return await streams_three_updates(agent, message)

    proxy = AsksAJudgeFirst()
    async with open_test_chain([proxy], ScriptedAgent({"session/prompt": prompt})) as client:
        with anyio.fail_after(5):
            sid = await client.new_session()
            turn = await client.prompt(sid, "go")
    assert (turn.text, proxy.verdicts) == ("012", ["end_turn"])
    assert "session/request_permission" not in client.received_methods()


class AsksTheAgentFirst(Proxy):
    """On the first update, asks the agent something before forwarding it."""

    @on("session/update", source="successor")
    async def relay(self, ctx: ProxyContext, message: Message) -> None:
        if message.params_value()["update"]["content"]["text"] == "0":
            await ctx.request("_ext/status", {}, to="successor")
        await ctx.forward()


async def test_the_editors_answer_routed_past_is_not_held_behind_an_agent_side_handler(
        ) -> None:
    # Only what the agent side sends waits for such a handler: the editor's answer to the
    # agent goes the other way, and the agent may need it to answer the handler.
    answered, gate = anyio.Event(), anyio.Event()

    async def prompt(agent: ScriptedAgent, message: Message) -> object:
        sid = message.params_value()["sessionId"]

        async def ask() -> None:
            await agent.request("session/request_permission", {
                "sessionId": sid, "toolCall": {"toolCallId": "t"}, "options": []})
            answered.set()
        assert agent.tg is not None
        agent.tg.start_soon(ask)
        await anyio.wait_all_tasks_blocked()  # the question is with the editor
        await agent.notify("session/update", update(sid, "0"))
        return {"stopReason": "end_turn"}

    async def status(agent: ScriptedAgent, message: Message) -> object:
        await answered.wait()  # busy with the permission question until it is answered
        return {}

    async def permission(message: Message) -> object:
        await gate.wait()
        return {"outcome": {"outcome": "cancelled"}}

    agent = ScriptedAgent({"session/prompt": prompt, "_ext/status": status})
    async with open_test_chain([AsksTheAgentFirst()], agent,
                               client=TestClient({"session/request_permission": permission})
                               ) as client:
        with anyio.fail_after(5):
            sid = await client.new_session()
            async with anyio.create_task_group() as tg:
                tg.start_soon(client.prompt, sid, "go")
                await agent.wait_for("_ext/status")  # the handler holds the agent side
                gate.set()
            assert client.agent_text(sid) == "0"


def said(sid: str, text: str) -> dict[str, Any]:
    return {"sessionId": sid, "update": {"sessionUpdate": "agent_message_chunk",
                                         "content": {"type": "text", "text": text}}}


class AsksTheAgentToAnswer(Proxy):
    """Nearer the editor: answers `_ext/ask` by asking the agent first."""

    @on("_ext/ask", source="successor")
    async def ask(self, ctx: ProxyContext, message: Any) -> object:
        await ctx.request("_ext/status", {}, to="successor")
        return {}


class AsksBeforeForwarding(Proxy):
    """Nearer the agent: asks its predecessor about each update before forwarding it."""

    @on("session/update", source="successor")
    async def relay(self, ctx: ProxyContext, message: Any) -> None:
        await ctx.request("_ext/ask", {}, to="predecessor")
        await ctx.forward()


async def test_a_hold_waiting_for_what_only_comes_behind_it_gives_way_not_a_hang(
        monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    # The editor side must ask the agent before it can answer the holding handler: the
    # agent's answer was held behind that handler, and nothing moved again.
    monkeypatch.setattr(host_module, "HOLD_BOUND", 0.3)

    async def prompt(agent: ScriptedAgent, message: Any) -> object:
        await agent.notify("session/update", said(message.params_value()["sessionId"], "0"))
        return {"stopReason": "end_turn"}
    agent = ScriptedAgent({"session/prompt": prompt, "_ext/status": {}})
    async with open_test_chain([AsksTheAgentToAnswer(), AsksBeforeForwarding()],
                               agent) as client:
        with anyio.fail_after(10):
            sid = await client.new_session()
            await client.prompt(sid, "go")
            await client.wait_for("session/update")  # behind the answer: order gave way
    assert client.agent_text(sid) == "0"
    assert "has not forwarded it for 0.3s; what the agent sent after it goes on now" \
        in caplog.text


async def test_messages_held_behind_a_handler_are_let_go_at_a_bound_none_lost(
        monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    # Held messages left the bounded inbox for a list without bound: 20,000 updates behind
    # one slow handler were all held at once. (The inbox reader must not wait for room
    # instead: what it would read may be what frees the hold.)
    monkeypatch.setattr(host_module, "HELD_LIMIT", 16)
    held: list[int] = []
    hold = host_module.ProxyHost._hold

    def counting(self: host_module.ProxyHost, item: Any, sides: Any) -> bool:
        kept = hold(self, item, sides)
        held.append(len(self._held))
        return kept
    monkeypatch.setattr(host_module.ProxyHost, "_hold", counting)

    class SlowOnTheFirst(Proxy):
        seen = 0

        @on("session/update", source="successor")
        async def relay(self, ctx: ProxyContext, message: Any) -> None:
            self.seen += 1
            if self.seen == 1:
                ctx.release()
                await anyio.sleep(0.2)  # the agent streams on meanwhile
            await ctx.forward()

    async def prompt(agent: ScriptedAgent, message: Any) -> object:
        for _ in range(200):
            await agent.notify("session/update", said(message.params_value()["sessionId"],
                                                      "x"))
        return {"stopReason": "end_turn"}
    async with open_test_chain([SlowOnTheFirst()],
                               ScriptedAgent({"session/prompt": prompt})) as client:
        with anyio.fail_after(10):
            sid = await client.new_session()
            await client.prompt(sid, "go")
            await client.wait_for("session/update", 200)
    assert client.agent_text(sid) == "x" * 200  # every one
    assert max(held) < 200  # the hold gave way at 16: not all of them held at once
    assert "16 messages are held behind them; what the agent sent after it goes on" \
        in caplog.text
