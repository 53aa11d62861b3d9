"""transcript: one readable transcript per session, as Markdown and as JSONL.

Records prompts, the agent's text, tool calls and their status, permission requests with
the answer they got, and each turn's stop reason. Put it after `permissions` in a chain
(nearer the agent) to record the decisions that proxy makes. The history an agent replays
for `session/load` (or `session/resume`) is counted, not recorded again (it was recorded as
it happened).
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import time
from collections import OrderedDict
from pathlib import Path
from typing import TYPE_CHECKING, Any

from msgspec import UNSET
from pydantic import BaseModel, ConfigDict

from conductor.errors import ConfigError
from conductor.jsonrpc.message import as_object
from conductor.output import make_private_dir, open_output
from conductor.plugins import Proxy, ProxyContext, SessionScope, WatchContext, on, watch
from conductor.tracing.redact import redact_url

if TYPE_CHECKING:
    from conductor.jsonrpc.message import Notification, Request


# Titles remembered per session, for permission requests that name only their tool call.
MAX_TITLES = 1024
# Sessions whose transcripts stay open between writes (two descriptors each).
MAX_OPEN = 32


class TranscriptOptions(BaseModel):
    model_config = ConfigDict(extra="forbid")

    directory: str = "transcripts"   # relative to the working directory of this process


def _uri(block: dict[str, Any]) -> str:
    """Where a resource block points: a link's `uri`, an embedded resource's
    `resource.uri` (else its name), without credentials (as traces hide them), on one line."""
    uri = block.get("uri") or as_object(block.get("resource")).get("uri") or block.get("name")
    if not isinstance(uri, str):
        return ""
    return redact_url(" ".join(uri.splitlines()))


def _text(blocks: Any) -> str:
    if isinstance(blocks, dict):
        blocks = [blocks]
    parts = []
    for block in blocks if isinstance(blocks, list) else []:
        if isinstance(block, dict):
            if block.get("type") == "text":
                parts.append(str(block.get("text", "")))
            elif block.get("type") in ("resource_link", "resource"):
                parts.append(f"[{block.get('type')}: {_uri(block)}]")
            else:
                parts.append(f"[{block.get('type')}]")
    return "".join(parts)


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]


def file_stem(session_id: str) -> str:
    """A file name for any session id: a readable prefix (safe characters, no leading dots,
    short enough for any filesystem) plus a hash of the whole id, so ids that read alike
    (`a/b`, `a_b`) or differ only past the prefix never share a file."""
    readable = re.sub(r"[^A-Za-z0-9._-]", "_", session_id)[:64].lstrip(".")
    digest = hashlib.sha256(session_id.encode("utf-8", "surrogatepass")).hexdigest()[:8]
    return f"{readable}-{digest}" if readable else digest


class Transcript(Proxy[TranscriptOptions]):
    """Write a Markdown and a JSONL transcript of every session to a directory."""

    options_model = TranscriptOptions

    def __init__(self, options: TranscriptOptions | None = None) -> None:
        super().__init__(options)
        # session id -> its open (markdown, jsonl) descriptors, least recently written first
        self._open: OrderedDict[str, tuple[int, int]] = OrderedDict()
        # session id -> loads and resumes of it still unanswered: its updates are the replay
        self._loading: dict[str, int] = {}

    def _paths(self, session_id: str) -> tuple[Path, Path]:
        stem = file_stem(session_id)
        base = Path(self.options.directory)
        make_private_dir(base)
        return base / f"{stem}.md", base / f"{stem}.jsonl"

    def _files(self, session: SessionScope) -> tuple[int, int]:
        """The session's two transcripts, opened once (created 0600, never through a
        symbolic link: they hold the whole session) and kept open while it is among the
        `MAX_OPEN` last written: a streamed answer writes one line per chunk, and opening
        both files for each cost more than the rest of the proxy's work."""
        key = session.session_id
        fds = self._open.get(key)
        if fds is not None:
            self._open.move_to_end(key)
            return fds
        md, jsonl = self._paths(key)
        md_fd = open_output(md, option="transcript", append=True)
        try:
            fds = (md_fd, open_output(jsonl, option="transcript", append=True))
        except BaseException:
            os.close(md_fd)
            raise
        self._open[key] = fds
        while len(self._open) > MAX_OPEN:  # bounded descriptors, however many sessions
            for fd in self._open.popitem(last=False)[1]:
                os.close(fd)
        return fds

    def _close(self, session: SessionScope) -> None:
        for fd in self._open.pop(session.session_id, ()):
            os.close(fd)

    def _append(self, session: SessionScope, markdown: str, event: dict[str, Any]) -> None:
        """Best effort: a transcript that cannot be written must not break the session.
        Each event is written at once, unbuffered: what a crash leaves is complete."""
        try:
            md, jsonl = self._files(session)
            if markdown:
                _write_all(md, markdown.encode())
            _write_all(jsonl, (json.dumps({"time": round(time.time(), 3),
                                           "session": session.session_id, **event})
                               + "\n").encode())
        except (OSError, ConfigError) as e:
            self._close(session)  # opened again for the next event: the fault may pass
            if not session.state.get("transcript_warned"):  # once per session, not per chunk
                session.state["transcript_warned"] = True
                reason = str(e) if isinstance(e, ConfigError) else \
                    e.strerror or type(e).__name__
                self.log.warning("cannot write the transcript of %s to %s: %s",
                                 session.session_id, self.options.directory, reason)

    def _write(self, session: SessionScope | None, event: dict[str, Any], markdown: str) -> None:
        if session is None:
            return
        if event["type"] in ("agent_text", "agent_message"):
            self._append(session, markdown, event)
            return
        pending = "".join(session.state.pop("transcript_agent_text", ()))
        session.state.pop("transcript_message", None)
        if pending:
            markdown = f"**Agent:** {pending}\n\n{markdown}"
        self._append(session, markdown, event)

    async def session_closed(self, session: SessionScope) -> None:
        # The agent's text waits in chunks for the next event to be written out: a session
        # ending mid-turn (closed, the chain stopping) has no next event.
        pending = "".join(session.state.pop("transcript_agent_text", ()))
        if pending and not session.owned:
            try:
                _write_all(self._files(session)[0], f"**Agent:** {pending}\n\n".encode())
            except (OSError, ConfigError):
                pass  # warned of already, with the chunks' own lines
        self._close(session)

    async def chain_stopped(self) -> None:
        while self._open:
            for fd in self._open.popitem()[1]:
                os.close(fd)

    async def session_opened(self, session: SessionScope) -> None:
        if session.owned:
            return
        self._write(session, {"type": "session", "how": session.how, "cwd": session.cwd},
                    f"# Session {session.session_id}\n\n_{session.how}, cwd {session.cwd}_\n\n")

    @on("session/load")
    @on("session/resume")
    async def load(self, ctx: ProxyContext, message: Request) -> object:
        # The agent replays the session's history as updates before it answers (v2's
        # resume, as `replayFrom` asks): the transcript has them from when they happened,
        # and they are no new turn.
        sid = as_object(message.params_value()).get("sessionId")
        if not isinstance(sid, str):
            return await ctx.forward()
        self._loading[sid] = self._loading.get(sid, 0) + 1
        try:
            answer = await ctx.forward()
        finally:
            if self._loading[sid] == 1:
                del self._loading[sid]
            else:
                self._loading[sid] -= 1
        assert answer is not None
        if answer.error is not UNSET:
            # Refused: its session is released; reading `ctx.session` now would make it
            # again, as one never set up, and keep it for ever.
            return answer
        session = ctx.session
        replayed = session.state.pop("transcript_replayed", 0) if session is not None else 0
        if replayed:
            self._write(session, {"type": "replayed", "updates": replayed},
                        f"_History replayed by the agent ({replayed} updates), not recorded "
                        "again_\n\n")
        return answer

    @on("session/prompt")
    async def prompt(self, ctx: ProxyContext, message: Request) -> object:
        text = _text(as_object(message.params_value()).get("prompt"))
        self._write(ctx.session, {"type": "prompt", "text": text}, f"## User\n\n{text}\n\n")
        v2 = ctx.protocol_version >= 2
        if v2 and ctx.session is not None:
            # v2 answers when it accepts the prompt: the turn ends with its idle state,
            # which may overtake this handler's return from the forward.
            ctx.session.state["transcript_turn"] = True
        answer = await ctx.forward()
        assert answer is not None
        if answer.error is not UNSET:
            if ctx.session is not None:
                ctx.session.state.pop("transcript_turn", None)
            err = answer.error_value()
            shown = err.get("message") if isinstance(err, dict) else err
            self._write(ctx.session, {"type": "error", "error": err},
                        f"_Turn failed: {shown}_\n\n")
        elif not v2:  # (v2: accepted; the turn is recorded as it streams, to its idle state)
            result = answer.result_value()
            stop = result.get("stopReason") if isinstance(result, dict) else None
            self._write(ctx.session, {"type": "stop", "stopReason": stop},
                        f"_Turn ended: {stop}_\n\n")
        return answer

    @watch("session/update", source="successor")
    def update(self, ctx: WatchContext, message: Notification) -> None:
        # A watcher: streamed updates keep the router's shortcut past this proxy.
        session = ctx.session
        if session is None:
            return
        update = as_object(as_object(message.params_value()).get("update"))
        kind = update.get("sessionUpdate")
        call_id, title = update.get("toolCallId"), update.get("title")
        if kind in ("tool_call", "tool_call_update") and isinstance(call_id, str) \
                and isinstance(title, str):
            titles = session.state.setdefault("transcript_titles", {})
            if kind == "tool_call_update" and call_id not in titles:
                kind = "tool_call"  # ACP v2 has no `tool_call`: the first update creates it
            titles.pop(call_id, None)  # newest last: the oldest is forgotten first
            titles[call_id] = title
            if len(titles) > MAX_TITLES:
                del titles[next(iter(titles))]
        if session.session_id in self._loading:  # the replay of a load: recorded already
            session.state["transcript_replayed"] = session.state.get("transcript_replayed",
                                                                     0) + 1
            return
        if kind == "agent_message_chunk":
            chunk = _text(update.get("content"))
            # In chunks, joined once when written: growing one string would copy the whole
            # message for every chunk (quadratic in a long answer).
            pending = session.state.setdefault("transcript_agent_text", [])
            message_id = update.get("messageId")
            current = session.state.get("transcript_message", (None, 0))[0]
            if message_id is not None and message_id != current:
                session.state["transcript_message"] = (message_id, len(pending))
            pending.append(chunk)
            self._append(session, "", {"type": "agent_text", "text": chunk})
        elif kind == "agent_message" and "content" in update:
            self._agent_message(session, update)
        elif kind == "tool_call":
            self._write(session, {"type": "tool_call", "id": update.get("toolCallId"),
                                  "title": update.get("title"), "kind": update.get("kind"),
                                  "status": update.get("status")},
                        f"- Tool call `{update.get('title')}` ({update.get('kind', 'other')}): "
                        f"{update.get('status', 'pending')}\n\n")
        elif kind == "state_update" and update.get("state") == "idle" \
                and session.state.pop("transcript_turn", False):
            stop = update.get("stopReason")  # v2: the end of the turn it accepted
            self._write(session, {"type": "stop", "stopReason": stop},
                        f"_Turn ended: {stop}_\n\n")
        elif kind == "tool_call_update" and update.get("status"):
            self._write(session, {"type": "tool_call_update", "id": update.get("toolCallId"),
                                  "status": update.get("status")},
                        f"- Tool call {update.get('toolCallId')}: {update.get('status')}\n\n")

    def _agent_message(self, session: SessionScope, update: dict[str, Any]) -> None:
        """ACP v2's `agent_message`, an upsert: its `content` (null clears) replaces what
        the chunks of the same messageId built; another messageId starts a new message,
        and the one before it is a paragraph of its own."""
        message_id = update.get("messageId")
        text = _text(update.get("content")) if update.get("content") is not None else ""
        pending: list[str] = session.state.setdefault("transcript_agent_text", [])
        current, start = session.state.get("transcript_message", (None, 0))
        markdown = ""
        if message_id is not None and message_id == current:
            del pending[start:]
        else:
            if pending:
                markdown = f"**Agent:** {''.join(pending)}\n\n"
                pending.clear()
            session.state["transcript_message"] = (message_id, 0)
        if text:
            pending.append(text)
        self._write(session, {"type": "agent_message", "id": message_id, "text": text},
                    markdown)

    @on("session/request_permission", source="successor")
    async def permission(self, ctx: ProxyContext, message: Request) -> object:
        answer = await ctx.forward()
        assert answer is not None
        params = as_object(message.params_value())
        # v1 carries the tool call; v2 its own prompt `title` and a `subject` (a tool call
        # or a command) instead: record the title the editor shows.
        subject = as_object(params.get("subject"))
        tool = as_object(params.get("toolCall") or subject.get("toolCall"))
        call_id = tool.get("toolCallId") or subject.get("toolCallId")
        title = params.get("title") if isinstance(params.get("title"), str) else \
            tool.get("title")
        # A request may name only its tool call (ACP): then the title it announced.
        if title is None and isinstance(call_id, str):
            known = ctx.session.state.get("transcript_titles", {}) if ctx.session else {}
            title = known.get(call_id, call_id)
        outcome = as_object(answer.result_value()).get("outcome") if answer.error is UNSET \
            else {"outcome": "error"}
        decision = (outcome.get("optionId") or outcome.get("outcome")) if isinstance(
            outcome, dict) else str(outcome)
        self._write(ctx.session, {"type": "permission", "title": title, "outcome": outcome},
                    f"- Permission for `{title}`: {decision}\n\n")
        return answer
