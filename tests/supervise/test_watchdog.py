"""The watchdog, on real processes: when the process that fed it ends (here: closes the
pipe), what it was told about is stopped."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from typing import TYPE_CHECKING

import psutil
import pytest

from conductor.supervise.spawn import TOKEN_PREFIX
from conductor.supervise.watchdog import Watchdog

if TYPE_CHECKING:
    from collections.abc import Iterator

pytestmark = pytest.mark.skipif(sys.platform == "win32", reason="POSIX process groups")
SLEEP = [sys.executable, "-c", "import time; time.sleep(60)"]
STUBBORN = [sys.executable, "-c", "import signal, time; signal.signal(signal.SIGTERM, "
            "signal.SIG_IGN); print('ready', flush=True); time.sleep(60)"]


@pytest.fixture
def spawned() -> Iterator[list[subprocess.Popen[bytes]]]:
    procs: list[subprocess.Popen[bytes]] = []
    yield procs
    for p in procs:  # whatever the test asserted, leave nothing running
        if p.poll() is None:
            p.kill()
        p.wait()
        if p.stdout is not None:
            p.stdout.close()


def start(procs: list[subprocess.Popen[bytes]], argv: list[str], **kw: object
          ) -> subprocess.Popen[bytes]:
    proc = subprocess.Popen(argv, start_new_session=True, **kw)  # type: ignore[call-overload]
    procs.append(proc)
    return proc


def wait_gone(procs: list[subprocess.Popen[bytes]]) -> None:
    for p in procs:
        p.wait(timeout=10)  # a bound, not a measurement


def end_of(watchdog: Watchdog) -> None:
    """What the conductor's death looks like to its watchdog: EOF on the pipe."""
    assert watchdog._fd is not None
    os.close(watchdog._fd)


def test_at_eof_the_watchdog_kills_every_group_it_still_knows_term_then_kill(
        spawned: list[subprocess.Popen[bytes]]) -> None:
    polite = start(spawned, SLEEP)
    stubborn = start(spawned, STUBBORN, stdout=subprocess.PIPE)
    assert stubborn.stdout is not None and stubborn.stdout.readline() == b"ready\n"
    released = start(spawned, SLEEP)
    watchdog = Watchdog(mark="test-not-a-conductor")
    for p in (polite, stubborn, released):
        watchdog.watch(p.pid, 0.2)
    watchdog.release(released.pid)
    end_of(watchdog)
    wait_gone([polite, stubborn])
    assert polite.returncode == -signal.SIGTERM
    assert stubborn.returncode == -signal.SIGKILL
    assert released.poll() is None  # stopped by the conductor itself: not the watchdog's


@pytest.mark.skipif(sys.platform != "linux", reason="finds strays through /proc")
def test_at_eof_the_watchdog_also_kills_strays_carrying_its_conductors_mark(
        spawned: list[subprocess.Popen[bytes]]) -> None:
    group = start(spawned, SLEEP)
    env = {**os.environ, f"{TOKEN_PREFIX}abc123": "test-mark-1"}
    stray = start(spawned, SLEEP, env=env)  # a session of its own, as after setsid
    other = start(spawned, SLEEP, env={**os.environ, f"{TOKEN_PREFIX}abc123": "test-mark-2"})
    watchdog = Watchdog(mark="test-mark-1")
    watchdog.watch(group.pid, 0.2)
    end_of(watchdog)
    wait_gone([group, stray])
    assert other.poll() is None  # another conductor's


def test_a_watchdog_found_dead_is_replaced_and_told_every_group(
        spawned: list[subprocess.Popen[bytes]]) -> None:
    first, second = start(spawned, SLEEP), start(spawned, SLEEP)
    watchdog = Watchdog(mark="test-not-a-conductor")
    watchdog.watch(first.pid, 0.2)
    old = watchdog._pid
    assert old is not None
    os.kill(old, signal.SIGKILL)
    psutil.Process(old).wait(timeout=10)  # reaped here: it is our child
    watchdog.watch(second.pid, 0.2)
    assert watchdog._pid not in (None, old)
    end_of(watchdog)
    wait_gone([first, second])
