"""Bad chain files and usage: exit 2 with the file, the key path and a hint; no traceback."""

from __future__ import annotations

import subprocess
from typing import TYPE_CHECKING

import pytest

from tests.conftest import child_env, conductor_argv
from tests.in_process import conductor

if TYPE_CHECKING:
    from pathlib import Path

AGENT = '[agent]\ncommand = "true"\n'

CASES = {
    "unknown key": (AGENT + 'comand = "typo"\n', ["agent.comand", "unknown key 'comand'",
                                                  "hint"]),
    "unknown proxy key": ('[[proxy]]\ncommand = "true"\nnmae = "p"\n' + AGENT,
                          ["proxy[0].nmae", "unknown key", "hint"]),
    "unknown table": (AGENT + "[agnet]\ncommand = 'x'\n", ["agnet", "unknown key", "hint"]),
    "bad type": ("[agent]\ncommand = 5\n", ["agent.command", "hint"]),
    "bad setting type": ('[conductor]\nmax_frame_bytes = "big"\n' + AGENT,
                         ["conductor.max_frame_bytes", "integer"]),
    "bad dialect": (AGENT + 'dialect = "klingon"\n', ["agent.dialect", "'spec' or 'legacy'"]),
    "missing command": ('[agent]\nname = "a"\n', ["agent.command", "hint: add it"]),
    "missing agent": ('[[proxy]]\ncommand = "true"\n', ["agent", "no agent",
                                                        "hint: add an [agent] table"]),
    "bad toml": ("[agent\ncommand = 'x'\n", ["not valid TOML", "line 1"]),
    "unset variable": (AGENT + 'env = { KEY = "${SURELY_UNSET_VAR_42}" }\n',
                       ["agent.env.KEY", "SURELY_UNSET_VAR_42 is not set",
                        "hint: export SURELY_UNSET_VAR_42"]),
    "unset variable in command": ('[agent]\ncommand = ["${SURELY_UNSET_VAR_42}"]\n',
                                  ["agent.command", "SURELY_UNSET_VAR_42"]),
    "several problems": ('[[proxy]]\nuse = "redcat"\n[agent]\ncommand = "true"\n'
                         'env = { K = "${SURELY_UNSET_VAR_42}" }\n',
                         ["2 problems:\n  proxy[0].use:", "did you mean 'redact'?",
                          "\n  agent.env.K: environment variable SURELY_UNSET_VAR_42"]),
    "duplicate names": ('[[proxy]]\nname = "x"\ncommand = "true"\n'
                        '[agent]\nname = "x"\ncommand = "true"\n',
                        ["agent.name", "duplicate component name 'x'", "hint"]),
}


def run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(conductor_argv(*args), env=child_env(), stdin=subprocess.DEVNULL,
                          capture_output=True, text=True, timeout=30, check=False)


def refused(*args: str) -> subprocess.CompletedProcess[str]:
    """A command line refused before anything starts: what it says and exits with is the
    same in this process (tests/in_process.py); `run` shows it from a real one."""
    return conductor(*args)


@pytest.mark.parametrize("case", CASES)
def test_a_bad_chain_file_exits_2_naming_the_file_the_key_and_a_fix(
        tmp_path: Path, case: str) -> None:
    text, fragments = CASES[case]
    path = tmp_path / "chain.toml"
    path.write_text(text, encoding="utf-8")
    result = refused("--chain", str(path))
    assert result.returncode == 2, result.stderr
    assert result.stdout == ""
    assert str(path) in result.stderr
    for fragment in fragments:
        assert fragment in result.stderr, result.stderr
    assert "Traceback" not in result.stderr


def test_a_missing_chain_file_exits_2_with_a_hint(tmp_path: Path) -> None:
    result = run("--chain", str(tmp_path / "nope.toml"))
    assert result.returncode == 2
    assert f"{tmp_path / 'nope.toml'}: file not found" in result.stderr
    assert "hint" in result.stderr
    assert "Traceback" not in result.stderr


def test_no_chain_and_no_command_prints_help_and_exits_2() -> None:
    result = run()
    assert result.returncode == 2
    assert "--chain" in result.stderr
    assert result.stdout == ""


def test_help_is_written_for_a_new_user() -> None:
    result = run("--help")
    assert result.returncode == 0
    for words in ("--chain", "agent", "proxy", "--max-frame-bytes", "--log-level",
                  "--log-file", "Exit codes"):
        assert words in result.stdout


def test_the_proxy_command_refuses_a_chain_with_an_agent(tmp_path: Path) -> None:
    path = tmp_path / "chain.toml"
    path.write_text(AGENT, encoding="utf-8")
    result = refused("--chain", str(path), "proxy")
    assert result.returncode == 2
    assert "agent" in result.stderr
    assert "hint" in result.stderr
