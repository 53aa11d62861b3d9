"""`run`'s file-system sandbox: what `fs/read_text_file` and `fs/write_text_file` may touch.

Only absolute paths that resolve inside `--cwd`; only regular files (nothing else is even
opened: a FIFO would block, some devices act when opened); at most `MAX_READ_BYTES` (or the
frame limit) read, in a worker thread abandoned on cancel, so `--timeout` and Ctrl-C always
work. Every refusal is a decision the run reports, and (but for malformed requests) a policy
violation (exit 8). The table of answers is in docs/run.md.
"""

from __future__ import annotations

import errno
import os
import stat
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn, Protocol

import anyio
import msgspec

from conductor.errors import RpcError
from conductor.jsonrpc.codes import ErrorCode

if TYPE_CHECKING:
    from conductor.jsonrpc.message import JsonValue

REFUSED = ErrorCode.POLICY_DENIED  # run's sandbox refused a client request (docs/errors.md)
NOT_FOUND = ErrorCode.RESOURCE_NOT_FOUND
MAX_READ_BYTES = 64 * 1024 * 1024  # the largest file fs/read_text_file serves (docs/run.md)
# Pseudo filesystems: files that block, never end, or change each read; and devices whose
# very opening does something (a tape rewinds, a watchdog arms).
NOT_FILES = ("/proc", "/sys", "/dev")
_WINDOW_SCAN = 64 * 1024  # newlines are counted this many bytes at a time


class Decisions(Protocol):
    """Where the sandbox reports what it allowed and refused (run's renderer)."""

    def decision(self, record: dict[str, Any]) -> None: ...


class Sandbox:
    """Answers the agent's file requests inside `root`, recording every violation."""

    def __init__(self, root: Path, events: Decisions, *, allow_write: bool,
                 frame_limit: int) -> None:
        self.root = Path(os.path.realpath(root))
        self.events = events
        self.allow_write = allow_write
        self.frame_limit = frame_limit
        self.violations: list[dict[str, Any]] = []

    def inside(self, op: str, raw_path: object, *, file: bool = True) -> Path:
        """The real path of `raw_path`, which must lie inside --cwd (and, for a `file`,
        outside the pseudo filesystems).

        Raises:
            RpcError: INVALID_PARAMS when it is not an absolute path (ACP requires one) or
                has a NUL byte; REFUSED when it resolves outside --cwd.
        """
        if not isinstance(raw_path, str) or not raw_path:
            self._invalid(op, repr(raw_path), f"path must be a string, got {raw_path!r}")
        if "\0" in raw_path:
            self._invalid(op, repr(raw_path), f"path {raw_path!r} has a NUL byte")
        if not os.path.isabs(raw_path):
            # An editor would resolve it against a directory of its own choosing.
            self._invalid(op, raw_path, f"paths must be absolute (ACP), got {raw_path!r}")
        try:
            os.fsencode(raw_path)
        except UnicodeEncodeError:  # a lone surrogate (a \ud800 escape): names no file
            self._invalid(op, repr(raw_path), f"path {raw_path!r} is not valid Unicode")
        path = Path(raw_path)
        try:
            resolved = Path(os.path.realpath(path))
        except RecursionError:  # Python's realpath recurses once per link in a chain
            resolved = None
        # realpath leaves a symlink loop and what follows it (`..` included) unresolved.
        if resolved is None or ".." in resolved.parts:
            self.refuse(op, str(path), f"{path} goes through a symlink loop or more "
                                        "symlinks than the system follows")
        if resolved != self.root and self.root not in resolved.parents:
            self.refuse(op, str(path), f"{path} is outside the run's --cwd {self.root}")
        if file and any(resolved == Path(top) or Path(top) in resolved.parents
                        for top in NOT_FILES):
            self.refuse(op, str(path), f"{path} is not a regular file (it is under "
                                        f"/{resolved.parts[1]})")
        return resolved

    def _invalid(self, op: str, target: str, reason: str) -> NoReturn:
        """A malformed request: shown as refused, but not a policy violation."""
        self.events.decision({"type": "access", "op": op, "target": target, "allowed": False,
                              "reason": reason})
        raise RpcError(ErrorCode.INVALID_PARAMS, f"invalid params: {reason}",
                       {"op": op, "target": target})

    def refuse(self, op: str, target: str, reason: str) -> NoReturn:
        self.violation(op, reason, path=target)
        self.events.decision({"type": "access", "op": op, "target": target, "allowed": False,
                              "reason": reason})
        # `editor`: the name run's handler failures give too (open_client_connection); it
        # tells this refusal from a permissions proxy's, which names itself.
        raise RpcError(REFUSED, f"refused by acp-conductor run: {reason}",
                       {"component": "editor", "op": op, "target": target})

    def violation(self, op: str, reason: str, **extra: Any) -> None:
        self.violations.append({"op": op, "reason": reason, **extra})

    def _open_failed(self, op: str, path: Path, error: Exception) -> NoReturn:
        if isinstance(error, _NotRegular):
            self.refuse(op, str(path), f"{path} is {error.kind}, not a regular file")
        if isinstance(error, _Escaped):
            self.refuse(op, str(path), f"{path} changed while being opened and now leads "
                                        f"outside the run's --cwd {self.root}")
        if isinstance(error, _TooLarge):
            self.refuse(op, str(path), error.reason)
        if isinstance(error, FileNotFoundError):
            raise RpcError(NOT_FOUND, f"file not found: {path}", {"path": str(path)}) from None
        if isinstance(error, OSError) and error.errno == errno.ELOOP:  # O_NOFOLLOW hit a link
            self.refuse(op, str(path), f"{path} (or a directory on its way) became a "
                                        "symlink while being opened")
        reason = error.strerror if isinstance(error, OSError) else str(error)
        raise RpcError(ErrorCode.INTERNAL_ERROR, f"cannot {op} {path}: {reason}") from None

    async def read(self, p: dict[str, Any]) -> JsonValue:
        path = self.inside("read", p.get("path"))
        limit = min(MAX_READ_BYTES, self.frame_limit)
        try:
            # In a worker that is abandoned on cancel: a read stuck in the kernel (NFS, a
            # dying disk) must not keep --timeout and Ctrl-C from ending the run.
            data = await anyio.to_thread.run_sync(_read_file, path, self.root, limit,
                                                  abandon_on_cancel=True)
        except (OSError, _Refusal) as e:
            self._open_failed("read", path, e)
        text = _lines(data, _count(p.get("line")), _count(p.get("limit"))).decode(
            "utf-8", "replace")
        # The answer must fit one frame; JSON escapes can make it far bigger than the file.
        encoded = len(msgspec.json.encode(text))
        if encoded > self.frame_limit - 256:  # room for the envelope and the id
            self.refuse("read", str(path), f"{path} would be {encoded} bytes as JSON, over "
                                            f"the frame limit of {self.frame_limit} bytes")
        self.events.decision({"type": "access", "op": "read", "target": str(path),
                              "allowed": True})
        return {"content": text}

    async def write(self, p: dict[str, Any]) -> JsonValue:
        target = p.get("path")
        if not self.allow_write:
            self.refuse("write", str(target), "writing files needs --allow-write")
        path = self.inside("write", target)
        content = p.get("content")
        if not isinstance(content, str):
            raise RpcError(ErrorCode.INVALID_PARAMS, "Invalid params", "content must be a string")
        data = content.encode("utf-8", "replace")  # a lone surrogate from a \ud800 escape
        try:
            await anyio.to_thread.run_sync(_write_file, path, self.root, data,
                                           abandon_on_cancel=True)
        except (OSError, _Refusal) as e:
            self._open_failed("write", path, e)
        self.events.decision({"type": "access", "op": "write", "target": str(path),
                              "allowed": True})
        return {}


class _Refusal(Exception):
    """A file the sandbox will not serve, found while opening it (in a worker thread)."""


class _NotRegular(_Refusal):
    def __init__(self, kind: str) -> None:
        super().__init__(kind)
        self.kind = kind


class _Escaped(_Refusal):
    pass


class _TooLarge(_Refusal):
    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


_KINDS = ((stat.S_ISDIR, "a directory"), (stat.S_ISFIFO, "a FIFO"), (stat.S_ISSOCK, "a socket"),
          (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"),
          (stat.S_ISLNK, "a symlink"))


def _kind(mode: int) -> str:
    return next((name for test, name in _KINDS if test(mode)), "a special file")


# Linux: a directory fd that only walks (no read permission needed, as for a path).
_DIR_FLAGS = getattr(os, "O_PATH", os.O_RDONLY) | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


def _open_regular(path: Path, root: Path, flags: int) -> int:
    """An fd on the regular file `path`, checked after opening. Nothing that is not a
    regular file is opened at all (a FIFO would block; opening some devices acts).

    `path` is a real path inside `root` (links resolved when it was checked), so it is
    opened one directory at a time from `root`, following no link: a directory swapped
    for a link since the check stops the walk (ELOOP) before anything is created or
    opened where it leads. With O_CREAT, missing directories are created on the way.

    Raises:
        _NotRegular: not a regular file.  _Escaped: it now lies outside `root` (`root`
        itself moved).  OSError: from the system (ELOOP: a link swapped in).
    """
    parts = path.relative_to(root).parts
    if not parts:
        raise _NotRegular("a directory")
    dir_fd = os.open(root, _DIR_FLAGS)
    try:
        for name in parts[:-1]:
            if flags & os.O_CREAT:
                try:
                    os.mkdir(name, 0o777, dir_fd=dir_fd)
                except FileExistsError:
                    pass
            try:
                inner = os.open(name, _DIR_FLAGS, dir_fd=dir_fd)
            except NotADirectoryError:  # O_PATH | O_NOFOLLOW says this of a link
                if stat.S_ISLNK(os.stat(name, dir_fd=dir_fd, follow_symlinks=False).st_mode):
                    raise OSError(errno.ELOOP, os.strerror(errno.ELOOP), name) from None
                raise
            os.close(dir_fd)
            dir_fd = inner
        return _open_in(dir_fd, parts[-1], root, flags)
    finally:
        os.close(dir_fd)


def _open_in(dir_fd: int, name: str, root: Path, flags: int) -> int:
    try:
        before = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
    except FileNotFoundError:
        if not flags & os.O_CREAT:
            raise
    else:
        if not stat.S_ISREG(before.st_mode):
            raise _NotRegular(_kind(before.st_mode))
    # O_NONBLOCK: should a FIFO be swapped in after the lstat, opening it returns at once.
    fd = os.open(name, flags | os.O_NONBLOCK | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NOCTTY,
                 0o666, dir_fd=dir_fd)
    try:
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):
            raise _NotRegular(_kind(mode))
        try:  # Linux: where the fd really points, whatever happened to `root` meanwhile
            opened = Path(os.readlink(f"/proc/self/fd/{fd}"))
        except OSError:
            opened = None
        if opened is not None and opened != root and root not in opened.parents:
            raise _Escaped(str(opened))
    except BaseException:
        os.close(fd)
        raise
    return fd


def _read_file(path: Path, root: Path, limit: int) -> bytes:
    """At most `limit` bytes of the regular file `path`, read once, or refused.

    Raises:
        _Refusal, OSError: see `_open_regular`; _TooLarge over `limit`.
    """
    fd = _open_regular(path, root, os.O_RDONLY)
    try:
        size = os.fstat(fd).st_size
        if size > limit:
            raise _TooLarge(f"{path} is {size} bytes, over the {limit} bytes run serves")
        chunks, total = [], 0
        while chunk := os.read(fd, min(1 << 20, limit + 1 - total)):
            chunks.append(chunk)
            total += len(chunk)
            if total > limit:  # it grew while being read
                raise _TooLarge(f"{path} grew past the {limit} bytes run serves")
        return b"".join(chunks)
    finally:
        os.close(fd)


def _write_file(path: Path, root: Path, data: bytes) -> None:
    """Replace the content of the regular file `path` (created if missing).

    Raises:
        _Refusal, OSError: see `_open_regular`.
    """
    fd = _open_regular(path, root, os.O_WRONLY | os.O_CREAT)
    try:
        os.ftruncate(fd, 0)  # only now: a FIFO or device found by fstat is left untouched
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view):]
    finally:
        os.close(fd)


def _count(value: object) -> int | None:
    """A `line` or `limit` value: a non-negative integer, else absent (ACP deserialises
    invalid values to the default)."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        return None
    return value


def _skip_lines(data: bytes, start: int, n: int) -> int:
    """The offset just past the `n`th newline from `start` (len(data) if there are fewer).
    Newlines are counted a block at a time in C, so this is linear in what it passes."""
    pos = start
    while n > 0 and pos < len(data):
        block = min(pos + _WINDOW_SCAN, len(data))
        found = data.count(b"\n", pos, block)
        if found < n:
            n, pos = n - found, block
            continue
        for _ in range(n):
            pos = data.index(b"\n", pos, block) + 1
        return pos
    return pos if n == 0 else len(data)


def _lines(data: bytes, line: int | None, limit: int | None) -> bytes:
    """Lines `line` (1-based; 0 and absent mean 1) to `line + limit - 1`; lines end at
    newlines, which they keep."""
    start = _skip_lines(data, 0, max((line or 1) - 1, 0))
    if limit is None:
        return data[start:]
    return data[start:_skip_lines(data, start, limit)]
