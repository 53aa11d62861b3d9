"""The bridge: real agents that only take http or stdio MCP servers (the official MCP SDK
client inside a real agent process) reach a plugin's tool through the conductor."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
from typing import TYPE_CHECKING

import pytest

from tests.conftest import BIN, REPO, child_env, conductor_argv

if TYPE_CHECKING:
    from collections.abc import Sequence
    from pathlib import Path


def chain(tmp_path: Path, mode: str, bridge: str = "auto") -> str:
    path = tmp_path / "chain.toml"
    path.write_text(
        f'[conductor]\nmcp_bridge = "{bridge}"\n'
        f'[[proxy]]\nname = "docs"\nplugin = "{BIN / "docs_tools.py"}:Docs"\n'
        f'[agent]\nname = "mcp-client"\n'
        f'command = ["{sys.executable}", "{BIN / "mcp_client_agent.py"}", "{mode}"]\n',
        encoding="utf-8")
    return str(path)


def run(chain_file: str, prompt: str, *extra: str,
        then: Sequence[str] = ()) -> subprocess.CompletedProcess[str]:
    """`extra`: global options; `then`: options of `run`."""
    return subprocess.run(conductor_argv(*extra, "run", "--chain", chain_file, prompt, *then),
                          capture_output=True, text=True, env=child_env(), timeout=60,
                          cwd=REPO)


@pytest.fixture(scope="module", params=["http", "stdio"])
def turn(request: pytest.FixtureRequest,
         tmp_path_factory: pytest.TempPathFactory) -> tuple[subprocess.CompletedProcess[str],
                                                            Path]:
    """One traced turn in which the agent uses its bridged server (in MODE): each such run
    starts a conductor and an agent with the MCP and ACP SDKs (~2 s of CPU), and the tests
    below check different things about the same run. Over http a second turn then posts
    to the server without its token ("raw URL")."""
    mode = str(request.param)
    folder = tmp_path_factory.mktemp(mode)
    trace = folder / "t.jsonl"
    then: list[str] = []
    if mode == "http":
        (folder / "then.txt").write_text("raw URL\n", encoding="utf-8")
        then = ["--prompt-file", str(folder / "then.txt")]
    return run(chain(folder, mode), "find anyio", "--trace", str(trace), then=then), trace


def test_an_sdk_client_in_the_agent_calls_a_plugin_tool_over_the_bridge(
        turn: tuple[subprocess.CompletedProcess[str], Path]) -> None:
    result, _ = turn
    assert result.returncode == 0, result.stderr
    assert "servers: ['docs']" in result.stdout
    assert "docs (docs) tools ['search']; search said: found 'find anyio' in session " \
        "mcp-client-" in result.stdout, result.stdout + result.stderr


@pytest.mark.parametrize("turn", ["http"], indirect=True)
def test_the_agent_is_told_it_has_an_http_server_and_the_session_keeps_it(
        turn: tuple[subprocess.CompletedProcess[str], Path]) -> None:
    result, trace = turn
    assert result.returncode == 0, result.stderr
    text = trace.read_text(encoding="utf-8")
    assert '"mcp-bridged"' in text and '"transport":"http"' in text
    assert '"mcp-connected"' in text


@pytest.mark.parametrize("turn", ["http"], indirect=True)
def test_a_request_without_the_token_is_refused_and_logged(
        turn: tuple[subprocess.CompletedProcess[str], Path]) -> None:
    result, _ = turn
    assert result.returncode == 0, result.stderr
    assert "docs without its token: HTTP 401" in result.stdout
    assert "MCP bridge refused a http request" in result.stderr
    assert "no token" in result.stderr


def test_with_the_bridge_off_the_agent_gets_no_acp_server(tmp_path: Path) -> None:
    result = run(chain(tmp_path, "http", bridge="off"), "find x")
    assert result.returncode == 0, result.stderr
    assert "servers: []" in result.stdout


def test_a_shim_whose_session_the_conductor_ends_exits_cleanly_while_the_agent_holds_stdin(
        tmp_path: Path) -> None:
    # The conductor ends the session (the provider disconnected, its session closed) while
    # the agent's MCP client still holds the shim's stdin open: the shim's reader thread is
    # then blocked in a read of stdin, and a normal interpreter exit aborted on its lock
    # (SIGABRT, "Fatal Python error" on the agent's stderr) most of the time. A few runs
    # make that chance a near-certain failure.
    path = str(tmp_path / "bridge.sock")
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as listener:
        listener.bind(path)
        listener.listen(1)
        for _ in range(4):
            shim = subprocess.Popen(
                conductor_argv("mcp-shim", "key"), stdin=subprocess.PIPE,
                stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                env=child_env(ACP_CONDUCTOR_MCP_SOCKET=path, ACP_CONDUCTOR_MCP_TOKEN="t"))
            try:
                conn, _ = listener.accept()
                with conn, conn.makefile("rb") as lines:
                    assert json.loads(lines.readline()) == {"server": "key", "token": "t"}
                    conn.sendall(b'{"ok":true}\n')
                    assert shim.stdin is not None and shim.stdout is not None
                    shim.stdin.write(b'{"jsonrpc":"2.0","id":1,"method":"ping"}\n')
                    shim.stdin.flush()
                    assert json.loads(lines.readline())["method"] == "ping"
                    conn.sendall(b'{"jsonrpc":"2.0","id":1,"result":{}}\n')
                    assert json.loads(shim.stdout.readline()) == {
                        "jsonrpc": "2.0", "id": 1, "result": {}}
                    conn.shutdown(socket.SHUT_RDWR)  # the conductor ends the session
                returncode = shim.wait(timeout=30)
                assert shim.stderr is not None
                stderr = shim.stderr.read().decode()
            finally:
                if shim.poll() is None:
                    shim.kill()
                for stream in (shim.stdin, shim.stdout, shim.stderr):
                    if stream is not None:
                        stream.close()
            assert (returncode, stderr) == (0, "")


def test_a_shim_whose_agent_closed_its_stdout_exits_quietly_while_the_agent_holds_stdin(
        tmp_path: Path) -> None:
    # The agent stopped reading (closed the shim's stdout) but holds its stdin: the next
    # message from the conductor is a broken pipe, and the shim must leave without a
    # traceback or the abort of an interpreter exit with its stdin reader blocked.
    path = str(tmp_path / "bridge.sock")
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as listener:
        listener.bind(path)
        listener.listen(1)
        shim = subprocess.Popen(
            conductor_argv("mcp-shim", "key"), stdin=subprocess.PIPE,
            stdout=subprocess.PIPE, stderr=subprocess.PIPE,
            env=child_env(ACP_CONDUCTOR_MCP_SOCKET=path, ACP_CONDUCTOR_MCP_TOKEN="t"))
        try:
            conn, _ = listener.accept()
            with conn, conn.makefile("rb") as lines:
                assert json.loads(lines.readline()) == {"server": "key", "token": "t"}
                conn.sendall(b'{"ok":true}\n')
                assert shim.stdout is not None
                shim.stdout.close()  # the agent reads no more
                for _ in range(3):  # (the first write may still fit the pipe's buffer)
                    try:
                        conn.sendall(b'{"jsonrpc":"2.0","method":"notifications/x"}\n')
                    except OSError:
                        break
                returncode = shim.wait(timeout=30)
            assert shim.stderr is not None
            stderr = shim.stderr.read().decode()
        finally:
            if shim.poll() is None:
                shim.kill()
            for stream in (shim.stdin, shim.stderr):
                if stream is not None:
                    stream.close()
    assert (returncode, stderr) == (0, "")
