"""What every transport offers the layers above: messages out (`MessageSink`), and one
receiving contract, messages in (`MessageSource`).

A source hands its reader callback one `Incoming` item at a time, in arrival order, in the
reader's own task (routing happens there, so a slow consumer stalls only its producer).
Bytes, frames and decoding stay below this line: the reader sees a `Request`,
`Notification` or `Response`, a `Batch`, an `InvalidMessage` (JSON but not JSON-RPC), a
`NotJson` line, an `Unreadable` frame (not UTF-8, or nested too deeply to decode), or an
`Oversized` frame that was skipped unread. The last two carry what a scan of their top
level found, so their sender can still be answered (`Endpoint.refuse_unread`).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Protocol, TypeAlias

from conductor.jsonrpc.head import read_head
from conductor.jsonrpc.message import (
    Batch,
    InvalidMessage,
    Message,
    ParseError,
    UnreadableFrame,
    decode,
)
from conductor.record import Record

if TYPE_CHECKING:
    from conductor.jsonrpc.head import Head


class NotJson(Record, frozen=True):
    """A line that is not JSON (or not UTF-8): `reason` says why, `head` its first bytes,
    `top` what a scan of its top level found (its id, whether it has a method): a broken
    answer still fails the request it answers, so nobody waits for it."""

    reason: str
    head: bytes
    top: Head | None = None

    @classmethod
    def of(cls, reason: str, data: bytes | bytearray) -> NotJson:
        shaped = data.lstrip(b" \t\r")[:1] == b"{"  # (noise and banners are not scanned)
        return cls(reason, bytes(data[:500]), read_head(data) if shaped else None)


class Unreadable(Record, frozen=True):
    """A frame that is not UTF-8 or nested too deeply to decode: refused, never routed.
    `code` is the JSON-RPC error to answer with; `head` what its top level showed."""

    code: int
    reason: str
    head: Head


class Oversized(Record, frozen=True):
    """A frame over the size limit, skipped without being buffered. `head` is what could be
    read of its top-level `id` and `method` while it went by."""

    size: int
    limit: int
    head: Head


Incoming: TypeAlias = Message | Batch | InvalidMessage | NotJson | Unreadable | Oversized
Handle: TypeAlias = Callable[[Incoming], Awaitable[None]]
HandleNowait: TypeAlias = Callable[[Incoming], bool]


class MessageSink(Protocol):
    """Something messages can be sent to. One call at a time per sink is the caller's job.

    A sink may also offer `send_nowait(message) -> bool`: queue one message without
    waiting, when that is possible, else return False (then call `send`). The router uses
    it to route a burst without a coroutine per message (`Chain.receive_nowait`).
    """

    async def send(self, item: Message | list[Message]) -> None:
        """Send one message, or a batch. Raises anyio.BrokenResourceError when the peer is gone."""
        ...

    async def aclose(self) -> None:
        """Signal end of input to the peer (EOF). Idempotent."""
        ...


class MessageSource(Protocol):
    """Something messages arrive from."""

    async def serve(self, handle: Handle, nowait: HandleNowait | None = None) -> None:
        """Call `handle` with every item, in order, until the peer's end of input. With
        `nowait`, each item is offered to it first, and handed to `handle` only when it
        returns False (it handled nothing)."""
        ...


# Line breaks outside strings are insignificant JSON whitespace (inside a string they are
# not allowed at all), and every stdio hop is line-delimited: a message that arrived whole
# (a WebSocket frame, an HTTP body) has them turned into spaces, so it stays one frame there.
# The same holds for an SSE event, where a CR alone ends a line too: a frame read from stdio
# has no LF but may have a bare CR (JSON whitespace) between tokens.
_LINE_BREAKS = bytes.maketrans(b"\r\n", b"  ")


def on_one_line(data: bytes) -> bytes:
    """`data`, one JSON text, with its line breaks (all outside strings) made spaces."""
    if b"\n" in data or b"\r" in data:
        return data.translate(_LINE_BREAKS)
    return data


def decode_whole(data: bytes, limit: int) -> Incoming:
    """A message that arrived in one piece, as the item a source hands on."""
    if len(data) > limit:
        return Oversized(len(data), limit, read_head(data))  # its id may be anywhere
    data = on_one_line(data)
    try:
        return decode(data)
    except UnreadableFrame as e:
        return Unreadable(e.code, e.reason, e.head)
    except ParseError as e:
        return NotJson.of(str(e), data)


def decode_lines(data: bytes, limit: int) -> list[Incoming]:
    """The items of a WebSocket message: one JSON value (line breaks and all), or several
    newline-delimited ones, as a client reusing a stdio writer sends them. Read whole, those
    were one "not JSON" and every message after the first went unanswered. Split only when
    the first line is JSON on its own, so a broken pretty-printed message stays one error."""
    if data.isspace() or not data:
        return []  # no message, as a blank line on stdio is none (a keep-alive, say)
    item = decode_whole(data, limit)
    if not isinstance(item, NotJson) or b"\n" not in data:
        return [item]
    lines = [line for line in data.split(b"\n") if line.strip()]
    if len(lines) < 2:
        return [item]
    first = decode_whole(lines[0], limit)
    if isinstance(first, NotJson):
        return [item]
    return [first, *(decode_whole(line, limit) for line in lines[1:])]
