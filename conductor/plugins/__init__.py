"""Proxies as Python plugins: the API, discovery, and the host that runs them."""

from conductor.errors import RpcError
from conductor.plugins.api import (
    CloseReason,
    McpOffer,
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


def __getattr__(name: str) -> object:
    if name == "NoOptions":  # a pydantic model, made on first use (conductor.plugins.api)
        from conductor.plugins.no_options import NoOptions

        return NoOptions
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
