"""Global MCP servers from the chain file, appended to session setup on its way to the agent.

Injection appends to `mcpServers` (creating it when missing) and changes no other byte of
meaning: every other field keeps its raw value. Each server is shaped for the protocol
version the agent was initialized with, and skipped when the agent's capabilities say it
cannot use that transport. A server the request already names (same name) is not added.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import msgspec
from msgspec import UNSET, Raw, UnsetType

from conductor import acp

log = logging.getLogger("acp_conductor.mcp")


@dataclass(frozen=True, slots=True)
class McpServer:
    """One declaration, already resolved (absolute command, expanded variables)."""

    name: str
    transport: str                       # "stdio", "http" or "sse"
    command: str = ""
    args: tuple[str, ...] = ()
    env: tuple[tuple[str, str], ...] = ()
    url: str = ""
    headers: tuple[tuple[str, str], ...] = ()

    def shape(self, version: int) -> dict[str, object]:
        pairs = [{"name": k, "value": v} for k, v in (self.env if self.transport == "stdio"
                                                      else self.headers)]
        if self.transport == "stdio":
            body: dict[str, object] = {"name": self.name, "command": self.command,
                                       "args": list(self.args), "env": pairs}
            if version >= 2:
                body = {"type": "stdio", **body}  # v2: every entry has a type
            return body
        return {"type": self.transport, "name": self.name, "url": self.url, "headers": pairs}


class _Named(msgspec.Struct):
    name: str | UnsetType = UNSET


class McpInjection:
    """Applies the chain file's `[[mcp_server]]` list to session setup requests."""

    def __init__(self, servers: list[McpServer]) -> None:
        self.servers = servers
        self.version = 1
        self._supported: set[str] | None = None  # None: the agent's answer is not known yet
        self._warned: set[str] = set()

    def learn_initialize(self, version: int, result: Raw | UnsetType) -> None:
        """Read which MCP transports the agent supports from its initialize result."""
        self.version = version
        if result is UNSET:
            return
        try:
            value = msgspec.json.decode(result)
        except (msgspec.DecodeError, RecursionError):
            return
        if not isinstance(value, dict):
            return
        supported = {"stdio"}
        if version >= 2:
            mcp = ((value.get("capabilities") or {}).get("session") or {}).get("mcp") or {}
            if isinstance(mcp, dict):
                supported = {k for k, v in mcp.items() if isinstance(v, dict)} or {"stdio"}
        else:
            caps = (value.get("agentCapabilities") or {}).get("mcpCapabilities") or {}
            if isinstance(caps, dict):
                supported |= {k for k in ("http", "sse") if caps.get(k) is True}
        self._supported = supported

    def apply(self, params: Raw | UnsetType) -> Raw | UnsetType:
        if not self.servers:
            return params
        try:
            present = {s.name for s in msgspec.json.decode(acp.get_raw(params, "mcpServers")
                                                          or b"[]", type=list[_Named])}
        except (msgspec.MsgspecError, RecursionError):
            log.warning("session setup has an mcpServers value that is not a list; "
                        "global MCP servers not injected")
            return params
        extra: list[Raw] = []
        for server in self.servers:
            if server.name in present:
                continue  # the client's own declaration wins
            if self._supported is not None and server.transport not in self._supported:
                if server.name not in self._warned:
                    self._warned.add(server.name)
                    log.warning("MCP server %r not injected: the agent does not support %s "
                                "MCP servers", server.name, server.transport)
                continue
            extra.append(Raw(msgspec.json.encode(server.shape(self.version))))
        if not extra:
            return params
        try:
            return acp.append_to_list(params, "mcpServers", extra)
        except (ValueError, msgspec.MsgspecError):
            return params
