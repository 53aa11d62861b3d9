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


@pytest.mark.usefixtures("saved_logging")
async def test_a_tool_that_raises_is_one_log_line_naming_the_proxy_and_the_cause(
        capfd: pytest.CaptureFixture[str]) -> None:
    # The SDK logs the tool's exception with its traceback (some forty lines on the
    # user's terminal for every failing call), under its own name only: which proxy's
    # tool failed, and why, is what the user needs; the traceback is for --log-level debug.
    from conductor.testing import open_test_chain
    from tests.test_plugin_tools import Docs, McpAgent

    server = MCPServer("docs")

    @server.tool()
    def lookup(ticket: str) -> str:
        """Look a ticket up."""
        raise RuntimeError(f"no ticket {ticket}")

    logging.getLogger().handlers.clear()
    configure_logging("warning")
    agent = McpAgent()
    async with open_test_chain([Docs(server)], agent) as client:
        conn = await agent.open_mcp(await client.new_session())
        result = await agent.mcp(conn, "tools/call", {"name": "lookup",
                                                      "arguments": {"ticket": "T-1"}})
    assert result["isError"] is True
    err = capfd.readouterr().err
    assert "proxy docs" in err and "RuntimeError: no ticket T-1" in err, err
    assert "Traceback" not in err
