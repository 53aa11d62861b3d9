"""The editor side of ACP over byte streams.

What `run`, `check`, tests and bench drive a chain with.

Unlike the router, this is an endpoint: it decodes payloads fully (it is the one reading
them). Outgoing requests get per-connection ids; incoming requests are dispatched to an
`EditorHandler`, each in its own task and cancel scope (so `$/cancel_request` from the agent
cancels exactly that handler); notifications are delivered in order, in the reader task.
"""

from __future__ import annotations

import itertools
import logging
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import anyio
import msgspec

from conductor.jsonrpc.codes import ErrorCode
from conductor.jsonrpc.framing import DEFAULT_MAX_FRAME_BYTES, FrameDecoder, OversizedFrame
from conductor.jsonrpc.head import Head, read_head
from conductor.transport.pipes import serve_frames

if TYPE_CHECKING:
    from collections.abc import AsyncIterator, Awaitable, Callable

    from anyio.abc import ByteReceiveStream, ByteSendStream, TaskGroup

    from conductor.jsonrpc.message import JsonValue

log = logging.getLogger("acp_conductor.client")

_encoder = msgspec.json.Encoder()


class RpcError(Exception):
    """A JSON-RPC error answer (from the far end), or one a handler raises to answer with."""

    def __init__(self, code: int, message: str, data: JsonValue = None) -> None:
        super().__init__(message)
        self.code, self.message, self.data = code, message, data

    def to_json(self) -> dict[str, JsonValue]:
        err: dict[str, JsonValue] = {"code": self.code, "message": self.message}
        if self.data is not None:
            err["data"] = self.data
        return err

    def __str__(self) -> str:
        return f"{self.message} (code {self.code})"


class ConnectionClosed(Exception):
    """The far end closed the stream while requests were outstanding."""


class EditorHandler:
    """What an editor answers. Subclass and override; unknown methods get method-not-found."""

    async def handle_request(self, method: str, params: JsonValue) -> JsonValue:
        raise RpcError(ErrorCode.METHOD_NOT_FOUND, "Method not found", {"method": method})

    async def handle_notification(self, method: str, params: JsonValue) -> None:
        return None


@dataclass
class _Outgoing:
    method: str
    done: anyio.Event = field(default_factory=anyio.Event)
    result: JsonValue = None
    error: RpcError | None = None
    closed: bool = False


class ClientConnection:
    """One ACP connection from the editor's side. Use `open_client_connection`."""

    def __init__(self, send_stream: ByteSendStream, handler: EditorHandler, tg: TaskGroup) -> None:
        self._out = send_stream
        self._handler = handler
        self._tg = tg
        self._ids = itertools.count(1)
        self._pending: dict[int, _Outgoing] = {}
        self._incoming: dict[Any, anyio.CancelScope] = {}
        self._write_lock = anyio.Lock()
        self.closed = anyio.Event()

    async def _write(self, message: dict[str, JsonValue]) -> None:
        data = _encoder.encode({"jsonrpc": "2.0", **message}) + b"\n"
        async with self._write_lock:
            await self._out.send(data)

    async def request(self, method: str, params: JsonValue = None) -> JsonValue:
        """Send a request and wait for its result.

        Cancelling the caller sends `$/cancel_request` for it (and stops waiting).
        Raises:
            RpcError: the far end answered with an error.
            ConnectionClosed: the stream ended first.
        """
        if self.closed.is_set():
            raise ConnectionClosed(f"connection closed before {method}")
        ident = next(self._ids)
        entry = _Outgoing(method)
        self._pending[ident] = entry
        message: dict[str, JsonValue] = {"id": ident, "method": method}
        if params is not None:
            message["params"] = params
        try:
            await self._write(message)
            await entry.done.wait()
        except anyio.get_cancelled_exc_class():
            if not entry.done.is_set() and not self.closed.is_set():
                with anyio.CancelScope(shield=True), anyio.move_on_after(1):
                    await self.notify("$/cancel_request", {"requestId": ident})
            raise
        finally:
            self._pending.pop(ident, None)
        if entry.closed:
            raise ConnectionClosed(f"connection closed while waiting for {method}")
        if entry.error is not None:
            raise entry.error
        return entry.result

    async def notify(self, method: str, params: JsonValue = None) -> None:
        message: dict[str, JsonValue] = {"method": method}
        if params is not None:
            message["params"] = params
        await self._write(message)

    # -- incoming -------------------------------------------------------------------------

    async def _receive(self, frame: bytes | OversizedFrame) -> None:
        if isinstance(frame, OversizedFrame):
            await self._unreadable(frame.top, frame.head, f"{frame.size} bytes, over the "
                                   f"{frame.limit}-byte limit")
            return
        try:
            value = msgspec.json.decode(frame)
        except msgspec.DecodeError as e:
            await self._unreadable(read_head(frame), frame, str(e))
            return
        except RecursionError:
            await self._unreadable(read_head(frame), frame, "nested too deeply to decode")
            return
        for item in value if isinstance(value, list) else [value]:
            if isinstance(item, dict):
                await self._receive_one(item)

    async def _unreadable(self, head: Head, frame: bytes | bytearray, why: str) -> None:
        """Drop a frame that cannot be decoded, but answer for it when its id can be read:
        a request gets an error, an awaited answer becomes one (nobody waits forever)."""
        log.warning("dropped a line that cannot be read (%s): %r", why, frame[:200])
        if head.id is None or head.is_batch:
            return
        ident = msgspec.json.decode(head.id)
        if head.has_method:
            await self._write({"id": ident, "error": {"code": ErrorCode.INVALID_REQUEST,
                                                      "message": f"unreadable request: {why}"}})
            return
        entry = self._pending.get(ident)  # type: ignore[arg-type]
        if entry is not None:
            entry.error = RpcError(ErrorCode.PARSE_ERROR,
                                   f"the answer to {entry.method} cannot be read: {why}")
            entry.done.set()

    async def _receive_one(self, msg: dict[str, Any]) -> None:
        method = msg.get("method")
        if method is None:
            entry = self._pending.get(msg.get("id"))  # type: ignore[arg-type]
            if entry is None:
                log.debug("answer for unknown id %r ignored", msg.get("id"))
                return
            error = msg.get("error")
            if error is not None:
                e = error if isinstance(error, dict) else {}
                entry.error = RpcError(int(e.get("code", ErrorCode.INTERNAL_ERROR)),
                                       str(e.get("message", "error")), e.get("data"))
            else:
                entry.result = msg.get("result")
            entry.done.set()
            return
        params = msg.get("params")
        if "id" not in msg:
            if method == "$/cancel_request" and isinstance(params, dict):
                scope = self._incoming.get(_key(params.get("requestId")))
                if scope is not None:
                    scope.cancel()
                return
            try:
                await self._handler.handle_notification(method, params)
            except Exception as e:  # a broken renderer must not kill the connection
                log.error("notification handler failed for %s: %s: %s", method,
                          type(e).__name__, e)
                log.debug("handler traceback", exc_info=True)
            return
        self._tg.start_soon(self._serve_request, msg["id"], method, params)

    async def _serve_request(self, ident: JsonValue, method: str, params: JsonValue) -> None:
        scope = anyio.CancelScope()
        self._incoming[_key(ident)] = scope
        answer: dict[str, JsonValue]
        try:
            with scope:
                try:
                    answer = {"id": ident, "result": await self._handler.handle_request(method,
                                                                                        params)}
                except RpcError as e:
                    answer = {"id": ident, "error": e.to_json()}
                except Exception as e:  # answer, don't die: the agent is waiting on us
                    log.error("request handler failed for %s: %s: %s", method,
                              type(e).__name__, e)
                    log.debug("handler traceback", exc_info=True)
                    answer = {"id": ident, "error": {"code": ErrorCode.INTERNAL_ERROR,
                                                     "message": f"{type(e).__name__}: {e}"}}
            if scope.cancel_called:
                answer = {"id": ident, "error": {"code": ErrorCode.REQUEST_CANCELLED,
                                                 "message": "Request cancelled"}}
            if not self.closed.is_set():
                try:
                    await self._write(answer)
                except (anyio.BrokenResourceError, anyio.ClosedResourceError):
                    pass
        finally:
            self._incoming.pop(_key(ident), None)

    def _close(self) -> None:
        self.closed.set()
        for entry in list(self._pending.values()):
            entry.closed = True
            entry.done.set()

    async def aclose(self) -> None:
        """EOF toward the far end."""
        try:
            await self._out.aclose()
        except (OSError, anyio.BrokenResourceError, anyio.ClosedResourceError):
            pass


def _key(ident: Any) -> Any:
    hashable = isinstance(ident, str | int | None) and not isinstance(ident, bool)
    return ident if hashable else repr(ident)


@asynccontextmanager
async def open_client_connection(
    receive_stream: ByteReceiveStream,
    send_stream: ByteSendStream,
    handler: EditorHandler | None = None,
    *,
    max_frame_bytes: int = DEFAULT_MAX_FRAME_BYTES,
    on_closed: Callable[[], Awaitable[None]] | None = None,
) -> AsyncIterator[ClientConnection]:
    """A connection reading `receive_stream` in a task; closed (EOF sent) on exit."""
    async with anyio.create_task_group() as tg:
        conn = ClientConnection(send_stream, handler or EditorHandler(), tg)

        async def reader() -> None:
            try:
                await serve_frames(receive_stream, FrameDecoder(max_frame_bytes=max_frame_bytes),
                                   conn._receive)
            finally:
                conn._close()
                if on_closed is not None:
                    await on_closed()

        tg.start_soon(reader)
        try:
            yield conn
        finally:
            with anyio.CancelScope(shield=True):
                await conn.aclose()
            tg.cancel_scope.cancel()
