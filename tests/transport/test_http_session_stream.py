"""A Streamable HTTP client's streams (`GET`, with or without `Acp-Session-Id`), in memory:
the endpoint's `HttpClient` with hand-made ASGI `send` and `receive`."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

import anyio
import pytest

from conductor.jsonrpc.message import Notification, Raw, Request, Response, raw
from conductor.transport.http import AcpEndpoint, Gate, HttpClient, RemoteClient

if TYPE_CHECKING:
    from anyio.abc import TaskGroup


class Stream:
    """One GET's response as the client would see it; `stall()` makes its writes block
    (a reader that stopped reading)."""

    def __init__(self) -> None:
        self.events: list[Any] = []
        self.opened = anyio.Event()
        self.got_event = anyio.Event()
        self.ended = False
        self.done = anyio.Event()  # set with `ended`
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
                self.done.set()

    async def receive(self) -> Any:
        await self._disconnect.wait()
        return {"type": "http.disconnect"}


async def open_streams(tg: TaskGroup, client: HttpClient, main: Stream, own: Stream) -> None:
    """The connection's stream (`main`) and session s1's (`own`), both open."""
    tg.start_soon(client.stream, None, main.send, main.receive)
    tg.start_soon(client.stream, "s1", own.send, own.receive)
    await main.opened.wait()
    await own.opened.wait()


def update(n: int) -> Notification:
    return Notification(method="session/update", params=raw({"sessionId": "s1", "n": n}))


async def test_a_newer_get_for_a_session_stream_takes_over_and_loses_no_queued_event() -> None:
    client = HttpClient("peer", 0, max_frame_bytes=1 << 20)
    client.sessions.add("s1")
    first, second, main = Stream(), Stream(), Stream()
    with anyio.fail_after(5):
        async with anyio.create_task_group() as tg:
            await open_streams(tg, client, main, first)
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


async def test_a_client_that_stops_reading_its_stream_is_dropped_and_its_place_freed() -> None:
    # Through the endpoint (so the bound it is given is the one its clients use): the
    # client opens its stream, then reads nothing. Once the outbox is full the chain's
    # next send must fail within the bound, the chain see the client leave, and the
    # stuck GET end; not all wait for as long as the client keeps its socket.
    stream = Stream()
    chain_ended, get_ended = anyio.Event(), anyio.Event()
    connected: list[RemoteClient] = []
    answers: list[Any] = []

    async def chain(client: RemoteClient) -> None:  # answers initialize, then listens
        async def handle(item: object) -> None:
            assert isinstance(item, Request), item
            await client.send(Response(id=item.id, result=raw({"protocolVersion": 1})))
        await client.serve(handle)
        chain_ended.set()
        client.finish()  # what the listener does once the chain has stopped

    def scope(method: str, *headers: tuple[bytes, bytes]) -> dict[str, Any]:
        return {"type": "http", "method": method, "path": "/acp", "headers": list(headers),
                "client": ("127.0.0.1", 50000)}

    async def post(message: Any, *headers: tuple[bytes, bytes]) -> None:
        async def receive() -> dict[str, Any]:
            return {"type": "http.request", "body": json.dumps(message).encode()}

        async def send(event: Any) -> None:
            answers.append(event)
        await endpoint(scope("POST", (b"content-type", b"application/json"), *headers),
                       receive, send)

    async def get(ident: bytes) -> None:
        await endpoint(scope("GET", (b"accept", b"text/event-stream"),
                             (b"acp-connection-id", ident)), stream.receive, stream.send)
        get_ended.set()

    with anyio.fail_after(5):
        async with anyio.create_task_group() as tg:
            def on_connect(client: RemoteClient) -> None:
                connected.append(client)
                tg.start_soon(chain, client)
            endpoint = AcpEndpoint(Gate(), on_connect, send_timeout=lambda size: 0.05)
            await post({"jsonrpc": "2.0", "id": 1, "method": "initialize",
                        "params": {"protocolVersion": 1}})
            assert answers[0]["status"] == 200, answers
            [client] = connected
            tg.start_soon(get, client.id.encode())
            await stream.opened.wait()
            stream.stall()  # the client reads nothing more: the outbox fills

            async def fill() -> None:  # until the outbox is full and a send waits
                while True:
                    await client.send(update(0))
            with pytest.raises(anyio.BrokenResourceError):
                await fill()
            await chain_ended.wait()
            await get_ended.wait()
            answers.clear()
            await post({"jsonrpc": "2.0", "method": "x"},
                       (b"acp-connection-id", client.id.encode()))
    assert endpoint.clients == {}
    assert answers[0]["status"] == 404, answers  # the connection has ended


async def test_a_session_closed_on_an_http_connection_is_forgotten_by_it() -> None:
    # A long-lived connection that opens and closes sessions keeps no trace of the closed
    # ones (nor accepts their id in Acp-Session-Id); one whose close failed is still open.
    client = HttpClient("peer", 0, max_frame_bytes=1 << 20)
    main = Stream()
    ids = iter(range(1_000_000))

    async def answered(method: str, session: str | None, result: Any = None,
                       error: Any = None) -> None:
        request = Request(id=raw(next(ids)), method=method,
                          params=raw({"sessionId": session} if session else {"cwd": "/"}))
        client.note_request(request, session)
        await client.send(Response(id=request.id, result=raw(result)) if error is None
                          else Response(id=request.id, error=raw(error)))

    with anyio.fail_after(5):
        async with anyio.create_task_group() as tg:
            tg.start_soon(client.stream, None, main.send, main.receive)
            await main.opened.wait()
            for n in range(100):
                await answered("session/new", None, {"sessionId": f"s{n}"})
                await answered("session/close", f"s{n}", {})
            await answered("session/new", None, {"sessionId": "kept"})
            await answered("session/close", "kept", error={"code": -32603, "message": "no"})
            tg.cancel_scope.cancel()
    client.finish()  # what the listener does once the chain has stopped
    assert client.sessions == {"kept"}


async def test_a_session_stream_ends_once_its_session_close_is_answered() -> None:
    # The GET stayed open for ever: a client that opens and closes sessions for hours held
    # one stream (and one of the server's connections) for each.
    client = HttpClient("peer", 0, max_frame_bytes=1 << 20)
    client.sessions.add("s1")
    main, own = Stream(), Stream()
    close = Request(id=raw(7), method="session/close", params=raw({"sessionId": "s1"}))
    with anyio.fail_after(5):
        async with anyio.create_task_group() as tg:
            await open_streams(tg, client, main, own)
            await client.send(update(1))
            client.note_request(close, "s1")
            await client.send(Response(id=close.id, result=raw({})))
            await own.done.wait()
            assert [e.get("params", {}).get("n", e.get("id")) for e in own.events] == [1, 7]
            assert main.events == [] and not main.ended
            tg.cancel_scope.cancel()
    client.finish()


def sse_events(body: bytes) -> list[Any]:
    """Events as an SSE client reads them: a line ends at CRLF, LF or a lone CR."""
    events, data = [], []
    for line in body.replace(b"\r\n", b"\n").replace(b"\r", b"\n").split(b"\n"):
        if not line:
            if data:
                events.append(json.loads(b"\n".join(data)))
            data = []
        elif line.startswith(b"data:"):
            data.append(line[5:].removeprefix(b" "))
    return events


async def test_a_payload_with_a_carriage_return_as_whitespace_is_one_sse_event() -> None:
    # A component may write a bare CR as JSON whitespace inside a line (valid JSON, and only
    # a line feed ends a stdio frame); in SSE a bare CR ends a line, so the event was cut.
    client = HttpClient("peer", 0, max_frame_bytes=1 << 20)
    bodies: list[bytes] = []
    opened, got_event = anyio.Event(), anyio.Event()

    async def send(message: Any) -> None:
        if message["type"] == "http.response.body":
            bodies.append(message.get("body", b""))
            (got_event if opened.is_set() else opened).set()

    async def receive() -> Any:
        await anyio.sleep_forever()

    answer = Response(id=raw(7), result=Raw(b'{"a":1,\r"b":2}'))
    with anyio.fail_after(5):
        async with anyio.create_task_group() as tg:
            tg.start_soon(client.stream, None, send, receive)
            await opened.wait()
            await client.send(answer)
            await got_event.wait()
            tg.cancel_scope.cancel()
    client.finish()
    assert sse_events(b"".join(bodies)) == [{"jsonrpc": "2.0", "id": 7, "result": {"a": 1, "b": 2}}]


async def test_events_queued_for_a_closed_session_stream_keep_their_order_on_the_main_one(
        ) -> None:
    # The session's stream drops mid-turn with updates queued behind a stalled write; the
    # agent goes on streaming meanwhile. The connection's stream must carry the queued ones
    # first: a chunk of text that overtakes the ones before it garbles the answer.
    client = HttpClient("peer", 0, max_frame_bytes=1 << 20)
    client.sessions.add("s1")
    session, main = Stream(), Stream()
    with anyio.fail_after(5):
        async with anyio.create_task_group() as tg:
            tg.start_soon(client.stream, None, main.send, main.receive)
            tg.start_soon(client.stream, "s1", session.send, session.receive)
            await session.opened.wait()
            await main.opened.wait()
            session.stall()
            for n in range(20):
                await client.send(update(n))
            session._disconnect.set()  # the client drops the session's stream

            async def go_on() -> None:
                for n in range(20, 40):
                    await client.send(update(n))
            tg.start_soon(go_on)
            while not any(e["params"]["n"] == 39 for e in main.events):
                main.got_event = anyio.Event()
                await main.got_event.wait()
            await client.aclose()
            client.finish()
            tg.cancel_scope.cancel()
    delivered = [e["params"]["n"] for e in main.events]
    assert delivered == sorted(delivered)
    assert set(range(1, 40)) <= set(delivered)  # only the one being written may be lost


async def test_events_a_closed_session_stream_cannot_hand_on_drop_the_client_not_the_events(
        caplog: pytest.LogCaptureFixture) -> None:
    # The session's stream drops with updates queued, and the connection's stream is full
    # (its reader stopped too): they were lost after 5 s without a word, the connection
    # going on as if nothing was missing. A client that stops reading is dropped.
    from conductor.transport.http import OUTBOX

    client = HttpClient("peer", 0, max_frame_bytes=1 << 20, timeout=lambda size: 0.05)
    client.sessions.add("s1")
    session, main = Stream(), Stream()
    with anyio.fail_after(15):
        async with anyio.create_task_group() as tg:
            tg.start_soon(client.stream, None, main.send, main.receive)
            session_ended = anyio.Event()

            async def session_send(message: Any) -> None:
                if session._disconnect.is_set():
                    raise OSError("the client has gone")  # as the server says then
                await session.send(message)

            async def session_get() -> None:
                await client.stream("s1", session_send, session.receive)
                session_ended.set()
            tg.start_soon(session_get)
            await session.opened.wait()
            await main.opened.wait()
            main.stall()
            session.stall()
            for _ in range(OUTBOX + 1):  # one being written, the rest queued: full
                await client.send(Notification(method="x", params=raw({})))
            for n in range(3):
                await client.send(update(n))
            session._disconnect.set()
            await session_ended.wait()  # its queue handed on, or not
            tg.cancel_scope.cancel()
    client.finish()  # what the listener does once the chain has stopped
    assert client.closed
    assert "stopped reading" in caplog.text
