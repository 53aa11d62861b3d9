"""A large payload is written from its own memory, byte for byte as a normal encode, in order."""

from __future__ import annotations

import pytest
from anyio.abc import ByteSendStream
from msgspec import Raw

from conductor.jsonrpc.message import Message, Notification, Request, Response, encode, int_id
from conductor.transport.pipes import LARGE_PAYLOAD, PipeSink


class Collect(ByteSendStream):
    def __init__(self) -> None:
        self.writes: list[bytes] = []

    async def send(self, item: bytes) -> None:
        self.writes.append(bytes(item))

    async def aclose(self) -> None:
        pass


BIG = Raw(b'{"text" : "' + b"x" * LARGE_PAYLOAD + b'", "n": 1e2}')


@pytest.mark.parametrize("message", [
    Request(id=int_id(7), method="session/prompt", params=BIG),
    Notification(method="session/update", params=BIG),
    Response(id=Raw(b'"a"'), result=BIG),
    Response(id=Raw(b"null"), error=BIG),
], ids=["request", "notification", "result", "error"])
async def test_a_large_payload_is_written_exactly_as_a_normal_encode(message: Message) -> None:
    stream = Collect()
    await PipeSink(stream).send(message)
    assert b"".join(stream.writes) == encode(message)
    assert any(len(w) >= LARGE_PAYLOAD for w in stream.writes)  # the payload went on its own


async def test_a_large_payload_goes_out_after_what_was_sent_before_it() -> None:
    stream = Collect()
    sink = PipeSink(stream)
    small = Notification(method="a", params=Raw(b"[1]"))
    big = Notification(method="b", params=BIG)
    await sink.send(small)
    await sink.send(big)
    await sink.send(small)
    assert b"".join(stream.writes) == encode(small) + encode(big) + encode(small)
