"""An agent built on the official ACP Python SDK (`acp` 0.12), for end-to-end proxy tests.

Prompt words drive it: `read PATH` asks the client for a file (fs/read_text_file) and echoes
what it got; `permission` asks session/request_permission; everything else is echoed.
"""

from __future__ import annotations

import asyncio
import uuid
from typing import Any

from acp import (
    PROTOCOL_VERSION,
    Agent,
    InitializeResponse,
    NewSessionResponse,
    PromptResponse,
    run_agent,
    start_tool_call,
    text_block,
    update_agent_message,
    update_tool_call,
)
from acp.schema import AgentCapabilities, PermissionOption, ToolCallUpdate


class SdkAgent(Agent):
    def on_connect(self, conn: Any) -> None:
        self.conn = conn

    async def initialize(self, protocol_version: int, client_capabilities: Any = None,
                         client_info: Any = None, **kwargs: Any) -> InitializeResponse:
        return InitializeResponse(protocol_version=PROTOCOL_VERSION,
                                  agent_capabilities=AgentCapabilities(load_session=False))

    async def new_session(self, cwd: str, mcp_servers: Any = None,
                          **kwargs: Any) -> NewSessionResponse:
        return NewSessionResponse(session_id=f"sdk-{uuid.uuid4().hex[:8]}")

    async def say(self, session_id: str, text: str) -> None:
        await self.conn.session_update(session_id, update_agent_message(text_block(text)))

    async def prompt(self, prompt: list[Any], session_id: str, **kwargs: Any) -> PromptResponse:
        text = " ".join(getattr(b, "text", "") for b in prompt)
        words = text.split()
        if "read" in words and words.index("read") + 1 < len(words):
            path = words[words.index("read") + 1]
            await self.conn.session_update(session_id, start_tool_call(
                "read-1", f"Read {path}", kind="read", status="pending"))
            try:
                got = await self.conn.read_text_file(path=path, session_id=session_id)
                await self.conn.session_update(session_id, update_tool_call(
                    "read-1", status="completed"))
                await self.say(session_id, f"file says: {got.content}")
            except Exception as e:  # the client refused: report it and carry on
                await self.conn.session_update(session_id, update_tool_call(
                    "read-1", status="failed"))
                await self.say(session_id, f"read failed: {e}")
        if "permission" in words:
            answer = await self.conn.request_permission(
                session_id=session_id,
                tool_call=ToolCallUpdate(tool_call_id="edit-1", title="Write notes.txt",
                                         kind="edit"),
                options=[PermissionOption(option_id="allow", name="Allow", kind="allow_once"),
                         PermissionOption(option_id="reject", name="Reject",
                                          kind="reject_once")])
            chosen = getattr(answer.outcome, "option_id", None)
            await self.say(session_id, f"permission: {chosen or 'cancelled'}")
            if chosen != "allow":
                return PromptResponse(stop_reason="refusal")
        await self.say(session_id, f"sdk echo: {text}")
        return PromptResponse(stop_reason="end_turn")


if __name__ == "__main__":
    asyncio.run(run_agent(SdkAgent()))
