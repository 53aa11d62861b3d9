"""The editor's own command line (`acp-conductor --chain FILE`) is served without click, and
says exactly what click's path would."""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
from typing import TYPE_CHECKING

import pytest
from click.testing import CliRunner

from conductor.cli import entry
from conductor.cli.app import main as with_click
from conductor.errors import ConfigError
from tests.conftest import child_env, conductor_argv

if TYPE_CHECKING:
    from pathlib import Path


@pytest.mark.parametrize(("argv", "chain"), [
    (["--chain", "chain.toml"], "chain.toml"),
    (["--chain=chain.toml"], "chain.toml"),
    (["--chain", "demo"], "demo"),
    (["--chain", "chain.toml", "--log-level", "info"], None),
    (["--log-level", "info", "--chain", "chain.toml"], None),
    (["run", "--chain", "demo", "hi"], None),
    (["agent", "python proxy.py"], None),
    (["--chain"], None),
    (["--chain="], None),
    (["--chain", "--help"], None),
    (["--chain", "-"], None),
    (["--help"], None),
    ([], None),
])
def test_only_the_editors_own_command_line_skips_click(argv: list[str],
                                                        chain: str | None) -> None:
    assert entry.editor_invocation(argv) == chain


def test_a_directory_or_shell_completion_is_left_to_click(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    assert entry.editor_invocation(["--chain", str(tmp_path)]) is None
    monkeypatch.setenv(entry.COMPLETION_VAR, "bash_complete")
    assert entry.editor_invocation(["--chain", "demo"]) is None


def test_an_unreadable_chain_file_is_left_to_click(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """click's `--chain` type refuses it with its usage line; the fast path would instead
    say `cannot read` (as root every file is readable: deny it as a user would be)."""

    path = tmp_path / "chain.toml"
    path.write_text('[agent]\ncommand = ["x"]\n', encoding="utf-8")
    path.chmod(0)
    if os.access(path, os.R_OK):
        real = os.access
        monkeypatch.setattr(os, "access", lambda p, mode, **kw: False if os.fspath(p) == str(
            path) and mode & os.R_OK else real(p, mode, **kw))
    assert entry.editor_invocation(["--chain", str(path)]) is None
    assert entry.editor_invocation([f"--chain={path}"]) is None


BAD_CHAINS = {
    "missing": None,
    "not-toml": "[agent\n",
    "unknown-field": '[agent]\ncommand = ["x"]\ncolour = "red"\n',
    "no-agent": '[[proxy]]\nuse = "passthrough"\n',
    "empty-command": "[agent]\ncommand = []\n",
    "unknown-proxy": '[[proxy]]\nuse = "nope"\n\n[agent]\ncommand = ["x"]\n',
}


def both_paths_fail_alike(argv: list[str], monkeypatch: pytest.MonkeyPatch,
                          capsys: pytest.CaptureFixture[str]) -> str:
    """Run `argv` through click and through the click-free entry: both must exit 2 with the
    same stderr and nothing on stdout. Returns that stderr."""
    clicked = CliRunner().invoke(with_click, argv)
    monkeypatch.setattr(sys, "argv", ["acp-conductor", *argv])
    with pytest.raises(SystemExit) as exited:
        entry.main()
    fast = capsys.readouterr()
    assert exited.value.code == clicked.exit_code == 2
    assert fast.out == clicked.stdout == ""
    assert fast.err == clicked.stderr
    return fast.err


@pytest.mark.parametrize("case", sorted(BAD_CHAINS))
def test_a_bad_chain_file_is_reported_as_click_reports_it(
        case: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "chain.toml"
    if BAD_CHAINS[case] is not None:
        path.write_text(BAD_CHAINS[case], encoding="utf-8")
    err = both_paths_fail_alike(["--chain", str(path)], monkeypatch, capsys)
    assert err.startswith(f"acp-conductor: error: {path}")


def initialize_importing(*args: str) -> set[str]:
    """Start a real conductor with `args`, have it answer initialize (the demo agent), and
    return the modules it imported (-X importtime, which children do not inherit)."""
    init = {"jsonrpc": "2.0", "id": 1, "method": "initialize",
            "params": {"protocolVersion": 1, "clientCapabilities": {}}}
    python, *rest = conductor_argv(*args)
    done = subprocess.run([python, "-X", "importtime", *rest],
                          input=json.dumps(init) + "\n", capture_output=True, text=True,
                          env=child_env(), timeout=60, check=False)
    assert done.returncode == 0, done.stderr
    answer = json.loads(done.stdout.splitlines()[0])
    assert answer["id"] == 1 and answer["result"]["agentInfo"]["name"] == "demo-agent"
    imported = {line.rpartition("|")[2].strip() for line in done.stderr.splitlines()
                if line.startswith("import time:")}
    assert "conductor.serve" in imported  # the import log is what it seems
    return imported


def test_the_editors_command_line_answers_initialize_without_importing_click() -> None:
    imported = initialize_importing("--chain", "demo")
    assert "click" not in imported
    # The demo's passthrough plugin takes no options: nothing to validate, so no pydantic
    # and its ≈ 100 ms of CPU (conductor/plugins/no_options.py).
    assert "conductor.plugins.api" in imported and "pydantic" not in imported


@pytest.mark.parametrize(("argv", "commands"), [
    (["agent", "npx some-agent"], ["npx some-agent"]),
    (["agent", "python proxy.py", "npx some-agent"], ["python proxy.py", "npx some-agent"]),
    (["agent"], None),
    (["agent", "--help"], None),
    (["agent", "npx a", "--log-level", "info"], None),
    (["--log-level", "info", "agent", "npx a"], None),
    (["proxy", "python p.py"], None),
])
def test_only_a_plain_agent_command_line_skips_click(argv: list[str],
                                                     commands: list[str] | None) -> None:
    assert entry.agent_invocation(argv) == commands


@pytest.mark.parametrize("commands", [[""], ["python proxy.py", "  "]])
def test_a_bad_agent_command_is_reported_as_click_reports_it(
        commands: list[str], monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    assert "command is empty" in both_paths_fail_alike(["agent", *commands], monkeypatch, capsys)


def test_agent_mode_answers_initialize_without_importing_click() -> None:
    agent = shlex.join([sys.executable, "-m", "conductor", "demo-agent"])
    assert "click" not in initialize_importing("agent", agent)


@pytest.mark.parametrize(("raised", "code", "said"), [
    (ExceptionGroup("in a task group", [ConfigError("bad", field="--x")]), 2,
     "acp-conductor: error: --x: bad"),
    (ExceptionGroup("outer", [ExceptionGroup("inner", [ValueError("the real cause")])]), 1,
     "acp-conductor: internal error: ValueError: the real cause"),
    # Ctrl-C while something else failed: the user's stop wins, without a traceback
    (BaseExceptionGroup("both", [ValueError("meanwhile"), KeyboardInterrupt()]), 130, "")])
def test_an_error_raised_in_a_task_group_is_reported_as_itself(
        capsys: pytest.CaptureFixture[str], raised: BaseException, code: int,
        said: str) -> None:
    # An error out of a task group arrives wrapped: it was reported as "internal error:
    # ExceptionGroup: unhandled errors in a TaskGroup (1 sub-exception)", exit 1, even
    # for a ConductorError with its own exit code and message.
    from conductor.cli.guard import errors_reported

    with pytest.raises(SystemExit) as exited, errors_reported(None):
        raise raised
    assert exited.value.code == code
    assert said in capsys.readouterr().err
