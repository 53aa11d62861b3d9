"""An ACP agent written with the official Python SDK (agent-client-protocol), for interop tests.

On a prompt it streams two text chunks, asks the client for permission, reads a file
through the client, and ends the turn with `end_turn` when allowed (`refusal` otherwise).
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, Any

from acp import (
    InitializeResponse,
    NewSessionResponse,
    PromptResponse,
    run_agent,
    text_block,
    update_agent_message,
)
from acp.schema import AgentCapabilities, Implementation, PermissionOption, ToolCallUpdate

if TYPE_CHECKING:
    from acp.interfaces import Client


class SdkAgent:
    def __init__(self) -> None:
        self.client: Client | None = None
        self.sessions = 0

    def on_connect(self, conn: Client) -> None:
        self.client = conn

    async def initialize(self, protocol_version: int, client_capabilities: Any = None,
                         client_info: Any = None, **kwargs: Any) -> InitializeResponse:
        return InitializeResponse(protocol_version=protocol_version,
                                  agent_capabilities=AgentCapabilities(),
                                  agent_info=Implementation(name="sdk-agent", version="1.0"))

    async def new_session(self, cwd: str, mcp_servers: Any = None,
                          **kwargs: Any) -> NewSessionResponse:
        self.sessions += 1
        return NewSessionResponse(session_id=f"sdk-{self.sessions}")

    async def prompt(self, prompt: list[Any], session_id: str, **kwargs: Any) -> PromptResponse:
        assert self.client is not None
        said = " ".join(getattr(block, "text", "") for block in prompt)
        for text in ("you said: ", said):
            await self.client.session_update(session_id=session_id,
                                             update=update_agent_message(text_block(text)))
        answer = await self.client.request_permission(
            session_id=session_id,
            tool_call=ToolCallUpdate(tool_call_id="t1", title="Read notes"),
            options=[PermissionOption(option_id="allow", name="Allow", kind="allow_once"),
                     PermissionOption(option_id="deny", name="Deny", kind="reject_once")])
        outcome = answer.outcome
        if outcome.outcome != "selected" or outcome.option_id != "allow":
            return PromptResponse(stop_reason="refusal")
        read = await self.client.read_text_file(session_id=session_id, path="/notes.txt")
        await self.client.session_update(session_id=session_id,
                                         update=update_agent_message(text_block(read.content)))
        return PromptResponse(stop_reason="end_turn")

    async def cancel(self, session_id: str, **kwargs: Any) -> None:
        return None


if __name__ == "__main__":
    asyncio.run(run_agent(SdkAgent()))
