"""A proxy's MCP servers (the official `mcp` SDK), served over MCP-over-ACP in this process.

The plugin host hands this module what concerns tools: the initialize answer (does the
agent side take `acp` MCP servers?), each session setup it sends downstream (it appends one
`{"type": "acp", "name", "serverId"}` per offered server), the answers to those (which
session each serverId belongs to), session ends, and the `mcp/*` messages naming its
serverIds or connectionIds.

Each `mcp/connect` starts one run of the SDK server (`Server.run`) on a pair of in-memory
streams: no subprocess, no HTTP, and the same code whether the proxy runs inside the
conductor or stand-alone (`serve-proxy`). An `mcp/message` request becomes a JSON-RPC
request on the server's input, under an id of this connection's own, and its answer the
ACP answer (the bare inner result, or the inner error); cancelling it sends the server
`notifications/cancelled`. What the server sends itself (progress, list changes, log
lines, and requests such as elicitation) goes to the connector as `mcp/message`.
A handler finds the ACP side of its call with `conductor.plugins.tool_context()`.

The SDK is imported by the first connection that needs it (each function below imports
what it uses): ≈ 0.65 s of CPU that a chain whose proxy offers servers lazily (`McpOffer`
with `build`, as `session-tools` does) no longer spends before answering `initialize`,
and a run whose agent never connects never spends.

serverIds are minted per session setup, so each belongs to one session; a reload
(`session/load`, `session/resume`) of a session declares the same serverIds again.
"""

from __future__ import annotations

import contextlib
import itertools
import logging
import uuid
from collections import OrderedDict
from typing import TYPE_CHECKING, Any, Final

import anyio
import msgspec
from msgspec import UNSET, Raw, UnsetType, field

from conductor import acp
from conductor.errors import PluginError, RpcError
from conductor.jsonrpc.codes import ErrorCode
from conductor.jsonrpc.message import Notification, Request, error_response, id_key, payload
from conductor.plugins.api import (
    McpOffer,
    Proxy,
    SessionSetup,
    Side,
    ToolContext,
    _tool_context,
)
from conductor.record import Record
from conductor.routing.mcp import McpSupport
from conductor.rpc.endpoint import Inbound

if TYPE_CHECKING:
    from collections.abc import Sequence

    import mcp_types
    from anyio.abc import TaskStatus
    from anyio.streams.memory import MemoryObjectReceiveStream, MemoryObjectSendStream
    from mcp.server.lowlevel import Server
    from mcp.shared.message import SessionMessage

    from conductor.jsonrpc.message import Call, JsonValue
    from conductor.plugins.host import HostRequest, ProxyHost

log = logging.getLogger("acp_conductor.plugins.tools")

STREAM_BUFFER: Final = 64       # messages queued toward / from one server run
MAX_SERVER_IDS: Final = 4096    # declared serverIds kept (oldest unused ones go first)
MAX_CONNECTIONS: Final = 256    # open connections per proxy


def as_offer(item: McpOffer | Any) -> McpOffer:
    return item if isinstance(item, McpOffer) else McpOffer(item)


def lowlevel(server: Any) -> Server[Any]:
    """The low-level SDK server behind `server` (an MCPServer wraps one).

    Raises:
        TypeError: not an `mcp` SDK server.
    """
    from mcp.server.lowlevel import Server  # (loaded already: `server` came from the SDK)

    if isinstance(server, Server):
        return server
    inner = getattr(server, "_lowlevel_server", None)  # MCPServer: how the SDK itself runs it
    if isinstance(inner, Server):
        return inner
    raise TypeError(f"{server!r} is not an MCP server from the `mcp` SDK "
                    "(mcp.server.mcpserver.MCPServer or mcp.server.lowlevel.Server)")


def made(offer: McpOffer) -> Server[Any]:
    """The low-level server of `offer`, made now if it is offered with `build`.

    Raises:
        PluginError: `build` failed, or made something that is not an MCP server (the
            proxy's failure then names the server, not only the exception).
    """
    try:
        return lowlevel(offer.instance())
    except Exception as e:
        raise PluginError(f"its MCP server {offer.declared_name!r} could not be made: "
                          f"{type(e).__name__}: {e}") from e


class _Declared(Record, eq=False):
    server_id: str
    offer: McpOffer
    key: str                      # stable within a session: the server's name (+ a number)
    session_id: str | None = None
    pending: bool = True          # its setup request is unanswered


class _Waiter(Record):
    local: int = 0                # the call's id toward the server
    done: anyio.Event = field(default_factory=anyio.Event)
    result: Any = None
    error: mcp_types.ErrorData | None = None


class ToolServers:
    """The MCP servers one proxy offers, their declarations and their connections."""

    def __init__(self, host: ProxyHost, offers: Sequence[McpOffer | Any]) -> None:
        self._host = host
        proxy = host.proxy
        self._offers = [as_offer(o) for o in offers]
        for offer in self._offers:
            if offer.server is not None:  # (one offered with `build` is checked when made)
                lowlevel(offer.server)  # a wrong object fails at start, naming it
        self._per_session = type(proxy).session_mcp_servers is not Proxy.session_mcp_servers
        self.support = McpSupport()
        self.acp_downstream: bool | None = None
        self._declared: dict[str, _Declared] = {}
        self._by_session: dict[str, dict[str, str]] = {}   # session -> key -> serverId
        self.connections: dict[str, _Connection] = {}
        # Connections whose server run ended on its own, and why: what the connector sent
        # before it heard (the two cross over pipes) is answered here, not passed on to a
        # component that never heard of the id.
        self._ended: OrderedDict[str, str] = OrderedDict()
        self._warned = False

    # -- declarations --------------------------------------------------------------------

    def learn_initialize(self, answer_result: Raw | UnsetType) -> None:
        version = acp.result_protocol_version(answer_result)
        self.support.learn(2 if isinstance(version, int) and version >= 2 else 1,
                           answer_result)
        self.acp_downstream = bool(self.support.takes("acp"))

    async def declare(self, method: str, params: Raw | UnsetType
                      ) -> tuple[Raw | UnsetType, list[str]]:
        """A session setup request goes downstream: append this proxy's servers."""
        if self.acp_downstream is False:
            if not self._warned:
                self._warned = True
                log.warning("proxy %s offers MCP servers, but the agent side does not take "
                            "acp MCP servers (and no bridge stands in): not declared",
                            self._host.name)
            return params, []
        session_id = acp.get_str(params, "sessionId")
        offers = self._host.proxy.declared_mcp_servers()
        if self._per_session:
            decoded = None if params is UNSET else msgspec.json.decode(params)
            setup = SessionSetup(method, decoded, session_id)
            offers += [as_offer(o) for o in await self._host.bounded(
                "session_mcp_servers", self._host.proxy.session_mcp_servers(setup))]
        if not offers:
            return params, []
        # A reload of a known session declares the serverIds it had (stable for the agent).
        reuse = self._by_session.get(session_id, {}) \
            if session_id is not None and method in (acp.SESSION_LOAD, acp.SESSION_RESUME) \
            else {}
        for offer in offers:  # all made first: one that fails registers none of them
            made(offer)
        entries: list[Raw] = []
        ids: list[str] = []
        seen: dict[str, int] = {}
        for offer in offers:
            name = offer.declared_name
            seen[name] = seen.get(name, 0) + 1
            key = name if seen[name] == 1 else f"{name}#{seen[name]}"
            server_id = reuse.get(key)
            decl = self._declared.get(server_id) if server_id is not None else None
            if decl is None or decl.offer.instance() is not offer.instance():
                server_id = f"{name}-{uuid.uuid4().hex}"
                self._evict()
                self._declared[server_id] = _Declared(server_id, offer, key)
            else:
                decl.pending = True
            assert server_id is not None
            ids.append(server_id)
            entries.append(payload({"type": "acp", "name": name, "serverId": server_id}))
        if method in (acp.SESSION_LOAD, acp.SESSION_RESUME) and session_id is not None:
            self.bind(ids, session_id)  # the request names the session: bound at once
        try:
            return acp.append_to_list(params, "mcpServers", entries), ids
        except (ValueError, msgspec.MsgspecError):
            log.warning("%s: %s params are not an object with a list of mcpServers; no MCP "
                        "servers declared", self._host.name, method)
            self.bind(ids, None)
            return params, []

    def bind(self, server_ids: list[str], session_id: str | None) -> None:
        """The setup request that declared `server_ids` was answered (None: it failed)."""
        for server_id in server_ids:
            decl = self._declared.get(server_id)
            if decl is None:
                continue
            decl.pending = False
            if session_id is None:
                if decl.session_id is None and not self._used(server_id):
                    del self._declared[server_id]
                continue
            decl.session_id = session_id
            self._by_session.setdefault(session_id, {})[decl.key] = server_id

    def _used(self, server_id: str) -> bool:
        return any(c.decl.server_id == server_id for c in self.connections.values())

    def _evict(self) -> None:
        if len(self._declared) < MAX_SERVER_IDS:
            return
        for server_id, decl in list(self._declared.items()):
            if not decl.pending and not self._used(server_id):
                self._forget_id(decl)
                return

    def _forget_id(self, decl: _Declared) -> None:
        self._declared.pop(decl.server_id, None)
        if decl.session_id is not None:
            keys = self._by_session.get(decl.session_id, {})
            keys.pop(decl.key, None)
            if not keys:
                self._by_session.pop(decl.session_id, None)

    async def session_closed(self, session_id: str) -> None:
        """The session ended: its servers' connections close, its serverIds go."""
        for server_id in self._by_session.pop(session_id, {}).values():
            self._declared.pop(server_id, None)
            for conn in [c for c in self.connections.values()
                         if c.decl.server_id == server_id]:
                conn.close()

    # -- connections ---------------------------------------------------------------------

    def claims(self, msg: Call) -> bool:
        """Is this `mcp/*` message for one of this proxy's servers or connections?"""
        if msg.method == acp.MCP_CONNECT:
            server_id = acp.get_str(msg.params, "serverId")
            return server_id is not None and server_id in self._declared
        ident = acp.get_str(msg.params, "connectionId")
        return ident is not None and (ident in self.connections or ident in self._ended)

    async def handle(self, msg: Call, source: Side) -> None:
        """An `mcp/*` message this proxy claims (see `claims`), from `source`."""
        host = self._host
        assert host.task_group is not None
        if msg.method == acp.MCP_CONNECT:
            if isinstance(msg, Request):
                host.task_group.start_soon(host.endpoint.answer, msg,
                                           self._connector(source))
            return
        ident = acp.get_str(msg.params, "connectionId")
        conn = self.connections.get(ident) if ident is not None else None
        if conn is None:  # it ended on its own (see `claims`)
            why = self._ended.get(ident, "") if ident is not None else ""
            if isinstance(msg, Request) and msg.method == acp.MCP_DISCONNECT:
                await host.endpoint.answer(msg, _empty)
            elif isinstance(msg, Request):
                await host.endpoint.send(error_response(
                    msg.id, ErrorCode.INVALID_PARAMS, f"Invalid params: the MCP connection "
                    f"{ident} has ended: {why}", {"connectionId": ident}))  # why names us
            return
        if msg.method == acp.MCP_DISCONNECT:
            conn.close()
            if isinstance(msg, Request):
                await host.endpoint.answer(msg, _empty)
            return
        inner = acp.get_str(msg.params, "method")
        try:
            inner_params = _inner_params(msg.params)
            problem = "without a method" if inner is None else None
        except ValueError as e:
            problem = str(e)
        if inner is None or problem is not None:
            text = f"Invalid params: proxy {host.name}: mcp/message {problem}"
            if isinstance(msg, Request):
                await host.endpoint.send(error_response(
                    msg.id, ErrorCode.INVALID_PARAMS, text, {"method": inner}))
            else:
                log.warning("%s (dropped)", text)
            return
        if isinstance(msg, Notification):
            if inner == _CANCELLED:
                await conn.cancel_call(inner_params)
            else:
                await conn.notify_server(inner, inner_params)
            return
        inbound = Inbound()
        try:
            key: Any = id_key(msg.id)
        except ValueError:
            key = None  # (an id the endpoint answers anyway; no cancel can name it)
        # Handed to the server and findable by a cancel now, not in the task that waits:
        # what the connector sent next (its cancel, a notification) may be dispatched
        # before that task runs, and must not overtake the call.
        conn.calls[key] = inbound
        host.endpoint.track_inbound(msg.id, inbound)
        try:
            sent: _Waiter | Exception = await conn.send_call(inner, inner_params, inbound)
        except Exception as e:  # answered below, as a handler's failure
            sent = e

        async def call(request: Request) -> JsonValue:
            try:
                if isinstance(sent, Exception):
                    raise sent
                return await conn.result(inner, sent)
            finally:
                if conn.calls.get(key) is inbound:
                    del conn.calls[key]
        host.task_group.start_soon(host.endpoint.answer, msg, call, inbound)

    def _connector(self, source: Side) -> Any:
        async def connect(request: Request) -> JsonValue:
            server_id = acp.get_str(request.params, "serverId")
            decl = self._declared.get(server_id) if server_id is not None else None
            if decl is None:  # released between the claim and now
                raise RpcError(ErrorCode.INVALID_PARAMS, f"Invalid params: unknown serverId "
                               f"{server_id!r}", {"serverId": server_id})
            if len(self.connections) >= MAX_CONNECTIONS:
                raise RpcError(ErrorCode.LIMIT_REACHED, f"proxy {self._host.name}: too many "
                               f"MCP connections ({MAX_CONNECTIONS} open)",
                               {"serverId": server_id, "limit": MAX_CONNECTIONS})
            conn = _Connection(self, f"{decl.offer.declared_name}-{uuid.uuid4().hex[:12]}",
                               decl, source)
            assert self._host.task_group is not None
            await self._host.task_group.start(conn.run)
            return {"connectionId": conn.ident}
        return connect

    def ended(self, ident: str, why: str) -> None:
        self._ended[ident] = why
        while len(self._ended) > MAX_CONNECTIONS:
            self._ended.popitem(last=False)

    async def aclose(self) -> None:
        for conn in list(self.connections.values()):
            conn.close()


async def _empty(request: Request) -> JsonValue:
    return {}


def _inner_params(params: Raw | UnsetType) -> dict[str, Any] | None:
    """The inner MCP message's params (None: it has none).

    Raises:
        ValueError: they are not an object (MCP params are named), which the server would
            otherwise see as no params at all.
    """
    value = acp.get_raw(params, "params")
    if value is None:
        return None
    decoded = msgspec.json.decode(value)
    if decoded is not None and not isinstance(decoded, dict):
        raise ValueError("whose params are not an object")
    return decoded


class _Connection:
    """One MCP-over-ACP connection: one run of the SDK server on in-memory streams."""

    def __init__(self, servers: ToolServers, ident: str, decl: _Declared, side: Side) -> None:
        from mcp.shared.message import SessionMessage

        self.servers = servers
        self.ident = ident
        self.decl = decl
        self.side = side                       # where the connector is
        self.scope = anyio.CancelScope()
        self.closing = False                   # ended by the connector or the session
        self._ids = itertools.count(1)
        self._waiting: dict[int, _Waiter] = {}
        # The server's own requests relayed to the connector, by the server's id: its
        # `notifications/cancelled` names them so, which means nothing past this proxy.
        # None: not sent yet (a cancel then waits for the send).
        self._relayed: dict[Any, HostRequest | None] = {}
        self._cancel_early: set[Any] = set()
        # The connector's calls in flight, by the id of the mcp/message that carried each:
        # what its `notifications/cancelled` names them by (the server's ids are its own).
        self.calls: dict[Any, Inbound] = {}
        to_server, self._server_in = anyio.create_memory_object_stream[
            SessionMessage | Exception](STREAM_BUFFER)
        self._server_out, from_server = anyio.create_memory_object_stream[SessionMessage](
            STREAM_BUFFER)
        self._to_server: MemoryObjectSendStream[SessionMessage | Exception] = to_server
        self._from_server: MemoryObjectReceiveStream[SessionMessage] = from_server
        host = servers._host
        self.context = ToolContext(host, server_name=decl.offer.declared_name,
                                   server_id=decl.server_id, connection_id=ident,
                                   session_id=lambda: decl.session_id)

    @property
    def _host(self) -> ProxyHost:
        return self.servers._host

    async def run(self, *, task_status: TaskStatus[None]) -> None:
        import mcp_types

        server = made(self.decl.offer)
        name = self.decl.offer.declared_name
        self.servers.connections[self.ident] = self
        _tool_context.set(self.context)  # this task's context: handlers inherit it
        log.info("%s: MCP server %s connected (%s)", self._host.name, name, self.ident)
        why = (f"proxy {self._host.name}: the connection {self.ident} to its MCP server "
               f"{name!r} closed before the answer (disconnected, or its session ended)")
        try:
            with self.scope:
                async with anyio.create_task_group() as tg:
                    tg.start_soon(self._pump, tg)
                    task_status.started()
                    await server.run(self._server_in, self._server_out,
                                     server.create_initialization_options())
                    tg.cancel_scope.cancel()
        except Exception as e:
            # A failing lifespan (or the SDK) ends this connection; it runs in the proxy's
            # task group, so letting it escape would take the whole proxy down with it.
            leaf = _leaf(e)
            why = (f"proxy {self._host.name}: its MCP server {name!r} failed: "
                   f"{type(leaf).__name__}: {leaf}")
            log.error("%s (connection %s)", why, self.ident, exc_info=leaf)
        finally:
            for stream in (self._to_server, self._server_in, self._server_out,
                           self._from_server):
                stream.close()
            self.servers.connections.pop(self.ident, None)
            for waiter in self._waiting.values():
                waiter.error = mcp_types.ErrorData(code=ErrorCode.INTERNAL_ERROR,
                                                   message=why)
                waiter.done.set()
            self._waiting.clear()
            log.info("%s: MCP connection %s closed", self._host.name, self.ident)
        if not self.closing:  # it ended on its own: the connector (and router) must hear
            self.servers.ended(self.ident, why)
            with contextlib.suppress(Exception):  # the connector's side may be gone too
                await self._host.notify(acp.MCP_DISCONNECT,
                                        payload({"connectionId": self.ident}), self.side)

    def close(self) -> None:
        self.closing = True
        self._to_server.close()   # the server sees EOF and ends its run
        self.scope.cancel()

    async def send_call(self, method: str, params: dict[str, Any] | None,
                        inbound: Inbound) -> _Waiter:
        """Hand the connector's request to the server (its answer: `result`)."""
        import mcp_types
        from mcp.shared.message import ServerMessageMetadata, SessionMessage

        local = next(self._ids)
        waiter = _Waiter(local)
        self._waiting[local] = waiter

        async def unanswered() -> None:  # the server settled it without answering: cancelled
            waiter.error = mcp_types.ErrorData(code=ErrorCode.REQUEST_CANCELLED,
                                               message="Request cancelled")
            waiter.done.set()

        async def cancel() -> None:  # $/cancel_request from the connector
            await self.notify_server("notifications/cancelled",
                                     {"requestId": local, "reason": "cancelled over ACP"})
        inbound.on_cancel = cancel
        message = _message({"jsonrpc": "2.0", "id": local, "method": method,
                            **({"params": params} if params is not None else {})})
        try:
            await self._to_server.send(SessionMessage(message, ServerMessageMetadata(
                on_request_unanswered=unanswered)))
        except (anyio.BrokenResourceError, anyio.ClosedResourceError):
            self._waiting.pop(local, None)
            waiter.error = mcp_types.ErrorData(
                code=ErrorCode.INTERNAL_ERROR, message=f"the MCP connection {self.ident} is "
                "closed", data={"connectionId": self.ident})
            waiter.done.set()
            return waiter
        return waiter

    async def result(self, method: str, waiter: _Waiter) -> JsonValue:
        """The server's answer to a call `send_call` handed it (its result, or RpcError)."""
        try:
            await waiter.done.wait()
        finally:
            self._waiting.pop(waiter.local, None)
        error = waiter.error
        if error is not None and error.code == 0:
            # The SDK's answer for a handler that raised (its message the exception's text;
            # it logged the traceback): 0 is no JSON-RPC code, and the agent is told who.
            name = self.decl.offer.declared_name
            raise RpcError(ErrorCode.INTERNAL_ERROR, f"proxy {self._host.name}: its MCP "
                           f"server {name!r} failed on {method}: {error.message}",
                           {"component": self._host.name, "server": name, "method": method})
        if error is not None:
            raise RpcError(error.code, error.message, error.data)
        return waiter.result

    async def cancel_call(self, params: dict[str, Any] | None) -> None:
        """The connector's MCP cancel: it names its call by the outer id, never passed on
        as is (the server would read it as one of its own ids)."""
        requested = (params or {}).get("requestId")
        try:
            inbound = self.calls.get(id_key(payload(requested)))
        except ValueError:
            inbound = None
        if inbound is not None and inbound.on_cancel is not None:
            await inbound.on_cancel()

    async def notify_server(self, method: str, params: dict[str, Any] | None) -> None:
        from mcp.shared.message import SessionMessage

        message = _message({"jsonrpc": "2.0", "method": method,
                            **({"params": params} if params is not None else {})})
        try:
            await self._to_server.send(SessionMessage(message))
        except (anyio.BrokenResourceError, anyio.ClosedResourceError):
            log.debug("%s: %s for a closed MCP connection dropped", self._host.name, method)

    async def _pump(self, tg: anyio.abc.TaskGroup) -> None:
        """What the server writes: answers to the connector's requests, and its own
        notifications and requests, which go to the connector as `mcp/message`."""
        import mcp_types

        async with self._from_server:
            async for item in self._from_server:
                message = item.message
                if isinstance(message, mcp_types.JSONRPCResponse | mcp_types.JSONRPCError):
                    waiter = self._waiting.get(message.id) \
                        if isinstance(message.id, int) else None
                    if waiter is None:
                        log.debug("%s: answer for unknown MCP id %r", self.ident, message.id)
                        continue
                    if isinstance(message, mcp_types.JSONRPCError):
                        waiter.error = message.error
                    else:
                        waiter.result = message.result
                    waiter.done.set()
                elif isinstance(message, mcp_types.JSONRPCRequest):
                    self._relayed[message.id] = None
                    tg.start_soon(self._relay_request, message)
                elif message.method == "notifications/cancelled":
                    await self._cancel_relayed((message.params or {}).get("requestId"))
                else:
                    await self._host.notify(acp.MCP_MESSAGE, self._envelope(
                        message.method, message.params), self.side)

    def _envelope(self, method: str, params: Any) -> Raw:
        body: dict[str, Any] = {"connectionId": self.ident, "method": method}
        if params is not None:
            body["params"] = params
        return payload(body)

    async def _cancel_relayed(self, request_id: Any) -> None:
        """The server gave up a request it made: cancel it where it was relayed (the
        connector's `$/cancel_request`, under the id it was asked with)."""
        if request_id not in self._relayed:
            return  # answered meanwhile: nothing to cancel
        pending = self._relayed[request_id]
        if pending is None:
            self._cancel_early.add(request_id)
        else:
            await pending.cancel()

    async def _relay_request(self, message: mcp_types.JSONRPCRequest) -> None:
        """A request of the server's own (elicitation, sampling, roots): ask the connector."""
        import mcp_types
        from mcp.shared.message import SessionMessage

        try:
            pending = await self._host.start_request(
                acp.MCP_MESSAGE, self._envelope(message.method, message.params), self.side)
            self._relayed[message.id] = pending
            if message.id in self._cancel_early:
                await pending.cancel()
            answer = await pending.wait()
        except Exception as e:  # the connector is gone: the server gets an error
            reply: mcp_types.JSONRPCMessage = mcp_types.JSONRPCError(
                jsonrpc="2.0", id=message.id, error=mcp_types.ErrorData(
                    code=ErrorCode.INTERNAL_ERROR, message=f"{type(e).__name__}: {e}"))
        else:
            if answer.is_error:
                error = answer.error_value()
                error = error if isinstance(error, dict) else {}
                code = error.get("code")
                if not isinstance(code, int) or isinstance(code, bool):
                    code = ErrorCode.INTERNAL_ERROR  # the connector's error is malformed:
                    # the server still gets an error, not a crash of its connection
                reply = mcp_types.JSONRPCError(jsonrpc="2.0", id=message.id,
                                               error=mcp_types.ErrorData(
                                                   code=code,
                                                   message=str(error.get("message", "")),
                                                   data=error.get("data")))
            else:
                result = answer.result_value()
                reply = mcp_types.JSONRPCResponse(jsonrpc="2.0", id=message.id,
                                                  result=result if isinstance(result, dict)
                                                  else {})
        finally:
            self._relayed.pop(message.id, None)
            self._cancel_early.discard(message.id)
        try:
            await self._to_server.send(SessionMessage(reply))
        except (anyio.BrokenResourceError, anyio.ClosedResourceError):
            pass


def _leaf(error: BaseException) -> BaseException:
    """The one exception inside task-group wrappings (the group itself when several)."""
    while isinstance(error, BaseExceptionGroup) and len(error.exceptions) == 1:
        error = error.exceptions[0]
    return error


_CANCELLED: Final = "notifications/cancelled"


def _message(body: dict[str, Any]) -> mcp_types.JSONRPCMessage:
    import mcp_types

    message: mcp_types.JSONRPCMessage = mcp_types.jsonrpc_message_adapter.validate_python(
        body, by_name=False)
    return message
