"""The /proc scan that finds what a component left behind, by the token in its environment."""

from __future__ import annotations

import os
import subprocess
import uuid

import pytest

from conductor.supervise import _linux

pytestmark = pytest.mark.skipif(not os.path.isdir("/proc"), reason="scans /proc (Linux)")

# Unique to this run: a scan sees every process on the machine, and another test run (a
# parallel worker, another checkout's suite) may have one carrying a fixed value just now.
VALUE = uuid.uuid4().hex
TOKEN = f"ACP_CONDUCTOR_TEST_SCAN={VALUE}".encode()


def test_a_process_caught_in_the_middle_of_an_exec_is_still_found(
        monkeypatch: pytest.MonkeyPatch) -> None:
    # Between an exec's new image and its environment, /proc/PID/environ reads empty (seen
    # 47 times in 15,000 reads of `setsid sleep` just started): a single scan missed such a
    # process, and a terminal's or a component's detached child then outlived the sweep.
    child = subprocess.Popen(["sleep", "30"], env={**os.environ, "ACP_CONDUCTOR_TEST_SCAN": VALUE})
    try:
        real = _linux._environ
        reads: list[int] = []

        def in_exec_at_first(pid: int) -> bytes | None:
            if pid == child.pid:
                reads.append(pid)
                if len(reads) == 1:
                    return b""
            return real(pid)

        monkeypatch.setattr(_linux, "_environ", in_exec_at_first)
        assert child.pid in _linux.processes_with_env(TOKEN)
    finally:
        child.kill()
        child.wait()


def test_a_process_with_no_environment_at_all_is_not_taken_for_a_stray() -> None:
    # It reads empty on every reread, as one caught mid-exec does at first: the rereads end,
    # it is not taken, and the stray beside it is still found.
    blank = subprocess.Popen(["sleep", "30"], env={})
    stray = subprocess.Popen(["sleep", "30"],
                             env={**os.environ, "ACP_CONDUCTOR_TEST_SCAN": VALUE})
    try:
        assert _linux.processes_with_env(TOKEN) == [stray.pid]
    finally:
        for child in (blank, stray):
            child.kill()
            child.wait()
