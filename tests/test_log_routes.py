"""Where log records go once the CLI has configured logging (conductor/cli/logs.py)."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

import pytest
from mcp.server.mcpserver import MCPServer

from conductor.cli.logs import configure_logging

if TYPE_CHECKING:
    from collections.abc import Iterator

ROUTED = ["", "acp_conductor", "acp_conductor.stderr", "mcp", "acp_conductor.proxy"]


@pytest.fixture
def saved_logging() -> Iterator[None]:
    loggers = [logging.getLogger(name or None) for name in ROUTED]
    saved = [(lg, lg.handlers[:], lg.level, lg.propagate) for lg in loggers]
    try:
        yield
    finally:
        for logger, handlers, level, propagate in saved:
            logger.handlers[:] = handlers
            logger.setLevel(level)
            logger.propagate = propagate


@pytest.mark.usefixtures("saved_logging")
def test_a_librarys_info_stays_off_stderr_after_a_plugin_builds_an_mcp_server(
        capfd: pytest.CaptureFixture[str]) -> None:
    root = logging.getLogger()
    root.handlers.clear()  # as in a fresh process (pytest hangs its own handlers here)
    root.setLevel(logging.WARNING)
    configure_logging("warning")
    MCPServer("tools")  # the SDK's basicConfig would give the root a handler at INFO
    logging.getLogger("httpx").info("HTTP Request: GET http://127.0.0.1/acp")
    logging.getLogger("httpx").warning("a library's warning")
    err = capfd.readouterr().err
    assert "HTTP Request" not in err
    assert "acp-conductor WARNING" in err and "a library's warning" in err  # in our format
