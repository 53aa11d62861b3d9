"""What only Linux offers: exit notification by pidfd, /proc scans.

Each function says "not available" (None, or nothing found) on other systems.
"""

from __future__ import annotations

import os


def open_pidfd(pid: int) -> int | None:
    """A file descriptor that becomes readable when `pid` exits (Linux 5.3+), or None."""
    pidfd_open = getattr(os, "pidfd_open", None)
    if pidfd_open is None:
        return None
    try:
        return int(pidfd_open(pid))
    except OSError:  # an older kernel, a sandbox that forbids it, or already reaped
        return None


def processes_with_env(entry_prefix: bytes) -> list[int]:
    """Pids (other than ours) whose initial environment has an entry starting with
    `entry_prefix`. Reads /proc; finds nothing elsewhere, and skips processes not ours."""
    me = os.getpid()
    found: list[int] = []
    try:
        entries = os.listdir("/proc")
    except OSError:
        return found
    for entry in entries:
        if not entry.isdigit() or int(entry) == me:
            continue
        try:
            with open(f"/proc/{entry}/environ", "rb") as f:
                if any(item.startswith(entry_prefix) for item in f.read().split(b"\0")):
                    found.append(int(entry))
        except OSError:
            continue  # gone, or not ours to read
    return found
