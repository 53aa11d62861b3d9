"""Messages over a WebSocket, one JSON-RPC message per text frame: the client end of ACP's
remote transport (its WebSocket profile), used for remote components (`url = "wss://..."`).

httpx-ws does the handshake and the framing, on anyio (so on both backends). It is an
optional dependency (the `remote` extra), imported only when a chain names a url.
"""

from __future__ import annotations

from contextlib import AsyncExitStack, asynccontextmanager
from typing import TYPE_CHECKING, Any, Final

import anyio

from conductor.jsonrpc.framing import DEFAULT_MAX_FRAME_BYTES
from conductor.jsonrpc.message import Message, encode, encode_batch
from conductor.transport.base import decode_lines

if TYPE_CHECKING:
    from collections.abc import AsyncIterator, Callable, Iterator

    from conductor.transport.base import Handle, HandleNowait

# acp-conductor is not on PyPI: the extra comes from the checkout or wheel it was installed from.
REMOTE_EXTRA_HINT = ("install it from your checkout, pip install '/path/to/acp-conductor[remote]' "
                     "(or from a wheel, 'acp_conductor-*.whl[remote]'; docs/remote.md)")
CONNECT_TIMEOUT = 30.0
PING_INTERVAL = 20.0  # a peer that stops answering pings is a dropped connection
# The reason httpx-ws (0.9) closes a session with when a read fails.
READ_FAILED_REASON: Final = "Stream error"
MESSAGE_TOO_BIG: Final = 1009  # the WebSocket close code
# A peer that stops reading makes our sends wait for its TCP window forever (and pings
# queue behind them): a message must be taken within this grace plus a second per
# SEND_RATE bytes of it, or the peer is dropped. Both ends use it (docs/remote.md).
SEND_GRACE: Final = 30.0
SEND_RATE: Final = 64 * 1024


def allowed_send_time(size: int) -> float:
    """How long the peer may take to accept a message of `size` bytes."""
    return SEND_GRACE + size / SEND_RATE


def stalled(waited: float) -> str:
    return f"it stopped reading: a message was not taken within {waited:g} s"


def text_of(item: Message | list[Message]) -> str:
    """One message (or a batch) as the text of one frame; payload bytes unchanged."""
    data = encode(item) if isinstance(item, Message) else encode_batch(item)
    return data[:-1].decode("utf-8", "replace")  # valid JSON is valid UTF-8: nothing replaced


class WsClientSink:
    """A MessageSink that sends each message as one text frame. A send the peer does not
    take in time (`timeout`) drops the connection: `source` then ends, saying why."""

    def __init__(self, session: Any, source: WsClientSource, *,
                 timeout: Callable[[int], float] = allowed_send_time) -> None:
        self._session = session
        self._source = source
        self._timeout = timeout
        self._closed = False

    async def send(self, item: Message | list[Message]) -> None:
        import httpx_ws
        import wsproto.utilities

        if self._closed:
            raise anyio.BrokenResourceError
        text = text_of(item)
        waited = self._timeout(len(text))
        try:
            with anyio.move_on_after(waited) as late:
                await self._session.send_text(text)
        except (httpx_ws.HTTPXWSException, OSError, anyio.BrokenResourceError,
                anyio.ClosedResourceError,
                # httpx-ws closed the session itself (a ping unanswered, a read failed):
                # wsproto refuses any frame after the close.
                wsproto.utilities.LocalProtocolError) as e:
            raise anyio.BrokenResourceError from e
        if late.cancelled_caught:
            await self.drop(stalled(waited))
            raise anyio.BrokenResourceError

    async def drop(self, why: str) -> None:
        """End a connection whose peer stopped reading. No close frame: it would wait
        behind the message that is stuck (perhaps half written). Closing the socket ends
        the reader (and makes httpx-ws's own close on exit fail fast, not wait forever)."""
        self._closed = True
        self._source.drop(why)
        with anyio.move_on_after(1, shield=True):  # TLS says goodbye first: bounded
            await self._session.stream.aclose()

    async def aclose(self) -> None:
        if self._closed:
            return
        self._closed = True
        with anyio.move_on_after(2, shield=True):
            try:
                await self._session.close()
            except Exception:  # the peer is gone already: closed is closed
                pass


class WsClientSource:
    """A MessageSource reading text frames until the server closes; `ended` says how."""

    def __init__(self, session: Any, *, max_frame_bytes: int) -> None:
        self._session = session
        self._max = max_frame_bytes
        self.ended = "the connection is still open"
        self._reading = anyio.CancelScope()
        self._dropped: str | None = None
        # Since when it has waited for a frame; None while the chain handles one. Pongs are
        # read in order behind frames: while a frame waits for us, so does the pong.
        self.waiting_since: float | None = None

    def drop(self, why: str) -> None:
        """The connection is being dropped (`why`): stop reading (a message being handled
        is handled to the end)."""
        self._dropped = why
        self._reading.cancel()

    async def serve(self, handle: Handle, nowait: HandleNowait | None = None) -> None:
        import httpx_ws

        while True:
            text: str | None = None
            try:
                if self._dropped is None:
                    self._reading = anyio.CancelScope()
                    self.waiting_since = anyio.current_time()
                    with self._reading:
                        text = await self._session.receive_text()
                    self.waiting_since = None
                if text is None:  # dropped (the sink saw the peer stop reading)
                    self.ended = self._dropped or self.ended
                    return
            except httpx_ws.WebSocketDisconnect as e:
                if getattr(self._session.connection, "too_big", False):
                    # As the server end does: up to twice the limit is answered as any
                    # oversized message; past that the socket closes with 1009.
                    self.ended = f"it sent a message of over {2 * self._max} bytes " \
                                 f"(twice the limit): closed with {MESSAGE_TOO_BIG}"
                    with anyio.move_on_after(2, shield=True):
                        await self._session.close(MESSAGE_TOO_BIG, "message too big")
                    return
                self.ended = f"closed by the server: code {e.code}" + (
                    f", {e.reason}" if e.reason else "")
                return
            except httpx_ws.WebSocketInvalidTypeReceived:
                continue  # binary frames carry nothing in ACP: ignored, as the RFD says
            except (httpx_ws.HTTPXWSException, OSError, anyio.EndOfStream,
                    anyio.BrokenResourceError, anyio.ClosedResourceError) as e:
                # httpx-ws's WebSocketNetworkError says nothing; the reason it closed
                # the session with tells a failed read.
                closed = getattr(self._session, "close_reason", None)
                self.ended = self._dropped or (
                    "the connection broke (reading from it failed)"
                    if closed == READ_FAILED_REASON else f"network error: {type(e).__name__}")
                return
            for item in decode_lines(text.encode(), self._max):
                if nowait is None or not nowait(item):
                    await handle(item)


async def _keep_alive(session: Any, sink: WsClientSink, source: WsClientSource) -> None:
    """Ping the peer every PING_INTERVAL; drop it when a pong does not come within that
    while we wait for its frames. httpx-ws's own keepalive cannot tell: its reader hands
    frames on one at a time, so a pong behind a frame the chain has not taken yet (it waits
    on a slow client, say) is not read, and a peer that is fine would be dropped."""
    import httpx_ws
    import wsproto.utilities

    while True:
        await anyio.sleep(PING_INTERVAL)
        try:
            pong = await session.ping()
        except (httpx_ws.HTTPXWSException, wsproto.utilities.LocalProtocolError, OSError,
                anyio.BrokenResourceError, anyio.ClosedResourceError):
            return  # closing or closed: the reader says how
        sent = anyio.current_time()
        while not pong.is_set():
            with anyio.move_on_after(PING_INTERVAL):
                await pong.wait()
            since = source.waiting_since
            if not pong.is_set() and since is not None \
                    and anyio.current_time() - max(since, sent) >= PING_INTERVAL:
                await sink.drop(f"it did not answer a ping within {PING_INTERVAL:g} s")
                return


class _CappedConnection:
    """A wsproto connection that stops a message at `cap` bytes (characters, for text)
    while httpx-ws assembles its fragments, which it would otherwise do without a limit.
    Past the cap it reports the connection closed instead of the fragment, so httpx-ws
    stops reading and buffers no more; `too_big` says so."""

    def __init__(self, inner: Any, cap: int) -> None:
        self._inner = inner
        self._cap = cap
        self._assembled = 0
        self.too_big = False

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)

    def events(self) -> Iterator[Any]:
        import wsproto.events

        for event in self._inner.events():
            if isinstance(event, wsproto.events.Message):
                self._assembled += len(event.data)
                if self._assembled > self._cap:
                    self.too_big = True
                    yield wsproto.events.CloseConnection(code=MESSAGE_TOO_BIG)
                    return
                if event.message_finished:
                    self._assembled = 0
            yield event


def _capped_session(cap: int) -> type:
    import httpx_ws

    class CappedSession(httpx_ws.AsyncWebSocketSession):
        close_reason: str | None = None  # the first close's: why httpx-ws gave up, say

        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            self.connection = _CappedConnection(self.connection, cap)  # type: ignore[assignment]

        async def close(self, code: int = 1000, reason: str | None = None) -> None:
            if self.close_reason is None:
                self.close_reason = reason or ""
            await super().close(code, reason)
    return CappedSession


def http_url(url: str) -> str:
    """httpx speaks http(s): the same address, ws -> http, wss -> https."""
    scheme, rest = url.split("://", 1)
    return ("https" if scheme.lower() == "wss" else "http") + "://" + rest


@asynccontextmanager
async def open_ws_client(url: str, headers: dict[str, str], *,
                         max_frame_bytes: int = DEFAULT_MAX_FRAME_BYTES,
                         send_timeout: Callable[[int], float] = allowed_send_time,
                         ) -> AsyncIterator[tuple[WsClientSink, WsClientSource]]:
    """Connect to a WebSocket ACP endpoint; the socket is closed on exit.

    Raises:
        ConnectionError: the extra is not installed, the server cannot be reached, or it
            refused the upgrade (the message says which, with the HTTP status); also raised
            on exit when the connection failed underneath (a read failed). What the
            block itself raises is not translated (httpx-ws's task group may wrap it in an
            ExceptionGroup).
    """
    try:
        import httpx
        import httpx_ws
    except ImportError:
        raise ConnectionError(f"remote components need the remote extra: {REMOTE_EXTRA_HINT}"
                              ) from None
    mine: list[BaseException] = []  # what the caller's block raised: not ours to translate
    try:
        async with AsyncExitStack() as stack:
            client = await stack.enter_async_context(httpx.AsyncClient(
                headers=headers, timeout=httpx.Timeout(CONNECT_TIMEOUT)))
            try:
                session: Any = await stack.enter_async_context(httpx_ws.aconnect_ws(
                    http_url(url), client, keepalive_ping_interval_seconds=None,  # ours
                    session_class=_capped_session(2 * max_frame_bytes)))
            except httpx_ws.WebSocketUpgradeError as e:
                status = e.response.status_code
                raise ConnectionError(f"the server refused the connection: HTTP {status}"
                                      + (" (check the token header)" if status == 401
                                         else "")) from None
            except httpx.TimeoutException:  # str() of it is empty: say what timed out
                raise ConnectionError("no answer to the WebSocket handshake within "
                                      f"{CONNECT_TIMEOUT:g} s") from None
            except httpx.HTTPError as e:
                import ssl

                hint, cause = "", e.__cause__ or e.__context__
                while cause is not None:  # httpx's error, from httpcore's, from ssl's
                    if isinstance(cause, ssl.SSLCertVerificationError):
                        hint = (" (to trust the server's certificate, point SSL_CERT_FILE at "
                                "it in the conductor's environment: docs/remote.md)")
                        break
                    cause = cause.__cause__ or cause.__context__
                raise ConnectionError((str(e) or type(e).__name__) + hint) from None
            source = WsClientSource(session, max_frame_bytes=max_frame_bytes)
            sink = WsClientSink(session, source, timeout=send_timeout)
            pinging = await stack.enter_async_context(anyio.create_task_group())
            stack.callback(pinging.cancel_scope.cancel)  # runs first: then the group ends
            pinging.start_soon(_keep_alive, session, sink, source)
            try:
                yield sink, source
            except BaseException as e:
                mine.append(e)
                raise
    except* (httpx_ws.HTTPXWSException, httpx.HTTPError, OSError) as group:
        if mine and group.subgroup(lambda e: e is mine[0]) is not None:
            raise  # the caller's (httpx-ws's task group wrapped it): its own cause stays
        first = group.exceptions[0]
        if isinstance(first, ConnectionError):
            raise first from None
        raise ConnectionError(f"network error: {type(first).__name__}") from None
