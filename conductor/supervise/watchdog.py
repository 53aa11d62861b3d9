"""The cleanup of a conductor that could not clean up (SIGKILL, a crash, the OOM killer).

A small shell process, started beside the first component, reads a pipe that only this
process holds. It learns each component's process group as it starts and is stopped; at
EOF, which comes however this process ends, it TERMs, then KILLs, every group still
listed and, on Linux, every process carrying one of this conductor's tokens (`tag()` is
their value), then removes the directories it was given (the MCP bridge's socket). After
a clean shutdown nothing is listed and it just exits.

It runs in a process group of its own, so a signal meant for the conductor's group
(Ctrl-C) leaves it standing, and with stdout and stderr on /dev/null, so it never keeps
the editor's pipes open.
"""

from __future__ import annotations

import atexit
import contextlib
import functools
import logging
import math
import os
import select
import signal
import time
from pathlib import Path

from conductor.supervise import _linux

log = logging.getLogger("acp_conductor.supervise")

SCRIPT = Path(__file__).with_name("watchdog.sh")


@functools.cache
def tag() -> str:
    """This conductor's mark, the value of its components' token variables."""
    return f"{os.getpid()}-{os.urandom(4).hex()}"  # the pid says whose; the salt, not a reuse


class Watchdog:
    """Started at the first `watch`; restarted, with every group, if it is found dead."""

    def __init__(self, mark: str | None = None) -> None:
        self._mark = mark  # whose tokens it looks for at the end: this conductor's by default
        self._fd: int | None = None
        self._pid: int | None = None
        self._groups: dict[int, int] = {}  # pgid -> tenths of a second of grace
        self._dirs: set[str] = set()

    def watch(self, pgid: int, grace: float) -> None:
        ticks = max(1, math.ceil(grace * 10))
        self._groups[pgid] = ticks
        self._send(f"+ {pgid} {ticks}\n")

    def release(self, pgid: int) -> None:
        if self._groups.pop(pgid, None) is not None:
            self._send(f"- {pgid}\n")

    def remove_at_end(self, directory: str) -> None:
        """Remove `directory` (one of ours, named `acp-conductor-*`) if this process dies
        before it does."""
        if any(c.isspace() for c in directory):  # the script reads one word
            return
        self._dirs.add(directory)
        self._send(f"d {directory}\n")

    def forget(self, directory: str) -> None:
        """We removed `directory` ourselves."""
        if directory in self._dirs:
            self._dirs.discard(directory)
            self._send(f"k {directory}\n")

    def _send(self, line: str) -> None:
        if self._fd is not None:
            try:
                os.write(self._fd, line.encode())  # a few bytes: a pipe takes them at once
                return
            except OSError:  # it died (EPIPE), or stopped reading (EAGAIN)
                log.warning("the process watchdog is gone; starting another")
                self._close()
        self._start()  # tells the new one every group, this line's included

    def retire(self) -> None:
        """At exit, with nothing left to watch: end the watchdog now and reap it. Left to
        see our exit, it would end a moment after us, an orphan whose zombie waits for
        whoever reaps orphans: pid 1, which is slow in some VMs and never reaps in a
        container whose pid 1 is not an init; meanwhile a client tracking our descendants
        (acpx) waits on it. With a group still listed it is left running: that is when
        it must outlive us."""
        if self._pid is None or self._fd is None or self._groups or self._dirs:
            return
        pid, fd = self._pid, self._fd
        self._fd = self._pid = None
        os.close(fd)  # EOF: with nothing listed it exits at once
        deadline = time.monotonic() + 0.5  # bounded: a stuck one is left to end on its own
        exited = _linux.open_pidfd(pid)  # readable at its exit; elsewhere, poll
        try:
            while True:
                try:
                    if os.waitpid(pid, os.WNOHANG)[0]:
                        return
                except ChildProcessError:
                    return
                left = deadline - time.monotonic()
                if left <= 0:
                    return
                if exited is not None:
                    select.select([exited], [], [], left)
                else:
                    time.sleep(min(0.002, left))
        finally:
            if exited is not None:
                os.close(exited)

    def _start(self) -> None:
        read, write = os.pipe()  # both close-on-exec: no component inherits the write end
        os.set_blocking(write, False)  # never stall the event loop on it
        try:
            self._pid = os.posix_spawn(
                "/bin/sh", ["sh", str(SCRIPT), self._mark or tag()],
                {"PATH": os.environ.get("PATH", os.defpath)},
                file_actions=[(os.POSIX_SPAWN_DUP2, read, 0),
                              (os.POSIX_SPAWN_OPEN, 1, os.devnull, os.O_WRONLY, 0),
                              (os.POSIX_SPAWN_OPEN, 2, os.devnull, os.O_WRONLY, 0)],
                setpgroup=0, setsigmask=(), setsigdef=(signal.SIGPIPE,))
            self._fd = write
            os.write(write, "".join([*(f"+ {g} {t}\n" for g, t in self._groups.items()),
                                     *(f"d {d}\n" for d in self._dirs)]).encode())
            atexit.register(self.retire)  # (once per start: it returns at once when done)
        except OSError as e:
            log.warning("cannot start the process watchdog (%s): if this conductor is "
                        "killed, what it started may keep running", e)
            if self._fd is None:
                os.close(write)
            self._close()
        finally:
            os.close(read)

    def _close(self) -> None:
        if self._pid is not None:
            # Before the EOF: a stuck watchdog woken by it would kill live components.
            with contextlib.suppress(ProcessLookupError):
                os.kill(self._pid, signal.SIGKILL)
            with contextlib.suppress(ChildProcessError):
                os.waitpid(self._pid, os.WNOHANG)  # no zombie if it already died
        if self._fd is not None:
            with contextlib.suppress(OSError):
                os.close(self._fd)
        self._fd = self._pid = None


# One per conductor process: its lifetime is the process's, which is the point.
WATCHDOG = Watchdog()
