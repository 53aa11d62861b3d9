"""The bridge's stdio side: a Unix socket the `mcp-shim` processes connect back to.

The socket lives in a directory only this user can enter (0700, made by `mkdtemp`), and a
shim must open with `{"server": KEY, "token": TOKEN}` (its environment has the token), so
neither another user nor a stray process of this one gets a tool: a wrong hello is
refused, logged and closed. After the hello every line is one MCP message each way.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import tempfile
from typing import TYPE_CHECKING, Any, Final

import anyio
from anyio.streams.buffered import BufferedByteReceiveStream

from conductor.bridge.relay import Relay
from conductor.jsonrpc.codes import ErrorCode
from conductor.jsonrpc.framing import FrameDecoder, OversizedFrame

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable

    from anyio.abc import SocketStream, TaskStatus

    from conductor.bridge import McpBridge

log = logging.getLogger("acp_conductor.bridge.stdio")

HELLO_LIMIT: Final = 4096
HELLO_TIMEOUT: Final = 10.0
MAX_SHIMS: Final = 256
MAX_SOCKET_PATH: Final = 100  # bytes: sun_path holds 104 (macOS) or 108 (Linux), NUL included


class SocketBridge:
    """Listens for shims on a private Unix socket."""

    def __init__(self, bridge: McpBridge) -> None:
        self.bridge = bridge
        self.directory = ""
        self.path = ""
        self.open = 0

    async def serve(self, *, task_status: TaskStatus[None]) -> None:
        self.directory = tempfile.mkdtemp(prefix="acp-conductor-mcp-")  # 0700
        self.path = os.path.join(self.directory, "bridge.sock")
        if len(os.fsencode(self.path)) > MAX_SOCKET_PATH:  # a deep $TMPDIR: /tmp will do
            os.rmdir(self.directory)
            self.directory = tempfile.mkdtemp(prefix="acp-conductor-mcp-", dir="/tmp")
            self.path = os.path.join(self.directory, "bridge.sock")
        leftovers = self.bridge.leftovers
        if leftovers is not None:  # a conductor killed cannot remove it: its watchdog does
            leftovers.remove_at_end(self.directory)
        try:
            listener = await anyio.create_unix_listener(self.path, mode=0o600)
            log.info("MCP bridge: shims connect to %s", self.path)
            async with listener:
                task_status.started()
                await listener.serve(self._shim, task_group=self.bridge.tg)
        finally:
            shutil.rmtree(self.directory, ignore_errors=True)
            if leftovers is not None:
                leftovers.forget(self.directory)

    async def _shim(self, stream: SocketStream) -> None:
        bridge = self.bridge
        async with stream:
            reader = BufferedByteReceiveStream(stream)
            try:
                with anyio.fail_after(HELLO_TIMEOUT):
                    hello = json.loads(await reader.receive_until(b"\n", HELLO_LIMIT))
            # RecursionError: valid JSON nested too deeply for the decoder (a 4 KB line of
            # `[`), which must end this connection and not the bridge's task group.
            except (TimeoutError, ValueError, RecursionError, anyio.IncompleteRead,
                    anyio.EndOfStream, anyio.DelimiterNotFound, anyio.BrokenResourceError
                    ) as e:
                bridge.refused("stdio", f"a shim sent no usable hello ({type(e).__name__})")
                return
            key = str(hello.get("server")) if isinstance(hello, dict) else None
            server = bridge.by_key.get(key) if key is not None else None
            token = hello.get("token") if isinstance(hello, dict) else None
            token = token if isinstance(token, str) else None
            gone = bridge.released(key, token) if server is None else None
            if gone is not None:  # late (its sessions closed), not a stranger at the door
                log.debug("a shim for %s, whose sessions closed: told so", gone.name)
                await _say_last(stream, {"error": f"the sessions that declared the MCP "
                                         f"server {gone.name} have closed"})
                return
            if server is None or not server.check(token):
                bridge.refused("stdio", "a shim named an unknown server" if server is None
                               else "a shim presented a wrong token")
                await _say_last(stream, {"error": "refused: unknown server or wrong token"})
                return
            if self.open >= MAX_SHIMS:
                await _say_last(stream, {"error": f"too many MCP sessions ({MAX_SHIMS} open)"})
                return
            # The place is taken before the first await (mcp/connect), so concurrent shims
            # cannot all pass the check.
            self.open += 1
            connected = False
            try:
                connection_id = await bridge.connect(server)
                connected = True
            except Exception as e:
                await _say_last(stream, {"error": f"cannot connect to {server.name}: {e}"})
                return
            finally:
                if not connected:  # else the session holds it until it ends (below)
                    self.open -= 1
            lock = anyio.Lock()

            async def to_agent(body: dict[str, Any]) -> None:
                async with lock:
                    try:
                        await _say(stream, body)
                    except (anyio.BrokenResourceError, anyio.ClosedResourceError):
                        log.debug("%s: the shim is gone", server.name)

            relay = Relay(bridge.endpoint, bridge.tg, connection_id,  # type: ignore[arg-type]
                          server.name, to_agent, stream.aclose, answers_cancelled=False)
            bridge.relays[connection_id] = relay
            try:
                try:
                    async with lock:  # before anything the provider sends, never inside it
                        await _say(stream, {"ok": True})
                except (anyio.BrokenResourceError, anyio.ClosedResourceError):
                    return  # the shim left while we connected: the provider is told below
                # Framed as the conductor's own pipes are: a message over the limit is
                # skipped and answered by its id, and the session goes on.
                decoder = FrameDecoder(max_frame_bytes=bridge.max_message_bytes)
                chunk = bytes(reader.buffer)  # what came in the hello's read
                while True:
                    for frame in decoder.feed(chunk):
                        await _take(frame, relay, to_agent)
                    try:
                        chunk = await stream.receive()
                    except (anyio.EndOfStream, anyio.ClosedResourceError,
                            anyio.BrokenResourceError):
                        last = decoder.end()
                        if last is not None:
                            await _take(last, relay, to_agent)
                        return
            except Exception:  # one broken session must not take the chain down
                log.exception("MCP bridge: the session for %s failed", server.name)
            finally:
                self.open -= 1
                if bridge.relays.get(connection_id) is relay:
                    bridge.relays.pop(connection_id, None)
                    await relay.close(tell_provider=True)


async def _take(frame: bytes | bytearray | OversizedFrame, relay: Relay,
                to_agent: Callable[[dict[str, Any]], Awaitable[None]]) -> None:
    """One line from the shim: an MCP message for the relay, or answered here."""
    if isinstance(frame, OversizedFrame):
        await _too_large(frame, relay, to_agent)
        return
    try:
        message = json.loads(frame)
    except (ValueError, RecursionError) as e:  # RecursionError: too deep
        why = "nested too deeply" if isinstance(e, RecursionError) else "not JSON"
        await to_agent({"jsonrpc": "2.0", "id": None, "error": {
            "code": -32700, "message": f"Parse error: {why}"}})
        return
    if isinstance(message, dict):
        await relay.from_agent(message)
    else:  # MCP has no batches (since 2025-06-18); silence would hang it
        await to_agent({"jsonrpc": "2.0", "id": None, "error": {
            "code": -32600, "message": "Invalid Request: not a JSON object"
            + (" (JSON-RPC batches are not supported)" if isinstance(message, list)
               else "")}})


async def _too_large(frame: OversizedFrame, relay: Relay,
                     to_agent: Callable[[dict[str, Any]], Awaitable[None]]) -> None:
    """A message over the limit, answered by what a scan of its top level showed: a
    request gets the error, an answer fails the provider's request, a notification only
    a log line (nothing can answer it)."""
    why = (f"a {frame.size}-byte MCP message exceeds the {frame.limit}-byte limit of the "
           f"conductor's MCP bridge (server {relay.name})")
    log.warning("%s; dropped", why)
    head = frame.top
    ident = json.loads(bytes(head.id)) if head.id is not None else None
    error = {"code": ErrorCode.FRAME_TOO_LARGE, "message": why}
    if head.is_notification:
        return
    if head.has_method or ident is None:
        await to_agent({"jsonrpc": "2.0", "id": ident, "error": error})
    else:  # the agent's answer to a request of the provider's
        await relay.from_agent({"jsonrpc": "2.0", "id": ident, "error": error})


async def _say(stream: SocketStream, body: Any) -> None:
    await stream.send(json.dumps(body, separators=(",", ":")).encode() + b"\n")


async def _say_last(stream: SocketStream, body: Any) -> None:
    """A refusal: a shim that already left cannot read it, and must not take the bridge
    (its task group is the chain's) down with a broken pipe."""
    try:
        await _say(stream, body)
    except (anyio.BrokenResourceError, anyio.ClosedResourceError):
        log.debug("a refused shim left before its answer")
