"""The exit-code tables, rendered from their one definition (`ExitCode`, `RunExit`) for
`--help` and for the docs (README.md and docs/run.md carry `markdown_table` output between
`exit-codes` markers; a test keeps them equal)."""

from __future__ import annotations

import re
import textwrap
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    import enum
    from collections.abc import Iterable


class _Code(Protocol):
    @property
    def value(self) -> int: ...

    meaning: str


def _rows(codes: Iterable[_Code]) -> list[tuple[str, str]]:
    return [(str(code.value), code.meaning) for code in codes]


def epilog(title: str, codes: Iterable[_Code]) -> str:
    """Plain text for a click epilog (`\\b` keeps click from re-wrapping it)."""
    lines = ["\b", f"{title}:"]
    for code, meaning in _rows(codes):
        plain = re.sub(r"`([^`]*)`", r"\1", meaning)
        lines += textwrap.wrap(plain, 78, initial_indent=f"  {code:<4} ",
                               subsequent_indent=" " * 7)
    return "\n".join(lines) + "\n"


def markdown_table(codes: Iterable[_Code]) -> str:
    lines = ["| code | meaning |", "| --- | --- |"]
    lines += [f"| {code} | {meaning} |" for code, meaning in _rows(codes)]
    return "\n".join(lines) + "\n"


def all_tables() -> dict[str, type[enum.IntEnum]]:
    """Every table by the marker name the docs use."""
    from conductor.errors import ExitCode
    from conductor.headless import RunExit

    return {"conductor": ExitCode, "run": RunExit}
