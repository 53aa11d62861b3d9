"""How `run` shows a turn: plain text in a pipe, JSON lines, or only the answer. The live
view on a terminal is `conductor.editor.live`, the one place that imports rich (a pipe, as
in CI, does not pay for it).

In `run`, stdout is the user's: the agent's text (or the JSON events) goes there and
everything else (tool calls, plans, thoughts, notices) goes to stderr in plain mode.
"""

from __future__ import annotations

import os
import sys
from typing import Any, TextIO

import anyio
import msgspec

from conductor.terminal_text import SHOWN, SHOWN_TEXT

STATUS_MARK = {"pending": "○", "in_progress": "◐", "completed": "✓", "failed": "✗"}
STATUS_STYLE = {"pending": "yellow", "in_progress": "cyan", "completed": "green",
                "failed": "red"}
PLAN_MARK = {"pending": "[ ]", "in_progress": "[~]", "completed": "[x]"}


def _content_text(update: dict[str, Any]) -> str:
    content = update.get("content")
    if isinstance(content, dict):
        if content.get("type") == "text":
            return str(content.get("text", ""))
        return f"[{content.get('type', 'content')}]"
    return ""


def _usage_line(usage: dict[str, Any] | None) -> str | None:
    if not usage:
        return None
    parts = []
    if "used" in usage and "size" in usage:
        parts.append(f"context {usage['used']}/{usage['size']} tokens")
    for key, label in (("inputTokens", "in"), ("outputTokens", "out"),
                       ("thoughtTokens", "thought"), ("totalTokens", "total")):
        if usage.get(key) is not None:
            parts.append(f"{label} {usage[key]}")
    cost = usage.get("cost")
    if isinstance(cost, dict) and "amount" in cost:
        parts.append(f"cost {cost['amount']} {cost.get('currency', '')}".rstrip())
    return ", ".join(parts) or None


class _Tools:
    """Tool calls by id, with the latest kind/title/status merged in."""

    def __init__(self) -> None:
        self.calls: dict[str, dict[str, Any]] = {}

    def merge(self, update: dict[str, Any]) -> dict[str, Any]:
        ident = str(update.get("toolCallId"))
        call = self.calls.setdefault(ident, {"toolCallId": ident, "status": "pending"})
        for key in ("title", "kind", "status"):
            # Only strings: a list here (a broken agent) is no key to look a mark up by.
            if isinstance(update.get(key), str):
                call[key] = update[key]
        return call


def error_text(error: dict[str, Any]) -> str:
    """An error answer as a line: its message, and the agent's own detail where it gave one
    in `data` (Claude Code's `-32603 Internal error` says what went wrong only there)."""
    message = str(error.get("message") or f"error {error.get('code')}")
    data = error.get("data")
    detail = data if isinstance(data, str) else next(
        (data[k] for k in ("details", "detail", "reason", "message", "error")
         if isinstance(data, dict) and isinstance(data.get(k), str) and data[k]), None)
    if detail and detail not in message:
        message += f" ({detail[:DETAIL_SHOWN]}{'...' if len(detail) > DETAIL_SHOWN else ''})"
    return message


DETAIL_SHOWN = 300  # characters of an error's detail shown on its line


def agent_info(record: dict[str, Any]) -> dict[str, Any]:
    """The session record's agentInfo, as an object (anything else an agent sent: none)."""
    info = record.get("agentInfo")
    return info if isinstance(info, dict) else {}


def plan_entries(update: dict[str, Any]) -> list[dict[str, Any]]:
    """A plan update's entries that can be shown: objects, with a string status."""
    entries = update.get("entries")
    return [{**e, "status": e.get("status") if isinstance(e.get("status"), str) else "pending"}
            for e in (entries if isinstance(entries, list) else []) if isinstance(e, dict)]



# The agent's words on the terminal are shown, never obeyed (conductor/terminal_text.py).


def _question(tool_call: dict[str, Any], options: list[dict[str, Any]]) -> list[str]:
    """The permission question as lines (both renderers ask with the same words)."""
    lines = [f"The agent asks: {tool_call.get('title', 'a tool call')} "
             f"({tool_call.get('kind', 'other')})",
             *(f"  {i}. {o.get('name', o.get('optionId'))}" for i, o in enumerate(options, 1))]
    return [line.translate(SHOWN) for line in lines]


ANSWER_PROMPT = "choose a number (empty: cancel): "


async def _read_choice(options: list[dict[str, Any]]) -> str | None:
    """One line from the terminal on stdin, as an optionId (None: cancel).

    Waits for fd 0 in the event loop rather than a worker thread: a thread blocked in
    readline() cannot be abandoned, and the interpreter would join it at exit (a hang after
    --timeout or Ctrl-C). A terminal in canonical mode hands over a whole line per read.
    """
    await anyio.wait_readable(sys.stdin.fileno())
    answer = os.read(sys.stdin.fileno(), 4096).decode("utf-8", "replace").strip()
    # isdigit() alone takes "²", which int() does not.
    if answer.isascii() and answer.isdigit() and 1 <= int(answer) <= len(options):
        return options[int(answer) - 1].get("optionId")
    return None


class _Guarded:
    """A text stream whose reader may go away (`| head`): then output stops, quietly."""

    def __init__(self, stream: TextIO) -> None:
        self._stream = stream
        self.gone = False

    def write(self, text: str) -> None:
        if self.gone:
            return
        try:
            self._stream.write(text)
        except BrokenPipeError:
            self._gone()

    def flush(self) -> None:
        if self.gone:
            return
        try:
            self._stream.flush()
        except BrokenPipeError:
            self._gone()

    def isatty(self) -> bool:
        return self._stream.isatty()

    def _gone(self) -> None:
        self.gone = True
        # Python flushes stdout again at exit; point the fd at /dev/null so that flush is silent.
        try:
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, self._stream.fileno())
            os.close(devnull)
        except (OSError, ValueError):
            pass

class JsonEvents:
    """One JSON object per line on stdout; the schema is in docs/run.md."""

    def __init__(self, out: TextIO | None = None) -> None:
        self.out = _Guarded(out or sys.stdout)

    def _emit(self, record: dict[str, Any]) -> None:
        self.out.write(msgspec.json.encode(record).decode() + "\n")
        self.out.flush()

    def session(self, record: dict[str, Any]) -> None:
        self._emit(record)

    def update(self, session_id: str | None, update: dict[str, Any]) -> None:
        self._emit({"type": "update", "sessionId": session_id, "update": update})

    def decision(self, record: dict[str, Any]) -> None:
        self._emit(record)

    def notice(self, text: str) -> None:
        self._emit({"type": "notice", "message": text})

    def prompting(self, number: int) -> None:
        pass  # a replayed history is `update` lines before the first turn's, as it came

    def turn(self, record: dict[str, Any]) -> None:
        if record["of"] > 1:  # a single turn's report is the result line
            self._emit(record)

    def result(self, record: dict[str, Any]) -> None:
        self._emit(record)

    async def ask_permission(self, tool_call: dict[str, Any],
                             options: list[dict[str, Any]]) -> str | None:
        return None  # --json never asks (the CLI refuses --approve ask with --json)


class PlainEvents:
    """No escape codes: agent text to stdout as it streams, the rest as lines on stderr."""

    def __init__(self, out: TextIO | None = None, err: TextIO | None = None) -> None:
        self.out, self.err = _Guarded(out or sys.stdout), err or sys.stderr
        self.tools = _Tools()
        self._text_open = False   # stdout has text without a final newline
        self._thought_open = False

    def _line(self, text: str) -> None:
        if self._thought_open:
            self.err.write("\n")
            self._thought_open = False
        self.err.write(text.translate(SHOWN) + "\n")
        self.err.flush()

    def session(self, record: dict[str, Any]) -> None:
        info = agent_info(record)
        self._line(f"[session] {record.get('sessionId')} ({record.get('how')}) with "
                   f"{info.get('name', 'the agent')} {info.get('version', '')}".rstrip())

    def update(self, session_id: str | None, update: dict[str, Any]) -> None:
        kind = update.get("sessionUpdate")
        if kind == "agent_message_chunk":
            text = _content_text(update)
            self.out.write(text)
            self.out.flush()
            self._text_open = (bool(text) and not text.endswith("\n")) or \
                (self._text_open and not text)
        elif kind == "agent_thought_chunk":
            if not self._thought_open:
                self.err.write("[thought] ")
                self._thought_open = True
            self.err.write(_content_text(update).translate(SHOWN_TEXT))
            self.err.flush()
        elif kind in ("tool_call", "tool_call_update"):
            call = self.tools.merge(update)
            title = call.get("title", call["toolCallId"])
            self._line(f"[tool] {call.get('kind', 'other')}: {title} ({call['status']})")
        elif kind == "plan":
            self._line("[plan]")
            for entry in plan_entries(update):
                mark = PLAN_MARK.get(entry["status"], "[ ]")
                self._line(f"  {mark} {entry.get('content', '')}")
        elif kind == "usage_update":
            line = _usage_line(update)
            if line:
                self._line(f"[usage] {line}")
        elif kind == "user_message_chunk":
            self._line(f"[user] {_content_text(update)}")

    def decision(self, record: dict[str, Any]) -> None:
        if record["type"] == "permission":
            tool = record.get("toolCall") or {}
            self._line(f"[permission] {tool.get('title', 'tool call')}: "
                       f"{record.get('optionId') or record['outcome']} "
                       f"(--approve {record['policy']})")
        elif not record.get("allowed"):
            self._line(f"[refused] {record['op']} {record['target']}: {record.get('reason')}")

    def notice(self, text: str) -> None:
        self._line(f"[notice] {text}")

    def prompting(self, number: int) -> None:
        pass

    def _end_text(self) -> None:
        if self._text_open:
            self.out.write("\n")
            self.out.flush()
            self._text_open = False

    def turn(self, record: dict[str, Any]) -> None:
        if record["of"] > 1:  # each turn's text on its own lines, then its outcome
            self._end_text()
            self._line(f"[turn {record['turn']}/{record['of']}] "
                       f"{record.get('stopReason') or record['exitReason']} "
                       f"(exit {record['exitCode']})")

    def result(self, record: dict[str, Any]) -> None:
        self._end_text()
        usage = _usage_line(record.get("usage"))
        if usage:
            self._line(f"[usage] {usage}")
        if record.get("error"):
            self._line(f"[error] {error_text(record['error'])}")
        self._line(f"[stop] {record.get('stopReason') or record['exitReason']} "
                   f"(exit {record['exitCode']})")

    async def ask_permission(self, tool_call: dict[str, Any],
                             options: list[dict[str, Any]]) -> str | None:
        # stdout may be a file (`run ... > answer.txt`) while a person sits at the terminal.
        if not sys.stdin.isatty():
            return None
        for line in _question(tool_call, options):
            self._line(line)
        self.err.write(ANSWER_PROMPT)
        self.err.flush()
        return await _read_choice(options)


class QuietEvents:
    """Only the answer: on success, the last turn's agent text on stdout; otherwise nothing
    there and one line on stderr. The exit code tells the outcome."""

    def __init__(self, out: TextIO | None = None, err: TextIO | None = None) -> None:
        self.out, self.err = _Guarded(out or sys.stdout), err or sys.stderr
        self._text: list[str] = []   # the current turn's agent text
        self.answer = ""             # the last finished turn's

    def session(self, record: dict[str, Any]) -> None:
        pass

    def update(self, session_id: str | None, update: dict[str, Any]) -> None:
        if update.get("sessionUpdate") == "agent_message_chunk":
            self._text.append(_content_text(update))

    def decision(self, record: dict[str, Any]) -> None:
        pass

    def notice(self, text: str) -> None:
        self.err.write(f"acp-conductor: {text.translate(SHOWN)}\n")
        self.err.flush()

    def prompting(self, number: int) -> None:
        self._text = []  # a loaded session's replayed history is not this turn's answer

    def turn(self, record: dict[str, Any]) -> None:
        self.answer, self._text = "".join(self._text), []

    def result(self, record: dict[str, Any]) -> None:
        if record["exitCode"] == 0:
            text = self.answer
            self.out.write(text if text.endswith("\n") or not text else text + "\n")
            self.out.flush()
            return
        line = f"acp-conductor: run: {record['exitReason']} (exit {record['exitCode']})"
        error = record.get("error")
        if isinstance(error, dict) and error.get("message"):
            line += f": {error_text(error)}"
        self.err.write(line.translate(SHOWN) + "\n")  # the agent's words: shown, not obeyed
        self.err.flush()

    async def ask_permission(self, tool_call: dict[str, Any],
                             options: list[dict[str, Any]]) -> str | None:
        return None  # quiet never asks (the CLI refuses --approve ask with it)
