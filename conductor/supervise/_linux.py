"""What only Linux offers: a parent-death signal, exit notification by pidfd, /proc scans.

Each function says "not available" (None, or nothing found) on other systems.
"""

from __future__ import annotations

import functools
import os
import sys
import time
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from collections.abc import Callable

_PR_SET_PDEATHSIG = 1


@functools.cache
def _prctl() -> Callable[..., int] | None:
    if sys.platform != "linux":
        return None
    import ctypes  # here, not at import: ~2 ms that only a spawn needs

    try:
        function = ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None
    function.restype = ctypes.c_int
    function.argtypes = [ctypes.c_int, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong,
                         ctypes.c_ulong]
    prctl: Callable[..., int] = function
    return prctl


def parent_death_signal(sig: int) -> Callable[[], None] | None:
    """A `preexec_fn` that has the kernel send `sig` to the child when its parent dies.

    The "parent" is the *thread* that forked: spawn from the event loop's thread, never from
    a worker thread (idle workers exit, and would take their children with them).
    """
    prctl = _prctl()
    if prctl is None:
        return None
    parent = os.getpid()

    def preexec() -> None:
        prctl(_PR_SET_PDEATHSIG, sig, 0, 0, 0)
        if os.getppid() != parent:  # the parent died before prctl: nobody will signal us
            os.kill(os.getpid(), sig)

    return preexec


def open_pidfd(pid: int) -> int | None:
    """A file descriptor that becomes readable when `pid` exits (Linux 5.3+), or None."""
    pidfd_open = getattr(os, "pidfd_open", None)
    if pidfd_open is None:
        return None
    try:
        return int(pidfd_open(pid))
    except OSError:  # an older kernel, a sandbox that forbids it, or already reaped
        return None


# A process in the middle of an exec reads as having no environment for a moment (its new
# image is mapped, its environment not yet): one that reads empty is read again, briefly.
_EXEC_REREADS = 20
_EXEC_REREAD_PAUSE = 0.001
_PF_KTHREAD = 0x00200000


def processes_with_env(entry_prefix: bytes) -> list[int]:
    """Pids (other than ours) whose initial environment has an entry starting with
    `entry_prefix`. Reads /proc; finds nothing elsewhere, and skips processes not ours."""
    me = os.getpid()
    found: list[int] = []
    try:
        entries = os.listdir("/proc")
    except OSError:
        return found
    blank: list[int] = []
    for entry in entries:
        if not entry.isdigit() or int(entry) == me:
            continue
        environ = _environ(int(entry))
        if environ is None:
            continue  # gone, or not ours to read
        if not environ:
            blank.append(int(entry))
        elif _carries(environ, entry_prefix):
            found.append(int(entry))
    blank = [pid for pid in blank if _may_be_in_exec(pid)]
    for _ in range(_EXEC_REREADS):
        if not blank:
            break
        time.sleep(_EXEC_REREAD_PAUSE)
        still: list[int] = []
        for pid in blank:
            environ = _environ(pid)
            if environ == b"":
                still.append(pid)
            elif environ is not None and _carries(environ, entry_prefix):
                found.append(pid)
        blank = still
    return found


def _environ(pid: int) -> bytes | None:
    """The initial environment of `pid` as /proc has it; None: gone, or not ours to read."""
    try:
        with open(f"/proc/{pid}/environ", "rb") as f:
            return f.read()
    except OSError:
        return None


def _carries(environ: bytes, entry_prefix: bytes) -> bool:
    return any(item.startswith(entry_prefix) for item in environ.split(b"\0"))


def _may_be_in_exec(pid: int) -> bool:
    """Not a zombie and not a kernel thread: both read as having no environment for good."""
    fields = _stat_fields(pid)  # state ppid pgrp session tty tpgid flags ...
    return len(fields) > 6 and fields[0] not in (b"Z", b"X") \
        and not int(fields[6]) & _PF_KTHREAD


def group_has_live_members(pgid: int) -> bool | None:
    """Whether process group `pgid` has a member that has not exited (a zombie has: it
    only waits for its reaper, which for orphans is pid 1, and pid 1 may be slow to reap
    or, in a container where it is the conductor, never do it). None: /proc unreadable."""
    members = live_group_members(pgid)
    return None if members is None else bool(members)


def live_group_members(pgid: int) -> list[int] | None:
    """The members of process group `pgid` that have not exited, from a scan of /proc
    (see `group_has_live_members`). None: /proc unreadable."""
    try:
        entries = os.listdir("/proc")
    except OSError:
        return None
    return [int(entry) for entry in entries if entry.isdigit() and runs_in_group(int(entry), pgid)]


def runs_in_group(pid: int, pgid: int) -> bool:
    """`pid` is in process group `pgid` and has not exited (one small read of /proc)."""
    fields = _stat_fields(pid)
    return len(fields) > 2 and int(fields[2]) == pgid and fields[0] not in (b"Z", b"X")


def _stat_fields(pid: int) -> list[bytes]:
    """/proc/PID/stat's fields after `pid (comm)`: state ppid pgrp ...; none when it is
    gone. (comm may hold spaces and parentheses: the fields start after the last ")".)"""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read()
    except OSError:
        return []
    return stat[stat.rfind(b")") + 2:].split()
