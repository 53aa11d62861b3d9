"""A plugin proxy with one MCP tool, for bridge tests: `plugin = "tests/bin/docs_tools.py:Docs"`."""

from __future__ import annotations

from typing import Any

from mcp.server.mcpserver import MCPServer

from conductor.plugins import Proxy, tool_context


class Docs(Proxy):
    """Offers a `search` tool."""

    def mcp_servers(self) -> list[Any]:
        server = MCPServer("docs")

        @server.tool()
        def search(query: str) -> str:
            """Search the docs."""
            return f"found {query!r} in session {tool_context().session_id}"

        return [server]
