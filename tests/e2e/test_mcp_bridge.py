"""The bridge: real agents that only take http or stdio MCP servers (the official MCP SDK
client inside a real agent process) reach a plugin's tool through the conductor."""

from __future__ import annotations

import subprocess
import sys
from typing import TYPE_CHECKING

import pytest

from tests.conftest import BIN, REPO, child_env, conductor_argv

if TYPE_CHECKING:
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


def run(chain_file: str, prompt: str, *extra: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(conductor_argv(*extra, "run", "--chain", chain_file, prompt),
                          capture_output=True, text=True, env=child_env(), timeout=60,
                          cwd=REPO)


@pytest.fixture(scope="module", params=["http", "stdio"])
def turn(request: pytest.FixtureRequest,
         tmp_path_factory: pytest.TempPathFactory) -> tuple[subprocess.CompletedProcess[str],
                                                            Path]:
    """One traced turn in which the agent uses its bridged server (in MODE): each such run
    starts a conductor and an agent with the MCP and ACP SDKs (~2 s of CPU), and the tests
    below check different things about the same run."""
    mode = str(request.param)
    folder = tmp_path_factory.mktemp(mode)
    trace = folder / "t.jsonl"
    return run(chain(folder, mode), "find anyio", "--trace", str(trace)), trace


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


def test_a_request_without_the_token_is_refused_and_logged(tmp_path: Path) -> None:
    result = run(chain(tmp_path, "http"), "raw URL")
    assert result.returncode == 0, result.stderr
    assert "docs without its token: HTTP 401" in result.stdout
    assert "MCP bridge refused a http request" in result.stderr
    assert "no token" in result.stderr


def test_with_the_bridge_off_the_agent_gets_no_acp_server(tmp_path: Path) -> None:
    result = run(chain(tmp_path, "http", bridge="off"), "find x")
    assert result.returncode == 0, result.stderr
    assert "servers: []" in result.stdout
