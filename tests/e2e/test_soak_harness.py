"""bench/soak.py leaves no process behind, however it ends.

The soak is an editor: it starts a conductor and must reap it. A conductor that exits at EOF
hides a harness that never stops it (the soak's own exit closes the conductor's stdin), so
these runs use a stand-in conductor (`--checkout` a fake package) that ignores both EOF
and SIGTERM: only a harness that escalates to SIGKILL and waits gets rid of it.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
from typing import TYPE_CHECKING

import anyio
import pytest

from tests.conftest import REPO

if TYPE_CHECKING:
    from pathlib import Path

pytestmark = pytest.mark.anyio

SOAK = REPO / "bench" / "soak.py"

# Answers initialize; at session/new writes its pid to $SOAK_FAKE_READY, then refuses the
# request or never answers ($SOAK_FAKE_MODE); never exits on its own.
FAKE_CONDUCTOR = """\
import json, os, signal, sys, threading

signal.signal(signal.SIGTERM, signal.SIG_IGN)
out = sys.stdout.buffer
for line in sys.stdin.buffer:
    msg = json.loads(line)
    if msg["method"] == "initialize":
        answer = {"jsonrpc": "2.0", "id": msg["id"], "result": {"protocolVersion": 1}}
    else:
        with open(os.environ["SOAK_FAKE_READY"], "w") as ready:
            ready.write(str(os.getpid()))
        if os.environ["SOAK_FAKE_MODE"] == "silent":
            continue
        answer = {"jsonrpc": "2.0", "id": msg["id"],
                  "error": {"code": -32603, "message": "refused"}}
    out.write(json.dumps(answer).encode() + b"\\n")
    out.flush()
threading.Event().wait()  # EOF on stdin: stay
"""


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


async def soak_with_stubborn_conductor(tmp_path: Path, mode: str,
                                       sig: int | None) -> tuple[int, int]:
    """Run the soak against the fake conductor, send `sig` to the soak (only) once the
    conductor holds a session/new: (the soak's exit code, the conductor's pid)."""
    fake = tmp_path / "checkout" / "conductor"
    fake.mkdir(parents=True)
    (fake / "__init__.py").write_text("", encoding="utf-8")
    (fake / "__main__.py").write_text(FAKE_CONDUCTOR, encoding="utf-8")
    ready = tmp_path / "ready"
    os.mkfifo(ready)
    env = {**os.environ, "SOAK_FAKE_READY": str(ready), "SOAK_FAKE_MODE": mode}
    argv = [sys.executable, str(SOAK), "--checkout", str(fake.parent), "--proxies", "none",
            "--sessions", "1", "--exit-timeout", "0.2"]
    pid = 0
    with (tmp_path / "soak.out").open("wb") as out:
        proc = await anyio.open_process(argv, env=env, stdout=out, stderr=subprocess.STDOUT)
    try:
        with anyio.fail_after(30):
            pid = int(await anyio.to_thread.run_sync(ready.read_text, abandon_on_cancel=True))
            if sig is not None:
                proc.send_signal(sig)
            code = await proc.wait()
        return code, pid
    finally:
        with contextlib.suppress(OSError):  # a reader still blocked on the fifo: release it
            os.close(os.open(ready, os.O_WRONLY | os.O_NONBLOCK))
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
        if pid and alive(pid):
            os.kill(pid, signal.SIGKILL)  # what the failing case left behind


async def test_a_soak_that_fails_on_an_error_answer_kills_a_conductor_that_will_not_exit(
        tmp_path: Path) -> None:
    code, pid = await soak_with_stubborn_conductor(tmp_path, "refused", None)
    assert code == 1
    assert "error answer" in (tmp_path / "soak.out").read_text(encoding="utf-8")
    assert not alive(pid), "the soak exited and left its conductor running"


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT, signal.SIGHUP],
                         ids=["SIGTERM", "SIGINT", "SIGHUP"])
async def test_a_soak_stopped_by_a_signal_midway_kills_a_conductor_that_will_not_exit(
        tmp_path: Path, sig: int) -> None:
    code, pid = await soak_with_stubborn_conductor(tmp_path, "silent", sig)
    assert code != 0
    assert not alive(pid), "the soak exited and left its conductor running"


async def test_a_short_soak_through_the_real_conductor_reports_its_clean_exit() -> None:
    with anyio.fail_after(60):
        result = await anyio.run_process(
            [sys.executable, str(SOAK), "--sessions", "100", "--every", "100"], check=False)
    assert result.returncode == 0, result.stderr.decode(errors="replace")
    assert b"the conductor exited 0" in result.stdout
