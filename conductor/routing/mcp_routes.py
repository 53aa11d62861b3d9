"""MCP-over-ACP routing: `mcp/connect`, `mcp/message`, `mcp/disconnect` (protocol.md §8).

A component offers an MCP server by putting `{"type": "acp", "name", "serverId"}` in the
`mcpServers` of a session setup request it sends downstream. The router learns who provided
each serverId from the setup requests it forwards: a declaration first seen in what
component X sends was provided by X (the editor, on the client's hop). It binds the
serverId to the session the setup opens (when the answer names it).

`mcp/connect {serverId}` goes straight to that provider, past any proxy in between, with
the session under `_meta.acpSessionId` when the serverId belongs to exactly one session.
The provider's `connectionId` is replaced by one the conductor mints (two providers may
pick the same), and the pair is remembered: `mcp/message` then travels between the two
ends in either direction (requests with per-hop ids and cancellation, and notifications),
and `mcp/disconnect` ends it. An unknown serverId or connectionId is answered -32602,
naming it.

Connections end with their session (session/close, session/delete), and with either end:
an ending the router decides (the session, its failed setup) also answers the requests in
flight on the connection and cancels them where they went, as no end is bound to answer
what it was asked on a connection it was told is gone;
when a provider's hop fails, the other end of each of its connections gets an
`mcp/disconnect` notification (its requests in flight are failed by the hop); when a
connector's hop fails, the provider gets `mcp/disconnect`. State is bounded (declarations
and connections), released as sessions close, and every change is a trace event.
"""

from __future__ import annotations

import itertools
import logging
from collections import OrderedDict
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Final

import msgspec
from msgspec import Raw, UnsetType

from conductor import acp
from conductor.jsonrpc.codes import ErrorCode
from conductor.jsonrpc.message import (
    Notification,
    Request,
    Response,
    error_response,
    id_key,
    raw,
)
from conductor.record import Record
from conductor.routing.mcp import acp_declarations

if TYPE_CHECKING:
    from conductor.jsonrpc.message import Call
    from conductor.routing.handshake import ResponseHook
    from conductor.routing.topology import Hop, Node
    from conductor.rpc.endpoint import Endpoint, Inbound, Outgoing
    from conductor.tracing.sink import TraceSink

log = logging.getLogger("acp_conductor.mcp")

MAX_DECLARATIONS: Final = 4096
MAX_CONNECTIONS: Final = 1024
MCP_CANCELLED: Final = "notifications/cancelled"

# (origin hop, message, method, params, source, target, hook): the chain's direct forward
Forwarder = Callable[["Hop", "Call", str, "Raw | UnsetType", "Node", "Node",
                      "ResponseHook | None"], Awaitable[None]]
# (source, target, method, params, as_request): a message the conductor itself originates
Originator = Callable[["Node", "Node", str, Raw, bool], Awaitable[None]]
Replier = Callable[["Hop", Response], Awaitable[None]]
# (target, its request, the answer): answer a forwarded request now, and cancel it there
Abandoner = Callable[["Endpoint", "Outgoing", Response], Awaitable[None]]


class Declaration(Record, eq=False):
    server_id: str
    name: str
    provider: Node
    sessions: set[str] = msgspec.field(default_factory=set)
    pending: int = 0     # setup requests carrying it whose answer has not arrived


class Connection(Record, eq=False):
    ident: str           # the conductor's connectionId: what the connector uses
    provider_ident: str  # the provider's own
    server_id: str
    provider: Node
    connector: Node
    session: str | None
    # mcp/message requests in flight either way, by id: (the hop they came in on, where
    # they went). Ids are per hop; a connection's requests come from its two ends only.
    calls: dict[object, tuple[Hop, Inbound]] = msgspec.field(default_factory=dict)


class McpRoutes:
    """The serverId and connectionId tables of one chain, and the routing over them."""

    def __init__(self, forward: Forwarder, originate: Originator, reply: Replier,
                 abandon: Abandoner, *, tracer: TraceSink | None = None,
                 on_release: Callable[[str], None] | None = None,
                 max_declarations: int = MAX_DECLARATIONS,
                 max_connections: int = MAX_CONNECTIONS) -> None:
        self._forward = forward
        self._on_release = on_release  # the bridge: what it keeps for a serverId can go
        self._originate = originate
        self._reply = reply
        self._abandon = abandon
        self._tracer = tracer
        self.max_declarations = max_declarations
        self.max_connections = max_connections
        self.declarations: OrderedDict[str, Declaration] = OrderedDict()
        self.connections: dict[str, Connection] = {}
        self._by_provider: dict[tuple[str, str], Connection] = {}
        # mcp/connect requests on their way to a provider: each holds a place under the
        # limit until its answer, or concurrent connects would all pass the check.
        self._connecting: set[object] = set()
        self._closed_sessions: list[str] = []
        self._ids = itertools.count(1)

    # -- learning declarations ---------------------------------------------------------

    def learn(self, params: Raw | UnsetType, source: Node) -> list[str]:
        """A setup request crosses from `source`: its `acp` entries not seen before were
        declared by `source`. Returns their serverIds (to bind when the answer comes)."""
        fresh: list[str] = []
        for server_id, name in acp_declarations(params):
            known = self.declarations.get(server_id)
            if known is not None:
                known.pending += 1
                fresh.append(server_id)
                continue
            if len(self.declarations) >= self.max_declarations and not self._evict_one():
                log.warning("MCP server %r (%s) from %s not routable: %d declarations are "
                            "live, the limit", name, server_id, source.name,
                            self.max_declarations)
                self._trace(source.name, "mcp-declaration-refused", serverId=server_id,
                            name=name, limit=self.max_declarations)
                continue
            self.declarations[server_id] = Declaration(server_id, name, source, pending=1)
            fresh.append(server_id)
            self._trace(source.name, "mcp-declared", serverId=server_id, name=name)
        return fresh

    async def setup_answered(self, server_ids: list[str], session_id: str | None) -> None:
        """The setup request that carried `server_ids` was answered (opening `session_id`,
        or nothing: then declarations no session holds are released).

        Agents may connect before they answer the setup: such a connection has no session
        yet. It takes the session now, or it would outlive it (never told, never freed,
        routed to a provider that closed it); when the setup failed, it ends now."""
        for server_id in server_ids:
            decl = self.declarations.get(server_id)
            if decl is None:
                continue
            decl.pending = max(0, decl.pending - 1)
            early = [c for c in self.connections.values()
                     if c.server_id == server_id and c.session is None]
            if session_id is not None:
                decl.sessions.add(session_id)
                if len(decl.sessions) == 1:
                    for conn in early:
                        conn.session = session_id
            elif not decl.sessions and not decl.pending:
                self._release(decl)
                for conn in early:
                    await self._end(conn, "its session setup failed")

    def _release(self, decl: Declaration) -> None:
        self.declarations.pop(decl.server_id, None)
        if self._on_release is not None:
            self._on_release(decl.server_id)
        self._trace(decl.provider.name, "mcp-released", serverId=decl.server_id,
                    name=decl.name)

    def _evict_one(self) -> bool:
        """Make room: forget the oldest declaration no connection uses."""
        used = {c.server_id for c in self.connections.values()}
        for server_id, decl in self.declarations.items():
            if server_id not in used and not decl.pending:
                self._release(decl)
                return True
        return False

    # -- routing -----------------------------------------------------------------------

    async def receive(self, origin: Hop, msg: Call, method: str, params: Raw | UnsetType,
                      source: Node, *, down: bool) -> None:
        """An `mcp/*` message arrived from `source` (on `origin`, unwrapped), travelling
        toward the agent (`down`: a proxy wrapped it, or the client sent it) or the client."""
        if method == acp.MCP_CONNECT:
            await self._connect(origin, msg, params, source)
            return
        ident = acp.get_str(params, "connectionId")
        conn = self._find(ident, source, down) if ident is not None else None
        if conn is None:
            await self._refuse(origin, msg, method, "connectionId", ident, source)
            return
        if method == acp.MCP_MESSAGE and isinstance(msg, Notification) \
                and acp.get_str(params, "method") == MCP_CANCELLED:
            await self._cancel(origin, params, source)
            return
        to_provider = source is conn.connector
        target = conn.provider if to_provider else conn.connector
        out_id = conn.provider_ident if to_provider else conn.ident
        out_params = acp.set_key(params, "connectionId", raw(out_id))
        if method == acp.MCP_DISCONNECT:
            self._drop(conn, f"{source.name} disconnected")
        if method != acp.MCP_MESSAGE or not isinstance(msg, Request):
            await self._forward(origin, msg, method, out_params, source, target, None)
            return
        # A call is tracked until its answer, so that the connection's end can answer it.
        answered = False

        async def settled(answer: Response) -> Response:
            nonlocal answered
            answered = True
            conn.calls.pop(key, None)
            return answer
        try:
            key: object = (origin.name, id_key(msg.id))
        except ValueError:
            key = None  # (an id no table can hold: left to the ends, as before)
        await self._forward(origin, msg, method, out_params, source, target, settled)
        inbound = origin.inbound.get(key[1]) if isinstance(key, tuple) else None
        if not answered and inbound is not None and inbound.target is not None:
            conn.calls[key] = (origin, inbound)

    async def _cancel(self, origin: Hop, params: Raw | UnsetType, source: Node) -> None:
        """An MCP `notifications/cancelled` names the request by its sender's id, which is
        the outer id on the sender's hop (ids are per hop): passed on verbatim, it would
        name nothing at the other end, or another request that has that number there. It
        crosses as `$/cancel_request` for that request, which each end knows how to take
        (an in-process server gets its own `notifications/cancelled`)."""
        inner = acp.get_raw(params, "params")
        request_id = acp.get_raw(inner, "requestId") if inner is not None else None
        if request_id is None or not await origin.cancel_inbound(
                Raw(b'{"requestId":' + bytes(request_id) + b"}")):
            log.debug("%s cancelled an MCP request that is not open (answered meanwhile, "
                      "or never sent): dropped", source.name)

    def _find(self, ident: str, source: Node, down: bool) -> Connection | None:
        mine = self.connections.get(ident)
        if mine is not None and mine.connector is not source:
            mine = None
        theirs = self._by_provider.get((source.name, ident))
        if mine is not None and theirs is not None:
            # `source` is a connector (our id) and a provider (its own) under one string: a
            # nested conductor mints `mcp-N` too. The end the message travels toward decides.
            return theirs if (theirs.connector.index > source.index) == down else mine
        return mine or theirs

    async def _connect(self, origin: Hop, msg: Call, params: Raw | UnsetType,
                       source: Node) -> None:
        server_id = acp.get_str(params, "serverId")
        decl = self.declarations.get(server_id) if server_id is not None else None
        if decl is None:
            await self._refuse(origin, msg, acp.MCP_CONNECT, "serverId", server_id, source)
            return
        if not isinstance(msg, Request):
            log.warning("%s sent mcp/connect as a notification; dropped", source.name)
            return
        if len(self.connections) + len(self._connecting) >= self.max_connections:
            await self._reply(origin, error_response(
                msg.id, ErrorCode.LIMIT_REACHED,
                f"too many MCP-over-ACP connections: {self.max_connections} are open",
                {"serverId": server_id, "limit": self.max_connections}))
            return
        session = next(iter(decl.sessions)) if len(decl.sessions) == 1 else None
        out_params = params
        if session is not None:
            try:
                out_params = acp.set_path(params, ("_meta", acp.MCP_SESSION_META_KEY),
                                          raw(session))
            except ValueError:
                out_params = params
        place = object()
        if decl.provider.hop.failure is None:  # else it is answered at once, with no hook
            self._connecting.add(place)
        try:
            await self._forward(origin, msg, acp.MCP_CONNECT, out_params, source,
                                decl.provider, self._connected_hook(decl, source, session,
                                                                    place, origin))
        except BaseException:
            self._connecting.discard(place)
            raise

    def _connected_hook(self, decl: Declaration, connector: Node, session: str | None,
                        place: object, origin: Hop) -> ResponseHook:
        async def connected(answer: Response) -> Response:
            self._connecting.discard(place)
            if answer.is_error:
                return answer
            provider_ident = acp.get_str(answer.result, "connectionId")
            if provider_ident is None:
                return error_response(
                    answer.id, ErrorCode.INTERNAL_ERROR,
                    f"{decl.provider.name} answered mcp/connect without a connectionId",
                    {"component": decl.provider.name, "serverId": decl.server_id})
            if decl.provider.hop.failure is not None:
                return answer  # the provider is gone: the next message is refused
            if origin.failure is not None:
                # The connector left while connecting (the answer goes nowhere): nobody
                # can use or end what the provider opened, so it is ended there now.
                await self._tell(decl.provider, connector, provider_ident, request=True)
                return answer
            if decl.server_id not in self.declarations:
                # Released meanwhile (its session closed): nobody can reach the connection
                # the provider opened, so it is ended there, and the connector told so.
                await self._tell(decl.provider, connector, provider_ident, request=True)
                return error_response(
                    answer.id, ErrorCode.INVALID_PARAMS,
                    f"Invalid params: serverId {decl.server_id!r} was released while "
                    "connecting (its session closed)", {"serverId": decl.server_id})
            bound = session
            if bound is None and len(decl.sessions) == 1:
                bound = next(iter(decl.sessions))  # its setup was answered meanwhile
            conn = Connection(f"mcp-{next(self._ids)}", provider_ident, decl.server_id,
                              decl.provider, connector, bound)
            stale = self._by_provider.get((decl.provider.name, provider_ident))
            if stale is not None:  # the provider reused an id it gave before: that one
                self._drop(stale, "its connectionId was given again")  # is over for it
                await self._tell(stale.connector, stale.provider, stale.ident)
            self.connections[conn.ident] = conn
            self._by_provider[(decl.provider.name, provider_ident)] = conn
            self._trace(connector.name, "mcp-connected", connectionId=conn.ident,
                        providerConnectionId=provider_ident, serverId=decl.server_id,
                        name=decl.name, provider=decl.provider.name, session=bound)
            return answer.with_result(acp.set_key(answer.result, "connectionId",
                                                  raw(conn.ident)))
        return connected

    async def _refuse(self, origin: Hop, msg: Call, method: str, key: str,
                      value: str | None, source: Node) -> None:
        # `method` is the MCP method: `msg` may be the successor envelope that carried it.
        what = f"unknown {key} {value!r}" if value is not None else f"no {key}"
        log.warning("%s sent %s with %s", source.name, method, what)
        if isinstance(msg, Request):
            await self._reply(origin, error_response(
                msg.id, ErrorCode.INVALID_PARAMS, f"Invalid params: {what}",
                {key: value, "method": method}))

    def _drop(self, conn: Connection, reason: str) -> None:
        if self.connections.pop(conn.ident, None) is None:
            return
        self._by_provider.pop((conn.provider.name, conn.provider_ident), None)
        self._trace(conn.connector.name, "mcp-disconnected", connectionId=conn.ident,
                    provider=conn.provider.name, reason=reason)

    async def _end(self, conn: Connection, reason: str) -> None:
        """End `conn` for `reason`: its calls in flight are answered (cancelled at their
        target, which need not answer them any more), and both ends are told."""
        self._drop(conn, reason)
        calls, conn.calls = list(conn.calls.values()), {}
        for _, inbound in calls:
            target = inbound.target
            outgoing = target.pending.get(inbound.target_id) if target is not None else None
            if target is None or outgoing is None:
                continue
            await self._abandon(target, outgoing, error_response(
                outgoing.id, ErrorCode.REQUEST_CANCELLED, f"Request cancelled: the "
                f"MCP connection {conn.ident} ended ({reason})",
                {"connectionId": conn.ident, "reason": reason}))
        await self._tell_both(conn)

    # -- endings ---------------------------------------------------------------------------

    def session_closed(self, session_id: str) -> None:
        """SessionTable observer: the session ended (its connections end in `drain`)."""
        self._closed_sessions.append(session_id)

    async def drain(self) -> None:
        """End what the sessions closed since the last call held: their connections (both
        ends are told) and the declarations only they held."""
        closed, self._closed_sessions = set(self._closed_sessions), []
        if not closed:
            return
        for conn in [c for c in self.connections.values() if c.session in closed]:
            await self._end(conn, "its session closed")
        for decl in list(self.declarations.values()):
            if decl.sessions & closed:
                decl.sessions -= closed
                if not decl.sessions and not decl.pending:
                    self._release(decl)
                    # A connection to a server several sessions declared belongs to none
                    # of them alone: it ends with the last of them.
                    for conn in [c for c in self.connections.values()
                                 if c.server_id == decl.server_id]:
                        await self._end(conn, "the sessions that declared its server closed")

    async def hop_failed(self, node: Node) -> None:
        """`node`'s component is gone: its connections end, its declarations go."""
        for conn in list(self.connections.values()):
            if conn.provider is node:
                self._drop(conn, f"{node.name} is gone")
                await self._tell(conn.connector, conn.provider, conn.ident)
            elif conn.connector is node:
                self._drop(conn, f"{node.name} is gone")
                await self._tell(conn.provider, conn.connector, conn.provider_ident,
                                 request=True)
        for decl in [d for d in self.declarations.values() if d.provider is node]:
            self._release(decl)

    async def _tell_both(self, conn: Connection) -> None:
        await self._tell(conn.provider, conn.connector, conn.provider_ident, request=True)
        await self._tell(conn.connector, conn.provider, conn.ident)

    async def _tell(self, target: Node, source: Node, ident: str, *,
                    request: bool = False) -> None:
        """`mcp/disconnect` to one end: a request to a provider (it is how it is told), a
        notification to a connector (nothing it could answer would change anything)."""
        if target.hop.failure is not None:
            return
        await self._originate(source, target, acp.MCP_DISCONNECT,
                              raw({"connectionId": ident}), request)

    # -- traces ------------------------------------------------------------------------------

    def _trace(self, component: str, event: str, **fields: object) -> None:
        if self._tracer is not None:
            self._tracer.lifecycle(component, event, **fields)
