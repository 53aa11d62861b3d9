"""Proxies as Python plugins: the API, discovery, and the host that runs them."""

from conductor.errors import RpcError
from conductor.plugins.api import (
    CloseReason,
    McpOffer,
    NoOptions,
    Proxy,
    ProxyContext,
    SessionScope,
    SessionSetup,
    Side,
    ToolContext,
    WatchContext,
    on,
    tool_context,
    watch,
)

__all__ = ["CloseReason", "McpOffer", "NoOptions", "Proxy", "ProxyContext", "RpcError",
           "SessionScope", "SessionSetup", "Side", "ToolContext", "WatchContext", "on",
           "tool_context", "watch"]
