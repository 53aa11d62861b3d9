"""The editor side of ACP over byte streams: what `run`, `check` and tests drive a chain with.

Unlike the router, this is an endpoint that reads payloads: it decodes them for its
handler. Its requests, their answers and cancellation are the shared `Endpoint`'s; each
incoming request runs in its own task and cancel scope (so `$/cancel_request` from the
agent cancels exactly that handler); notifications are handled in order, in the reader.
"""

from __future__ import annotations

import logging
from contextlib import asynccontextmanager
from typing import TYPE_CHECKING

import anyio

from conductor import acp
from conductor.errors import ConnectionClosedError, RpcError
from conductor.jsonrpc.codes import ErrorCode
from conductor.jsonrpc.framing import DEFAULT_MAX_FRAME_BYTES
from conductor.jsonrpc.message import Batch, Notification, Request, Response
from conductor.rpc.endpoint import Endpoint
from conductor.rpc.failure import raise_for_error
from conductor.transport.base import Oversized, Unreadable
from conductor.transport.pipes import PipeSink, PipeSource

if TYPE_CHECKING:
    from collections.abc import AsyncIterator, Awaitable, Callable

    from anyio.abc import ByteReceiveStream, ByteSendStream, TaskGroup

    from conductor.jsonrpc.message import JsonValue
    from conductor.transport.base import Incoming

log = logging.getLogger("acp_conductor.editor.client")


class EditorHandler:
    """What an editor answers. Subclass and override; unknown methods get method-not-found.

    Raise `conductor.RpcError` to answer with that error; anything else it raises is
    answered as a handler failure (-33002) naming the editor.
    """

    async def handle_request(self, method: str, params: JsonValue) -> JsonValue:
        raise RpcError(ErrorCode.METHOD_NOT_FOUND, "Method not found", {"method": method})

    async def handle_notification(self, method: str, params: JsonValue) -> None:
        return None


class ClientConnection:
    """One ACP connection from the editor's side. Use `open_client_connection`."""

    def __init__(self, endpoint: Endpoint, handler: EditorHandler, tg: TaskGroup) -> None:
        self.endpoint = endpoint
        self._handler = handler
        self._tg = tg
        self.closed = anyio.Event()

    async def request(self, method: str, params: JsonValue = None, *,
                      cancel_on_abort: bool = True) -> JsonValue:
        """Send a request and return its decoded result.

        Cancelling the caller sends `$/cancel_request` for it, unless `cancel_on_abort` is
        False (the caller has cancelled the work another way, e.g. `session/cancel`).
        Raises:
            RpcError: the far end answered with an error.
            ConnectionClosedError: the stream ended first.
        """
        answer = await self.endpoint.request(method, params, cancel_on_abort=cancel_on_abort)
        return raise_for_error(answer).result_value()

    async def notify(self, method: str, params: JsonValue = None) -> None:
        await self.endpoint.notify(method, params)

    # -- incoming -------------------------------------------------------------------------

    async def receive(self, item: Incoming) -> None:
        items = item.items if isinstance(item, Batch) else [item]
        for one in items:
            if isinstance(one, Response):
                if await self.endpoint.settle(one) is None:
                    log.debug("answer for unknown id %r ignored", bytes(one.id))
            elif isinstance(one, Request):
                self._tg.start_soon(self.endpoint.answer, one, self._answer)
            elif isinstance(one, Notification):
                await self._notification(one)
            elif isinstance(one, Unreadable | Oversized):
                # Answer for it when its id can be read: nobody waits for what was dropped.
                reason = one.reason if isinstance(one, Unreadable) else (
                    f"{one.size} bytes, over the {one.limit}-byte limit")
                log.warning("dropped a message that cannot be read: %s", reason)
                code = one.code if isinstance(one, Unreadable) else ErrorCode.FRAME_TOO_LARGE
                await self.endpoint.refuse_unread(one.head, code,
                                                  f"a message that cannot be read: {reason}")
            else:
                log.warning("dropped unusable input: %r", one)

    async def _notification(self, message: Notification) -> None:
        if message.method == acp.CANCEL_REQUEST:
            await self.endpoint.cancel_inbound(message.params)
            return
        try:
            await self._handler.handle_notification(message.method, message.params_value())
        except Exception as e:  # a broken renderer must not kill the connection
            log.error("notification handler failed for %s: %s: %s", message.method,
                      type(e).__name__, e)
            log.debug("handler traceback", exc_info=True)

    async def _answer(self, request: Request) -> JsonValue:
        try:
            return await self._handler.handle_request(request.method, request.params_value())
        except RpcError:
            raise
        except Exception as e:  # answered by the endpoint; logged here for the user
            log.error("request handler failed for %s: %s: %s", request.method,
                      type(e).__name__, e)
            log.debug("handler traceback", exc_info=True)
            raise

    async def _close(self) -> None:
        self.closed.set()
        await self.endpoint.fail(ConnectionClosedError("the connection closed"))

    async def aclose(self) -> None:
        """EOF toward the far end."""
        try:
            await self.endpoint.sink.aclose()
        except (OSError, anyio.BrokenResourceError, anyio.ClosedResourceError):
            pass


@asynccontextmanager
async def open_client_connection(
    receive_stream: ByteReceiveStream,
    send_stream: ByteSendStream,
    handler: EditorHandler | None = None,
    *,
    max_frame_bytes: int = DEFAULT_MAX_FRAME_BYTES,
    on_closed: Callable[[], Awaitable[None]] | None = None,
    name: str = "editor",
) -> AsyncIterator[ClientConnection]:
    """A connection reading `receive_stream` in a task; closed (EOF sent) on exit."""
    async with anyio.create_task_group() as tg:
        conn = ClientConnection(Endpoint(name, PipeSink(send_stream)),
                                handler or EditorHandler(), tg)

        async def reader() -> None:
            try:
                await PipeSource(receive_stream, max_frame_bytes=max_frame_bytes).serve(
                    conn.receive)
            finally:
                with anyio.CancelScope(shield=True):
                    await conn._close()
                    if on_closed is not None:
                        await on_closed()

        tg.start_soon(reader)
        try:
            yield conn
        finally:
            with anyio.CancelScope(shield=True):
                await conn.aclose()
            tg.cancel_scope.cancel()
