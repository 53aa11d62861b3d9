"""Running a plugin: the proxy side of the proxy protocol, hidden behind the Proxy API.

`ProxyHost` turns what the conductor sends a proxy (plain messages from the predecessor,
`_proxy/successor` envelopes from the successor, responses, cancels) into handler calls,
and what handlers do back into the proxy protocol. Its connection to the conductor is one
`Endpoint` (ids, pending requests, cancellation). The same host runs a plugin in-process
(`open_inprocess_proxy`: message objects in and out, nothing encoded) and stand-alone
(`serve_proxy`: frames on stdin/stdout).

Dispatch is in order, in one task, like a subprocess reading its stdin. A handler runs
inline until it first waits for an answer (or calls `ctx.release()`); then the host goes
on dispatching while the handler waits in its own task. So a session's route is installed
before the next message is dispatched, and nothing overtakes a handled message that has not
been forwarded yet: a handler of an agent-side notification that let dispatch go on holds
what the agent side sends after it (`_hold`) until it forwards or returns, so the editor
sees the agent's stream in order, a turn's answer last.
"""

from __future__ import annotations

import contextvars
import functools
import logging
from collections import deque
from collections.abc import Coroutine
from contextlib import asynccontextmanager
from typing import TYPE_CHECKING, Any, Final, TypeVar

import anyio
import msgspec
from msgspec import UNSET, Raw, UnsetType

from conductor import acp
from conductor.acp import Dialect
from conductor.errors import REACHES_CLIENT, ComponentStartError, ProtocolVersionError, RpcError
from conductor.jsonrpc.codes import ErrorCode
from conductor.jsonrpc.message import (
    Batch,
    InvalidMessage,
    Message,
    Notification,
    Request,
    Response,
    error_response,
    id_key,
)
from conductor.plugins.api import (
    CloseReason,
    Handler,
    Proxy,
    ProxyContext,
    SessionScope,
    Side,
    WatchContext,
    not_json,
)
from conductor.record import Record
from conductor.routing.sessions import Lifecycle, PendingLoads, Step, lifecycle
from conductor.routing.topology import Hop
from conductor.rpc.endpoint import Endpoint, Inbound, Outgoing
from conductor.rpc.failure import failure_response
from conductor.transport.base import Oversized, Unreadable
from conductor.transport.pipes import CoalescedWrites, PipeSink, PipeSource

if TYPE_CHECKING:
    from collections.abc import AsyncIterator, Awaitable, Callable, Mapping

    from anyio.abc import ByteReceiveStream, ByteSendStream, TaskGroup, TaskStatus
    from anyio.streams.memory import MemoryObjectReceiveStream, MemoryObjectSendStream

    from conductor.jsonrpc.message import Call
    from conductor.plugins.tools import ToolServers
    from conductor.tracing.sink import TraceSink
    from conductor.transport.base import Incoming, MessageSink


log = logging.getLogger("acp_conductor.plugins")
_T = TypeVar("_T")

# Messages waiting for an in-process proxy. Bounded like a pipe buffer; large enough that
# traffic flowing both ways at once cannot fill both inboxes and wedge each other.
INBOX_SIZE: Final = 256
_ALWAYS_VISIT: Final = frozenset({acp.INITIALIZE, *acp.PROXY_INITIALIZE_METHODS,
                                  *acp.SUCCESSOR_METHODS, *acp.SESSION_SETUP,
                                  acp.SESSION_CLOSE, acp.SESSION_DELETE, acp.CANCEL_REQUEST})
_GONE = (anyio.BrokenResourceError, anyio.ClosedResourceError)
# How long a proxy's stop hooks (session_closed for each open session, chain_stopped) may
# take: a plugin flushing its files must not hold the conductor's exit for ever.
STOP_HOOKS_GRACE: Final = 5.0
# How long `chain_started` may take (a plugin connecting to a server that never answers
# must not keep the editor's initialize waiting for ever: nothing else bounds the start).
START_HOOK_BOUND = 60.0
# How long `session_opened`, `session_closed` and `session_mcp_servers` may take: they run
# inline, in the proxy's dispatch, so everything crossing the proxy waits for them.
SESSION_HOOK_BOUND = 10.0
# How long a handler of an agent-side notification may hold what the agent sends after it
# (docs/writing-a-proxy.md, "Ordering"), and how many it may hold, before the hold gives
# way with a warning: a hold must never become a hang, nor an unbounded queue.
HOLD_BOUND: Final = 30.0
HELD_LIMIT: Final = 4 * INBOX_SIZE
# How long a cancelled handler waits for the far end to answer a request it sent (so its
# own answer follows what the far end streamed before answering).
CANCELLED_ANSWER_GRACE: Final = 5.0
# The ACP requests whose result is always an object (the schemas'), so a handler answering
# one with None forgot its `return`. Not mcp/message: its result is the inner MCP one.
_OBJECT_ANSWERS: Final = (acp.AGENT_METHODS | acp.CLIENT_METHODS) - {acp.MCP_MESSAGE}
# Scopes kept for sessions a proxy never saw set up (see ProxyHost.session_of).
MAX_STRAY_SCOPES: Final = 1024
# The `release` of the handler a task runs for (its child tasks inherit it): a wait in the
# handler holding dispatch releases it; a wait in another handler, or in a task dispatch
# started (`_not_a_handler`: MCP tool calls), does not, or messages would overtake the held one.
# A task of the plugin's own (no value) still releases it, as it always did: it may be doing
# the holding handler's work.
_handler_release: contextvars.ContextVar[Callable[[], None]] = contextvars.ContextVar(
    "acp_handler_release")


def _not_a_handler() -> None:
    """The `_handler_release` of dispatch and of the tasks it starts: releases nothing."""


def plugin_failure(error: BaseException) -> Exception | None:
    """What a plugin's code raised, as the failure to answer or log. An ExceptionGroup (a
    task group in a handler) is its real cause (or, for several, all of them, an RpcError
    first); `sys.exit()` is a failure like any other, since a plugin cannot stop the
    conductor. None: no failure of the plugin's (a cancellation, Ctrl-C): it goes on."""
    if isinstance(error, Exception) and not isinstance(error, BaseExceptionGroup):
        return error  # the common case: as it is
    leaves: list[BaseException] = []
    todo = [error]
    while todo:
        one = todo.pop()
        if isinstance(one, BaseExceptionGroup):
            todo.extend(reversed(one.exceptions))
        else:
            leaves.append(one)
    failures: list[Exception] = []
    for leaf in leaves:
        if isinstance(leaf, SystemExit):
            exited = RuntimeError(f"sys.exit({leaf.code!r}) was called, and a plugin cannot "
                                  "stop the conductor")
            exited.__traceback__ = leaf.__traceback__
            failures.append(exited)
        elif isinstance(leaf, Exception):
            failures.append(leaf)
        else:
            return None
    if len(failures) == 1:
        return failures[0]
    rpc = next((f for f in failures if isinstance(f, RpcError)), None)
    return rpc if rpc is not None else RuntimeError(
        f"{len(failures)} errors: " + "; ".join(f"{type(f).__name__}: {f}" for f in failures))


class _Everything:
    """A set that contains every method (a proxy with a `*` handler sees all)."""

    def __contains__(self, item: object) -> bool:
        return True


_EVERYTHING: Final = _Everything()
_FROM_SUCCESSOR: Final = frozenset({Side.SUCCESSOR})
_FROM_PREDECESSOR: Final = frozenset({Side.PREDECESSOR})
_IN_NO_STREAM: Final[frozenset[Side]] = frozenset()  # held only while a drain dispatches


class HostRequest:
    """A request the proxy sent (its own, or a forward): `PendingRequest` of the API."""

    __slots__ = ("_endpoint", "_host", "outgoing", "owner")

    def __init__(self, host: ProxyHost, outgoing: Outgoing) -> None:
        self._host = host
        self._endpoint = host.endpoint
        self.outgoing = outgoing
        self.owner: ProxyContext | None = None  # the handler that sent it, if one did

    @property
    def done(self) -> bool:
        return self.outgoing.done or self.outgoing.failure is not None

    async def wait(self) -> Response:
        try:
            return await self._endpoint.wait(self.outgoing)
        except anyio.get_cancelled_exc_class():
            # The handler was cancelled (its request's cancel) with this one sent: the wait
            # sent its cancel; the far end's answer comes after whatever it streamed for
            # it, so the handler's own answer (-32800) must not go before that answer.
            # Not when the proxy is stopping: its dispatch, which would settle that
            # answer, stops too, so nothing can come (the chain's exit must not wait).
            # Nor when something else cancelled the wait (the plugin's own timeout): the
            # grace is for the handled request's cancel only.
            host = self._host
            if host.stopping or self.owner is None or self.owner not in host.peer_cancelled:
                raise
            with anyio.CancelScope(shield=True) as grace, \
                    anyio.move_on_after(CANCELLED_ANSWER_GRACE):
                host.graces.add(grace)
                try:
                    await self._endpoint.wait(self.outgoing)
                except Exception:
                    pass  # the connection failed: nothing more will come
                finally:
                    host.graces.discard(grace)
            raise

    async def cancel(self) -> None:
        await self._endpoint.cancel(self.outgoing)


class _Sent(Record):
    """What the host needs back with an answer (the context of its Outgoing)."""

    rule: Lifecycle | None       # the session lifecycle step this request takes
    owned: bool                  # a session it opens is the proxy's own
    origin_id: Raw | None = None  # a pass-through forward: answer the conductor's id
    params: Raw | UnsetType = UNSET  # the request's (a session's setup, for its scope)
    declared: list[str] | None = None  # serverIds of this proxy's MCP servers it declares
    fresh: bool = False          # a load/resume of a session no answer has confirmed yet
    inbound: Inbound | None = None  # a pass-through forward: how the conductor's id is tracked
    to: Side = Side.SUCCESSOR    # where it went (its answer comes from there)
    owner: ProxyContext | None = None  # the handler that sent it, if one did
    about: Raw | None = None     # a handler's forward: the id of the request it handles


class _CallbackSink:
    """A MessageSink that hands each message to a callback (the router, in-process)."""

    __slots__ = ("_deliver",)

    def __init__(self, deliver: Callable[[Message], Awaitable[None]]) -> None:
        self._deliver = deliver

    async def send(self, item: Message | list[Message]) -> None:
        for message in item if isinstance(item, list) else (item,):
            await self._deliver(message)

    async def aclose(self) -> None:
        return None


def _turn_update(scope: SessionScope, msg: Call) -> None:
    """A message from the successor for a session this proxy owns: the v2 idle state ends
    the turn its `SessionScope.prompt` waits for."""
    if scope.turns_waiting and msg.method == acp.SESSION_UPDATE \
            and acp.idle_session(msg.params) == scope.session_id:
        for idle in scope.turns_waiting:
            idle.set()


class ProxyHost:
    """One plugin instance speaking the proxy protocol to one conductor."""

    def __init__(self, proxy: Proxy[Any], sink: MessageSink, *,
                 next_to_client: bool = True) -> None:
        self._proxy = proxy
        # Whether its predecessor is the client: only then does an error answer to a
        # request from there reach the client (behind a proxy, it may be that proxy's own).
        self._next_to_client = next_to_client
        self.name = proxy.name
        self.endpoint = Endpoint(proxy.name, sink)
        self.endpoint.before_wait = self.release_dispatch
        self.task_group: TaskGroup | None = None
        self._sessions: dict[str, SessionScope] = {}
        self._strays: dict[str, None] = {}  # scopes made for sessions never set up, oldest first
        # Loads (resumes) of sessions no answer has confirmed: refused only when all are.
        self._loads = PendingLoads()
        # Sessions the router ended (idle expiry, lost), waiting for dispatch to release them.
        self.releases: deque[tuple[str, CloseReason]] = deque()
        self._handlers = proxy.handlers()
        # Handlers cancelled by their request's cancel (`$/cancel_request`), while they run.
        self.peer_cancelled: set[ProxyContext] = set()
        # Watchers by method, per side ("*" under None): looked up per notification, so
        # keyed by plain strings (an enum's hash is Python code).
        watchers = proxy.watchers()
        self._watch_up = {m: w for (s, m), w in watchers.items() if s is Side.SUCCESSOR}
        self._watch_down = {m: w for (s, m), w in watchers.items() if s is Side.PREDECESSOR}
        self._watch_up_any = self._watch_up.pop("*", None)
        self._watch_down_any = self._watch_down.pop("*", None)
        # What the router calls for a notification it routes past this proxy on its
        # shortcut (None: nothing to watch).
        self.watch: Callable[[Notification, bool], None] | None = \
            self.watch_inline if watchers else None
        self._routed = False   # some session has its own handlers or is ours: read sessionId
        # The ACP version of the initialize its predecessor sent (1 until one arrives).
        self.protocol_version = 1
        self._dialect = Dialect.PROXY
        self._holding: Callable[[], None] | None = None
        # Messages handed to this proxy and not yet fully dispatched (a held handler counts
        # until it releases). Counted at hand-over: anyio gives an item straight to a waiting
        # receiver without it ever showing in the buffer.
        self.queued = 0
        # Set when dispatch stops: a cancelled handler then waits for no answer (`graces`:
        # the shielded waits of those already waiting, cut short by `stop_dispatch`).
        self.stopping = False
        self.graces: set[anyio.CancelScope] = set()
        # Order behind a notification handler that let dispatch go on before forwarding
        # its notification (docs/writing-a-proxy.md, "Ordering"): what its side sends
        # after it is held (`_held`, in arrival order, with the sides it comes from) until
        # it forwards or returns, and then dispatched by `_drain`. Answers its own requests
        # (and unowned ones) need are not held: it may be waiting for them.
        self._barriers: dict[ProxyContext, Side] = {}
        self._barrier_since: dict[ProxyContext, float] = {}  # for the bound (HOLD_BOUND)
        self._watching_holds = False
        self._held: deque[tuple[frozenset[Side], Message | Callable[[], Awaitable[None]]]] = \
            deque()
        self._held_sides: dict[Side, int] = {}
        self._draining = False
        self._ordering = False  # any of the three above: checked on every message
        # Methods this proxy must see, per direction (None: it handles `*`, so everything).
        self._visit_up = self._must_visit(Side.SUCCESSOR)
        self._visit_down = self._must_visit(Side.PREDECESSOR)
        if any(side is Side.PREDECESSOR for side, _ in self._handlers) \
                and not isinstance(self._visit_up, _Everything):
            # A request it handles goes on under its own id: an elicitation (rare) about
            # it must visit, to be told the id its predecessor knows (`_elicitation_scope`).
            self._visit_up |= {acp.ELICITATION_CREATE}
        # MCP servers the proxy offers (docs/mcp.md); the SDK is imported only then.
        self.tools: ToolServers | None = None
        try:
            declared = proxy.declared_mcp_servers()
        except BaseException as raised:
            # A plugin's hook: its failure fails the start naming it, as chain_started's
            # does (it was an "internal error" naming nobody).
            raise self._start_failure(raised, "mcp_servers") from None
        if declared or type(proxy).session_mcp_servers is not Proxy.session_mcp_servers:
            from conductor.plugins.tools import ToolServers
            self.tools = ToolServers(self, proxy.offered_mcp_servers())

    @property
    def proxy(self) -> Proxy[Any]:
        return self._proxy

    @property
    def sessions(self) -> Mapping[str, SessionScope]:
        return self._sessions

    # -- out -----------------------------------------------------------------------------

    async def notify(self, method: str, params: Raw | UnsetType, to: Side) -> None:
        if to is Side.SUCCESSOR:
            await self.endpoint.send(Notification(
                method=self._dialect.successor_method(is_request=False),
                params=acp.encode_envelope(method, params, UNSET, self._dialect)))
        else:
            await self.endpoint.send(Notification(method=method, params=params))

    async def start_request(self, method: str, params: Raw | UnsetType, to: Side, *,
                            on_behalf_of: ProxyContext | None = None,
                            forwarding: bool = False) -> HostRequest:
        # A forward of the handled request stands for it: a v2 elicitation about it (by
        # the id it goes on under) is told the handled one's id (`_elicitation_scope`).
        about = on_behalf_of.message.id if forwarding and on_behalf_of is not None \
            and isinstance(on_behalf_of.message, Request) else None
        outgoing = await self._send_request(method, params, to, _Sent(
            None, owned=not forwarding, owner=on_behalf_of, about=about))
        pending = HostRequest(self, outgoing)
        if on_behalf_of is not None:
            pending.owner = on_behalf_of
            on_behalf_of.adopt(pending)
        return pending

    async def _send_request(self, method: str, params: Raw | UnsetType, to: Side,
                            sent: _Sent) -> Outgoing:
        sent.to = to
        if to is Side.SUCCESSOR and self.tools is not None and method in acp.SESSION_SETUP:
            params, sent.declared = await self.tools.declare(method, params)
        if to is Side.SUCCESSOR:
            sent.rule, sent.params = lifecycle(method, params), params
            if sent.rule is not None and sent.rule.step is Step.OPEN_NOW:
                # Replay precedes the answer: the route must exist before the request goes out.
                assert sent.rule.session_id is not None
                sid = sent.rule.session_id
                sent.fresh = self._loads.sent(sid, known=sid in self._sessions)
                await self._install(sid, method, sent.owned, params)
        deliver = self._answered if sent.rule is not None or sent.origin_id is not None \
            or (self.tools is not None and method == acp.INITIALIZE) else None
        if to is Side.SUCCESSOR:
            outgoing, request = self.endpoint.open_request(
                method, params, deliver=deliver, context=sent,
                wire_method=self._dialect.successor_method(is_request=True),
                wire_params=acp.encode_envelope(method, params, UNSET, self._dialect))
        else:
            outgoing, request = self.endpoint.open_request(method, params, deliver=deliver,
                                                           context=sent)
        try:
            await self.endpoint.send(request)
        except BaseException:
            # Not written (cancelled, or the peer is gone): no answer will ever settle it.
            self.endpoint.pending.pop(outgoing.ident, None)
            raise
        return outgoing

    async def _answered(self, outgoing: Outgoing, answer: Response) -> None:
        """Session routes first (later messages may name the session), then the answer
        goes back to the conductor (a pass-through forward) or to the waiting handler."""
        sent: _Sent = outgoing.context
        if self.tools is not None:
            if outgoing.method == acp.INITIALIZE and not answer.is_error:
                self.tools.learn_initialize(answer.result)
            if sent.declared:
                opened = sent.rule.opened_by(answer) if sent.rule is not None else None
                self.tools.bind(sent.declared, opened)
        if sent.rule is not None:
            try:
                await self._apply(sent, answer)
            except BaseException as raised:  # e.g. session_opened raised: answer, naming it
                e = plugin_failure(raised)
                if e is None:
                    raise
                # Passed back to the client itself, the error reaches the client.
                self._log_failure(e, f"the answer to {outgoing.method}",
                                  reaches_client=self._next_to_client
                                  and sent.origin_id is not None)
                answer = failure_response(answer.id, e, component=self.name,
                                          method=outgoing.method)
                outgoing.answer = answer
        if sent.origin_id is not None:
            self.endpoint.untrack_inbound(sent.origin_id, sent.inbound)
            try:
                await self.endpoint.send(answer.answering(sent.origin_id))
            except _GONE:
                pass  # the conductor went away: nothing left to answer

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
        if self._ordering and self._hold(message, self._sides_of(message)):
            if len(self._held) >= HELD_LIMIT and self._barriers:
                # Held messages leave the bounded inbox. The inbox reader must never wait
                # here (what it would read may be what frees the drain, or another proxy's
                # inbox may wait on ours): past this many, order gives way instead.
                self._give_up_holding(f"{len(self._held)} messages are held behind them")
            return
        await self._dispatch_now(message)

    async def relay(self, then: Callable[[], Awaitable[None]], *, up: bool) -> None:
        """Pass on an answer the router routed past this proxy (`_InboxSink.relay_if_busy`),
        behind what is held of the side it comes from (`up`: the successor's)."""
        if self._ordering and self._hold(then, _FROM_SUCCESSOR if up else _FROM_PREDECESSOR):
            return
        await then()

    def _sides_of(self, message: Message) -> frozenset[Side] | None:
        """The side `message` comes from, for ordering; None: never held (an answer a
        waiting handler may need to go on)."""
        if not isinstance(message, Response):
            if message.method not in acp.SUCCESSOR_METHODS:
                return _FROM_PREDECESSOR
            if self._routed and self._of_own_session(message):
                # Never goes to the editor, so it keeps no order with what does; and the
                # handler holding the agent side back may well be waiting for it (a judge's).
                return _IN_NO_STREAM
            return _FROM_SUCCESSOR
        try:
            key = id_key(message.id)
        except ValueError:
            return None
        outgoing = self.endpoint.pending.get(key) if isinstance(key, int) else None
        sent = outgoing.context if outgoing is not None else None
        if not isinstance(sent, _Sent) or (sent.origin_id is None and (
                sent.owner is None or sent.owner in self._barriers)):
            return None
        return _FROM_SUCCESSOR if sent.to is Side.SUCCESSOR else _FROM_PREDECESSOR

    def _of_own_session(self, message: Call) -> bool:
        """Whether `message`, wrapped as from the successor, is of a session of our own."""
        try:
            env = acp.decode_envelope(message.params)
        except ValueError:
            return False
        scope = self.session_of(env.params, create=False)
        return scope is not None and scope.owned

    def _hold(self, item: Message | Callable[[], Awaitable[None]],
              sides: frozenset[Side] | None) -> bool:
        """Keep `item` for `_drain` if something it must not overtake is held or still in a
        handler (or a drain is dispatching: it alone dispatches until it is done)."""
        if sides is None:
            return False
        if not self._draining and not any(
                self._held_sides.get(side) or side in self._barriers.values()
                for side in sides):
            return False
        self._held.append((sides, item))
        for side in sides:
            self._held_sides[side] = self._held_sides.get(side, 0) + 1
        self.queued += 1
        return True

    def _hold_back(self, ctx: ProxyContext) -> None:
        """`ctx`'s handler let dispatch go on before forwarding its notification."""
        self._barriers[ctx] = ctx.source
        self._barrier_since[ctx] = anyio.current_time()
        self.queued += 1
        self._ordering = True
        if not self._watching_holds and self.task_group is not None:
            self._watching_holds = True
            self.task_group.start_soon(self._bound_holds)

    async def _bound_holds(self) -> None:
        """A handler holding the agent's stream back for HOLD_BOUND lets it go: it may wait
        for something that only comes behind what it holds (the editor side asking the
        agent first), and a hold must never become a hang."""
        try:
            while self._barrier_since and not self.stopping:
                oldest = next(iter(self._barrier_since.values()))
                await anyio.sleep(max(0.0, oldest + HOLD_BOUND - anyio.current_time()))
                now = anyio.current_time()
                late = [c for c, since in self._barrier_since.items() if since + HOLD_BOUND <= now]
                if late:
                    self._give_up_holding(f"a handler of {late[0].message.method} has not "
                                          f"forwarded it for {HOLD_BOUND:g}s", late)
        finally:
            self._watching_holds = False

    def _give_up_holding(self, why: str, which: list[ProxyContext] | None = None) -> None:
        log.warning("proxy %s: %s; what the agent sent after it goes on now, no longer in "
                    "order behind it (docs/writing-a-proxy.md, Ordering)", self.name, why)
        for ctx in list(self._barriers) if which is None else which:
            self._let_go(ctx)

    def _let_go(self, ctx: ProxyContext) -> None:
        """`ctx`'s handler forwarded its notification, or returned (or held too long): what
        it held may go."""
        if self._barriers.pop(ctx, None) is None:
            return  # let go already, by the bound
        del self._barrier_since[ctx]
        self.queued -= 1
        if self._held and not self._draining:
            assert self.task_group is not None
            self._draining = True
            self.task_group.start_soon(self._drain)
        self._ordering = bool(self._barriers or self._held or self._draining)

    def _next_held(self) -> int | None:
        """The first held item nothing keeps back any more (nothing before it from its side
        is held, and no handler of its side holds it back)."""
        blocked = set(self._barriers.values())
        for i, (sides, _) in enumerate(self._held):
            if sides.isdisjoint(blocked):
                return i
            blocked |= sides
        return None

    async def _drain(self) -> None:
        """Dispatch the held items nothing keeps back any more, in order (the only
        dispatcher until done: dispatch holds everything else meanwhile)."""
        _handler_release.set(_not_a_handler)
        try:
            while not self.stopping and (i := self._next_held()) is not None:
                sides, item = self._held[i]
                try:
                    if isinstance(item, Request | Notification | Response):
                        await self._dispatch_now(item)
                    else:
                        await item()
                finally:
                    # (meanwhile only appended to: `i` still holds; usually the first)
                    if i == 0:
                        self._held.popleft()
                    else:
                        del self._held[i]
                    for side in sides:
                        self._held_sides[side] -= 1
                    self.queued -= 1
        finally:
            self._draining = False
            self._ordering = bool(self._barriers or self._held)

    async def _dispatch_now(self, message: Message) -> None:
        try:
            await self._dispatch(message)
        except BaseException as raised:  # a plugin bug must never take the conductor down
            e = plugin_failure(raised)
            if e is None:
                raise
            method = message.method if not isinstance(message, Response) else "an answer"
            self._log_failure(e, method)
            if isinstance(message, Request):
                await self.endpoint.send(failure_response(message.id, e, component=self.name,
                                                          method=message.method))

    async def _dispatch(self, msg: Message) -> None:
        if isinstance(msg, Response):
            if await self.endpoint.settle(msg) is None:
                log.debug("%s: answer for unknown id %r ignored", self.name, bytes(msg.id))
            return
        method = msg.method
        if method == acp.CANCEL_REQUEST:
            if not await self._cancel_not_request(msg, method):
                await self.endpoint.cancel_inbound(msg.params)
            return
        source = Side.PREDECESSOR
        dialect = acp.SUCCESSOR_METHODS.get(method)
        if dialect is not None:
            try:
                env = acp.decode_envelope(msg.params)
            except ValueError as e:
                if isinstance(msg, Request):
                    await self.endpoint.send(error_response(msg.id, ErrorCode.INVALID_PARAMS,
                                                            "Invalid params", str(e)))
                return
            if env.method == acp.CANCEL_REQUEST:
                if not await self._cancel_not_request(msg, env.method):
                    await self.endpoint.cancel_inbound(env.params)
                return
            source = Side.SUCCESSOR
            msg = Request(id=msg.id, method=env.method, params=env.params) \
                if isinstance(msg, Request) else Notification(method=env.method,
                                                               params=env.params)
        elif method in acp.PROXY_INITIALIZE_METHODS:
            self._dialect = acp.PROXY_INITIALIZE_METHODS[method]
            msg = Request(id=msg.id, method=acp.INITIALIZE, params=msg.params) \
                if isinstance(msg, Request) else Notification(method=acp.INITIALIZE,
                                                               params=msg.params)
        elif method == acp.INITIALIZE and acp.is_legacy_proxy_initialize(msg.params):
            self._dialect = Dialect.LEGACY
            if isinstance(msg, Request):
                self.endpoint.amend_answer(msg.id, acp.accepting_legacy_proxy_role)
        if msg.method == acp.INITIALIZE and source is Side.PREDECESSOR:
            try:  # the version its predecessor speaks: what it sends that way is shaped so
                self.protocol_version = acp.protocol_version(msg.params)
            except ProtocolVersionError:
                pass  # its successor answers that initialize with the error
        await self._route(source, msg)

    def _elicitation_scope(self, msg: Call) -> Call:
        """A v2 elicitation from the successor about a request this proxy sent there (by
        its id on this hop, `requestId`): when that request forwarded one from the
        predecessor, it is named by that one's id instead, as the router maps ids per hop.
        """
        key = acp.elicitation_request(msg.params)
        outgoing = self.endpoint.pending.get(key) if type(key) is int else None
        sent = outgoing.context if outgoing is not None else None
        origin = (sent.origin_id or sent.about) if isinstance(sent, _Sent) else None
        if origin is None:
            return msg
        try:
            return msg.with_params(acp.set_key(msg.params, "requestId", origin))
        except ValueError:
            return msg

    async def _cancel_not_request(self, msg: Call, method: str) -> bool:
        """A cancel sent with an id is refused, as the router does: nobody else would
        answer it, and its sender would wait for ever."""
        if not isinstance(msg, Request):
            return False
        await self.endpoint.send(error_response(
            msg.id, ErrorCode.INVALID_REQUEST, "Invalid Request",
            f"`{method}` is a notification: send it without an id"))
        return True

    def watch_inline(self, msg: Notification, from_successor: bool) -> None:
        """`msg` is on its way past this proxy, or through it: its watcher sees it now."""
        if from_successor:
            watcher = self._watch_up.get(msg.method, self._watch_up_any)
            source = Side.SUCCESSOR
        else:
            watcher = self._watch_down.get(msg.method, self._watch_down_any)
            source = Side.PREDECESSOR
        if watcher is not None:
            try:
                watcher(WatchContext(self, source, msg), msg)
            except BaseException as raised:  # it only watches: the notification goes on
                e = plugin_failure(raised)
                if e is None:
                    raise
                self._log_failure(e, msg.method)

    async def _route(self, source: Side, msg: Call) -> None:
        if msg.method == acp.ELICITATION_CREATE and source is Side.SUCCESSOR \
                and self.protocol_version >= 2:
            msg = self._elicitation_scope(msg)
        if self.watch is not None and isinstance(msg, Notification):
            self.watch_inline(msg, source is Side.SUCCESSOR)
        if self.tools is not None and msg.method in acp.MCP_METHODS and self.tools.claims(msg):
            await self.tools.handle(msg, source)
            return
        handler: Handler | None = None
        if self._routed:
            scope = self.session_of(msg.params, create=False)
            if scope is not None:
                if scope.owned and source is Side.SUCCESSOR:
                    _turn_update(scope, msg)
                handler = scope.handler_for(source, msg.method)
                if handler is None and scope.owned and source is Side.SUCCESSOR:
                    await self._unclaimed(msg, scope)  # our own session: never goes upstream
                    return
        if handler is None:
            handler = self._handlers.get((source, msg.method)) \
                or self._handlers.get((source, "*"))
        if handler is None:
            await self._pass(source, msg)
        else:
            assert self.task_group is not None
            await self.task_group.start(self._handle, handler, ProxyContext(self, source, msg))

    async def _pass(self, source: Side, msg: Call) -> None:
        """Forward untouched, inline: the fast path for everything without a handler."""
        if isinstance(msg, Notification):
            await self.notify(msg.method, msg.params, source.other)
            return
        inbound = Inbound(target=self.endpoint)
        sent = _Sent(None, owned=False, origin_id=msg.id, inbound=inbound)
        self.endpoint.track_inbound(msg.id, inbound)
        try:
            outgoing = await self._send_request(msg.method, msg.params, source.other, sent)
        except BaseException:
            # Not sent (a plugin hook raised, or cancelled): `dispatch` answers it, or nobody.
            self.endpoint.untrack_inbound(msg.id, inbound)
            raise
        inbound.target_id = outgoing.ident

    async def _handle(self, handler: Handler, ctx: ProxyContext, *,
                      task_status: TaskStatus[None]) -> None:
        released = holds_back = False

        def release() -> None:
            nonlocal released, holds_back
            if not released:
                released = True
                if ctx.sent_on is not None:  # a notification still to be forwarded
                    holds_back = True
                    self._hold_back(ctx)
                task_status.started()

        def sent_on() -> None:
            nonlocal holds_back
            ctx.sent_on = None
            if holds_back:
                holds_back = False
                self._let_go(ctx)

        ctx.released = release
        if ctx.source is Side.SUCCESSOR and isinstance(ctx.message, Notification):
            # The agent's stream keeps its order (updates, then the turn's answer). Not
            # the editor side's: a handler there may well work on for as long as it likes.
            ctx.sent_on = sent_on
        self._holding = release
        _handler_release.set(release)
        msg = ctx.message
        try:
            if isinstance(msg, Request):
                await self.endpoint.answer(msg, self._run(handler, ctx),
                                           self._cancellable(ctx))
            else:
                try:
                    await handler(ctx, msg)
                except BaseException as raised:
                    e = plugin_failure(raised)
                    if e is None:
                        raise
                    self._log_failure(e, msg.method)
        finally:
            self.peer_cancelled.discard(ctx)
            if self._holding is release:
                self._holding = None
            sent_on()  # returned: nothing of its side waits for it any more
            release()

    def _run(self, handler: Handler, ctx: ProxyContext
             ) -> Callable[[Request], Awaitable[object]]:
        async def run(request: Request) -> object:
            try:
                reply = await handler(ctx, request)
                if isinstance(reply, Coroutine):
                    # `return ctx.forward()`: closed, or its "never awaited" warning would
                    # blame nobody (and fail a test run), and named for what it is.
                    reply.close()
                    name = getattr(handler, "__qualname__", repr(handler))
                    raise TypeError(f"{name} returned an unawaited coroutine for "
                                    f"{request.method}: a missing `await`?")
                if reply is None and (ctx.forwarded or request.method in _OBJECT_ANSWERS):
                    # A missing `return`: a null answer would leave the editor puzzling over
                    # an empty result (every ACP method's is an object), blaming nobody.
                    name = getattr(handler, "__qualname__", repr(handler))
                    if ctx.forwarded:
                        raise TypeError(f"{name} forwarded {request.method} and returned None: "
                                        "return the answer (`return await ctx.forward()`)")
                    raise TypeError(f"{name} answered {request.method} with None, and an ACP "
                                    "answer is an object: return the result (`{}` for an "
                                    "empty one) or `await ctx.forward()`")
                if isinstance(reply, str | int | float | list | tuple) \
                        and request.method in _OBJECT_ANSWERS:
                    # It would reach the editor as the result, the agent's answer to blame.
                    name = getattr(handler, "__qualname__", repr(handler))
                    kind = type(reply).__name__
                    raise TypeError(f"{name} answered {request.method} with "
                                    f"{'an' if kind[0] in 'aeiou' else 'a'} {kind} "
                                    f"({reply!r:.60}), and an ACP answer is an object: return "
                                    "a dict (`{}` for an empty one) or `await ctx.forward()`")
                problem = None if isinstance(reply, Response | Raw) else not_json(reply)
                if problem is not None:
                    name = getattr(handler, "__qualname__", repr(handler))
                    raise TypeError(f"{name} answered {request.method} with a value that is "
                                    f"not JSON: {problem}")
                return reply
            except RpcError:
                raise
            except BaseException as raised:
                e = plugin_failure(raised)
                if e is None:
                    raise
                if isinstance(e, RpcError):  # from inside a task group: its answer still
                    raise e from None
                # Answered with an error: to the client itself, it reaches the client.
                self._log_failure(e, request.method, reaches_client=self._next_to_client
                                  and ctx.source is Side.PREDECESSOR)
                if e is raised:
                    raise
                raise e from None
        return run

    def _cancellable(self, ctx: ProxyContext) -> Inbound:
        """A cancel of a handled request cancels the handler's forwards (the far end
        answers, and the handler passes that back); with none in flight, the handler."""
        inbound = Inbound()

        async def cancel() -> None:
            live = ctx.outstanding
            if live:
                for pending in live:
                    await pending.cancel()
            elif inbound.scope is not None:
                self.peer_cancelled.add(ctx)  # see HostRequest.wait
                inbound.scope.cancel()
        inbound.on_cancel = cancel
        return inbound

    def release_dispatch(self) -> None:
        """The handler holding dispatch waits for something: let dispatch go on."""
        holding = self._holding
        if holding is not None and _handler_release.get(None) in (None, holding):
            self._holding = None
            holding()

    def _log_failure(self, error: BaseException, what: object, *,
                     reaches_client: bool = False) -> None:
        # One line for the user; the traceback is for the plugin's author, at debug level.
        self._proxy.log.error("proxy %s failed handling %s: %s: %s", self.name, what,
                              type(error).__name__, error,
                              extra=REACHES_CLIENT if reaches_client else None)
        self._proxy.log.debug("traceback", exc_info=error)

    async def _unclaimed(self, msg: Call, scope: SessionScope) -> None:
        if isinstance(msg, Request):
            await self.endpoint.send(error_response(
                msg.id, ErrorCode.METHOD_NOT_FOUND, "Method not found",
                f"proxy {self.name} has no handler for {msg.method} in its own session "
                f"{scope.session_id}"))
        else:
            log.debug("%s: %s for own session %s dropped", self.name, msg.method,
                      scope.session_id)

    # -- sessions ------------------------------------------------------------------------

    def session_of(self, params: Raw | UnsetType, *, create: bool) -> SessionScope | None:
        sid = acp.get_str(params, "sessionId")
        if sid is None:
            return None
        scope = self._sessions.get(sid)
        if scope is None and create:  # a session we never saw set up: still give it state
            scope = SessionScope(sid, "unknown", owned=False, host=self)
            self._sessions[sid] = scope
            # No setup, so no close or expiry will name it (an update trailing a close, an
            # editor's stale id): keep only the latest few, so they cannot pile up.
            self._strays[sid] = None
            if len(self._strays) > MAX_STRAY_SCOPES:
                oldest = next(iter(self._strays))
                del self._strays[oldest]
                self._sessions.pop(oldest, None)
        return scope

    def handlers_changed(self) -> None:
        self._routed = True

    def owns(self, message: Call) -> bool:
        if not self._routed:
            return False
        scope = self.session_of(message.params, create=False)
        return scope is not None and scope.owned

    async def _apply(self, sent: _Sent, answer: Response) -> None:
        rule = sent.rule
        assert rule is not None
        opened = rule.opened_by(answer)
        if opened is not None and rule.step is Step.OPEN_ON_ANSWER:
            await self._install(opened, rule.method, sent.owned, sent.params)
        elif sent.fresh and rule.session_id is not None \
                and self._loads.answered(rule.session_id, not answer.is_error):
            await self.release(rule.session_id, CloseReason.REFUSED)  # every load refused
        elif opened is not None and opened not in self._sessions:
            # A close answered while this load was on its way released the session; the
            # load succeeding after it means it is open downstream again.
            await self._install(opened, rule.method, sent.owned, sent.params)
        closed = rule.closed_by(answer)
        if closed is not None:
            # `release`: a session_closed hook's failure is logged, not answered: the session
            # did end downstream, and an error would tell the editor it is still open.
            await self.release(closed, CloseReason.DELETED if rule.method == acp.SESSION_DELETE
                               else CloseReason.CLOSED)

    async def _install(self, sid: str, how: str, owned: bool,
                       params: Raw | UnsetType) -> SessionScope:
        setup = None
        if params is not UNSET:
            try:
                setup = msgspec.json.decode(params)
            except (msgspec.DecodeError, RecursionError):
                log.warning("%s: session %s set up with params that cannot be read",
                            self.name, sid)
        scope = SessionScope(sid, how, owned=owned, setup=setup, host=self)
        self._strays.pop(sid, None)
        previous = self._sessions.get(sid)
        if previous is not None:  # a reload keeps the state and the handlers
            scope.succeed(previous)
        self._sessions[sid] = scope
        if owned:
            self._routed = True
        try:
            await self.bounded("session_opened", self._proxy.session_opened(scope))
        except BaseException:
            # The setup is answered with the failure: nobody will ever close this session,
            # so its scope must not stay (nor get a session_closed when the chain stops).
            if self._sessions.get(sid) is scope:
                if previous is not None:
                    self._sessions[sid] = previous
                else:
                    del self._sessions[sid]
            raise
        return scope

    async def _remove(self, sid: str, reason: CloseReason) -> None:
        scope = self._sessions.pop(sid, None)
        self._loads.forget(sid)
        if self.tools is not None:
            await self.tools.session_closed(sid)
        if scope is None:
            return
        if scope.owned or scope.handlers:  # only such a scope can have made us route
            self._routed = any(s.owned or s.handlers for s in self._sessions.values())
        scope.closed_reason = reason
        if self._strays.pop(sid, False) is None:
            return  # never opened (see session_of): no hook for its end either
        await self.bounded("session_closed", self._proxy.session_closed(scope))

    async def bounded(self, hook: str, call: Awaitable[_T]) -> _T:
        """A session hook's `call`, within `SESSION_HOOK_BOUND`.

        Raises:
            TimeoutError: it did not return in time (abandoned: the hook is cancelled).
        """
        with anyio.move_on_after(SESSION_HOOK_BOUND):
            return await call
        raise TimeoutError(f"{hook} did not return within {SESSION_HOOK_BOUND:g}s")

    async def release(self, sid: str, reason: CloseReason) -> None:
        """A session ended (closed, refused; or ended by the conductor without a message
        crossing this proxy: idle expiry, lost): drop its scope and tell the plugin. A
        hook's failure is logged."""
        try:
            await self._remove(sid, reason)
        except BaseException as raised:
            e = plugin_failure(raised)
            if e is None:
                raise
            self._log_failure(e, f"session_closed of {sid}")

    # -- the chain's life ----------------------------------------------------------------

    def stop_dispatch(self) -> None:
        """Dispatch is stopping: no answer reaches a handler any more, so a cancelled
        handler's wait for one (HostRequest.wait) ends now instead of after its grace."""
        self.stopping = True
        for grace in self.graces:
            grace.cancel()

    def _start_failure(self, raised: BaseException, hook: str) -> ComponentStartError:
        """What `hook` raised, as the chain's start failure naming this proxy; what is no
        failure of the plugin's (a cancellation) is raised as it is."""
        e = plugin_failure(raised)
        if e is None:
            raise raised
        # In-process, the start failure answers the editor's initialize, which
        # run/check/call report: this line is theirs to hide (REACHES_CLIENT).
        self._log_failure(e, hook, reaches_client=True)
        return ComponentStartError(self.name, f"{hook} failed: {type(e).__name__}: {e}")

    async def start_chain(self) -> None:
        """`chain_started`, before the first message.

        Raises:
            ComponentStartError: the hook raised or did not return within
                `START_HOOK_BOUND` (the chain's start fails, naming the proxy).
        """
        try:
            with anyio.move_on_after(START_HOOK_BOUND) as bound:
                await self._proxy.chain_started()
        except BaseException as raised:
            raise self._start_failure(raised, "chain_started") from None
        if bound.cancelled_caught:
            self._proxy.log.error("proxy %s: chain_started did not return within %gs",
                                  self.name, START_HOOK_BOUND, extra=REACHES_CLIENT)
            raise ComponentStartError(self.name, "chain_started did not return within "
                                                 f"{START_HOOK_BOUND:g}s")

    async def stop_chain(self) -> None:
        """The chain is gone: every session still open ends (`session_closed`, reason
        "stopped"), then `chain_stopped`. Every hook runs, whichever fails; bounded,
        shielded (this runs while the conductor is being cancelled)."""
        with anyio.CancelScope(shield=True), anyio.move_on_after(STOP_HOOKS_GRACE) as bound:
            for sid in list(self._sessions):
                try:
                    await self._remove(sid, CloseReason.STOPPED)
                except BaseException as raised:
                    self._log_stop_failure(raised, "session_closed")
            try:
                await self._proxy.chain_stopped()
            except BaseException as raised:
                self._log_stop_failure(raised, "chain_stopped")
        if bound.cancelled_caught:
            self._proxy.log.warning("proxy %s: its stop hooks took over %gs; abandoned",
                                    self.name, STOP_HOOKS_GRACE)

    def _log_stop_failure(self, raised: BaseException, hook: str) -> None:
        e = plugin_failure(raised)
        if e is None:
            raise raised
        self._log_failure(e, hook)


# -- running a host -----------------------------------------------------------------------

class _Wake:
    """In the inbox: the router ended sessions (`ProxyHost.releases`); look at them."""


_WAKE: Final = _Wake()


class _Relay:
    """In the inbox: an answer the router routed past this proxy, to pass on (`then`) once
    dispatch has handled what was handed over before it (`_InboxSink.relay_if_busy`)."""

    __slots__ = ("then", "up")

    def __init__(self, then: Callable[[], Awaitable[None]], *, up: bool) -> None:
        self.then = then
        self.up = up  # toward the client: from the successor's side, to this proxy


_InboxItem = Message | list[Message] | _Wake | _Relay


class _InboxSink:
    """The conductor's sink toward an in-process proxy: hands message objects over."""

    def __init__(self, send: MemoryObjectSendStream[_InboxItem], host: ProxyHost) -> None:
        self._send = send
        self._host = host
        self.passes = host.passes  # the router asks the host directly: no extra call
        self.watch = host.watch
        self.relay = self.relay_if_busy

    def release(self, session_id: str, reason: CloseReason) -> None:
        """Never waits: the router may end thousands of sessions at once (idle expiry), and
        the bounded inbox is for messages (filled with releases, the inboxes of two proxies
        could wedge each other). Dispatch looks at `releases` after what it was already
        handed, and is woken if idle."""
        self._host.releases.append((session_id, reason))
        try:
            self._send.send_nowait(_WAKE)
        except (anyio.WouldBlock, anyio.ClosedResourceError, anyio.BrokenResourceError):
            pass  # busy (it looks before it waits again), or stopping (stop_chain releases)

    async def send(self, item: Message | list[Message]) -> None:
        count = len(item) if isinstance(item, list) else 1
        self._host.queued += count
        try:
            try:
                self._send.send_nowait(item)  # no checkpoint: an in-process hop costs no yield
            except anyio.WouldBlock:
                await self._send.send(item)
        except BaseException:
            # Not handed over (cancelled while the inbox was full, or closed): never to be
            # dispatched, so it must not count, or the proxy would look busy for ever
            # (no shortcut past it, and an answer relayed behind its queue would wait).
            self._host.queued -= count
            raise

    def relay_if_busy(self, then: Callable[..., Awaitable[None]], *args: Any, up: bool
                      ) -> Awaitable[bool] | None:
        """An answer to a request routed past this proxy is on its way past it too. None:
        nothing is in dispatch (pass it on now). Else what queues `then(*args)` (passing it
        on) behind what was handed over before it: awaited, True once queued, False if
        dispatch has stopped. Checked without a coroutine: this is on every such answer."""
        if not self._host.queued:
            return None
        return self._relay(_Relay(functools.partial(then, *args, up=up), up=up))

    async def _relay(self, relay: _Relay) -> bool:
        self._host.queued += 1
        try:
            try:
                self._send.send_nowait(relay)
            except anyio.WouldBlock:
                await self._send.send(relay)
        except (anyio.ClosedResourceError, anyio.BrokenResourceError):
            self._host.queued -= 1  # stopping: nothing is dispatched any more
            return False
        except BaseException:
            self._host.queued -= 1  # cancelled before it was handed over: see `send`
            raise
        return True

    def send_nowait(self, item: Message) -> bool:
        self._host.queued += 1
        try:
            self._send.send_nowait(item)
        except (anyio.WouldBlock, anyio.ClosedResourceError, anyio.BrokenResourceError):
            self._host.queued -= 1
            return False
        return True

    async def aclose(self) -> None:
        await self._send.aclose()


@asynccontextmanager
async def open_inprocess_proxy(proxy: Proxy[Any], deliver: Callable[[Message], Awaitable[None]],
                               *, next_to_client: bool = True) -> AsyncIterator[_InboxSink]:
    """Run `proxy` in this process. Yields the sink the conductor writes to; what the proxy
    sends goes to `deliver` (the router, as if read from the proxy's hop)."""
    host = ProxyHost(proxy, _CallbackSink(deliver), next_to_client=next_to_client)
    await host.start_chain()
    send, receive = anyio.create_memory_object_stream[_InboxItem](INBOX_SIZE)
    try:
        async with _dispatching(host, send, receive) as sink:
            yield sink
    finally:
        await host.stop_chain()


@asynccontextmanager
async def _dispatching(host: ProxyHost, send: MemoryObjectSendStream[_InboxItem],
                       receive: MemoryObjectReceiveStream[_InboxItem]
                       ) -> AsyncIterator[_InboxSink]:
    """Dispatch what the conductor hands over, until the context ends."""
    async with anyio.create_task_group() as tg:
        host.task_group = tg

        async def serve() -> None:
            _handler_release.set(_not_a_handler)
            # Drain whatever is waiting in one turn of the event loop, with writes coalesced
            # like a pipe reader's: a burst costs one wake-up and one write per pipe, not
            # one per message.
            writes = CoalescedWrites()
            async with receive:
                while True:
                    while host.releases:
                        await host.release(*host.releases.popleft())
                    try:
                        item = await receive.receive()
                    except anyio.EndOfStream:
                        return
                    writes.begin()
                    try:
                        while True:
                            if item is _WAKE:
                                item = []
                            elif isinstance(item, _Relay):
                                try:
                                    await host.relay(item.then, up=item.up)
                                finally:
                                    host.queued -= 1
                                item = []
                            assert not isinstance(item, _Wake | _Relay)
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
            host.stop_dispatch()
            send.close()
            tg.cancel_scope.cancel()


@asynccontextmanager
async def open_inprocess_hop(proxy: Proxy[Any],
                             receive: Callable[[Hop, Message], Awaitable[None]],
                             *, tracer: TraceSink | None = None,
                             next_to_client: bool = True) -> AsyncIterator[Hop]:
    """`proxy` in this process behind a router Hop: what is sent on the hop reaches the
    plugin as message objects (nothing encoded), and what the plugin sends comes back
    through `receive(hop, message)` (the router's `Chain.receive`). `next_to_client`:
    the client is its predecessor."""
    async def deliver(message: Message) -> None:
        await receive(hop, message)

    async with open_inprocess_proxy(proxy, deliver, next_to_client=next_to_client) as sink:
        hop = Hop(proxy.name, sink, dialect=Dialect.PROXY, passes=sink.passes, watch=sink.watch,
                  relay=sink.relay, release=sink.release, tracer=tracer)
        yield hop


async def serve_proxy(proxy: Proxy[Any], stdin: ByteReceiveStream, stdout: ByteSendStream,
                      *, max_frame_bytes: int | None = None) -> None:
    """Run `proxy` as a stand-alone stdio proxy program until its stdin closes."""
    sink = PipeSink(stdout)
    host = ProxyHost(proxy, sink)
    source = PipeSource(stdin) if max_frame_bytes is None \
        else PipeSource(stdin, max_frame_bytes=max_frame_bytes)

    def invalid(one: InvalidMessage) -> Response | None:
        """What answers an invalid message: a request-shaped one is refused (its sender
        waits for it); an answer or a notification is only logged."""
        log.warning("%s: invalid message from the conductor: %s", proxy.name, one.reason)
        if not one.call_shaped:
            return None
        return error_response(one.id, ErrorCode.INVALID_REQUEST, "Invalid Request",
                              one.reason)

    async def handle(item: Incoming) -> None:
        if isinstance(item, Request | Notification | Response):
            await host.dispatch(item)
        elif isinstance(item, Unreadable | Oversized):
            reason = item.reason if isinstance(item, Unreadable) else (
                f"a {item.size}-byte message exceeds the {item.limit}-byte limit")
            log.error("%s: a message from the conductor: %s; dropped", proxy.name, reason)
            code = item.code if isinstance(item, Unreadable) else ErrorCode.FRAME_TOO_LARGE
            await host.endpoint.refuse_unread(item.head, code, reason,
                                              {"component": proxy.name})
        elif isinstance(item, Batch):
            if not item.items:  # one error, as JSON-RPC 2.0 has it
                await host.endpoint.send(error_response(None, ErrorCode.INVALID_REQUEST,
                                                        "Invalid Request", "empty batch"))
                return
            # Answered as one array, as protocol.md §1 has every hop do.
            replies = host.endpoint.open_batch([m.id for m in item.items
                                                if isinstance(m, Request)])
            for one in item.items:
                if isinstance(one, InvalidMessage):
                    refusal = invalid(one)
                    if refusal is not None:
                        replies.replies.append(refusal)
                else:
                    await host.dispatch(one)
            await host.endpoint.end_batch(replies)
        elif isinstance(item, InvalidMessage):
            refusal = invalid(item)
            if refusal is not None:
                await host.endpoint.send(refusal)
        else:  # not JSON: answered by what its top level showed (a request, an answer)
            log.warning("%s: a line from the conductor that is not JSON: %s", proxy.name,
                        item.reason)
            if item.top is not None:
                await host.endpoint.refuse_unread(item.top, ErrorCode.PARSE_ERROR,
                                                  f"Parse error: {item.reason}",
                                                  {"component": proxy.name})
            else:
                await host.endpoint.send(error_response(None, ErrorCode.PARSE_ERROR,
                                                        "Parse error", item.reason))

    try:
        await host.start_chain()
        try:
            async with anyio.create_task_group() as tg:
                host.task_group = tg
                token = _handler_release.set(_not_a_handler)
                try:
                    await source.serve(handle)
                finally:
                    _handler_release.reset(token)
                    host.stop_dispatch()  # stdin closed, or we are cancelled: no more answers
                tg.cancel_scope.cancel()  # the conductor closed our stdin: we are done
        finally:
            await host.stop_chain()
    finally:
        with anyio.CancelScope(shield=True):
            await sink.aclose()
