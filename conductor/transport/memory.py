"""In-memory byte pipes: run a conductor and a client in one process (run, tests)."""

from __future__ import annotations

from typing import TYPE_CHECKING

import anyio
from anyio.abc import ByteReceiveStream, ByteSendStream

if TYPE_CHECKING:
    from anyio.streams.memory import MemoryObjectReceiveStream, MemoryObjectSendStream


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
