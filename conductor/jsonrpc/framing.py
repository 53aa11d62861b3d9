"""Newline-delimited frames from arbitrary chunks. No I/O; no JSON but an oversized frame's
top-level keys, read as it is skipped."""

from __future__ import annotations

import msgspec

from conductor.jsonrpc.head import Head, HeadScanner
from conductor.record import Record

DEFAULT_MAX_FRAME_BYTES = 64 * 1024 * 1024


class OversizedFrame(Record, frozen=True):
    """A frame that exceeded the limit and was skipped; `head` is its first bytes, `top` its
    top-level id and method as scanned over all of its bytes."""

    size: int
    limit: int
    head: bytes
    top: Head = msgspec.field(default_factory=lambda: Head(None, False, False))


class FrameDecoder:
    """Splits a byte stream into frames.

    A frame over the limit is not an error that ends the stream: its bytes are discarded
    as they arrive (memory stays bounded) and one `OversizedFrame` takes its place, so the
    connection's other traffic continues. The skipped bytes go through a `HeadScanner` on
    their way out, so the frame's id is known even when it comes after a huge `params`.
    """

    HEAD_BYTES = 4096

    def __init__(self, *, max_frame_bytes: int = DEFAULT_MAX_FRAME_BYTES) -> None:
        self._pending = bytearray()
        self._max = max_frame_bytes
        self._skipping: int | None = None  # bytes of the oversized frame seen so far
        self._skip_head = b""
        self._scan = HeadScanner()

    @property
    def max_frame_bytes(self) -> int:
        return self._max

    def feed(self, chunk: bytes) -> list[bytes | bytearray | OversizedFrame]:
        """Frames completed by `chunk`. A frame that spanned chunks comes as the bytearray
        it was collected in (handed over, never touched again): no copy of a large frame."""
        out: list[bytes | bytearray | OversizedFrame] = []
        view = memoryview(chunk)
        start = 0
        n = len(chunk)
        while start < n:
            nl = chunk.find(b"\n", start)
            end = n if nl < 0 else nl
            size = end - start
            if self._skipping is not None:
                self._skipping += size
                if not self._scan.done:
                    self._scan.feed(chunk, start, end)
            elif len(self._pending) + size > self._max and not self._cr_ends(chunk, start, end):
                self._skip_head = (bytes(self._pending[: self.HEAD_BYTES])
                                   + chunk[start:min(end, start + self.HEAD_BYTES)])
                self._skipping = len(self._pending) + size
                self._scan = HeadScanner()
                self._scan.feed(self._pending)
                self._scan.feed(chunk, start, end)
                self._pending = bytearray()
            elif nl >= 0 and not self._pending:
                # Fast path: a whole frame inside this chunk, no copy into the buffer.
                piece = chunk[start:end]
                if piece and not piece.isspace():  # blank lines are not messages
                    out.append(piece)
            else:
                self._pending += view[start:end]
            if nl < 0:
                break
            if self._skipping is not None:
                out.append(self._skipped())
            elif self._pending:
                frame, self._pending = self._pending, bytearray()
                if not frame.isspace():
                    out.append(frame)
            start = nl + 1
        return out

    def _cr_ends(self, chunk: bytes, start: int, end: int) -> bool:
        """The line so far is one byte over the limit, and that byte is a CR: a CRLF line
        end's, no part of the message (if no LF follows, the next byte is over anyway)."""
        if len(self._pending) + end - start != self._max + 1:
            return False
        last = chunk[end - 1] if end > start else self._pending[-1]
        return last == 0x0D

    def end(self) -> bytes | bytearray | OversizedFrame | None:
        """The stream ended: return a final unterminated frame, if any."""
        if self._skipping is not None:
            return self._skipped()
        rest, self._pending = bytes(self._pending), bytearray()
        return rest if rest.strip() else None

    def _skipped(self) -> OversizedFrame:
        assert self._skipping is not None
        skipped = OversizedFrame(self._skipping, self._max, self._skip_head[: self.HEAD_BYTES],
                                 self._scan.head())
        self._skipping = None
        self._skip_head = b""
        return skipped
