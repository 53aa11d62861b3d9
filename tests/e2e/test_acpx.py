"""acpx, a real ACP client (TypeScript SDK), drives a chain and cannot tell it from an agent."""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import subprocess
from typing import TYPE_CHECKING

import pytest

from tests.conftest import REPO, child_env, conductor_argv

if TYPE_CHECKING:
    from pathlib import Path

# .ci/run installs acpx here; elsewhere it may be on PATH. Skipped only outside CI.
ACPX = shutil.which("acpx", path=str(REPO / ".ci" / "node" / "node_modules" / ".bin")) \
    or shutil.which("acpx")
pytestmark = pytest.mark.skipif(ACPX is None and not os.environ.get("CI"),
                                reason="acpx is not installed (.ci/run installs it)")


def acpx(tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    assert ACPX is not None, "CI must have acpx: .ci/run installs it"
    agent = shlex.join(conductor_argv("--chain", "demo"))
    return subprocess.run([ACPX, "--agent", agent, "--cwd", str(tmp_path), *args],
                          capture_output=True, text=True, timeout=90,
                          env=child_env(HOME=str(tmp_path)))


def test_acpx_gets_the_demo_agents_streamed_answer_through_the_chain(tmp_path: Path) -> None:
    done = acpx(tmp_path, "exec", "hello from acpx")
    assert done.returncode == 0, done.stdout + done.stderr
    assert "Hello from the demo agent. You said: hello from acpx" in done.stdout
    assert "end_turn" in done.stdout


def test_acpx_answers_the_agents_permission_request_through_the_chain(tmp_path: Path) -> None:
    done = acpx(tmp_path, "--approve-all", "exec", "please write a file")
    assert done.returncode == 0, done.stdout + done.stderr
    assert "Write notes.txt (completed)" in done.stdout


def readme_acpx_config(command: str) -> str:
    """The README's ~/.acpx/config.json, its chain swapped for `command`."""
    text = (REPO / "README.md").read_text(encoding="utf-8")
    (config,) = [b for b in re.findall(r"^```json\n(.*?)^```", text, re.M | re.S)
                 if '"agents"' in b]
    assert "acp-conductor --chain /home/me/chains/chain.toml" in config
    return config.replace("acp-conductor --chain /home/me/chains/chain.toml", command)


def test_the_readme_s_acpx_config_file_is_what_acpx_accepts(tmp_path: Path) -> None:
    # The README tells the reader to put this in ~/.acpx/config.json and run
    # `acpx conductor exec ...`, or `acpx conductor sessions new` first for a session.
    assert ACPX is not None, "CI must have acpx: .ci/run installs it"
    (tmp_path / ".acpx").mkdir()
    config = readme_acpx_config(shlex.join(conductor_argv("--chain", "demo")))
    json.loads(config)  # the block itself is valid JSON
    (tmp_path / ".acpx" / "config.json").write_text(config, encoding="utf-8")

    def run(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([ACPX, "--cwd", str(tmp_path), *args], capture_output=True,
                              text=True, timeout=90, env=child_env(HOME=str(tmp_path)))

    done = run("conductor", "exec", "review this patch")
    assert done.returncode == 0, done.stdout + done.stderr
    assert "You said: review this patch" in done.stdout
    made = run("conductor", "sessions", "new")
    assert made.returncode == 0, made.stdout + made.stderr
    done = run("conductor", "a second prompt")
    assert done.returncode == 0, done.stdout + done.stderr
    assert "You said: a second prompt" in done.stdout
    closed = run("conductor", "sessions", "close")
    assert closed.returncode == 0, closed.stdout + closed.stderr
