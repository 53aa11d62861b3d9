"""The exit-code tables, rendered from their one definition (`ExitCode`, `RunExit`) for
`--help` and for the docs (README.md and docs/run.md carry `markdown_table` output between
`exit-codes` markers; a test keeps them equal)."""

from __future__ import annotations

import re
import sys
import textwrap
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
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


def all_tables() -> dict[str, Iterable[_Code]]:
    """Every table by the marker name the docs use."""
    from conductor.editor.turn import RunExit
    from conductor.errors import ExitCode

    return {"conductor": ExitCode, "run": RunExit}


DOCS = ("README.md", "docs/run.md")
_BLOCK = re.compile(r"(<!-- exit-codes:(\w+) -->\n)(.*?)(<!-- /exit-codes -->)", re.S)


def synced(text: str) -> str:
    """`text` with every marked exit-code table rendered afresh from its definition."""
    tables = all_tables()
    return _BLOCK.sub(lambda m: m.group(1) + markdown_table(tables[m.group(2)]) + m.group(4),
                      text)


def main(argv: list[str]) -> int:
    """`python -m conductor.cli.exits [--write] ROOT`: check (or rewrite) the docs' tables."""
    from pathlib import Path

    write = "--write" in argv
    root = Path(next((a for a in argv if not a.startswith("--")), "."))
    stale = []
    for name in DOCS:
        path = root / name
        text = path.read_text(encoding="utf-8")
        if synced(text) != text:
            stale.append(name)
            if write:
                path.write_text(synced(text), encoding="utf-8")
    if stale and not write:
        sys.stderr.write(f"exit-code tables out of date in {', '.join(stale)}; "
                         "run: python -m conductor.cli.exits --write\n")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
