"""transcript: one readable transcript per session, as Markdown and as JSONL.

Records prompts, the agent's text, tool calls and their status, permission requests with
the answer they got, and each turn's stop reason. Put it after `permissions` in a chain
(nearer the agent) to record the decisions that proxy makes.
"""

from __future__ import annotations

import json
import re
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from msgspec import UNSET
from pydantic import BaseModel, ConfigDict

from conductor.plugins import Proxy, ProxyContext, SessionScope, on

if TYPE_CHECKING:
    from conductor.jsonrpc.message import Message


class TranscriptOptions(BaseModel):
    model_config = ConfigDict(extra="forbid")

    directory: str = "transcripts"   # relative to the conductor's working directory


def _text(blocks: Any) -> str:
    if isinstance(blocks, dict):
        blocks = [blocks]
    parts = []
    for block in blocks or []:
        if isinstance(block, dict):
            if block.get("type") == "text":
                parts.append(str(block.get("text", "")))
            elif block.get("type") in ("resource_link", "resource"):
                parts.append(f"[{block.get('type')}: {block.get('uri') or block.get('name', '')}]")
            else:
                parts.append(f"[{block.get('type')}]")
    return "".join(parts)


class Transcript(Proxy[TranscriptOptions]):
    """Write a Markdown and a JSONL transcript of every session to a directory."""

    options_model = TranscriptOptions

    def _paths(self, session_id: str) -> tuple[Path, Path]:
        safe = re.sub(r"[^A-Za-z0-9_.-]", "_", session_id)
        base = Path(self.options.directory)
        base.mkdir(parents=True, exist_ok=True)
        return base / f"{safe}.md", base / f"{safe}.jsonl"

    def _write(self, session: SessionScope | None, event: dict[str, Any], markdown: str) -> None:
        if session is None:
            return
        md, jsonl = self._paths(session.session_id)
        pending = session.state.pop("transcript_agent_text", "")
        with md.open("a", encoding="utf-8") as f:
            if pending and event["type"] != "agent_text":
                f.write(f"**Agent:** {pending}\n\n")
            if markdown:
                f.write(markdown)
        with jsonl.open("a", encoding="utf-8") as f:
            f.write(json.dumps({"time": round(time.time(), 3), "session": session.session_id,
                                **event}) + "\n")

    async def session_opened(self, session: SessionScope) -> None:
        if session.owned:
            return
        self._write(session, {"type": "session", "how": session.how, "cwd": session.cwd},
                    f"# Session {session.session_id}\n\n_{session.how}, cwd {session.cwd}_\n\n")

    @on("session/prompt")
    async def prompt(self, ctx: ProxyContext, message: Message) -> object:
        params = message.params_value() or {}
        text = _text(params.get("prompt"))
        self._write(ctx.session, {"type": "prompt", "text": text}, f"## User\n\n{text}\n\n")
        answer = await ctx.forward()
        assert answer is not None
        if answer.error is UNSET:
            result = answer.result_value()
            stop = result.get("stopReason") if isinstance(result, dict) else None
            self._write(ctx.session, {"type": "stop", "stopReason": stop},
                        f"_Turn ended: {stop}_\n\n")
        else:
            err = answer.error_value()
            shown = err.get("message") if isinstance(err, dict) else err
            self._write(ctx.session, {"type": "error", "error": err},
                        f"_Turn failed: {shown}_\n\n")
        return answer

    @on("session/update", source="successor")
    async def update(self, ctx: ProxyContext, message: Message) -> None:
        await ctx.forward()
        session = ctx.session
        if session is None:
            return
        update = (message.params_value() or {}).get("update") or {}
        kind = update.get("sessionUpdate")
        if kind == "agent_message_chunk":
            chunk = _text(update.get("content"))
            session.state["transcript_agent_text"] = \
                session.state.get("transcript_agent_text", "") + chunk
            _md, jsonl = self._paths(session.session_id)
            with jsonl.open("a", encoding="utf-8") as f:
                f.write(json.dumps({"time": round(time.time(), 3),
                                    "session": session.session_id, "type": "agent_text",
                                    "text": chunk}) + "\n")
        elif kind == "tool_call":
            self._write(session, {"type": "tool_call", "id": update.get("toolCallId"),
                                  "title": update.get("title"), "kind": update.get("kind"),
                                  "status": update.get("status")},
                        f"- Tool call `{update.get('title')}` ({update.get('kind', 'other')}): "
                        f"{update.get('status', 'pending')}\n\n")
        elif kind == "tool_call_update" and update.get("status"):
            self._write(session, {"type": "tool_call_update", "id": update.get("toolCallId"),
                                  "status": update.get("status")},
                        f"- Tool call {update.get('toolCallId')}: {update.get('status')}\n\n")

    @on("session/request_permission", source="successor")
    async def permission(self, ctx: ProxyContext, message: Message) -> object:
        answer = await ctx.forward()
        assert answer is not None
        params = message.params_value() or {}
        title = (params.get("toolCall") or {}).get("title")
        outcome = (answer.result_value() or {}).get("outcome") if answer.error is UNSET \
            else {"outcome": "error"}
        decision = (outcome.get("optionId") or outcome.get("outcome")) if isinstance(
            outcome, dict) else str(outcome)
        self._write(ctx.session, {"type": "permission", "title": title, "outcome": outcome},
                    f"- Permission for `{title}`: {decision}\n\n")
        return answer
