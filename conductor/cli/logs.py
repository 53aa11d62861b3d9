"""Where the conductor's words go: stderr or a log file, never stdout."""

from __future__ import annotations

import atexit
import logging
import sys
from typing import Any

LEVELS = ("debug", "info", "warning", "error")


def configure_logging(level: str = "warning", log_file: str | None = None) -> None:
    """Conductor logs at `level`; component stderr lines always, prefixed with the name.

    Raises:
        ConfigError: `log_file` is a symbolic link or cannot be written (created 0600).
    """
    stream: Any = sys.stderr  # (what logging.StreamHandler writes to: `write`, `flush`)
    if log_file:
        from conductor.output import open_output

        fd = open_output(log_file, option="--log-file", append=True)
        stream = open(fd, "a", encoding="utf-8", buffering=1)
    else:
        from conductor.cli.stderr_pipe import PipeStderr

        pipe = PipeStderr.for_stderr()  # a pipe nobody reads must not stop the conductor
        if pipe is not None:
            stream = pipe
            atexit.unregister(pipe.finish)  # (once, however often logging is configured)
            atexit.register(pipe.finish)
    _route("acp_conductor", stream, logging.Formatter("acp-conductor %(levelname)s: %(message)s"),
           level.upper())
    _route("acp_conductor.stderr", stream, logging.Formatter("%(component)s| %(message)s"),
           logging.INFO)
    # The MCP SDK (plugin tools, the bridge) logs under "mcp", and MCPServer() would
    # otherwise install a root handler at INFO: its records go where ours go, at our level.
    _route("mcp", stream, McpFormatter(tracebacks=level == "debug"), level.upper())
    # Every other library (httpx logs each request at INFO) goes where ours go, warnings
    # and up. A root that has a handler also makes the SDK's `basicConfig` a no-op, which
    # would otherwise print their INFO records on stderr past --log-file.
    root = logging.getLogger()
    root.handlers.clear()
    handler = logging.StreamHandler(stream)
    handler.setFormatter(logging.Formatter("acp-conductor %(levelname)s (%(name)s): "
                                           "%(message)s"))
    root.addHandler(handler)
    root.setLevel(logging.WARNING)
    # Plugin proxies speak like components: always shown, prefixed with the proxy's name
    # (their logs are audit trails, e.g. every permission decision).
    _route("acp_conductor.proxy", stream, ProxyFormatter(),
           logging.DEBUG if level == "debug" else logging.INFO)


def leave_to_the_client(level: str) -> None:
    """For `run`, `check` and `call`, which report every failure that reaches them: the
    log lines for those same failures (`REACHES_CLIENT`) are shown only at debug level, so
    a failure is read once, in the command's own report."""
    if level == "debug":
        return
    for name in ("acp_conductor", "acp_conductor.proxy"):
        for handler in logging.getLogger(name).handlers:
            handler.addFilter(_not_reaching_client)


def _not_reaching_client(record: logging.LogRecord) -> bool:
    return not getattr(record, "reaches_client", False)


def _route(name: str, stream: Any, formatter: logging.Formatter, level: int | str) -> None:
    """Logger `name` writes to `stream` alone, formatted by `formatter`, from `level` on."""
    logger = logging.getLogger(name)
    logger.handlers.clear()
    handler = logging.StreamHandler(stream)
    handler.setFormatter(formatter)
    logger.addHandler(handler)
    logger.setLevel(level)
    logger.propagate = False


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


class McpFormatter(logging.Formatter):
    """The MCP SDK's records: `acp-conductor LEVEL (mcp): message`, naming the proxy and
    server when one of a proxy's MCP servers logs (a tool that raised: which tool is in
    the message, whose is not). An exception is its innermost cause on the same line; its
    traceback only at debug level (the SDK logs one for every tool call that raises)."""

    def __init__(self, *, tracebacks: bool) -> None:
        super().__init__()
        self.tracebacks = tracebacks

    def format(self, record: logging.LogRecord) -> str:
        text = f"acp-conductor {record.levelname} (mcp{_serving()}): {record.getMessage()}"
        if not record.exc_info or record.exc_info[1] is None:
            return text
        if self.tracebacks:
            return f"{text}\n{self.formatException(record.exc_info)}"
        error: BaseException = record.exc_info[1]
        while True:
            inner = error.__cause__ or (None if error.__suppress_context__
                                        else error.__context__)
            if inner is None:
                break
            error = inner
        return f"{text}: {type(error).__name__}: {error}"


def _serving() -> str:
    """`, proxy P, server S` inside a handler of a proxy's MCP server, else ''."""
    api = sys.modules.get("conductor.plugins.api")  # (never imported for this alone)
    if api is None:
        return ""
    try:
        context = api.tool_context()
    except LookupError:
        return ""
    return f", proxy {context.proxy.name}, server {context.server_name!r}"
