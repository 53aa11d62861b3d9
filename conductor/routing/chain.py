"""The chain router: client <-> proxy:0 ... proxy:n <-> agent, in a star around the conductor.

Every component has one Wire. Anything a proxy sends plainly goes to its predecessor;
anything it wraps in a successor envelope goes to its successor. The router runs in the
reader task of the wire a message arrived on, so a slow component stalls only the hops
feeding it, and order is kept per hop.
"""

from __future__ import annotations

import enum
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

import anyio
import msgspec
from msgspec import UNSET, Raw, UnsetType

from conductor import acp
from conductor.acp import Dialect
from conductor.errors import ComponentError, ComponentExitedError, ComponentStartError
from conductor.jsonrpc.codes import ErrorCode
from conductor.jsonrpc.message import (
    Batch,
    InvalidMessage,
    Message,
    error_response,
    id_key,
    int_id,
)
from conductor.routing.sessions import SessionTable
from conductor.routing.wire import Pending, ResponseHook, Wire

if TYPE_CHECKING:
    from conductor.jsonrpc.head import Head
    from conductor.routing.mcp import McpInjection
    from conductor.tracing import TraceSink

log = logging.getLogger("acp_conductor.routing")

_GONE = (anyio.BrokenResourceError, anyio.ClosedResourceError)
# Notifications the router must look at, not just pass on.
_NOT_PLAIN = frozenset({acp.CANCEL_REQUEST, acp.INITIALIZE, *acp.PROXY_INITIALIZE_METHODS,
                        *acp.SUCCESSOR_METHODS, *acp.SESSION_SETUP, acp.SESSION_PROMPT,
                        acp.SESSION_CLOSE, acp.SESSION_DELETE})


class Role(enum.StrEnum):
    CLIENT = "client"
    PROXY = "proxy"
    AGENT = "agent"
    SUCCESSOR = "successor"  # proxy mode: our successor, reached through the client wire


@dataclass(eq=False, slots=True)
class Node:
    index: int
    name: str
    role: Role
    wire: Wire


@dataclass(frozen=True, slots=True)
class ComponentLink:
    """What the start-up callback hands the router for each spawned component."""

    name: str
    role: Role
    wire: Wire


Starter = Callable[[], Awaitable[list[ComponentLink]]]


def component_error_data(error: ComponentError) -> dict[str, object]:
    data: dict[str, object] = {"component": error.component}
    if isinstance(error, ComponentExitedError):
        data["returncode"] = error.returncode
        data["stderrTail"] = error.stderr_tail
    return data


def component_error_message(error: ComponentError) -> str:
    text = str(error)
    if isinstance(error, ComponentExitedError) and error.stderr_tail:
        text += f"; last stderr: {error.stderr_tail[-1]}"
    return text


class Chain:
    """Routes Messages between the client and the components."""

    def __init__(
        self,
        client: Wire,
        starter: Starter,
        *,
        proxy_mode: bool = False,
        tracer: TraceSink | None = None,
        on_fatal: Callable[[ComponentError], None] | None = None,
        on_broken: Callable[[Wire], None] | None = None,
        mcp: McpInjection | None = None,
    ) -> None:
        self.client = client
        self.proxy_mode = proxy_mode
        self.sessions = SessionTable()
        self.nodes: list[Node] = [Node(0, "client", Role.CLIENT, client)]
        self._starter = starter
        self._started = False
        self._tracer = tracer
        self._on_fatal = on_fatal
        self._on_broken = on_broken
        self._node_of: dict[Wire, Node] = {client: self.nodes[0]}
        self._upstream_dialect = Dialect.PROXY
        self._mcp = mcp if mcp is not None and mcp.servers else None
        # Wires whose plain notifications go, unchanged, straight to one other wire (see
        # _attach): target, the in-process proxies' `passes` to ask, whether it travels up
        # (from the successor side), and the sender's name for traces.
        self._plain_route: dict[Wire, tuple[Wire, tuple[Callable[[str, bool], bool], ...],
                                            bool, str]] = {}

    @property
    def started(self) -> bool:
        return self._started

    # -- entry point -----------------------------------------------------------------------

    async def receive(self, wire: Wire, item: Message | InvalidMessage | Batch) -> None:
        """Handle one decoded frame that arrived on `wire`."""
        if isinstance(item, Message):
            await self._receive_message(wire, item)
        elif isinstance(item, InvalidMessage):
            await self._answer_invalid(wire, item)
        else:
            await self._receive_batch(wire, item)

    async def _receive_batch(self, wire: Wire, batch: Batch) -> None:
        if not batch.items:
            await self._reply(wire, error_response(None, ErrorCode.INVALID_REQUEST,
                                                   "Invalid Request", "empty batch"))
            return
        collector = wire.open_batch([m.id for m in batch.items
                                     if isinstance(m, Message) and m.is_request])  # type: ignore[misc]
        for item in batch.items:
            if isinstance(item, InvalidMessage):
                if self._tracer is not None:
                    self._tracer.lifecycle(wire.name, "invalid-message", reason=item.reason)
                if item.call_shaped:  # answers and notifications are never answered
                    collector.replies.append(error_response(item.id, ErrorCode.INVALID_REQUEST,
                                                            "Invalid Request", item.reason))
            else:
                await self._receive_message(wire, item)
        await wire.end_batch(collector)

    async def _answer_invalid(self, wire: Wire, item: InvalidMessage) -> None:
        log.warning("%s sent an invalid message: %s", wire.name, item.reason)
        if self._tracer is not None:
            self._tracer.lifecycle(wire.name, "invalid-message", reason=item.reason)
        if item.call_shaped:
            await self._reply(wire, error_response(item.id, ErrorCode.INVALID_REQUEST,
                                                   "Invalid Request", item.reason))

    async def _receive_message(self, wire: Wire, msg: Message) -> None:
        if self._tracer is not None:
            self._tracer.message(wire.name, "in", msg, peer=self._addressee(wire, msg))
        if msg.is_response:
            await self._on_response(wire, msg)
            return
        if msg.id is UNSET:
            # Fast path: a plain notification whose next hop takes it plainly (component ->
            # client, client -> agent) needs no ids, hooks or wrapping: send it as it came.
            route = self._plain_route.get(wire)
            if route is not None and msg.method not in _NOT_PLAIN:
                target, gates, up, source = route
                if not gates or all(gate(msg.method, up) for gate in gates):  # type: ignore[arg-type]
                    if target.failure is None:
                        await self._send(target, msg, source=source)
                    return
        if not self._started:
            await self._before_start(msg)
            return
        src = self._node_of[wire]
        method = msg.method
        assert isinstance(method, str)
        if method == acp.CANCEL_REQUEST:
            if msg.id is not UNSET:  # nobody would answer it (in a batch: nor the batch)
                await self._reply(wire, error_response(
                    msg.id, ErrorCode.INVALID_REQUEST, "Invalid Request",
                    f"`{method}` is a notification: send it without an id"))
                return
            await self._on_cancel(wire, msg.params)
            return
        wrapped = acp.SUCCESSOR_METHODS.get(method)
        if wrapped is not None and (src.role is Role.PROXY or
                                    (src.role is Role.CLIENT and self.proxy_mode)):
            await self._unwrap(src, msg, wrapped)
            return
        if src.role is Role.CLIENT:
            if method in acp.PROXY_INITIALIZE_METHODS:  # in proxy mode too: once was enough
                await self._reject_proxy_initialize(wire, msg, method)
                return
            if method == acp.INITIALIZE:
                if not await self._check_version(wire, msg):
                    return
                method = acp.INITIALIZE
            await self._forward(wire, msg.id, method, msg.params, src, self.nodes[1])
        else:
            await self._forward(wire, msg.id, method, msg.params, src, self.nodes[src.index - 1])

    # -- start-up ----------------------------------------------------------------------------

    async def _before_start(self, msg: Message) -> None:
        method = msg.method
        assert isinstance(method, str)
        expected = acp.INITIALIZE
        if self.proxy_mode:
            expected = "_proxy/initialize"
            ok = method in acp.PROXY_INITIALIZE_METHODS or method == acp.INITIALIZE
            if method in acp.PROXY_INITIALIZE_METHODS:
                self._upstream_dialect = acp.PROXY_INITIALIZE_METHODS[method]
            elif method == acp.INITIALIZE and acp.is_legacy_proxy_initialize(msg.params):
                self._upstream_dialect = Dialect.LEGACY
        else:
            ok = method == acp.INITIALIZE
            if method in acp.PROXY_INITIALIZE_METHODS:
                await self._reject_proxy_initialize(self.client, msg, method)
                return
        if not ok or msg.id is UNSET:
            if msg.id is not UNSET:
                await self._reply(self.client, error_response(
                    msg.id, ErrorCode.INVALID_REQUEST, "Invalid Request",
                    f"the first message must be the request `{expected}`, got `{method}`; "
                    "nothing is started until then"))
            else:
                log.warning("notification %s before %s ignored", method, expected)
            return
        if not await self._check_version(self.client, msg):
            return
        try:
            links = await self._starter()
        except ComponentStartError as e:
            await self._reply(self.client, error_response(
                msg.id, ErrorCode.INTERNAL_ERROR, component_error_message(e),
                component_error_data(e)))
            if self._on_fatal is not None:
                self._on_fatal(e)
            return
        self._attach(links)
        self._started = True
        await self._forward(self.client, msg.id, acp.INITIALIZE, msg.params,
                            self.nodes[0], self.nodes[1])

    def _attach(self, links: list[ComponentLink]) -> None:
        for link in links:
            node = Node(len(self.nodes), link.name, link.role, link.wire)
            self.nodes.append(node)
            if link.role is not Role.SUCCESSOR:
                self._node_of[link.wire] = node
        if self.proxy_mode:
            self.nodes.append(Node(len(self.nodes), "successor", Role.SUCCESSOR, self.client))
        # Where a plain notification lands unchanged: up to the client from any component
        # with only in-process proxies before it, and down from the client to the agent or
        # the first subprocess proxy across in-process ones, provided each of those proxies
        # would be routed past (`passes`, asked per message: the gates).
        gates_up: list[Callable[[str, bool], bool]] = []
        for node in self.nodes[1:]:
            if node.role is Role.SUCCESSOR:
                break
            self._plain_route[node.wire] = (self.client, tuple(gates_up), True, node.name)
            if node.wire.passes is None:
                break
            gates_up.insert(0, node.wire.passes)
        gates_down: list[Callable[[str, bool], bool]] = []
        for node in self.nodes[1:]:
            if node.role is Role.SUCCESSOR:
                break
            if node.wire.passes is None:
                self._plain_route[self.client] = (node.wire, tuple(gates_down), False, "client")
                break
            gates_down.append(node.wire.passes)

    async def _check_version(self, wire: Wire, msg: Message) -> bool:
        try:
            acp.protocol_version(msg.params)
        except acp.VersionError as e:
            if msg.id is not UNSET:
                await self._reply(wire, error_response(msg.id, e.code, e.message, e.data))
            return False
        return True

    async def _reject_proxy_initialize(self, wire: Wire, msg: Message, method: str) -> None:
        if msg.id is not UNSET:
            await self._reply(wire, error_response(
                msg.id, ErrorCode.INVALID_REQUEST, "Invalid Request",
                f"`{method}` is only sent by the conductor"))

    # -- forwarding --------------------------------------------------------------------------

    async def _unwrap(self, src: Node, msg: Message, dialect: Dialect) -> None:
        wire = src.wire
        if src.role is Role.PROXY:
            if not wire.dialect_forced:
                wire.dialect = dialect
        else:
            self._upstream_dialect = dialect
        try:
            env = acp.decode_envelope(msg.params)
        except ValueError as e:
            log.warning("%s: %s", src.name, e)
            if msg.id is not UNSET:
                await self._reply(wire, error_response(msg.id, ErrorCode.INVALID_PARAMS,
                                                       "Invalid params", str(e)))
            return
        inner = env.method
        if inner == acp.CANCEL_REQUEST:
            await self._on_cancel(wire, env.params)
            return
        if inner in acp.PROXY_INITIALIZE_METHODS:
            await self._reject_proxy_initialize(wire, msg, inner)
            return
        if src.role is Role.PROXY:
            source, target = src, self.nodes[src.index + 1]
        else:  # proxy mode: the client wire carried a message from our successor, going up
            source, target = self.nodes[-1], self.nodes[-2]
        await self._forward(wire, msg.id, inner, env.params, source, target, meta=env.any_meta)

    async def _forward(
        self,
        origin: Wire,
        origin_id: Raw | UnsetType,
        method: str,
        params: Raw | UnsetType,
        source: Node,
        target: Node,
        *,
        meta: Raw | UnsetType = UNSET,
    ) -> None:
        downward = target.index > source.index
        # An in-process proxy with no handler for this message, and nothing earlier in its
        # queue, would forward it untouched: route past it and save the hop entirely.
        while (target.role is Role.PROXY and target.wire.passes is not None
               and target.wire.passes(method, not downward)):
            target = self.nodes[target.index + (1 if downward else -1)]
        out_method, out_params = method, params
        hooks: list[ResponseHook] = []
        if method == acp.INITIALIZE and downward:
            if target.role is Role.PROXY:
                dialect = target.wire.dialect or Dialect.PROXY
                out_method = dialect.initialize_method()
                if dialect is Dialect.LEGACY:
                    out_params = acp.with_legacy_proxy_meta(params)
                elif not target.wire.dialect_forced and origin_id is not UNSET:
                    hooks.append(self._legacy_fallback(origin, origin_id, params, target))
            elif target.role in (Role.AGENT, Role.SUCCESSOR):
                try:
                    version = acp.protocol_version(params)
                except acp.VersionError:
                    version = None  # the agent judges a proxy's bad params itself
                if version == 2 and target.role is Role.AGENT:
                    hooks.append(self._require_v2(target))
                if version is not None and self._mcp is not None:
                    hooks.append(self._learn_mcp_support(version))
        if (self._mcp is not None and method in acp.SESSION_SETUP
                and target.role in (Role.AGENT, Role.SUCCESSOR)):
            out_params = self._mcp.apply(out_params)
        session_hook = self._track_session(method, params, source, target)
        if session_hook is not None:
            hooks.append(session_hook)

        if target.wire.failure is not None:
            if origin_id is not UNSET:
                await self._reply(origin, self._failure_response(origin_id, target.wire.failure))
            return
        out = Message(method=out_method, params=out_params)
        if origin_id is not UNSET:
            pending = Pending(method, origin, origin_id, _chain_hooks(hooks))
            our_id, out.id = target.wire.allocate(pending)
            origin.track_inbound(origin_id, (target.wire, our_id))
        if (target.role is Role.PROXY and not downward) or target.role is Role.SUCCESSOR:
            dialect = (target.wire.dialect or Dialect.PROXY) if target.role is Role.PROXY \
                else self._upstream_dialect
            out = Message(id=out.id,
                          method=dialect.successor_method(is_request=out.id is not UNSET),
                          params=acp.encode_envelope(out_method, out_params, meta, dialect))
        await self._send(target.wire, out, source=source.name,
                         origin=None if origin_id is UNSET else (origin.name, origin_id))

    def _legacy_fallback(self, origin: Wire, origin_id: Raw, params: Raw | UnsetType,
                         target: Node) -> ResponseHook:
        async def hook(answer: Message) -> Message | None:
            if not _is_method_not_found(answer) or target.wire.dialect_forced:
                return answer
            log.info("%s does not know _proxy/initialize; retrying in the legacy dialect",
                     target.name)
            target.wire.dialect = Dialect.LEGACY
            pending = Pending(acp.INITIALIZE, origin, origin_id, None)
            our_id, new_id = target.wire.allocate(pending)
            origin.track_inbound(origin_id, (target.wire, our_id))
            await self._send(target.wire, Message(id=new_id, method=acp.INITIALIZE,
                                                  params=acp.with_legacy_proxy_meta(params)),
                             source=self.nodes[target.index - 1].name,
                             origin=(origin.name, origin_id))
            return None
        return hook

    def _learn_mcp_support(self, version: int) -> ResponseHook:
        mcp = self._mcp
        assert mcp is not None

        async def hook(answer: Message) -> Message | None:
            mcp.learn_initialize(version, answer.result)
            return answer
        return hook

    def _require_v2(self, agent: Node) -> ResponseHook:
        async def hook(answer: Message) -> Message | None:
            if answer.result is UNSET:
                return answer
            version = acp.result_protocol_version(answer.result)
            if version == 2:
                return answer
            return error_response(
                answer.id, ErrorCode.INTERNAL_ERROR,
                f"{agent.name} answered initialize with protocolVersion {version!r}, but the "
                "client asked for protocol version 2 and the conductor requires the agent to "
                "say protocolVersion 2",
                {"component": agent.name, "agentProtocolVersion": version})
        return hook

    def _track_session(self, method: str, params: Raw | UnsetType, source: Node,
                       target: Node) -> ResponseHook | None:
        if not method.startswith("session/"):
            return None
        table = self.sessions
        last = self.nodes[-1]
        if method in (acp.SESSION_LOAD, acp.SESSION_RESUME):
            # Install the route before the request goes out: replayed updates precede the answer.
            sid = acp.get_str(params, "sessionId")
            if sid is not None:
                table.opened(sid, by=source.name, rank=source.index, served_by=last.name,
                             how=method)
            return None
        if method in (acp.SESSION_NEW, acp.SESSION_FORK):
            async def opened(answer: Message) -> Message | None:
                sid = acp.get_str(answer.result, "sessionId")
                if sid is not None:
                    table.opened(sid, by=source.name, rank=source.index, served_by=last.name,
                                 how=method)
                return answer
            return opened
        if method == acp.SESSION_PROMPT and target is last:
            sid = acp.get_str(params, "sessionId")
            if sid is None:
                return None
            table.prompting(sid)
            async def finished(answer: Message) -> Message | None:
                table.idle(sid)
                return answer
            return finished
        if method in (acp.SESSION_CLOSE, acp.SESSION_DELETE) and target is last:
            sid = acp.get_str(params, "sessionId")
            if sid is None:
                return None
            async def closed(answer: Message) -> Message | None:
                if answer.error is UNSET:
                    table.closed(sid)
                return answer
            return closed
        return None

    # -- responses and cancellation ----------------------------------------------------------

    async def _on_response(self, wire: Wire, msg: Message) -> None:
        try:
            key = id_key(msg.id)  # type: ignore[arg-type]
        except ValueError:
            log.warning("%s sent a response with an unusable id; ignored", wire.name)
            return
        pending = wire.pending.pop(key, None)
        if pending is None:
            log.warning("%s answered id %r, which is not pending; ignored", wire.name, key)
            return
        answer: Message | None = msg
        if pending.hook is not None:
            answer = await pending.hook(msg)
            if answer is None:
                return
        await self._settle(pending, answer, source=wire.name)

    async def _settle(self, pending: Pending, answer: Message, *,
                      source: str = "conductor") -> None:
        if pending.origin is None:
            pending.answer = answer
            if pending.waiter is not None:
                pending.waiter.set()
            return
        origin = pending.origin
        assert pending.origin_id is not None
        origin.untrack_inbound(pending.origin_id)
        if origin.failure is not None:
            log.info("answer for %s dropped: %s is gone", pending.method, origin.name)
            return
        await self._send(origin, Message(id=pending.origin_id, result=answer.result,
                                         error=answer.error), source=source)

    async def _on_cancel(self, wire: Wire, params: Raw | UnsetType) -> None:
        """Re-issue a cancel on the hop the cancelled request was forwarded to, with its id."""
        ident = acp.get_raw(params, "requestId")
        forwarded = None
        if ident is not None:
            try:
                forwarded = wire.inbound.get(id_key(ident))
            except ValueError:
                forwarded = None
        if forwarded is None:
            log.debug("%s cancelled a request that is not in flight; ignored", wire.name)
            return
        target, our_id = forwarded
        if target.failure is not None:
            return
        await self._send(target, Message(method=acp.CANCEL_REQUEST,
                                         params=acp.set_key(params, "requestId", int_id(our_id))),
                         source=wire.name)

    async def refuse_oversized(self, wire: Wire, head: Head, size: int, limit: int) -> None:
        """A frame over the size limit arrived on `wire` and was skipped unread."""
        reason = (f"{wire.name} sent a message of {size} bytes, over the {limit}-byte limit "
                  "on messages")
        log.error("%s; dropped", reason)
        if self._tracer is not None:
            self._tracer.lifecycle(wire.name, "oversized", size=size, limit=limit)
        hint = "raise the limit with --max-frame-bytes or [conductor] max_frame_bytes"
        await self.refuse_frame(wire, head, ErrorCode.INVALID_REQUEST, reason, hint)

    async def refuse_unreadable(self, wire: Wire, head: Head, code: int, why: str) -> None:
        """A frame arrived on `wire` that is not UTF-8 or is nested too deeply to decode."""
        reason = f"{wire.name} sent a message that is {why}"
        log.error("%s; dropped", reason)
        if self._tracer is not None:
            self._tracer.lifecycle(wire.name, "unreadable", reason=why)
        await self.refuse_frame(wire, head, code, reason, None)

    async def refuse_frame(self, wire: Wire, head: Head, code: int, reason: str,
                           data: str | None) -> None:
        """Answer for a frame from `wire` that was not decoded, by what its `head` shows.

        A request is refused to its sender (with id null when its id could not be read); a
        notification is never answered (a frame whose params begin before any id, when the
        rest could not be scanned, is taken for one: every SDK writes the id first); an
        answer fails the request it answered, so the asker is not left waiting; a batch is
        refused as a whole (JSON-RPC 2.0 §6), and so is call-shaped junk.
        """
        if head.is_batch or (head.id_known and not head.has_method and head.id is None
                             and not head.bad_id):  # neither a method nor an id
            await self._reply(wire, error_response(None, code, reason, data))
            return
        if head.is_notification:
            return  # a notification is never answered
        if head.has_method:  # a request: refuse it, by id when the id could be read
            await self._reply(wire, error_response(head.id, code, reason, data))
            return
        if head.id is None:
            return  # an answer to nobody we can tell: responses are never answered
        try:
            pending = wire.pending.pop(id_key(head.id), None)
        except ValueError:
            pending = None
        if pending is not None:
            detail: dict[str, object] = {"component": wire.name}
            if data is not None:
                detail["hint"] = data
            await self._settle(pending, error_response(None, ErrorCode.INTERNAL_ERROR, reason,
                                                       detail))

    # -- I/O and failure ---------------------------------------------------------------------

    async def _reply(self, wire: Wire, msg: Message) -> None:
        await self._send(wire, msg)

    async def _send(self, wire: Wire, msg: Message, *, source: str = "conductor",
                    origin: tuple[str, Raw] | None = None) -> None:
        if self._tracer is not None:
            self._tracer.message(wire.name, "out", msg, peer=source, origin=origin)
        try:
            await wire.send(msg)
        except _GONE:
            # Its stdin is closed: the reader will see EOF and fail the wire with the exit status.
            log.debug("could not write to %s", wire.name)
            if self._on_broken is not None:
                self._on_broken(wire)

    def _addressee(self, wire: Wire, msg: Message) -> str:
        """For traces: the component a message arriving on `wire` is addressed to."""
        if msg.is_response:
            try:
                pending = wire.pending.get(id_key(msg.id))  # type: ignore[arg-type]
            except ValueError:
                pending = None
            return pending.origin.name if pending is not None and pending.origin is not None \
                else "conductor"
        node = self._node_of.get(wire)
        if not self._started or node is None or len(self.nodes) < 2:
            return "conductor"
        wrapped = msg.method in acp.SUCCESSOR_METHODS
        if node.role is Role.CLIENT:
            return self.nodes[-2].name if self.proxy_mode and wrapped else self.nodes[1].name
        if node.role is Role.PROXY and wrapped:
            return self.nodes[node.index + 1].name
        return self.nodes[node.index - 1].name

    def _failure_response(self, ident: Raw, error: ComponentError) -> Message:
        return error_response(ident, ErrorCode.INTERNAL_ERROR, component_error_message(error),
                              component_error_data(error))

    async def fail_wire(self, wire: Wire, error: ComponentError) -> None:
        """`wire`'s component is gone: answer everything it owed, refuse what comes next."""
        if wire.failure is not None:
            return
        wire.failure = error
        owed = list(wire.pending.values())
        wire.pending.clear()
        for pending in owed:
            if pending.origin_id is None:
                pending.answer = self._failure_response(Raw(b"null"), error)
                if pending.waiter is not None:
                    pending.waiter.set()
                continue
            await self._settle(pending, self._failure_response(pending.origin_id, error))

    async def request(self, wire: Wire, method: str, params: Raw | UnsetType) -> Message:
        """The conductor's own request on a wire (used for shutdown and tests)."""
        pending = Pending(method, None, None, waiter=anyio.Event())
        _, ident = wire.allocate(pending)
        await self._send(wire, Message(id=ident, method=method, params=params))
        assert pending.waiter is not None
        await pending.waiter.wait()
        assert pending.answer is not None
        return pending.answer


def _is_method_not_found(answer: Message) -> bool:
    if answer.error is UNSET:
        return False
    try:
        error = answer.error_value()
    except msgspec.DecodeError:
        return False
    return isinstance(error, dict) and error.get("code") == ErrorCode.METHOD_NOT_FOUND


def _chain_hooks(hooks: list[ResponseHook]) -> ResponseHook | None:
    if not hooks:
        return None
    if len(hooks) == 1:
        return hooks[0]

    async def run_all(answer: Message) -> Message | None:
        current: Message | None = answer
        for hook in hooks:
            if current is None:
                return None
            current = await hook(current)
        return current
    return run_all
