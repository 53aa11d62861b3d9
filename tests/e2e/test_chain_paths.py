"""Paths in a chain file are relative to the file's folder, wherever the editor starts the
conductor: plugin files, programs named by a path, arguments (components run in that folder
unless `cwd` says otherwise), and MCP server commands. Errors name the folder."""

from __future__ import annotations

import json
import subprocess
from typing import TYPE_CHECKING

import pytest

from tests import in_process
from tests.conftest import child_env, conductor_argv

if TYPE_CHECKING:
    from pathlib import Path

GUARD = '''
from conductor.plugins import Proxy


class Guard(Proxy):
    """Lets everything through."""
'''
AGENT = "from conductor.demo_agent import serve_stdio\n\nserve_stdio()\n"
RELAY = '#!/bin/sh\nexec "$PY" -m conductor serve-proxy passthrough\n'
CHAIN = '''
[[proxy]]
name = "guard"
plugin = "plugins/guard.py:Guard"

[[proxy]]
name = "relay"
command = "./bin/relay.sh"
env = { PY = "${PYTHON}" }

[agent]
command = ["${PYTHON}", "agent.py"]
'''


def project(root: Path, chain: str = CHAIN) -> Path:
    """A chain file with its plugin, scripts and agent beside it, in root/project."""
    folder = root / "project"
    (folder / "plugins").mkdir(parents=True)
    (folder / "bin").mkdir()
    (folder / "plugins" / "guard.py").write_text(GUARD, encoding="utf-8")
    (folder / "agent.py").write_text(AGENT, encoding="utf-8")
    relay = folder / "bin" / "relay.sh"
    relay.write_text(RELAY, encoding="utf-8")
    relay.chmod(0o755)
    (folder / "chain.toml").write_text(chain, encoding="utf-8")
    (root / "elsewhere").mkdir()
    return folder / "chain.toml"


def conductor(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    """Started in `cwd`, in this process (tests/in_process.py): the chain's components are
    the real processes whose paths and folders these tests check."""
    return in_process.conductor(*args, cwd=cwd)


def process(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    # In-process, a check that fails on a missing path shows a memory stream left unclosed.
    return subprocess.run(conductor_argv(*args), env=child_env(), cwd=cwd, capture_output=True,
                          text=True, stdin=subprocess.DEVNULL, timeout=60, check=False)


def test_relative_paths_in_a_chain_file_are_taken_from_its_folder_wherever_it_starts(
        tmp_path: Path) -> None:
    chain = project(tmp_path)
    result = conductor("check", "--chain", str(chain), "--json", cwd=tmp_path / "elsewhere")
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    assert [c["name"] for c in report["components"]] == ["guard", "relay", "agent"]
    relay = report["components"][1]
    assert relay["command"][0] == str(chain.parent / "bin" / "relay.sh")


def test_a_component_runs_in_the_chain_files_folder_unless_cwd_says_otherwise(
        tmp_path: Path) -> None:
    chain = project(tmp_path, '[agent]\ncommand = ["${PYTHON}", "agent.py"]\n')
    result = conductor("run", "--chain", str(chain), "hello", cwd=tmp_path / "elsewhere")
    assert result.returncode == 0, result.stderr
    (chain.parent / "sub").mkdir()
    (chain.parent / "sub" / "agent.py").write_text(AGENT, encoding="utf-8")
    chain.write_text('[agent]\ncwd = "sub"\ncommand = ["${PYTHON}", "agent.py"]\n',
                     encoding="utf-8")
    (chain.parent / "agent.py").unlink()
    result = conductor("run", "--chain", str(chain), "hello", cwd=tmp_path / "elsewhere")
    assert result.returncode == 0, result.stderr


@pytest.mark.parametrize(("entry", "key"), [
    ('[[proxy]]\nplugin = "plugins/missing.py:Guard"\n', "proxy[0].plugin"),
    ('[[proxy]]\ncommand = "./bin/missing.sh"\n', "proxy[0].command"),
    ('[[mcp_server]]\nname = "m"\ncommand = "./bin/missing-mcp"\n', "mcp_server[0].command"),
    ('[[proxy]]\ncommand = "cat"\ncwd = "missing-dir"\n', "proxy[0].cwd"),
], ids=["plugin", "command", "mcp_server", "cwd"])
def test_a_relative_path_that_is_missing_is_reported_with_the_folder_it_was_taken_from(
        tmp_path: Path, entry: str, key: str) -> None:
    chain = project(tmp_path, entry + '[agent]\ncommand = ["${PYTHON}", "agent.py"]\n')
    result = process("check", "--chain", str(chain), cwd=tmp_path / "elsewhere")
    assert result.returncode == 2, result.stderr
    assert key in result.stderr
    assert f"relative to {chain.parent}, the chain file's folder" in result.stderr
    assert "Traceback" not in result.stderr

