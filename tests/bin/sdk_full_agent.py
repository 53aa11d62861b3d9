"""An ACP agent (official Python SDK) that calls every client method back, for interop tests.

On a prompt it runs a terminal (create, output, wait, kill, release), writes and reads a
file, asks the client an extension method and sends it an extension notification, then
says what it got in one text chunk: `OUTPUT|EXIT|CONTENT|EXT-ANSWER|PROMPT-META`. A prompt
"hang" then waits for session/cancel. It answers modes, config options, session/load (with
one replayed chunk) and extension methods (echoing params and `_meta`).
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

from acp import (
    InitializeResponse,
    LoadSessionResponse,
    NewSessionResponse,
    PromptResponse,
    run_agent,
    text_block,
    update_agent_message,
)
from acp.schema import (
    AgentCapabilities,
    Implementation,
    SetSessionConfigOptionResponse,
    SetSessionModeResponse,
)


class FullAgent:
    def __init__(self) -> None:
        self.cancelled = asyncio.Event()

    def on_connect(self, conn: Any) -> None:
        self.conn = conn

    async def initialize(self, protocol_version: int, **kwargs: Any) -> InitializeResponse:
        return InitializeResponse(protocol_version=protocol_version,
                                  agent_capabilities=AgentCapabilities(load_session=True),
                                  agent_info=Implementation(name="full-agent", version="1"),
                                  field_meta={"initMeta": kwargs.get("trace")})

    async def new_session(self, cwd: str, **kwargs: Any) -> NewSessionResponse:
        return NewSessionResponse(session_id="s1", field_meta={"newMeta": kwargs.get("k")})

    async def load_session(self, cwd: str, session_id: str, **kwargs: Any) -> LoadSessionResponse:
        await self.conn.session_update(session_id=session_id,
                                       update=update_agent_message(text_block("replayed")))
        return LoadSessionResponse()

    async def set_session_mode(self, session_id: str, mode_id: str,
                               **kwargs: Any) -> SetSessionModeResponse:
        return SetSessionModeResponse(field_meta={"mode": mode_id})

    async def set_config_option(self, config_id: str, session_id: str, value: Any,
                                **kwargs: Any) -> SetSessionConfigOptionResponse:
        return SetSessionConfigOptionResponse(config_options=[],
                                              field_meta={config_id: value})

    async def prompt(self, session_id: str, prompt: list[Any], **kwargs: Any) -> PromptResponse:
        c, sid = self.conn, session_id
        term = await c.create_terminal(session_id=sid, command="echo", args=["hi"])
        out = await c.terminal_output(session_id=sid, terminal_id=term.terminal_id)
        done = await c.wait_for_terminal_exit(session_id=sid, terminal_id=term.terminal_id)
        await c.kill_terminal(session_id=sid, terminal_id=term.terminal_id)
        await c.release_terminal(session_id=sid, terminal_id=term.terminal_id)
        await c.write_text_file(session_id=sid, path="/a.txt", content="A")
        read = await c.read_text_file(session_id=sid, path="/a.txt")
        ext = await c.ext_method("x/agent_ask", {"q": 1})   # the SDK sends `_x/agent_ask`
        await c.ext_notification("x/agent_note", {"n": 1})
        said = f"{out.output}|{done.exit_code}|{read.content}|{json.dumps(ext)}|{kwargs.get('p')}"
        await c.session_update(session_id=sid, update=update_agent_message(text_block(said)))
        if any(getattr(block, "text", "") == "hang" for block in prompt):
            await self.cancelled.wait()
            return PromptResponse(stop_reason="cancelled")
        return PromptResponse(stop_reason="end_turn")

    async def cancel(self, session_id: str, **kwargs: Any) -> None:
        self.cancelled.set()

    async def ext_method(self, method: str, params: dict[str, Any]) -> dict[str, Any]:
        return {"method": method, "params": params}

    async def ext_notification(self, method: str, params: dict[str, Any]) -> None:
        return None


if __name__ == "__main__":
    asyncio.run(run_agent(FullAgent()))
