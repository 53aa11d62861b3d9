"""`acp-conductor run`: the conductor as its own editor, for terminals and CI.

The chain runs in-process (`serve_chain` over in-memory byte pipes, the same code path
an editor gets; components are real subprocesses). `HeadlessEditor` answers the agent's
client-side requests by policy; `run_headless` drives one turn and maps its outcome to an
exit code (`RunExit`, documented in the README and docs/run.md).
"""

from __future__ import annotations

import errno
import logging
import os
import secrets
import signal
import stat
import subprocess
import time
from dataclasses import dataclass, field
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn, Protocol

import anyio
import msgspec

from conductor.editor.client import EditorHandler, open_client_connection
from conductor.errors import (
    ConductorError,
    ConfigError,
    ConnectionClosedError,
    ExplainedCode,
    RpcError,
)
from conductor.jsonrpc.codes import ErrorCode
from conductor.jsonrpc.framing import DEFAULT_MAX_FRAME_BYTES
from conductor.serve import RunOptions, serve_chain
from conductor.supervise.component import TOKEN_PREFIX, sweep_strays
from conductor.transport.memory import memory_pipe

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable

    from anyio.abc import Process

    from conductor.config import ChainConfig
    from conductor.jsonrpc.message import JsonValue
    from conductor.tracing.sink import TraceSink

log = logging.getLogger("acp_conductor.run")

REFUSED = ErrorCode.POLICY_DENIED  # run's sandbox refused a client request (docs/errors.md)
NOT_FOUND = -32002  # ACP's resource-not-found
MAX_READ_BYTES = 64 * 1024 * 1024  # the largest file fs/read_text_file serves (docs/run.md)
# Pseudo filesystems: files that block, never end, or change each read; and devices whose
# very opening does something (a tape rewinds, a watchdog arms).
NOT_FILES = ("/proc", "/sys", "/dev")
_WINDOW_SCAN = 64 * 1024  # newlines are counted this many bytes at a time
TERMINAL_STRAY_GRACE = 1.0  # how long a terminal's strays get between SIGTERM and SIGKILL


class RunExit(ExplainedCode):
    """Exit codes of `run`: the one definition behind `run --help`, the README and
    docs/run.md."""

    END_TURN = 0, "the turn ended with `end_turn`"
    FAILED = 1, ("the agent (or a plugin proxy) answered the prompt with an error, or an "
                 "unknown stop reason")
    CONFIG = 2, ("bad chain file, proxy (unknown `use`, bad `options`) or usage (no or empty "
                 "prompt, `--approve ask` off a terminal); `--session-id` but the agent cannot "
                 "reopen sessions. No `result` line")
    COMPONENT = 3, ("a component failed to start or exited (the message names it, with its "
                    "stderr tail)")
    REFUSAL = 5, "the agent refused (`stopReason: refusal`)"
    LIMIT = 6, "the agent hit a limit (`max_tokens`, `max_turn_requests`)"
    CANCELLED = 7, "the agent cancelled the turn (`stopReason: cancelled`)"
    POLICY = 8, ("policy violation: `--approve fail` was hit, or `run` itself refused a "
                 "file/terminal request (its `--cwd` sandbox, `--allow-write`, "
                 "`--allow-terminal`). Requests a proxy in the chain refuses never reach `run` "
                 "and do not count")
    TIMEOUT = 124, ("`--timeout` passed: the turn was cancelled with `session/cancel`, or "
                    "`run` gave up waiting for setup")
    INTERRUPTED = 130, ("Ctrl-C: the turn was cancelled, or `run` gave up waiting for setup; a "
                        "second Ctrl-C stops at once")
    TERMINATED = 143, ("SIGTERM: as Ctrl-C (the turn is cancelled, the result line written); "
                       "a second signal stops at once")


STOP_REASON_EXIT = {"end_turn": RunExit.END_TURN, "refusal": RunExit.REFUSAL,
                    "max_tokens": RunExit.LIMIT, "max_turn_requests": RunExit.LIMIT,
                    "cancelled": RunExit.CANCELLED}

APPROVE_CHOICES = ("all", "reads", "none", "fail", "ask")
READ_KINDS = frozenset({"read", "search", "think"})


class RunEvents(Protocol):
    """What a renderer (rich, plain, JSON lines) is told about the turn."""

    def session(self, record: dict[str, Any]) -> None: ...
    def update(self, session_id: str | None, update: dict[str, Any]) -> None: ...
    def decision(self, record: dict[str, Any]) -> None: ...
    def notice(self, text: str) -> None: ...
    def result(self, record: dict[str, Any]) -> None: ...
    async def ask_permission(self, tool_call: dict[str, Any],
                             options: list[dict[str, Any]]) -> str | None: ...


@dataclass
class HeadlessOptions:
    prompt: str
    cwd: Path
    session_id: str | None = None
    approve: str = "none"
    allow_write: bool = False
    allow_terminal: bool = False
    timeout: float | None = None
    cancel_grace: float = 10.0
    tracer: TraceSink | None = None
    max_frame_bytes: int | None = None
    handle_signals: bool = True


def _package_version() -> str:
    try:
        return version("acp-conductor")
    except PackageNotFoundError:
        return "0"


# -- the editor's side ---------------------------------------------------------------------

@dataclass
class _Terminal:
    process: Process
    limit: int | None
    token: str  # in its environment: finds what left its process group (setsid, daemons)
    output: bytearray = field(default_factory=bytearray)
    truncated: bool = False
    done: anyio.Event = field(default_factory=anyio.Event)

    def add(self, chunk: bytes) -> None:
        self.output += chunk
        if self.limit is not None and len(self.output) > self.limit:
            # Keep the end (the spec truncates from the beginning), at a character boundary.
            cut = len(self.output) - self.limit
            while cut < len(self.output) and (self.output[cut] & 0xC0) == 0x80:
                cut += 1
            del self.output[:cut]
            self.truncated = True

    def status(self) -> dict[str, Any] | None:
        code = self.process.returncode
        if code is None or not self.done.is_set():
            return None
        if code < 0:
            return {"exitCode": None, "signal": signal.Signals(-code).name}
        return {"exitCode": code, "signal": None}


class HeadlessEditor(EditorHandler):
    """Answers the agent's requests by the run's policy; reports every decision."""

    def __init__(self, options: HeadlessOptions, events: RunEvents,
                 on_policy_failure: Callable[[], None], spawn: Callable[..., Awaitable[None]]):
        self.options = options
        self.events = events
        self.root = Path(os.path.realpath(options.cwd))
        self.violations: list[dict[str, Any]] = []
        self.cancelling = False
        self._on_policy_failure = on_policy_failure
        self._spawn = spawn  # starts a task in the run's task group (terminal readers)
        self._asking: set[anyio.CancelScope] = set()
        self._terminals: dict[str, _Terminal] = {}
        self.last_usage: dict[str, Any] | None = None
        self.frame_limit = options.max_frame_bytes or DEFAULT_MAX_FRAME_BYTES

    # dispatch ------------------------------------------------------------------------------

    async def handle_notification(self, method: str, params: JsonValue) -> None:
        if method == "session/update" and isinstance(params, dict):
            update = params.get("update")
            if isinstance(update, dict):
                if update.get("sessionUpdate") == "usage_update":
                    self.last_usage = update
                self.events.update(params.get("sessionId"), update)

    async def handle_request(self, method: str, params: JsonValue) -> JsonValue:
        p = params if isinstance(params, dict) else {}
        if method == "session/request_permission":
            return await self._permission(p)
        if method == "fs/read_text_file":
            return await self._read(p)
        if method == "fs/write_text_file":
            return await self._write(p)
        if method.startswith("terminal/"):
            return await self._terminal(method, p)
        return await super().handle_request(method, params)

    def cancel_pending(self) -> None:
        """The turn is being cancelled: open questions get the `cancelled` outcome (ACP rule)."""
        self.cancelling = True
        for scope in list(self._asking):
            scope.cancel()

    # permissions ---------------------------------------------------------------------------

    async def _permission(self, p: dict[str, Any]) -> JsonValue:
        tool = p.get("toolCall") if isinstance(p.get("toolCall"), dict) else {}
        options = [o for o in p.get("options") or [] if isinstance(o, dict)]
        policy = self.options.approve
        chosen: str | None = None
        if not self.cancelling:
            if policy == "all":
                chosen = _pick(options, ("allow_once", "allow_always"))
            elif policy == "reads":
                chosen = _pick(options,
                               ("allow_once", "allow_always") if tool.get("kind") in READ_KINDS
                               else ("reject_once", "reject_always"))
            elif policy == "none":
                chosen = _pick(options, ("reject_once", "reject_always"))
            elif policy == "ask":
                scope = anyio.CancelScope()
                self._asking.add(scope)
                try:
                    with scope:
                        chosen = await self.events.ask_permission(tool, options)
                finally:
                    self._asking.discard(scope)
            elif policy == "fail":
                self._violation("permission", "--approve fail: the agent asked for permission",
                                tool=tool)
                self._on_policy_failure()
        kind = next((o.get("kind") for o in options if o.get("optionId") == chosen), None)
        self.events.decision({"type": "permission", "sessionId": p.get("sessionId"),
                              "toolCall": tool, "policy": policy,
                              "outcome": "selected" if chosen is not None else "cancelled",
                              "optionId": chosen, "optionKind": kind})
        if chosen is None:
            return {"outcome": {"outcome": "cancelled"}}
        return {"outcome": {"outcome": "selected", "optionId": chosen}}

    # file system ---------------------------------------------------------------------------

    def _inside(self, op: str, raw_path: object, *, file: bool = True) -> Path:
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
        path = Path(raw_path)
        resolved = Path(os.path.realpath(path))
        if resolved != self.root and self.root not in resolved.parents:
            self._refuse(op, str(path), f"{path} is outside the run's --cwd {self.root}")
        if file and any(resolved == Path(top) or Path(top) in resolved.parents
                        for top in NOT_FILES):
            self._refuse(op, str(path), f"{path} is not a regular file (it is under "
                                        f"/{resolved.parts[1]})")
        return resolved

    def _invalid(self, op: str, target: str, reason: str) -> NoReturn:
        """A malformed request: shown as refused, but not a policy violation."""
        self.events.decision({"type": "access", "op": op, "target": target, "allowed": False,
                              "reason": reason})
        raise RpcError(ErrorCode.INVALID_PARAMS, f"invalid params: {reason}",
                       {"op": op, "target": target})

    def _refuse(self, op: str, target: str, reason: str) -> NoReturn:
        self._violation(op, reason, path=target)
        self.events.decision({"type": "access", "op": op, "target": target, "allowed": False,
                              "reason": reason})
        raise RpcError(REFUSED, f"refused by acp-conductor run: {reason}",
                       {"op": op, "target": target})

    def _violation(self, op: str, reason: str, **extra: Any) -> None:
        self.violations.append({"op": op, "reason": reason, **extra})

    def _open_failed(self, op: str, path: Path, error: Exception) -> NoReturn:
        if isinstance(error, _NotRegular):
            self._refuse(op, str(path), f"{path} is {error.kind}, not a regular file")
        if isinstance(error, _Escaped):
            self._refuse(op, str(path), f"{path} changed while being opened and now leads "
                                        f"outside the run's --cwd {self.root}")
        if isinstance(error, _TooLarge):
            self._refuse(op, str(path), error.reason)
        if isinstance(error, FileNotFoundError):
            raise RpcError(NOT_FOUND, f"file not found: {path}", {"path": str(path)}) from None
        if isinstance(error, OSError) and error.errno == errno.ELOOP:  # O_NOFOLLOW hit a link
            self._refuse(op, str(path), f"{path} became a symlink while being opened")
        reason = error.strerror if isinstance(error, OSError) else str(error)
        raise RpcError(ErrorCode.INTERNAL_ERROR, f"cannot {op} {path}: {reason}") from None

    async def _read(self, p: dict[str, Any]) -> JsonValue:
        path = self._inside("read", p.get("path"))
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
            self._refuse("read", str(path), f"{path} would be {encoded} bytes as JSON, over "
                                            f"the frame limit of {self.frame_limit} bytes")
        self.events.decision({"type": "access", "op": "read", "target": str(path),
                              "allowed": True})
        return {"content": text}

    async def _write(self, p: dict[str, Any]) -> JsonValue:
        target = p.get("path")
        if not self.options.allow_write:
            self._refuse("write", str(target), "writing files needs --allow-write")
        path = self._inside("write", target)
        content = p.get("content")
        if not isinstance(content, str):
            raise RpcError(ErrorCode.INVALID_PARAMS, "Invalid params", "content must be a string")
        data = content.encode("utf-8", "replace")  # a lone surrogate from a \ud800 escape
        try:
            await anyio.Path(path.parent).mkdir(parents=True, exist_ok=True)
            await anyio.to_thread.run_sync(_write_file, path, self.root, data,
                                           abandon_on_cancel=True)
        except (OSError, _Refusal) as e:
            self._open_failed("write", path, e)
        self.events.decision({"type": "access", "op": "write", "target": str(path),
                              "allowed": True})
        return {}

    # terminals -----------------------------------------------------------------------------

    async def _terminal(self, method: str, p: dict[str, Any]) -> JsonValue:
        if not self.options.allow_terminal:
            command = " ".join([str(p.get("command", "")), *map(str, p.get("args") or [])])
            self._refuse("terminal", command.strip() or method,
                         "running commands needs --allow-terminal")
        if method == "terminal/create":
            return await self._create_terminal(p)
        term = self._terminals.get(str(p.get("terminalId")))
        if term is None:
            raise RpcError(NOT_FOUND, f"unknown terminal {p.get('terminalId')!r}")
        if method == "terminal/output":
            return {"output": term.output.decode("utf-8", "replace"),
                    "truncated": term.truncated, "exitStatus": term.status()}
        if method == "terminal/wait_for_exit":
            await term.done.wait()
            return term.status() or {"exitCode": None, "signal": None}
        if method in ("terminal/kill", "terminal/release"):
            if method == "terminal/release":
                self._terminals.pop(str(p.get("terminalId")), None)
            await _stop_terminal(term)
            return {}
        raise RpcError(ErrorCode.METHOD_NOT_FOUND, "Method not found", {"method": method})

    async def _create_terminal(self, p: dict[str, Any]) -> JsonValue:
        command = p.get("command")
        if not isinstance(command, str) or not command:
            raise RpcError(ErrorCode.INVALID_PARAMS, "Invalid params", "command must be a string")
        cwd = self._inside("terminal", p.get("cwd") or str(self.root), file=False)
        env = dict(os.environ)
        for item in p.get("env") or []:
            if isinstance(item, dict) and isinstance(item.get("name"), str):
                env[item["name"]] = str(item.get("value", ""))
        token = secrets.token_hex(8)
        env[f"{TOKEN_PREFIX}{token}"] = "1"  # after the agent's env: it cannot drop it
        argv = [command, *map(str, p.get("args") or [])]
        try:
            process = await anyio.open_process(argv, cwd=cwd, env=env, stdin=subprocess.DEVNULL,
                                               stderr=subprocess.STDOUT, start_new_session=True)
        except OSError as e:
            raise RpcError(ErrorCode.INTERNAL_ERROR,
                           f"cannot start {command}: {e.strerror}") from None
        limit = p.get("outputByteLimit")
        term = _Terminal(process, limit if isinstance(limit, int) else None, token)
        ident = f"term-{len(self._terminals) + 1}-{process.pid}"
        self._terminals[ident] = term
        self.events.decision({"type": "access", "op": "terminal", "target": " ".join(argv),
                              "allowed": True, "terminalId": ident})

        async def pump() -> None:
            assert process.stdout is not None
            try:
                async for chunk in process.stdout:
                    term.add(chunk)
            except (anyio.BrokenResourceError, anyio.ClosedResourceError):
                pass
            await process.wait()
            term.done.set()

        await self._spawn(pump)
        return {"terminalId": ident}

    async def aclose(self) -> None:
        """Kill what the agent left running (released terminals were stopped already)."""
        terminals = list(self._terminals.values())
        self._terminals.clear()
        for term in terminals:
            await _stop_terminal(term)


async def _stop_terminal(term: _Terminal) -> None:
    """SIGKILL the terminal's process group, then TERM and KILL whatever still carries its
    token (descendants that left the group). Bounded; harmless when all are gone."""
    with anyio.CancelScope(shield=True):
        try:
            os.killpg(term.process.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        await sweep_strays(term.token, TERMINAL_STRAY_GRACE)
        with anyio.move_on_after(2):
            await term.process.wait()


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


def _open_regular(path: Path, root: Path, flags: int) -> int:
    """An fd on the regular file `path`, checked after opening. Nothing that is not a
    regular file is opened at all (a FIFO would block; opening some devices acts).

    Raises:
        _NotRegular: not a regular file.  _Escaped: it now lies outside `root` (a link
        swapped in after the path was checked).  OSError: from the system.
    """
    try:
        before = os.lstat(path)
    except FileNotFoundError:
        if not flags & os.O_CREAT:
            raise
    else:
        if not stat.S_ISREG(before.st_mode):
            raise _NotRegular(_kind(before.st_mode))
    # O_NONBLOCK: should a FIFO be swapped in after the lstat, opening it returns at once.
    fd = os.open(path, flags | os.O_NONBLOCK | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NOCTTY,
                 0o666)
    try:
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):
            raise _NotRegular(_kind(mode))
        try:  # Linux: where the fd really points, whatever happened to the path's parents
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


def _pick(options: list[dict[str, Any]], kinds: tuple[str, ...]) -> str | None:
    for kind in kinds:
        for option in options:
            if option.get("kind") == kind and isinstance(option.get("optionId"), str):
                return option["optionId"]
    return None


# -- one turn ------------------------------------------------------------------------------

@dataclass
class _Turn:
    trigger: str | None = None     # "timeout" | "interrupt" | "terminate" | "policy"
    result: dict[str, Any] | None = None
    error: RpcError | None = None
    closed: bool = False
    usage_error: ConfigError | None = None
    step: str = "initialize"       # the request the run is waiting on
    prompted: bool = False         # session/prompt was sent: a cancel has a turn to end
    forced: anyio.Event = field(default_factory=anyio.Event)  # a second Ctrl-C: stop now
    stop: anyio.Event = field(default_factory=anyio.Event)
    done: anyio.Event = field(default_factory=anyio.Event)
    scope: anyio.CancelScope = field(default_factory=anyio.CancelScope)

    def interrupt(self, why: str) -> None:
        if self.trigger is None and not self.done.is_set():
            self.trigger = why
        self.stop.set()

    def force(self) -> None:
        self.interrupt("interrupt")
        self.forced.set()
        self.scope.cancel()


async def run_headless(config: ChainConfig, options: HeadlessOptions, events: RunEvents) -> int:
    """Run one prompt turn through the chain; returns a `RunExit` code.

    Raises:
        ConfigError: the chain cannot be planned, or the agent cannot load --session-id.
    """
    started = time.monotonic()
    to_conductor, conductor_in = memory_pipe()
    conductor_out, from_conductor = memory_pipe()
    conductor_code: int | None = None
    conductor_error: ConductorError | None = None
    conductor_done = anyio.Event()
    turn = _Turn()
    record: dict[str, Any] = {"type": "result"}

    async with anyio.create_task_group() as tg:

        async def conductor() -> None:
            nonlocal conductor_code, conductor_error
            try:
                conductor_code = await serve_chain(
                    config, conductor_in, conductor_out,
                    RunOptions(mode="agent", max_frame_bytes=options.max_frame_bytes,
                               tracer=options.tracer, handle_signals=False))
            except ConductorError as e:
                conductor_error = e
                await conductor_out.aclose()  # the client sees EOF instead of waiting forever
            finally:
                conductor_done.set()

        async def spawn(func: Callable[[], Awaitable[None]]) -> None:
            tg.start_soon(func)

        def policy_failure() -> None:
            turn.interrupt("policy")

        editor = HeadlessEditor(options, events, policy_failure, spawn)
        tg.start_soon(conductor)
        if options.handle_signals:
            tg.start_soon(_watch_signals, turn, events)
        try:
            with turn.scope:  # a second Ctrl-C cancels it
                async with open_client_connection(from_conductor, to_conductor, editor) as conn:
                    await _converse(conn, editor, options, events, turn, record)
        except* ConnectionClosedError:  # arrives wrapped by the connection's task group
            turn.closed = True
        finally:
            with anyio.CancelScope(shield=True):
                await editor.aclose()
                with anyio.move_on_after(config.conductor.shutdown_grace + 10):
                    await _first(conductor_done, turn.forced)
        # Forced: cancelling serve_chain still stops each component (shielded cleanup).
        tg.cancel_scope.cancel()

    if conductor_error is not None:
        raise conductor_error
    if turn.usage_error is not None:
        raise turn.usage_error
    code = _exit_code(turn, editor, conductor_code)
    if turn.error is not None:
        record["error"] = turn.error.to_json()
    record.update(stopReason=(turn.result or {}).get("stopReason"),
                  usage=(turn.result or {}).get("usage") or _usage_of(editor.last_usage),
                  exitCode=int(code), exitReason=code.name.lower(), cancelledBy=turn.trigger,
                  violations=editor.violations,
                  durationMs=round((time.monotonic() - started) * 1000, 1))
    events.result(record)
    return int(code)


async def _first(*events: anyio.Event) -> None:
    """Wait until any of `events` is set."""
    async with anyio.create_task_group() as tg:
        async def wait(event: anyio.Event) -> None:
            await event.wait()
            tg.cancel_scope.cancel()
        for event in events:
            tg.start_soon(wait, event)


def _usage_of(update: dict[str, Any] | None) -> dict[str, Any] | None:
    if update is None:
        return None
    return {k: v for k, v in update.items() if k in ("used", "size", "cost")}


async def _watch_signals(turn: _Turn, events: RunEvents) -> None:
    """Ctrl-C and SIGTERM cancel the turn and stop the chain gracefully; a second one of
    either stops now. Either way the result line is written and nothing is left running."""
    with anyio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
        count = 0
        async for signum in signals:
            count += 1
            name = "interrupted" if signum == signal.SIGINT else "terminated"
            if count == 1:
                doing = "cancelling the turn" if turn.prompted else "giving up"
                again = "Ctrl-C" if signum == signal.SIGINT else "SIGTERM"
                events.notice(f"{name}: {doing} ({again} again to stop now)")
                turn.interrupt("interrupt" if signum == signal.SIGINT else "terminate")
            else:
                # Not KeyboardInterrupt: that would skip the result line and print a traceback.
                events.notice(f"{name} again: stopping now")
                turn.force()
                return


async def _converse(conn: Any, editor: HeadlessEditor, options: HeadlessOptions,
                    events: RunEvents, turn: _Turn, record: dict[str, Any]) -> None:
    """The whole conversation (setup included) under --timeout and Ctrl-C."""
    sid: list[str] = []  # set once the session is open; session/cancel needs it

    async with anyio.create_task_group() as tg:
        async def talk() -> None:
            try:
                await _talk(conn, editor, options, events, turn, record, sid)
            except RpcError as e:
                turn.error = e
            except ConnectionClosedError:
                turn.closed = True
            finally:
                turn.done.set()
                turn.stop.set()

        tg.start_soon(talk)
        with anyio.move_on_after(options.timeout if options.timeout else float("inf")):
            await turn.stop.wait()
        if not turn.stop.is_set():
            turn.interrupt("timeout")
            if turn.prompted:
                events.notice(f"timeout after {options.timeout:g}s: cancelling the turn")
        if turn.done.is_set():
            return
        if not turn.prompted:
            # No turn to cancel yet: the agent is stuck answering a setup request.
            why = f"timeout after {options.timeout:g}s" if turn.trigger == "timeout" \
                else "terminated" if turn.trigger == "terminate" else "interrupted"
            events.notice(f"{why}: the agent never answered {turn.step}; giving up")
            tg.cancel_scope.cancel()
            return
        editor.cancel_pending()
        await conn.notify("session/cancel", {"sessionId": sid[0]})
        with anyio.move_on_after(options.cancel_grace):
            await turn.done.wait()
        if not turn.done.is_set():
            events.notice(f"the agent did not answer the cancel within "
                          f"{options.cancel_grace:g}s; giving up on the turn")
            tg.cancel_scope.cancel()


async def _talk(conn: Any, editor: HeadlessEditor, options: HeadlessOptions,
                events: RunEvents, turn: _Turn, record: dict[str, Any], sid_out: list[str]) -> None:
    turn.step = "initialize"
    init = await conn.request("initialize", {
        "protocolVersion": 1,
        "clientCapabilities": {"fs": {"readTextFile": True,
                                      "writeTextFile": options.allow_write},
                               "terminal": options.allow_terminal},
        "clientInfo": {"name": "acp-conductor-run", "title": "acp-conductor run",
                       "version": _package_version()}})
    caps = (init or {}).get("agentCapabilities") or {}
    cwd = str(editor.root)

    def announce(sid: str, how: str) -> None:
        record["sessionId"] = sid
        events.session({"type": "session", "sessionId": sid, "how": how,
                        "protocolVersion": (init or {}).get("protocolVersion"),
                        "agentInfo": (init or {}).get("agentInfo"), "cwd": cwd})
    if options.session_id is None:
        turn.step = "session/new"
        opened = await conn.request("session/new", {"cwd": cwd, "mcpServers": []})
        sid, how = (opened or {}).get("sessionId"), "new"
    else:
        sid = options.session_id
        if caps.get("loadSession"):
            how = "load"
        elif isinstance(caps.get("sessionCapabilities"), dict) and \
                caps["sessionCapabilities"].get("resume") is not None:
            how = "resume"
        else:
            turn.usage_error = ConfigError(
                f"the agent cannot reopen session {sid!r}: it advertises neither "
                "loadSession nor sessionCapabilities.resume", field="--session-id",
                hint="drop --session-id")
            return
        # Announced before the request: the replayed history arrives before its answer.
        announce(sid, how)
        turn.step = f"session/{how}"
        await conn.request(f"session/{how}", {"sessionId": sid, "cwd": cwd,
                                             "mcpServers": []})
    if how == "new":
        announce(sid, how)
    sid_out.append(sid)
    turn.step = "session/prompt"
    turn.prompted = True
    turn.result = await conn.request("session/prompt", {
        "sessionId": sid, "prompt": [{"type": "text", "text": options.prompt}]})


def _exit_code(turn: _Turn, editor: HeadlessEditor, conductor_code: int | None) -> RunExit:
    error = turn.error
    component_failed = conductor_code == RunExit.COMPONENT or (
        error is not None and error.code == ErrorCode.INTERNAL_ERROR
        and isinstance(error.data, dict) and "component" in error.data)
    if component_failed or (turn.closed and turn.result is None):
        return RunExit.COMPONENT
    if turn.trigger == "policy" or editor.violations:
        return RunExit.POLICY
    if turn.trigger == "timeout":
        return RunExit.TIMEOUT
    if turn.trigger == "interrupt":
        return RunExit.INTERRUPTED
    if turn.trigger == "terminate":
        return RunExit.TERMINATED
    if turn.error is not None or turn.result is None:
        return RunExit.FAILED
    return STOP_REASON_EXIT.get(str(turn.result.get("stopReason")), RunExit.FAILED)

