"""Where the conductor's words go: stderr or a log file, never stdout."""

from __future__ import annotations

import logging
import sys
from typing import TextIO

LEVELS = ("debug", "info", "warning", "error")


def configure_logging(level: str = "warning", log_file: str | None = None) -> None:
    """Conductor logs at `level`; component stderr lines always, prefixed with the name.

    Raises:
        ConfigError: `log_file` is a symbolic link or cannot be written (created 0600).
    """
    stream: TextIO = sys.stderr
    if log_file:
        from conductor.output import open_output

        fd = open_output(log_file, option="--log-file", append=True)
        stream = open(fd, "a", encoding="utf-8", buffering=1)
    root = logging.getLogger("acp_conductor")
    root.handlers.clear()
    handler = logging.StreamHandler(stream)
    handler.setFormatter(logging.Formatter("acp-conductor %(levelname)s: %(message)s"))
    root.addHandler(handler)
    root.setLevel(level.upper())
    root.propagate = False

    component = logging.getLogger("acp_conductor.stderr")
    component.handlers.clear()
    comp_handler = logging.StreamHandler(stream)
    comp_handler.setFormatter(logging.Formatter("%(component)s| %(message)s"))
    component.addHandler(comp_handler)
    component.setLevel(logging.INFO)
    component.propagate = False

    # The MCP SDK (plugin tools, the bridge) logs under "mcp", and MCPServer() would
    # otherwise install a root handler at INFO: its records go where ours go, at our level.
    sdk = logging.getLogger("mcp")
    sdk.handlers.clear()
    sdk_handler = logging.StreamHandler(stream)
    sdk_handler.setFormatter(logging.Formatter("acp-conductor %(levelname)s (mcp): %(message)s"))
    sdk.addHandler(sdk_handler)
    sdk.setLevel(level.upper())
    sdk.propagate = False

    # Plugin proxies speak like components: always shown, prefixed with the proxy's name
    # (their logs are audit trails, e.g. every permission decision).
    proxies = logging.getLogger("acp_conductor.proxy")
    proxies.handlers.clear()
    proxy_handler = logging.StreamHandler(stream)
    proxy_handler.setFormatter(ProxyFormatter())
    proxies.addHandler(proxy_handler)
    proxies.setLevel(logging.DEBUG if level == "debug" else logging.INFO)
    proxies.propagate = False


class ProxyFormatter(logging.Formatter):
    """`name| message`, or just the message when a conductor adds the name (stand-alone)."""

    def __init__(self, *, prefixed: bool = True) -> None:
        super().__init__()
        self.prefixed = prefixed

    def format(self, record: logging.LogRecord) -> str:
        text = super().format(record)
        if not self.prefixed:
            return text
        return f"{record.name.removeprefix('acp_conductor.proxy.')}| {text}"
