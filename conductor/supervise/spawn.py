"""Starting one component's process, with no event loop: pipes, fork/exec, the watchdog.

Kept free of anyio and asyncio so that it can run while the conductor is still importing
them (`conductor/early_start.py`); `component.py` serves what it starts.
"""

from __future__ import annotations

import contextlib
import errno
import os
import signal
import subprocess
import time
from typing import TYPE_CHECKING

import msgspec

from conductor.errors import ComponentStartError
from conductor.record import Record
from conductor.supervise import _linux
from conductor.supervise.watchdog import WATCHDOG, tag

if TYPE_CHECKING:
    from collections.abc import Mapping, Sequence

# One variable per token, so tokens accumulate down a nested chain (a conductor run as a
# component passes its own token on to what it starts) instead of replacing each other.
TOKEN_PREFIX = "ACP_CONDUCTOR_COMPONENT_"


class LaunchSpec(Record, frozen=True):
    """Everything needed to start one process. Built from config by the composition root."""

    name: str
    argv: Sequence[str]
    env: Mapping[str, str] | None = None
    cwd: str | None = None
    shutdown_grace: float = 3.0
    # Put in the component's environment: its descendants inherit it even when they leave
    # its process group, so shutdown can still find them. Its value is the conductor's
    # `tag()`, by which the watchdog finds them if the conductor is killed. (os.urandom, not
    # `secrets`: the same bytes, without ~5 ms of hashlib/OpenSSL imports at start-up.)
    token: str = msgspec.field(default_factory=lambda: os.urandom(8).hex())

    def environment(self) -> dict[str, str]:
        return {**(os.environ if self.env is None else self.env),
                f"{TOKEN_PREFIX}{self.token}": tag()}


class Started(Record):
    """A process just started, and our ends of its three pipes (raw fds, ours to close)."""

    popen: subprocess.Popen[bytes]
    stdin: int
    stdout: int
    stderr: int


def stop_together(started: Sequence[tuple[LaunchSpec, Started]]) -> None:
    """Stop processes that were never served (their chain did not start), all at once:
    EOF and closed pipes, SIGTERM to each group, SIGKILL to what is left after the longest
    grace, then their descendants that left the group. Blocking; bounded by that grace."""
    for _, process in started:
        for fd in (process.stdin, process.stdout, process.stderr):
            with contextlib.suppress(OSError):
                os.close(fd)
    waiting = [process.popen for _, process in started]
    grace = max((launch.shutdown_grace for launch, _ in started), default=0.0)
    for sig, wait in ((signal.SIGTERM, grace), (signal.SIGKILL, 2.0)):  # then the kernel's turn
        for popen in waiting:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(popen.pid, sig)  # a group leader: its pid names its group
        deadline = time.monotonic() + wait
        while any(p.poll() is None for p in waiting) and time.monotonic() < deadline:
            time.sleep(0.01)
        waiting = [p for p in waiting if p.poll() is None]
        if not waiting:
            break
    for launch, process in started:
        # Descendants that left the group still carry the token (Linux: /proc).
        for pid in _linux.processes_with_env(f"{TOKEN_PREFIX}{launch.token}=".encode()):
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)
        WATCHDOG.release(process.popen.pid)


def start_process(spec: LaunchSpec) -> Started:
    """Spawn `spec` in its own process group, on three new pipes, watched by the watchdog.

    Raises:
        ComponentStartError: the command could not be started (or no pipes: out of fds).
    """
    made: list[int] = []
    try:
        for _ in range(3):
            made.extend(os.pipe())
    except OSError as e:  # out of fds (EMFILE): a start error, and none of them kept
        for fd in made:
            os.close(fd)
        raise ComponentStartError(spec.name, f"cannot start {spec.argv[0]}: "
                                  f"{e.strerror or e}") from None
    stdin_r, stdin_w, stdout_r, stdout_w, stderr_r, stderr_w = made
    try:
        popen = _spawn(spec, stdin=stdin_r, stdout=stdout_w, stderr=stderr_w)
    except BaseException:
        for fd in (stdin_w, stdout_r, stderr_r):
            os.close(fd)
        raise
    finally:
        for fd in (stdin_r, stdout_w, stderr_w):  # the child has its own copies now
            os.close(fd)
    WATCHDOG.watch(popen.pid, spec.shutdown_grace)
    return Started(popen, stdin_w, stdout_r, stderr_r)


def _spawn(spec: LaunchSpec, *, stdin: int, stdout: int, stderr: int) -> subprocess.Popen[bytes]:
    """Fork and exec in this thread, the main one: the parent-death signal is tied to the
    forking thread (trio's `open_process` forks in a worker thread), and the exec result is
    known at once (a few ms at most, as asyncio's own spawn blocks).

    Raises:
        ComponentStartError: the command could not be started.
    """
    try:
        return subprocess.Popen(list(spec.argv), cwd=spec.cwd, env=spec.environment(),
                                start_new_session=True, stdin=stdin, stdout=stdout,
                                stderr=stderr,
                                preexec_fn=_linux.parent_death_signal(signal.SIGTERM))
    except FileNotFoundError as e:
        # One stat on an error path after a failed spawn: not worth a worker thread.
        cwd_missing = spec.cwd and not os.path.isdir(spec.cwd)
        missing = spec.cwd if cwd_missing else spec.argv[0]
        what = "working directory" if missing == spec.cwd else "command"
        raise ComponentStartError(
            spec.name, f"{what} not found: {missing} ({e.strerror})") from None
    except PermissionError as e:
        import shutil  # here: an error path only

        program = shutil.which(spec.argv[0], path=spec.environment().get("PATH")) \
            if "/" not in spec.argv[0] else spec.argv[0]
        program = program or spec.argv[0]
        if os.path.isdir(program):  # a stat or two on an error path: the fix is worth it
            why = f"{program} is a directory (hint: give the program's path)"
        elif os.path.isfile(program) and not os.access(program, os.X_OK):
            why = (f"{program} is not executable (hint: make it so, chmod +x {program}, or "
                   "start it through its interpreter)")
        else:
            why = f"cannot execute {spec.argv[0]}: {e.strerror}"
        raise ComponentStartError(spec.name, why) from None
    except (OSError, subprocess.SubprocessError, ValueError) as e:
        # ValueError: a NUL in the argv, the environment or the working directory (a chain
        # file's "\u0000"), which no exec can carry.
        reason = (e.strerror or errno.errorcode.get(e.errno or 0, str(e))
                  if isinstance(e, OSError) else str(e))
        raise ComponentStartError(spec.name, f"cannot start {spec.argv[0]}: {reason}") from None
