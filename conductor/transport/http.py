"""ACP's remote transport, server side: one `/acp` endpoint speaking WebSocket and
Streamable HTTP (agentclientprotocol's RFD "Streamable HTTP & WebSocket Transport"), as an
ASGI application that hypercorn serves (`serve_asgi`).

- `GET` with `Upgrade: websocket`: one JSON-RPC message per text frame, both ways; the
  accept carries `Acp-Connection-Id`; binary frames are ignored.
- `POST` of `initialize` (no `Acp-Connection-Id`) opens a connection: 200, the answer as
  the JSON body, `Acp-Connection-Id` in a header. Every other POST names its connection
  and answers 202; what the chain sends back travels on a `GET` SSE stream: the
  connection's, or a session's (`Acp-Session-Id`) while one is open for that session
  (which may be opened before the session/load that makes it known). Session-scoped
  methods must carry `Acp-Session-Id` (400), naming a session of this connection (404).
  Batches get 501.
- `DELETE` ends the connection.

Every client connection is a `RemoteClient`: a MessageSink (what the chain sends to the
client) and a MessageSource (what the client sends), handed to `on_connect`. The layer
above serves one chain on it and calls `finish()` when that chain is done. Authentication
(bearer tokens), `Origin` and the connection limit are the `Gate`'s; a refusal is logged
with the reason, never with a token.
"""

from __future__ import annotations

import hmac
import logging
import secrets
from collections.abc import Awaitable, Callable, Iterable, MutableMapping, Sequence
from typing import TYPE_CHECKING, Any

import anyio
from msgspec import UNSET

from conductor import acp
from conductor.jsonrpc.codes import ErrorCode
from conductor.jsonrpc.framing import DEFAULT_MAX_FRAME_BYTES
from conductor.jsonrpc.message import (
    Batch,
    InvalidMessage,
    Message,
    Notification,
    Request,
    Response,
    encode,
    encode_batch,
    error_response,
    raw,
)
from conductor.record import Record
from conductor.transport.base import (
    NotJson,
    Oversized,
    Unreadable,
    decode_lines,
    decode_whole,
    on_one_line,
)
from conductor.transport.websocket import allowed_send_time, stalled, text_of

if TYPE_CHECKING:
    import socket

    from anyio.streams.memory import MemoryObjectReceiveStream, MemoryObjectSendStream

    from conductor.transport.base import Handle, HandleNowait, Incoming

log = logging.getLogger("acp_conductor.remote")

PATH = "/acp"
CONNECTION_ID = "acp-connection-id"
SESSION_ID = "acp-session-id"
SSE_KEEPALIVE = 15.0
INITIALIZE_TIMEOUT = 120.0  # the components start meanwhile: `npx` may download first
# Frames held for a stream nobody reads yet; then the chain waits (backpressure), but no
# longer than `allowed_send_time` per frame: a client that stops reading is dropped.
OUTBOX = 256
INBOX = 16
# Methods that act on a session the client already has: their POST names it (the RFD).
SESSION_SCOPED = frozenset({acp.SESSION_PROMPT, acp.SESSION_CANCEL, acp.SESSION_CLOSE,
                            "session/set_mode", "session/set_model",
                            "session/set_config_option"})
_OPENS = frozenset({acp.INITIALIZE, *acp.PROXY_INITIALIZE_METHODS})
_GONE = (anyio.BrokenResourceError, anyio.ClosedResourceError, OSError)

Scope = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[MutableMapping[str, Any]]]
Send = Callable[[MutableMapping[str, Any]], Awaitable[None]]


class Refusal(Exception):
    """A request the endpoint will not serve: its HTTP status and why (logged, and sent)."""

    def __init__(self, status: int, reason: str, headers: Sequence[tuple[str, str]] = ()) -> None:
        self.status, self.reason, self.headers = status, reason, tuple(headers)
        super().__init__(reason)


class Gate(Record, frozen=True):
    """Who may connect: bearer tokens (empty: no authentication), the browser origins
    allowed (a request without `Origin` is not from a browser page), and how many
    connections may be open at once."""

    tokens: tuple[str, ...] = ()
    origins: frozenset[str] = frozenset()
    max_connections: int = 16

    def admit(self, scope: Scope) -> int:
        """The index of the token the request carries (0 without authentication).

        Raises:
            Refusal: no token, a wrong one, or an origin that is not allowed.
        """
        self.check_origin(scope)
        if not self.tokens:
            return 0
        offered = _bearer(scope)
        if offered is None:
            raise Refusal(401, "no bearer token (send `Authorization: Bearer TOKEN`, or the "
                               "WebSocket subprotocol `bearer.TOKEN`)",
                          [("www-authenticate", "Bearer")])
        found = -1
        for i, token in enumerate(self.tokens):  # compare with every one: no timing hint
            if hmac.compare_digest(offered.encode(), token.encode()):
                found = i
        if found < 0:
            raise Refusal(401, "wrong bearer token", [("www-authenticate", "Bearer")])
        return found

    def check_origin(self, scope: Scope) -> None:
        """Raises Refusal: a browser page from an origin not in `--allow-origin`."""
        origin = _header(scope, "origin")
        if origin is not None and origin not in self.origins:
            raise Refusal(403, f"origin {origin!r} is not allowed (serve --allow-origin)")


def _header(scope: Scope, name: str) -> str | None:
    wanted = name.encode()
    for key, value in scope.get("headers", ()):
        if key.lower() == wanted:
            return bytes(value).decode("latin-1")
    return None


def _bearer(scope: Scope) -> str | None:
    authorization = _header(scope, "authorization")
    if authorization is not None:
        scheme, _, value = authorization.strip().partition(" ")
        return value.strip() if scheme.lower() == "bearer" and value.strip() else None
    for protocol in scope.get("subprotocols", ()):  # browsers cannot set headers on a socket
        if protocol.startswith("bearer."):
            return str(protocol[len("bearer."):])
    return None


def _peer(scope: Scope) -> str:
    client = scope.get("client")
    return f"{client[0]}:{client[1]}" if client else "?"


# -- connections ------------------------------------------------------------------------------


class RemoteClient:
    """One client connection: the chain's client hop sends to it, and serves from it."""

    transport = "?"

    def __init__(self, peer: str, owner: int, *, max_frame_bytes: int) -> None:
        self.id = secrets.token_urlsafe(18)
        self.peer = peer
        self.owner = owner
        self.max_frame_bytes = max_frame_bytes
        self.finished = anyio.Event()
        self.last_activity = anyio.current_time()
        self._open_requests: set[bytes] = set()  # the client's, not answered yet
        self._inbox_send, self._inbox = anyio.create_memory_object_stream[Any](INBOX)
        self._on_finish: list[Callable[[], None]] = []
        # Why the server ended the client's input (shutdown, idle, not reading); None when
        # the client ended it. The chain says it in the answers it could not give.
        self.ended_because: str | None = None

    # -- MessageSink (each transport's own) -----------------------------------------------

    async def send(self, item: Message | list[Message]) -> None:
        raise NotImplementedError

    async def aclose(self) -> None:
        raise NotImplementedError

    # -- MessageSource -----------------------------------------------------------------------

    async def serve(self, handle: Handle, nowait: HandleNowait | None = None) -> None:
        async with self._inbox:
            async for item in self._inbox:
                if nowait is None or not nowait(item):
                    await handle(item)

    async def deliver(self, item: Incoming) -> None:
        """What the client sent, in the order it arrived. Raises anyio.BrokenResourceError
        when the connection has ended."""
        self.last_activity = anyio.current_time()
        for message in item.items if isinstance(item, Batch) else [item]:
            if isinstance(message, Request):
                self._open_requests.add(bytes(message.id))
        try:
            await self._inbox_send.send(item)
        except (anyio.ClosedResourceError, anyio.BrokenResourceError):
            raise anyio.BrokenResourceError from None

    def _sent(self, item: Message | list[Message]) -> None:
        self.last_activity = anyio.current_time()
        for message in item if isinstance(item, list) else [item]:
            if isinstance(message, Response):
                self._open_requests.discard(bytes(message.id))

    @property
    def busy(self) -> bool:
        """A request of the client's is still being worked on: not idle, however quiet."""
        return bool(self._open_requests)

    def end(self, why: str | None = None) -> None:
        """End the client's input (DELETE, idle, shutdown): the chain sees EOF and stops.
        `why`: the server's reason, when it was not the client's doing."""
        if why is not None and self.ended_because is None and not self.finished.is_set():
            self.ended_because = why
        self._inbox_send.close()

    def when_finished(self, callback: Callable[[], None]) -> None:
        self._on_finish.append(callback)

    def finish(self) -> None:
        """The chain serving this connection is done (called by whoever served it)."""
        self.end()
        self._inbox.close()
        if not self.finished.is_set():
            self.finished.set()
            for callback in self._on_finish:
                callback()


class WsClient(RemoteClient):
    """A WebSocket client: every message one text frame."""

    transport = "ws"

    def __init__(self, peer: str, owner: int, send: Send, *, max_frame_bytes: int,
                 timeout: Callable[[int], float] = allowed_send_time) -> None:
        super().__init__(peer, owner, max_frame_bytes=max_frame_bytes)
        self._send = send
        self._timeout = timeout
        self._closed = False

    async def send(self, item: Message | list[Message]) -> None:
        if self._closed:
            raise anyio.BrokenResourceError
        text = text_of(item)
        waited = self._timeout(len(text))
        try:
            # A client that stops reading would hold this send (and its chain, and its
            # place under --max-connections) for as long as it keeps the socket.
            with anyio.move_on_after(waited) as late:
                await self._send({"type": "websocket.send", "text": text})
        except Exception as e:  # whatever the server says about a gone socket
            self._closed = True
            raise anyio.BrokenResourceError from e
        if late.cancelled_caught:
            log.warning("ws client %s: %s; dropping it", self.id, stalled(waited))
            self._closed = True  # no close frame: it would wait behind the stuck message
            self.end("the client stopped reading")  # its chain stops as if it had left
            raise anyio.BrokenResourceError
        self._sent(item)

    def disconnected(self) -> None:
        """The client closed the socket: nothing more can be sent, not even a close."""
        self._closed = True

    async def aclose(self) -> None:
        if self._closed:
            return
        self._closed = True
        # Bounded as any send: the close frame waits behind what a client that stopped
        # reading left unread, and the chain's shutdown (shielded) waits for this.
        with anyio.move_on_after(self._timeout(2)):
            try:
                await self._send({"type": "websocket.close", "code": 1000})
            except Exception:  # already closed by the client: nothing to say
                pass


class HttpClient(RemoteClient):
    """A Streamable HTTP client: messages in by POST, out on SSE streams."""

    transport = "http"

    def __init__(self, peer: str, owner: int, *, max_frame_bytes: int,
                 timeout: Callable[[int], float] = allowed_send_time) -> None:
        super().__init__(peer, owner, max_frame_bytes=max_frame_bytes)
        self._timeout = timeout
        self._main_send, self._main = anyio.create_memory_object_stream[bytes](OUTBOX)
        self._main_reader: anyio.CancelScope | None = None
        self._session_streams: dict[str, MemoryObjectSendStream[bytes]] = {}
        self._session_readers: dict[str, anyio.CancelScope] = {}
        # Each session stream's queue outlives one GET: a newer GET reads on from it, in order.
        self._session_sources: dict[str, MemoryObjectReceiveStream[bytes]] = {}
        # Sessions whose closed stream's queue is being moved to the connection's stream:
        # their next events wait for that, or they would overtake the ones queued before.
        self._handing_back: dict[str, anyio.Event] = {}
        self.sessions: set[str] = set()
        self._request_session: dict[bytes, str] = {}
        self._closing: set[bytes] = set()  # requests that end their session when answered
        self._initialize: bytes | None = None
        self.closed = False  # the chain said its last word: the streams end
        self.initialized = anyio.Event()  # the initialize answer came, or the chain ended
        self.initialize_answer: Response | None = None
        self.when_finished(self._finished)

    def _finished(self) -> None:
        self.initialized.set()
        self._main_send.close()
        self._main.close()

    def expect_initialize(self, request: Request) -> None:
        self._initialize = bytes(request.id)

    def note_request(self, message: Request | Notification, session: str | None) -> None:
        """Remember what the client's request is about, to route its answer."""
        if session is None:
            return
        if message.method in (acp.SESSION_LOAD, acp.SESSION_RESUME):
            self.sessions.add(session)  # its replayed updates may come before the answer
        if isinstance(message, Request):
            self._request_session[bytes(message.id)] = session
            if message.method in (acp.SESSION_CLOSE, acp.SESSION_DELETE):
                self._closing.add(bytes(message.id))

    async def send(self, item: Message | list[Message]) -> None:
        session: str | None = None
        ended: str | None = None  # the session this answer closes: its stream ends after it
        if isinstance(item, Response):
            key = bytes(item.id)
            if key == self._initialize:
                self._initialize = None
                self._sent(item)
                self.initialize_answer = item
                self.initialized.set()
                return
            session = self._request_session.pop(key, None)
            if key in self._closing:
                self._closing.discard(key)
                if session is not None and not item.is_error:
                    # Closed: forgotten (a connection that opens and closes sessions for
                    # hours keeps none of them), and its id is no longer accepted.
                    self.sessions.discard(session)
                    ended = session
            opened = acp.get_str(item.result, "sessionId") if item.result is not UNSET \
                else None
            if opened is not None:
                # Answers that open a session go on the connection stream: the client has
                # no stream for that session yet.
                self.sessions.add(opened)
                session = None
        elif isinstance(item, Notification | Request):
            session = acp.get_str(item.params, "sessionId")
        data = encode(item) if isinstance(item, Message) else encode_batch(item)
        frame = b"data: " + on_one_line(data[:-1]) + b"\n\n"  # a bare CR would end the event's line
        waited = self._timeout(len(frame))
        # A client that stops reading its stream fills the outbox: without a bound this
        # send (and its chain, and its place under --max-connections) would wait for as
        # long as it keeps the socket.
        with anyio.move_on_after(waited) as late:
            while True:
                handing_back = self._handing_back.get(session) if session is not None else None
                if handing_back is not None:
                    await handing_back.wait()
                stream = self._session_streams.get(session) if session is not None else None
                try:
                    await (stream or self._main_send).send(frame)
                    break
                except (anyio.BrokenResourceError, anyio.ClosedResourceError):
                    if stream is None:
                        raise anyio.BrokenResourceError from None
                    # That session's stream closed meanwhile: the connection's stream takes it.
        if late.cancelled_caught:
            self._drop(stalled(waited))
            raise anyio.BrokenResourceError
        self._sent(item)
        if ended is not None and (sink := self._session_streams.pop(ended, None)) is not None:
            # Its GET sends what is queued, this answer last, and ends: a client that opens
            # and closes sessions for hours is not left holding a stream for each.
            sink.close()

    def _drop(self, why: str) -> None:
        """The client stopped reading (`why`): drop it as if it had left. Its streams end
        (what they still hold is not handed anywhere: nobody reads it), the GETs stuck
        writing to it are cancelled (the server then closes their sockets), its input
        ends (its chain stops) and what it sends next is refused: the connection has ended."""
        log.warning("http client %s: %s; dropping it", self.id, why)
        self.closed = True
        self._main_send.close()
        for stream in self._session_streams.values():
            stream.close()
        for reader in [self._main_reader, *self._session_readers.values()]:
            if reader is not None:
                reader.cancel()
        self.end("the client stopped reading")

    async def aclose(self) -> None:
        self.closed = True
        self._main_send.close()
        for stream in self._session_streams.values():
            stream.close()

    async def stream(self, session: str | None, send: Send, receive: Receive) -> None:
        """Serve one GET: SSE events until the connection ends or the client goes away. A
        newer GET for the same stream replaces this one, and reads on from the events this
        one had not sent yet."""
        # Registered before the first await: the reader it replaces must see it is not the
        # last one when it unwinds, or it would close the stream under this one.
        reader = anyio.CancelScope()
        if session is None:
            if self._main_reader is not None:
                self._main_reader.cancel()
            self._main_reader = reader
            source = self._main.clone()
        else:
            old = self._session_readers.get(session)
            if old is not None:
                old.cancel()
            self._session_readers[session] = reader
            if session not in self._session_sources:
                sink, self._session_sources[session] = \
                    anyio.create_memory_object_stream[bytes](OUTBOX)
                self._session_streams[session] = sink
            source = self._session_sources[session].clone()
        try:
            await send({"type": "http.response.start", "status": 200, "headers": [
                (b"content-type", b"text/event-stream"), (b"cache-control", b"no-cache"),
                (b"x-accel-buffering", b"no")]})
            await send({"type": "http.response.body", "body": b": stream open\n\n",
                        "more_body": True})
            with reader:
                async with anyio.create_task_group() as tg:
                    tg.start_soon(_cancel_on_disconnect, receive, tg.cancel_scope)
                    await _pump_sse(source, send)
                    tg.cancel_scope.cancel()
        finally:
            if session is not None and self._session_readers.get(session) is reader:
                # The last reader of this session's stream: what is queued goes to the
                # connection's stream, and so does what comes next.
                del self._session_readers[session]
                if session in self._session_streams:  # not when its session closed
                    self._session_streams.pop(session).close()
                self._session_sources.pop(session).close()
                self._handing_back[session] = handed = anyio.Event()
                try:
                    with anyio.CancelScope(shield=True):
                        await self._hand_back(source)
                finally:
                    if self._handing_back.get(session) is handed:  # not a newer GET's
                        del self._handing_back[session]
                    handed.set()
            source.close()
        if not reader.cancelled_caught:
            try:
                await send({"type": "http.response.body", "body": b"", "more_body": False})
            except Exception:  # the client left first
                pass

    async def _hand_back(self, source: MemoryObjectReceiveStream[bytes]) -> None:
        """A session's stream closed with events still queued: the connection's stream
        carries them, each within the time any send has; one it cannot take in that time
        means the client stopped reading (it is dropped: not events lost without a word)."""
        while True:
            try:
                frame = source.receive_nowait()
            except (anyio.WouldBlock, anyio.EndOfStream, anyio.ClosedResourceError):
                return
            waited = self._timeout(len(frame))
            with anyio.move_on_after(waited) as late:
                try:
                    await self._main_send.send(frame)
                except _GONE:
                    return
            if late.cancelled_caught:
                self._drop(stalled(waited))
                return


async def _pump_sse(source: MemoryObjectReceiveStream[bytes], send: Send) -> None:
    while True:
        with anyio.move_on_after(SSE_KEEPALIVE) as quiet:
            try:
                frame = await source.receive()
            except (anyio.EndOfStream, anyio.ClosedResourceError):
                return
        if quiet.cancelled_caught:  # intermediaries drop streams that say nothing
            frame = b": keepalive\n\n"
        await send({"type": "http.response.body", "body": frame, "more_body": True})


async def _cancel_on_disconnect(receive: Receive, scope: anyio.CancelScope) -> None:
    while (await receive())["type"] != "http.disconnect":
        pass
    scope.cancel()


# -- the endpoint -----------------------------------------------------------------------------


class AcpEndpoint:
    """The ASGI application serving `/acp`. `on_connect` is called (not awaited) with each
    new client connection; it must arrange for a chain to serve it and call `finish()`."""

    def __init__(self, gate: Gate, on_connect: Callable[[RemoteClient], None], *,
                 max_frame_bytes: int = DEFAULT_MAX_FRAME_BYTES,
                 send_timeout: Callable[[int], float] = allowed_send_time) -> None:
        self.gate = gate
        self.on_connect = on_connect
        self.max_frame_bytes = max_frame_bytes
        self.send_timeout = send_timeout
        self.clients: dict[str, RemoteClient] = {}

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        kind = scope["type"]
        if kind == "lifespan":
            await lifespan(receive, send)
        elif kind == "websocket":
            await self._websocket(scope, receive, send)
        elif kind == "http":
            try:
                await self._http(scope, receive, send)
            except Refusal as refusal:
                self._log_refusal(scope, refusal)
                await _json(send, refusal.status, {"error": refusal.reason},
                            [*refusal.headers, *self._cors(scope)])

    async def _answer_refusal(self, scope: Scope, send: Send, status: int, reason: str,
                              body: bytes, cors: list[tuple[str, str]]) -> None:
        """A refusal whose body is a JSON-RPC error: logged as every refusal is."""
        self._log_refusal(scope, Refusal(status, reason))
        await _json(send, status, body, cors)

    def _log_refusal(self, scope: Scope, refusal: Refusal) -> None:
        what = "WebSocket" if scope["type"] == "websocket" else scope.get("method", "?")
        log.warning("refused %s %s from %s: %s (%d)", what, scope.get("path", "?"),
                    _peer(scope), refusal.reason, refusal.status)

    def _cors(self, scope: Scope) -> list[tuple[str, str]]:
        origin = _header(scope, "origin")
        if origin is None or origin not in self.gate.origins:
            return []
        return [("access-control-allow-origin", origin), ("vary", "origin"),
                ("access-control-expose-headers", "acp-connection-id")]

    def _check_room(self) -> None:
        if len(self.clients) >= self.gate.max_connections:
            raise Refusal(503, f"{self.gate.max_connections} connections are open already "
                               "(serve --max-connections)")

    def _open(self, client: RemoteClient) -> None:
        self.clients[client.id] = client

        def forget() -> None:
            self.clients.pop(client.id, None)
        client.when_finished(forget)
        log.info("%s client %s connected from %s", client.transport, client.id, client.peer)
        self.on_connect(client)

    # -- WebSocket ----------------------------------------------------------------------------

    async def _websocket(self, scope: Scope, receive: Receive, send: Send) -> None:
        if (await receive())["type"] != "websocket.connect":
            return
        try:
            if scope.get("path") != PATH:
                raise Refusal(404, f"no ACP endpoint at {scope.get('path')!r} (it is {PATH})")
            owner = self.gate.admit(scope)
            self._check_room()
            client = WsClient(_peer(scope), owner, send, max_frame_bytes=self.max_frame_bytes,
                              timeout=self.send_timeout)
            self._open(client)
        except Refusal as refusal:
            self._log_refusal(scope, refusal)
            await _deny_websocket(scope, send, refusal)
            return
        offered = [p for p in scope.get("subprotocols", ()) if not p.startswith("bearer.")]
        await send({"type": "websocket.accept",
                    "subprotocol": offered[0] if offered else None,  # never the token
                    "headers": [(CONNECTION_ID.encode(), client.id.encode())]})
        try:
            async with anyio.create_task_group() as tg:
                tg.start_soon(self._read_frames, client, receive)
                await client.finished.wait()
                tg.cancel_scope.cancel()
        finally:
            client.finish()

    async def _read_frames(self, client: WsClient, receive: Receive) -> None:
        try:
            while True:
                event = await receive()
                if event["type"] == "websocket.disconnect":
                    log.info("ws client %s disconnected", client.id)
                    client.disconnected()
                    return
                text = event.get("text")
                if text is None:
                    continue  # binary frames carry nothing in ACP: ignored, as the RFD says
                try:
                    for item in decode_lines(text.encode(), client.max_frame_bytes):
                        await client.deliver(item)
                except anyio.BrokenResourceError:
                    return
        finally:
            client.end()

    # -- Streamable HTTP ----------------------------------------------------------------------

    async def _http(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope.get("path") != PATH:
            raise Refusal(404, f"no ACP endpoint at {scope.get('path')!r} (it is {PATH})")
        method = scope["method"]
        if method == "OPTIONS":  # a browser's CORS preflight: no credentials on it
            self.gate.check_origin(scope)
            await _json(send, 204, None, [
                *self._cors(scope), ("access-control-allow-methods", "GET, POST, DELETE"),
                ("access-control-allow-headers",
                 "authorization, content-type, acp-connection-id, acp-session-id"),
                ("access-control-max-age", "600")])
            return
        owner = self.gate.admit(scope)
        if method == "POST":
            await self._post(scope, receive, send, owner)
        elif method == "GET":
            if "text/event-stream" not in (_header(scope, "accept") or ""):
                raise Refusal(406, "GET opens an event stream: send Accept: text/event-stream "
                                   "(or Upgrade: websocket)")
            client = self._client_of(scope, owner)
            # A session's stream may open before the session is known here: a client opens
            # it, then POSTs the session/load (or resume) whose replay it is to carry (the
            # TypeScript SDK does). It carries this connection's traffic only: for a session
            # the chain never opens, nothing.
            session = _header(scope, SESSION_ID)
            await client.stream(session, _with_headers(send, self._cors(scope)), receive)
        elif method == "DELETE":
            client = self._client_of(scope, owner)
            log.info("http client %s ended the connection", client.id)
            client.end()
            await _json(send, 202, None, self._cors(scope))
        else:
            raise Refusal(405, f"{method} is not part of ACP's HTTP transport",
                          [("allow", "GET, POST, DELETE")])

    def _client_of(self, scope: Scope, owner: int) -> HttpClient:
        ident = _header(scope, CONNECTION_ID)
        if ident is None:
            raise Refusal(400, "no Acp-Connection-Id header (POST initialize first)")
        client = self.clients.get(ident)
        if not isinstance(client, HttpClient) or client.closed:
            raise Refusal(404, "unknown Acp-Connection-Id (or the connection has ended)")
        if client.owner != owner:
            raise Refusal(403, "this connection was opened with another token")
        return client

    async def _post(self, scope: Scope, receive: Receive, send: Send, owner: int) -> None:
        content_type = (_header(scope, "content-type") or "").split(";")[0].strip().lower()
        if content_type != "application/json":
            raise Refusal(415, "POST a JSON-RPC message as Content-Type: application/json")
        cors = self._cors(scope)
        item = decode_whole(await _read_body(receive, self.max_frame_bytes),
                            self.max_frame_bytes)
        if isinstance(item, Oversized):
            why = f"a message of over {item.limit} bytes, the limit on messages"
            await self._answer_refusal(scope, send, 413, why, _error(
                item.head.id, ErrorCode.FRAME_TOO_LARGE, why, {"limit": item.limit}), cors)
            return
        if isinstance(item, NotJson):
            await self._answer_refusal(scope, send, 400, f"not JSON: {item.reason}", _error(
                None, ErrorCode.PARSE_ERROR, "Parse error", item.reason), cors)
            return
        if isinstance(item, Unreadable):
            await self._answer_refusal(scope, send, 400, item.reason, _error(
                item.head.id, item.code, item.reason), cors)
            return
        if isinstance(item, Batch):
            why = "batches are not supported over HTTP (the RFD); send one message per POST"
            await self._answer_refusal(scope, send, 501, why, _error(
                None, ErrorCode.INVALID_REQUEST, why), cors)
            return
        if _header(scope, CONNECTION_ID) is None and isinstance(item, Request) \
                and item.method in _OPENS:
            await self._initialize(scope, receive, send, owner, item, cors)
            return
        if _header(scope, CONNECTION_ID) is None and isinstance(item, InvalidMessage):
            # No connection to answer on (a malformed initialize, usually): the rule it
            # breaks is the answer, not "POST initialize first".
            await self._answer_refusal(scope, send, 400, item.reason, _error(
                item.id if item.call_shaped else None, ErrorCode.INVALID_REQUEST,
                "Invalid Request", item.reason), cors)
            return
        client = self._client_of(scope, owner)
        if isinstance(item, Request | Notification):
            session = _header(scope, SESSION_ID)
            named = acp.get_str(item.params, "sessionId")
            if item.method in SESSION_SCOPED:
                if session is None:
                    raise Refusal(400, f"{item.method} needs an Acp-Session-Id header")
                if named is not None and named != session:
                    raise Refusal(400, "Acp-Session-Id differs from params.sessionId")
            if session is not None and session not in client.sessions \
                    and item.method not in (acp.SESSION_LOAD, acp.SESSION_RESUME):
                raise Refusal(404, "unknown Acp-Session-Id for this connection")
            client.note_request(item, named)
        elif isinstance(item, InvalidMessage):
            pass  # the chain answers it, on the stream
        try:
            await client.deliver(item)
        except anyio.BrokenResourceError:
            raise Refusal(404, "the connection has ended") from None
        await _json(send, 202, None, cors)

    async def _initialize(self, scope: Scope, receive: Receive, send: Send, owner: int,
                          request: Request, cors: list[tuple[str, str]]) -> None:
        self._check_room()
        client = HttpClient(_peer(scope), owner, max_frame_bytes=self.max_frame_bytes,
                            timeout=self.send_timeout)
        client.expect_initialize(request)
        self._open(client)
        try:
            await client.deliver(request)
        except anyio.BrokenResourceError:
            pass
        gave_up = False
        async with anyio.create_task_group() as tg:
            async def watch_hang_up() -> None:
                # The answer carries the connection id: a client gone before it can never
                # use the connection, which would hold a place until it idled out.
                # The body has been read: what comes next is the hang-up (ASGI); anything
                # else, from a server that says more, ends the watch, not the request.
                nonlocal gave_up
                if (await receive())["type"] != "http.disconnect":
                    return
                gave_up = True
                tg.cancel_scope.cancel()

            tg.start_soon(watch_hang_up)
            with anyio.move_on_after(INITIALIZE_TIMEOUT):
                await client.initialized.wait()
            tg.cancel_scope.cancel()
        answer = client.initialize_answer
        if gave_up:
            log.info("%s hung up before its initialize was answered: its chain stops",
                     client.peer)
            client.end()
            return
        if answer is None:
            client.end()
            why = "the chain did not answer initialize" + (
                "" if client.finished.is_set() else f" within {INITIALIZE_TIMEOUT:g} s")
            self._log_refusal(scope, Refusal(504, why + ": its chain stops"))
            await _json(send, 504, {"error": why}, cors)
            return
        await _send_response(send, 200, encode(answer)[:-1], [
            ("content-type", "application/json"), (CONNECTION_ID, client.id), *cors])


# -- ASGI odds and ends -----------------------------------------------------------------------


def _error(ident: Any, code: int, message: str, data: Any = None) -> bytes:
    return encode(error_response(ident, code, message, data))[:-1]


async def _read_body(receive: Receive, limit: int) -> bytes:
    """The request body; once past `limit`, only its first bytes (the rest is not kept)."""
    body = bytearray()
    while True:
        event = await receive()
        if event["type"] == "http.disconnect":
            break
        chunk = event.get("body", b"")
        if len(body) <= limit:
            body += chunk
        if not event.get("more_body"):
            break
    return bytes(body)


async def _json(send: Send, status: int, body: Any,
                headers: Iterable[tuple[str, str]] = ()) -> None:
    data = b"" if body is None else body if isinstance(body, bytes) else bytes(raw(body))
    extra = [("content-type", "application/json")] if data else []
    await _send_response(send, status, data, [*extra, *headers])


async def _send_response(send: Send, status: int, body: bytes,
                         headers: Iterable[tuple[str, str]]) -> None:
    await send({"type": "http.response.start", "status": status,
                "headers": [(k.encode(), v.encode("latin-1")) for k, v in headers]})
    await send({"type": "http.response.body", "body": body})


def _with_headers(send: Send, headers: list[tuple[str, str]]) -> Send:
    if not headers:
        return send

    async def sender(event: MutableMapping[str, Any]) -> None:
        if event["type"] == "http.response.start":
            event = {**event, "headers": [*event["headers"],
                                          *((k.encode(), v.encode()) for k, v in headers)]}
        await send(event)
    return sender


async def _deny_websocket(scope: Scope, send: Send, refusal: Refusal) -> None:
    if "websocket.http.response" in scope.get("extensions", {}):
        body = bytes(raw({"error": refusal.reason}))
        await send({"type": "websocket.http.response.start", "status": refusal.status,
                    "headers": [(b"content-type", b"application/json"),
                                *((k.encode(), v.encode()) for k, v in refusal.headers)]})
        await send({"type": "websocket.http.response.body", "body": body})
    else:
        await send({"type": "websocket.close", "code": 1008})


async def lifespan(receive: Receive, send: Send) -> None:
    """Answer an ASGI server's lifespan events (nothing to start or stop)."""
    while True:
        event = await receive()
        if event["type"] == "lifespan.startup":
            await send({"type": "lifespan.startup.complete"})
        elif event["type"] == "lifespan.shutdown":
            await send({"type": "lifespan.shutdown.complete"})
            return


async def serve_asgi(app: AcpEndpoint, sock: socket.socket, *, certfile: str | None = None,
                     keyfile: str | None = None, shutdown: Callable[[], Awaitable[None]],
                     graceful_timeout: float = 1.0) -> None:
    """Serve `app` on a bound socket with hypercorn (HTTP/1.1, HTTP/2, WebSocket; TLS with
    a certificate) until `shutdown` returns, on whichever backend is running."""
    import os

    import sniffio
    from hypercorn.config import Config

    config = Config()
    config.bind = [f"fd://{os.dup(sock.fileno())}"]  # hypercorn owns (and closes) the copy
    config.certfile, config.keyfile = certfile, keyfile
    # Frames up to twice the limit are read, so the chain answers them like any oversized
    # message; beyond that the socket closes with 1009 (message too big).
    config.websocket_max_message_size = 2 * app.max_frame_bytes
    config.websocket_ping_interval = 20.0  # a client that stops answering is dropped
    config.errorlog = logging.getLogger("acp_conductor.http")
    config.accesslog = None
    # Every chain has ended before hypercorn is told to stop; what is still open then is a
    # socket its client did not close, or the ping task (`websocket_ping_interval`) of a
    # WebSocket that closed, which hypercorn 0.18 leaves sleeping: this is waited out then.
    config.graceful_timeout = graceful_timeout
    config.include_server_header = False
    drop_frames_after_too_big()
    if sniffio.current_async_library() == "trio":
        from hypercorn.trio import serve as trio_serve

        await trio_serve(app, config, shutdown_trigger=shutdown)  # type: ignore[arg-type]
    else:
        from hypercorn.asyncio import serve as asyncio_serve

        quiet_cancelled_connections()
        await asyncio_serve(app, config, shutdown_trigger=shutdown)  # type: ignore[arg-type]


def drop_frames_after_too_big() -> None:
    """Make hypercorn drop what a client sends after a message too big (idempotent).

    Hypercorn 0.18 answers a message past `websocket_max_message_size` with close 1009 but
    keeps that message's buffer: the client's next frame, if of the other kind (text
    after binary), raises TypeError in the connection's task, a traceback on asyncio and
    the whole server's end on trio; one of the same kind is appended to the old one and
    handed to the application as a message. The replacement buffer takes nothing more
    once over the limit and hands on empty binary frames, which the endpoint ignores,
    until the socket has closed.
    """
    from io import BytesIO

    from hypercorn.protocol import ws_stream

    base: Any = getattr(ws_stream, "WebsocketBuffer", None)
    if base is None or not hasattr(ws_stream, "FrameTooLargeError") \
            or getattr(base, "_drops_after_too_big", False):
        return  # patched already, or a hypercorn laid out otherwise: leave it as it is

    class ClosingBuffer(base):  # type: ignore[misc]
        _drops_after_too_big = True
        too_big = False

        def extend(self, event: Any) -> None:
            if self.too_big:
                return  # the socket is closing with 1009: nothing more is read
            try:
                super().extend(event)
            except ws_stream.FrameTooLargeError:
                self.too_big = True
                self.value, self.length = BytesIO(), 0
                raise

        def to_message(self) -> dict[str, Any]:
            if self.too_big:
                return {"type": "websocket.receive", "bytes": b"", "text": None}
            return dict(super().to_message())

    setattr(ws_stream, "WebsocketBuffer", ClosingBuffer)  # noqa: B010 (a class, not a field)


def quiet_cancelled_connections() -> None:
    """Keep a connection cancelled at shutdown from printing a traceback (asyncio only).

    Hypercorn cancels the connections still open when its graceful timeout ends (a client
    that keeps its socket), and Python 3.11's `asyncio.streams` then calls `exception()` on
    the cancelled task in a done-callback, which raises `CancelledError` into the loop's
    exception handler: a traceback on stderr for an orderly stop (3.12 checks first). A
    `CancelledError` is never a failure worth reporting, so this handler drops exactly
    those and passes everything else on. Installed once per loop; a no-op on trio.
    """
    import asyncio

    try:
        loop = asyncio.get_running_loop()
    except RuntimeError:
        return  # another backend (trio)
    previous = loop.get_exception_handler()
    if getattr(previous, "_quiets_cancelled", False):
        return

    def handler(loop: asyncio.AbstractEventLoop, context: dict[str, Any]) -> None:
        if isinstance(context.get("exception"), asyncio.CancelledError):
            return
        if previous is not None:
            previous(loop, context)
        else:
            loop.default_exception_handler(context)

    handler._quiets_cancelled = True  # type: ignore[attr-defined]
    loop.set_exception_handler(handler)
