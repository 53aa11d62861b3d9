"""session-tools: tools about the session itself, for the agent (an MCP server, docs/mcp.md).

- `chain`: the chain's components and their state, and the open sessions (what the
  conductor knows; stand-alone, only this proxy and what initialize said);
- `search_transcript`: lines of this session's transcript (prompts, the agent's messages,
  tool calls) that contain a text, newest last;
- `ask_user`: a yes/no question to the person at the editor (as a permission request).

It remembers the last `keep` lines of each session (and at most `sessions` sessions), in
memory only.
"""

from __future__ import annotations

from collections import OrderedDict, deque
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel, ConfigDict, Field

from conductor.jsonrpc.message import as_object
from conductor.plugins import (
    McpOffer,
    Proxy,
    ProxyContext,
    WatchContext,
    on,
    tool_context,
    watch,
)

if TYPE_CHECKING:
    from conductor.jsonrpc.message import Notification, Request


MAX_CALLS = 1024  # tool call ids remembered per session (v2's first update creates a call)


class SessionToolsOptions(BaseModel):
    model_config = ConfigDict(extra="forbid")

    keep: int = Field(default=2000, ge=1, description="transcript lines kept per session")
    sessions: int = Field(default=64, ge=1, description="sessions remembered at most")


def _text(blocks: Any) -> str:
    blocks = blocks if isinstance(blocks, list) else [blocks]
    return "".join(str(b.get("text", "")) for b in blocks
                   if isinstance(b, dict) and b.get("type") == "text")


class SessionTools(Proxy[SessionToolsOptions]):
    """Give the agent tools about its own session: the chain, the transcript, the user."""

    options_model = SessionToolsOptions

    def __init__(self, options: SessionToolsOptions | None = None) -> None:
        super().__init__(options)
        self._lines: OrderedDict[str, deque[str]] = OrderedDict()
        # The message being streamed, in chunks (joined once: a long message would otherwise
        # be copied whole for every chunk), and whose it is: the agent's, or the user's
        # (in a session/load's replay of the history).
        self._streamed: dict[str, tuple[str, list[str]]] = {}
        self._turns: set[str] = set()  # sessions with a turn running
        # v2 has no `tool_call` update: a call's first titled `tool_call_update` creates it.
        # The ids of each session's calls already recorded (the newest MAX_CALLS).
        self._calls: dict[str, OrderedDict[str, None]] = {}
        self._initialize: dict[str, Any] = {}

    # -- what it records -------------------------------------------------------------------

    def _session(self, session_id: str) -> deque[str]:
        """The session's lines, now the most recently used: past `sessions`, the session
        used least recently is forgotten (its message being streamed too)."""
        lines = self._lines.get(session_id)
        if lines is None:
            lines = self._lines[session_id] = deque(maxlen=self.options.keep)
            while len(self._lines) > self.options.sessions:
                forgotten, _ = self._lines.popitem(last=False)
                self._streamed.pop(forgotten, None)
                self._calls.pop(forgotten, None)
        else:
            self._lines.move_to_end(session_id)
        return lines

    def _log(self, session_id: str, line: str) -> None:
        self._session(session_id).append(line)

    def _flush(self, session_id: str) -> None:
        who, chunks = self._streamed.pop(session_id, ("", []))
        text = "".join(chunks).strip()
        if text:
            self._log(session_id, f"{who}: {text}")

    @on("initialize")
    async def remember_initialize(self, ctx: ProxyContext, request: Request) -> Any:
        params = as_object(request.params_value())
        self._initialize["client"] = params.get("clientInfo") or params.get("info")  # v1, v2
        answer = await ctx.forward()
        if answer is not None and not answer.is_error:
            result = as_object(answer.result_value())
            self._initialize["agent"] = result.get("agentInfo") or result.get("info")
            self._initialize["protocolVersion"] = result.get("protocolVersion")
        return answer

    @on("session/prompt")
    async def record_prompt(self, ctx: ProxyContext, request: Request) -> Any:
        params = as_object(request.params_value())
        sid = str(params.get("sessionId", ""))
        self._flush(sid)
        self._log(sid, f"user: {_text(params.get('prompt'))}")
        self._turns.add(sid)
        answer = None
        try:
            answer = await ctx.forward()
        finally:
            # v2 answers when it accepts the prompt: its turn runs on, to its idle state.
            if answer is None or answer.is_error or ctx.protocol_version < 2:
                self._turns.discard(sid)
                self._flush(sid)
        return answer

    @watch("session/update", source="successor")
    def record_update(self, ctx: WatchContext, note: Notification) -> None:
        # A watcher: streamed updates keep the router's shortcut past this proxy.
        params = as_object(note.params_value())
        sid = str(params.get("sessionId", ""))
        update = as_object(params.get("update"))
        kind = update.get("sessionUpdate")
        # The user's chunks replay the history (session/load); in a turn, the prompt itself
        # is recorded (an agent may echo it).
        if kind == "agent_message_chunk" or (kind == "user_message_chunk"
                                             and sid not in self._turns):
            who = "agent" if kind == "agent_message_chunk" else "user"
            self._session(sid)  # counted among the sessions remembered, and forgotten with them
            streamed = self._streamed.get(sid)
            if streamed is None or streamed[0] != who:
                self._flush(sid)
                streamed = self._streamed[sid] = (who, [])
            streamed[1].append(_text(update.get("content")))
        elif kind in ("agent_message", "user_message") and "content" in update:
            # v2: a whole message, replacing what its chunks said so far
            who = "agent" if kind == "agent_message" else "user"
            streamed = self._streamed.get(sid)
            if streamed is not None and streamed[0] == who:
                del self._streamed[sid]
            self._flush(sid)
            text = _text(update.get("content")).strip()
            if text:
                self._log(sid, f"{who}: {text}")
        elif kind == "tool_call" or (kind == "tool_call_update" and "title" in update
                                     and ctx.protocol_version >= 2
                                     and self._new_call(sid, update.get("toolCallId"))):
            self._flush(sid)
            self._log(sid, f"tool call: {update.get('title', '')} ({update.get('kind', '')})")
        elif kind == "state_update" and update.get("state") == "idle":
            self._turns.discard(sid)  # v2: the turn ended
            self._flush(sid)

    def _new_call(self, session_id: str, call_id: object) -> bool:
        """Whether a v2 tool call is seen for the first time (then remembered)."""
        if not isinstance(call_id, str):
            return False
        calls = self._calls.setdefault(session_id, OrderedDict())
        if call_id in calls:
            return False
        calls[call_id] = None
        if len(calls) > MAX_CALLS:
            calls.popitem(last=False)
        return True

    # -- the tools ---------------------------------------------------------------------------

    def describe_chain(self) -> str:
        status: Any = self.chain_status() if self.chain_status is not None else None
        if not isinstance(status, dict):  # stand-alone: only this proxy is known
            status = {"components": [{"name": self.name, "role": "proxy",
                                      "state": "running (stand-alone)"}]}
        lines = ["components (editor side first):"]
        for c in status.get("components", []):
            where = " (in-process)" if c.get("inProcess") else ""
            lines.append(f"  {c.get('name')}: {c.get('role')}{where}, {c.get('state')}")
        sessions = status.get("sessions")
        if sessions is not None:
            lines.append(f"open sessions: {len(sessions)}")
            for r in sessions:
                lines.append(f"  {r.get('sessionId')}: {r.get('state')}, {r.get('prompts')} "
                             f"prompt(s), opened by {r.get('openedBy')}")
        mcp = status.get("mcp")
        if isinstance(mcp, dict):
            lines.append(f"MCP-over-ACP: {mcp.get('servers')} server(s) declared, "
                         f"{mcp.get('connections')} connection(s) open")
        info = self._initialize
        for who in ("client", "agent"):
            about = info.get(who)
            if isinstance(about, dict):
                lines.append(f"{who}: {about.get('name')} {about.get('version', '')}".rstrip())
        if "protocolVersion" in info:
            lines.append(f"ACP protocol version: {info['protocolVersion']}")
        return "\n".join(lines)

    def mcp_servers(self) -> list[Any]:
        # Offered by name and made at the agent's first connect: the `mcp` SDK's import
        # (≈ 0.65 s of CPU) is then no part of answering `initialize`.
        return [McpOffer(name="session-tools", build=self._server)]

    def _server(self) -> Any:
        from mcp.server.mcpserver import MCPServer

        server = MCPServer("session-tools", instructions=(
            "Tools about this ACP session: the chain of components serving it, its "
            "transcript, and yes/no questions to the user."))

        @server.tool()
        def chain() -> str:
            """The chain serving this session: each component (proxy or agent) and its
            state, and the open sessions."""
            return self.describe_chain()

        @server.tool()
        def search_transcript(query: str, limit: int = 20) -> str:
            """Lines of this session's transcript (prompts, agent messages, tool calls)
            that contain `query` (case-insensitive), newest last."""
            sid = tool_context().session_id or ""
            self._flush(sid)
            lines = [line for line in self._lines.get(sid, ())
                     if query.lower() in line.lower()]
            return "\n".join(lines[-max(1, limit):]) or f"no line contains {query!r}"

        @server.tool()
        async def ask_user(question: str) -> str:
            """Ask the user a yes/no question; answers "yes" or "no"."""
            return "yes" if await tool_context().ask_permission(question) else "no"

        return server
