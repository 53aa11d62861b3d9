"""Tools from a proxy reach a real agent process: the documented command, and the same
plugin run stand-alone (`serve-proxy`) behind the conductor."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from tests.conftest import REPO, child_env, conductor_argv


def acp_conductor() -> list[str]:
    """The installed console script next to this interpreter (what a user types)."""
    script = Path(sys.executable).parent / "acp-conductor"
    return [str(script)] if script.exists() else conductor_argv()


def test_the_demo_agent_calls_a_session_tools_tool_with_the_documented_command() -> None:
    result = subprocess.run([*acp_conductor(), "run", "--chain", "tools",
                             "use the tool"], capture_output=True, text=True,
                            env=child_env(), timeout=60, cwd=REPO)
    assert result.returncode == 0, result.stderr
    assert "Tool chain of session-tools says:" in result.stdout
    assert "session-tools: proxy (in-process), running" in result.stdout
    assert "demo-agent: agent, running" in result.stdout
    assert "[tool] other: session-tools: chain (completed)" in result.stderr


def test_the_same_plugin_serves_its_tools_stand_alone(tmp_path: Path) -> None:
    chain = tmp_path / "chain.toml"
    chain.write_text(
        '[[proxy]]\nname = "tools"\n'
        'command = ["${PYTHON}", "-m", "conductor", "serve-proxy", "session-tools"]\n'
        '[agent]\ncommand = ["${PYTHON}", "-m", "conductor.demo_agent"]\n', encoding="utf-8")
    result = subprocess.run(conductor_argv("run", "--chain", str(chain),
                                           "tool:search_transcript tool"),
                            capture_output=True, text=True, env=child_env(), timeout=60,
                            cwd=REPO)
    assert result.returncode == 0, result.stderr
    assert "Tool search_transcript of session-tools says:\nuser: tool:search_transcript " \
        "tool" in result.stdout


def test_an_opt_in_server_named_in_the_chain_file_is_declared_by_a_stand_alone_provider(
        tmp_path: Path) -> None:
    # permissions offers its server opt-in: only the chain file's [[mcp_server]] asks for
    # it, and a provider running as a process has no other way to learn that it was asked.
    chain = tmp_path / "chain.toml"
    chain.write_text(
        '[[proxy]]\nname = "guard"\n'
        'command = ["${PYTHON}", "-m", "conductor", "serve-proxy", "permissions"]\n'
        '[agent]\ncommand = ["${PYTHON}", "-m", "conductor.demo_agent"]\n'
        '[[mcp_server]]\nname = "permissions"\ntype = "acp"\nprovider = "guard"\n'
        'required = true\n', encoding="utf-8")
    result = subprocess.run(conductor_argv("run", "--chain", str(chain), "tool:rules tool"),
                            capture_output=True, text=True, env=child_env(), timeout=60,
                            cwd=REPO)
    assert result.returncode == 0, result.stderr
    assert "Tool rules of permissions says:\notherwise: ask" in result.stdout
