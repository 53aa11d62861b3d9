"""Messages over byte pipes: frames in, encoded messages out.

Write coalescing: while `serve_frames` routes the frames of one read, every PipeSink that
is sent to only appends the encoded message to its buffer; the reader flushes those sinks,
in the order they were first written, when the read's frames are done. A burst of small
messages then costs one write() per pipe instead of one per message, and a single request
still goes out as soon as its frame has been routed. Before anything could block (a buffer
over HIGH_WATER), every deferred sink is flushed first, so no message waits behind a
blocked pipe that it would have preceded without coalescing.

The deferral list lives in a ContextVar, so tasks started while a read is being routed
(components spawned at the first initialize) inherit it. It is only `active` while its
reader is routing a read, and that reader flushes it when the read is done, so a send from
such a task is at most deferred to the end of that read; otherwise it is written at once.
"""

from __future__ import annotations

from collections import deque
from contextvars import ContextVar
from typing import TYPE_CHECKING, Any, cast

import anyio
import msgspec
from msgspec import UNSET, Raw, UnsetType

from conductor.jsonrpc.framing import DEFAULT_MAX_FRAME_BYTES, FrameDecoder, OversizedFrame
from conductor.jsonrpc.message import (
    Message,
    ParseError,
    Response,
    UnreadableFrame,
    decode,
    encode_batch,
    encode_into,
)
from conductor.transport.base import NotJson, Oversized, Unreadable

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable

    from anyio.abc import ByteReceiveStream, ByteSendStream

    from conductor.transport.base import Handle, HandleNowait, Incoming

READ_CHUNK = 1 << 20
HIGH_WATER = 256 * 1024  # deferred bytes per sink before it is written without waiting
LARGE_PAYLOAD = 1 << 20  # payloads from this size are written from their own memory

_GONE = (OSError, anyio.BrokenResourceError, anyio.ClosedResourceError)


class _Deferral:
    """The sinks a reader deferred writes to while routing one read."""

    __slots__ = ("active", "sinks")

    def __init__(self) -> None:
        self.active = False
        self.sinks: list[PipeSink] = []


_deferred: ContextVar[_Deferral | None] = ContextVar("deferred_sinks", default=None)


class PipeSink:
    """A MessageSink that encodes onto a byte stream (a child's stdin, our stdout)."""

    __slots__ = ("_broken", "_buffer", "_closed", "_on_broken", "_stream", "_wait", "_write",
                 "_writing")

    def __init__(self, stream: ByteSendStream, *,
                 on_broken: Callable[[], None] | None = None) -> None:
        self._stream = stream
        self._closed = False
        self._buffer = bytearray()
        self._broken: BaseException | None = None
        # Told once when the peer stops reading: deferred writes swallow the error, and a
        # peer that closed its input yet runs on never shows EOF to its reader.
        self._on_broken = on_broken
        self._writing = anyio.Lock(fast_acquire=True)  # one write() in flight per pipe
        # A stream may offer `write_nowait(data) -> int` (write what fits now) and
        # `wait_writable()` (FdSendStream). Then a flush that finds the pipe with room costs
        # one write() and no lock, and a cancelled write never cuts a frame.
        self._write: Callable[[bytes | bytearray | memoryview], int] | None = \
            getattr(stream, "write_nowait", None)
        self._wait: Callable[[], Awaitable[None]] | None = getattr(stream, "wait_writable", None)

    async def send(self, item: Message | list[Message]) -> None:
        if self._broken is not None:
            raise anyio.BrokenResourceError from self._broken
        if isinstance(item, list):
            self._buffer += encode_batch(item)
        else:
            large = _large_payload(item)
            if large is not None:
                await self._send_large(item, *large)
                return
            encode_into(item, self._buffer)
        deferred = _deferred.get()
        if deferred is None or not deferred.active:
            await self.flush()
            return
        if self not in deferred.sinks:
            deferred.sinks.append(self)
        if len(self._buffer) >= HIGH_WATER:
            await flush_deferred()

    def send_nowait(self, item: Message) -> bool:
        """Queue `item` without waiting: only while a reader is routing a read (its writes
        are deferred anyway), below the high-water mark and without a large payload. False
        when it would have to wait: call `send`."""
        if self._broken is not None or len(self._buffer) >= HIGH_WATER:
            return False
        deferred = _deferred.get()
        if deferred is None or not deferred.active or _large_payload(item) is not None:
            return False
        encode_into(item, self._buffer)
        if self not in deferred.sinks:
            deferred.sinks.append(self)
        return True

    async def _send_large(self, message: Message, field: str, payload: Raw) -> None:
        """Write a message with a large payload without copying the payload: the envelope
        is encoded, then the payload's own bytes follow (peak memory: one copy, not two)."""
        head = bytearray()
        encode_into(msgspec.structs.replace(message, **{field: UNSET}), head)
        del head[-2:]  # the closing brace and newline: the payload field comes last
        head += b',"' + field.encode() + b'":'
        deferred = _deferred.get()
        if deferred is not None and deferred.active:
            await flush_deferred()  # what was routed before this message goes out first
        async with self._writing:
            pending, self._buffer = self._buffer, bytearray()
            try:
                await self._write_all([pending + head, memoryview(payload), b"}\n"])
            except _GONE as e:
                self._break(e)
                raise anyio.BrokenResourceError from e

    async def flush(self) -> None:
        """Write whatever is buffered. Raises anyio.BrokenResourceError when the peer is gone."""
        if self._write_nowait():
            return
        async with self._writing:
            if not self._buffer:
                return
            data, self._buffer = self._buffer, bytearray()
            try:
                await self._write_all([data])
            except _GONE as e:
                self._break(e)
                raise anyio.BrokenResourceError from e

    def _break(self, error: BaseException) -> None:
        first = self._broken is None
        self._broken = error
        if first and self._on_broken is not None:
            self._on_broken()

    async def _write_all(self, chunks: list[bytearray | bytes | memoryview]) -> None:
        """Write `chunks` in order (the caller holds `_writing`). Cancelled part-way, what
        the pipe has not taken goes back to the front of the buffer, to be written first:
        otherwise the next message would start inside a half-written frame, and both be
        lost to the reader. Streams without `write_nowait` write each chunk as a whole."""
        write, wait = self._write, self._wait
        if write is None or wait is None:
            for chunk in chunks:
                # anyio's byte streams take any buffer (they hand it to the OS or copy it)
                await self._stream.send(cast("bytes", chunk))
            return
        views = deque(memoryview(chunk) for chunk in chunks if len(chunk))
        try:
            while views:
                written = write(views[0])
                if written == len(views[0]):
                    views.popleft()
                    continue
                views[0] = views[0][written:]
                await wait()
        except BaseException:
            if views and self._broken is None:
                self._buffer[:0] = b"".join(views)
            raise

    def _write_nowait(self) -> bool:
        """Write the whole buffer at once if the pipe has room and no write is in flight:
        the common case, without the lock's bookkeeping. False: what is left (possibly
        less than before) goes out through the lock."""
        if self._writing.locked():
            return False  # a write is in flight: flushing means waiting until it is done
        if not self._buffer:
            return True
        if self._write is None:
            return False
        try:
            written = self._write(self._buffer)
        except _GONE as e:
            self._break(e)
            raise anyio.BrokenResourceError from e
        if written == len(self._buffer):
            self._buffer = bytearray()
            return True
        del self._buffer[:written]
        return False

    async def aclose(self) -> None:
        if self._closed:
            return
        self._closed = True
        try:
            await self.flush()
        except anyio.BrokenResourceError:
            pass
        try:
            await self._stream.aclose()
        except _GONE:
            pass  # the peer already went away: EOF is what we wanted


def _large_payload(message: Message) -> tuple[str, Raw] | None:
    """The field holding a large payload. It is always the last field encoded (params after
    method; result or error after id), which is what lets the envelope be written first."""
    value: Raw | UnsetType
    if isinstance(message, Response):
        field, value = ("result", message.result) if message.result is not UNSET \
            else ("error", message.error)
    else:
        field, value = "params", message.params
    if value is UNSET or len(value) < LARGE_PAYLOAD:
        return None
    return field, value


async def flush_deferred() -> None:
    """Write what this task deferred, first-deferred sink first. A gone peer is skipped:
    its reader sees EOF and fails that wire."""
    deferred = _deferred.get()
    if deferred is None:
        return
    sinks = deferred.sinks
    while sinks:
        sink = sinks.pop(0)
        try:
            await sink.flush()
        except anyio.BrokenResourceError:
            pass


class CoalescedWrites:
    """Defer this task's pipe writes until `flush()`: for a task that routes a burst of
    messages it received some other way (an in-process proxy's inbox)."""

    def __init__(self) -> None:
        self._deferral = _Deferral()
        _deferred.set(self._deferral)  # the calling task's own context

    def begin(self) -> None:
        self._deferral.active = True

    async def flush(self) -> None:
        self._deferral.active = False
        if self._deferral.sinks:
            await flush_deferred()


async def serve_frames(
    stream: ByteReceiveStream,
    decoder: FrameDecoder,
    handle: Callable[[Any], Awaitable[None]],
    *,
    convert: Callable[[bytes | bytearray | OversizedFrame], Any] | None = None,
    nowait: Callable[[Any], bool] | None = None,
    cut: Callable[[Any], bool] | None = None,
) -> None:
    """Feed every frame (through `convert`, when given) to `handle`, in order, until EOF.
    With `nowait`, each is offered to it first and handed to `handle` only when it returns
    False: routing that needs no waiting costs no coroutine. A last frame the stream ended
    in (no newline) is offered to `cut` first, and dropped when it returns True."""
    deferred = _Deferral()
    token = _deferred.set(deferred)

    try:
        while True:
            try:
                chunk = await stream.receive(READ_CHUNK)
            except (anyio.EndOfStream, anyio.BrokenResourceError, anyio.ClosedResourceError):
                break
            deferred.active = True
            try:
                for frame in decoder.feed(chunk):
                    item = frame if convert is None else convert(frame)
                    if nowait is None or not nowait(item):
                        await handle(item)
            finally:
                deferred.active = False
            if deferred.sinks:
                await flush_deferred()
        last = decoder.end()
        if last is not None:
            item = last if convert is None else convert(last)
            if (cut is None or not cut(item)) and (nowait is None or not nowait(item)):
                await handle(item)
    finally:
        deferred.active = False
        with anyio.move_on_after(1.0, shield=True):
            await flush_deferred()  # what was routed is written, as if sent at once
        _deferred.reset(token)


def incoming(data: bytes | bytearray | OversizedFrame) -> Incoming:
    """What a frame is, for a reader: a decoded message (or batch), or why it is not one."""
    if isinstance(data, OversizedFrame):
        return Oversized(data.size, data.limit, data.top)
    try:
        return decode(data)
    except UnreadableFrame as e:
        return Unreadable(e.code, e.reason, e.head)
    except ParseError as e:
        return NotJson.of(str(e), data)


class PipeSource:
    """A MessageSource that decodes the frames of a byte stream (a child's stdout, our stdin).

    Served once: the stream is closed when serving ends."""

    def __init__(self, stream: ByteReceiveStream, *,
                 max_frame_bytes: int = DEFAULT_MAX_FRAME_BYTES,
                 on_cut: Callable[[str], None] | None = None) -> None:
        self._stream = stream
        self._max = max_frame_bytes
        # A writer whose output ends inside a frame died writing it: with `on_cut`, that
        # frame is dropped (and `on_cut` told why it did not decode), not refused as its
        # message, so its exit is what answers the request it was answering.
        self._on_cut = on_cut

    def _cut(self, item: Incoming) -> bool:
        if self._on_cut is None or not isinstance(item, NotJson | Unreadable):
            return False
        self._on_cut(item.reason)
        return True

    async def wait_hangup(self) -> None:
        """Until the writer has closed its end, read to it or not (`FdReceiveStream`);
        never for a stream that cannot tell."""
        wait = getattr(self._stream, "wait_hangup", None)
        await (anyio.sleep_forever() if wait is None else wait())

    async def serve(self, handle: Handle, nowait: HandleNowait | None = None) -> None:
        try:
            await serve_frames(self._stream, FrameDecoder(max_frame_bytes=self._max), handle,
                               convert=incoming, nowait=nowait, cut=self._cut)
        finally:
            with anyio.CancelScope(shield=True):
                await self._stream.aclose()  # a source is served once
