"""Byte streams over raw pipe fds (our stdin/stdout, a child's pipes), without a thread per
read and without asyncio's transport/protocol layers: a write is one os.write when the pipe
has room, a read is one os.read of whatever is waiting.

Waiting for data is the one place that knows the event loop. On asyncio the fd stays
registered with the loop while a reader keeps coming back for more (`_LoopReader`);
anyio's portable `wait_readable`, used on every other backend, registers and unregisters
it around each wait: two `epoll_ctl` calls per message on the latency path (measured in
docs/performance.md).
"""

from __future__ import annotations

import asyncio
import fcntl
import os
import select
import stat

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


class _LoopReader:
    """asyncio only: reads the fd in the loop's own readiness callback, keeping it
    registered between reads. A stale readiness report (the data was already read) costs
    one failed read and wakes nobody. When the fd is readable and nobody is waiting (the
    reader is busy routing, or stalled by backpressure), it is unregistered, so unread data
    never keeps the loop spinning; the next read registers it again."""

    __slots__ = ("_fd", "_loop", "_max", "_registered", "_stash", "_waiter")

    def __init__(self, fd: int, loop: asyncio.AbstractEventLoop) -> None:
        self._fd = fd
        self._loop = loop
        self._registered = False
        self._waiter: asyncio.Future[bytes] | None = None
        self._max = 65536
        self._stash: bytes | None = None  # read for a reader that was cancelled meanwhile

    def take_stash(self) -> bytes | None:
        data, self._stash = self._stash, None
        return data

    async def read(self, max_bytes: int) -> bytes:
        """The next bytes (b"" at end of file), read by the loop when the fd is readable."""
        waiter = self._loop.create_future()
        self._waiter, self._max = waiter, max_bytes
        if not self._registered:
            self._loop.add_reader(self._fd, self._ready)
            self._registered = True
        try:
            data: bytes = await waiter
            return data
        except BaseException:
            # Cancelled after the loop had read for us: keep the bytes for the next read.
            if waiter.done() and not waiter.cancelled() and waiter.exception() is None:
                self._stash = waiter.result()
            raise
        finally:
            self._waiter = None

    def _ready(self) -> None:
        waiter = self._waiter
        if waiter is None:
            self._unregister()
            return
        if waiter.done():
            return
        try:
            data = os.read(self._fd, self._max)
        except BlockingIOError:
            return  # a stale report: nothing to read after all
        except OSError as e:
            waiter.set_exception(e)
            return
        waiter.set_result(data)

    def _unregister(self) -> None:
        if self._registered:
            self._registered = False
            self._loop.remove_reader(self._fd)

    def close(self) -> None:
        self._unregister()
        if self._waiter is not None and not self._waiter.done():
            self._waiter.set_exception(anyio.ClosedResourceError())


def _running_asyncio_loop() -> asyncio.AbstractEventLoop | None:
    try:
        return asyncio.get_running_loop()
    except RuntimeError:
        return None  # another backend (trio)


class FdReceiveStream(ByteReceiveStream):
    # Reads that find data waiting do not yield; after this many in a row, yield once so a
    # flood on this fd cannot starve the other tasks (the wire locks no longer yield).
    YIELD_EVERY = 8
    # The portable wait on every backend (tests set it to compare the two).
    USE_LOOP_READINESS = True

    def __init__(self, fd: int, *, owns_fd: bool = False, unread: bytes = b"") -> None:
        self._fd = _NonBlocking(fd)
        self._unread = unread  # read from the fd before this stream existed: comes first
        self._streak = 0
        self._owns_fd = owns_fd
        self._closed = False
        self._reader: _LoopReader | None = None
        self._probed = False
        self._drained = False  # the last read took less than asked: the pipe was empty

    def _loop_reader(self) -> _LoopReader | None:
        if not self._probed:
            self._probed = True
            loop = _running_asyncio_loop() if self.USE_LOOP_READINESS else None
            if loop is not None:
                self._reader = _LoopReader(self._fd.fd, loop)
        return self._reader

    async def receive(self, max_bytes: int = 65536) -> bytes:
        if self._unread and not self._closed:
            data, self._unread = self._unread[:max_bytes], self._unread[max_bytes:]
            return data
        fd = self._fd.fd
        while True:
            if self._closed:
                raise anyio.ClosedResourceError
            if not self._fd.pollable:
                data = await anyio.to_thread.run_sync(os.read, fd, max_bytes,
                                                      abandon_on_cancel=True)
            else:
                reader = self._loop_reader()
                stashed = reader.take_stash() if reader is not None else None
                if stashed is not None:
                    data = stashed
                elif self._drained and reader is not None:
                    # The last read left the pipe empty: a read now would almost surely
                    # fail, so wait for readiness first (one syscall less per message).
                    self._streak = 0
                    data = await reader.read(max_bytes)
                else:
                    try:
                        data = os.read(fd, max_bytes)
                    except BlockingIOError:
                        self._streak = 0
                        if reader is None:
                            await anyio.wait_readable(fd)
                            continue
                        data = await reader.read(max_bytes)
                self._drained = len(data) < max_bytes
                self._streak += 1
                if self._streak >= self.YIELD_EVERY:
                    self._streak = 0
                    await anyio.lowlevel.checkpoint()
            if not data:
                raise anyio.EndOfStream
            return data

    async def wait_hangup(self) -> None:
        """Until the writer has closed its end, even while data it wrote is still unread
        (its reader may be stuck routing it). Linux only (epoll reports the hangup alone,
        unread data or not); elsewhere, or on a fd that is not a pipe or socket, never."""
        if not self._fd.pollable or not hasattr(select, "epoll"):
            await anyio.sleep_forever()
        with select.epoll() as hangup:  # readable once the fd hangs up: not on data
            try:
                hangup.register(self._fd.fd, select.EPOLLRDHUP)
            except OSError:
                await anyio.sleep_forever()
            await anyio.wait_readable(hangup.fileno())

    async def aclose(self) -> None:
        if self._closed:
            return
        self._closed = True
        if self._reader is not None:
            self._reader.close()
        self._fd.restore()
        if self._owns_fd:
            _close(self._fd.fd)


class FdSendStream(ByteSendStream):
    def __init__(self, fd: int) -> None:
        self._fd = _NonBlocking(fd)
        self._closed = False

    def write_nowait(self, data: bytes | bytearray | memoryview) -> int:
        """Write what the pipe takes now; how many bytes that was (0 when it is full).

        Raises:
            anyio.BrokenResourceError: the reader is gone.
            anyio.ClosedResourceError: this stream was closed.
        """
        if self._closed:
            raise anyio.ClosedResourceError
        try:
            return os.write(self._fd.fd, data)
        except BlockingIOError:
            return 0
        except (BrokenPipeError, ConnectionResetError) as e:
            raise anyio.BrokenResourceError from e

    async def wait_writable(self) -> None:
        """Until the pipe has room (or its reader is gone: the next write says so)."""
        if self._closed:
            raise anyio.ClosedResourceError
        await anyio.wait_writable(self._fd.fd)

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


def stdio_streams(wire: int, unread: bytes = b"") -> tuple[ByteReceiveStream, ByteSendStream]:
    """(stdin, stdout) of this process, by file descriptor: `wire` is the claimed stdout
    (`claim.claim_stdout`), `unread` what was already read from stdin (it comes first)."""
    return FdReceiveStream(0, unread=unread), FdSendStream(wire)
