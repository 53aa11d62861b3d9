"""Trace hooks: the router reports every message on every hop, in causal order.

`JsonlTraceSink` writes them as JSON lines (schema: docs/tracing.md). It is called from
routing tasks, so it never awaits: each event is encoded, redacted and appended to an
in-memory buffer that is written out when it passes 64 KiB, by a flusher task 50 ms after
it stopped being empty (so the last events before a hang reach the file), and on close (a
plain `write` to a regular file; measured in docs/tracing.md). A named pipe is written
without blocking: what its reader has not taken waits, bounded, and past that events are
dropped and counted (a `trace-dropped` event), never the conductor stopped.
"""

from __future__ import annotations

import logging
import os
import select
import stat
import time
from collections import OrderedDict
from contextlib import asynccontextmanager, contextmanager
from typing import TYPE_CHECKING, Any, Literal, Protocol, TypeVar

import anyio
import msgspec
from msgspec import UNSET, Raw

from conductor import acp
from conductor.record import Record
from conductor.tracing.redact import REDACTED, Redactor

if TYPE_CHECKING:
    from collections.abc import AsyncIterator, Awaitable, Callable, Iterator

    from conductor.jsonrpc.message import Message

log = logging.getLogger("acp_conductor.trace")

T = TypeVar("T")
Direction = Literal["in", "out"]  # in: component -> conductor; out: conductor -> component

TRACE_FORMAT_VERSION = 1


class TraceSink(Protocol):
    """Receives trace events. Must not block: called from routing tasks."""

    def message(self, hop: str, direction: Direction, message: Message | list[Message], *,
                peer: str | None = None, origin: tuple[str, Raw] | None = None) -> None:
        """A message crossed the hop between the conductor and `hop`.

        `peer` is the logical other end: for "in" the component it is addressed to, for
        "out" the one it comes from ("conductor" when the conductor itself speaks).
        `origin` (for forwarded requests) is the (hop, id) of the request this one forwards.
        """
        ...

    def lifecycle(self, component: str, event: str, **fields: object) -> None:
        """spawned / stderr / exited / error / ..."""
        ...


# -- the JSONL sink ---------------------------------------------------------------------------

class _Flow(Record):
    """One logical request as it crosses hops (same object on every hop it is seen on)."""

    number: int
    method: str
    session: str | None
    client_id: Any = None


def _key(ident: Raw | Any) -> Any:
    return bytes(ident) if isinstance(ident, Raw) else ident


class JsonlTraceSink:
    """Appends one JSON object per line to a file it creates (or truncates) 0600.

    Raises:
        ConfigError: the path is a symbolic link or cannot be written.
    """

    FLUSH_BYTES = 64 * 1024
    FLUSH_SECONDS = 0.05
    # Requests followed to their answers, per direction. A request the conductor answered
    # itself (timed out, its component gone) never sees its answer cross the hop it was
    # sent on: past this many, the oldest is forgotten (its late answer, if any, is traced
    # without its method and flow), so a long run keeps no more than this.
    MAX_OPEN_REQUESTS = 10_000
    MAX_UNCLAIMED = 256  # per hop: requests a component may still forward
    # A named pipe whose reader is behind: bytes held for it, then events are dropped
    MAX_BEHIND = 4 * 1024 * 1024
    EXIT_WAIT = 0.5  # at close, how long what is held may wait for the pipe's reader

    def __init__(self, path: str | os.PathLike[str], *, redactor: Redactor | None = None) -> None:
        from conductor.output import open_output

        self._fd = open_output(path, option="--trace")
        self._path = os.fsdecode(path)
        # A pipe (`jq . t.fifo`) is written without blocking: a slow reader must not stop
        # the routing tasks that trace. (The flag is this open's own: the reader has its.)
        self._pipe = stat.S_ISFIFO(os.fstat(self._fd).st_mode)
        if self._pipe:
            os.set_blocking(self._fd, False)
        self._dropped = 0  # events dropped since the reader was last caught up
        self._buffer = bytearray()
        self._last_flush = time.monotonic()
        self._blocked_at: float | None = None  # when a write last found the pipe full
        self._filled: anyio.Event | None = None  # set when the buffer stops being empty
        self._redact = redactor
        self._seq = 0
        self._flows = 0
        # requests the conductor sent on a hop; requests it received (oldest first)
        self._out: OrderedDict[tuple[str, Any], _Flow] = OrderedDict()
        self._in: OrderedDict[tuple[str, Any], _Flow] = OrderedDict()
        # given to a component, which has neither re-sent (forwarded) nor answered it yet
        self._unclaimed: dict[str, OrderedDict[int, _Flow]] = {}
        self._closed = False
        self._write({"type": "trace", "version": TRACE_FORMAT_VERSION, "time": time.time(),
                     "redacted": redactor is not None, "pid": os.getpid()})

    # -- TraceSink -----------------------------------------------------------------------------

    def message(self, hop: str, direction: Direction, message: Message | list[Message], *,
                peer: str | None = None, origin: tuple[str, Raw] | None = None) -> None:
        if self._closed:
            return
        items = message if isinstance(message, list) else [message]
        for item in items:
            self._message(hop, direction, item, peer, origin, batch=isinstance(message, list))

    def lifecycle(self, component: str, event: str, **fields: object) -> None:
        if self._closed:
            return
        self._write({"type": "lifecycle", "component": component, "event": event, **fields},
                    urgent=event in ("exited", "error"))

    # -- internals -----------------------------------------------------------------------------

    def _message(self, hop: str, direction: Direction, msg: Message, peer: str | None,
                 origin: tuple[str, Raw] | None, *, batch: bool) -> None:
        from conductor.jsonrpc.message import Notification, Request, Response, encode

        sender, receiver = (hop, peer or "conductor") if direction == "in" \
            else (peer or "conductor", hop)
        event: dict[str, Any] = {"type": "message", "hop": hop, "dir": direction,
                                 "from": sender, "to": receiver}
        flow: _Flow | None = None
        envelope: str | None = None
        if not isinstance(msg, Response):
            method = msg.method
            params = msg.params
            if method in acp.SUCCESSOR_METHODS:
                envelope = method
                try:
                    env = acp.decode_envelope(params)
                    method, params = env.method, env.params
                except ValueError:
                    pass
            session = acp.get_str(params, "sessionId")
            if isinstance(msg, Request):
                event["kind"] = "request"
                flow = self._request_flow(hop, direction, msg.id, method, session, origin)
            else:
                event["kind"] = "notification"
            event["method"] = method
            event["session"] = session
        else:
            event["kind"] = "error" if msg.error is not UNSET else "response"
            table = self._out if direction == "in" else self._in
            flow = table.pop((hop, _key(msg.id)), None)
            waiting = self._unclaimed.get(hop) if direction == "in" else None
            if flow is not None and waiting is not None:  # answered: it will not forward it
                waiting.pop(flow.number, None)  # (a later request of the same method, it does)
            event["method"] = flow.method if flow else None
            session = flow.session if flow else None
            if session is None and msg.result is not UNSET:
                session = acp.get_str(msg.result, "sessionId")
            event["session"] = session
        event["id"] = None if isinstance(msg, Notification) else Raw(bytes(msg.id))
        event["client_id"] = flow.client_id if flow else None
        event["flow"] = flow.number if flow else None
        if envelope is not None:
            event["envelope"] = envelope
        if batch:
            event["batch"] = True
        event["payload"] = Raw(encode(msg)[:-1])
        self._write(event)

    def _request_flow(self, hop: str, direction: Direction, ident: Raw, method: str,
                      session: str | None, origin: tuple[str, Raw] | None) -> _Flow:
        flow: _Flow | None = None
        if direction == "out":
            if origin is not None:
                flow = self._in.get((origin[0], _key(origin[1])))
            if flow is None:
                flow = self._new_flow(method, session)
            if hop == "client":  # the editor answers this id: that is the flow's editor-side id
                flow.client_id = Raw(bytes(ident))
            self._open(self._out, (hop, _key(ident)), flow)
            waiting = self._unclaimed.setdefault(hop, OrderedDict())
            waiting[flow.number] = flow
            if len(waiting) > self.MAX_UNCLAIMED:  # e.g. the agent's: it forwards nothing
                waiting.popitem(last=False)
        else:
            if hop == "client":
                flow = self._new_flow(method, session)
                flow.client_id = Raw(bytes(ident))
            else:
                flow = self._claim(hop, method, session)
            self._open(self._in, (hop, _key(ident)), flow)
        return flow

    def _open(self, table: OrderedDict[tuple[str, Any], _Flow], key: tuple[str, Any],
              flow: _Flow) -> None:
        table[key] = flow
        if len(table) > self.MAX_OPEN_REQUESTS:
            table.popitem(last=False)

    def _claim(self, hop: str, method: str, session: str | None) -> _Flow:
        """A component sent a request: most likely it forwards one we gave it (same method)."""
        waiting = self._unclaimed.get(hop)
        if waiting:
            for flow in waiting.values():
                same_method = flow.method == method or (
                    flow.method == acp.INITIALIZE and method == acp.INITIALIZE)
                if same_method and (session is None or flow.session in (None, session)):
                    del waiting[flow.number]
                    return flow
        return self._new_flow(method, session)

    def _new_flow(self, method: str, session: str | None) -> _Flow:
        self._flows += 1
        return _Flow(self._flows, method, session)

    def _write(self, event: dict[str, Any], *, urgent: bool = False) -> None:
        self._seq += 1
        event = {"seq": self._seq, "time": round(time.time(), 6), **event}
        line = msgspec.json.encode(event)
        if self._redact is not None:
            try:
                line = self._redact(line)
            except ValueError as e:  # unreadable, so unchecked: keep the event, not the payload
                event["payload"] = f"{REDACTED} ({e})"
                # ids are copied as sent (`1e400`, out of range): spelt as text they are
                # still shown, and the line decodes for the strings in it to be checked
                for key in ("id", "client_id"):
                    if isinstance(event.get(key), Raw):
                        event[key] = bytes(event[key]).decode("utf-8", "replace")
                line = self._redact(msgspec.json.encode(event))
        was_empty = not self._buffer
        now = time.monotonic()
        # A pipe found full is tried again once a FLUSH_SECONDS, not at every event (each
        # try costs a system call, and events come by the thousand a second).
        blocked = self._blocked_at is not None and now - self._blocked_at < self.FLUSH_SECONDS
        if self._pipe and len(self._buffer) >= self.MAX_BEHIND:
            if not blocked:
                self.flush()
            if len(self._buffer) >= self.MAX_BEHIND:
                self._drop()
                return
        self._buffer += line
        self._buffer += b"\n"
        if not blocked and (urgent or len(self._buffer) >= self.FLUSH_BYTES
                            or now - self._last_flush >= self.FLUSH_SECONDS):
            self.flush()
        elif was_empty and self._filled is not None:
            self._filled.set()  # no later event may come (a hang): the flusher writes it

    @asynccontextmanager
    async def open_flusher(self) -> AsyncIterator[None]:
        """While open, buffered events reach the file within FLUSH_SECONDS of being traced,
        whether or not another event follows."""
        filled = self._filled = anyio.Event()
        if self._buffer:
            filled.set()
        try:
            async with anyio.create_task_group() as tg:
                tg.start_soon(self._serve_flush, filled)
                yield
                tg.cancel_scope.cancel()
        finally:
            self._filled = None

    async def _serve_flush(self, filled: anyio.Event) -> None:
        while True:
            await filled.wait()
            await anyio.sleep(self.FLUSH_SECONDS)  # what follows in the window: one write
            filled = self._filled = anyio.Event()
            if not self._closed and self._buffer:
                self.flush()
            if not self._closed and self._buffer:  # a pipe's reader is behind: try again
                filled.set()

    def _drop(self) -> None:
        if not self._dropped:
            log.warning("the reader of the trace %s is behind: events are dropped until it "
                        "catches up (the trace says how many)", self._path)
        self._dropped += 1

    def _say_dropped(self) -> None:
        """The pipe's reader caught up: tell it how many events it missed (their `seq`s)."""
        self._seq += 1
        self._buffer += msgspec.json.encode(
            {"seq": self._seq, "time": round(time.time(), 6), "type": "lifecycle",
             "component": "conductor", "event": "trace-dropped", "count": self._dropped})
        self._buffer += b"\n"
        self._dropped = 0
        if self._filled is not None:
            self._filled.set()

    def flush(self) -> None:
        self._blocked_at = None
        try:
            while self._buffer:
                try:
                    written = os.write(self._fd, self._buffer)
                except BlockingIOError:  # a pipe whose reader is behind: the rest waits
                    self._blocked_at = time.monotonic()
                    break
                del self._buffer[:written]  # in place: the backlog is not copied each try
            if self._dropped and not self._buffer:
                self._say_dropped()
        except OSError as e:
            # Called from routing tasks: a full disk must not take the session down with
            # the trace. Say so once; a trace with holes in it would mislead.
            log.error("cannot write the trace %s: %s; tracing stopped (the chain goes on)",
                      self._path, e.strerror or e)
            self._closed = True
            os.close(self._fd)
            return
        self._last_flush = time.monotonic()

    def close(self) -> None:
        if self._closed:
            return
        self.flush()
        deadline = time.monotonic() + self.EXIT_WAIT
        if self._buffer and not self._closed:  # a pipe's reader: a last, bounded wait
            poller = select.poll()  # (not select(): it refuses descriptors above 1023)
            poller.register(self._fd, select.POLLOUT)
            while self._buffer and not self._closed:
                left = deadline - time.monotonic()
                if left <= 0:
                    log.warning("the reader of the trace %s is behind: its last %d bytes "
                                "are not written", self._path, len(self._buffer))
                    break
                poller.poll(left * 1000)
                self.flush()
        if self._closed:  # the flush failed, and closed it
            return
        self._closed = True
        os.close(self._fd)

    def __enter__(self) -> JsonlTraceSink:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class FanoutTraceSink:
    """Several sinks as one (e.g. `check`'s recorder plus `--trace FILE`)."""

    def __init__(self, *sinks: TraceSink) -> None:
        self.sinks = [s for s in sinks if s is not None]

    def message(self, hop: str, direction: Direction, message: Message | list[Message], *,
                peer: str | None = None, origin: tuple[str, Raw] | None = None) -> None:
        for sink in self.sinks:
            sink.message(hop, direction, message, peer=peer, origin=origin)

    def lifecycle(self, component: str, event: str, **fields: object) -> None:
        for sink in self.sinks:
            sink.lifecycle(component, event, **fields)


async def run_flushed(sink: JsonlTraceSink | None, func: Callable[..., Awaitable[T]],
                      *args: object) -> T:
    """`await func(*args)` with `sink`'s flusher running (for `anyio.run`)."""
    if sink is None:
        return await func(*args)
    async with sink.open_flusher():
        return await func(*args)


def refuse_replacing(path: str, *, option: str = "--trace") -> None:
    """A trace file is written from its start: refuse a file that is there and is not a
    trace (`--trace agent.py`, a typo for a script next to it, would destroy it).

    Raises:
        ConfigError: `path` is a non-empty regular file whose first line is no trace's.
    """
    from conductor.errors import ConfigError

    try:
        st = os.stat(path, follow_symlinks=False)
    except OSError:
        return  # not there (or a link, refused when it is opened)
    if not stat.S_ISREG(st.st_mode) or st.st_size == 0:
        return
    try:
        with open(path, "rb") as f:
            first = msgspec.json.decode(f.readline(64 * 1024))
    except (OSError, msgspec.DecodeError):
        first = None
    if isinstance(first, dict) and first.get("type") == "trace":
        return  # an earlier trace: replaced, as asked
    raise ConfigError(f"{path} is there and is not a trace; writing the trace there would "
                      "destroy it", field=option,
                      hint="give a new file name (or remove that file first)")


@contextmanager
def open_trace_sink(path: str | None,
                    redactor: Redactor | None) -> Iterator[JsonlTraceSink | None]:
    """The `--trace FILE` sink for a run (None without a path), hiding what `redactor`
    finds (None: nothing); flushed and closed on exit."""
    if path is None:
        yield None
        return
    sink = JsonlTraceSink(path, redactor=redactor)
    try:
        yield sink
    finally:
        sink.close()
