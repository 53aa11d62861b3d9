"""An agent written with the official Python ACP SDK (`acp`): streams, thinks, asks permission."""

from __future__ import annotations

import asyncio
from typing import Any

from acp import (
    PROTOCOL_VERSION,
    Agent,
    InitializeResponse,
    NewSessionResponse,
    PromptResponse,
    run_agent,
    text_block,
    update_agent_message,
    update_agent_thought_text,
)
from acp.schema import AgentCapabilities, Implementation, PermissionOption, ToolCallUpdate


class SdkAgent(Agent):
    def on_connect(self, conn: Any) -> None:
        self.conn = conn
        self.sessions = 0

    async def initialize(self, protocol_version: int, client_capabilities: Any = None,
                         client_info: Any = None, **kwargs: Any) -> InitializeResponse:
        return InitializeResponse(protocol_version=PROTOCOL_VERSION,
                                  agent_capabilities=AgentCapabilities(),
                                  agent_info=Implementation(name="sdk-agent", version="1.0"))

    async def new_session(self, cwd: str, mcp_servers: Any = None,
                          **kwargs: Any) -> NewSessionResponse:
        self.sessions += 1
        return NewSessionResponse(session_id=f"sdk-{self.sessions}")

    async def prompt(self, prompt: list[Any], session_id: str, **kwargs: Any) -> PromptResponse:
        text = " ".join(getattr(block, "text", "") for block in prompt)
        await self.conn.session_update(session_id, update_agent_thought_text("pondering"))
        if "permission" in text:
            answer = await self.conn.request_permission(
                options=[PermissionOption(option_id="yes", name="Yes", kind="allow_once"),
                         PermissionOption(option_id="no", name="No", kind="reject_once")],
                session_id=session_id,
                tool_call=ToolCallUpdate(tool_call_id="t1", title="Delete things", kind="delete"))
            outcome = answer.outcome
            if getattr(outcome, "option_id", None) != "yes":
                return PromptResponse(stop_reason="refusal")
        for word in ("SDK", "agent", "says", "hi"):
            await self.conn.session_update(session_id, update_agent_message(text_block(word + " ")))
        return PromptResponse(stop_reason="end_turn")


if __name__ == "__main__":
    asyncio.run(run_agent(SdkAgent()))
