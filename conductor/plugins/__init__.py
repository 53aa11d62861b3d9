"""Proxies as Python plugins: the API, discovery, and the host that runs them."""

from conductor.errors import RpcError
from conductor.plugins.api import (
    NoOptions,
    Proxy,
    ProxyContext,
    SessionEnd,
    SessionScope,
    Side,
    on,
)

__all__ = ["NoOptions", "Proxy", "ProxyContext", "RpcError", "SessionEnd", "SessionScope", "Side",
           "on"]
