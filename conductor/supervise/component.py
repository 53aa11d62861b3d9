"""A spawned component: its own process group, stderr read continuously, stopped gracefully,
and not outliving the conductor even when the conductor is killed.

How it is stopped is `escalation.py`; this module holds the OS side. Against a conductor
killed with SIGKILL, two things: on Linux each component gets a parent-death signal
(SIGTERM), and `watchdog.py` TERMs, then KILLs, what is left (see docs/design.md).
"""

from __future__ import annotations

import contextlib
import logging
import os
from collections import deque
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import asynccontextmanager
from typing import TYPE_CHECKING

import anyio

from conductor.supervise import _linux
from conductor.supervise.escalation import stop_escalating, stop_strays
from conductor.supervise.spawn import TOKEN_PREFIX, LaunchSpec, Started, start_process
from conductor.supervise.watchdog import WATCHDOG
from conductor.transport.stdio import FdReceiveStream, FdSendStream

log = logging.getLogger("acp_conductor.supervise")
SCAN_TIMEOUT = 5.0  # /proc reads can block on a process stuck in the kernel

if TYPE_CHECKING:
    import subprocess

    from anyio.abc import ByteReceiveStream, ByteSendStream

STDERR_TAIL_LINES = 20
_MAX_STDERR_LINE = 8192
EXIT_POLL_INTERVAL = 0.05  # where no pidfd tells us (not Linux), how often to look
EXIT_DRAIN = 0.5  # after the leader exits, how long its stdout may stay open (grandchildren)

StderrCallback = Callable[[str, str], None]  # (component name, line)


class Child:
    """The leader's pid and exit. Its exit is reaped by `watch_exit`, not by the event
    loop's child watcher: asyncio's `Process.wait()` also waits for every pipe to close,
    which a grandchild holding them may never do."""

    def __init__(self, popen: subprocess.Popen[bytes]) -> None:
        self._popen = popen
        self.pid = popen.pid
        self._exited = anyio.Event()
        # Shielded: a cancelled chain's cleanup still needs the exit seen (and the leader
        # reaped, or it stays in its group as a zombie); `stop_watching` ends it.
        self._watching = anyio.CancelScope(shield=True)

    @property
    def returncode(self) -> int | None:
        """The exit status, or minus the signal that ended it; None while it runs."""
        return self._popen.returncode

    async def wait(self) -> int:
        await self._exited.wait()
        assert self._popen.returncode is not None
        return self._popen.returncode

    async def watch_exit(self) -> None:
        """Reap the leader when it exits: at once on Linux (pidfd), by polling elsewhere."""
        with self._watching:
            pidfd = _linux.open_pidfd(self.pid)
            if pidfd is not None:
                try:
                    await anyio.wait_readable(pidfd)
                finally:
                    os.close(pidfd)
            while self._popen.poll() is None:  # noqa: ASYNC110 (no pidfd: nothing signals it)
                await anyio.sleep(EXIT_POLL_INTERVAL)
            self._exited.set()

    def stop_watching(self) -> None:
        self._watching.cancel()


class Component:
    """A running child. `stdin`/`stdout` carry the protocol; stderr is pumped to a callback."""

    def __init__(self, spec: LaunchSpec, process: Child, on_stderr: StderrCallback, *,
                 stdin: ByteSendStream, stdout: ByteReceiveStream,
                 stderr: ByteReceiveStream) -> None:
        self.spec = spec
        self.name = spec.name
        self.process = process
        self.pid = process.pid
        self.stderr_tail: deque[str] = deque(maxlen=STDERR_TAIL_LINES)
        self.stderr_closed = anyio.Event()
        self._stopped = False
        self._stopping = anyio.Lock()
        self._on_stderr = on_stderr
        self.stdin = stdin
        self.stdout = stdout
        self.stderr = stderr

    @property
    def returncode(self) -> int | None:
        return self.process.returncode

    async def pump_stderr(self) -> None:
        """Read stderr line by line until EOF; an unread stderr pipe would wedge the child."""
        stream = self.stderr
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

    def _line(self, line: bytes | bytearray) -> None:
        text = line[:_MAX_STDERR_LINE].decode("utf-8", "replace").rstrip("\r")
        self.stderr_tail.append(text)
        self._on_stderr(self.name, text)

    async def wait_exited(self) -> int:
        """The leader's exit, even while a grandchild still holds its pipes open."""
        return await self.process.wait()

    async def stop(self, grace: float) -> None:
        """EOF on stdin, wait, SIGTERM the group, wait, SIGKILL the group, then the strays
        (`escalation.stop_escalating`). Always bounded. A second call waits for the first;
        after one that was cancelled part-way (its caller's scope), it stops it again."""
        async with self._stopping:
            if self._stopped:
                return
            await stop_escalating(_Control(self), grace)
            self._stopped = True  # only once done: a cancelled stop left it running
            WATCHDOG.release(self.pid)


class _Control:
    """`ProcessControl` for a real component."""

    def __init__(self, component: Component) -> None:
        self._component = component
        self._pgid = component.pid  # a group leader: its pid names its group
        self._members: list[int] = []  # running members the last scan of /proc found

    async def close_input(self) -> None:
        try:
            await self._component.stdin.aclose()
        except (OSError, anyio.BrokenResourceError, anyio.ClosedResourceError):
            pass

    async def wait_exited(self) -> None:
        await self._component.wait_exited()

    def signal_group(self, sig: int) -> bool:
        try:
            os.killpg(self._pgid, sig)
        except (ProcessLookupError, PermissionError):
            return False
        return True

    async def group_running(self) -> bool:
        if not self.signal_group(0):
            return False
        # Someone is in the group: /proc tells a running member from a zombie. Asked every
        # GONE_POLL while a stop waits, so the members a scan found are looked at first
        # (a read each); the whole of /proc is scanned again, in a worker thread as it is
        # not instant on a busy host, only once none of them runs. Unreadable: running.
        if any(_linux.runs_in_group(pid, self._pgid) for pid in self._members):
            return True
        members = await anyio.to_thread.run_sync(_linux.live_group_members, self._pgid,
                                                 abandon_on_cancel=True)
        if members is None:
            return True
        self._members = members
        return bool(members)

    async def find_strays(self) -> list[int]:
        return await _scan(self._component.spec.token)

    def signal_strays(self, pids: Sequence[int], sig: int) -> None:
        _Tokened(self._component.spec.token).signal_strays(pids, sig)


class _Tokened:
    """`StrayControl` for processes known only by the token in their environment."""

    def __init__(self, token: str) -> None:
        self._token = token

    async def find_strays(self) -> list[int]:
        return await _scan(self._token)

    def signal_strays(self, pids: Sequence[int], sig: int) -> None:
        for pid in pids:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, sig)


async def sweep_strays(token: str, grace: float) -> None:
    """TERM, then KILL, every process that carries `token` (`TOKEN_PREFIX` + token in its
    environment): what a process left behind when its group was killed. Bounded."""
    await stop_strays(_Tokened(token), grace)


async def _scan(token: str) -> list[int]:
    """Processes carrying `token`, read from /proc in a worker thread, bounded: a stuck
    read is abandoned, not waited for. Elsewhere nothing is found."""
    prefix = f"{TOKEN_PREFIX}{token}=".encode()
    with anyio.move_on_after(SCAN_TIMEOUT):
        return await anyio.to_thread.run_sync(_linux.processes_with_env, prefix,
                                              abandon_on_cancel=True)
    log.warning("gave up looking for stray processes: /proc did not answer in time")
    return []


@asynccontextmanager
async def open_component(spec: LaunchSpec, on_stderr: StderrCallback, *,
                         started: Started | None = None) -> AsyncIterator[Component]:
    """Spawn `spec` in its own process group (or serve `started`, the process `spec` was
    already started as); on exit stop it, grandchildren included.

    Raises:
        ComponentStartError: the command could not be started.
    """
    # The pipes are our own fds, not the event loop's: a write is one os.write and a read
    # one os.read (FdSendStream/FdReceiveStream), with no transport, protocol and
    # StreamReader layers and no event-loop yield per message in between.
    if started is None:
        started = start_process(spec)
    process = Child(started.popen)
    component = Component(spec, process, on_stderr, stdin=FdSendStream(started.stdin),
                          stdout=FdReceiveStream(started.stdout, owns_fd=True),
                          stderr=FdReceiveStream(started.stderr, owns_fd=True))
    async with anyio.create_task_group() as tg:
        tg.start_soon(process.watch_exit)
        tg.start_soon(component.pump_stderr)
        try:
            yield component
        finally:
            with anyio.CancelScope(shield=True):  # cleanup must finish even when cancelled
                await component.stop(spec.shutdown_grace)
                with anyio.move_on_after(1.0):
                    await component.stderr_closed.wait()
                await component.stdout.aclose()
                await component.stderr.aclose()  # held open by a straggler: close our end
            process.stop_watching()
            tg.cancel_scope.cancel()
