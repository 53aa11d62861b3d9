"""`run`'s live view on a terminal (rich): streaming text, dim thoughts, tool calls updating
in place. Imported only when stdout is a terminal, so `run` in a pipe or CI never loads
rich (docs/performance.md measures what rich costs at start-up)."""

from __future__ import annotations

from typing import Any

from rich.console import Console, Group, RenderableType
from rich.live import Live
from rich.markup import escape
from rich.text import Text

from conductor.editor.render import (
    ANSWER_PROMPT,
    PLAN_MARK,
    STATUS_MARK,
    STATUS_STYLE,
    _content_text,
    _question,
    _read_choice,
    _Tools,
    _usage_line,
    agent_info,
    error_text,
    plan_entries,
)
from conductor.terminal_text import shown


class RichEvents:
    """Live view on a terminal: streaming text, dim thoughts, tool calls updating in place."""

    def __init__(self, console: Console | None = None, err: Console | None = None) -> None:
        self.console = console or Console()
        self.err = err or Console(stderr=True)
        self.tools = _Tools()
        self.open_tools: list[str] = []
        self.text = Text()
        self.text_kind: str | None = None
        self.plan: list[dict[str, Any]] = []
        self.usage: dict[str, Any] | None = None
        self.live = Live(console=self.console, refresh_per_second=12, transient=True,
                         get_renderable=self._render, redirect_stderr=False)
        self.live.start()

    def _render(self) -> RenderableType:
        parts: list[RenderableType] = []
        if self.text:
            parts.append(self.text)
        for ident in self.open_tools:
            parts.append(self._tool_line(self.tools.calls[ident]))
        if self.plan:
            parts.append(self._plan())
        line = _usage_line(self.usage)
        if line:
            parts.append(Text(line, style="dim"))
        return Group(*parts)

    def _tool_line(self, call: dict[str, Any]) -> Text:
        status = call.get("status", "pending")
        text = Text(f"{STATUS_MARK.get(status, '?')} ", style=STATUS_STYLE.get(status, ""))
        text.append(f"{shown(call.get('kind', 'other'))} ", style="bold")
        text.append(shown(call.get("title", call["toolCallId"])))
        text.append(f"  {status}", style=STATUS_STYLE.get(status, "dim"))
        return text

    def _plan(self) -> Text:
        text = Text("Plan\n", style="bold")
        for entry in self.plan:
            status = entry.get("status", "pending")
            text.append(f"  {PLAN_MARK.get(status, '[ ]')} {shown(entry.get('content', ''))}\n",
                        style="dim strike" if status == "completed" else "")
        text.rstrip()
        return text

    def _commit_text(self) -> None:
        if self.text:
            self.console.print(self.text)
        self.text = Text()
        self.text_kind = None

    def _refresh(self) -> None:
        self.live.refresh()

    def session(self, record: dict[str, Any]) -> None:
        info = agent_info(record)
        name = escape(shown(info.get("name", "?")))
        self.err.print(f"[dim]session {escape(shown(record.get('sessionId')))} "
                       f"({record.get('how')}), agent {name}[/dim]")

    def update(self, session_id: str | None, update: dict[str, Any]) -> None:
        kind = update.get("sessionUpdate")
        if kind in ("agent_message_chunk", "agent_thought_chunk", "user_message_chunk"):
            if self.text_kind != kind:
                self._commit_text()
                self.text_kind = kind
            style = {"agent_thought_chunk": "dim italic",
                     "user_message_chunk": "blue"}.get(kind, "")
            self.text.append(shown(_content_text(update), text=True), style=style)
        elif kind in ("tool_call", "tool_call_update"):
            self._commit_text()
            call = self.tools.merge(update)
            ident = call["toolCallId"]
            if call["status"] in ("completed", "failed"):
                if ident in self.open_tools:
                    self.open_tools.remove(ident)
                self.console.print(self._tool_line(call))
            elif ident not in self.open_tools:
                self.open_tools.append(ident)
        elif kind == "plan":
            self.plan = plan_entries(update)
        elif kind == "usage_update":
            self.usage = update
        self._refresh()

    def decision(self, record: dict[str, Any]) -> None:
        if record["type"] == "permission":
            tool = record.get("toolCall") or {}
            choice = record.get("optionId") or record["outcome"]
            style = "green" if (record.get("optionKind") or "").startswith("allow") else "red"
            self.console.print(Text.assemble(("permission ", "bold"),
                                             shown(tool.get("title", "tool call")), ": ",
                                             (str(choice), style),
                                             (f"  (--approve {record['policy']})", "dim")))
        elif not record.get("allowed"):
            self.console.print(Text.assemble(("refused ", "bold red"),
                                             f"{record['op']} {shown(record['target'])}: ",
                                             (shown(record.get("reason")), "red")))

    def notice(self, text: str) -> None:
        self.err.print(f"[yellow]{escape(shown(text))}[/yellow]")

    def prompting(self, number: int) -> None:
        pass

    def turn(self, record: dict[str, Any]) -> None:
        if record["of"] > 1:
            self._commit_text()
            ok = record["exitCode"] == 0
            self.console.print(Text.assemble(
                ("─ ", "green" if ok else "red"),
                (f"turn {record['turn']}/{record['of']}: ", "dim"),
                (str(record.get("stopReason") or record["exitReason"]), "bold"),
                (f"  {record['durationMs'] / 1000:.1f}s", "dim")))

    def result(self, record: dict[str, Any]) -> None:
        self._commit_text()
        for ident in self.open_tools:
            self.console.print(self._tool_line(self.tools.calls[ident]))
        self.open_tools.clear()
        if self.plan:
            self.console.print(self._plan())
            self.plan = []
        usage = _usage_line(record.get("usage") or self.usage)
        self.usage = None
        self.live.stop()
        if usage:
            self.console.print(Text(usage, style="dim"))
        if record.get("error"):
            self.err.print(f"[red]error:[/red] {escape(shown(error_text(record['error'])))}")
        ok = record["exitCode"] == 0
        self.console.print(Text.assemble(
            ("■ ", "green" if ok else "red"),
            (str(record.get("stopReason") or record["exitReason"]), "bold"),
            (f"  exit {record['exitCode']}, {record['durationMs'] / 1000:.1f}s", "dim")))

    async def ask_permission(self, tool_call: dict[str, Any],
                             options: list[dict[str, Any]]) -> str | None:
        self.live.stop()
        try:
            first, *rest = _question(tool_call, options)
            self.err.print(Text(first, style="bold"))
            for line in rest:
                self.err.print(Text(line))
            self.err.print(ANSWER_PROMPT, end="")
            return await _read_choice(options)
        finally:
            self.live.start()
