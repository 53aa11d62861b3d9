"""One JSON-RPC connection as one side of it sees it: the only request correlator.

An `Endpoint` owns, for one connection:
- the ids of the requests it sends and what waits for their answers (`Outgoing`): a task
  (`request`, `call`), or a callback (`deliver`, how the router forwards without a task
  per request);
- the requests it received and are still open (`Inbound`): the cancel scope of a handler
  running for one, or where the router forwarded it;
- `$/cancel_request` both ways: `cancel` sends one for an outgoing request (at most once),
  `cancel_inbound` acts on one that arrived;
- `answer`: runs a handler for an incoming request and sends its reply; the single place
  where what a handler raises becomes a wire error (`conductor.rpc.failure.error_for`);
- batches that arrived: replies to their requests leave as one array;
- one writer at a time, first come first served.

It does no I/O of its own beyond `sink.send`; whoever reads the connection hands it the
responses (`settle`) and the cancels (`cancel_inbound`) and decides what else to do.
"""

from __future__ import annotations

import logging
from collections import deque
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

import anyio
import msgspec
from msgspec import UNSET, Raw, UnsetType

from conductor import acp
from conductor.errors import ConnectionClosedError
from conductor.jsonrpc.message import (
    Message,
    Notification,
    Request,
    Response,
    error_response,
    id_key,
    int_id,
    payload,
)
from conductor.record import Record
from conductor.rpc.failure import cancelled_response, failure_response, raise_for_error

log = logging.getLogger("acp_conductor.rpc")
_ID_DIGITS = 20  # more than any id the conductor allocates (2**64 has 20 digits)

if TYPE_CHECKING:
    from conductor.jsonrpc.head import Head
    from conductor.jsonrpc.message import JsonValue
    from conductor.transport.base import MessageSink

# What a request handler returns: a Response (e.g. one it got by forwarding), a Raw
# result, a pydantic model, or any JSON value (so: anything). It raises RpcError to answer
# with an error.
Reply = Any
Deliver = Callable[["Outgoing", Response], Awaitable[None]]
# (message, who speaks, (hop, id) of the request it forwards)
# A one-message list: a reply that goes out inside a batch's array.
Observer = Callable[[Message | list[Message], str, "tuple[str, Raw] | None"], None]
_GONE = (anyio.BrokenResourceError, anyio.ClosedResourceError)


class Outgoing:
    """A request sent on this connection, until its answer arrives."""

    # (__weakref__: a deadline refers to it without keeping it, or its payload, once answered)
    __slots__ = ("__weakref__", "_done", "answer", "cancel_sent", "context", "deliver",
                 "failure", "ident", "method")

    def __init__(self, ident: int, method: str, deliver: Deliver | None, context: Any) -> None:
        self.ident = ident
        self.method = method
        self.deliver = deliver        # None: a task waits for it (Endpoint.wait)
        self.context = context        # whatever the sender wants back with the answer
        self.answer: Response | None = None
        self.failure: BaseException | None = None  # the connection failed instead
        self.cancel_sent = False
        self._done: anyio.Event | None = None

    @property
    def done(self) -> bool:
        return self.answer is not None

    @property
    def id(self) -> Raw:
        return int_id(self.ident)


class Inbound(Record):
    """A request that arrived on this connection and is not answered yet."""

    scope: anyio.CancelScope | None = None   # a handler runs for it here
    target: Endpoint | None = None           # or it was forwarded there ...
    target_id: int = 0                       # ... under this id
    # or cancelling it means something else (the plugin host cancels a handler's forwards)
    on_cancel: Callable[[], Awaitable[None]] | None = None


class _BatchReplies(Record):
    """Answers owed for one batch that arrived; sent as one array when complete."""

    wanted: int  # how many of its requests are not answered yet
    replies: list[Message] = msgspec.field(default_factory=list)
    intake_open: bool = True

    @property
    def complete(self) -> bool:
        return not self.intake_open and not self.wanted


class _WriterTurn:
    """FIFO mutual exclusion for the writers of one connection.

    Taken once per message, so when free it costs one flag test: anyio.Lock (even with
    fast_acquire) looks up the task and walks its cancel scopes every time.
    """

    __slots__ = ("_waiters", "busy")

    def __init__(self) -> None:
        self.busy = False
        self._waiters: deque[anyio.Event] = deque()

    async def __aenter__(self) -> None:
        if not self.busy:
            self.busy = True
            return
        turn = anyio.Event()
        self._waiters.append(turn)
        try:
            await turn.wait()
        except BaseException:
            if turn.is_set():
                self.release()  # handed the turn just as we were cancelled: pass it on
            else:
                self._waiters.remove(turn)
            raise

    async def __aexit__(self, *exc_info: object) -> None:
        self.release()

    def release(self) -> None:
        if self._waiters:
            self._waiters.popleft().set()  # stays busy: the turn goes to the next writer
        else:
            self.busy = False


class Endpoint:
    """One side of one JSON-RPC connection. See the module docstring."""

    def __init__(self, name: str, sink: MessageSink) -> None:
        self.name = name
        self.sink = sink
        self.pending: dict[int, Outgoing] = {}
        self.inbound: dict[object, Inbound] = {}
        self.failure: BaseException | None = None
        # Called before a task blocks waiting for an answer (the plugin host lets its
        # dispatch go on meanwhile).
        self.before_wait: Callable[[], None] | None = None
        # Sees every message sent, with who speaks and the request it forwards (traces).
        self.observe: Observer | None = None
        self._next_id = 0
        self._turn = _WriterTurn()
        # A sink that can queue without waiting (transport/base.py's MessageSink note).
        self._sink_nowait: Callable[[Message], bool] | None = getattr(sink, "send_nowait",
                                                                      None)
        self._batches = 0  # how many arrived batches still collect their replies
        # The open batches owing a reply to each id (by its exact bytes), oldest first: a
        # reply finds its batch at once, however large the batch (a 1 MB frame holds 20,000
        # requests) and in whatever order the answers come.
        self._batch_owed: dict[bytes, deque[_BatchReplies]] = {}
        self._quiet = anyio.Event()  # set while no inbound request is open
        self._quiet.set()
        # Answers to rewrite on their way out, by request id bytes (`amend_answer`).
        self._amend: dict[bytes, Callable[[Response], Response]] = {}

    def __repr__(self) -> str:
        return f"Endpoint({self.name})"

    # -- writing -------------------------------------------------------------------------

    async def send(self, message: Message, *, source: str = "conductor",
                   origin: tuple[str, Raw] | None = None) -> None:
        """Write one message (a reply to a batch member waits for the whole batch).
        `source` (who speaks) and `origin` (the request it forwards) are for the observer.

        Raises:
            anyio.BrokenResourceError: the peer is gone.
        """
        if self._amend and type(message) is Response:
            amend = self._amend.pop(bytes(message.id), None)
            if amend is not None:
                message = amend(message)
        batch = self._batch_for(message.id) \
            if self._batches and type(message) is Response else None
        if self.observe is not None:
            self.observe(message if batch is None else [message], source, origin)
        if batch is not None:
            batch.replies.append(message)
            await self._flush_if_complete(batch)
            return
        turn = self._turn
        if turn.busy:
            async with turn:  # one writer per connection, FIFO
                await self.sink.send(message)
            return
        # The turn is free: take it inline (this is every routed message's path; `async
        # with` would cost two more coroutines per message).
        turn.busy = True
        try:
            await self.sink.send(message)
        finally:
            turn.release()

    def send_nowait(self, message: Message) -> bool:
        """Write one message without waiting, when nothing stands in the way: no batch
        open, no writer mid-write, no observer, and a sink that can queue it at once.
        False: nothing was sent (call `send`)."""
        if self._batches or self._turn.busy or self.observe is not None \
                or self._sink_nowait is None or self._amend:
            return False
        return self._sink_nowait(message)

    def amend_answer(self, ident: Raw, amend: Callable[[Response], Response]) -> None:
        """The answer this endpoint sends to request `ident` goes out as `amend(answer)`,
        whoever answers it (a handler, or a forward's answer passed back)."""
        self._amend[bytes(ident)] = amend

    async def notify(self, method: str, params: object = UNSET) -> None:
        await self.send(Notification(method=method, params=_params(params)))

    # -- requests we send ----------------------------------------------------------------

    def open_request(self, method: str, params: Raw | UnsetType = UNSET, *,
                     deliver: Deliver | None = None, context: Any = None,
                     wire_method: str | None = None,
                     wire_params: Raw | UnsetType | None = None,
                     ident: int | None = None) -> tuple[Outgoing, Request]:
        """Allocate an id for a request and remember it; the caller sends the Request.

        `method` is what the request is (for answers, traces and errors); `wire_method` /
        `wire_params`, when given, are what goes on the wire (a successor envelope).
        `ident` picks the id (tests); by default the next free one.
        """
        if ident is None:
            self._next_id += 1
            ident = self._next_id
        elif ident in self.pending:
            raise ValueError(f"{self.name}: request id {ident} is already pending")
        outgoing = Outgoing(ident, method, deliver, context)
        self.pending[ident] = outgoing
        request = Request(id=outgoing.id, method=wire_method or method,
                          params=params if wire_params is None else wire_params)
        return outgoing, request

    async def request(self, method: str, params: object = UNSET, *,
                      ident: int | None = None, cancel_on_abort: bool = True) -> Response:
        """Send a request and wait for its answer (a result or an error, as received).

        Cancelling the caller sends `$/cancel_request` for it, unless `cancel_on_abort`
        is False (the caller stops the work another way, e.g. ACP's `session/cancel`).
        Raises:
            ConnectionClosedError (or the connection's failure): no answer can come.
        """
        if self.failure is not None:
            raise self.failure
        outgoing, request = self.open_request(method, _params(params), ident=ident)
        try:
            await self.send(request)
        except _GONE as e:
            self.pending.pop(outgoing.ident, None)
            raise ConnectionClosedError(f"{self.name}: connection closed before {method}") \
                from e
        except BaseException:
            # Cancelled while being written (waiting for the writer's turn, a full pipe):
            # nothing will wait for its answer, so nothing may keep it pending. A sink may
            # still write it (a pipe keeps what it took, never cutting a frame), so the peer
            # is told to stop, as a cancelled wait does; a cancel naming nothing is ignored.
            self.pending.pop(outgoing.ident, None)
            if cancel_on_abort:
                with anyio.CancelScope(shield=True), anyio.move_on_after(1):
                    await self.cancel(outgoing)
            raise
        return await self.wait(outgoing, cancel_on_abort=cancel_on_abort)

    async def call(self, method: str, params: object = UNSET) -> Response:
        """`request`, raising RpcError when the answer is an error."""
        return raise_for_error(await self.request(method, params))

    async def wait(self, outgoing: Outgoing, *, cancel_on_abort: bool = True) -> Response:
        """The answer to `outgoing`. Cancelling the wait cancels the request (unless
        `cancel_on_abort` is False; then it is only forgotten).

        Raises:
            ConnectionClosedError (or the connection's failure): no answer can come.
        """
        if outgoing.answer is None and outgoing.failure is None:
            if self.before_wait is not None:
                self.before_wait()
            if outgoing._done is None:
                outgoing._done = anyio.Event()
            try:
                await outgoing._done.wait()
            except BaseException:
                if cancel_on_abort:
                    with anyio.CancelScope(shield=True), anyio.move_on_after(1):
                        await self.cancel(outgoing)
                else:
                    self.pending.pop(outgoing.ident, None)
                raise
        if outgoing.failure is not None:
            raise outgoing.failure
        assert outgoing.answer is not None
        return outgoing.answer

    async def cancel(self, outgoing: Outgoing, params: Raw | UnsetType = UNSET) -> None:
        """Ask the far end to stop (`$/cancel_request`, once); it still answers, usually
        -32800. `params` keeps what the canceller sent beside `requestId`."""
        if outgoing.done or outgoing.cancel_sent or outgoing.failure is not None \
                or self.failure is not None:
            return
        outgoing.cancel_sent = True
        body = acp.set_key(params, "requestId", outgoing.id) if params is not UNSET \
            else payload({"requestId": outgoing.ident})
        try:
            await self.send(Notification(method=acp.CANCEL_REQUEST, params=body))
        except _GONE:
            pass  # the reader sees the peer go and fails what it owed

    async def settle(self, response: Response) -> Outgoing | None:
        """An answer arrived: hand it to its request. None when no request has that id."""
        outgoing = self.take(response.id)
        if outgoing is None:
            return None
        await self._resolve(outgoing, response)
        return outgoing

    def take(self, ident: Raw) -> Outgoing | None:
        """Forget the request with this id and return it (None when not pending)."""
        try:
            key = id_key(ident)
        except ValueError:
            return None
        if isinstance(key, str) and len(key) <= _ID_DIGITS and key.isdecimal() \
                and key == str(int(key)):
            # "7" for our 7 (some JSON-RPC libraries keep ids as text): strictly it
            # matches nothing, and the asker would wait for ever. Ours are only integers
            # (and short: int() refuses a string of thousands of digits, a crash here).
            outgoing = self.pending.pop(int(key), None)
            if outgoing is not None:
                log.warning("%s answered request %s with the id as a string; taken as %s",
                            self.name, key, key)
            return outgoing
        return self.pending.pop(key, None) if isinstance(key, int) else None

    async def expire(self, outgoing: Outgoing, response: Response) -> bool:
        """Answer `outgoing` here, with `response`, instead of waiting for the peer (it took
        too long); a later answer from the peer is then for an unknown id. False when it
        was answered meanwhile (then nothing is done)."""
        if self.pending.get(outgoing.ident) is not outgoing:
            return False
        del self.pending[outgoing.ident]
        await self._resolve(outgoing, response)
        return True

    async def _resolve(self, outgoing: Outgoing, response: Response) -> None:
        # `deliver` runs first (it may set another answer, e.g. when a hook fails); then a
        # task waiting for it wakes with that answer.
        if outgoing.deliver is not None:
            await outgoing.deliver(outgoing, response)
        if outgoing.answer is None:
            outgoing.answer = response
        if outgoing._done is not None:
            outgoing._done.set()

    async def fail(self, error: BaseException, *, component: str | None = None) -> None:
        """The connection is gone: every request still open on it gets `error` as its
        answer (a `deliver` callback as a wire error naming `component`; a waiting task
        has it raised). Later requests fail at once. Idempotent."""
        if self.failure is not None:
            return
        self.failure = error
        await self.fail_pending(error, component=component)

    async def fail_pending(self, error: BaseException, *, component: str | None = None) -> None:
        """Every request still open on this connection gets `error` as its answer, as in
        `fail`, but the connection stays usable: for a peer that can no longer answer while
        it still reads what we send (it closed only its side)."""
        owed = list(self.pending.values())
        self.pending.clear()
        for outgoing in owed:
            outgoing.failure = error
            try:
                if outgoing.deliver is not None:
                    await outgoing.deliver(outgoing, failure_response(
                        outgoing.id, error, component=component or self.name,
                        method=outgoing.method))
            except Exception as e:
                # One recipient that cannot take its answer (its own connection broke) must
                # not cost the others theirs.
                log.warning("%s: the failure answer to %s could not be delivered: %s",
                            self.name, outgoing.method, e)
                log.debug("delivery failure", exc_info=True)
            finally:
                if outgoing._done is not None:
                    outgoing._done.set()

    # -- requests we received ------------------------------------------------------------

    def track_inbound(self, ident: Raw, inbound: Inbound) -> object:
        """Remember an open request by its id, so a cancel can find it, and `wait_quiet`
        waits for its answer. Returns its key."""
        key = _inbound_key(ident)
        self.inbound[key] = inbound
        if self._quiet.is_set():
            self._quiet = anyio.Event()
        return key

    def untrack_inbound(self, ident: Raw, inbound: Inbound | None = None) -> None:
        """Forget the open request `ident`; with `inbound`, only if it is still that one: a
        client may reuse an id once answered (or, wrongly, while in flight), and the newer
        request must stay tracked (its cancel, and `wait_quiet` waiting for its answer)."""
        key = _inbound_key(ident)
        if inbound is None or self.inbound.get(key) is inbound:
            self.inbound.pop(key, None)
        if not self.inbound:
            self._quiet.set()

    async def wait_quiet(self) -> None:
        """Until every request received on this connection has been answered."""
        await self._quiet.wait()

    def cancelled_by(self, params: Raw | UnsetType) -> Inbound | None:
        """The open request a `$/cancel_request` with these params names, if any."""
        ident = acp.get_raw(params, "requestId")
        if ident is None:
            return None
        try:
            return self.inbound.get(id_key(ident))
        except ValueError:
            return None

    async def cancel_inbound(self, params: Raw | UnsetType) -> bool:
        """A `$/cancel_request` arrived: cancel that request's handler, or re-issue the
        cancel where it was forwarded. False when it names nothing open (then ignored)."""
        inbound = self.cancelled_by(params)
        if inbound is None:
            return False
        if inbound.on_cancel is not None:
            await inbound.on_cancel()
        elif inbound.scope is not None:
            inbound.scope.cancel()
        elif inbound.target is not None:
            outgoing = inbound.target.pending.get(inbound.target_id)
            if outgoing is None:
                return False
            await inbound.target.cancel(outgoing, params)
        return True

    async def answer(self, request: Request, handler: Callable[[Request], Awaitable[Reply]],
                     inbound: Inbound | None = None) -> None:
        """Run `handler` for `request` under its own cancel scope and send the reply.

        What the handler raises is answered, never raised: RpcError as itself, anything
        else by `error_for`; a cancelled handler is answered -32800. `inbound` is how the
        request is tracked meanwhile (default: a cancel cancels the handler).
        """
        inbound = inbound if inbound is not None else Inbound()
        inbound.scope = anyio.CancelScope()
        self.track_inbound(request.id, inbound)
        reply: Response | None = None
        try:
            assert inbound.scope is not None
            with inbound.scope:
                try:
                    reply = reply_to(request.id, await handler(request))
                except Exception as e:  # the wire gets an answer, whatever the handler did
                    reply = failure_response(request.id, e, component=self.name,
                                             method=request.method)
            if inbound.scope.cancelled_caught or reply is None:
                reply = cancelled_response(request.id, component=self.name)
        finally:
            # Forgotten before the answer goes: once the peer has it, it may use the id again.
            self.untrack_inbound(request.id, inbound)
        if self.failure is None:
            try:
                await self.send(reply)
            except _GONE:
                pass  # the peer left: its reader ends the connection

    async def refuse_unread(self, head: Head, code: int, reason: str,
                            data: JsonValue = None) -> None:
        """A frame from the peer could not be decoded (too large, not UTF-8, too deep):
        answer for it by what a scan of its top level showed, so nobody waits for what was
        dropped. A request gets the error under its own id; an answer fails the request it
        answered; a notification gets nothing; a batch, or junk with neither a method nor an
        id, gets one error with id null (JSON-RPC 2.0 §6)."""
        error = error_response
        if head.is_batch or (head.id_known and not head.has_method and head.id is None
                             and not head.bad_id):
            await self._send_quietly(error(None, code, reason, data))
        elif head.is_notification:
            return
        elif head.has_method:
            await self._send_quietly(error(head.id, code, reason, data))
        elif head.id is not None:
            await self.settle(error(head.id, code, reason, data))

    async def _send_quietly(self, message: Message) -> None:
        try:
            await self.send(message)
        except _GONE:
            pass  # the peer left: its reader ends the connection

    # -- batches -------------------------------------------------------------------------

    def open_batch(self, request_ids: list[Raw]) -> _BatchReplies:
        """Start collecting: replies to these ids are held back until `end_batch`."""
        batch = _BatchReplies(len(request_ids))
        for ident in request_ids:
            self._batch_owed.setdefault(bytes(ident), deque()).append(batch)
        self._batches += 1
        return batch

    async def end_batch(self, batch: _BatchReplies) -> None:
        batch.intake_open = False
        await self._flush_if_complete(batch)

    def _batch_for(self, ident: Raw) -> _BatchReplies | None:
        # By the id's exact bytes: duplicate and float ids are still matched one by one.
        key = bytes(ident)
        owed = self._batch_owed.get(key)
        if owed is None:
            return None
        batch = owed.popleft()
        if not owed:
            del self._batch_owed[key]
        batch.wanted -= 1
        return batch

    async def _flush_if_complete(self, batch: _BatchReplies) -> None:
        if not batch.complete:
            return
        self._batches -= 1
        if batch.replies:  # a batch of only notifications gets nothing
            async with self._turn:
                await self.sink.send(batch.replies)


def _inbound_key(ident: Raw) -> object:
    """An open request's key in `Endpoint.inbound`. An id such as `1.5` has no `id_key`
    (no cancel can name it) but its request is open all the same: keyed by its bytes, in a
    tuple that no cancel's key can equal."""
    try:
        return id_key(ident)
    except ValueError:
        return (bytes(ident),)


def reply_to(ident: Raw, reply: Reply) -> Response:
    """The Response to request `ident` for what a handler returned.

    Raises:
        TypeError: the handler returned a request or notification.
    """
    if isinstance(reply, Response):
        return reply.answering(ident)
    if isinstance(reply, Request | Notification):
        raise TypeError(f"a handler returned a {reply.method} message, not a response")
    return Response(id=ident, result=payload(reply))


def _params(params: object) -> Raw | UnsetType:
    if params is UNSET or params is None:
        return UNSET
    return payload(params)

