"""Our stderr, when it is a pipe, written without ever blocking.

Component stderr and our logs all go to stderr, from the event loop. An editor that pipes
our stderr but does not read it (or reads it only now and then) would fill the pipe
(64 KiB), and a blocking write there would stop every session: the conductor would never
answer again. So when stderr is a pipe, we write to it through a fresh, non-blocking open
of that pipe (`/proc/self/fd/2`: the flag is then ours alone, not shared with fd 2):
what the pipe cannot take waits in a bounded queue, in order, and what overflows it is
dropped and counted, with one line saying so once the reader catches up. A socket (what an
editor on Node, libuv, gives its child for a piped stderr) cannot be opened again: each
write to it is made non-blocking by itself (MSG_DONTWAIT), the socket's flag untouched.
Elsewhere (a file, a terminal, no /proc) stderr is written as before.
"""

from __future__ import annotations

import fcntl
import os
import select
import stat
import threading
import time
from collections import deque
from typing import TYPE_CHECKING, Final

if TYPE_CHECKING:
    import socket

MAX_QUEUED: Final = 1 << 20   # bytes held while the reader is behind (then lines drop)
EXIT_WAIT: Final = 0.5        # at exit, how long what is queued may wait for the reader

_made: tuple[tuple[int, int], PipeStderr] | None = None  # (fd 2's identity, its writer)


class PipeStderr:
    """A text stream for `logging.StreamHandler` that never blocks (see the module)."""

    def __init__(self, fd: int, *, max_queued: int = MAX_QUEUED,
                 sock: socket.socket | None = None, dontwait: int = 0) -> None:
        self._fd = fd                  # non-blocking, ours (or `sock`'s)
        self._sock = sock              # a socket: each write given `dontwait` instead
        self._dontwait = dontwait
        self._max = max_queued
        self._queue: deque[bytes] = deque()
        self._queued = 0
        self._dropped = 0              # lines dropped since the last note
        self._lock = threading.Lock()  # logging may write from worker threads too

    @classmethod
    def for_stderr(cls) -> PipeStderr | None:
        """The one for our fd 2 if it is a pipe we can reopen or a stream socket, else None
        (made once per pipe: logging is configured again by every command a test runs
        in-process)."""
        global _made
        try:
            st = os.fstat(2)
            if not (stat.S_ISFIFO(st.st_mode) or stat.S_ISSOCK(st.st_mode)):
                return None
            if _made is not None and _made[0] == (st.st_dev, st.st_ino):
                return _made[1]
            if stat.S_ISSOCK(st.st_mode):
                made = _socket_writer()
            else:
                fd = os.open("/proc/self/fd/2", os.O_WRONLY | os.O_NONBLOCK | os.O_CLOEXEC)
                if fd < 3:  # stdin or stdout was closed: never take their place
                    try:
                        moved = fcntl.fcntl(fd, fcntl.F_DUPFD_CLOEXEC, 3)
                    finally:
                        os.close(fd)
                    fd = moved
                made = cls(fd)
        except OSError:
            return None
        if _made is not None:
            _made[1]._close()  # fd 2 is another pipe now: the old one is not ours
        _made = ((st.st_dev, st.st_ino), made)
        return _made[1]

    def _close(self) -> None:
        if self._sock is not None:
            self._sock.close()
        else:
            os.close(self._fd)

    def write(self, text: str) -> int:
        data = text.encode("utf-8", "replace")
        with self._lock:
            self._drain()
            if not self._queue:
                data = data[self._write_some(data):]
            if data:
                if self._queued + len(data) > self._max:
                    self._dropped += text.count("\n") or 1
                else:
                    self._queue.append(data)
                    self._queued += len(data)
        return len(text)

    def flush(self) -> None:
        with self._lock:
            self._drain()

    def finish(self, wait: float = EXIT_WAIT) -> None:
        """At exit: give the reader `wait` seconds to take what is queued."""
        deadline = time.monotonic() + wait
        with self._lock:
            self._drain()
            while self._queue or self._dropped:
                left = deadline - time.monotonic()
                if left <= 0:
                    return
                try:
                    select.select([], [self._fd], [], left)
                except (OSError, ValueError):
                    return
                self._drain()

    def _drain(self) -> None:
        while self._queue:
            head = self._queue[0]
            n = self._write_some(head)
            self._queued -= n
            if n < len(head):
                self._queue[0] = head[n:]
                return
            self._queue.popleft()
        if self._dropped:  # caught up: say what was lost, once
            note = (f"acp-conductor WARNING: {self._dropped} line(s) of logs and component "
                    "stderr were dropped: nothing was reading stderr\n").encode()
            if self._write_some(note) == len(note):
                self._dropped = 0

    def _write_some(self, data: bytes) -> int:
        try:
            if self._sock is not None:
                return self._sock.send(data, self._dontwait)
            return os.write(self._fd, data)
        except BlockingIOError:
            return 0
        except OSError:  # the reader is gone (EPIPE): nothing will read it, ever
            return len(data)


def _socket_writer() -> PipeStderr:
    """The writer for a stderr that is a socket: our own descriptor of it (a duplicate, fd
    3 or above), written with MSG_DONTWAIT.

    Raises:
        OSError: it cannot be duplicated, or is not a stream socket after all.
    """
    import socket  # here: only this case needs it

    fd = fcntl.fcntl(2, fcntl.F_DUPFD_CLOEXEC, 3)
    try:
        sock = socket.socket(fileno=fd)
    except OSError:
        os.close(fd)
        raise
    if sock.type != socket.SOCK_STREAM:  # a datagram socket would cut lines: leave it be
        sock.close()
        raise OSError("stderr is not a stream socket")
    return PipeStderr(sock.fileno(), sock=sock, dontwait=socket.MSG_DONTWAIT)
