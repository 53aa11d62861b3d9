"""The chain router: client <-> proxy:0 ... proxy:n <-> agent, in a star around the conductor.

The router runs in the reader task of the hop a message arrived on, so a slow component
stalls only the hops feeding it, and order is kept per hop. It decides where each message
goes (`Topology`), applies the initialize rules (`Handshake`) and the session rules
(`sessions.lifecycle`), and forwards: a request gets a fresh id on its target hop (the
hop's `Endpoint` keeps it, with a `Forward` saying where the answer goes back to).
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING

import anyio
import msgspec
from msgspec import UNSET, Raw, UnsetType

from conductor import acp
from conductor.acp import Dialect
from conductor.errors import ComponentError, ComponentRestartingError, ComponentStartError
from conductor.jsonrpc.codes import ErrorCode
from conductor.jsonrpc.message import (
    Batch,
    InvalidMessage,
    Message,
    Notification,
    Request,
    Response,
    error_response,
    payload,
)
from conductor.record import Record
from conductor.routing.deadlines import Deadlines, Expired, Timeouts
from conductor.routing.handshake import Handshake, ResponseHook, chain_hooks
from conductor.routing.mcp import McpRefusedError, McpSupport, acp_declarations, for_agent
from conductor.routing.mcp_routes import McpRoutes
from conductor.routing.recovery import Recovery
from conductor.routing.roles import Role
from conductor.routing.sessions import CloseReason, Lifecycle, SessionTable, Step, lifecycle
from conductor.routing.topology import ComponentLink, Hop, Node, Passes, Topology, Watch
from conductor.rpc.endpoint import Endpoint, Inbound, Outgoing
from conductor.rpc.failure import failure_response
from conductor.transport.base import NotJson, Oversized, Unreadable
from conductor.transport.pipes import flush_deferred

if TYPE_CHECKING:
    from anyio.abc import TaskGroup

    from conductor.jsonrpc.message import Call
    from conductor.routing.mcp import Bridge, McpInjection
    from conductor.routing.sessions import SessionRecord
    from conductor.tracing.sink import TraceSink
    from conductor.transport.base import Handle, HandleNowait, Incoming

log = logging.getLogger("acp_conductor.routing")

_GONE = (anyio.BrokenResourceError, anyio.ClosedResourceError)
# Notifications the router must look at, not just pass on.
_NOT_PLAIN = frozenset({acp.CANCEL_REQUEST, acp.INITIALIZE, *acp.PROXY_INITIALIZE_METHODS,
                        *acp.SUCCESSOR_METHODS, *acp.SESSION_SETUP, acp.SESSION_PROMPT,
                        acp.SESSION_CLOSE, acp.SESSION_DELETE, *acp.MCP_METHODS})
FRAME_LIMIT_HINT = "raise the limit with --max-frame-bytes or [conductor] max_frame_bytes"
CANCEL_WRITE_BOUND = 5.0  # a timed-out request's cancel waits at most this long for the pipe
INITIALIZE_WAIT = 60.0    # a session setup pipelined behind initialize waits this for the agent

Starter = Callable[[], Awaitable[list[ComponentLink]]]
# A plain notification's route: target, the in-process proxies' `passes` to ask, whether
# it travels up, and the sender's name for traces.
_PlainRoute = tuple[Hop, tuple[Passes, ...], bool, str, tuple[Watch, ...]]


class Forward(Record):
    """Where the answer to a forwarded request goes: the context of its `Outgoing`."""

    origin: Hop        # the hop the request came from ...
    origin_id: Raw     # ... with this id, echoed back exactly
    target: Hop        # where it was forwarded
    hook: ResponseHook | None = None
    timed_out: bool = False  # the conductor answered it (request_timeout)
    inbound: Inbound | None = None  # how the origin tracks it (for its cancel)
    # A prompt's params (else UNSET), whose session id tells an agent which turn to stop:
    # read only when one is stopped, not for every prompt on its way.
    prompt: Raw | UnsetType = UNSET
    down: bool = False  # toward the agent (in proxy mode: the successor, past the client)

    @property
    def turn(self) -> str | None:
        return None if self.prompt is UNSET else acp.get_str(self.prompt, "sessionId")


class Chain:
    """Routes messages between the client and the components."""

    def __init__(
        self,
        client: Hop,
        starter: Starter,
        *,
        proxy_mode: bool = False,
        tracer: TraceSink | None = None,
        on_fatal: Callable[[ComponentError, bool], None] | None = None,
        on_broken: Callable[[Hop], None] | None = None,
        mcp: McpInjection | None = None,
        bridge: Bridge | None = None,
        timeouts: Timeouts | None = None,
        keep_session_setup: bool = False,
        on_dropped: Callable[[str], None] | None = None,
    ) -> None:
        self.client = client
        # Told (with why) of each message a component sent that was refused unread: its
        # sender and any request it answered get errors, but a notification is simply gone.
        self._on_dropped = on_dropped
        # Remember each session's setup params (to reopen it on a restarted agent): only
        # when the agent may restart, since they cost memory for every open session.
        self._keep_setup = keep_session_setup
        self.topology = Topology(client, proxy_mode=proxy_mode)
        self.sessions = SessionTable(self._trace_session if tracer is not None else None)
        # -- MCP: what the agent takes, global servers, MCP-over-ACP routes, the bridge --
        self.mcp_support = mcp.support if mcp is not None else McpSupport()
        self.mcp_routes = McpRoutes(self._forward_direct, self._originate, self._send,
                                    self._abandon, tracer=tracer,
                                    on_release=bridge.release if bridge is not None else None)
        self.sessions.observe(lambda event, record: self.mcp_routes.session_closed(
            record.session_id) if event == "closed" else None)
        self.sessions.observe(self._stop_turn_timer)
        self._bridge = bridge
        self.handshake = Handshake(proxy_mode=proxy_mode, mcp=self.mcp_support,
                                   bridge=bridge)
        self._starter = starter
        # Why the chain could not start: what every later request is answered with.
        self._start_failure: ComponentError | None = None
        self._starting: Request | None = None  # the initialize a start in progress holds
        self._tracer = tracer
        self._on_fatal = on_fatal
        self._on_broken = on_broken
        self._mcp = mcp if mcp is not None and mcp.servers else None
        self._required_acp = mcp.required_acp if mcp is not None else frozenset()
        # Hops whose plain notifications go, unchanged, straight to one other hop (see
        # _plan_plain_routes): target, the in-process proxies' `passes` to ask, whether it
        # travels up (from the successor side), and the sender's name for traces.
        self._plain_route: dict[Hop, _PlainRoute] = {}
        self.timeouts = timeouts or Timeouts()
        self._deadlines = Deadlines(self.timeouts) if self.timeouts.any_deadline else None
        self._timers: TaskGroup | None = None  # serve_timers' tasks
        # v2 sessions -> the deadline of their accepted turn (prompt_timeout), cancelled
        # when the turn ends: one sleeping task per running turn, none per ended one.
        self._turn_timers: dict[str, anyio.CancelScope] = {}
        # The names v2 elicitations were shown by to a proxy the request they are about
        # was routed past (hop, name) -> that request's forward, until the proxy answers.
        self._scoped_past: dict[tuple[Hop, str], Forward] = {}
        self._past_names = 0
        self.recovery = Recovery(self)
        self._muted = self.recovery.muted  # the same set: one lookup on the hot path

    @property
    def started(self) -> bool:
        return self.topology.started

    @property
    def nodes(self) -> list[Node]:
        return self.topology.nodes

    def status(self) -> dict[str, object]:
        """A snapshot for people and tools (the session-tools proxy): components, open
        sessions, MCP-over-ACP routes."""
        return {
            "components": [{"name": n.name, "role": str(n.role),
                            "inProcess": n.hop.passes is not None,
                            "state": "running" if n.hop.failure is None
                            else f"failed: {n.hop.failure}"}
                           for n in self.topology.nodes[1:] if n.role is not Role.SUCCESSOR],
            "sessions": [{"sessionId": r.session_id, "openedBy": r.opened_by,
                          "servedBy": r.served_by, "state": str(r.state),
                          "prompts": r.prompts} for r in self.sessions.records()],
            "mcp": {"servers": len(self.mcp_routes.declarations),
                    "connections": len(self.mcp_routes.connections)},
        }

    # -- entry point -----------------------------------------------------------------------

    def receive_nowait(self, hop: Hop, item: Incoming) -> bool:
        """Route `item` from `hop` at once if it needs no waiting: a plain notification
        (streamed updates, the bulk of the traffic) whose next hop can queue it now. False:
        nothing was done; `receive` handles it."""
        if type(item) is not Notification or self._tracer is not None:
            return False
        plain = self._plain(hop, item)
        if plain is None:
            return False
        # While v2 turns run, the agent's idle ends them: read once (a scan of the params).
        idle = self._idle_of(hop, item) if self.sessions.accepted_turns else None
        if idle is not None and self.sessions.accepted_turns.get(idle) == 0:
            return False  # the late idle of turns the conductor ended: `receive` drops it
        target = plain[0]
        if target.failure is None and not target.send_nowait(item):
            return False  # `receive` takes it, and its watchers see it there
        # The proxies on the way see it even when it goes nowhere, as a handler would have.
        for watch in plain[4]:
            watch(item, plain[2])
        if idle is not None:
            self._turns_ended(idle)
        return True  # sent, or as `receive` does: nowhere to go

    def _plain(self, hop: Hop, msg: Notification) -> _PlainRoute | None:
        """Where a notification from `hop` goes when it needs no ids, hooks or wrapping (a
        plain one, component -> client or client -> agent, that every in-process proxy on
        the way lets pass): its planned route, (target, gates, up, the sender's name for
        traces). None: the full route,
        also while a restarted agent replays sessions (`recovery.muted`)."""
        route = self._plain_route.get(hop)
        if route is None or msg.method in _NOT_PLAIN or self._muted:
            return None
        up = route[2]
        for gate in route[1]:  # a loop, not all(genexpr): per message, per in-process proxy
            if not gate(msg.method, up):
                return None
        return route

    def reader(self, hop: Hop) -> tuple[Handle, HandleNowait]:
        """What `hop`'s reader hands each item to (`MessageSource.serve(*reader)`)."""
        return functools.partial(self.receive, hop), functools.partial(self.receive_nowait, hop)

    async def receive(self, hop: Hop, item: Incoming) -> None:
        """Handle one item that arrived on `hop` (called by its reader, in its task)."""
        if isinstance(item, Notification) and self._tracer is None:
            # The hot path (streamed updates): a plain notification is sent as it came.
            plain = self._plain(hop, item)
            if plain is not None:
                if self.sessions.accepted_turns and self._turn_update(hop, item):
                    return  # the agent's late idle, for a turn the conductor ended
                target, _, up, source, watchers = plain
                for watch in watchers:  # even if it goes nowhere, as a handler would have
                    watch(item, up)
                if target.failure is None:
                    try:
                        await target.send(item, source=source)
                    except _GONE:
                        self._gone(target)
                return
            await self._receive_message(hop, item, plain_tried=True)
        elif isinstance(item, Request | Notification | Response):
            await self._receive_message(hop, item)
        elif isinstance(item, Batch):
            await self._receive_batch(hop, item)
        elif isinstance(item, InvalidMessage):
            await self._answer_invalid(hop, item)
        elif isinstance(item, NotJson):
            await self._not_json(hop, item)
        elif isinstance(item, Unreadable):
            await self.refuse_unreadable(hop, item)
        else:
            await self.refuse_oversized(hop, item)

    async def _receive_batch(self, hop: Hop, batch: Batch) -> None:
        if not batch.items:
            await self._send(hop, error_response(None, ErrorCode.INVALID_REQUEST,
                                                 "Invalid Request", "empty batch"))
            return
        replies = hop.open_batch([m.id for m in batch.items if isinstance(m, Request)])
        for item in batch.items:
            if isinstance(item, InvalidMessage):
                self._trace_lifecycle(hop.name, "invalid-message", reason=item.reason)
                if item.call_shaped:  # answers and notifications are never answered
                    replies.replies.append(error_response(item.id, ErrorCode.INVALID_REQUEST,
                                                          "Invalid Request", item.reason))
                else:
                    await self._fail_answered(hop, item)
            else:
                await self._receive_message(hop, item, batch=True)
        await hop.end_batch(replies)

    async def _answer_invalid(self, hop: Hop, item: InvalidMessage) -> None:
        log.warning("%s sent an invalid message: %s", hop.name, item.reason)
        self._trace_lifecycle(hop.name, "invalid-message", reason=item.reason)
        if item.call_shaped:
            await self._send(hop, error_response(item.id, ErrorCode.INVALID_REQUEST,
                                                 "Invalid Request", item.reason))
        else:
            await self._fail_answered(hop, item)

    async def _fail_answered(self, hop: Hop, item: InvalidMessage) -> None:
        """A broken answer (both result and error, neither, `jsonrpc` not "2.0"): never
        answered itself, but the request it names fails, naming the sender, as for an
        answer that is not JSON. Dropped, its asker would wait for ever."""
        if item.id is None:
            return  # a notification: nobody waits for it
        reason = f"{hop.name} sent an answer that is not valid JSON-RPC ({item.reason})"
        self._dropped(hop, reason)
        await hop.settle(error_response(item.id, ErrorCode.INVALID_REQUEST, reason,
                                        {"component": hop.name}))

    async def _not_json(self, hop: Hop, item: NotJson) -> None:
        top = item.top
        if hop is self.client:
            with_id = top is not None and top.id is not None and not top.is_batch
            if not (with_id and top is not None and top.has_method):
                # Junk, a batch, an answer: told with id null (JSON-RPC 2.0 §5.1).
                await self._send(hop, error_response(None, ErrorCode.PARSE_ERROR,
                                                     "Parse error", item.reason))
            if with_id and top is not None:
                # A request is answered under its id; an answer (to an agent's question; in
                # proxy mode, our successor's too) fails the request it answers, naming the
                # client: else its sender, or its asker, waits for ever.
                reason = f"{hop.name} sent a message that is not valid JSON ({item.reason})"
                log.error("%s; dropped", reason)
                await hop.refuse_unread(top, ErrorCode.PARSE_ERROR, reason,
                                        {"component": hop.name})
            return
        if top is not None and top.id is not None and not top.is_batch:
            # A broken message with an id (an answer whose JSON does not decode, e.g. a lone
            # surrogate escape): the request it answers fails, naming the sender; a request
            # is answered with the parse error.
            reason = f"{hop.name} sent a message that is not valid JSON ({item.reason})"
            log.error("%s; dropped", reason)
            self._dropped(hop, reason)
            self._trace_lifecycle(hop.name, "unreadable", reason=item.reason)
            await hop.refuse_unread(top, ErrorCode.PARSE_ERROR, reason, {"component": hop.name})
            return
        # Banners and ANSI noise on a component's stdout: never forwarded, never answered.
        text = item.head.decode("utf-8", "replace")
        log.warning("%s wrote a non-JSON line on %s (dropped): %s", hop.name, hop.channel,
                    text)
        self._trace_lifecycle(hop.name, "noise", line=text)

    async def _receive_message(self, hop: Hop, msg: Message, *,
                               plain_tried: bool = False, batch: bool = False) -> None:
        if self._tracer is not None:  # a one-message list: traced as a batch member
            self._tracer.message(hop.name, "in", [msg] if batch else msg,
                                 peer=self.topology.addressee(hop, msg))
        if isinstance(msg, Response):
            if await hop.settle(msg) is None:
                log.warning("%s answered id %s, which is not pending; ignored", hop.name,
                            bytes(msg.id).decode(errors="replace"))
            return
        if isinstance(msg, Notification):
            if self.recovery.muted and self.recovery.is_muted(msg):
                return  # replayed by a restarted agent's session/load: the editor has it
            if self.sessions.accepted_turns and self._turn_update(hop, msg):
                return  # the agent's late idle, for a turn the conductor ended
            plain = None if plain_tried else self._plain(hop, msg)
            if plain is not None:
                target, _, up, source, watchers = plain
                for watch in watchers:
                    watch(msg, up)
                if target.failure is None:
                    await self._send(target, msg, source=source)
                return
        if not self.topology.started:
            if self._start_failure is None:
                await self._start(msg)
            elif isinstance(msg, Request):  # sent before the initialize was answered
                failure = self._start_failure
                await self._send(hop, failure_response(msg.id, failure,
                                                       component=failure.component))
            return
        src = self.topology.node_of(hop)
        method = msg.method
        if method == acp.CANCEL_REQUEST:
            if isinstance(msg, Request):  # nobody would answer it (in a batch: nor the batch)
                await self._send(hop, error_response(
                    msg.id, ErrorCode.INVALID_REQUEST, "Invalid Request",
                    f"`{method}` is a notification: send it without an id"))
                return
            await hop.cancel_inbound(msg.params)
            return
        if method in acp.MCP_METHODS:  # routed by serverId / connectionId (mcp_routes.py)
            await self.mcp_routes.receive(hop, msg, method, msg.params, src,
                                          down=src.role is Role.CLIENT)
            return
        wrapped = acp.SUCCESSOR_METHODS.get(method)
        if wrapped is not None:
            if src.role is Role.PROXY or (src.role is Role.CLIENT and self.topology.proxy_mode):
                await self._unwrap(hop, src, msg, wrapped)
            else:
                await self._refuse_envelope(hop, msg, method)
            return
        if src.role is Role.CLIENT:
            if self.recovery.lost:
                refusal = self.recovery.lost_answer(msg)
                if isinstance(refusal, Response):
                    await self._send(hop, refusal)
                if refusal is not False:
                    return
            if method in acp.PROXY_INITIALIZE_METHODS:  # in proxy mode too: once was enough
                await self.handshake.reject_proxy_initialize(msg, method, self._replier(hop))
                return
            if method == acp.INITIALIZE and \
                    not await self.handshake.check_version(msg, self._replier(hop)):
                return
            await self._forward(hop, msg, method, msg.params, src, self.topology.first())
        else:
            await self._forward(hop, msg, method, msg.params, src, self.topology.before(src))

    # -- start-up ----------------------------------------------------------------------------

    async def _start(self, msg: Call) -> None:
        if not await self.handshake.accept_first(msg, self._replier(self.client)):
            return
        assert isinstance(msg, Request)  # accept_first takes only the request
        self._starting = msg
        try:
            links = await self._starter()
        except ComponentStartError as e:
            if self._starting is not msg:  # stopped meanwhile: answered already
                return
            self._starting = None
            self._start_failure = e
            await self._send(self.client, failure_response(msg.id, e, component=e.component))
            if self._on_fatal is not None:
                self._on_fatal(e, True)  # True: the client has it, in that answer
            return
        if self._starting is not msg:
            return
        self._starting = None
        self.topology.attach(links)
        self._plan_plain_routes()
        legacy = self.topology.proxy_mode and self.handshake.upstream_dialect is Dialect.LEGACY
        await self._forward(self.client, msg, acp.INITIALIZE, msg.params,
                            self.topology.nodes[0], self.topology.first(),
                            hook=_accept_legacy_proxy_role if legacy else _disclaim_proxy_role)

    def _plan_plain_routes(self) -> None:
        # Where a plain notification lands unchanged: up to the client from any component
        # with only in-process proxies before it, and down from the client to the agent or
        # the first subprocess proxy across in-process ones, provided each of those proxies
        # would be routed past (`passes`, asked per message: the gates).
        # Their watchers see it on the way, in the order the proxies would have.
        nodes = self.topology.nodes
        gates_up: list[Passes] = []
        watch_up: list[Watch] = []
        for node in nodes[1:]:
            if node.role is Role.SUCCESSOR:
                break
            self._plain_route[node.hop] = (self.client, tuple(gates_up), True, node.name,
                                           tuple(watch_up))
            if node.hop.passes is None:
                break
            gates_up.insert(0, node.hop.passes)
            if node.hop.watch is not None:
                watch_up.insert(0, node.hop.watch)
        gates_down: list[Passes] = []
        watch_down: list[Watch] = []
        for node in nodes[1:]:
            if node.role is Role.SUCCESSOR:
                break
            if node.hop.passes is None:
                self._plain_route[self.client] = (node.hop, tuple(gates_down), False, "client",
                                                  tuple(watch_down))
                break
            gates_down.append(node.hop.passes)
            if node.hop.watch is not None:
                watch_down.append(node.hop.watch)

    async def stop_starting(self, error: ComponentError) -> None:
        """The chain stops while it is still starting (a plugin's `chain_started`, a remote
        component's connection): the initialize that started it waits for the start, and
        nothing else would answer it. It is answered with `error`, as is what comes later."""
        msg, self._starting = self._starting, None
        if msg is None:
            return
        self._start_failure = error
        await self._send(self.client, failure_response(msg.id, error,
                                                       component=error.component))

    # -- forwarding --------------------------------------------------------------------------

    async def _unwrap(self, hop: Hop, src: Node, msg: Call, dialect: Dialect) -> None:
        # `hop` is where it arrived: `src.hop` itself, or a restarted proxy's new hop
        if src.role is Role.PROXY:
            if not hop.dialect_forced:
                hop.dialect = dialect
        else:
            self.handshake.upstream_dialect = dialect
        try:
            env = acp.decode_envelope(msg.params)
        except ValueError as e:
            log.warning("%s: %s", src.name, e)
            if isinstance(msg, Request):
                await self._send(hop, error_response(msg.id, ErrorCode.INVALID_PARAMS,
                                                     "Invalid params", str(e)))
            return
        inner = env.method
        if inner == acp.CANCEL_REQUEST:
            if isinstance(msg, Request):  # as a plain one: nobody would answer the envelope
                await self._send(hop, error_response(
                    msg.id, ErrorCode.INVALID_REQUEST, "Invalid Request",
                    f"`{inner}` is a notification: send its envelope without an id"))
                return
            await hop.cancel_inbound(env.params)
            return
        if inner in acp.PROXY_INITIALIZE_METHODS:
            await self.handshake.reject_proxy_initialize(msg, inner, self._replier(hop))
            return
        if inner in acp.SUCCESSOR_METHODS:
            await self._refuse_envelope(hop, msg, inner)
            return
        if src.role is Role.PROXY:
            source, target = src, self.topology.after(src)
        else:  # proxy mode: the client wire carried a message from our successor, going up
            source, target = self.topology.last, self.topology.nodes[-2]
        if inner in acp.MCP_METHODS:
            await self.mcp_routes.receive(hop, msg, inner, env.params, source,
                                          down=src.role is Role.PROXY)
            return
        if self.sessions.accepted_turns and src.role is Role.CLIENT \
                and inner == acp.SESSION_UPDATE and isinstance(msg, Notification):
            sid = acp.idle_session(env.params)  # our successor's idle: its turns end
            if sid is not None and self._turns_ended(sid) == 0:
                return  # its late idle, for turns the conductor ended: the editor was told
        await self._forward(hop, msg, inner, env.params, source, target, meta=env.any_meta)

    async def _refuse_envelope(self, hop: Hop, msg: Call, method: str) -> None:
        """A successor envelope from the editor (not in proxy mode), from the agent, or
        inside another envelope. Passed on, it would reach a proxy as if that proxy's own
        successor had sent it (the conductor wraps what comes from there): refused."""
        reason = (f"`{method}` is only sent by a proxy to the conductor, to reach its "
                  f"successor; {hop.name} is not a proxy here, or wrapped it twice")
        if isinstance(msg, Request):
            await self._send(hop, error_response(msg.id, ErrorCode.INVALID_REQUEST,
                                                 "Invalid Request", reason))
        else:
            log.warning("%s; the notification is dropped", reason)
            self._trace_lifecycle(hop.name, "invalid-message", reason=reason)

    async def _forward(self, origin: Hop, msg: Call, method: str, params: Raw | UnsetType,
                       source: Node, target: Node, *, meta: Raw | UnsetType = UNSET,
                       direct: bool = False, hook: ResponseHook | None = None) -> None:
        """Send `msg` (its `method` and `params`, unwrapped) from `source` on to `target`
        (exactly there when `direct`; `hook` runs on the answer)."""
        downward = target.index > source.index
        # An in-process proxy with no handler for this message, and nothing earlier in its
        # queue, would forward it untouched: route past it and save the hop entirely.
        # Its watchers see a notification routed past it, as on the plain route.
        seen: Notification | None = None
        while not direct and target.role is Role.PROXY and target.hop.passes is not None \
                and target.hop.passes(method, not downward):
            if target.hop.watch is not None and isinstance(msg, Notification):
                if seen is None:
                    seen = msg if msg.method == method else \
                        Notification(method=method, params=params)
                target.hop.watch(seen, not downward)
            target = self.topology.nodes[target.index + (1 if downward else -1)]
        is_request = isinstance(msg, Request)
        out_method, out_params = method, params
        hooks: list[ResponseHook] = []
        if method == acp.ELICITATION_CREATE and not downward \
                and (self.handshake.version or 0) >= 2:
            out_params = self._elicitation_scope(origin, target, params, hooks,
                                                 is_request=is_request)
        after_resend: list[ResponseHook] | None = None  # a legacy resend's answer: these
        handshake_hooks = 0
        if method == acp.INITIALIZE and downward:
            if source.role is Role.PROXY and self.recovery.reinitializing:
                replay = self.recovery.replay_for(source.name)
                if replay is not None and isinstance(msg, Request):
                    # A restarted proxy: its successor was initialized once already.
                    await self._send(origin, replay.answering(msg.id))
                    return
            self.recovery.initialize_seen(target, params)
            after_resend = []
            init = self.handshake.downward(
                params, target, is_request=is_request,
                resend=self._resender(origin, msg, source, target, after_resend))
            out_method, out_params, hooks = init.method, init.params, init.hooks
            handshake_hooks = len(hooks)  # (the legacy fallback, for a proxy: run once)
            if source.role is Role.PROXY:
                hooks.append(self._initialize_answer_hook(source.name))
        if method in acp.SESSION_SETUP and downward:
            try:
                out_params = await self._mcp_setup(out_params, source, target, hooks)
            except McpRefusedError as e:
                if isinstance(msg, Request):
                    await self._send(origin, error_response(
                        msg.id, ErrorCode.INVALID_PARAMS, f"Invalid params: {e}",
                        {"mcpServer": e.name, "reason": e.reason}))
                return
        # Only a request that goes on gets the answer whose hooks end what tracking starts:
        # a notification (session/prompt without an id) or one answered here for a failed
        # target would leave a turn running, or an unconfirmed load recorded, for ever.
        session_hook = self._track_session(method, params, source, target, out_params) \
            if isinstance(msg, Request) and target.hop.failure is None else None
        if session_hook is not None:
            hooks.append(session_hook)
        if hook is not None:
            hooks.append(hook)
        if after_resend is not None:
            after_resend.extend(hooks[handshake_hooks:])

        hop = target.hop
        if hop.failure is not None:
            if isinstance(msg, Request):
                await self._send(origin, failure_response(msg.id, hop.failure,
                                                          component=target.name))
            return
        wrap = (target.role is Role.PROXY and not downward) or target.role is Role.SUCCESSOR
        dialect = self._dialect_of(target) if wrap else Dialect.PROXY
        if not isinstance(msg, Request):
            if wrap:
                out: Message = Notification(
                    method=dialect.successor_method(is_request=False),
                    params=acp.encode_envelope(out_method, out_params, meta, dialect))
            else:
                out = Notification(method=out_method, params=out_params)
            await self._send(hop, out, source=source.name)
            return
        forward = Forward(origin, msg.id, hop, chain_hooks(hooks),
                          prompt=params if method == acp.SESSION_PROMPT else UNSET,
                          down=downward)
        if wrap:
            outgoing, request = hop.open_request(
                out_method, out_params, deliver=self._answered, context=forward,
                wire_method=dialect.successor_method(is_request=True),
                wire_params=acp.encode_envelope(out_method, out_params, meta, dialect))
        else:
            outgoing, request = hop.open_request(out_method, out_params,
                                                 deliver=self._answered, context=forward)
        forward.inbound = Inbound(target=hop, target_id=outgoing.ident)
        origin.track_inbound(msg.id, forward.inbound)
        if self._deadlines is not None and downward:
            self._deadlines.add(hop, outgoing, prompt=method == acp.SESSION_PROMPT,
                                after=len(self.topology.nodes) - 1 - target.index,
                                session_id=forward.turn)
        try:
            await self._send(hop, request, source=source.name, origin=(origin.name, msg.id))
        except BaseException:
            # Cancelled while writing it: an in-process proxy's forward is routed in its
            # handler's task, which its own cancel may stop while the target's connection is
            # busy. Nothing waits for this answer any more (the handler is answered -32800),
            # so nothing may stay pending; had the request gone out, it is stopped there.
            if hop.pending.get(outgoing.ident) is outgoing:
                del hop.pending[outgoing.ident]
                origin.untrack_inbound(msg.id, forward.inbound)
                with anyio.CancelScope(shield=True):
                    await self._cancel_held(hop, outgoing.ident, forward.turn,
                                            down=downward)
                    # No answer will run its hooks: they see it cancelled, so the records
                    # they keep end with it (a prompt's session is idle again, a setup's
                    # declared MCP servers are forgotten).
                    if forward.hook is not None:
                        with anyio.move_on_after(CANCEL_WRITE_BOUND):
                            try:
                                await forward.hook(error_response(
                                    msg.id, ErrorCode.REQUEST_CANCELLED, "Request cancelled"))
                            except Exception as e:
                                log.debug("hooks of a forgotten %s: %s", method, e)
            raise

    def _elicitation_scope(self, origin: Hop, target: Node, params: Raw | UnsetType,
                           hooks: list[ResponseHook], *, is_request: bool
                           ) -> Raw | UnsetType:
        """A request-scoped v2 elicitation names the request it is about by its id on
        `origin`'s hop (`requestId`), one the conductor sent there: going up to the hop that
        request came from, it names it by that hop's id instead, as every id is mapped per
        hop. A proxy that handles elicitations but never saw the request (it was routed past
        it) is shown a name of the conductor's for it (`routed-past:N`, a string: no id of
        any hop), which becomes the request's id again when that proxy forwards the
        elicitation on up, until it answers it. Any other `requestId` (one `target` never
        sent) crosses unchanged."""
        key = acp.elicitation_request(params)
        forward: object = None
        if type(key) is int:
            outgoing = origin.pending.get(key)
            forward = outgoing.context if outgoing is not None else None
        elif type(key) is str and self._scoped_past:
            forward = self._scoped_past.get((origin, key))
        if not isinstance(forward, Forward):
            return params
        mapped = forward.origin_id
        if forward.origin is not target.hop:
            back = self._node_at(forward.origin, far=not forward.down)
            if not is_request or target.role is not Role.PROXY or back is None \
                    or back.index >= target.index or target.hop.failure is not None:
                return params
            # Routed past `target`: named for it until it answers this elicitation.
            self._past_names += 1
            name = (target.hop, f"routed-past:{self._past_names}")
            mapped = Raw(msgspec.json.encode(name[1]))
            self._scoped_past[name] = forward
            scoped_past = self._scoped_past

            async def forget(answer: Response) -> Response:
                scoped_past.pop(name, None)
                return answer
            hooks.append(forget)
        try:
            return acp.set_key(params, "requestId", mapped)
        except ValueError:
            return params

    def _initialize_answer_hook(self, proxy: str) -> ResponseHook:
        async def remember(answer: Response) -> Response:
            self.recovery.remember_answer(proxy, answer)
            return answer
        return remember

    # -- MCP (MCP-over-ACP routing lives in mcp_routes.py, the bridge in bridge.py) ---------

    async def _mcp_setup(self, params: Raw | UnsetType, source: Node, target: Node,
                         hooks: list[ResponseHook]) -> Raw | UnsetType:
        """A session setup request crosses from `source` down to `target`: learn the
        `acp` servers it declares; at the agent, inject global servers and bridge.

        Raises:
            McpRefusedError: a required server cannot reach the agent.
        """
        out = params
        if target.role is Role.AGENT:
            await self._await_agent_initialize(target, params)
        if target.role in (Role.AGENT, Role.SUCCESSOR):
            if self._mcp is not None:
                out = self._mcp.apply(out)
            if target.role is Role.AGENT:
                out = await for_agent(out, self.mcp_support, self._bridge,
                                      self._required_acp)
        # Learnt only for a request that goes on (not refused above, nor answered at once
        # for a component that is gone): its answer is what releases them.
        if target.hop.failure is not None:
            return out
        declared = self.mcp_routes.learn(params, source)
        if declared:
            routes = self.mcp_routes

            async def bind(answer: Response) -> Response:
                sid = acp.get_str(answer.result, "sessionId") if not answer.is_error else None
                if sid is None and not answer.is_error:
                    sid = acp.get_str(params, "sessionId")  # load / resume name it
                await routes.setup_answered(declared, sid)
                return answer
            hooks.append(bind)
        return out

    async def _await_agent_initialize(self, target: Node, params: Raw | UnsetType) -> None:
        """A setup pipelined behind `initialize` waits for the agent's answer when what
        reaches the agent depends on it (servers to inject, `acp` servers to pass on or
        bridge): before it, nobody knows which MCP transports the agent takes, and an
        `acp` server would reach an agent that cannot take it, unbridged.

        The reader that routes the setup waits here, so order is kept. Only toward the
        agent, whose answers another reader reads (in proxy mode our successor answers on
        the client's own connection, which this reader would be blocking), and bounded:
        an agent that never answers must not keep us from the client's EOF. After one
        such wait the setups go on as the answer would find them (with a warning)."""
        pending = self.handshake.agent_pending
        if pending is None or pending.is_set() or target.hop.failure is not None:
            return
        if self._mcp is None and not self._required_acp and not acp_declarations(params):
            return  # nothing in this setup turns on what the agent takes
        await flush_deferred()  # the initialize it waits for may still be in our buffer
        with anyio.move_on_after(INITIALIZE_WAIT) as waited:
            await pending.wait()
        if waited.cancelled_caught:
            pending.set()  # given up once: later setups do not each wait again
            log.warning("%s has not answered initialize after %g s: a session setup goes on "
                        "without knowing which MCP servers it takes", target.name,
                        INITIALIZE_WAIT)

    async def _forward_direct(self, origin: Hop, msg: Call, method: str,
                              params: Raw | UnsetType, source: Node, target: Node,
                              hook: ResponseHook | None) -> None:
        await self._forward(origin, msg, method, params, source, target, direct=True,
                            hook=hook)

    async def _originate(self, source: Node, target: Node, method: str, params: Raw,
                         as_request: bool) -> None:
        """A message the conductor itself sends `target` as if from `source`'s side (an
        answer to a request is only logged)."""
        wrap = (target.role is Role.PROXY and target.index < source.index) \
            or target.role is Role.SUCCESSOR
        dialect = self._dialect_of(target) if wrap else Dialect.PROXY
        wire_method = dialect.successor_method(is_request=as_request) if wrap else method
        wire_params = acp.encode_envelope(method, params, UNSET, dialect) if wrap else params
        if not as_request:
            await self._send(target.hop, Notification(method=wire_method, params=wire_params))
            return

        async def answered(outgoing: Outgoing, answer: Response) -> None:
            if answer.is_error:
                log.debug("%s answered %s with an error: %r", target.name, method,
                          answer.error_value())
        _, request = target.hop.open_request(method, params, deliver=answered,
                                             wire_method=wire_method, wire_params=wire_params)
        await self._send(target.hop, request)

    def _dialect_of(self, target: Node) -> Dialect:
        if target.role is Role.PROXY:
            return target.hop.dialect or Dialect.PROXY
        return self.handshake.upstream_dialect

    def _resender(self, origin: Hop, msg: Call, source: Node, target: Node,
                  then: list[ResponseHook]) -> Callable[[str, Raw], Awaitable[None]]:
        """Ask `target` again (the legacy-dialect fallback), answering the same origin. Its
        answer goes through `then`: the hooks after the fallback's own (filled in by the
        time an answer comes), e.g. the record a restarted proxy's re-initialize replays."""
        async def resend(method: str, params: Raw) -> None:
            assert isinstance(msg, Request)
            forward = Forward(origin, msg.id, target.hop, chain_hooks(then), down=True)
            outgoing, request = target.hop.open_request(method, params, deliver=self._answered,
                                                        context=forward)
            forward.inbound = Inbound(target=target.hop, target_id=outgoing.ident)
            origin.track_inbound(msg.id, forward.inbound)
            await self._send(target.hop, request, source=source.name,
                             origin=(origin.name, msg.id))
        return resend

    async def _answered(self, outgoing: Outgoing, answer: Response) -> None:
        """The answer to a forwarded request arrived (or its hop failed): send it back."""
        forward: Forward = outgoing.context
        if forward.hook is not None:
            hooked = await forward.hook(answer)
            if hooked is None:
                return
            answer = hooked
        origin = forward.origin
        origin.untrack_inbound(forward.origin_id, forward.inbound)
        if origin.failure is not None:
            log.info("answer for %s dropped: %s is gone", outgoing.method, origin.name)
            return
        source = "conductor" if forward.target.failure is not None or forward.timed_out \
            else forward.target.name
        reply = answer.answering(forward.origin_id)
        # Only the target's own answer queues behind what the proxies it was routed past
        # still hold: the conductor's (a timeout, the target gone) is in no component's
        # stream, so it overtakes nothing, and must not wait on a proxy stuck in dispatch.
        past = self._routed_past(forward) if source != "conductor" else None
        if past:
            await self._send_past(past, origin, reply, source, up=forward.down)
        else:
            await self._send(origin, reply, source=source)

    def _routed_past(self, forward: Forward) -> list[Hop]:
        """The in-process proxies between the target and the origin of `forward` (a request
        routed past them), in the order its answer travels back."""
        to = self._node_at(forward.target, far=forward.down)
        back = self._node_at(forward.origin, far=not forward.down)
        if to is None or back is None or abs(to.index - back.index) < 2:
            return []
        lo, hi = sorted((to.index, back.index))
        hops = [n.hop for n in self.topology.nodes[lo + 1:hi]
                if n.role is Role.PROXY and n.hop.passes is not None]
        return hops[::-1] if to.index > back.index else hops

    def _node_at(self, hop: Hop, *, far: bool) -> Node | None:
        """`hop`'s node; in proxy mode the client's hop is also our successor's, the node
        at the far end (`far`: the end toward the agent)."""
        if far and hop is self.client and self.topology.proxy_mode:
            return self.topology.last
        return self.topology.find(hop)

    async def _send_past(self, past: list[Hop], origin: Hop, reply: Response,
                         source: str, *, up: bool) -> None:
        """Send `reply` to `origin` past these proxies without overtaking what is still in
        their dispatch (sent before it by the same side): behind such a proxy's queue, it
        goes on when dispatch reaches it (docs/architecture.md: order is unchanged). `up`:
        it travels toward the client (what a proxy holds back of one side, it holds back
        only going that way)."""
        for i, hop in enumerate(past):
            if hop.relay is None or hop.failure is not None:
                continue
            queued = hop.relay(self._send_past, past[i + 1:], origin, reply, source, up=up)
            if queued is not None and await queued:
                return
        await self._send(origin, reply, source=source)

    def _track_session(self, method: str, params: Raw | UnsetType, source: Node,
                       target: Node, sent: Raw | UnsetType) -> ResponseHook | None:
        rule = lifecycle(method, params)
        if rule is None:
            return None
        table, last = self.sessions, self.topology.last
        setup = sent if target is last and self._keep_setup else UNSET
        if rule.step is Step.OPEN_NOW:
            # Install the route before the request goes out: replayed updates precede the answer.
            assert rule.session_id is not None
            record = table.loading(rule.session_id, by=source.name, rank=source.index,
                                   served_by=last.name, how=method, setup=setup)
            refused = None if table.loads.confirmed(rule.session_id) \
                else self._refused_hook(record)
            return self._reloaded_hook(rule, source, setup, refused)
        if rule.step is Step.OPEN_ON_ANSWER:
            return self._opened_hook(rule, source, setup)
        if target is not last:
            return None  # turns and closes count where they reach the agent
        assert rule.session_id is not None
        turn = table.prompting(rule.session_id) if rule.step is Step.PROMPT else None
        # A v2 agent answers a prompt when it accepts it: the turn ends with its idle state.
        # So does our successor in proxy mode (it was initialized with that version too).
        v2 = (self.handshake.agent_version or 0) >= 2
        return self._ended_hook(rule, turn, v2=v2)

    def _opened_hook(self, rule: Lifecycle, source: Node,
                     setup: Raw | UnsetType) -> ResponseHook:
        table, last = self.sessions, self.topology.last

        async def opened(answer: Response) -> Response:
            sid = rule.opened_by(answer)
            if sid is not None:
                table.opened(sid, by=source.name, rank=source.index, served_by=last.name,
                             how=rule.method, setup=setup)
            return answer
        return opened

    def _reloaded_hook(self, rule: Lifecycle, source: Node, setup: Raw | UnsetType,
                       refused: ResponseHook | None) -> ResponseHook:
        table, last = self.sessions, self.topology.last

        async def reloaded(answer: Response) -> Response | None:
            if refused is not None and (await refused(answer)) is None:
                return None
            # A close answered while this load was on its way released the record; the
            # load succeeding after it means the session is open at the agent again.
            sid = rule.opened_by(answer)
            if sid is not None and sid not in table:
                table.opened(sid, by=source.name, rank=source.index, served_by=last.name,
                             how=rule.method, setup=setup)
            return answer
        return reloaded

    def _refused_hook(self, record: SessionRecord) -> ResponseHook:
        table = self.sessions

        async def refused(answer: Response) -> Response:
            # A load or resume that failed opened nothing: forget what it installed, unless
            # another load of it is still on its way or succeeded (an editor's retry).
            if table.load_answered(record, not answer.is_error):
                await self.mcp_routes.drain()
            return answer
        return refused

    def _ended_hook(self, rule: Lifecycle, turn: SessionRecord | None, *,
                    v2: bool = False) -> ResponseHook:
        table = self.sessions

        async def ended(answer: Response) -> Response:
            assert rule.session_id is not None
            if rule.step is Step.PROMPT and v2 and not answer.is_error:
                table.accepted(rule.session_id, turn)  # runs on until the agent says idle
                if self.timeouts.prompt is not None and self._timers is not None \
                        and turn is not None:
                    self._timers.start_soon(self._turn_deadline, rule.session_id, turn,
                                            self.timeouts.prompt)
            elif rule.step is Step.PROMPT:
                table.idle(rule.session_id, turn)
            elif rule.closed_by(answer) is not None:
                table.closed(rule.session_id, CloseReason.DELETED
                             if rule.method == acp.SESSION_DELETE else CloseReason.CLOSED)
                await self.mcp_routes.drain()  # its MCP connections end
            return answer
        return ended

    def _turn_update(self, hop: Hop, msg: Notification) -> bool:
        """A notification from `hop` while v2 turns run: the agent's `session/update` saying
        a session is idle ends its turns (their prompts were answered when accepted). True:
        it is the agent's late idle for turns the conductor ended (timed out), dropped:
        the editor was told they ended."""
        sid = self._idle_of(hop, msg)
        return sid is not None and self._turns_ended(sid) == 0

    def _stop_turn_timer(self, event: str, record: SessionRecord) -> None:
        if event == "closed":
            self._cancel_turn_timer(record.session_id)  # its turns ended with it

    def _cancel_turn_timer(self, session_id: str) -> None:
        timer = self._turn_timers.pop(session_id, None)
        if timer is not None:
            timer.cancel()

    def _turns_ended(self, session_id: str) -> int | None:
        """The session's accepted v2 turns end (`SessionTable.said_idle`), and so does the
        deadline timing them."""
        self._cancel_turn_timer(session_id)
        return self.sessions.said_idle(session_id)

    async def _tell_turn_ended(self, failed: Node, session_id: str, error: object) -> None:
        """The editor side of `failed` is told `session_id`'s v2 turn ended (its idle state,
        with why in `_meta`): only the agent could have said so, through `failed`."""
        with anyio.move_on_after(CANCEL_WRITE_BOUND):
            await self._originate(failed, self.topology.before(failed), acp.SESSION_UPDATE,
                                  acp.idle_update(session_id,
                                                  {"acp-conductor": {"error": error}}),
                                  as_request=False)

    def _idle_of(self, hop: Hop, msg: Notification) -> str | None:
        last = self.topology.last
        if msg.method != acp.SESSION_UPDATE or last.role is not Role.AGENT \
                or hop is not last.hop:
            return None
        return acp.idle_session(msg.params)

    async def _turn_deadline(self, session_id: str, record: SessionRecord,
                             seconds: float) -> None:
        """A v2 turn the agent accepted must end (its idle state) within `prompt_timeout`
        of its acceptance, as a v1 turn's answer must come within it: else the editor is
        told it ended (an idle update with the timeout error), and the agent is told to
        stop it (`session/cancel`); its own late idle is dropped."""
        prompts = record.prompts
        with anyio.CancelScope() as timer:
            self._cancel_turn_timer(session_id)  # an earlier turn's: the newest one's holds
            self._turn_timers[session_id] = timer
            try:
                await anyio.sleep(seconds)
            finally:
                if self._turn_timers.get(session_id) is timer:
                    del self._turn_timers[session_id]
        if timer.cancel_called:
            return  # it ended in time
        table, agent = self.sessions, self.topology.last
        if table.get(session_id) is not record or record.prompts != prompts \
                or not table.accepted_turns.get(session_id):
            return  # it ended, or another turn began since (its own deadline holds)
        table.timed_out(session_id)
        reason = f"{agent.name} did not end the turn of session {session_id} " \
                 f"within {seconds:g}s"
        log.warning("%s; told the editor it ended and cancelled it there", reason)
        self._trace_lifecycle(agent.name, "request-timeout", method=acp.SESSION_PROMPT,
                              timeout=seconds)
        error = {"code": int(ErrorCode.REQUEST_TIMEOUT), "message": reason,
                 "data": {"component": agent.name, "method": acp.SESSION_PROMPT,
                          "timeout": seconds}}
        await self._tell_turn_ended(agent, session_id, error)
        await self._stop_turn(session_id)

    async def _end_v2_turns(self, failed: Node, error: ComponentError) -> None:
        """A component failed with v2 turns running through it (the agent: all of them; a
        proxy: those of sessions opened on its editor side). Their prompts were answered
        (accepted) long ago, and only the agent would have said they ended, through the
        failed component: each ends in the table, and the failed component's editor side
        is told its session is idle, with why in `_meta` (the error a v1 prompt would have
        been answered with), else a v2 editor waits for ever. Behind a failed proxy the
        agent, still working, is told to stop (`session/cancel`), as for a v1 prompt, and
        its late idle is dropped."""
        rpc = failure_response(None, error, component=failed.name).error_value()
        for sid, count in list(self.sessions.accepted_turns.items()):
            if failed.role is Role.PROXY and (not count
                                              or self.sessions.rank(sid) >= failed.index):
                continue  # ended already, or a session of the proxies after it
            if failed.role is Role.AGENT:
                self._turns_ended(sid)
                if not count:
                    continue  # timed out: the editor was told already
            else:
                self._cancel_turn_timer(sid)
                self.sessions.timed_out(sid)
            log.warning("session %s: its turn ended with %s (%s)", sid, failed.name, error)
            await self._tell_turn_ended(failed, sid, rpc)
            if failed.role is Role.PROXY:
                await self._stop_turn(sid)

    async def _stop_turn(self, session_id: str) -> None:
        """Tell the agent (in proxy mode: our successor, wrapped like the prompt was) to
        stop the turn of `session_id` (`session/cancel`), if it is still there."""
        agent = self.topology.last
        if agent.hop.failure is not None:
            return
        params = payload({"sessionId": session_id})
        with anyio.move_on_after(CANCEL_WRITE_BOUND):
            if agent.role is Role.SUCCESSOR:  # plain, it would go up to the editor
                await self._originate(self.topology.before(agent), agent, acp.SESSION_CANCEL,
                                      params, as_request=False)
            else:
                await self._send(agent.hop, Notification(method=acp.SESSION_CANCEL,
                                                         params=params))

    # -- releasing sessions ------------------------------------------------------------------

    async def end_sessions(self, session_ids: list[str], reason: CloseReason) -> None:
        """The router ends these sessions without a message saying so (idle expiry, a lost
        session): its record goes, its MCP-over-ACP connections end, and each in-process
        proxy drops its state for them. The agent and subprocess proxies are not told."""
        released = [sid for sid in session_ids if self.sessions.closed(sid, reason) is not None]
        if not released:
            return
        for hop in self.topology.hops():
            if hop.release is not None and hop.failure is None:
                for sid in released:
                    hop.release(sid, reason)  # never waits (see the host's `releases`)
        await self.mcp_routes.drain()

    async def expire_idle(self, seconds: float) -> list[str]:
        """End every session idle for `seconds` or more; returns their ids."""
        expired = self.sessions.idle_longer_than(seconds)
        if expired:
            log.info("%d session(s) idle for %gs or more expired: %s", len(expired), seconds,
                     ", ".join(expired[:5]) + (" ..." if len(expired) > 5 else ""))
            await self.end_sessions(expired, CloseReason.EXPIRED)
        return expired

    async def serve_timers(self) -> None:
        """Run the timers `timeouts` asks for (none: return at once), until cancelled."""
        expiry = self.timeouts.session_idle_expiry
        if expiry is None and self._deadlines is None:
            return
        async with anyio.create_task_group() as tg:
            self._timers = tg
            if expiry is not None:
                tg.start_soon(self._serve_idle_expiry, expiry)
            if self._deadlines is not None:
                tg.start_soon(self._deadlines.serve, self._expire_soon)

    async def _expire_soon(self, expired: Expired) -> None:
        # Each timeout's answer in a task of its own: it is owed to the component that sent
        # the request, and one that stopped reading would otherwise hold the scan, and with
        # it every later timeout of every session (the editor's own among them).
        assert self._timers is not None  # expiries come from serve_timers
        self._timers.start_soon(self._timed_out, expired)

    async def _serve_idle_expiry(self, seconds: float) -> None:
        # One scan every eighth of `seconds`: a session goes between `seconds` and
        # 1.125 x `seconds` after its last turn.
        while True:
            await anyio.sleep(seconds / 8)
            await self.expire_idle(seconds)

    # -- request timeouts --------------------------------------------------------------------

    async def _timed_out(self, expired: Expired) -> None:
        """A forwarded request outlived its timeout: answer it for the holder, then cancel
        it there (in a task of its own: a wedged component may not read its input)."""
        hop, outgoing = expired.hop, expired.outgoing
        reason = f"{hop.name} did not answer {outgoing.method} within {expired.timeout:g}s"
        if hop.pending.get(outgoing.ident) is not outgoing:
            return  # answered since the scan: that answer may be on its way, still its own
        forward = outgoing.context
        if isinstance(forward, Forward):
            forward.timed_out = True
        answered = await hop.expire(outgoing, error_response(
            outgoing.id, ErrorCode.REQUEST_TIMEOUT, reason,
            {"component": hop.name, "method": outgoing.method, "timeout": expired.timeout}))
        if not answered:
            return
        log.warning("%s; answered for it and cancelled it there", reason)
        self._trace_lifecycle(hop.name, "request-timeout", method=outgoing.method,
                              timeout=expired.timeout)
        assert self._timers is not None  # expiries come from serve_timers
        self._timers.start_soon(self._cancel_held, hop, outgoing.ident, expired.session_id)

    async def _abandon(self, target: Endpoint, outgoing: Outgoing, answer: Response) -> None:
        """Answer a forwarded request for its target, which is no longer bound to (its MCP
        connection ended), and cancel it there."""
        forward = outgoing.context
        if isinstance(forward, Forward):
            forward.timed_out = True  # the conductor's answer: it waits behind no proxy
        if await target.expire(outgoing, answer) and isinstance(target, Hop) \
                and target.failure is None \
                and (target is not self.client or self._editor_cancels()):
            await self._cancel_held(target, outgoing.ident, None)

    def _editor_cancels(self) -> bool:
        """The editor side acts on $/cancel_request: an outer conductor, or a v2 editor (v1
        lets a peer ignore `$/` notifications, and the SDKs' v1 clients print a traceback
        for one)."""
        return self.topology.proxy_mode or (self.handshake.version or 0) >= 2

    async def _cancel_held(self, hop: Hop, ident: int, session_id: str | None, *,
                           down: bool = True) -> None:
        """Stop the request `ident` sent on `hop` (`down`: toward the agent), and the turn
        `session_id` it is, if any."""
        node = self.topology.find(hop)
        # A turn is stopped the ACP way. $/cancel_request goes to a v2 agent only: v1 lets a
        # peer ignore `$/` notifications, and the SDKs' v1 agents print a traceback for it
        # (issue 10.13). Proxies speak the conductor protocol: they act on it.
        to_agent = node is not None and node.role is Role.AGENT
        v2 = (self.handshake.agent_version or 0) >= 2  # as the agent was initialized
        cancel_request = not to_agent or (session_id is None and v2)
        with anyio.move_on_after(CANCEL_WRITE_BOUND):
            if cancel_request:  # (for our successor: the envelope's own id, plain)
                await self._send(hop, Notification(method=acp.CANCEL_REQUEST,
                                                   params=payload({"requestId": ident})))
            if session_id is not None:  # the turn itself: ACP's way to stop it
                params = payload({"sessionId": session_id})
                if down and hop is self.client and self.topology.proxy_mode:
                    # Our successor's turn: wrapped like the prompt was. Plain, it would
                    # go up to the editor.
                    await self._originate(self.topology.nodes[-2], self.topology.last,
                                          acp.SESSION_CANCEL, params, as_request=False)
                else:
                    await self._send(hop, Notification(method=acp.SESSION_CANCEL,
                                                       params=params))

    def disconnected(self) -> None:
        """The client's connection ended: every record goes (in-process proxies release
        their own state as they stop)."""
        self.sessions.clear(CloseReason.STOPPED)

    # -- oversized frames --------------------------------------------------------------------

    async def refuse_oversized(self, hop: Hop, item: Oversized) -> None:
        """A frame over the size limit arrived on `hop` and was skipped unread: answered by
        what its top level showed (`Endpoint.refuse_unread`)."""
        reason = (f"{hop.name} sent a message of {item.size} bytes, over the {item.limit}-byte "
                  "limit on messages")
        log.error("%s; dropped", reason)
        self._dropped(hop, reason)
        self._trace_lifecycle(hop.name, "oversized", size=item.size, limit=item.limit)
        await hop.refuse_unread(item.head, ErrorCode.FRAME_TOO_LARGE, reason,
                                {"component": hop.name, "size": item.size,
                                 "limit": item.limit, "hint": FRAME_LIMIT_HINT})

    def _dropped(self, hop: Hop, reason: str) -> None:
        if self._on_dropped is not None and hop is not self.client:
            self._on_dropped(reason)

    async def refuse_unreadable(self, hop: Hop, item: Unreadable) -> None:
        """A frame arrived on `hop` that is not UTF-8 or is nested too deeply to decode."""
        reason = f"{hop.name} sent a message that is {item.reason}"
        log.error("%s; dropped", reason)
        self._dropped(hop, reason)
        self._trace_lifecycle(hop.name, "unreadable", reason=item.reason)
        await hop.refuse_unread(item.head, item.code, reason, {"component": hop.name})

    # -- I/O and failure ---------------------------------------------------------------------

    def _replier(self, hop: Hop) -> Callable[[Response], Awaitable[None]]:
        async def reply(response: Response) -> None:
            await self._send(hop, response)
        return reply

    async def _send(self, hop: Hop, msg: Message, *, source: str = "conductor",
                    origin: tuple[str, Raw] | None = None) -> None:
        try:
            await hop.send(msg, source=source, origin=origin)
        except _GONE:
            self._gone(hop)

    def _gone(self, hop: Hop) -> None:
        # Its stdin is closed: the reader will see EOF and fail the hop with the exit status.
        log.debug("could not write to %s", hop.name)
        if self._on_broken is not None:
            self._on_broken(hop)

    async def fail_hop(self, hop: Hop, error: ComponentError) -> None:
        """`hop`'s component is gone: answer everything it owed, refuse what comes next,
        and stop what it had sent on toward the agent (nobody can take those answers; a
        turn left running holds its session, and a retried prompt would wait behind it)."""
        node = self.topology.find(hop)
        # In proxy mode the client's hop holds both what went up to the editor and what
        # went on to our successor: which is which, each forward says (`down`).
        held = [(each.hop, outgoing) for each in self.topology.nodes
                if node is not None and each.index != node.index
                and each.role is not Role.SUCCESSOR and each.hop.failure is None
                for outgoing in list(each.hop.pending.values())
                if isinstance(outgoing.context, Forward) and outgoing.context.origin is hop]
        orphans = [(target, outgoing) for target, outgoing in held if outgoing.context.down]
        # What it had asked upstream (a permission dialog at the editor): nobody can take
        # the answer, so it is cancelled, hop by hop. Only toward an editor whose protocol
        # has $/cancel_request (v2; an outer conductor): a proxy told so cancels its own
        # forward, which would reach a v1 editor too (v1 SDK clients print a traceback).
        editor_cancels = self._editor_cancels()
        asked = [(target, outgoing) for target, outgoing in held
                 if editor_cancels and not outgoing.context.down]
        await hop.fail(error, component=hop.name)
        if node is not None and node.role in (Role.AGENT, Role.SUCCESSOR):
            self.handshake.agent_gone()
        if node is not None:
            await self.mcp_routes.hop_failed(node)
            if node.role in (Role.AGENT, Role.PROXY) and self.sessions.accepted_turns:
                await self._end_v2_turns(node, error)
        for target, outgoing in orphans:
            if target.pending.get(outgoing.ident) is outgoing and target.failure is None:
                await self._cancel_held(target, outgoing.ident, outgoing.context.turn)
        for target, outgoing in asked:
            if target.pending.get(outgoing.ident) is outgoing and target.failure is None:
                with anyio.move_on_after(CANCEL_WRITE_BOUND):
                    await target.cancel(outgoing)

    # -- components restarted or bypassed (recovery.py) ---------------------------------------

    def restarting(self, hop: Hop, error: ComponentError) -> None:
        """`hop`'s component failed (`fail_hop` answered what it owed) and is being
        restarted: what is sent to it meanwhile is answered so."""
        hop.failure = ComponentRestartingError(hop.name, error.reason)
        self.recovery.restarting(hop.name, error)

    async def reattach(self, name: str, hop: Hop) -> None:
        """The restarted `name` is on `hop`: see `Recovery.reattach`.

        Raises:
            ComponentError: it did not come back.
        """
        await self.recovery.reattach(name, hop)

    def bypass(self, name: str, error: ComponentError) -> bool:
        """The optional proxy `name` failed for good: the chain goes on without it."""
        if not self.recovery.bypass(name):
            return False
        log.warning("%s; it is optional: the chain goes on without it", error)
        self._trace_lifecycle(name, "bypassed", reason=str(error))
        return True

    def replan(self) -> None:
        """The topology changed: plan the plain-notification shortcuts again."""
        self._plain_route.clear()
        self._plan_plain_routes()

    def trace_lifecycle(self, component: str, event: str, **fields: object) -> None:
        self._trace_lifecycle(component, event, **fields)

    def _trace_lifecycle(self, component: str, event: str, **fields: object) -> None:
        if self._tracer is not None:
            self._tracer.lifecycle(component, event, **fields)

    def _trace_session(self, event: str, record: SessionRecord) -> None:
        extra = {"reason": str(record.ended)} if record.ended is not None else {}
        self._trace_lifecycle(record.opened_by, f"session-{event}", session=record.session_id,
                              how=record.how, servedBy=record.served_by,
                              prompts=record.prompts, **extra)


async def _accept_legacy_proxy_role(answer: Response) -> Response:
    """As a legacy-dialect proxy, say so in our initialize answer (acp.py)."""
    return acp.accepting_legacy_proxy_role(answer)


async def _disclaim_proxy_role(answer: Response) -> Response:
    """Otherwise our client was not asking for a proxy: a marker left in the answer (a
    legacy proxy's, or one @thinkwell/conductor as our agent hands on) would tell a
    legacy conductor we took the role."""
    if answer.result is UNSET:
        return answer
    result = acp.without_legacy_proxy_meta(answer.result)
    return answer if result is answer.result else Response(id=answer.id, result=result)
