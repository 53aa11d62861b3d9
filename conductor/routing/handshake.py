"""The initialize handshake: what comes first, protocol versions, proxy dialects, and what
the conductor learns from the agent's answer (protocol.md §3).

- Nothing starts until the client's first message, which must be the request
  `initialize` (`_proxy/initialize` in proxy mode; the spelling tells our client's dialect).
- The raw `protocolVersion` decides v1 or v2 before anything else; a bad one is answered.
- On its way down, `initialize` becomes `_proxy/initialize` (in the proxy's dialect) for a
  proxy and stays plain `initialize` for the agent (a legacy proxy's `_meta.proxy`
  marker removed). A proxy that answers method-not-found is
  asked again in the legacy dialect (`initialize` + `_meta.proxy`), once.
- A v2 client requires the agent to answer protocol version 2.
- The agent's answer tells which MCP transports it supports (for injection and bridging);
  when the bridge stands in for `acp`, the answer going up says the agent takes it. A
  session setup the client sends before that answer (JSON-RPC lets it pipeline) waits for
  it (`agent_pending`), bounded: its servers are judged by what the agent takes.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING

import anyio
import msgspec
from msgspec import UNSET, Raw, UnsetType

from conductor import acp
from conductor.acp import Dialect
from conductor.errors import ProtocolVersionError
from conductor.jsonrpc.codes import ErrorCode
from conductor.jsonrpc.message import Request, Response, error_response
from conductor.record import Record
from conductor.routing.mcp import advertise_acp
from conductor.routing.roles import Role

if TYPE_CHECKING:
    from conductor.jsonrpc.message import Call
    from conductor.routing.mcp import Bridge, McpSupport
    from conductor.routing.topology import Node

log = logging.getLogger("acp_conductor.routing")

# Runs on an answer before it travels on; None means it was consumed (e.g. asked again).
ResponseHook = Callable[[Response], Awaitable[Response | None]]
Reply = Callable[[Response], Awaitable[None]]
Resend = Callable[[str, Raw], Awaitable[None]]  # (method, params) to the same target


class Initialize(Record):
    """What the initialize going to one target becomes."""

    method: str
    params: Raw | UnsetType
    hooks: list[ResponseHook] = msgspec.field(default_factory=list)


class Handshake:
    """The initialize rules for one chain."""

    def __init__(self, *, proxy_mode: bool, mcp: McpSupport | None = None,
                 bridge: Bridge | None = None) -> None:
        self.proxy_mode = proxy_mode
        self.upstream_dialect = Dialect.PROXY  # proxy mode: how our own client spells it
        self.version: int | None = None        # what the client asked for
        # What the agent was asked for: a proxy may speak another version to it than our
        # client speaks to us, and what the conductor itself sends the agent follows this.
        self.agent_version: int | None = None
        self._mcp = mcp
        self._bridge = bridge
        # An initialize request to the agent not answered yet (set when answered, when the
        # agent is gone, or when a setup gave up waiting): a session setup the client
        # pipelined behind it waits for it, so its MCP servers are judged by what the agent
        # said it takes. One event while any is pending: a retried initialize (after the
        # first was answered for a failed agent) or a restart's settles it too.
        self.agent_pending: anyio.Event | None = None

    async def accept_first(self, msg: Call, reply: Reply) -> bool:
        """Is `msg`, the client's first message, the initialize that starts the chain?

        Anything else is answered (a request) or logged (a notification), and nothing starts.
        """
        method = msg.method
        if acp.starts_chain(method, msg.params, is_request=isinstance(msg, Request),
                            proxy_mode=self.proxy_mode):
            if self.proxy_mode:
                if method in acp.PROXY_INITIALIZE_METHODS:
                    self.upstream_dialect = acp.PROXY_INITIALIZE_METHODS[method]
                elif acp.is_legacy_proxy_initialize(msg.params):
                    self.upstream_dialect = Dialect.LEGACY
            self.version = acp.protocol_version(msg.params)
            return True
        # Not it: say why (a request), or log it (a notification); nothing starts.
        expected = "_proxy/initialize" if self.proxy_mode else acp.INITIALIZE
        if not self.proxy_mode and method in acp.PROXY_INITIALIZE_METHODS:
            # Our client is a conductor that took this one for a proxy: the fix is here.
            await self.reject_proxy_initialize(
                msg, method, reply, "; this conductor runs its chain as an agent: to be a "
                "conductor's proxy, run it as one (`acp-conductor proxy --chain FILE`, or "
                "`acp-conductor serve --as-proxy` for `[[proxy]] url = ...`)")
            return False
        named = method == acp.INITIALIZE or (self.proxy_mode
                                             and method in acp.PROXY_INITIALIZE_METHODS)
        if named and isinstance(msg, Request):
            return await self.check_version(msg, reply)  # refused: it answers why
        if isinstance(msg, Request):
            await reply(error_response(
                msg.id, ErrorCode.INVALID_REQUEST, "Invalid Request",
                f"the first message must be the request `{expected}`, got `{method}`; "
                "nothing is started until then"))
        else:
            log.warning("notification %s before %s ignored", method, expected)
        return False

    async def check_version(self, msg: Call, reply: Reply) -> bool:
        try:
            self.version = acp.protocol_version(msg.params)
        except ProtocolVersionError as e:
            if isinstance(msg, Request):
                await reply(error_response(msg.id, e.code, e.message, e.data))
            return False
        return True

    @staticmethod
    async def reject_proxy_initialize(msg: Call, method: str, reply: Reply,
                                      fix: str = "") -> None:
        """`_proxy/initialize` is only ever sent by the conductor (protocol.md §3)."""
        if isinstance(msg, Request):
            await reply(error_response(msg.id, ErrorCode.INVALID_REQUEST, "Invalid Request",
                                       f"`{method}` is only sent by the conductor{fix}"))

    def downward(self, params: Raw | UnsetType, target: Node, *, is_request: bool,
                 resend: Resend) -> Initialize:
        """What an `initialize` travelling down to `target` becomes."""
        out = Initialize(acp.INITIALIZE, params)
        hop = target.hop
        if target.role is Role.PROXY:
            dialect = hop.dialect or Dialect.PROXY
            out.method = dialect.initialize_method()
            if dialect is Dialect.LEGACY:
                out.params = acp.with_legacy_proxy_meta(params)
            elif not hop.dialect_forced and is_request:
                out.hooks.append(self._legacy_fallback(params, target, resend))
        elif target.role in (Role.AGENT, Role.SUCCESSOR):
            # A legacy proxy forwards the marker it was initialized with: the agent (or
            # whatever our successor is) must get plain initialize, not be told it is a proxy.
            out.params = acp.without_legacy_proxy_meta(params)
            try:
                version = acp.protocol_version(params)
            except ProtocolVersionError:
                version = None  # the agent judges a proxy's bad params itself
            self.agent_version = version  # (in proxy mode: our successor's)
            if target.role is Role.AGENT:
                if version == 2:
                    asked = acp.result_protocol_version(params)  # raw: 3 is served as 2
                    out.hooks.append(self._require_v2(target, asked))
            if version is not None and self._mcp is not None:
                answered = None
                if is_request and target.role is Role.AGENT:
                    if self.agent_pending is None or self.agent_pending.is_set():
                        self.agent_pending = anyio.Event()
                    answered = self.agent_pending
                out.hooks.append(self._learn_mcp_support(
                    version, self._bridge if target.role is Role.AGENT else None, answered))
        return out

    def agent_gone(self) -> None:
        """The agent will not answer: nothing may wait for its initialize answer."""
        if self.agent_pending is not None:
            self.agent_pending.set()

    @staticmethod
    def _legacy_fallback(params: Raw | UnsetType, target: Node,
                         resend: Resend) -> ResponseHook:
        async def hook(answer: Response) -> Response | None:
            if answer.error_code() != ErrorCode.METHOD_NOT_FOUND or target.hop.dialect_forced:
                return answer
            log.info("%s does not know _proxy/initialize; retrying in the legacy dialect",
                     target.name)
            target.hop.dialect = Dialect.LEGACY
            await resend(acp.INITIALIZE, acp.with_legacy_proxy_meta(params))
            return None
        return hook

    def _learn_mcp_support(self, version: int, bridge: Bridge | None,
                           answered: anyio.Event | None) -> ResponseHook:
        mcp = self._mcp
        assert mcp is not None

        async def hook(answer: Response) -> Response | None:
            mcp.learn(version, answer.result)
            if answered is not None:
                answered.set()
            if bridge is not None and not answer.is_error and not mcp.takes("acp") \
                    and bridge.covers(mcp):
                log.info("the agent does not take acp MCP servers: the bridge stands in")
                return answer.with_result(advertise_acp(answer.result, version))
            return answer
        return hook

    @staticmethod
    def _require_v2(agent: Node, asked: object) -> ResponseHook:
        async def hook(answer: Response) -> Response | None:
            if answer.result is UNSET:
                return answer
            version = acp.result_protocol_version(answer.result)
            if type(version) is int and version == 2:  # 2.0 is not the schema's integer
                return answer
            return error_response(
                answer.id, ErrorCode.INTERNAL_ERROR,
                f"{agent.name} answered initialize with protocolVersion {version!r}, but the "
                f"client asked for protocol version {asked!r} and the conductor, which speaks "
                "versions 1 and 2, requires the agent to say protocolVersion 2",
                {"component": agent.name, "agentProtocolVersion": version,
                 "clientProtocolVersion": asked})
        return hook


def chain_hooks(hooks: list[ResponseHook]) -> ResponseHook | None:
    """One hook that runs `hooks` in order (None when there are none)."""
    if not hooks:
        return None
    if len(hooks) == 1:
        return hooks[0]

    async def run_all(answer: Response) -> Response | None:
        current: Response | None = answer
        for hook in hooks:
            if current is None:
                return None
            current = await hook(current)
        return current
    return run_all
