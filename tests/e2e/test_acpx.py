"""acpx, a real ACP client (TypeScript SDK), drives a chain and cannot tell it from an agent."""

from __future__ import annotations

import os
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
