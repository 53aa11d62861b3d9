"""acp-conductor: one process that an ACP client sees as a single agent, in front of a chain
of proxies and an agent.

The public API is below; everything is imported on first use, so running one piece (the
demo agent, a stand-alone plugin) does not import the whole conductor.
"""

from __future__ import annotations

import importlib
from typing import Any

__version__ = "0.1.0"  # the package's version (pyproject.toml reads it from here)

_EXPORTS = {
    # running a chain
    "serve_chain": "conductor.serve",
    "RunOptions": "conductor.serve",
    "ChainConfig": "conductor.config",
    "load_chain": "conductor.config",
    # writing proxies
    "Proxy": "conductor.plugins",
    "ProxyContext": "conductor.plugins",
    "SessionScope": "conductor.plugins",
    "Side": "conductor.plugins",
    "NoOptions": "conductor.plugins",
    "on": "conductor.plugins",
    "watch": "conductor.plugins",
    "WatchContext": "conductor.plugins",
    "McpOffer": "conductor.plugins",
    "SessionSetup": "conductor.plugins",
    "ToolContext": "conductor.plugins",
    "tool_context": "conductor.plugins",
    # messages, as handlers see them
    "Message": "conductor.jsonrpc.message",
    "Request": "conductor.jsonrpc.message",
    "Notification": "conductor.jsonrpc.message",
    "Response": "conductor.jsonrpc.message",
    # errors
    "ConductorError": "conductor.errors",
    "ConfigError": "conductor.errors",
    "PluginError": "conductor.errors",
    "ComponentError": "conductor.errors",
    "ComponentStartError": "conductor.errors",
    "ComponentExitedError": "conductor.errors",
    "ComponentStoppedError": "conductor.errors",
    "ConnectionClosedError": "conductor.errors",
    "TraceFileError": "conductor.errors",
    "RpcError": "conductor.errors",
    "ErrorCode": "conductor.jsonrpc.codes",
    "ExitCode": "conductor.errors",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'conductor' has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)


def __dir__() -> list[str]:
    return __all__
