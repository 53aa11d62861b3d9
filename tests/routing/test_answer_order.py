"""An answer routed past an in-process proxy never overtakes what reached that proxy first."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import anyio
import pytest

from conductor.jsonrpc.codes import ErrorCode
from conductor.plugins import Proxy, ProxyContext, on
from conductor.routing.deadlines import Timeouts
from conductor.testing import ScriptedAgent, TestClient, open_test_chain

if TYPE_CHECKING:
    from conductor.jsonrpc.message import Message

CHUNKS = 40


class HandlesUpdates(Proxy):
    """Handles every update (as redact does) and forwards it."""

    @on("session/update", source="successor")
    async def update(self, ctx: ProxyContext, message: Message) -> None:
        await anyio.lowlevel.checkpoint()  # a handler that yields, as real ones do
        await ctx.forward()


def streaming_agent() -> ScriptedAgent:
    async def prompt(agent: ScriptedAgent, message: Message) -> object:
        sid = message.params_value()["sessionId"]
        for i in range(CHUNKS):
            await agent.notify("session/update", {"sessionId": sid, "update": {
                "sessionUpdate": "agent_message_chunk",
                "content": {"type": "text", "text": f"{i},"}}})
        return {"stopReason": "end_turn"}
    return ScriptedAgent({"session/prompt": prompt})


@pytest.mark.parametrize("transport", ["memory", "pipes"])
async def test_a_prompts_answer_reaches_the_editor_after_every_update_sent_before_it(
        transport: Any) -> None:
    async with open_test_chain([HandlesUpdates()], streaming_agent(),
                               transport=transport) as client:
        with anyio.fail_after(10):
            sid = await client.new_session()
            await client.prompt(sid, "go")
            text_when_answered = client.agent_text(sid)
    assert text_when_answered == "".join(f"{i}," for i in range(CHUNKS))


async def test_behind_two_busy_proxies_the_answer_still_comes_last() -> None:
    async with open_test_chain([HandlesUpdates(), HandlesUpdates()], streaming_agent(),
                               client=TestClient()) as client:
        with anyio.fail_after(10):
            sid = await client.new_session()
            await client.prompt(sid, "go")
            text_when_answered = client.agent_text(sid)
    assert text_when_answered == "".join(f"{i}," for i in range(CHUNKS))


class HandlesNotes(Proxy):
    """Handles the editor's `_ext/note` notifications and forwards them."""

    @on("_ext/note")
    async def note(self, ctx: ProxyContext, message: Message) -> None:
        await anyio.lowlevel.checkpoint()
        await ctx.forward()


async def test_the_editors_answer_reaches_the_agent_after_what_the_editor_sent_before_it(
) -> None:
    client: TestClient

    async def permission(message: Message) -> object:
        for i in range(CHUNKS):  # said before answering: the agent must see it first
            await client.notify("_ext/note", {"n": i})
        return {"outcome": {"outcome": "cancelled"}}

    async def prompt(agent: ScriptedAgent, message: Message) -> object:
        sid = message.params_value()["sessionId"]
        await agent.request("session/request_permission", {
            "sessionId": sid, "toolCall": {"toolCallId": "t"}, "options": []})
        return {"stopReason": "end_turn", "_meta": {"notes": len(
            agent.received_params("_ext/note"))}}

    client = TestClient({"session/request_permission": permission})
    async with open_test_chain([HandlesNotes()], ScriptedAgent({"session/prompt": prompt}),
                               client=client) as client:
        with anyio.fail_after(10):
            sid = await client.new_session()
            answer = await client.prompt(sid, "go")
    assert answer["_meta"] == {"notes": CHUNKS}


class HoldsDispatch(Proxy):
    """Handles the agent's `_ext/hold` without releasing dispatch until `let_go` is set
    (a handler that waits for something of its own and forgot `ctx.release()`)."""

    def __init__(self) -> None:
        super().__init__()
        self.holding = anyio.Event()
        self.let_go = anyio.Event()

    @on("_ext/hold", source="successor")
    async def hold(self, ctx: ProxyContext, message: Message) -> None:
        self.holding.set()
        await self.let_go.wait()
        await ctx.forward()


async def test_a_timeout_answer_is_not_held_behind_a_proxy_that_holds_its_dispatch() -> None:
    proxy = HoldsDispatch()

    async def slow(agent: ScriptedAgent, message: Message) -> object:
        await agent.notify("_ext/hold", {})
        await anyio.sleep_forever()
        raise AssertionError("unreachable")

    agent = ScriptedAgent({"_ext/slow": slow})
    async with open_test_chain([proxy], agent, timeouts=Timeouts(request=0.1)) as client:
        try:
            with anyio.fail_after(5):
                answer = await client.request("_ext/slow", {})
        finally:
            proxy.let_go.set()
    error = answer.error_value()
    assert isinstance(error, dict) and error["code"] == ErrorCode.REQUEST_TIMEOUT, error


async def test_an_agent_that_dies_is_answered_for_though_a_proxy_holds_its_dispatch() -> None:
    proxy = HoldsDispatch()

    async def dies(agent: ScriptedAgent, message: Message) -> object:
        await agent.notify("_ext/hold", {})
        await proxy.holding.wait()
        await agent.hang_up()  # the agent exits, owing this answer
        await anyio.sleep_forever()
        raise AssertionError("unreachable")

    agent = ScriptedAgent({"_ext/dies": dies})
    async with open_test_chain([proxy], agent) as client:
        try:
            with anyio.fail_after(5):
                answer = await client.request("_ext/dies", {})
        finally:
            proxy.let_go.set()
    error = answer.error_value()
    assert isinstance(error, dict) and error["data"]["component"] == "agent", error


async def test_a_message_not_handed_over_to_a_full_inbox_does_not_count_as_waiting() -> None:
    from conductor.jsonrpc.message import Notification
    from conductor.plugins.host import ProxyHost, _InboxSink

    class Nowhere:
        async def send(self, item: object) -> None:
            pass

        async def aclose(self) -> None:
            pass

    host = ProxyHost(HandlesNotes(), Nowhere())
    send, receive = anyio.create_memory_object_stream[Any](1)
    sink = _InboxSink(send, host)
    note = Notification(method="_ext/note")
    async with send, receive:
        await sink.send(note)  # fills the inbox
        with anyio.move_on_after(0.05):  # the editor gives up on the next one
            await sink.send(note)
        assert host.queued == 1  # only the one in the inbox is still to be dispatched
