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
