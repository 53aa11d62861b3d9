"""Running a plugin: the proxy side of the proxy protocol, hidden behind the Proxy API.

`ProxyHost` turns what the conductor sends a proxy (plain messages from the predecessor,
`_proxy/successor` envelopes from the successor, responses, cancels) into handler calls,
and what handlers do back into the proxy protocol. The same host runs a plugin
in-process (`open_inprocess_proxy`: Message objects in and out, nothing encoded but the
envelope around a Raw) and stand-alone (`serve_proxy`: frames on stdin/stdout).

Dispatch is in order, in one task, like a subprocess reading its stdin. A handler runs
inline until it first waits for an answer (or calls `ctx.release()`); then the host goes
on dispatching while the handler waits in its own task. So a session's route is installed
before the next message is dispatched, and nothing overtakes a handled message that has not
been forwarded yet.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Final

import anyio
import msgspec
from msgspec import UNSET, Raw, UnsetType

from conductor import acp
from conductor.acp import Dialect
from conductor.errors import RpcError
from conductor.jsonrpc.codes import ErrorCode
from conductor.jsonrpc.framing import FrameDecoder, OversizedFrame
from conductor.jsonrpc.message import (
    Batch,
    InvalidMessage,
    Message,
    ParseError,
    UnreadableFrame,
    decode,
    error_response,
    id_key,
    int_id,
    payload,
)
from conductor.plugins.api import (
    Handler,
    Proxy,
    ProxyContext,
    SessionScope,
    Side,
    answer_or_raise,
)
from conductor.routing.wire import Wire
from conductor.transport.pipes import CoalescedWrites, PipeSink, serve_frames

if TYPE_CHECKING:
    from anyio.abc import ByteReceiveStream, ByteSendStream, TaskGroup, TaskStatus

    from conductor.jsonrpc.head import Head
    from conductor.transport.base import MessageSink

log = logging.getLogger("acp_conductor.plugins")

# Messages waiting for an in-process proxy. Bounded like a pipe buffer; large enough that
# traffic flowing both ways at once cannot fill both inboxes and wedge each other.
INBOX_SIZE: Final = 256
REQUEST_CANCELLED: Final = -32800
_ALWAYS_VISIT: Final = frozenset({acp.INITIALIZE, *acp.PROXY_INITIALIZE_METHODS,
                                  *acp.SUCCESSOR_METHODS, *acp.SESSION_SETUP,
                                  acp.SESSION_CLOSE, acp.SESSION_DELETE, acp.CANCEL_REQUEST})

Send = Callable[[Message], Awaitable[None]]
AnswerHook = Callable[[Message], Awaitable[None]]


class _Everything:
    """A set that contains every method (a proxy with a `*` handler sees all)."""

    def __contains__(self, item: object) -> bool:
        return True


_EVERYTHING: Final = _Everything()


class OutgoingRequest:
    """A request this proxy sent (its own, or a forward) and the answer it will get."""

    __slots__ = ("_event", "_host", "answer", "cancel_sent", "hooks", "ident", "method",
                 "origin_id", "params", "to")

    def __init__(self, host: ProxyHost, ident: int, method: str, params: Raw | UnsetType,
                 to: Side, origin_id: Raw | None) -> None:
        self._host = host
        self.ident, self.method, self.params, self.to = ident, method, params, to
        self.origin_id = origin_id          # fast path: answer the conductor's id directly
        self.hooks: list[AnswerHook] = []    # session bookkeeping, run before delivery
        self.answer: Message | None = None
        self.cancel_sent = False
        self._event: anyio.Event | None = None

    @property
    def done(self) -> bool:
        return self.answer is not None

    def settle(self, answer: Message) -> None:
        self.answer = answer
        if self._event is not None:
            self._event.set()

    async def wait(self) -> Message:
        """The answer (a result or an error). Cancelling the wait cancels the request."""
        if self.answer is None:
            self._host.release_dispatch()  # the answer arrives through dispatch
            if self._event is None:
                self._event = anyio.Event()
            try:
                await self._event.wait()
            except BaseException:
                with anyio.CancelScope(shield=True):
                    await self.cancel()
                raise
        assert self.answer is not None
        return self.answer

    async def cancel(self) -> None:
        """Ask the far end to stop (`$/cancel_request`); it still answers, usually -32800."""
        if self.done or self.cancel_sent:
            return
        self.cancel_sent = True
        await self._host.emit(Message(method=acp.CANCEL_REQUEST,
                                      params=payload({"requestId": self.ident})))


@dataclass(eq=False, slots=True)
class _Inbound:
    """A request the conductor sent us, until we answer it."""

    forwarded: OutgoingRequest | None = None  # fast path
    ctx: ProxyContext | None = None
    scope: anyio.CancelScope | None = None


class ProxyHost:
    """One plugin instance speaking the proxy protocol to one conductor."""

    def __init__(self, proxy: Proxy[Any], send: Send) -> None:
        self.proxy = proxy
        self.name = proxy.name
        self.sessions: dict[str, SessionScope] = {}
        self.task_group: TaskGroup | None = None
        self._send = send
        self._lock = anyio.Lock(fast_acquire=True)  # one writer: messages leave in order
        self._handlers = proxy.handlers()
        self._routed = False   # some session has its own handlers or is ours: read sessionId
        self._dialect = Dialect.PROXY
        self._next_id = 0
        self._outgoing: dict[int, OutgoingRequest] = {}
        self._inbound: dict[object, _Inbound] = {}
        self._holding: Callable[[], None] | None = None
        # Messages handed to this proxy and not yet fully dispatched (a held handler counts
        # until it releases). Counted at hand-over: anyio gives an item straight to a waiting
        # receiver without it ever showing in the buffer.
        self.queued = 0
        # Methods this proxy must see, per direction (None: it handles `*`, so everything).
        self._visit_up = self._must_visit(Side.SUCCESSOR)
        self._visit_down = self._must_visit(Side.PREDECESSOR)

    # -- out -----------------------------------------------------------------------------

    async def emit(self, message: Message) -> None:
        async with self._lock:
            await self._send(message)

    async def send_notification(self, method: str, params: Raw | UnsetType, to: Side) -> None:
        if to is Side.SUCCESSOR:
            await self.emit(Message(method=self._dialect.successor_method(is_request=False),
                                    params=acp.encode_envelope(method, params, UNSET,
                                                               self._dialect)))
        else:
            await self.emit(Message(method=method, params=params))

    async def start_request(self, method: str, params: Raw | UnsetType, to: Side, *,
                            origin_id: Raw | None = None,
                            forwarded_for: ProxyContext | None = None) -> OutgoingRequest:
        self._next_id += 1
        pending = OutgoingRequest(self, self._next_id, method, params, to, origin_id)
        if to is Side.SUCCESSOR and method.startswith("session/"):
            await self._track_session(pending, owned=origin_id is None and forwarded_for is None)
        self._outgoing[pending.ident] = pending
        if forwarded_for is not None:
            forwarded_for._outstanding.append(pending)
        ident = int_id(pending.ident)
        if to is Side.SUCCESSOR:
            out = Message(id=ident, method=self._dialect.successor_method(is_request=True),
                          params=acp.encode_envelope(method, params, UNSET, self._dialect))
        else:
            out = Message(id=ident, method=method, params=params)
        await self.emit(out)
        return pending

    async def call(self, method: str, params: object, to: Side) -> Message:
        """This proxy's own request, awaited. Raises RpcError on an error answer."""
        pending = await self.start_request(method, UNSET if params is None else payload(params),
                                           to)
        return answer_or_raise(await pending.wait())

    # -- in ------------------------------------------------------------------------------

    def passes(self, method: str, from_successor: bool) -> bool:
        """Would this proxy forward `method` untouched, with nothing earlier still in dispatch?

        Then the conductor may route the message past it without waking it: same result,
        same order, no cost. Set-up and tear-down always visit (the host tracks sessions).
        On the path of every message: two set lookups, precomputed from the handlers.
        """
        if self.queued or self._routed:
            return False
        return method not in (self._visit_up if from_successor else self._visit_down)

    def _must_visit(self, side: Side) -> _Everything | frozenset[str]:
        if (side, "*") in self._handlers:
            return _EVERYTHING
        return frozenset(m for s, m in self._handlers if s is side) | _ALWAYS_VISIT

    async def dispatch(self, message: Message) -> None:
        """Handle one message from the conductor. A plugin's failure is answered, not raised."""
        try:
            await self._dispatch(message)
        except Exception as e:  # a plugin bug must never take the conductor down
            method = message.method if message.method is not UNSET else "an answer"
            self._log_failure(e, method)
            if message.is_request:
                await self._answer(message.id, self._failure(e, message.method))  # type: ignore[arg-type]

    async def _dispatch(self, msg: Message) -> None:
        method = msg.method
        if method is UNSET:
            await self._on_response(msg)
            return
        assert isinstance(method, str)
        if method == acp.CANCEL_REQUEST:
            await self._on_cancel(msg.params)
            return
        source = Side.PREDECESSOR
        dialect = acp.SUCCESSOR_METHODS.get(method)
        if dialect is not None:
            try:
                env = acp.decode_envelope(msg.params)
            except ValueError as e:
                if msg.id is not UNSET:
                    await self._answer(msg.id, error_response(None, ErrorCode.INVALID_PARAMS,
                                                              "Invalid params", str(e)))
                return
            if env.method == acp.CANCEL_REQUEST:
                await self._on_cancel(env.params)
                return
            source = Side.SUCCESSOR
            msg = Message(id=msg.id, method=env.method, params=env.params)
        elif method in acp.PROXY_INITIALIZE_METHODS:
            self._dialect = acp.PROXY_INITIALIZE_METHODS[method]
            msg = Message(id=msg.id, method=acp.INITIALIZE, params=msg.params)
        elif method == acp.INITIALIZE and acp.is_legacy_proxy_initialize(msg.params):
            self._dialect = Dialect.LEGACY
        await self._route(source, msg)

    async def _route(self, source: Side, msg: Message) -> None:
        method = msg.method
        assert isinstance(method, str)
        handler: Handler | None = None
        if self._routed:
            scope = self.session_of(msg, create=False)
            if scope is not None:
                handler = scope.handler_for(source, method)
                if handler is None and scope.owned and source is Side.SUCCESSOR:
                    await self._unclaimed(msg, scope)  # our own session: never goes upstream
                    return
        if handler is None:
            handler = self._handlers.get((source, method)) or self._handlers.get((source, "*"))
        if handler is None:
            await self._pass(source, msg)
        else:
            assert self.task_group is not None
            await self.task_group.start(self._handle, handler, ProxyContext(self, source, msg))

    async def _pass(self, source: Side, msg: Message) -> None:
        """Forward untouched, inline: the fast path for everything without a handler."""
        assert isinstance(msg.method, str)
        if msg.id is UNSET:
            await self.send_notification(msg.method, msg.params, source.other)
            return
        inbound = _Inbound()
        key = _key(msg.id)
        if key is not None:
            self._inbound[key] = inbound
        inbound.forwarded = await self.start_request(msg.method, msg.params, source.other,
                                                     origin_id=msg.id)

    async def _handle(self, handler: Handler, ctx: ProxyContext, *,
                      task_status: TaskStatus[None]) -> None:
        released = False

        def release() -> None:
            nonlocal released
            if not released:
                released = True
                task_status.started()

        ctx.released = release
        self._holding = release
        msg = ctx.message
        key = _key(msg.id) if msg.is_request else None  # type: ignore[arg-type]
        inbound = _Inbound(ctx=ctx)
        if key is not None:
            self._inbound[key] = inbound
        try:
            with anyio.CancelScope() as scope:
                inbound.scope = scope
                try:
                    reply = await handler(ctx, msg)
                except RpcError as e:
                    reply = error_response(None, e.code, e.message, e.data)
                except Exception as e:
                    self._log_failure(e, msg.method)
                    reply = self._failure(e, msg.method)
                if msg.is_request:
                    await self._answer(msg.id, reply)  # type: ignore[arg-type]
            if scope.cancelled_caught and msg.is_request:
                await self._answer(msg.id, error_response(  # type: ignore[arg-type]
                    None, REQUEST_CANCELLED, "Request cancelled", {"component": self.name}))
        finally:
            if key is not None:
                self._inbound.pop(key, None)
            if self._holding is release:
                self._holding = None
            release()

    def release_dispatch(self) -> None:
        """The handler holding dispatch waits for something: let dispatch go on."""
        holding, self._holding = self._holding, None
        if holding is not None:
            holding()

    async def _answer(self, ident: Raw, reply: object) -> None:
        if isinstance(reply, Message):
            if not reply.is_response:
                raise TypeError(f"a handler returned a {reply.method} message, not a response")
            out = Message(id=ident, result=reply.result, error=reply.error)
        else:
            out = Message(id=ident, result=payload(reply))
        await self.emit(out)

    def _log_failure(self, error: BaseException, what: object) -> None:
        # One line for the user; the traceback is for the plugin's author, at debug level.
        self.proxy.log.error("proxy %s failed handling %s: %s: %s", self.name, what,
                             type(error).__name__, error)
        self.proxy.log.debug("traceback", exc_info=error)

    def _failure(self, error: BaseException, method: object) -> Message:
        return error_response(
            None, ErrorCode.INTERNAL_ERROR,
            f"proxy {self.name} failed handling {method}: {type(error).__name__}: {error}",
            {"component": self.name, "plugin": self.name, "method": method})

    async def _unclaimed(self, msg: Message, scope: SessionScope) -> None:
        if msg.is_request:
            await self._answer(msg.id, error_response(  # type: ignore[arg-type]
                None, ErrorCode.METHOD_NOT_FOUND, "Method not found",
                f"proxy {self.name} has no handler for {msg.method} in its own session "
                f"{scope.session_id}"))
        else:
            log.debug("%s: %s for own session %s dropped", self.name, msg.method,
                      scope.session_id)

    async def _on_response(self, msg: Message) -> None:
        key = _key(msg.id)  # type: ignore[arg-type]
        pending = self._outgoing.pop(key, None) if isinstance(key, int) else None
        if pending is None:
            log.debug("%s: answer for unknown id %r ignored", self.name, key)
            return
        for hook in pending.hooks:  # routes first: later messages may name the session
            try:
                await hook(msg)
            except Exception as e:  # e.g. session_opened raised: answer, naming the plugin
                self._log_failure(e, f"the answer to {pending.method}")
                msg = self._failure(e, pending.method)
                break
        if pending.origin_id is not None:
            origin = _key(pending.origin_id)
            if origin is not None:
                self._inbound.pop(origin, None)
            await self.emit(Message(id=pending.origin_id, result=msg.result, error=msg.error))
        else:
            pending.settle(msg)

    async def _on_cancel(self, params: Raw | UnsetType) -> None:
        ident = acp.get_raw(params, "requestId")
        key = _key(ident) if ident is not None else None
        inbound = self._inbound.get(key) if key is not None else None
        if inbound is None:
            return
        if inbound.forwarded is not None:
            await inbound.forwarded.cancel()
            return
        live = [p for p in (inbound.ctx._outstanding if inbound.ctx else []) if not p.done]
        if live:  # the far end answers the cancelled forward; the handler passes it back
            for pending in live:
                await pending.cancel()
        elif inbound.scope is not None:
            inbound.scope.cancel()

    # -- sessions ------------------------------------------------------------------------

    def session_of(self, msg: Message, *, create: bool = True) -> SessionScope | None:
        sid = acp.get_str(msg.params, "sessionId")
        if sid is None:
            return None
        scope = self.sessions.get(sid)
        if scope is None and create:  # a session we never saw set up: still give it state
            scope = SessionScope(sid, "unknown", owned=False, _host=self)
            self.sessions[sid] = scope
        return scope

    def mark_routed(self) -> None:
        self._routed = True

    def owns(self, msg: Message) -> bool:
        """Does `msg` belong to a session this proxy opened itself?"""
        if not self._routed:
            return False
        scope = self.session_of(msg, create=False)
        return scope is not None and scope.owned

    async def _track_session(self, pending: OutgoingRequest, *, owned: bool) -> None:
        method, params = pending.method, pending.params
        if method in (acp.SESSION_LOAD, acp.SESSION_RESUME):
            # Replay precedes the answer: the route must exist before the request goes out.
            sid = acp.get_str(params, "sessionId")
            if sid is not None:
                await self._install(sid, method, owned, params)
        elif method in (acp.SESSION_NEW, acp.SESSION_FORK):
            async def opened(answer: Message) -> None:
                sid = acp.get_str(answer.result, "sessionId")
                if sid is not None and answer.error is UNSET:
                    await self._install(sid, method, owned, params)
            pending.hooks.append(opened)
        elif method in (acp.SESSION_CLOSE, acp.SESSION_DELETE):
            sid = acp.get_str(params, "sessionId")

            async def closed(answer: Message) -> None:
                if answer.error is UNSET and sid is not None:
                    await self._remove(sid)
            pending.hooks.append(closed)

    async def _install(self, sid: str, how: str, owned: bool,
                       params: Raw | UnsetType) -> SessionScope:
        setup = None
        if params is not UNSET:
            try:
                setup = Message(params=params).params_value()
            except msgspec.DecodeError:
                log.warning("%s: session %s set up with params nested too deeply to read",
                            self.name, sid)
        scope = SessionScope(sid, how, owned=owned, setup=setup, _host=self)
        previous = self.sessions.get(sid)
        if previous is not None:  # a reload keeps the state and the handlers
            scope.state, scope._handlers = previous.state, previous._handlers
        self.sessions[sid] = scope
        if owned:
            self._routed = True
        await self.proxy.session_opened(scope)
        return scope

    async def _remove(self, sid: str) -> None:
        scope = self.sessions.pop(sid, None)
        self._routed = any(s.owned or s._handlers for s in self.sessions.values())
        if scope is not None:
            await self.proxy.session_closed(scope)


def _key(ident: Raw) -> object:
    try:
        return id_key(ident)
    except ValueError:
        return None


# -- running a host -----------------------------------------------------------------------

class _InboxSink:
    """The Wire sink of an in-process proxy: hands Message objects over, encodes nothing."""

    def __init__(self, send: anyio.abc.ObjectSendStream[Message | list[Message]],
                 host: ProxyHost) -> None:
        self._send = send
        self._host = host
        self.passes = host.passes  # the router asks the host directly: no extra call


    async def send(self, item: Message | list[Message]) -> None:
        self._host.queued += len(item) if isinstance(item, list) else 1
        try:
            self._send.send_nowait(item)  # no checkpoint: an in-process hop costs no extra yield
        except anyio.WouldBlock:
            await self._send.send(item)

    async def aclose(self) -> None:
        await self._send.aclose()


@asynccontextmanager
async def open_inprocess_proxy(proxy: Proxy[Any], deliver: Send) -> AsyncIterator[MessageSink]:
    """Run `proxy` in this process. Yields the sink the conductor writes to; what the proxy
    sends goes to `deliver` (the conductor's `Chain.receive` for the proxy's wire)."""
    send, receive = anyio.create_memory_object_stream[Message | list[Message]](INBOX_SIZE)
    host = ProxyHost(proxy, deliver)
    async with anyio.create_task_group() as tg:
        host.task_group = tg

        async def serve() -> None:
            # Drain whatever is waiting in one turn of the event loop, with writes coalesced
            # like a pipe reader's: a burst costs one wake-up and one write per pipe, not
            # one per message.
            writes = CoalescedWrites()
            async with receive:
                while True:
                    try:
                        item = await receive.receive()
                    except anyio.EndOfStream:
                        return
                    writes.begin()
                    try:
                        while True:
                            for message in item if isinstance(item, list) else (item,):
                                try:
                                    await host.dispatch(message)
                                finally:
                                    host.queued -= 1
                            try:
                                item = receive.receive_nowait()
                            except (anyio.WouldBlock, anyio.EndOfStream):
                                break
                    finally:
                        with anyio.CancelScope(shield=True):
                            await writes.flush()

        tg.start_soon(serve)
        try:
            yield _InboxSink(send, host)
        finally:
            send.close()
            tg.cancel_scope.cancel()


@asynccontextmanager
async def open_inprocess_wire(proxy: Proxy[Any],
                              receive: Callable[[Wire, Message], Awaitable[None]]
                              ) -> AsyncIterator[Wire]:
    """`proxy` in this process behind a Wire: what is sent on the wire reaches the plugin as
    Message objects (nothing encoded), and what the plugin sends comes back through
    `receive(wire, message)` (the router's `Chain.receive`)."""
    async def deliver(message: Message) -> None:
        await receive(wire, message)

    async with open_inprocess_proxy(proxy, deliver) as sink:
        wire = Wire(proxy.name, sink, dialect=Dialect.PROXY)
        yield wire


async def serve_proxy(proxy: Proxy[Any], stdin: ByteReceiveStream, stdout: ByteSendStream,
                      *, max_frame_bytes: int | None = None) -> None:
    """Run `proxy` as a stand-alone stdio proxy program until its stdin closes."""
    sink = PipeSink(stdout)
    host = ProxyHost(proxy, sink.send)
    decoder = FrameDecoder() if max_frame_bytes is None else FrameDecoder(
        max_frame_bytes=max_frame_bytes)

    async def refuse(head: Head, code: int, reason: str) -> None:
        """Answer for a frame not decoded: a request gets an error, an answer settles the
        request it answered with one, so nobody waits for what was dropped."""
        log.error("%s: %s; dropped", proxy.name, reason)
        if head.is_batch or head.is_notification:
            return
        if head.has_method:
            await host.emit(error_response(head.id, code, reason, {"component": proxy.name}))
        elif head.id is not None:
            await host.dispatch(error_response(head.id, ErrorCode.INTERNAL_ERROR, reason))

    async def handle(frame: bytes | OversizedFrame) -> None:
        if isinstance(frame, OversizedFrame):
            await refuse(frame.top, ErrorCode.INVALID_REQUEST,
                         f"a {frame.size}-byte message exceeds the {frame.limit}-byte limit")
            return
        try:
            item = decode(frame)
        except UnreadableFrame as e:
            await refuse(e.head, e.code, f"a message from the conductor is {e.reason}")
            return
        except ParseError as e:
            log.warning("%s: not JSON from the conductor (dropped): %s", proxy.name, e)
            return
        items = item.items if isinstance(item, Batch) else [item]
        for one in items:
            if isinstance(one, InvalidMessage):
                log.warning("%s: invalid message from the conductor: %s", proxy.name, one.reason)
            else:
                await host.dispatch(one)

    try:
        async with anyio.create_task_group() as tg:
            host.task_group = tg
            await serve_frames(stdin, decoder, handle)
            tg.cancel_scope.cancel()  # the conductor closed our stdin: we are done
    finally:
        with anyio.CancelScope(shield=True):
            await sink.aclose()


def run_stdio(load: Callable[[], Proxy[Any]], *, max_frame_bytes: int | None = None) -> None:
    """Serve a plugin on this process's stdin/stdout (the stand-alone form).

    fd 1 is pointed at stderr before `load` imports any user code, so a stray `print`
    lands in the log instead of corrupting the wire; the wire keeps the real stdout.
    """
    import os
    import sys

    from conductor.logs import ProxyFormatter

    sys.stdout.flush()
    wire_fd = os.dup(1)
    os.dup2(2, 1)
    for handler in logging.getLogger("acp_conductor.proxy").handlers:
        handler.setFormatter(ProxyFormatter(prefixed=False))  # the conductor adds our name
    proxy = load()
    anyio.run(_serve_fds, proxy, wire_fd, max_frame_bytes)


async def _serve_fds(proxy: Proxy[Any], wire_fd: int, max_frame_bytes: int | None) -> None:
    from conductor.transport.stdio import FdReceiveStream, FdSendStream

    await serve_proxy(proxy, FdReceiveStream(0), FdSendStream(wire_fd),
                      max_frame_bytes=max_frame_bytes)
