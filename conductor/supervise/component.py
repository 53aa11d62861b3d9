"""A spawned component: its own process group, stderr read continuously, stopped gracefully."""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import secrets
import signal
from collections import deque
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import anyio

from conductor.errors import ComponentStartError
from conductor.transport.stdio import FdReceiveStream, FdSendStream

log = logging.getLogger("acp_conductor.supervise")
# One variable per token, so tokens accumulate down a nested chain (a conductor run as a
# component passes its own token on to what it starts) instead of replacing each other.
TOKEN_PREFIX = "ACP_CONDUCTOR_COMPONENT_"
SCAN_TIMEOUT = 5.0  # /proc reads can block on a process stuck in the kernel

if TYPE_CHECKING:
    from anyio.abc import ByteReceiveStream, ByteSendStream, Process

STDERR_TAIL_LINES = 20
_MAX_STDERR_LINE = 8192
EXIT_POLL_INTERVAL = 0.05
EXIT_DRAIN = 0.5  # after the leader exits, how long its stdout may stay open (grandchildren)

StderrCallback = Callable[[str, str], None]  # (component name, line)


@dataclass(frozen=True, slots=True)
class LaunchSpec:
    """Everything needed to start one process. Built from config by the composition root."""

    name: str
    argv: Sequence[str]
    env: Mapping[str, str] | None = None
    cwd: str | None = None
    shutdown_grace: float = 3.0
    # Put in the component's environment: its descendants inherit it even when they leave
    # its process group, so shutdown can still find them.
    token: str = field(default_factory=lambda: secrets.token_hex(8))

    def environment(self) -> dict[str, str]:
        return {**(os.environ if self.env is None else self.env),
                f"{TOKEN_PREFIX}{self.token}": "1"}


class Component:
    """A running child. `stdin`/`stdout` carry the protocol; stderr is pumped to a callback."""

    def __init__(self, spec: LaunchSpec, process: Process, on_stderr: StderrCallback, *,
                 stdin: ByteSendStream, stdout: ByteReceiveStream) -> None:
        self.spec = spec
        self.name = spec.name
        self.process = process
        self.pid = process.pid
        self.stderr_tail: deque[str] = deque(maxlen=STDERR_TAIL_LINES)
        self.stderr_closed = anyio.Event()
        self._stopped = False
        self._on_stderr = on_stderr
        self.stdin = stdin
        self.stdout = stdout

    @property
    def returncode(self) -> int | None:
        return self.process.returncode

    async def pump_stderr(self) -> None:
        """Read stderr line by line until EOF; an unread stderr pipe would wedge the child."""
        stream = self.process.stderr
        assert stream is not None
        pending = bytearray()
        try:
            while True:
                try:
                    chunk = await stream.receive(65536)
                except (anyio.EndOfStream, anyio.BrokenResourceError, anyio.ClosedResourceError):
                    break
                pending += chunk
                *lines, rest = pending.split(b"\n")
                pending = bytearray(rest[-_MAX_STDERR_LINE:]) if len(rest) > _MAX_STDERR_LINE \
                    else bytearray(rest)
                for line in lines:
                    self._line(line)
            if pending:
                self._line(bytes(pending))
        finally:
            self.stderr_closed.set()

    def _line(self, line: bytes) -> None:
        text = line[:_MAX_STDERR_LINE].decode("utf-8", "replace").rstrip("\r")
        self.stderr_tail.append(text)
        self._on_stderr(self.name, text)

    async def wait_exited(self) -> int:
        """The leader's exit, even while a grandchild still holds its pipes open."""
        # asyncio's process.wait() (3.11) also waits for every pipe to close, which a
        # grandchild that inherited stdout/stderr may never do; returncode is set at exit.
        # Nothing signals that moment, hence the poll.
        while self.process.returncode is None:  # noqa: ASYNC110
            await anyio.sleep(EXIT_POLL_INTERVAL)
        return self.process.returncode

    async def stop(self, grace: float) -> None:
        """EOF on stdin, wait, SIGTERM the group, wait, SIGKILL the group, then the strays.

        Always bounded; a second call returns at once.
        """
        if self._stopped:
            return
        self._stopped = True
        try:
            await self.stdin.aclose()
        except (OSError, anyio.BrokenResourceError, anyio.ClosedResourceError):
            pass
        with anyio.move_on_after(grace):
            await self.wait_exited()
        # The group is signalled even when the leader exited: npx/uvx leave grandchildren.
        if _signal_group(self.pid, signal.SIGTERM):
            with anyio.move_on_after(grace):
                await _wait_group_gone(self.pid, self.process)
            if _signal_group(self.pid, signal.SIGKILL):
                with anyio.move_on_after(2.0):
                    await _wait_group_gone(self.pid, self.process)
        with anyio.move_on_after(2.0):
            await self.process.wait()
        await sweep_strays(self.spec.token, grace)


async def sweep_strays(token: str, grace: float) -> None:
    """TERM, then KILL, whatever still carries the component's token: descendants that left
    its process group (setsid, double fork) or outlived their parent. Bounded."""
    survivors = await _scan(token)
    if not survivors:
        return
    log.warning("stopping %d process(es) that left the component's process group",
                len(survivors))
    for sig in (signal.SIGTERM, signal.SIGKILL):
        for pid in survivors:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, sig)
        with anyio.move_on_after(grace if sig == signal.SIGTERM else 2.0):
            while survivors:  # not our children: nothing to wait on, so check briefly
                await anyio.sleep(0.02)
                survivors = await _scan(token)
        if not survivors:
            return


async def _scan(token: str) -> list[int]:
    """`_marked` in a worker thread, bounded: a stuck read is abandoned, not waited for."""
    with anyio.move_on_after(SCAN_TIMEOUT):
        return await anyio.to_thread.run_sync(_marked, token, abandon_on_cancel=True)
    log.warning("gave up looking for stray processes: /proc did not answer in time")
    return []


def _marked(token: str) -> list[int]:
    """Pids whose environment carries `token` (Linux /proc; elsewhere nothing is found)."""
    needle = f"{TOKEN_PREFIX}{token}=1".encode()
    me = os.getpid()
    found = []
    try:
        entries = os.listdir("/proc")
    except OSError:
        return found
    for entry in entries:
        if not entry.isdigit() or int(entry) == me:
            continue
        try:
            with open(f"/proc/{entry}/environ", "rb") as f:
                if needle in f.read().split(b"\0"):
                    found.append(int(entry))
        except OSError:
            continue  # gone, or not ours to read
    return found


def _signal_group(pgid: int, sig: int) -> bool:
    """Signal a process group; False when nobody is left in it."""
    try:
        os.killpg(pgid, sig)
    except ProcessLookupError:
        return False
    except PermissionError:
        return False
    return True


async def _wait_group_gone(pgid: int, process: Process) -> None:
    # Grandchildren are not our children: nothing to wait on but the group itself, so this
    # checks at a short interval. Unbounded: callers bound it.
    while True:
        if process.returncode is None:
            with anyio.move_on_after(0.02):
                await process.wait()
        else:
            await anyio.sleep(0.02)
        if not _signal_group(pgid, 0):
            return


@asynccontextmanager
async def open_component(spec: LaunchSpec, on_stderr: StderrCallback) -> AsyncIterator[Component]:
    """Spawn `spec` in its own process group; on exit stop it, grandchildren included.

    Raises:
        ComponentStartError: the command could not be started.
    """
    # The protocol pipes are our own fds, not asyncio's: a write is one os.write and a read
    # one os.read (FdSendStream/FdReceiveStream), with no transport, protocol and
    # StreamReader layers and no event-loop yield per message in between.
    stdin_r, stdin_w = os.pipe()
    stdout_r, stdout_w = os.pipe()
    try:
        process = await _spawn(spec, stdin=stdin_r, stdout=stdout_w)
    except BaseException:
        os.close(stdin_w)
        os.close(stdout_r)
        raise
    finally:
        os.close(stdin_r)  # the child has its own copies now
        os.close(stdout_w)
    component = Component(spec, process, on_stderr, stdin=FdSendStream(stdin_w),
                          stdout=FdReceiveStream(stdout_r, owns_fd=True))
    async with anyio.create_task_group() as tg:
        tg.start_soon(component.pump_stderr)
        try:
            yield component
        finally:
            with anyio.CancelScope(shield=True):  # cleanup must finish even when cancelled
                await component.stop(spec.shutdown_grace)
                with anyio.move_on_after(1.0):
                    await component.stderr_closed.wait()
                await component.stdout.aclose()
                if process.stderr is not None:  # held open by a straggler: close our end
                    with contextlib.suppress(OSError, anyio.BrokenResourceError):
                        await process.stderr.aclose()
            tg.cancel_scope.cancel()


async def _spawn(spec: LaunchSpec, *, stdin: int, stdout: int) -> Process:
    """Raises:
        ComponentStartError: the command could not be started.
    """
    try:
        return await anyio.open_process(list(spec.argv), cwd=spec.cwd, env=spec.environment(),
                                        start_new_session=True, stdin=stdin, stdout=stdout)
    except FileNotFoundError as e:
        # One stat on an error path after a failed spawn: not worth a worker thread.
        cwd_missing = spec.cwd and not os.path.isdir(spec.cwd)  # noqa: ASYNC240
        missing = spec.cwd if cwd_missing else spec.argv[0]
        what = "working directory" if missing == spec.cwd else "command"
        raise ComponentStartError(
            spec.name, f"{what} not found: {missing} ({e.strerror})") from None
    except PermissionError as e:
        raise ComponentStartError(
            spec.name, f"cannot execute {spec.argv[0]}: {e.strerror}") from None
    except OSError as e:
        reason = e.strerror or errno.errorcode.get(e.errno or 0, str(e))
        raise ComponentStartError(spec.name, f"cannot start {spec.argv[0]}: {reason}") from None
