"""An ACP agent (official ACP SDK) whose tools come from MCP servers it connects to with the
official MCP SDK client, over http or stdio: what every agent on the market does.

    mcp_client_agent.py http|stdio|none [--acp]

It advertises http MCP support when told `http` (then the conductor's bridge gives it http
servers), only stdio for `stdio`, and neither for `none` (v2 style: the bridge has nothing
to offer; acp servers never reach it). On a prompt it connects to every MCP server of the
session, lists its tools and calls the first one with {"query": <prompt>}, and says what
came back. A prompt "raw URL" instead posts to each http server without its token and
says the HTTP status it got.
"""

from __future__ import annotations

import asyncio
import sys
import uuid
from typing import Any

import httpx2
from acp import (
    PROTOCOL_VERSION,
    Agent,
    InitializeResponse,
    NewSessionResponse,
    PromptResponse,
    run_agent,
    text_block,
    update_agent_message,
)
from acp.schema import AgentCapabilities, McpCapabilities
from mcp import ClientSession, StdioServerParameters, stdio_client
from mcp.client.streamable_http import streamable_http_client

MODE = sys.argv[1] if len(sys.argv) > 1 else "http"


class McpClientAgent(Agent):
    def __init__(self) -> None:
        self.servers: dict[str, list[Any]] = {}

    def on_connect(self, conn: Any) -> None:
        self.conn = conn

    async def initialize(self, protocol_version: int, client_capabilities: Any = None,
                         client_info: Any = None, **kwargs: Any) -> InitializeResponse:
        caps = McpCapabilities(http=MODE == "http", sse=False)
        return InitializeResponse(protocol_version=PROTOCOL_VERSION, agent_capabilities=(
            AgentCapabilities(load_session=False, mcp_capabilities=caps)))

    async def new_session(self, cwd: str, mcp_servers: Any = None,
                          **kwargs: Any) -> NewSessionResponse:
        sid = f"mcp-client-{uuid.uuid4().hex[:8]}"
        self.servers[sid] = list(mcp_servers or [])
        return NewSessionResponse(session_id=sid)

    async def say(self, session_id: str, text: str) -> None:
        await self.conn.session_update(session_id, update_agent_message(text_block(text)))

    async def prompt(self, prompt: list[Any], session_id: str, **kwargs: Any) -> PromptResponse:
        text = " ".join(getattr(b, "text", "") for b in prompt)
        servers = self.servers.get(session_id, [])
        await self.say(session_id, f"servers: {[s.name for s in servers]}\n")
        for server in servers:
            try:
                if text == "raw URL":
                    await self.say(session_id, await self.without_token(server))
                else:
                    await self.say(session_id, await self.use(server, text))
            except Exception as e:
                await self.say(session_id, f"{server.name} failed: {type(e).__name__}: {e}\n")
        return PromptResponse(stop_reason="end_turn")

    async def use(self, server: Any, text: str) -> str:
        url = getattr(server, "url", None)
        if url is not None:
            headers = {h.name: h.value for h in server.headers}
            async with httpx2.AsyncClient(headers=headers) as client, \
                    streamable_http_client(url, http_client=client) as (read, write):
                return await self.session(read, write, server.name, text)
        params = StdioServerParameters(command=server.command, args=list(server.args),
                                       env={e.name: e.value for e in server.env})
        async with stdio_client(params) as (read, write):
            return await self.session(read, write, server.name, text)

    async def session(self, read: Any, write: Any, name: str, text: str) -> str:
        async with ClientSession(read, write) as session:
            init = await session.initialize()
            tools = (await session.list_tools()).tools
            called = await session.call_tool(tools[0].name, {"query": text})
            said = "".join(getattr(c, "text", "") for c in called.content)
            return (f"{name} ({init.server_info.name}) tools {[t.name for t in tools]}; "
                    f"{tools[0].name} said: {said}\n")

    async def without_token(self, server: Any) -> str:
        async with httpx2.AsyncClient() as client:
            answer = await client.post(server.url, json={
                "jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {}},
                headers={"Accept": "application/json, text/event-stream"})
        return f"{server.name} without its token: HTTP {answer.status_code}\n"


if __name__ == "__main__":
    asyncio.run(run_agent(McpClientAgent()))
