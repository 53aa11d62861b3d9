"""A proxy's life: chain_started before anything, every session closed with a reason,
chain_stopped last; in-process (through the real router) and stand-alone."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

import anyio

from conductor.jsonrpc.codes import ErrorCode
from conductor.plugins import Proxy, ProxyContext, SessionScope, on
from conductor.plugins.host import serve_proxy
from conductor.testing import ScriptedAgent, open_test_chain
from conductor.transport.memory import memory_pipe

if TYPE_CHECKING:
    from pathlib import Path

    import pytest

    from conductor.jsonrpc.message import Request


class Recorder(Proxy):
    """Records its hooks and the first message it handles."""

    def __init__(self) -> None:
        super().__init__()
        self.events: list[str] = []

    async def chain_started(self) -> None:
        self.events.append("chain_started")

    @on("initialize")
    async def initialize(self, ctx: ProxyContext, message: Request) -> object:
        self.events.append("initialize")
        return await ctx.forward()

    async def session_opened(self, session: SessionScope) -> None:
        self.events.append(f"opened {session.session_id}")

    async def session_closed(self, session: SessionScope) -> None:
        self.events.append(f"closed {session.session_id}: {session.closed_reason}")

    async def chain_stopped(self) -> None:
        self.events.append("chain_stopped")


async def test_the_chain_hooks_bracket_everything_and_each_session_closes_with_its_reason(
) -> None:
    recorder = Recorder()
    agent = ScriptedAgent(replies={"session/delete": {}})
    async with open_test_chain([recorder], agent) as client:
        one, two, three = [await client.new_session() for _ in range(3)]
        await client.call("session/close", {"sessionId": one})
        await client.call("session/delete", {"sessionId": two})
        assert "chain_stopped" not in recorder.events
    assert recorder.events == [
        "chain_started", "initialize", f"opened {one}", f"opened {two}", f"opened {three}",
        f"closed {one}: closed", f"closed {two}: deleted", f"closed {three}: stopped",
        "chain_stopped"]


class FailsToStart(Proxy):
    """Cannot open what it needs."""

    async def chain_started(self) -> None:
        raise OSError("database is locked")


async def refused_initialize(proxy: Proxy[Any]) -> dict[str, Any]:
    """The error the editor's initialize gets from a chain of `proxy`, named "store"."""
    proxy.rename("store")
    async with open_test_chain([proxy], initialize=False) as client:
        with anyio.fail_after(5):
            answer = await client.request("initialize", {"protocolVersion": 1})
    error: dict[str, Any] = answer.error_value()
    assert error["code"] == ErrorCode.COMPONENT_FAILED
    assert "store" in error["message"]
    assert error["data"]["component"] == "store"
    return error


async def test_a_proxy_whose_chain_started_raises_fails_initialize_naming_it() -> None:
    error = await refused_initialize(FailsToStart())
    assert "chain_started failed: OSError: database is locked" in error["message"]


class OffersNoTools(Proxy):
    """Cannot say which MCP servers it offers."""

    def mcp_servers(self) -> list[Any]:
        raise ValueError("no tools configured")


async def test_a_proxy_whose_mcp_servers_raises_fails_initialize_naming_it() -> None:
    # It was "acp-conductor: internal error: ValueError: no tools configured", exit 1,
    # naming no proxy.
    error = await refused_initialize(OffersNoTools())
    assert "mcp_servers failed: ValueError: no tools configured" in error["message"]


class HangsAtStart(Proxy):
    """Waits for a server that never answers."""

    async def chain_started(self) -> None:
        await anyio.sleep_forever()


async def test_a_proxy_whose_chain_started_never_returns_fails_initialize_naming_it(
        monkeypatch: pytest.MonkeyPatch) -> None:
    # Else the editor's initialize waits for ever (no request_timeout covers the start).
    monkeypatch.setattr("conductor.plugins.host.START_HOOK_BOUND", 0.2)
    error = await refused_initialize(HangsAtStart())
    assert "chain_started did not return within 0.2s" in error["message"]


class BrokenHooks(Recorder):
    async def session_closed(self, session: SessionScope) -> None:
        await super().session_closed(session)
        raise RuntimeError("flush failed")


async def test_a_failing_session_closed_hook_does_not_skip_the_others_or_chain_stopped() -> None:
    recorder = BrokenHooks()
    async with open_test_chain([recorder]) as client:
        await client.new_session()
        await client.new_session()
    assert recorder.events[-3:] == ["closed session-1: stopped", "closed session-2: stopped",
                                    "chain_stopped"]


async def test_a_stand_alone_proxy_runs_the_same_hooks_when_its_stdin_ends() -> None:
    recorder = Recorder()
    to_proxy, proxy_in = memory_pipe()
    proxy_out, from_proxy = memory_pipe()
    buffered = b""

    async def read_line() -> dict[str, object]:
        nonlocal buffered
        while b"\n" not in buffered:
            buffered += await from_proxy.receive()
        line, buffered = buffered.split(b"\n", 1)
        decoded: dict[str, object] = json.loads(line)
        return decoded

    async def send(message: dict[str, object]) -> None:
        await to_proxy.send(json.dumps({"jsonrpc": "2.0", **message}).encode() + b"\n")

    with anyio.fail_after(5):
        async with anyio.create_task_group() as tg:
            tg.start_soon(serve_proxy, recorder, proxy_in, proxy_out)
            await send({"id": 1, "method": "session/new", "params": {"cwd": "/",
                                                                     "mcpServers": []}})
            forwarded = await read_line()  # to its successor, in the proxy protocol
            assert forwarded["method"] == "_proxy/successor"
            await send({"id": forwarded["id"], "result": {"sessionId": "s-1"}})
            assert (await read_line())["result"] == {"sessionId": "s-1"}
            await to_proxy.aclose()  # the conductor went away
    await from_proxy.aclose()
    await proxy_in.aclose()
    assert recorder.events == ["chain_started", "opened s-1", "closed s-1: stopped",
                               "chain_stopped"]


async def test_check_blames_a_plugin_whose_chain_started_fails(tmp_path: Path) -> None:
    from conductor.config import load_chain
    from conductor.editor.check import check_chain

    (tmp_path / "locked.py").write_text(
        "from conductor.plugins import Proxy\n\n"
        "class Locked(Proxy):\n"
        "    async def chain_started(self):\n"
        "        raise OSError('database is locked')\n", encoding="utf-8")
    chain = tmp_path / "chain.toml"
    chain.write_text(f'[[proxy]]\nname = "store"\nplugin = "{tmp_path / "locked.py"}:Locked"\n'
                     '[agent]\ncommand = ["${PYTHON}", "-m", "conductor.demo_agent"]\n',
                     encoding="utf-8")
    report = await check_chain(load_chain(str(chain)), timeout=20)
    assert not report.ok
    assert report.failed == "store"
    assert report.exit_code == 3
    store = next(c for c in report.components if c.name == "store")
    assert store.error == {"message": "store: chain_started failed: OSError: database is "
                                      "locked"}


class FailsToClose(Proxy):
    """Its session_closed hook cannot write its summary."""

    async def session_closed(self, session: SessionScope) -> None:
        raise OSError("disk full")


async def test_a_failing_session_closed_hook_is_logged_and_the_close_still_succeeds(
        caplog: pytest.LogCaptureFixture) -> None:
    # The agent closed the session: answering the editor an error would tell it the session
    # is still open (it is not, anywhere). The hook's failure is the plugin's, and logged,
    # as it is for an expired or a stopped session.
    agent = ScriptedAgent(replies={"session/delete": {}})
    async with open_test_chain([FailsToClose()], agent) as client:
        with anyio.fail_after(5):
            one, two = await client.new_session(), await client.new_session()
            closed = await client.request("session/close", {"sessionId": one})
            deleted = await client.request("session/delete", {"sessionId": two})
    assert (closed.result_value(), deleted.result_value()) == ({}, {})
    assert "proxy failstoclose failed handling session_closed of session-1: OSError: disk " \
        "full" in caplog.text


class HangsInSessionHooks(Proxy):
    """Its session hooks wait for a server that never answers (for the second session)."""

    def __init__(self) -> None:
        super().__init__()
        self.opened = 0

    async def session_opened(self, session: SessionScope) -> None:
        self.opened += 1
        if self.opened == 2:
            await anyio.sleep_forever()

    async def session_closed(self, session: SessionScope) -> None:
        await anyio.sleep_forever()


async def test_session_hooks_that_never_return_fail_or_are_abandoned_naming_the_proxy(
        monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    # They run inline, in the proxy's dispatch: the whole chain stood still behind them.
    monkeypatch.setattr("conductor.plugins.host.SESSION_HOOK_BOUND", 0.2)
    proxy = HangsInSessionHooks()
    proxy.rename("store")
    async with open_test_chain([proxy]) as client:
        with anyio.fail_after(5):
            sid = await client.new_session()
            refused = await client.request("session/new", {"cwd": "/", "mcpServers": []})
            closed = await client.request("session/close", {"sessionId": sid})
            assert await client.new_session()  # the chain goes on
    error = refused.error_value()
    assert error["code"] == ErrorCode.HANDLER_FAILED
    assert error["data"]["component"] == "store"
    assert "session_opened did not return within 0.2s" in error["message"]
    assert closed.result_value() == {}  # the agent did close it
    assert f"proxy store failed handling session_closed of {sid}: TimeoutError: " \
        "session_closed did not return within 0.2s" in caplog.text
