"""`acp-conductor check`: every shipped chain initializes; failures name the component."""

from __future__ import annotations

import functools
import io
import json
import os
import re
import signal
import subprocess
import sys
from typing import TYPE_CHECKING

import pytest

from tests.conftest import REPO, child_env, conductor_argv
from tests.in_process import conductor

if TYPE_CHECKING:
    from pathlib import Path

CHAINS = sorted((REPO / "chains").glob("*.toml"))


@functools.cache  # the same check of the same file, in two tests: run once a worker
def check(*args: str, columns: str = "160") -> subprocess.CompletedProcess[str]:
    """`acp-conductor check ARGS` in this process (tests/in_process.py); a terminal and
    Ctrl-C are tested on a real process (below)."""
    return conductor("check", *args, env={"COLUMNS": columns})


@pytest.mark.parametrize("chain", CHAINS, ids=[c.name for c in CHAINS])
def test_every_chain_in_chains_passes_check(chain: Path) -> None:
    result = check("--chain", str(chain), "--json")
    assert result.returncode == 0, result.stdout + result.stderr
    report = json.loads(result.stdout)
    assert report["ok"] is True
    assert all(c["pid"] and c["protocolVersion"] for c in report["components"])


def test_check_reports_each_component_it_started() -> None:
    result = check("--chain", str(REPO / "chains" / "demo.toml"), "--json")
    report = json.loads(result.stdout)
    names = [(c["name"], c["role"]) for c in report["components"]]
    assert names == [("passthrough", "proxy"), ("demo-agent", "agent")]
    agent = report["components"][1]
    assert agent["agentInfo"] == {"name": "demo-agent", "version": "0.1.0"}
    assert agent["capabilities"]["loadSession"] is True
    assert agent["mcpTransports"] == ["stdio", "acp"]  # it speaks MCP-over-ACP itself
    assert agent["authMethods"] == []
    table = check("--chain", str(REPO / "chains" / "demo.toml"))
    assert table.returncode == 0
    for word in ("passthrough", "demo-agent", "loadSession", "stdio", "ok"):
        assert word in table.stdout


def test_check_fails_with_the_failing_components_stderr_tail(tmp_path: Path) -> None:
    chain = tmp_path / "bad.toml"
    chain.write_text(
        '[[proxy]]\nname = "pass"\n'
        'command = ["${PYTHON}", "-m", "acp_conductor_proxies.passthrough"]\n'
        f'[agent]\nname = "broken"\ncommand = ["{sys.executable}", "-c", '
        '"import sys; sys.stderr.write(\'missing API key\\\\n\'); sys.exit(4)"]\n',
        encoding="utf-8")
    result = check("--chain", str(chain))
    assert result.returncode == 3
    assert "broken" in result.stderr
    assert "missing API key" in result.stderr
    as_json = json.loads(check("--chain", str(chain), "--json").stdout)
    assert as_json["ok"] is False
    assert as_json["failedComponent"] == "broken"
    assert "missing API key" in as_json["stderrTail"]


def test_check_of_a_missing_command_names_it(tmp_path: Path) -> None:
    chain = tmp_path / "missing.toml"
    chain.write_text('[agent]\ncommand = "no-such-agent-binary --flag"\n', encoding="utf-8")
    result = check("--chain", str(chain))
    assert result.returncode == 3
    assert "no-such-agent-binary" in result.stderr


def test_the_failure_line_is_one_line_in_an_80_column_log(tmp_path: Path) -> None:
    chain = tmp_path / "missing.toml"
    chain.write_text('[agent]\ncommand = "no-such-agent-binary-with-a-long-name --flag"\n',
                     encoding="utf-8")
    result = check("--chain", str(chain), columns="80")
    assert result.returncode == 3
    assert "acp-conductor: check failed: agent: command not found: " \
           "no-such-agent-binary-with-a-long-name (No such file or directory)\n" in result.stderr


def test_check_passes_without_an_optional_proxy_that_cannot_start_and_says_so(
        tmp_path: Path) -> None:
    chain = tmp_path / "optional.toml"
    chain.write_text('[[proxy]]\nname = "extra"\ncommand = "no-such-proxy-binary"\n'
                     'optional = true\n\n'
                     '[agent]\ncommand = ["${PYTHON}", "-m", "conductor.demo_agent"]\n',
                     encoding="utf-8")
    result = check("--chain", str(chain), "--json")
    assert result.returncode == 0, result.stdout + result.stderr
    extra = json.loads(result.stdout)["components"][0]
    assert extra["name"] == "extra"
    assert "command not found: no-such-proxy-binary" in extra["bypassed"]


def test_check_of_an_invalid_file_exits_2() -> None:
    result = check("--chain", "does/not/exist.toml")
    assert result.returncode == 2
    assert "file not found" in result.stderr


def test_check_of_a_misshapen_file_reports_every_problem_in_one_run(tmp_path: Path) -> None:
    chain = tmp_path / "c.toml"
    chain.write_text('[[proxy]]\nuse = "permisions"\n[[proxy]]\nuse = "redact"\n'
                     'options = { patern = "x" }\n[agnet]\ncommand = "python agent.py"\n',
                     encoding="utf-8")
    result = check("--chain", str(chain))
    assert result.returncode == 2
    assert result.stdout == ""
    lines = result.stderr.splitlines()
    assert lines[0] == f"acp-conductor: error: {chain}: 3 problems:"
    assert [line.split(":")[0].strip() for line in lines[1:]] == [
        "agnet", "proxy[0].use", "proxy[1].options.patern"]
    assert "did you mean 'permissions'?" in lines[2]
    assert "did you mean 'patterns'?" in lines[3]


def test_an_initialize_answer_nested_too_deeply_is_reported_not_fatal() -> None:
    from conductor.editor.check import _Recorder
    from conductor.jsonrpc.message import Raw, Request, Response

    recorder = _Recorder()
    recorder.message("agent", "out", Request(id=Raw(b"1"), method="initialize",
                                             params=Raw(b"{}")))
    recorder.message("agent", "in", Response(id=Raw(b"1"),
                                             result=Raw(b"[" * 5000 + b"]" * 5000)))
    error = recorder.get("agent").error
    assert isinstance(error, dict)
    assert "nested too deeply" in error["message"]


def test_a_chain_of_proxies_is_checked_as_a_proxy_with_a_stand_in_successor(
        tmp_path: Path) -> None:
    chain = tmp_path / "proxies.toml"
    chain.write_text('[[proxy]]\nuse = "redact"\n[[proxy]]\n'
                     'command = ["${PYTHON}", "-m", "conductor", "serve-proxy", "passthrough"]\n',
                     encoding="utf-8")
    result = check("--chain", str(chain), "--json")
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    assert report["mode"] == "proxy"
    assert [(c["name"], c["role"], c["protocolVersion"]) for c in report["components"]] == [
        ("redact", "proxy", 1), ("proxy:1", "proxy", 1)]
    plain = check("--chain", str(chain))
    assert "checked as a proxy" in plain.stdout


def test_check_off_a_terminal_prints_one_plain_line_per_component() -> None:
    result = check("--chain", "demo")
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert lines[0] == "demo: ok"
    assert lines[1].startswith("passthrough: proxy, in-process Passthrough, pid ")
    assert lines[2].startswith("demo-agent: agent, ")
    assert "loadSession" in lines[2] and "MCP: stdio" in lines[2]
    assert not set(result.stdout) & set("│┃━─┏┓┗┛╇")  # no table borders in a CI log


def test_check_on_a_terminal_draws_a_table() -> None:
    import os
    import pty

    primary, secondary = pty.openpty()
    with subprocess.Popen(conductor_argv("check", "--chain", "demo"), stdout=secondary,
                          stderr=subprocess.PIPE, env=child_env(COLUMNS="160"),
                          cwd=REPO) as process:
        os.close(secondary)
        seen = b""
        while True:
            try:
                chunk = os.read(primary, 65536)
            except OSError:  # EIO: the child closed the terminal
                break
            if not chunk:
                break
            seen += chunk
        assert process.wait(timeout=60) == 0
    os.close(primary)
    text = re.sub(r"\x1b\[[0-9;]*m", "", seen.decode("utf-8", "replace"))  # no colours
    assert re.search(r"[┃│] name +[┃│] role", text), text
    assert "demo-agent" in text


@pytest.mark.parametrize("result", [
    {"protocolVersion": 1, "agentCapabilities": ["loadSession"]},
    {"protocolVersion": 1, "agentCapabilities": "all", "authMethods": 5},
    {"protocolVersion": 1, "agentCapabilities": {}, "authMethods": 5}])
def test_a_malformed_initialize_answer_is_still_reported_not_an_internal_error(
        result: dict[str, object]) -> None:
    # check is where a broken agent gets diagnosed: capabilities that are not an object, or
    # authMethods that are not a list, raised AttributeError / TypeError (exit 1,
    # "internal error") instead of a report.
    from conductor.cli.check import _line
    from conductor.editor.check import ComponentReport

    report = ComponentReport("agent", "agent", result=result)
    summary = report.summary()
    assert summary["capabilities"] == {}
    assert summary["mcpTransports"][0] == "stdio"
    assert isinstance(summary["authMethods"], list)
    assert _line(report).startswith("agent: agent, ")


@pytest.mark.parametrize("command", [["check", "--timeout", "60"],
                                     ["call", "_x/y", "--timeout", "60"]])
def test_ctrl_c_during_check_or_call_says_interrupted_and_exits_130(
        tmp_path: Path, command: list[str]) -> None:
    chain = tmp_path / "mute.toml"
    chain.write_text('[agent]\nname = "mute"\ncommand = ["sh", "-c", "cat >/dev/null"]\n',
                     encoding="utf-8")
    proc = subprocess.Popen(conductor_argv("--log-level", "info", "--chain", str(chain),
                                           *command),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=child_env(),
                            cwd=REPO)
    try:
        seen = b""
        while b"started mute" not in seen:
            chunk = os.read(proc.stderr.fileno(), 65536)  # type: ignore[union-attr]
            assert chunk, seen
            seen += chunk
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 130
    assert out == b""
    assert (seen + err).decode().splitlines()[-1] == "acp-conductor: interrupted"


def test_the_table_on_a_terminal_shows_names_and_commands_as_written() -> None:
    from rich.console import Console

    from conductor.cli.check import _table
    from conductor.editor.check import CheckReport, ComponentReport

    # Names are plain (the chain file allows letters, digits, _ . : -), but a command, the
    # chain's path and what the agent answered are anybody's text.
    agent = ComponentReport(name="x", role="agent", argv=["[red]y", "[/]"],
                            result={"protocolVersion": 1, "agentCapabilities": {
                                "promptCapabilities": {"[bold]image": True}}})
    report = CheckReport(ok=True, components=[agent])
    console = Console(file=io.StringIO(), width=200, color_system=None)
    console.print(_table(report, "[i]chain.toml"))
    shown = console.file.getvalue()  # type: ignore[attr-defined]
    assert "[red]y [/]" in shown and "[i]chain.toml: ok" in shown
    assert "[bold]image" in shown


def test_what_components_answered_is_shown_not_obeyed_in_every_check_view(
        capsys: pytest.CaptureFixture[str]) -> None:
    from rich.console import Console

    from conductor.cli.check import _line, _table
    from conductor.editor.check import CheckReport, ComponentReport

    # An agent's answer (an auth method's name), a command, or a failing component's
    # stderr could clear the terminal, write its clipboard (OSC 52) or turn text around.
    tricks = ("\x1b[2J", "\x1b]52;c;cm0gLXJmIH4=\x07", "\u202e")
    agent = ComponentReport(name="x", role="agent", argv=["sh", "-c", "true\x1b[2J"],
                            result={"protocolVersion": 1, "agentCapabilities": {},
                                    "authMethods": [{"name": "x", "id":
                                                     "login\x1b]52;c;cm0gLXJmIH4=\x07\u202e"}]})
    report = CheckReport(ok=True, components=[agent])
    console = Console(file=io.StringIO(), width=200, color_system=None)
    console.print(_table(report, "chain.toml"))
    views = [console.file.getvalue(), _line(agent)]  # type: ignore[attr-defined]
    for view in views:
        assert not any(trick in view for trick in tricks), ascii(view)
        assert "login" in view


def test_check_shows_a_v2_agents_prompt_capabilities_and_auth_method_ids() -> None:
    from conductor.cli.check import _line
    from conductor.editor.check import ComponentReport

    # v2 moves prompt capabilities under `capabilities.session.prompt` (object markers, not
    # booleans) and names an auth method by `methodId`: check showed "session: prompt" and
    # the method's display name.
    agent = ComponentReport(name="a", role="agent", argv=["agent"], result={
        "protocolVersion": 2, "info": {"name": "a", "version": "1"},
        "capabilities": {"session": {"prompt": {"image": {}, "embeddedContext": {},
                                                "audio": None},
                                     "mcp": {"http": {}}, "delete": {}}},
        "authMethods": [{"type": "agent", "methodId": "oauth", "name": "Log in"}]})
    line = _line(agent)
    assert "prompt: image,embeddedContext" in line
    assert "session: delete" in line and "session: prompt" not in line
    assert "auth: oauth" in line
    assert "MCP: stdio, http" in line
