"""A component's exit is seen when it happens, even while a grandchild holds its pipes,
with a pidfd (Linux) and without one (the polling fallback)."""

from __future__ import annotations

import os
import sys

import anyio
import psutil
import pytest

from conductor.supervise import _linux
from conductor.supervise.component import open_component
from conductor.supervise.spawn import LaunchSpec
from tests.conftest import exited

# The leader says which sleep it started and exits 3; the sleep keeps stdout and stderr open.
LEADER = [sys.executable, "-c", "import subprocess, sys; "
          "print(subprocess.Popen(['sleep', '60']).pid, flush=True); sys.exit(3)"]


@pytest.mark.parametrize("pidfd", [True, False], ids=["pidfd", "polling"])
async def test_a_leaders_exit_is_seen_while_a_grandchild_still_holds_its_pipes(
        monkeypatch: pytest.MonkeyPatch, pidfd: bool) -> None:
    if not pidfd:
        monkeypatch.setattr(_linux, "open_pidfd", lambda pid: None)
    spec = LaunchSpec("agent", LEADER, shutdown_grace=0.5)
    with anyio.fail_after(10):
        async with open_component(spec, lambda name, line: None) as comp:
            line = b""
            while not line.endswith(b"\n"):
                line += await comp.stdout.receive()
            grandchild = psutil.Process(int(line))
            assert await comp.wait_exited() == 3
            assert comp.returncode == 3
            assert grandchild.is_running()  # holding the pipes: asyncio's wait() would hang
    assert exited([grandchild.pid])  # the group went with the component


async def test_a_cancelled_component_is_still_stopped_and_its_exit_seen() -> None:
    # `run`'s second Ctrl-C cancels the chain: the shielded cleanup must still see the
    # leader exit on EOF (not wait out every grace on an unreaped zombie).
    spec = LaunchSpec("agent", [sys.executable, "-c", "import sys; sys.stdin.read()"],
                      shutdown_grace=0.5)
    with anyio.fail_after(10):
        with anyio.CancelScope() as scope:
            async with open_component(spec, lambda name, line: None) as comp:
                scope.cancel()
                await anyio.sleep_forever()
    assert comp.returncode == 0  # exited on EOF, and reaped during the cleanup


async def test_a_stop_cancelled_part_way_is_finished_by_the_components_cleanup() -> None:
    # A caller's stop (serve's run loop) cancelled during its grace, e.g. by the shutdown's
    # backstop: the shielded cleanup's own stop must still end the process, not return at
    # once because a stop had begun.
    spec = LaunchSpec("agent", [sys.executable, "-c", "import time; time.sleep(60)"],
                      shutdown_grace=0.2)  # it ignores EOF; TERM ends it
    with anyio.fail_after(10):
        async with open_component(spec, lambda name, line: None) as comp:
            with anyio.CancelScope() as scope:
                scope.cancel()  # cancelled at its first wait (after EOF on stdin)
                await comp.stop(60.0)
            assert comp.returncode is None
    assert comp.returncode == -15  # TERMed by the cleanup, and reaped


def test_a_process_group_of_zombies_has_no_live_members() -> None:
    # An orphan's zombie waits for pid 1, which may reap late or (the conductor as a
    # container's pid 1) never: a stop must not wait out its grace on it.
    pid = os.fork()
    if pid == 0:  # the child: a group of its own, exits at once; not reaped until below
        os.setsid()
        os._exit(0)
    try:
        assert exited([pid])
        os.killpg(pid, 0)  # the kernel still counts the group...
        assert _linux.group_has_live_members(pid) is False  # ...but nobody in it runs
        assert not _linux.runs_in_group(pid, pid)
        assert _linux.group_has_live_members(os.getpgid(0)) is True
        assert os.getpid() in (_linux.live_group_members(os.getpgid(0)) or [])
        assert _linux.runs_in_group(os.getpid(), os.getpgid(0))
        assert not _linux.runs_in_group(os.getpid(), pid)  # running, but in another group
    finally:
        os.waitpid(pid, 0)
