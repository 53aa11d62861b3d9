"""`acp-conductor serve`'s endpoint in process, on both backends: a real listener (hypercorn
on an ephemeral 127.0.0.1 port), a real chain per connection (the demo agent), and raw HTTP
and WebSocket clients (httpx, httpx-ws) for the transport's and the gate's rules."""

from __future__ import annotations

import contextlib
import functools
import json
import logging
import ssl
import sys
from contextlib import aclosing, asynccontextmanager
from typing import TYPE_CHECKING, Any

import anyio
import httpx
import httpx_ws
import pytest
import wsproto.utilities

from conductor.config import parse_chain
from conductor.listen import ListenSettings, serve_listener
from tests.bin.rawjson import members
from tests.conftest import BIN

if TYPE_CHECKING:
    from collections.abc import AsyncIterator, Awaitable, Callable

# httpx reads a response through nested async generators; an SSE stream left early leaves
# the inner ones to trio's finalizer, which warns (the response itself is closed).
pytestmark = pytest.mark.filterwarnings("ignore:Async generator 'http:ResourceWarning")

TOKEN = "token-" + "a" * 26
OTHER = "token-" + "b" * 26
AUTH = {"Authorization": f"Bearer {TOKEN}"}  # httpx-ws adds to the dict it is given: copy
INIT = {"jsonrpc": "2.0", "id": 1, "method": "initialize",
        "params": {"protocolVersion": 1, "clientCapabilities": {}}}


@functools.cache
def _tls() -> ssl.SSLContext:
    return ssl.create_default_context()


def http_client(**options: Any) -> httpx.AsyncClient:
    """An httpx client that shares one TLS context: each would load the CA bundle (≈ 20 ms
    of CPU) for listeners that speak plain HTTP."""
    return httpx.AsyncClient(verify=_tls(), **options)


def demo_chain(agent: list[str] | None = None) -> Any:
    return parse_chain({"agent": {"command": agent or [sys.executable, "-m",
                                                       "conductor.demo_agent"]}},
                       file="<test>")


@asynccontextmanager
async def open_listener(chain: Any = None, **overrides: Any) -> AsyncIterator[tuple[str, str]]:
    """A listener on an ephemeral port: (ws url, http url). Stopped gracefully on exit.

    Its clients have closed by then: hypercorn's wait for leftover sockets, which also
    waits out every closed WebSocket's sleeping ping task, is cut to 0.1 s."""
    overrides.setdefault("leftover_sockets", 0.1)
    settings = ListenSettings(port=0, tokens=(TOKEN, OTHER), handle_signals=False,
                              **overrides)
    urls: list[tuple[str, str]] = []
    up = anyio.Event()

    def ready(found: tuple[str, str]) -> None:
        urls.append(found)
        up.set()

    async with anyio.create_task_group() as tg:
        tg.start_soon(functools.partial(serve_listener, chain or demo_chain(), settings,
                                        ready=ready))
        with anyio.fail_after(10):
            await up.wait()
        try:
            yield urls[0]
        finally:
            settings.stop.set()


async def initialize(client: httpx.AsyncClient, url: str, headers: dict[str, str] | None = None
                     ) -> httpx.Response:
    return await client.post(url, json=INIT, headers=headers if headers is not None else AUTH)


@asynccontextmanager
async def open_events(response: httpx.Response) -> AsyncIterator[Callable[[], Awaitable[Any]]]:
    """`next_event()`: the next SSE data event of an open stream."""
    async with aclosing(response.aiter_lines()) as lines:  # trio wants generators closed
        async def next_event() -> Any:
            async for line in lines:
                if line.startswith("data: "):
                    return json.loads(line[6:])
            raise EOFError("the stream ended")
        yield next_event


async def test_initialize_over_http_answers_with_the_chain_result_and_a_connection_id() -> None:
    async with open_listener() as (_, url), http_client() as client:
        with anyio.fail_after(15):
            answer = await initialize(client, url)
            assert answer.status_code == 200
            assert answer.headers["acp-connection-id"]
            body = answer.json()
            assert body["id"] == 1 and body["result"]["protocolVersion"] == 1
            done = await client.delete(url, headers={
                **AUTH, "Acp-Connection-Id": answer.headers["acp-connection-id"]})
            assert done.status_code == 202


async def test_a_request_without_a_token_is_refused_and_the_log_names_no_token(
        caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="acp_conductor")
    async with open_listener() as (_, url), http_client() as client:
        with anyio.fail_after(15):
            missing = await initialize(client, url, headers={})
            wrong = await initialize(client, url,
                                     headers={"Authorization": "Bearer not-the-token-123456"})
    assert missing.status_code == 401 and missing.headers["www-authenticate"] == "Bearer"
    assert "no bearer token" in missing.json()["error"]
    assert wrong.status_code == 401 and wrong.json()["error"] == "wrong bearer token"
    logged = "\n".join(r.getMessage() for r in caplog.records)
    assert "no bearer token" in logged and "wrong bearer token" in logged
    for secret in (TOKEN, OTHER, "not-the-token-123456"):
        assert secret not in logged


async def test_a_connection_opened_with_one_token_refuses_requests_bearing_another() -> None:
    async with open_listener() as (_, url), http_client() as client:
        with anyio.fail_after(15):
            opened = await initialize(client, url)
            ident = opened.headers["acp-connection-id"]
            other = {"Authorization": f"Bearer {OTHER}", "Acp-Connection-Id": ident}
            post = await client.post(url, headers=other, json={
                "jsonrpc": "2.0", "id": 2, "method": "session/new",
                "params": {"cwd": "/", "mcpServers": []}})
            stream = await client.get(url, headers={**other, "Accept": "text/event-stream"})
            delete = await client.delete(url, headers=other)
            still = await client.delete(url, headers={**AUTH, "Acp-Connection-Id": ident})
    assert [post.status_code, stream.status_code, delete.status_code] == [403, 403, 403]
    assert "another token" in post.json()["error"]
    assert still.status_code == 202  # the rightful owner still has it


async def test_a_session_of_one_connection_is_unknown_on_another() -> None:
    async with open_listener() as (_, url), http_client(timeout=10) as client:
        with anyio.fail_after(20):
            first = (await initialize(client, url)).headers["acp-connection-id"]
            second = (await initialize(client, url)).headers["acp-connection-id"]
            headers = {**AUTH, "Acp-Connection-Id": first, "Accept": "text/event-stream"}
            async with client.stream("GET", url, headers=headers) as stream, \
                    open_events(stream) as next_event:
                accepted = await client.post(url, headers={**AUTH, "Acp-Connection-Id": first},
                                             json={"jsonrpc": "2.0", "id": "s", "method":
                                                   "session/new",
                                                   "params": {"cwd": "/", "mcpServers": []}})
                assert accepted.status_code == 202
                answer = await next_event()
            session = answer["result"]["sessionId"]
            prompt = {"jsonrpc": "2.0", "id": 3, "method": "session/prompt",
                      "params": {"sessionId": session, "prompt": []}}
            elsewhere = await client.post(url, json=prompt, headers={
                **AUTH, "Acp-Connection-Id": second, "Acp-Session-Id": session})
            unnamed = await client.post(url, json=prompt,
                                        headers={**AUTH, "Acp-Connection-Id": first})
    assert answer["id"] == "s"
    assert elsewhere.status_code == 404 and "Acp-Session-Id" in elsewhere.json()["error"]
    assert unnamed.status_code == 400 and "needs an Acp-Session-Id" in unnamed.json()["error"]


async def test_session_traffic_goes_to_the_session_stream_while_one_is_open() -> None:
    async with open_listener() as (_, url), http_client(timeout=10) as client:
        with anyio.fail_after(20):
            ident = (await initialize(client, url)).headers["acp-connection-id"]
            base = {**AUTH, "Acp-Connection-Id": ident}
            sse = {**base, "Accept": "text/event-stream"}
            async with client.stream("GET", url, headers=sse) as main, \
                    open_events(main) as next_main:
                await client.post(url, headers=base, json={
                    "jsonrpc": "2.0", "id": 2, "method": "session/new",
                    "params": {"cwd": "/", "mcpServers": []}})
                opened = await next_main()
                session = opened["result"]["sessionId"]
                async with client.stream("GET", url, headers={**sse, "Acp-Session-Id": session}
                                         ) as scoped, open_events(scoped) as next_scoped:
                    await client.post(url, headers={**base, "Acp-Session-Id": session}, json={
                        "jsonrpc": "2.0", "id": 3, "method": "session/prompt",
                        "params": {"sessionId": session,
                                   "prompt": [{"type": "text", "text": "hi"}]}})
                    events = [await next_scoped()]
                    while "id" not in events[-1]:
                        events.append(await next_scoped())
    assert events[-1] == {"jsonrpc": "2.0", "id": 3, "result": {"stopReason": "end_turn"}}
    assert all(e["params"]["sessionId"] == session for e in events[:-1])


async def test_a_session_stream_opened_before_its_session_load_carries_the_replay() -> None:
    # The TypeScript SDK's HTTP client opens a session's stream before it POSTs the
    # session/load (or resume) naming it, so the replayed history lands there; refusing
    # that GET as an unknown session failed every load.
    async with open_listener() as (_, url), http_client(timeout=10) as client:
        with anyio.fail_after(20):
            ident = (await initialize(client, url)).headers["acp-connection-id"]
            base = {**AUTH, "Acp-Connection-Id": ident, "Acp-Session-Id": "earlier"}
            async with client.stream("GET", url, headers={**base, "Accept": "text/event-stream"}
                                     ) as scoped:
                assert scoped.status_code == 200
                async with open_events(scoped) as next_scoped:
                    loading = await client.post(url, headers=base, json={
                        "jsonrpc": "2.0", "id": 2, "method": "session/load",
                        "params": {"sessionId": "earlier", "cwd": "/", "mcpServers": []}})
                    assert loading.status_code == 202
                    events = [await next_scoped()]
                    while "id" not in events[-1]:
                        events.append(await next_scoped())
    assert events[0]["params"]["update"]["sessionUpdate"] == "user_message_chunk"
    assert events[-1] == {"jsonrpc": "2.0", "id": 2, "result": None}


async def test_the_rfd_status_codes_for_malformed_requests() -> None:
    async with open_listener() as (_, url), http_client() as client:
        with anyio.fail_after(15):
            ident = (await initialize(client, url)).headers["acp-connection-id"]
            base = {**AUTH, "Acp-Connection-Id": ident}
            text = await client.post(url, content=b"{}", headers={**base,
                                                                   "Content-Type": "text/plain"})
            batch = await client.post(url, json=[INIT], headers=base)
            junk = await client.post(url, content=b"{nope", headers={
                **base, "Content-Type": "application/json"})
            accept = await client.get(url, headers=base)
            no_id = await client.post(url, json={"jsonrpc": "2.0", "method": "x"}, headers=AUTH)
            unknown = await client.post(url, json={"jsonrpc": "2.0", "method": "x"},
                                        headers={**AUTH, "Acp-Connection-Id": "nope"})
            elsewhere = await client.post(url.replace("/acp", "/other"), json=INIT, headers=AUTH)
    assert text.status_code == 415
    assert batch.status_code == 501
    assert junk.status_code == 400 and junk.json()["error"]["code"] == -32700
    assert accept.status_code == 406
    assert no_id.status_code == 400 and unknown.status_code == 404
    assert elsewhere.status_code == 404


async def test_a_browser_origin_is_refused_unless_allowed_and_then_gets_cors_headers() -> None:
    allowed = "http://localhost:5173"
    async with open_listener(origins=frozenset({allowed})) as (_, url), \
            http_client() as client:
        with anyio.fail_after(15):
            foreign = await initialize(client, url, {**AUTH, "Origin": "https://evil.example"})
            preflight = await client.options(url, headers={"Origin": allowed})
            welcome = await initialize(client, url, {**AUTH, "Origin": allowed})
    assert foreign.status_code == 403 and "evil.example" in foreign.json()["error"]
    assert preflight.status_code == 204
    assert "acp-connection-id" in preflight.headers["access-control-allow-headers"]
    assert welcome.status_code == 200
    assert welcome.headers["access-control-allow-origin"] == allowed
    assert welcome.headers["access-control-expose-headers"] == "acp-connection-id"


async def test_connections_over_the_limit_are_refused() -> None:
    async with open_listener(max_connections=1) as (_, url), http_client() as client:
        with anyio.fail_after(15):
            first = await initialize(client, url)
            second = await initialize(client, url)
            with pytest.raises(httpx_ws.WebSocketUpgradeError) as refused:
                async with httpx_ws.aconnect_ws(url, client, headers=dict(AUTH)):
                    pass
    assert first.status_code == 200
    assert second.status_code == 503 and "max-connections" in second.json()["error"]
    assert refused.value.response.status_code == 503


async def test_a_client_that_hangs_up_before_its_initialize_is_answered_frees_its_place(
        tmp_path: Any) -> None:
    # The answer carries the connection id: a client gone before it can never use (or end)
    # the connection, which held one of the places until the initialize timed out (120 s).
    ready = tmp_path / "ready"
    agent = ["sh", "-c", f'[ -e {ready} ] && exec "$0" -m conductor.demo_agent; cat >/dev/null',
             sys.executable]
    # (a short grace: the first chain's initialize, owed at its EOF, is never answered)
    chain = parse_chain({"conductor": {"shutdown_grace": 0.3}, "agent": {"command": agent}},
                        file="<test>")
    async with open_listener(chain, max_connections=1) as (_, url), \
            http_client() as client:
        with anyio.fail_after(20):
            with pytest.raises(httpx.ReadTimeout):  # its agent never answers: give up
                await client.post(url, json=INIT, headers=AUTH, timeout=0.5)
            ready.touch()  # the next connection's agent answers
            while (second := await initialize(client, url)).status_code == 503:  # noqa: ASYNC110
                await anyio.sleep(0.05)  # (the place frees once the first chain stopped)
    assert second.status_code == 200 and second.json()["result"]["protocolVersion"] == 1


async def test_an_idle_connection_is_closed_and_its_stream_ends() -> None:
    async with open_listener(idle_timeout=0.5) as (_, url), http_client() as client:
        with anyio.fail_after(15):
            ident = (await initialize(client, url)).headers["acp-connection-id"]
            headers = {**AUTH, "Acp-Connection-Id": ident, "Accept": "text/event-stream"}
            async with client.stream("GET", url, headers=headers) as events:
                async for _ in events.aiter_lines():
                    pass  # until the server ends the stream
            gone = await client.delete(url, headers=headers)
    assert gone.status_code == 404


async def test_websocket_carries_the_chain_and_takes_the_token_as_a_subprotocol() -> None:
    async with open_listener() as (_, url), http_client() as client:
        with anyio.fail_after(15):
            async with httpx_ws.aconnect_ws(url, client,
                                            subprotocols=["acp", f"bearer.{TOKEN}"]) as ws:
                assert ws.subprotocol == "acp"  # never the token
                assert ws.response is not None
                assert ws.response.headers["acp-connection-id"]
                await ws.send_text(json.dumps({**INIT, "id": "x"}))
                answer = json.loads(await ws.receive_text())
            with pytest.raises(httpx_ws.WebSocketUpgradeError) as refused:
                async with httpx_ws.aconnect_ws(url, client):
                    pass
    assert answer["id"] == "x" and answer["result"]["protocolVersion"] == 1
    assert refused.value.response.status_code == 401


async def test_a_conductor_reaching_an_agent_chain_as_its_proxy_is_told_to_serve_it_as_one(
        ) -> None:
    # What the hop of a `[[proxy]] url = ...` sends first, to a server started without
    # --as-proxy. Before, the answer said only "`_proxy/initialize` is only sent by the
    # conductor", and the user's client got that, with nothing about the fix.
    async with open_listener() as (_, url), http_client() as client:
        with anyio.fail_after(15):
            async with httpx_ws.aconnect_ws(url, client, headers=dict(AUTH)) as ws:
                await ws.send_text(json.dumps({**INIT, "method": "_proxy/initialize"}))
                answer = json.loads(await ws.receive_text())
    assert answer["error"]["code"] == -32600
    assert "only sent by the conductor" in answer["error"]["data"]
    assert "serve --as-proxy" in answer["error"]["data"]
    assert "acp-conductor proxy" in answer["error"]["data"]


async def test_payload_bytes_cross_a_websocket_hop_unchanged(tmp_path: Any) -> None:
    log = tmp_path / "agent.jsonl"
    agent = [sys.executable, str(BIN / "tee_stdio.py"), str(log), sys.executable, "-m",
             "conductor.demo_agent"]
    params = ('{ "protocolVersion" : 1,"clientCapabilities":{},"x":1e2,"y":"\\u00e9",'
              '"z":123456789012345678901234567890,"_meta":null}')
    async with open_listener(demo_chain(agent)) as (_, url), http_client() as client:
        with anyio.fail_after(15):
            async with httpx_ws.aconnect_ws(url, client, headers=dict(AUTH)) as ws:
                await ws.send_text('{"jsonrpc":"2.0","id":"7","method":"initialize",'
                                   f'"params":{params}}}')
                answer = json.loads(await ws.receive_text())
    received = [json.loads(line)["line"] for line in log.read_text().splitlines()
                if json.loads(line)["dir"] == "recv"]
    assert members(received[0])["params"] == params
    assert answer["id"] == "7"


@pytest.mark.parametrize(("transport", "planted"), [
    ("http", "link"), ("ws", "link"), ("http", "file")])
async def test_a_connection_whose_trace_file_is_a_planted_link_is_answered_and_the_next_served(
        tmp_path: Any, transport: str, planted: str, caplog: pytest.LogCaptureFixture) -> None:
    # where the first connection's trace goes: a link, or a file that is no trace
    victim = tmp_path / ("victim.txt" if planted == "link" else "t.1.jsonl")
    victim.write_text("precious\n", encoding="utf-8")
    if planted == "link":
        (tmp_path / "t.1.jsonl").symlink_to(victim)
    async with open_listener(trace=str(tmp_path / "t.jsonl")) as (ws_url, http_url), \
            http_client() as client:
        with anyio.fail_after(15):
            if transport == "http":
                refused = (await initialize(client, http_url)).json()
            else:
                async with httpx_ws.aconnect_ws(ws_url, client, headers=dict(AUTH)) as ws:
                    await ws.send_text(json.dumps(INIT))
                    refused = json.loads(await ws.receive_text())
            served = (await initialize(client, http_url)).json()  # t.2.jsonl is fine
    assert refused["id"] == 1
    assert refused["error"]["code"] == -32603
    assert "cannot serve this connection" in refused["error"]["message"]
    assert str(tmp_path) not in refused["error"]["message"]  # server paths stay in its log
    assert served["result"]["protocolVersion"] == 1
    assert victim.read_text(encoding="utf-8") == "precious\n"
    assert "Traceback" not in caplog.text
    assert ("is a symbolic link" if planted == "link" else "is there and is not a trace") \
        in caplog.text


async def test_a_websocket_client_sending_binary_pings_and_oversized_frames_is_still_served(
        ) -> None:
    async with open_listener(max_frame_bytes=4096) as (_, url), \
            http_client() as client:
        with anyio.fail_after(15):
            async with httpx_ws.aconnect_ws(url, client, headers=dict(AUTH),
                                            max_message_size_bytes=1 << 20) as ws:
                await ws.send_bytes(b'{"jsonrpc":"2.0","id":"b","method":"initialize"}')
                pong = await ws.ping()
                await pong.wait()
                await ws.send_text(json.dumps({**INIT, "id": "big",
                                               "params": {"pad": "x" * 6000}}))
                oversized = json.loads(await ws.receive_text())
                await ws.send_text(json.dumps({**INIT, "id": "x"}))
                answer = json.loads(await ws.receive_text())
    assert oversized["id"] == "big" and oversized["error"]["data"]["limit"] == 4096
    assert answer["id"] == "x" and answer["result"]["protocolVersion"] == 1


async def test_a_websocket_message_past_twice_the_limit_closes_with_1009_and_the_server_goes_on(
        caplog: pytest.LogCaptureFixture) -> None:
    # A client that does not wait for the close sends more after the message too big:
    # hypercorn 0.18 kept that message's buffer, and the next frame (of the other kind)
    # raised TypeError in its connection task: a traceback on asyncio, the whole server
    # gone on trio.
    async with open_listener(max_frame_bytes=4096) as (_, url), \
            http_client() as client:
        with anyio.fail_after(15):
            async with httpx_ws.aconnect_ws(url, client, headers=dict(AUTH)) as ws:
                await ws.send_text(json.dumps(INIT))
                await ws.receive_text()
                await ws.send_bytes(b"x" * 9000)
                with contextlib.suppress(wsproto.utilities.LocalProtocolError):
                    # (unless the server's close has come back already)
                    await ws.send_text(json.dumps({**INIT, "id": 2}))
                    await ws.send_bytes(b"x" * 10)
                with pytest.raises(httpx_ws.WebSocketDisconnect) as closed:
                    await ws.receive_text()
            assert closed.value.code == 1009
            answer = await initialize(client, url.replace("ws://", "http://"))
    assert answer.json()["result"]["protocolVersion"] == 1
    assert "Traceback" not in caplog.text and "TypeError" not in caplog.text


async def test_a_websocket_client_that_stops_reading_is_dropped_and_its_place_freed() -> None:
    # In memory: the ASGI app with a client whose socket takes nothing (hypercorn's send
    # waits on the TCP window forever). Its chain must see it leave, not wait with it.
    from conductor.jsonrpc.message import Notification, raw
    from conductor.transport.http import AcpEndpoint, Gate, RemoteClient

    connected: list[RemoteClient] = []
    endpoint = AcpEndpoint(Gate(), connected.append, send_timeout=lambda size: 0.2)
    scope = {"type": "websocket", "path": "/acp", "headers": [], "subprotocols": [],
             "client": ("127.0.0.1", 50000)}
    events = [{"type": "websocket.connect"}]
    accepted = anyio.Event()

    async def receive() -> dict[str, Any]:
        if events:
            return events.pop()
        await anyio.sleep_forever()
        raise AssertionError

    async def send(event: Any) -> None:
        if event["type"] == "websocket.accept":
            accepted.set()
        else:
            await anyio.sleep_forever()  # the peer reads nothing: every send waits

    with anyio.fail_after(10):
        async with anyio.create_task_group() as tg:
            tg.start_soon(endpoint, scope, receive, send)
            await accepted.wait()
            [client] = connected
            with pytest.raises(anyio.BrokenResourceError):
                await client.send(Notification(method="x", params=raw({})))

            async def handle(item: object) -> None:
                raise AssertionError(f"the client sent nothing: {item}")
            await client.serve(handle)  # its input ended: the chain stops
            client.finish()  # what the listener does once the chain has stopped
    assert endpoint.clients == {}


async def test_two_messages_in_one_websocket_message_each_get_their_answer() -> None:
    # A client that reuses a stdio writer sends newline-delimited messages in one text
    # message. Before, the whole message was "not JSON" (trailing characters): the first
    # request got -32700 and the second no answer at all, its sender waiting for ever.
    second = {"jsonrpc": "2.0", "id": "b", "method": "session/new",
              "params": {"cwd": "/", "mcpServers": []}}
    async with open_listener() as (url, _), http_client() as client:
        with anyio.fail_after(15):
            async with httpx_ws.aconnect_ws(url, client, headers=dict(AUTH)) as ws:
                await ws.send_text(json.dumps({**INIT, "id": "a"}) + "\r\n"
                                   + json.dumps(second) + "\n")
                answers = {}
                while len(answers) < 2:
                    message = json.loads(await ws.receive_text())
                    if "id" in message:
                        answers[message["id"]] = message
    assert answers["a"]["result"]["protocolVersion"] == 1
    assert "sessionId" in answers["b"]["result"]


@pytest.mark.parametrize(("change", "rule"), [
    ({"jsonrpc": "1.0"}, '"jsonrpc" must be "2.0"'),
    ({"params": "protocolVersion=1"}, "params must be an object or an array"),
    ({"result": {}}, "cannot carry result or error"),
])
async def test_an_initialize_post_that_breaks_a_json_rpc_rule_is_told_which(
        change: dict[str, Any], rule: str) -> None:
    # Before, the answer was 400 "no Acp-Connection-Id header (POST initialize first)": the
    # client had posted initialize, and learnt nothing of what was wrong with it.
    async with open_listener() as (_, url), http_client() as client:
        with anyio.fail_after(15):
            refused = await client.post(url, json={**INIT, **change}, headers=AUTH)
    assert refused.status_code == 400
    assert "acp-connection-id" not in refused.headers
    answer = refused.json()
    assert answer["id"] == 1 and answer["error"]["code"] == -32600
    assert rule in answer["error"]["data"]


async def test_a_blank_websocket_message_is_no_message_as_a_blank_line_is_none() -> None:
    # Before, each got a -32700 with id null: an error the client had not asked for.
    async with open_listener() as (url, _), http_client() as client:
        with anyio.fail_after(15):
            async with httpx_ws.aconnect_ws(url, client, headers=dict(AUTH)) as ws:
                for blank in ["", "\n", " \r\n\t"]:
                    await ws.send_text(blank)
                await ws.send_text(json.dumps(INIT))
                first = json.loads(await ws.receive_text())
    assert first["id"] == 1 and first["result"]["protocolVersion"] == 1


async def test_every_post_refused_with_a_json_rpc_body_is_logged_with_its_status(
        caplog: pytest.LogCaptureFixture) -> None:
    # docs/remote.md: every refusal is logged (method, path, peer, reason, status), those
    # answered with a JSON-RPC error body too: not JSON, a batch, over the size limit.
    caplog.set_level(logging.INFO, logger="acp_conductor")
    json_body = {**AUTH, "Content-Type": "application/json"}
    async with open_listener(max_frame_bytes=1024) as (_, url), http_client() as client:
        with anyio.fail_after(15):
            not_json = await client.post(url, content=b"{x", headers=json_body)
            batch = await client.post(url, json=[INIT], headers=json_body)
            too_big = await client.post(url, json={**INIT, "pad": "x" * 4096},
                                        headers=json_body)
            broken = await client.post(url, json={**INIT, "jsonrpc": "1.0"},
                                       headers=json_body)
    assert [not_json.status_code, batch.status_code, too_big.status_code,
            broken.status_code] == [400, 501, 413, 400]
    refusals = [r.getMessage() for r in caplog.records
                if r.getMessage().startswith("refused POST")]
    for status in ("(400)", "(501)", "(413)"):
        assert any(line.endswith(status) for line in refusals), (status, refusals)
    assert sum(line.endswith("(400)") for line in refusals) == 2, refusals
    assert all("127.0.0.1" in line for line in refusals), refusals


async def test_a_request_cut_short_by_the_server_stopping_is_answered_saying_so(
        caplog: pytest.LogCaptureFixture) -> None:
    # The chain is still starting (its agent is slow to come up) when the server is told
    # to stop: the client's initialize is answered, and the reason is the server's stop,
    # not "the client closed its input", which this client never did.
    started = anyio.Event()

    class Started(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            if record.getMessage().startswith("started agent"):
                started.set()

    caplog.set_level(logging.INFO, logger="acp_conductor")
    logging.getLogger("acp_conductor").addHandler(watch := Started())
    slow = parse_chain({"conductor": {"shutdown_grace": 0.2}, "agent": {"command": [
        sys.executable, "-c", "import time; time.sleep(30)"]}}, file="<test>")
    stop = anyio.Event()
    try:
        async with open_listener(slow, stop=stop) as (ws_url, _), http_client() as http:
            with anyio.fail_after(20):
                async with httpx_ws.aconnect_ws(ws_url.replace("ws:", "http:"), http,
                                                headers=dict(AUTH)) as ws:
                    await ws.send_text(json.dumps(INIT))
                    await started.wait()
                    stop.set()
                    answer = json.loads(await ws.receive_text())
    finally:
        logging.getLogger("acp_conductor").removeHandler(watch)
    assert answer["id"] == 1
    assert "the client closed its input" not in answer["error"]["message"]
    assert "shutting down (the server was stopped)" in answer["error"]["message"]


async def test_every_refused_post_is_logged_with_its_status_and_reason(
        caplog: pytest.LogCaptureFixture) -> None:
    # docs/remote.md: "Every refusal is logged (method, path, peer, reason, status)". The
    # ones answered with a JSON-RPC error body were not: a server's log showed nothing.
    caplog.set_level(logging.INFO, logger="acp_conductor")
    async with open_listener(max_frame_bytes=1000) as (_, url), http_client() as client:
        with anyio.fail_after(15):
            ident = (await initialize(client, url)).headers["acp-connection-id"]
            base = {**AUTH, "Acp-Connection-Id": ident}
            batch = await client.post(url, json=[INIT], headers=base)
            junk = await client.post(url, content=b"{nope", headers={
                **base, "Content-Type": "application/json"})
            big = await client.post(url, json={**INIT, "pad": "x" * 2000}, headers=base)
            broken = await client.post(url, json={**INIT, "jsonrpc": "1.0"}, headers=AUTH)
    logged = [r.getMessage() for r in caplog.records if r.getMessage().startswith("refused")]
    for answer in (batch, junk, big, broken):
        assert any(line.startswith("refused POST /acp from 127.0.0.1:")
                   and line.endswith(f"({answer.status_code})") for line in logged), \
            (answer.status_code, logged)
    assert {batch.status_code, junk.status_code, big.status_code, broken.status_code} \
        == {501, 400, 413}


async def test_closing_a_websocket_whose_client_stopped_reading_does_not_wait_for_it() -> None:
    # The chain ends (idle, a signal, its agent crashed) and closes the socket: the close
    # frame queues behind what the client never read. Waiting for it (shielded, in the
    # chain's shutdown) held the chain, its place, and a stopping server, for ever.
    from conductor.transport.http import AcpEndpoint, Gate, RemoteClient

    connected: list[RemoteClient] = []
    endpoint = AcpEndpoint(Gate(), connected.append, send_timeout=lambda size: 0.2)
    scope = {"type": "websocket", "path": "/acp", "headers": [], "subprotocols": [],
             "client": ("127.0.0.1", 50000)}
    events = [{"type": "websocket.connect"}]
    accepted = anyio.Event()

    async def receive() -> dict[str, Any]:
        if events:
            return events.pop()
        await anyio.sleep_forever()
        raise AssertionError

    async def send(event: Any) -> None:
        if event["type"] == "websocket.accept":
            accepted.set()
        else:
            await anyio.sleep_forever()  # the peer reads nothing: every send waits

    with anyio.fail_after(10):
        async with anyio.create_task_group() as tg:
            tg.start_soon(endpoint, scope, receive, send)
            await accepted.wait()
            [client] = connected
            with anyio.CancelScope(shield=True):  # as the chain's shutdown closes it
                await client.aclose()
            client.finish()
    assert endpoint.clients == {}


async def test_an_initialize_the_chain_does_not_answer_in_time_is_logged_with_its_504(
        caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch) -> None:
    import conductor.transport.http as http_transport

    monkeypatch.setattr(http_transport, "INITIALIZE_TIMEOUT", 0.3)
    caplog.set_level(logging.INFO, logger="acp_conductor")
    slow = parse_chain({"conductor": {"shutdown_grace": 0.2}, "agent": {"command": [
        sys.executable, "-c", "import time; time.sleep(30)"]}}, file="<test>")
    async with open_listener(slow) as (_, url), http_client() as client:
        with anyio.fail_after(20):
            answer = await initialize(client, url)
    assert answer.status_code == 504
    assert any("did not answer initialize" in r.getMessage() and "(504)" in r.getMessage()
               for r in caplog.records), caplog.text
