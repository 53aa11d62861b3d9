"""Byte streams over raw pipe fds (our stdin/stdout, a child's pipes), without a thread per
read and without asyncio's transport/protocol layers: a write is one os.write when the pipe
has room, a read is one os.read of whatever is waiting."""

from __future__ import annotations

import fcntl
import os
import stat
import sys

import anyio
from anyio.abc import ByteReceiveStream, ByteSendStream


def _pollable(fd: int) -> bool:
    """Pipes and sockets can wait in the event loop; files and terminals cannot (or should not)."""
    mode = os.fstat(fd).st_mode
    return stat.S_ISFIFO(mode) or stat.S_ISSOCK(mode)


# Linux pipes hold 64 KiB by default: a 10 MB frame then crosses in 160 reads and as many
# event-loop wake-ups. 1 MiB is the default limit an unprivileged process may set.
PIPE_SIZE = 1 << 20
_F_SETPIPE_SZ = getattr(fcntl, "F_SETPIPE_SZ", None)


def _grow_pipe(fd: int) -> None:
    if _F_SETPIPE_SZ is None or not stat.S_ISFIFO(os.fstat(fd).st_mode):
        return
    try:
        fcntl.fcntl(fd, _F_SETPIPE_SZ, PIPE_SIZE)
    except OSError:
        pass  # over /proc/sys/fs/pipe-max-size, or not permitted: the default still works


class _NonBlocking:
    def __init__(self, fd: int) -> None:
        self.fd = fd
        self.pollable = _pollable(fd)
        self._flags = fcntl.fcntl(fd, fcntl.F_GETFL)
        if self.pollable:
            fcntl.fcntl(fd, fcntl.F_SETFL, self._flags | os.O_NONBLOCK)
            _grow_pipe(fd)

    def restore(self) -> None:
        if self.pollable:
            try:
                fcntl.fcntl(self.fd, fcntl.F_SETFL, self._flags)
            except OSError:
                pass


class FdReceiveStream(ByteReceiveStream):
    # Reads that find data waiting do not yield; after this many in a row, yield once so a
    # flood on this fd cannot starve the other tasks (the wire locks no longer yield).
    YIELD_EVERY = 8

    def __init__(self, fd: int, *, owns_fd: bool = False) -> None:
        self._fd = _NonBlocking(fd)
        self._streak = 0
        self._owns_fd = owns_fd
        self._closed = False

    async def receive(self, max_bytes: int = 65536) -> bytes:
        fd = self._fd.fd
        while True:
            if self._closed:
                raise anyio.ClosedResourceError
            if not self._fd.pollable:
                data = await anyio.to_thread.run_sync(os.read, fd, max_bytes,
                                                      abandon_on_cancel=True)
            else:
                try:
                    data = os.read(fd, max_bytes)
                except BlockingIOError:
                    self._streak = 0
                    await anyio.wait_readable(fd)
                    continue
                self._streak += 1
                if self._streak >= self.YIELD_EVERY:
                    self._streak = 0
                    await anyio.lowlevel.checkpoint()
            if not data:
                raise anyio.EndOfStream
            return data

    async def aclose(self) -> None:
        if self._closed:
            return
        self._closed = True
        self._fd.restore()
        if self._owns_fd:
            _close(self._fd.fd)


class FdSendStream(ByteSendStream):
    def __init__(self, fd: int) -> None:
        self._fd = _NonBlocking(fd)
        self._closed = False

    async def send(self, item: bytes | bytearray | memoryview) -> None:
        view = memoryview(item)
        fd = self._fd.fd
        while view:
            if self._closed:  # the number may already name another file
                raise anyio.ClosedResourceError
            try:
                written = os.write(fd, view)
            except BlockingIOError:
                await anyio.wait_writable(fd)
                continue
            except (BrokenPipeError, ConnectionResetError) as e:
                raise anyio.BrokenResourceError from e
            view = view[written:]

    async def aclose(self) -> None:
        if self._closed:
            return
        self._closed = True
        self._fd.restore()
        _close(self._fd.fd)


def _close(fd: int) -> None:
    anyio.notify_closing(fd)  # wakes a task still waiting on it with ClosedResourceError
    try:
        os.close(fd)
    except OSError:
        pass


def claim_stdout() -> int:
    """Take this process's stdout for the caller alone: return a private duplicate of fd 1,
    then point fd 1 and `sys.stdout` at stderr.

    Call it before any plugin is imported: a `print()` in user code (or a C library writing
    to fd 1) then lands on stderr instead of in the JSON-RPC wire or `run`'s output.
    """
    sys.stdout.flush()
    private = os.dup(1)  # not inherited (PEP 446): a child never gets the wire either
    os.dup2(2, 1)
    sys.stdout = sys.stderr  # unbuffered order with our logs; fd 1 covers everything else
    return private


def stdio_streams() -> tuple[ByteReceiveStream, ByteSendStream]:
    """(stdin, stdout) of this process, by file descriptor; stdout is claimed (above)."""
    return FdReceiveStream(0), FdSendStream(claim_stdout())
