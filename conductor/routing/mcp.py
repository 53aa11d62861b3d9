"""Global MCP servers from the chain file, appended to session setup on its way to the agent.

Injection appends to `mcpServers` (creating it when missing) and changes no other byte of
meaning: every other field keeps its raw value. Each server is shaped for the protocol
version the agent was initialized with, and skipped when the agent's capabilities say it
cannot use that transport (refused, for a `required` one). A server the request already
names (same name) is not added. `McpSupport` is what the agent's initialize answer says it
can take; injection, MCP-over-ACP routing and the bridge all read it.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Protocol

import msgspec
from msgspec import UNSET, Raw, UnsetType

from conductor import acp
from conductor.jsonrpc.message import as_object
from conductor.record import Record

if TYPE_CHECKING:
    from collections.abc import Callable

log = logging.getLogger("acp_conductor.mcp")


class McpRefusedError(Exception):
    """A `required` MCP server cannot reach the agent: the session setup is refused."""

    def __init__(self, name: str, reason: str) -> None:
        super().__init__(f"MCP server {name!r} is required, but {reason}")
        self.name = name
        self.reason = reason


class McpSupport(Record):
    """Which MCP transports the agent takes, from its initialize answer."""

    version: int = 1
    transports: frozenset[str] | None = None  # None: the agent has not answered yet

    def learn(self, version: int, result: Raw | UnsetType) -> None:
        self.version = version
        if result is UNSET:
            return
        try:
            value = msgspec.json.decode(result)
        except (msgspec.DecodeError, RecursionError):  # a hostile nesting depth
            return
        if not isinstance(value, dict):
            return
        supported = {"stdio"}  # v1: every agent takes stdio
        if version >= 2:
            # v2 has no baseline transport: stdio too is "only available when the agent
            # capabilities include `session.mcp.stdio`" (schema McpServer); `_meta` is none.
            session = as_object(as_object(value.get("capabilities")).get("session"))
            mcp = as_object(session.get("mcp"))
            supported = {k for k, v in mcp.items() if isinstance(v, dict) and k != "_meta"}
        else:
            caps = as_object(as_object(value.get("agentCapabilities")).get("mcpCapabilities"))
            supported |= {k for k in ("http", "sse", "acp") if caps.get(k) is True}
        self.transports = frozenset(supported)

    def takes(self, transport: str) -> bool | None:
        """Does the agent take `transport`? None while it has not said."""
        return None if self.transports is None else transport in self.transports


class McpServer(Record, frozen=True):
    """One declaration, already resolved (absolute command, expanded variables)."""

    name: str
    transport: str                       # "stdio", "http", "sse" (or "acp": see config)
    command: str = ""
    args: tuple[str, ...] = ()
    env: tuple[tuple[str, str], ...] = ()
    url: str = ""
    headers: tuple[tuple[str, str], ...] = ()
    required: bool = False               # refuse the session when the agent cannot take it
    provider: str = ""                   # acp: the proxy that offers it

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


class Bridge(Protocol):
    """Serves `acp` MCP servers to an agent that does not take them (conductor.bridge)."""

    def covers(self, support: McpSupport) -> bool:
        """Can it bridge for an agent that takes what `support` says?"""
        ...

    async def rewrite(self, params: Raw | UnsetType, support: McpSupport,
                      required: frozenset[str]) -> Raw | UnsetType:
        """Setup params for the agent, each `acp` entry rewritten to a transport it takes.

        Raises:
            McpRefusedError: a required server (by name) cannot be bridged.
        """
        ...

    def release(self, server_id: str) -> None:
        """The router forgot `server_id` (its sessions closed): no agent can use it now."""
        ...


class _Entry(msgspec.Struct):
    type: str | UnsetType = UNSET
    name: str | UnsetType = UNSET
    serverId: str | UnsetType = UNSET


_entries = msgspec.json.Decoder(list[_Entry])


def acp_declarations(params: Raw | UnsetType) -> list[tuple[str, str]]:
    """The (serverId, name) of every `acp` entry in a setup request's `mcpServers`."""
    servers = acp.get_raw(params, "mcpServers")
    if servers is None:
        return []
    try:
        entries = _entries.decode(servers)
    except msgspec.MsgspecError:
        return []
    return [(e.serverId, e.name if isinstance(e.name, str) else "")
            for e in entries if e.type == "acp" and isinstance(e.serverId, str)]


def map_acp_entries(params: Raw | UnsetType,
                    change: Callable[[str, str], Raw | None]) -> Raw | UnsetType:
    """`params` with each `acp` entry of `mcpServers` replaced by `change(serverId, name)`
    (dropped when it returns None); every other entry and field keeps its bytes."""
    servers = acp.get_raw(params, "mcpServers")
    if servers is None:
        return params
    try:
        raws = msgspec.json.decode(servers, type=list[Raw])
    except msgspec.MsgspecError:
        return params
    out: list[Raw] = []
    for item in raws:
        try:
            entry = msgspec.json.decode(item, type=_Entry)
        except msgspec.MsgspecError:
            out.append(item)
            continue
        if entry.type != "acp" or not isinstance(entry.serverId, str):
            out.append(item)
            continue
        replaced = change(entry.serverId, entry.name if isinstance(entry.name, str) else "")
        if replaced is not None:
            out.append(replaced)
    return acp.set_key(params, "mcpServers", Raw(msgspec.json.encode(out)))


async def for_agent(params: Raw | UnsetType, support: McpSupport, bridge: Bridge | None,
                    required: frozenset[str]) -> Raw | UnsetType:
    """Setup params as they reach the agent: `acp` servers unchanged where it takes them,
    else bridged, else dropped (an agent never gets what it said it cannot take).

    Raises:
        McpRefusedError: a required acp server (by name) cannot reach the agent.
    """
    declared = acp_declarations(params)
    bridged = bridge is not None and bridge.covers(support)
    blocked = support.takes("acp") is False and not bridged
    for name in sorted(required - {name for _, name in declared}):
        raise McpRefusedError(name, _NO_ACP if blocked else
                              "its provider did not declare it in this session setup")
    if not declared or support.takes("acp") is not False:
        return params
    if bridge is not None and bridged:
        return await bridge.rewrite(params, support, required)
    for _, name in declared:
        if name in required:
            raise McpRefusedError(name, _NO_ACP)
    log.warning("the agent does not take acp MCP servers and no bridge stands in: %s not "
                "declared to it", ", ".join(repr(n) for _, n in declared))
    return map_acp_entries(params, lambda server_id, name: None)


_NO_ACP = ("the agent does not take acp MCP servers and no bridge stands in for it "
           "([conductor] mcp_bridge is off, or the agent takes neither http nor stdio)")


def advertise_acp(result: Raw | UnsetType, version: int) -> Raw | UnsetType:
    """An initialize result that says the agent takes `acp` MCP servers (the bridge
    stands in for it)."""
    if result is UNSET:
        return result
    try:
        if version >= 2:
            return acp.set_path(result, ("capabilities", "session", "mcp", "acp"), Raw(b"{}"))
        return acp.set_path(result, ("agentCapabilities", "mcpCapabilities", "acp"),
                            Raw(b"true"))
    except ValueError:
        return result


class McpInjection:
    """Applies the chain file's `[[mcp_server]]` list to session setup requests.

    `acp` entries are not injected here: the proxy that offers them declares them itself
    (conductor.plugins.tools); the bridge checks that a required one reached the agent.
    """

    def __init__(self, servers: list[McpServer], support: McpSupport | None = None) -> None:
        self.servers = [s for s in servers if s.transport != "acp"]
        self.required_acp = frozenset(s.name for s in servers
                                      if s.transport == "acp" and s.required)
        self.support = support if support is not None else McpSupport()
        self._warned: set[str] = set()

    @property
    def version(self) -> int:
        return self.support.version

    def learn_initialize(self, version: int, result: Raw | UnsetType) -> None:
        """Read which MCP transports the agent supports from its initialize result."""
        self.support.learn(version, result)

    def apply(self, params: Raw | UnsetType) -> Raw | UnsetType:
        """`params` with the servers appended.

        Raises:
            McpRefusedError: a required server's transport is one the agent cannot take.
        """
        if not self.servers:
            return params
        try:
            present = {s.name for s in msgspec.json.decode(acp.get_raw(params, "mcpServers")
                                                          or b"[]", type=list[_Named])}
        except (msgspec.MsgspecError, RecursionError):
            self._refuse_required("the session setup's mcpServers is not a list of servers")
            log.warning("session setup has an mcpServers value that is not a list; "
                        "global MCP servers not injected")
            return params
        extra: list[Raw] = []
        for server in self.servers:
            if server.name in present:
                continue  # the client's own declaration wins
            if self.support.takes(server.transport) is False:
                if server.required:
                    raise McpRefusedError(server.name, f"the agent does not take "
                                          f"{server.transport} MCP servers")
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
            self._refuse_required("the session setup's params cannot take mcpServers")
            return params

    def _refuse_required(self, reason: str) -> None:
        """Nothing can be injected: a required server means the setup is refused.

        Raises:
            McpRefusedError: one of the servers is required.
        """
        for server in self.servers:
            if server.required:
                raise McpRefusedError(server.name, reason)
