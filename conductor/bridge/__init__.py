"""The MCP bridge: `acp` MCP servers for an agent that does not take them (docs/mcp.md).

When the agent's initialize answer lacks `acp` MCP support, the chain says it has it
(proxies and the editor then offer `acp` servers), and each `acp` declaration that reaches
the agent is rewritten into a transport the agent takes:

- `http`: a Streamable HTTP MCP endpoint on 127.0.0.1 (one path per server), which wants
  `Authorization: Bearer <token>` with a token of that server's own; anything else is
  refused (401) and logged;
- `stdio`: `acp-conductor mcp-shim KEY`, a small program the agent spawns, which connects
  back over a Unix socket in a private (0700) directory and proves itself with the token
  from its environment.

Each MCP session the agent opens is one MCP-over-ACP connection to the provider: the
bridge is a connector of the router (a side connection, `mcp-bridge`), so routing,
cancellation, session ends and traces are the same as for an agent that speaks acp. The
rewrite of a serverId is kept while the router knows it, so a declaration reaching the
agent again (load, resume, fork) gets the same URL or command; it goes when the router
releases the serverId (its sessions closed).
"""

from __future__ import annotations

import logging
import sys
from contextlib import asynccontextmanager
from typing import TYPE_CHECKING, Any, Final, Protocol

import anyio

from conductor import acp
from conductor.jsonrpc.framing import DEFAULT_MAX_FRAME_BYTES
from conductor.jsonrpc.message import (
    Notification,
    Request,
    Response,
    error_response,
    payload,
    raw,
)
from conductor.record import Record
from conductor.routing.mcp import (
    McpRefusedError,
    McpSupport,
    acp_declarations,
    map_acp_entries,
)
from conductor.routing.topology import Hop
from conductor.rpc.endpoint import Endpoint

if TYPE_CHECKING:
    from collections.abc import AsyncIterator

    from anyio.abc import TaskGroup
    from msgspec import Raw, UnsetType

    from conductor.bridge.http import HttpBridge
    from conductor.bridge.relay import Relay
    from conductor.bridge.stdio import SocketBridge
    from conductor.jsonrpc.message import Message
    from conductor.routing.chain import Chain
    from conductor.tracing.sink import TraceSink

log = logging.getLogger("acp_conductor.bridge")

MAX_SERVERS: Final = 4096
TOKEN_ENV: Final = "ACP_CONDUCTOR_MCP_TOKEN"
SOCKET_ENV: Final = "ACP_CONDUCTOR_MCP_SOCKET"


class BridgedServer(Record, eq=False):
    """One `acp` server as the agent sees it through the bridge."""

    server_id: str
    name: str
    key: str          # its path / shim argument: random, never the serverId itself
    token: str        # what the agent must present

    def check(self, token: str | None) -> bool:
        import hmac  # here: the serving path's start-up does without hashlib/OpenSSL

        return token is not None and hmac.compare_digest(token.encode(), self.token.encode())


class Leftovers(Protocol):
    """What removes the bridge's socket directory if the conductor dies first (its
    watchdog: `conductor.supervise.watchdog.WATCHDOG`)."""

    def remove_at_end(self, directory: str) -> None: ...

    def forget(self, directory: str) -> None: ...


class McpBridge:
    """Implements `conductor.routing.mcp.Bridge` for one chain."""

    def __init__(self, mode: str, tg: TaskGroup, *, tracer: TraceSink | None = None,
                 max_message_bytes: int = DEFAULT_MAX_FRAME_BYTES,
                 leftovers: Leftovers | None = None) -> None:
        self.mode = mode                 # auto | http | stdio
        self.tg = tg
        self.tracer = tracer
        self.leftovers = leftovers
        self.max_message_bytes = max_message_bytes  # a shim's message: the chain's frame limit
        self.servers: dict[str, BridgedServer] = {}     # by serverId
        self.by_key: dict[str, BridgedServer] = {}
        # Released, by key (bounded): what an agent's client still sends one of these (its
        # session's DELETE) is late, not a stranger's, and is answered so.
        self._released: dict[str, BridgedServer] = {}
        self.relays: dict[str, Relay] = {}              # by connectionId
        self.endpoint: Endpoint | None = None
        self._http: HttpBridge | None = None
        self._socket: SocketBridge | None = None
        # Setups may be rewritten concurrently (in-process proxies): one listener each, not
        # one per setup that found none yet.
        self._opening = anyio.Lock()

    # -- wiring --------------------------------------------------------------------------

    def attach(self, chain: Chain) -> None:
        """Become a connector of `chain`'s router (a side connection)."""
        bridge = self

        class ToBridge:
            async def send(self, item: Message | list[Message]) -> None:
                for message in item if isinstance(item, list) else [item]:
                    await bridge._deliver(message)

            async def aclose(self) -> None:
                return None

        hop = Hop("mcp-bridge", ToBridge(), tracer=self.tracer)
        chain.topology.add_side("mcp-bridge", hop)

        class ToChain:
            async def send(self, item: Message | list[Message]) -> None:
                for message in item if isinstance(item, list) else [item]:
                    await chain.receive(hop, message)

            async def aclose(self) -> None:
                return None

        self.endpoint = Endpoint("mcp-bridge", ToChain())

    def transport_for(self, support: McpSupport) -> str | None:
        """The transport the agent gets: http when it takes it (auto, http), else stdio."""
        if self.mode in ("auto", "http") and support.takes("http"):
            return "http"
        if self.mode in ("auto", "stdio") and support.takes("stdio") is not False:
            return "stdio"
        return None

    def covers(self, support: McpSupport) -> bool:
        return self.transport_for(support) is not None

    async def rewrite(self, params: Raw | UnsetType, support: McpSupport,
                      required: frozenset[str]) -> Raw | UnsetType:
        transport = self.transport_for(support)
        if transport is None:  # the router only asks when `covers`
            raise McpRefusedError(next(iter(required), "?"), "no bridge transport")
        try:
            if transport == "http":
                http = await self._open_http()
                base = http.base_url
            else:
                sock = await self._open_socket()
        except OSError as e:  # no listener: as if no bridge stood in, saying why
            why = f"the conductor's MCP bridge cannot listen ({transport}): {e}"
            declared = acp_declarations(params)
            for _, name in declared:
                if name in required:
                    raise McpRefusedError(name, why) from e
            log.warning("%s; not declared to the agent: %s", why,
                        ", ".join(repr(name) for _, name in declared))
            self._trace("mcp-bridge-failed", transport=transport, reason=str(e))
            return map_acp_entries(params, lambda server_id, name: None)
        entries: dict[str, Any] = {}
        for server_id, name in acp_declarations(params):
            server = self._server(server_id, name)
            if transport == "http":
                entries[server_id] = {"type": "http", "name": name,
                                      "url": f"{base}/{server.key}",
                                      "headers": [{"name": "Authorization",
                                                   "value": f"Bearer {server.token}"}]}
            else:
                # -P: the agent picks the directory it runs in, whose own conductor.py
                # (or package) `-m` would otherwise import instead of ours.
                body: dict[str, Any] = {"name": name, "command": sys.executable,
                                        "args": ["-P", "-m", "conductor", "mcp-shim",
                                                 server.key],
                                        "env": [{"name": SOCKET_ENV, "value": sock.path},
                                                {"name": TOKEN_ENV, "value": server.token}]}
                entries[server_id] = {"type": "stdio", **body} if support.version >= 2 \
                    else body
            self._trace("mcp-bridged", serverId=server_id, name=name, transport=transport)
        return map_acp_entries(params, lambda server_id, name: payload(entries[server_id]))

    def _server(self, server_id: str, name: str) -> BridgedServer:
        server = self.servers.get(server_id)
        if server is None:
            if len(self.servers) >= MAX_SERVERS:
                oldest = next(iter(self.servers.values()))
                self.servers.pop(oldest.server_id)
                self.by_key.pop(oldest.key, None)
            import secrets  # only once an MCP server is bridged (start-up stays light)

            server = BridgedServer(server_id, name, secrets.token_hex(8),
                                   secrets.token_urlsafe(32))
            self.servers[server_id] = server
            self.by_key[server.key] = server
        return server

    def release(self, server_id: str) -> None:
        """Its sessions are gone: its URL or shim key, and its token, serve no more (and
        past `MAX_SERVERS`, what is evicted is then never a live session's)."""
        server = self.servers.pop(server_id, None)
        if server is not None:
            self.by_key.pop(server.key, None)
            self._released[server.key] = server
            if len(self._released) > MAX_SERVERS:
                del self._released[next(iter(self._released))]

    def released(self, key: str | None, token: str | None) -> BridgedServer | None:
        """The released server `key` names, if `token` is its own: its agent's client is
        late (its sessions closed), not a stranger at the door."""
        server = self._released.get(key) if key is not None else None
        return server if server is not None and server.check(token) else None

    async def _open_http(self) -> HttpBridge:
        async with self._opening:
            return await self._start_http()

    async def _start_http(self) -> HttpBridge:
        if self._http is None:
            from conductor.bridge.http import HttpBridge
            http = HttpBridge(self)
            await self.tg.start(http.serve)
            self._http = http
            log.info("MCP bridge listening on %s", http.base_url)
        return self._http

    async def _open_socket(self) -> SocketBridge:
        async with self._opening:
            return await self._start_socket()

    async def _start_socket(self) -> SocketBridge:
        if self._socket is None:
            from conductor.bridge.stdio import SocketBridge
            sock = SocketBridge(self)
            await self.tg.start(sock.serve)
            self._socket = sock
        return self._socket

    # -- sessions ------------------------------------------------------------------------

    async def connect(self, server: BridgedServer) -> str:
        """Open the MCP-over-ACP connection for one agent-side session.

        Raises:
            RpcError: the router or the provider refused.
        """
        assert self.endpoint is not None
        answer = await self.endpoint.call(acp.MCP_CONNECT, {"serverId": server.server_id})
        ident = (answer.result_value() or {}).get("connectionId")
        if not isinstance(ident, str):
            raise RuntimeError("mcp/connect answered without a connectionId")
        return ident

    async def _deliver(self, message: Message) -> None:
        """What the router sends the bridge: answers, and the providers' messages."""
        assert self.endpoint is not None
        if isinstance(message, Response):
            await self.endpoint.settle(message)
            return
        if message.method == acp.CANCEL_REQUEST:
            await self.endpoint.cancel_inbound(message.params)
            return
        ident = acp.get_str(message.params, "connectionId")
        relay = self.relays.get(ident) if ident is not None else None
        if message.method == acp.MCP_MESSAGE and relay is not None:
            await relay.from_provider(message)
        elif message.method == acp.MCP_DISCONNECT and relay is not None:
            self.relays.pop(relay.connection_id, None)
            self.tg.start_soon(lambda: relay.close(tell_provider=False))
            if isinstance(message, Request):
                await self.endpoint.send(Response(id=message.id, result=_EMPTY))
        elif isinstance(message, Request):
            await self.endpoint.send(error_response(
                message.id, -32602, f"Invalid params: the bridge has no connection {ident!r}",
                {"connectionId": ident, "method": message.method}))
        elif not isinstance(message, Notification) or message.method != acp.MCP_DISCONNECT:
            log.debug("bridge: %s for an unknown connection dropped", message.method)

    def refused(self, how: str, detail: str) -> None:
        log.warning("MCP bridge refused a %s request: %s", how, detail)
        self._trace("mcp-bridge-refused", transport=how, reason=detail)

    def _trace(self, event: str, **fields: object) -> None:
        if self.tracer is not None:
            self.tracer.lifecycle("mcp-bridge", event, **fields)

    async def agent_gone(self) -> None:
        """The agent's process ended (it is restarted): end its HTTP MCP sessions, which no
        connection closing marks the end of (they would hold their provider connections
        until the idle timeout). Its shims ended with it: their sockets closed."""
        if self._http is not None:
            await self._http.end_sessions()

    async def aclose(self) -> None:
        """Close every agent-side session and stop the listeners (bounded)."""
        for relay in list(self.relays.values()):
            await relay.close(tell_provider=False)
        self.relays.clear()
        if self._http is not None:
            await self._http.aclose()


_EMPTY: Final = raw({})


@asynccontextmanager
async def open_mcp_bridge(mode: str, *, tracer: TraceSink | None = None,
                          max_message_bytes: int = DEFAULT_MAX_FRAME_BYTES
                          ) -> AsyncIterator[McpBridge]:
    """A bridge for one chain; its listeners start on first use, stop on exit."""
    async with anyio.create_task_group() as tg:
        bridge = McpBridge(mode, tg, tracer=tracer, max_message_bytes=max_message_bytes)
        try:
            yield bridge
        finally:
            with anyio.CancelScope(shield=True), anyio.move_on_after(3):
                await bridge.aclose()
            tg.cancel_scope.cancel()
