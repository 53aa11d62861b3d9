"""`@watch`: a proxy sees notifications inline, and they keep the router's shortcut past it."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

import anyio
import pytest

from conductor.plugins import Proxy, ProxyContext, Side, WatchContext, on, watch
from conductor.testing import ScriptedAgent, TestClient, open_test_chain

if TYPE_CHECKING:
    from conductor.jsonrpc.message import Message, Notification

UPDATES = 300  # enough that the client's link fills now and then: both send paths run


def update(sid: str, text: str) -> dict[str, object]:
    return {"sessionId": sid, "update": {"sessionUpdate": "agent_message_chunk",
                                         "content": {"type": "text", "text": text}}}


class HopRecorder:
    """A TraceSink that keeps (hop, method) for every message."""

    def __init__(self) -> None:
        self.seen: list[tuple[str, object]] = []

    def message(self, hop: str, direction: str, message: Message | list[Message], *,
                peer: str | None = None, origin: object = None) -> None:
        for one in message if isinstance(message, list) else [message]:
            self.seen.append((hop, getattr(one, "method", None)))

    def lifecycle(self, component: str, event: str, **fields: object) -> None:
        pass

    def hops_for(self, method: str) -> set[str]:
        return {hop for hop, m in self.seen if m == method}


class Counts(Proxy):
    """Watches the agent's updates and keeps their text in the session's state."""

    def __init__(self, lines: list[str] | None = None) -> None:
        super().__init__()
        self.lines = lines if lines is not None else []

    @watch("session/update", source="successor")
    def seen(self, ctx: WatchContext, message: Notification) -> None:
        assert ctx.session is not None and ctx.source is Side.SUCCESSOR
        text = message.params_value()["update"]["content"]["text"]
        ctx.session.state.setdefault("texts", []).append(text)
        self.lines.append(f"{self.name}:{text}")


def streaming_agent(count: int) -> ScriptedAgent:
    async def prompt(agent: ScriptedAgent, message: Message) -> object:
        sid = message.params_value()["sessionId"]
        for i in range(count):
            await agent.notify("session/update", update(sid, str(i)))
        return {"stopReason": "end_turn"}
    return ScriptedAgent({"session/prompt": prompt})


@pytest.mark.parametrize("transport", ["memory", "pipes"])
@pytest.mark.parametrize("traced", [False, True])
async def test_a_watcher_sees_every_update_once_in_order_and_the_updates_skip_the_proxy(
        transport: Any, traced: bool) -> None:
    counts, trace = Counts(), HopRecorder()
    async with open_test_chain([counts], streaming_agent(UPDATES), transport=transport,
                               tracer=trace if traced else None) as client:
        with anyio.fail_after(10):
            sid = await client.new_session()
            await client.prompt(sid, "go")
    expected = [str(i) for i in range(UPDATES)]
    assert client.agent_text(sid) == "".join(expected)
    assert [line.partition(":")[2] for line in counts.lines] == expected
    if traced:  # the updates went agent -> client without visiting the proxy
        assert trace.hops_for("session/update") == {"agent", "client"}


class HoldsPermissions(Counts):
    """Also holds permission requests until `gate` opens, keeping later messages behind."""

    def __init__(self) -> None:
        super().__init__()
        self.gate = anyio.Event()

    @on("session/request_permission", source="successor")
    async def permission(self, ctx: ProxyContext, message: Message) -> object:
        await self.gate.wait()
        return await ctx.forward()


async def test_an_update_held_behind_a_handled_request_is_watched_once_when_its_turn_comes(
) -> None:
    holder = HoldsPermissions()

    async def prompt(agent: ScriptedAgent, message: Message) -> object:
        assert agent.tg is not None
        agent.tg.start_soon(agent.request, "session/request_permission",
                            {"sessionId": "session-1", "toolCall": {"toolCallId": "t"},
                             "options": []})
        await anyio.wait_all_tasks_blocked()
        await agent.notify("session/update", update("session-1", "after"))
        return {"stopReason": "end_turn"}

    replies = {"session/request_permission": {"outcome": {"outcome": "cancelled"}}}
    async with open_test_chain([holder], ScriptedAgent({"session/prompt": prompt}),
                               client=TestClient(replies)) as client:
        with anyio.fail_after(5):
            sid = await client.new_session()
            async with anyio.create_task_group() as tg:
                tg.start_soon(client.prompt, sid, "go")
                await anyio.wait_all_tasks_blocked()
                # Held behind the request: the update has neither arrived nor been watched.
                assert client.received_params("session/update") == []
                assert holder.lines == []
                holder.gate.set()
            await client.wait_for("session/update")
    assert holder.lines == ["holdspermissions:after"]


async def test_watchers_of_several_proxies_see_an_update_in_the_order_it_travels() -> None:
    log: list[str] = []
    near_editor, near_agent = Counts(log), Counts(log)
    near_editor.rename("editor-side")
    near_agent.rename("agent-side")
    async with open_test_chain([near_editor, near_agent], streaming_agent(2)) as client:
        with anyio.fail_after(5):
            sid = await client.new_session()
            await client.prompt(sid, "go")
    assert log == ["agent-side:0", "editor-side:0", "agent-side:1", "editor-side:1"]


class WatchesCancels(Proxy):
    """Watches what the editor sends, whatever it is."""

    def __init__(self) -> None:
        super().__init__()
        self.methods: list[str] = []

    @watch("*")
    def seen(self, ctx: WatchContext, message: Notification) -> None:
        assert ctx.source is Side.PREDECESSOR
        self.methods.append(message.method)


async def test_a_star_watcher_sees_the_editors_notifications_on_their_way_to_the_agent() -> None:
    watcher, agent = WatchesCancels(), ScriptedAgent()
    async with open_test_chain([watcher], agent) as client:
        with anyio.fail_after(5):
            sid = await client.new_session()
            await client.notify("session/cancel", {"sessionId": sid})
            await client.notify("_ext/note", {"n": 1})
            await agent.wait_for("_ext/note")
    assert watcher.methods == ["session/cancel", "_ext/note"]
    assert [m.method for m in agent.received if m.method in ("session/cancel", "_ext/note")] \
        == ["session/cancel", "_ext/note"]


class Breaks(Proxy):
    @watch("session/update", source="successor")
    def seen(self, ctx: WatchContext, message: Notification) -> None:
        raise KeyError("oops")


async def test_a_watcher_that_raises_is_logged_and_the_update_still_reaches_the_editor(
        caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.ERROR):
        async with open_test_chain([Breaks()], streaming_agent(3)) as client:
            with anyio.fail_after(5):
                sid = await client.new_session()
                await client.prompt(sid, "go")
    assert client.agent_text(sid) == "012"
    failures = [r.getMessage() for r in caplog.records if "proxy breaks failed" in r.getMessage()]
    assert len(failures) == 3 and "KeyError" in failures[0]


def test_a_watcher_written_as_async_def_is_refused_with_the_reason() -> None:
    with pytest.raises(TypeError, match="must be a plain `def`"):
        class Wrong(Proxy):
            @watch("session/update", source="successor")
            async def seen(self, ctx: WatchContext, message: Notification) -> None:
                pass


def test_a_watcher_for_the_wrong_side_warns_where_it_is_written() -> None:
    with pytest.warns(UserWarning, match=r"session/update comes from the successor"):
        class Wrong(Proxy):
            @watch("session/update")
            def seen(self, ctx: WatchContext, message: Notification) -> None:
                pass


def test_a_watcher_of_a_request_warns_that_only_notifications_are_watched() -> None:
    with pytest.warns(UserWarning, match=r"session/prompt is a request.*use @on"):
        class Wrong(Proxy):
            @watch("session/prompt")
            def seen(self, ctx: WatchContext, message: Notification) -> None:
                pass


async def test_the_watch_example_in_writing_a_proxy_remembers_tool_calls_as_written() -> None:
    from pathlib import Path

    doc = (Path(__file__).parent.parent / "docs" / "writing-a-proxy.md").read_text()
    code = next(block.split("```", 1)[0] for block in doc.split("```python\n")[1:]
                if "class ToolLog" in block)
    namespace: dict[str, Any] = {}
    exec(compile(code, "writing-a-proxy.md", "exec"), namespace)

    async def prompt(agent: ScriptedAgent, message: Message) -> object:
        sid = message.params_value()["sessionId"]
        await agent.notify("session/update", {"sessionId": sid, "update": {
            "sessionUpdate": "tool_call", "toolCallId": "t1", "title": "Read README"}})
        await agent.notify("session/update", update(sid, "done"))
        return {"stopReason": "end_turn"}

    class Kept(namespace["ToolLog"]):  # type: ignore[misc]
        """Keeps the scope the example's watcher wrote to."""

        @watch("session/update", source="successor")
        def seen(self, ctx: WatchContext, message: Notification) -> None:
            super().seen(ctx, message)
            self.scope = ctx.session

    proxy = Kept()
    async with open_test_chain([proxy], ScriptedAgent({"session/prompt": prompt})) as client:
        with anyio.fail_after(5):
            sid = await client.new_session()
            await client.prompt(sid, "go")
    assert client.agent_text(sid) == "done"
    assert proxy.scope.session_id == sid
    assert proxy.scope.state["tools"] == ["Read README"]


class HandlesUpdates(Proxy):
    """Handles the agent's updates (forwarding them): the router cannot route past it."""

    @on("session/update", source="successor")
    async def relay(self, ctx: ProxyContext, message: Message) -> None:
        await ctx.forward()


async def test_a_watcher_routed_past_on_the_way_to_a_handling_proxy_still_sees_the_update(
) -> None:
    # editor - handles - watches - agent: the update goes past `watches` straight to
    # `handles` (the full route, not the plain-notification shortcut); the watcher is owed
    # the look it would get if the update visited it.
    handles, watches = HandlesUpdates(), Counts()
    async with open_test_chain([handles, watches], streaming_agent(2)) as client:
        with anyio.fail_after(5):
            sid = await client.new_session()
            await client.prompt(sid, "go")
            await client.wait_for("session/update", 2)
    assert watches.lines == ["counts:0", "counts:1"]
