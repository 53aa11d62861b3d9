"""The bridge's Streamable HTTP endpoint: 127.0.0.1 only, one path and one token per server.

The MCP wire is the official SDK's own server transport (`StreamableHTTPServerTransport`:
sessions, SSE, JSON answers, DNS-rebinding checks on Host and Origin); the HTTP server is
hypercorn, which runs on both of anyio's backends (uvicorn runs on asyncio only). Each
agent-side MCP session (`Mcp-Session-Id`) is one relay, i.e. one MCP-over-ACP connection.
A request without the server's token is answered 401 before anything else is looked at.
"""

from __future__ import annotations

import logging
import socket
import uuid
from typing import TYPE_CHECKING, Any, Final

import anyio
import mcp_types
from mcp.server.streamable_http import StreamableHTTPServerTransport
from mcp.server.transport_security import TransportSecuritySettings
from mcp.shared.message import ServerMessageMetadata, SessionMessage

from conductor.bridge.relay import Relay
from conductor.record import Record
from conductor.transport.http import lifespan

if TYPE_CHECKING:
    from collections.abc import MutableMapping

    from anyio.abc import TaskStatus
    from starlette.types import Receive, Scope, Send

    from conductor.bridge import BridgedServer, McpBridge

log = logging.getLogger("acp_conductor.bridge.http")

MAX_SESSIONS: Final = 256
IDLE_TIMEOUT: Final = 30 * 60.0   # an agent-side session with no request for this long ends
PREFIX: Final = "/mcp/"


class _Session(Record, eq=False):
    server: BridgedServer
    transport: StreamableHTTPServerTransport
    relay: Relay


class HttpBridge:
    """The HTTP side of the bridge: listens on 127.0.0.1, on a port the OS picks."""

    def __init__(self, bridge: McpBridge) -> None:
        self.bridge = bridge
        self.port = 0
        self.sessions: dict[str, _Session] = {}
        self._opening = 0  # sessions being opened: they count toward MAX_SESSIONS already
        self.stop = anyio.Event()   # a graceful stop: hypercorn closes its connections itself
        self.done = anyio.Event()

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/mcp"

    async def serve(self, *, task_status: TaskStatus[None]) -> None:
        import sniffio
        from hypercorn.config import Config

        listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        listener.bind(("127.0.0.1", 0))  # loopback only: nothing off this machine connects
        self.port = listener.getsockname()[1]
        listener.listen(128)  # connections queue from now on, before hypercorn accepts
        config = Config()
        config.bind = [f"fd://{listener.detach()}"]
        config.accesslog = None
        config.errorlog = log
        config.graceful_timeout = 1.0
        config.include_server_header = False
        task_status.started()
        # A trigger of our own (so hypercorn installs no signal handlers), set by `aclose`:
        # cancelling hypercorn instead leaves its connection tasks to die noisily.
        try:
            if sniffio.current_async_library() == "trio":
                from hypercorn.trio import serve as serve_trio
                await serve_trio(self.app, config,  # type: ignore[arg-type]  # starlette's
                                 shutdown_trigger=self.stop.wait, mode="asgi")
            else:
                from hypercorn.asyncio import serve as serve_asyncio

                from conductor.transport.http import quiet_cancelled_connections
                quiet_cancelled_connections()  # an agent's MCP client left open at shutdown
                await serve_asyncio(self.app, config,  # type: ignore[arg-type]
                                    shutdown_trigger=self.stop.wait, mode="asgi")
        finally:
            self.done.set()

    async def end_sessions(self) -> None:
        """End every agent-side session (each relay then tells its provider)."""
        for session in list(self.sessions.values()):
            await session.transport.terminate()

    async def aclose(self) -> None:
        """Stop listening; open streams get `graceful_timeout` to end."""
        await self.end_sessions()
        self.stop.set()
        with anyio.move_on_after(3):
            await self.done.wait()

    async def app(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            await lifespan(receive, send)
            return
        if scope["type"] != "http":
            return
        path: str = scope.get("path", "")
        headers = {k.decode("latin-1").lower(): v.decode("latin-1")
                   for k, v in scope.get("headers", [])}
        key = path[len(PREFIX):] if path.startswith(PREFIX) else None
        server = self.bridge.by_key.get(key) if key is not None else None
        auth = headers.get("authorization", "")
        token = auth[len("Bearer "):] if auth.startswith("Bearer ") else None
        gone = self.bridge.released(key, token) if server is None else None
        if gone is not None:  # e.g. its client's DELETE, after the sessions closed
            log.debug("%s %s for %s, whose sessions closed: not found", scope.get("method"),
                      path, gone.name)
            await _error(send, 404, f"Session not found: the sessions that declared the MCP "
                         f"server {gone.name} have closed")
            return
        if server is None or not server.check(token):
            client = scope.get("client") or ("?", 0)
            what = "an unknown path" if server is None else \
                ("no token" if token is None else "a wrong token")
            self.bridge.refused("http", f"{scope.get('method')} {path} from {client[0]}: "
                                f"{what}")
            await _error(send, 401, "Unauthorized: this MCP endpoint wants its token "
                         "(Authorization: Bearer ...)")
            return
        session_id = headers.get("mcp-session-id")
        if session_id is not None:
            session = self.sessions.get(session_id)
            if session is None or session.server is not server:
                await _error(send, 404, "Session not found")
                return
            await session.transport.handle_request(scope, receive, send)
            return
        if len(self.sessions) + self._opening >= MAX_SESSIONS:
            await _error(send, 503, f"Too many MCP sessions ({MAX_SESSIONS} open)")
            return
        await self._open(server, scope, receive, send)

    async def _open(self, server: BridgedServer, scope: Scope, receive: Receive,
                    send: Send) -> None:
        origins = [f"http://127.0.0.1:{self.port}", f"http://localhost:{self.port}"]
        transport = StreamableHTTPServerTransport(
            mcp_session_id=uuid.uuid4().hex,
            security_settings=TransportSecuritySettings(
                enable_dns_rebinding_protection=True,
                allowed_hosts=[f"127.0.0.1:{self.port}", f"localhost:{self.port}"],
                allowed_origins=origins),
            idle_timeout=IDLE_TIMEOUT)
        # The place is taken before the first await (mcp/connect), so concurrent opens
        # cannot all pass the check; once started, the session holds it in `sessions`.
        self._opening += 1
        try:
            await self.bridge.tg.start(self._run, server, transport)
        except Exception as e:  # the router or the provider refused mcp/connect
            log.warning("MCP bridge: cannot connect to %s: %s", server.name, e)
            await _error(send, 502, f"cannot connect to the MCP server {server.name}: {e}")
            return
        finally:
            self._opening -= 1
        status: list[int] = []

        async def watch(message: MutableMapping[str, Any]) -> None:
            if message["type"] == "http.response.start":
                status.append(message["status"])
            await send(message)
        established = False
        try:
            await transport.handle_request(scope, receive, watch)
            established = bool(status) and status[0] < 400
        finally:
            if not established:  # refused, or failed midway (the agent left): end it again
                with anyio.CancelScope(shield=True):
                    await transport.terminate()

    async def _run(self, server: BridgedServer, transport: StreamableHTTPServerTransport, *,
                   task_status: TaskStatus[None]) -> None:
        bridge = self.bridge
        assert bridge.endpoint is not None
        assert transport.mcp_session_id is not None
        session_id = transport.mcp_session_id
        async with transport.connect() as (read, write):
            connection_id = await bridge.connect(server)

            async def to_agent(body: dict[str, Any]) -> None:
                message = mcp_types.jsonrpc_message_adapter.validate_python(body, by_name=False)
                related = None
                if body.get("method") == "notifications/progress":  # on its request's stream
                    related = relay.progress_of((body.get("params") or {}).get(
                        "progressToken"))
                try:
                    await write.send(SessionMessage(message, ServerMessageMetadata(
                        related_request_id=related) if related is not None else None))
                except (anyio.BrokenResourceError, anyio.ClosedResourceError):
                    log.debug("%s: the agent's session is gone", server.name)

            relay = Relay(bridge.endpoint, bridge.tg, connection_id, server.name, to_agent,
                          transport.terminate)
            bridge.relays[connection_id] = relay
            self.sessions[session_id] = _Session(server, transport, relay)
            task_status.started()
            try:
                idle = transport.idle_scope or anyio.CancelScope()
                with idle:
                    async for item in read:
                        if isinstance(item, Exception):
                            log.debug("%s: unusable message from the agent: %s", server.name,
                                      item)
                            continue
                        await relay.from_agent(item.message.model_dump(
                            by_alias=True, mode="json", exclude_unset=True))
            except anyio.ClosedResourceError:
                pass  # terminated (DELETE, or the provider's side ended): the session is over
            except Exception:  # one broken session must not take the chain down
                log.exception("MCP bridge: the session for %s failed", server.name)
            finally:
                self.sessions.pop(session_id, None)
                if bridge.relays.get(connection_id) is relay:
                    bridge.relays.pop(connection_id, None)
                    await relay.close(tell_provider=True)
                with anyio.CancelScope(shield=True):
                    await transport.terminate()


async def _error(send: Send, status: int, message: str) -> None:
    body = mcp_types.JSONRPCError(jsonrpc="2.0", id=None, error=mcp_types.ErrorData(
        code=-32600, message=message)).model_dump_json(by_alias=True, exclude_unset=True)
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", b"application/json")]})
    await send({"type": "http.response.body", "body": body.encode()})
