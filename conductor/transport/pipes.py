"""Messages over byte pipes: frames in, encoded messages out."""

from __future__ import annotations

from collections.abc import Awaitable, Callable

import anyio
from anyio.abc import ByteReceiveStream, ByteSendStream

from conductor.jsonrpc.framing import FrameDecoder, OversizedFrame
from conductor.jsonrpc.message import Message, encode, encode_batch

READ_CHUNK = 1 << 20


class PipeSink:
    """A MessageSink that encodes onto a byte stream (a child's stdin, our stdout)."""

    def __init__(self, stream: ByteSendStream) -> None:
        self._stream = stream
        self._closed = False

    async def send(self, item: Message | list[Message]) -> None:
        data = encode(item) if isinstance(item, Message) else encode_batch(item)
        await self._stream.send(data)

    async def aclose(self) -> None:
        if self._closed:
            return
        self._closed = True
        try:
            await self._stream.aclose()
        except (OSError, anyio.BrokenResourceError, anyio.ClosedResourceError):
            pass  # the peer already went away: EOF is what we wanted


async def serve_frames(
    stream: ByteReceiveStream,
    decoder: FrameDecoder,
    handle: Callable[[bytes | OversizedFrame], Awaitable[None]],
) -> None:
    """Feed every frame to `handle`, in order, until EOF."""
    while True:
        try:
            chunk = await stream.receive(READ_CHUNK)
        except (anyio.EndOfStream, anyio.BrokenResourceError, anyio.ClosedResourceError):
            break
        for frame in decoder.feed(chunk):
            await handle(frame)
    last = decoder.end()
    if last is not None:
        await handle(last)
