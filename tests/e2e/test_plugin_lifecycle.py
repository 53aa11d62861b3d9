"""A plugin's lifecycle hooks in a real conductor process, which exits with os._exit: what
the plugin flushes in chain_stopped reaches its file, in-process and stand-alone."""

from __future__ import annotations

import json
import signal
from typing import TYPE_CHECKING

import anyio
import pytest

from conductor.supervise.signals import EXIT_SIGNAL
from conductor.testing import open_process_client
from tests.conftest import BIN, child_env, conductor_argv
from tests.wire_client import open_conductor

if TYPE_CHECKING:
    from pathlib import Path

PLUGIN = f"{BIN / 'lifecycle_proxy.py'}:Lifecycle"


@pytest.mark.parametrize("mode", ["in-process", "stand-alone"])
async def test_hooks_run_in_order_and_what_chain_stopped_flushes_is_written(
        tmp_path: Path, mode: str) -> None:
    log = tmp_path / "hooks.log"
    options = json.dumps({"path": str(log)})
    entry = f"plugin = {json.dumps(PLUGIN)}\noptions = {{ path = {json.dumps(str(log))} }}" \
        if mode == "in-process" else "command = " + json.dumps(
            ["${PYTHON}", "-m", "conductor", "serve-proxy", PLUGIN, "--options", options])
    chain = tmp_path / "chain.toml"
    chain.write_text(f'[[proxy]]\nname = "hooks"\n{entry}\n\n[agent]\n'
                     'command = ["${PYTHON}", "-m", "conductor.demo_agent"]\n', encoding="utf-8")
    async with open_process_client(conductor_argv("--chain", str(chain)),
                                   env=child_env()) as client:
        with anyio.fail_after(20):
            sid = await client.new_session("/tmp")
            await client.prompt(sid, "hello")
    # The client closed its input and the conductor exited: the session was still open.
    assert log.read_text(encoding="utf-8").splitlines() == [
        "chain_started", f"opened {sid}", f"closed {sid}: stopped", "chain_stopped"]


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])
async def test_a_stand_alone_proxy_stopped_by_a_signal_runs_its_stop_hooks(
        tmp_path: Path, signum: signal.Signals) -> None:
    # Stopped by a signal (the conductor's TERM after its grace, `kill`, a service manager),
    # it must end like on EOF: every session closed, chain_stopped, what it flushes written.
    log = tmp_path / "hooks.log"
    async with open_conductor("serve-proxy", PLUGIN, "--options",
                              json.dumps({"path": str(log)})) as proxy:
        with anyio.fail_after(20):
            await proxy.send({"jsonrpc": "2.0", "id": 0, "method": "_proxy/initialize",
                              "params": {"protocolVersion": 1}})
            wrapped = await proxy.read_until(lambda m: m.get("method") == "_proxy/successor")
            await proxy.send({"jsonrpc": "2.0", "id": wrapped["id"],
                              "result": {"protocolVersion": 1}})
            await proxy.response(0)
            await proxy.send({"jsonrpc": "2.0", "id": 1, "method": "session/new",
                              "params": {"cwd": "/", "mcpServers": []}})
            wrapped = await proxy.read_until(lambda m: m.get("method") == "_proxy/successor")
            await proxy.send({"jsonrpc": "2.0", "id": wrapped["id"],
                              "result": {"sessionId": "s1"}})
            await proxy.response(1)
            proxy.signal(signum)
            code = await proxy.wait()
    assert code == EXIT_SIGNAL[signum], proxy.stderr_text
    assert log.read_text(encoding="utf-8").splitlines() == [
        "chain_started", "opened s1", "closed s1: stopped", "chain_stopped"]
