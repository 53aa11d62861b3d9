"""A Streamable HTTP client's session stream (`GET` with `Acp-Session-Id`), in memory:
the endpoint's `HttpClient` with hand-made ASGI `send` and `receive`."""

from __future__ import annotations

import json
from typing import Any

import anyio

from conductor.jsonrpc.message import Notification, raw
from conductor.transport.http import HttpClient


class Stream:
    """One GET's response as the client would see it; `stall()` makes its writes block
    (a reader that stopped reading)."""

    def __init__(self) -> None:
        self.events: list[Any] = []
        self.opened = anyio.Event()
        self.got_event = anyio.Event()
        self.ended = False
        self._flowing = anyio.Event()
        self._flowing.set()
        self._disconnect = anyio.Event()

    def stall(self) -> None:
        self._flowing = anyio.Event()

    async def send(self, message: Any) -> None:
        if message["type"] == "http.response.body":
            body = message.get("body", b"")
            if body.startswith(b": stream open"):
                self.opened.set()
                return
            await self._flowing.wait()
            if body.startswith(b"data: "):
                self.events.append(json.loads(body[6:]))
                self.got_event.set()
            if not message.get("more_body"):
                self.ended = True

    async def receive(self) -> Any:
        await self._disconnect.wait()
        return {"type": "http.disconnect"}


def update(n: int) -> Notification:
    return Notification(method="session/update", params=raw({"sessionId": "s1", "n": n}))


async def test_a_newer_get_for_a_session_stream_takes_over_and_loses_no_queued_event() -> None:
    client = HttpClient("peer", 0, max_frame_bytes=1 << 20)
    client.sessions.add("s1")
    first, second, main = Stream(), Stream(), Stream()
    with anyio.fail_after(5):
        async with anyio.create_task_group() as tg:
            tg.start_soon(client.stream, None, main.send, main.receive)
            tg.start_soon(client.stream, "s1", first.send, first.receive)
            await first.opened.wait()
            await main.opened.wait()
            first.stall()  # the first reader stopped reading: events queue up behind it
            for n in range(3):
                await client.send(update(n))
            tg.start_soon(client.stream, "s1", second.send, second.receive)
            await second.opened.wait()
            await client.send(update(3))
            while not any(e["params"]["n"] == 3 for e in second.events + main.events):
                got = anyio.Event()
                second.got_event, main.got_event = got, got
                await got.wait()
            # The newer stream stays the session's: the next event is on it.
            await client.send(update(4))
            while not any(e["params"]["n"] == 4 for e in second.events):
                second.got_event = anyio.Event()
                await second.got_event.wait()
            assert not second.ended
            delivered = [e["params"]["n"] for e in first.events + second.events + main.events]
            # The one the stalled reader was writing may or may not have reached it;
            # those queued behind it must come on another stream.
            assert {1, 2, 3, 4} <= set(delivered)
            await client.aclose()
            client.finish()
            tg.cancel_scope.cancel()
