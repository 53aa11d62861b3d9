"""Everything a session holds is released when it ends: closed, refused, idle, disconnected.

Issue 11.4: memory grew with every session. These tests count what is left (session
records, proxy scopes) after many sessions, in memory; bench/soak.py measures the RSS.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import anyio
import pytest

from acp_conductor_proxies.context import Context, ContextOptions
from acp_conductor_proxies.permissions import Permissions, PermissionsOptions
from acp_conductor_proxies.redact import Redact, RedactOptions
from acp_conductor_proxies.transcript import Transcript, TranscriptOptions
from conductor.errors import RpcError
from conductor.plugins import CloseReason, Proxy, SessionScope
from conductor.routing.deadlines import Timeouts
from conductor.routing.sessions import SessionRecord
from conductor.testing import ScriptedAgent, open_test_chain

if TYPE_CHECKING:
    from collections.abc import Callable
    from pathlib import Path

    from conductor.jsonrpc.message import Notification, Request


class Recorder(Proxy):
    """Records each session's end and why."""

    def __init__(self) -> None:
        super().__init__()
        self.ended: list[tuple[str, CloseReason | None]] = []
        self.changed = anyio.Event()

    async def session_closed(self, session: SessionScope) -> None:
        self.ended.append((session.session_id, session.closed_reason))
        self.changed.set()
        self.changed = anyio.Event()

    async def wait_ended(self, count: int) -> None:
        while len(self.ended) < count:
            await self.changed.wait()


def built_ins(tmp_path: Path) -> list[Proxy]:
    proxies: list[Proxy] = [
        Permissions(PermissionsOptions(default="allow")),
        Context(ContextOptions(text="Answer briefly.")),
        Redact(RedactOptions(patterns=["sk-[a-z0-9]{8,}"])),
        Transcript(TranscriptOptions(directory=str(tmp_path / "transcripts"))),
    ]
    for i, proxy in enumerate(proxies):
        proxy.rename(f"p{i}")
    return proxies


def alive(kind: type, made: Callable[[], list[object]]) -> int:
    """How many `kind` the test made are still alive (`made`: objects_made_since_start)."""
    return sum(1 for o in made() if type(o) is kind)


async def refuse_odd_loads(agent: ScriptedAgent, message: Request) -> object:
    sid = message.params_value()["sessionId"]
    if int(sid.rsplit("-", 1)[1]) % 2:
        raise RpcError(-32002, "Resource not found", sid)
    return None


async def test_sessions_closed_or_refused_leave_nothing_behind_in_the_router_or_the_proxies(
        tmp_path: Path, objects_made_since_start: Callable[[], list[object]]) -> None:
    agent = ScriptedAgent({"session/load": refuse_odd_loads})
    proxies = [*built_ins(tmp_path), Recorder()]
    async with open_test_chain(proxies, agent, transport="pipes") as client:
        with anyio.fail_after(30):
            for i in range(30):
                sid = await client.new_session(str(tmp_path))
                await client.prompt(sid, "hello sk-abcdefgh1")
                await client.call("session/close", {"sessionId": sid})
                loaded = await client.request("session/load", {
                    "sessionId": f"old-{i}", "cwd": str(tmp_path), "mcpServers": []})
                assert loaded.is_error == bool(i % 2)
                if not loaded.is_error:
                    await client.call("session/close", {"sessionId": f"old-{i}"})
            assert alive(SessionScope, objects_made_since_start) == 0
            assert alive(SessionRecord, objects_made_since_start) == 0
    refused = [sid for sid, why in proxies[-1].ended if why is CloseReason.REFUSED]
    assert len(refused) == 15


async def test_an_idle_session_expires_but_one_in_a_turn_does_not_and_the_agent_is_not_told(
) -> None:
    recorder = Recorder()
    during_turn: list[tuple[str, CloseReason | None]] = []

    async def prompt(agent: ScriptedAgent, message: Request) -> object:
        await recorder.wait_ended(1)  # the idle session expires while this turn runs
        during_turn.extend(recorder.ended)
        return {"stopReason": "end_turn"}

    agent = ScriptedAgent({"session/prompt": prompt})
    expiry = Timeouts(session_idle_expiry=0.3)
    async with open_test_chain([recorder], agent, timeouts=expiry) as client:
        with anyio.fail_after(5):
            busy, idle = await client.new_session(), await client.new_session()
            await client.prompt(busy, "a long turn")
            assert during_turn == [(idle, CloseReason.EXPIRED)]
            await recorder.wait_ended(2)  # once its turn ended, the busy one goes too
    assert recorder.ended == [(idle, CloseReason.EXPIRED), (busy, CloseReason.EXPIRED)]
    assert agent.received_params("session/close") == []


async def test_sessions_still_open_when_the_connection_ends_are_released_as_stopped(
) -> None:
    recorder = Recorder()
    async with open_test_chain([recorder]) as client:
        with anyio.fail_after(5):
            sids = [await client.new_session() for _ in range(3)]
    assert sorted(recorder.ended) == [(sid, CloseReason.STOPPED) for sid in sorted(sids)]


@pytest.mark.parametrize("expiry", [0, -1])
def test_session_idle_expiry_must_be_positive(expiry: float) -> None:
    from conductor.config import parse_chain
    from conductor.errors import ConfigError

    with pytest.raises(ConfigError, match="session_idle_expiry"):
        parse_chain({"conductor": {"session_idle_expiry": expiry},
                     "agent": {"command": "x"}})


async def test_scopes_made_for_sessions_never_set_up_are_bounded(
        monkeypatch: pytest.MonkeyPatch,
        objects_made_since_start: Callable[[], list[object]]) -> None:
    from conductor.plugins import ProxyContext, on
    from conductor.plugins import host as plugin_host

    class Touch(Proxy):
        """Keeps per-session state on every prompt, like context and transcript do."""

        @on("session/prompt")
        async def prompt(self, ctx: ProxyContext, message: Request) -> object:
            assert ctx.session is not None
            ctx.session.state["seen"] = True
            return await ctx.forward()

    monkeypatch.setattr(plugin_host, "MAX_STRAY_SCOPES", 10)
    recorder = Recorder()
    async with open_test_chain([Touch(), recorder]) as client:
        with anyio.fail_after(10):
            for i in range(50):  # an editor's stale ids: never set up, never closed
                await client.prompt(f"stale-{i}", "hi")
            assert alive(SessionScope, objects_made_since_start) == 10
    assert recorder.ended == []  # never opened: no hook for their end either


async def test_thousands_of_sessions_expiring_at_once_never_wait_on_a_busy_proxy() -> None:
    """The router ends sessions in every in-process proxy. A proxy busy with a message
    must not hold the others' releases: with releases queued in its bounded inbox, 300 of
    them filled it and the expiring task waited for it, while it waited for the others."""
    from conductor.plugins import ProxyContext, on
    from conductor.plugins import host as plugin_host

    count = plugin_host.INBOX_SIZE + 44
    all_closed, holding = anyio.Event(), anyio.Event()

    class Busy(Proxy):
        @on("_test/hold")
        async def hold(self, ctx: ProxyContext, message: Notification) -> None:
            holding.set()
            await all_closed.wait()  # dispatch is held until then

    class Opener(Recorder):
        @on("_test/open", source="successor")
        async def open_many(self, ctx: ProxyContext, message: Notification) -> None:
            for _ in range(count):
                await ctx.open_session({"cwd": "/", "mcpServers": []})

        async def session_closed(self, session: SessionScope) -> None:
            await super().session_closed(session)
            if len(self.ended) == count:
                all_closed.set()

    agent = ScriptedAgent()
    opener = Opener()
    async with open_test_chain([Busy(), opener], agent,
                               timeouts=Timeouts(session_idle_expiry=0.2)) as client:
        with anyio.fail_after(10):
            await client.notify("_test/hold", {})
            await holding.wait()
            await agent.notify("_test/open", {})
            await all_closed.wait()
    assert {why for _, why in opener.ended} == {CloseReason.EXPIRED}


async def test_v2_fork_resume_close_and_delete_release_every_session(
        objects_made_since_start: Callable[[], list[object]]) -> None:
    async def resume(agent: ScriptedAgent, message: Request) -> object:
        if message.params_value()["sessionId"] == "gone":
            raise RpcError(-32002, "Resource not found", "gone")
        return {}

    async def fork(agent: ScriptedAgent, message: Request) -> object:
        return {"sessionId": "forked"}

    recorder = Recorder()
    agent = ScriptedAgent({"session/fork": fork, "session/resume": resume,
                           "session/delete": {}})
    async with open_test_chain([recorder], agent, initialize=False) as client:
        with anyio.fail_after(5):
            await client.initialize(2)
            sid = await client.new_session("/w")
            await client.call("session/fork", {"sessionId": sid, "cwd": "/w"})
            assert (await client.request("session/resume",
                                         {"sessionId": "gone", "cwd": "/w"})).is_error
            await client.call("session/resume", {"sessionId": "old", "cwd": "/w"})
            await client.call("session/close", {"sessionId": sid})
            await client.call("session/delete", {"sessionId": "forked"})
            await client.call("session/close", {"sessionId": "old"})
            await recorder.wait_ended(4)
            assert alive(SessionScope, objects_made_since_start) == 0
            assert alive(SessionRecord, objects_made_since_start) == 0
    assert recorder.ended == [("gone", CloseReason.REFUSED), (sid, CloseReason.CLOSED),
                              ("forked", CloseReason.DELETED), ("old", CloseReason.CLOSED)]


async def test_a_session_loaded_again_after_its_close_was_answered_is_open_in_the_proxies(
) -> None:
    # A load and a close race: the agent answers the close, then the load with success. The
    # session is open at the agent, so an in-process proxy has it open again too: its next
    # close ends it there (session_closed runs), not a session the proxy forgot.
    recorder = Recorder()
    closed = anyio.Event()

    async def load_after_close(agent: ScriptedAgent, message: Request) -> object:
        await closed.wait()
        return None

    agent = ScriptedAgent({"session/load": load_after_close})
    async with open_test_chain([recorder], agent) as client:
        with anyio.fail_after(5):
            sid = await client.new_session()
            async with anyio.create_task_group() as tg:
                tg.start_soon(client.request, "session/load",
                              {"sessionId": sid, "cwd": "/", "mcpServers": []})
                await agent.wait_for("session/load")
                await client.request("session/close", {"sessionId": sid})
                await recorder.wait_ended(1)
                closed.set()
            await client.request("session/close", {"sessionId": sid})  # ended before answered
    assert recorder.ended == [(sid, CloseReason.CLOSED), (sid, CloseReason.CLOSED)]
