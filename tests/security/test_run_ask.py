"""`--approve ask`: what the person at the terminal is shown, and what their answer selects.

stdin is a real pseudo-terminal (the question is only asked on one); stderr is captured.
"""

from __future__ import annotations

import io
import os
import pty
import sys
from typing import TYPE_CHECKING, Any

import anyio
import pytest

from conductor.editor.render import PlainEvents

if TYPE_CHECKING:
    from collections.abc import Iterator

OPTIONS = [{"optionId": "yes", "name": "Allow", "kind": "allow_once"},
           {"optionId": "no", "name": "Reject", "kind": "reject_once"}]


@pytest.fixture
def terminal(monkeypatch: pytest.MonkeyPatch) -> Iterator[int]:
    """stdin on a pseudo-terminal; yields the fd the person types into."""
    typed, tty = pty.openpty()
    stdin = os.fdopen(tty, "r", closefd=False)
    monkeypatch.setattr(sys, "stdin", stdin)
    yield typed
    stdin.close()
    os.close(tty)
    os.close(typed)


async def ask(typed: int, answer: str, tool: dict[str, Any],
              options: list[dict[str, Any]]) -> tuple[str | None, str]:
    err = io.StringIO()
    os.write(typed, answer.encode() + b"\n")
    with anyio.fail_after(5):
        chosen = await PlainEvents(io.StringIO(), err).ask_permission(tool, options)
    return chosen, err.getvalue()


async def test_an_answer_that_only_looks_like_a_number_cancels(terminal: int) -> None:
    chosen, _ = await ask(terminal, "\N{SUPERSCRIPT TWO}", {"title": "edit"}, OPTIONS)
    assert chosen is None


async def test_the_agents_words_in_the_question_cannot_move_the_cursor_or_recolour(
        terminal: int) -> None:
    # Else an agent could repaint the question: the person approves what they did not see.
    tool = {"title": "rm -rf ~\r\x1b[2K\x1b[1Aread README.md", "kind": "read\x1b[8m"}
    options = [{"optionId": "yes", "name": "Allow\x9b2K", "kind": "allow_once"}]
    _, shown = await ask(terminal, "", tool, options)
    assert not any((ord(c) < 32 and c != "\n") or 0x7f <= ord(c) < 0xa0 for c in shown), shown
    assert "rm -rf ~" in shown and "read README.md" in shown


async def test_the_agents_words_in_the_question_cannot_reorder_themselves(
        terminal: int) -> None:
    # Unicode direction overrides ("Trojan Source"): a terminal that honours them would show
    # `rm -rf ~` written backwards after harmless words, and the person approve that.
    tool = {"title": "read README.md \u202e~ fr- mr\u202c \u2066x\u2069", "kind": "read"}
    options = [{"optionId": "yes", "name": "Allow\u200f", "kind": "allow_once"}]
    _, shown = await ask(terminal, "", tool, options)
    assert not any(c in shown for c in "\u202e\u202c\u2066\u2069\u200f"), ascii(shown)
    assert "read README.md" in shown


def test_the_plain_view_shows_the_agents_control_characters_instead_of_obeying_them() -> None:
    # While a question waits for its answer, updates keep coming: an ESC in a tool title
    # or a thought could move the cursor up and rewrite the question on the terminal.
    err = io.StringIO()
    plain = PlainEvents(io.StringIO(), err)
    plain.update("s", {"sessionUpdate": "agent_thought_chunk",
                       "content": {"type": "text", "text": "thinking\n\x1b[3A\x1b[J"}})
    plain.update("s", {"sessionUpdate": "tool_call", "toolCallId": "t1", "kind": "read",
                       "title": "\x1b[2A\x1b[2K1. Allow: read README.md", "status": "pending"})
    plain.update("s", {"sessionUpdate": "plan",
                       "entries": [{"content": "a\rb", "status": "pending"}]})
    shown = err.getvalue()
    assert not any((ord(c) < 32 and c != "\n") or 0x7f <= ord(c) < 0xa0 for c in shown), shown
    assert "thinking\n" in shown and "read README.md" in shown


def test_the_live_view_shows_the_agents_control_characters_instead_of_obeying_them() -> None:
    from rich.console import Console

    from conductor.editor.live import RichEvents

    screen = io.StringIO()
    live = RichEvents(Console(file=screen, force_terminal=True, width=100),
                      Console(file=screen, force_terminal=True, width=100))
    live.update("s", {"sessionUpdate": "agent_message_chunk",
                      "content": {"type": "text", "text": "hi\n\x1b]0;pwned\x07"}})
    live.update("s", {"sessionUpdate": "tool_call", "toolCallId": "t1", "kind": "read",
                      "title": "\x1b[2A\x1b[2Kread README.md", "status": "completed"})
    live.update("s", {"sessionUpdate": "plan",
                      "entries": [{"content": "a\x1b[8mb", "status": "pending"}]})
    live.decision({"type": "permission", "toolCall": {"title": "x\x1b[5Ay"}, "policy": "none",
                   "outcome": "cancelled", "optionId": None, "optionKind": None})
    live.result({"exitCode": 0, "exitReason": "end_turn", "stopReason": "end_turn",
                 "durationMs": 1.0, "usage": None})
    shown = screen.getvalue()
    for sent in ("\x1b]0;", "\x1b[2A", "\x1b[8m", "\x1b[5A"):
        assert sent not in shown, repr(shown)
    assert "read README.md" in shown


_HOSTILE_ERROR = {"code": -32603, "message": "failed \x1b]52;c;cm0gLXJmIH4=\x07\x1b[2J "
                                              "\u202eevil"}


def test_the_error_a_run_ends_with_is_shown_not_obeyed_in_every_view() -> None:
    # The agent writes the error a turn ends with: an ESC in it could write the clipboard
    # or clear the screen, and a direction override reverse what follows it.
    from rich.console import Console

    from conductor.editor.live import RichEvents
    from conductor.editor.render import QuietEvents

    record = {"exitCode": 1, "exitReason": "error", "durationMs": 1.0, "usage": None,
              "error": _HOSTILE_ERROR}
    live_err = io.StringIO()
    live = RichEvents(Console(file=io.StringIO(), force_terminal=True, width=100),
                      Console(file=live_err, force_terminal=True, width=100))
    live.result(record)
    quiet_err = io.StringIO()
    QuietEvents(io.StringIO(), quiet_err).result(record)
    for shown in (live_err.getvalue(), quiet_err.getvalue()):
        for sent in ("\x1b]52", "\x1b[2J", "\u202e"):
            assert sent not in shown, repr(shown)
        assert "failed" in shown and "evil" in shown
