"""In-memory transports: byte pipes (a conductor and its client in one process: `run`,
`check`, tests) and message pipes (message objects handed over, nothing encoded)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Literal, cast

import anyio
from anyio.abc import ByteReceiveStream, ByteSendStream

from conductor.jsonrpc.message import Batch, InvalidMessage, Message
from conductor.transport.pipes import PipeSink, PipeSource

if TYPE_CHECKING:
    from anyio.streams.memory import MemoryObjectReceiveStream, MemoryObjectSendStream

    from conductor.transport.base import Handle, HandleNowait, MessageSink, MessageSource


class MemoryByteSendStream(ByteSendStream):
    def __init__(self, stream: MemoryObjectSendStream[bytes]) -> None:
        self._stream = stream

    async def send(self, item: bytes) -> None:
        if item:
            await self._stream.send(bytes(item))  # a memoryview would not outlive its source

    async def aclose(self) -> None:
        await self._stream.aclose()


class MemoryByteReceiveStream(ByteReceiveStream):
    def __init__(self, stream: MemoryObjectReceiveStream[bytes]) -> None:
        self._stream = stream
        self._rest = b""
        self._at = 0  # an offset, not a re-slice: slicing off the rest copied it each time

    async def receive(self, max_bytes: int = 65536) -> bytes:
        if self._at >= len(self._rest):
            self._rest = await self._stream.receive()  # EndOfStream when the sender closed
            self._at = 0
        chunk = self._rest[self._at:self._at + max_bytes]
        self._at += len(chunk)
        return chunk

    async def aclose(self) -> None:
        await self._stream.aclose()


def memory_pipe(buffer: int = 16) -> tuple[MemoryByteSendStream, MemoryByteReceiveStream]:
    """A one-way byte pipe holding at most `buffer` writes."""
    send, receive = anyio.create_memory_object_stream[bytes](buffer)
    return MemoryByteSendStream(send), MemoryByteReceiveStream(receive)


class MemoryMessageSink:
    """A MessageSink that hands message objects over (bounded, like a pipe's buffer)."""

    def __init__(self, stream: MemoryObjectSendStream[Message | list[Message]]) -> None:
        self._stream = stream

    async def send(self, item: Message | list[Message]) -> None:
        try:
            await self._stream.send(item)
        except anyio.ClosedResourceError:
            raise anyio.BrokenResourceError from None

    def send_nowait(self, item: Message) -> bool:
        try:
            self._stream.send_nowait(item)
        except (anyio.WouldBlock, anyio.ClosedResourceError, anyio.BrokenResourceError):
            return False
        return True

    async def aclose(self) -> None:
        await self._stream.aclose()


class MemoryMessageSource:
    """The receiving end of `message_pipe`: the same contract as a pipe's reader."""

    def __init__(self, stream: MemoryObjectReceiveStream[Message | list[Message]]) -> None:
        self._stream = stream

    async def serve(self, handle: Handle, nowait: HandleNowait | None = None) -> None:
        async with self._stream:
            async for item in self._stream:
                if isinstance(item, list):
                    items: list[Message | InvalidMessage] = list(item)
                    await handle(Batch(items))
                elif nowait is None or not nowait(item):
                    await handle(item)


def message_pipe(buffer: int = 256) -> tuple[MemoryMessageSink, MemoryMessageSource]:
    """A one-way pipe of message objects holding at most `buffer` messages."""
    send, receive = anyio.create_memory_object_stream[Message | list[Message]](buffer)
    return MemoryMessageSink(send), MemoryMessageSource(receive)


Transport = Literal["memory", "pipes"]


def open_link(transport: Transport) -> tuple[MessageSink, MessageSource]:
    """A one-way link: `memory` hands message objects over; `pipes` encodes them onto an
    in-memory byte pipe and decodes them at the other end, exactly as over a real pipe."""
    if transport == "memory":
        return message_pipe()
    send, receive = memory_pipe()
    return PipeSink(send), cast("MessageSource", PipeSource(receive))
