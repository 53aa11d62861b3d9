"""The remote-component WebSocket client (`open_ws_client`) against a scripted server on
an ephemeral 127.0.0.1 port: wsproto on a raw socket, so the server can misbehave in ways
a real one would not (stop reading, fragment without end)."""

from __future__ import annotations

import contextlib
import errno
import json
import sys
from typing import TYPE_CHECKING

import anyio
import pytest
import wsproto
import wsproto.events as ws

from conductor.jsonrpc.message import Notification, raw
from conductor.transport.websocket import open_ws_client

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable

    from anyio.abc import SocketStream

async def _accept(stream: SocketStream) -> wsproto.WSConnection:
    conn = wsproto.WSConnection(wsproto.ConnectionType.SERVER)
    while True:
        conn.receive_data(await stream.receive())
        for event in conn.events():
            if isinstance(event, ws.Request):
                await stream.send(conn.send(ws.AcceptConnection()))
                return conn


async def serve_one(script: Callable[[SocketStream, wsproto.WSConnection], Awaitable[None]],
                    *, task_status: anyio.abc.TaskStatus[str]) -> None:
    """Accept one WebSocket connection and run `script` on it; the url first."""
    async with await anyio.create_tcp_listener(local_host="127.0.0.1") as listener:
        port = listener.extra(anyio.abc.SocketAttribute.local_port)
        task_status.started(f"ws://127.0.0.1:{port}/acp")
        stream = await listener.listeners[0].accept()
        async with stream:
            await script(stream, await _accept(stream))


def note(size: int) -> Notification:
    return Notification(method="x", params=raw({"pad": "x" * size}))


async def test_a_server_that_stops_reading_is_dropped_once_a_send_waits_too_long() -> None:
    async def never_reads(stream: SocketStream, conn: wsproto.WSConnection) -> None:
        await anyio.sleep_forever()

    with anyio.fail_after(20):
        async with anyio.create_task_group() as tg:
            url = await tg.start(serve_one, never_reads)
            async with open_ws_client(url, {}, send_timeout=lambda size: 0.2) as (sink,
                                                                                source):
                async def fill() -> None:  # until the socket buffers are full and one waits
                    while True:
                        await sink.send(note(1 << 20))
                with pytest.raises(anyio.BrokenResourceError):
                    await fill()

                async def handle(item: object) -> None:
                    raise AssertionError(f"nothing was sent: {item}")
                await source.serve(handle)  # ends: the connection was dropped
                with pytest.raises(anyio.BrokenResourceError):
                    await sink.send(note(1))
            tg.cancel_scope.cancel()
    assert source.ended == "it stopped reading: a message was not taken within 0.2 s"


async def test_a_message_fragmented_past_twice_the_limit_closes_the_socket_with_1009() -> None:
    # Fragments are assembled before any size check could see the message: without a cap
    # a server could grow our memory by sending continuation frames that never finish.
    closed: list[int] = []

    async def fragments_without_end(stream: SocketStream, conn: wsproto.WSConnection
                                    ) -> None:
        for _ in range(9):  # 9000 characters, and never the last fragment
            await stream.send(conn.send(ws.TextMessage(data="x" * 1000,
                                                       message_finished=False)))
        while not closed:
            try:
                conn.receive_data(await stream.receive())
            except anyio.EndOfStream:
                return
            closed.extend(e.code for e in conn.events() if isinstance(e, ws.CloseConnection))

    async def handle(item: object) -> None:
        raise AssertionError(f"no message was whole: {item}")

    with anyio.fail_after(10):
        async with anyio.create_task_group() as tg:
            url = await tg.start(serve_one, fragments_without_end)
            async with open_ws_client(url, {}, max_frame_bytes=4000) as (_, source):
                await source.serve(handle)
    assert closed == [1009]
    assert source.ended == "it sent a message of over 8000 bytes (twice the limit): " \
        "closed with 1009"


async def test_an_os_error_raised_inside_the_connection_block_keeps_its_own_cause() -> None:
    async def until_closed(stream: SocketStream, conn: wsproto.WSConnection) -> None:
        while True:
            try:
                await stream.receive()
            except (anyio.EndOfStream, anyio.BrokenResourceError):
                return

    mine = OSError(errno.ENOSPC, "No space left on device")
    caught: list[BaseException] = []
    with anyio.fail_after(10):
        async with anyio.create_task_group() as tg:
            url = await tg.start(serve_one, until_closed)
            try:
                async with open_ws_client(url, {}):
                    raise mine
            except BaseException as e:  # what comes out is the question
                caught.append(e)
    [error] = caught
    assert not isinstance(error, ConnectionError), error
    assert error is mine or (isinstance(error, BaseExceptionGroup)
                             and error.subgroup(lambda e: e is mine) is not None), error


async def test_without_the_remote_extra_the_error_says_how_to_install_it_from_a_checkout(
        monkeypatch: pytest.MonkeyPatch) -> None:
    # acp-conductor is not on PyPI: "pip install 'acp-conductor[remote]'" fails, or installs
    # whatever someone else published under that name.
    monkeypatch.setitem(sys.modules, "httpx_ws", None)  # None: `import httpx_ws` fails
    with pytest.raises(ConnectionError) as caught:
        async with open_ws_client("ws://127.0.0.1:9/acp", {}):
            pass
    message = str(caught.value)
    assert "remote extra" in message
    assert "'acp-conductor[remote]'" not in message
    assert "/path/to/acp-conductor[remote]" in message
    assert "docs/remote.md" in message


async def test_a_remote_component_writing_two_lines_in_one_message_has_both_read() -> None:
    # A server reusing a stdio writer over its socket; a broken pretty-printed message after
    # them stays one message (its lines are no JSON on their own).
    async def two_lines(stream: SocketStream, conn: wsproto.WSConnection) -> None:
        for text in ['{"jsonrpc":"2.0","method":"a"}\n{"jsonrpc":"2.0","method":"b"}\n',
                     '{\n  "jsonrpc": "2.0",\n  "method": "c",\n}']:
            await stream.send(conn.send(ws.TextMessage(data=text)))
        await stream.send(conn.send(ws.CloseConnection(code=1000)))
        await anyio.sleep_forever()

    got: list[object] = []

    async def handle(item: object) -> None:
        got.append(item)

    with anyio.fail_after(10):
        async with anyio.create_task_group() as tg:
            url = await tg.start(serve_one, two_lines)
            async with open_ws_client(url, {}) as (_, source):
                await source.serve(handle)
            tg.cancel_scope.cancel()
    assert [getattr(item, "method", type(item).__name__) for item in got] == ["a", "b",
                                                                               "NotJson"]


async def test_a_server_that_stops_answering_pings_is_dropped_saying_so(
        monkeypatch: pytest.MonkeyPatch) -> None:
    # A remote agent whose process hangs (a blocked event loop, a stopped container) keeps
    # its socket but answers no ping: the error must say that, not "network error".
    import conductor.transport.websocket as websocket

    monkeypatch.setattr(websocket, "PING_INTERVAL", 0.2)

    async def hangs(stream: SocketStream, conn: wsproto.WSConnection) -> None:
        await anyio.sleep_forever()

    with anyio.fail_after(20):
        async with anyio.create_task_group() as tg:
            url = await tg.start(serve_one, hangs)
            async with open_ws_client(url, {}) as (sink, source):
                async def handle(item: object) -> None:
                    raise AssertionError(f"nothing was sent: {item}")
                await source.serve(handle)  # ends: the connection was dropped
                # What the chain sends it meanwhile fails as to any gone peer (httpx-ws has
                # closed the session: wsproto refuses the frame).
                with pytest.raises(anyio.BrokenResourceError):
                    await sink.send(note(1))
            tg.cancel_scope.cancel()
    assert source.ended == "it did not answer a ping within 0.2 s"


async def test_a_server_that_never_answers_the_handshake_is_refused_saying_so(
        monkeypatch: pytest.MonkeyPatch) -> None:
    import conductor.transport.websocket as websocket

    monkeypatch.setattr(websocket, "CONNECT_TIMEOUT", 0.2)

    async def says_nothing(stream: SocketStream) -> None:
        async with stream:
            await anyio.sleep_forever()

    with anyio.fail_after(20):
        async with await anyio.create_tcp_listener(local_host="127.0.0.1") as listener:
            port = listener.extra(anyio.abc.SocketAttribute.local_port)
            async with anyio.create_task_group() as tg:
                tg.start_soon(listener.serve, says_nothing)
                with pytest.raises(ConnectionError) as refused:
                    async with open_ws_client(f"ws://127.0.0.1:{port}/acp", {}):
                        pass
                tg.cancel_scope.cancel()
    assert str(refused.value) == "no answer to the WebSocket handshake within 0.2 s"



async def test_a_server_whose_message_the_chain_is_slow_to_take_is_not_taken_for_hung(
        monkeypatch: pytest.MonkeyPatch) -> None:
    # Its pongs queue behind a message the chain has not taken yet (the chain waits on a
    # slow client, say): that is our wait, not the server hanging, and must not drop it.
    import conductor.transport.websocket as websocket

    monkeypatch.setattr(websocket, "PING_INTERVAL", 0.2)

    async def answers_pings(stream: SocketStream, conn: wsproto.WSConnection) -> None:
        for method in ("a", "b"):
            await stream.send(conn.send(ws.TextMessage(
                data=f'{{"jsonrpc":"2.0","method":"{method}"}}')))
        while True:
            try:
                conn.receive_data(await stream.receive())
            except (anyio.EndOfStream, anyio.BrokenResourceError):
                return  # the client dropped us
            for event in conn.events():
                if isinstance(event, ws.Ping):
                    await stream.send(conn.send(event.response()))
                elif isinstance(event, ws.TextMessage):  # the client's: all is well
                    await stream.send(conn.send(ws.CloseConnection(code=1000)))

    got: list[str] = []
    slow_done = anyio.Event()

    async def handle(item: object) -> None:
        got.append(getattr(item, "method", "?"))
        if len(got) == 1:
            await anyio.sleep(1.5)  # ping after ping goes unanswered meanwhile
            slow_done.set()

    with anyio.fail_after(10):
        async with anyio.create_task_group() as tg:
            url = await tg.start(serve_one, answers_pings)
            async with open_ws_client(url, {}) as (sink, source):
                served = anyio.Event()

                async def serve() -> None:
                    await source.serve(handle)
                    served.set()
                tg.start_soon(serve)
                await slow_done.wait()
                with contextlib.suppress(anyio.BrokenResourceError):  # dropped: the bug
                    await sink.send(note(1))
                await served.wait()
            tg.cancel_scope.cancel()
    assert got == ["a", "b"]
    assert source.ended == "closed by the server: code 1000"


async def test_a_remote_component_writing_noise_is_logged_as_from_its_websocket(
        caplog: pytest.LogCaptureFixture) -> None:
    # A remote agent has no stdout: "wrote a non-JSON line on stdout" sent its user
    # looking for a process that is not there.
    from conductor.config import parse_chain
    from conductor.jsonrpc.message import Request
    from conductor.serve import RunOptions, serve_connection
    from conductor.transport.memory import message_pipe

    async def banner_then_answers(stream: SocketStream, conn: wsproto.WSConnection) -> None:
        await stream.send(conn.send(ws.TextMessage(data="Welcome to far-agent 1.0")))
        while True:
            try:
                conn.receive_data(await stream.receive())
            except (anyio.EndOfStream, anyio.BrokenResourceError):
                return
            for event in conn.events():
                if isinstance(event, ws.TextMessage):
                    ident = json.loads(event.data)["id"]
                    await stream.send(conn.send(ws.TextMessage(data=json.dumps(
                        {"jsonrpc": "2.0", "id": ident, "result": {"protocolVersion": 1}}))))
                elif isinstance(event, ws.CloseConnection):
                    await stream.send(conn.send(event.response()))
                    return

    answered = anyio.Event()

    async def read(item: object) -> None:
        answered.set()

    with anyio.fail_after(20):
        async with anyio.create_task_group() as tg:
            url = await tg.start(serve_one, banner_then_answers)
            config = parse_chain({"agent": {"name": "far", "url": url}}, file="<test>")
            to_chain, chain_reads = message_pipe()
            from_chain, editor_reads = message_pipe(1 << 16)
            tg.start_soon(editor_reads.serve, read)

            async def editor() -> None:
                await to_chain.send(Request(id=raw(1), method="initialize",
                                            params=raw({"protocolVersion": 1})))
                await answered.wait()
                await to_chain.aclose()
            tg.start_soon(editor)
            await serve_connection(config, from_chain, chain_reads,
                                   RunOptions(handle_signals=False))
            tg.cancel_scope.cancel()
    assert "far wrote a non-JSON line on its WebSocket (dropped): Welcome to far-agent 1.0" \
        in caplog.text
