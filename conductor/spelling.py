"""`did you mean ...?` for a misspelt name: a key, a command, a proxy, a method.

Apart from `conductor.validation` (pydantic's errors) so that code which only needs the
suggestion does not import pydantic.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from collections.abc import Iterable


def did_you_mean(word: str, choices: Iterable[str]) -> str | None:
    """`did you mean 'command'?` when one of `choices` is close to `word`."""
    import difflib  # here: only a mistake needs it, and the plugin API imports this module

    folded = {choice.lower(): choice for choice in choices}  # `COMMAND` means `command`
    matches = difflib.get_close_matches(word.lower(), list(folded), n=3, cutoff=0.6)
    # An abbreviation means the word it shortens (`cmd`: `command`), not one merely near by
    # its letters (`cwd`); a near miss (`restarts`: `restart`) is still the nearest.
    near = matches[:1] if matches and _ratio(word.lower(), matches[0]) >= 0.8 else []
    shortened = [m for m in matches if _letters_in_order(word.lower(), m)]
    best = (near or shortened or matches)[:1]
    return f"did you mean {folded[best[0]]!r}?" if best else None


def _ratio(a: str, b: str) -> float:
    import difflib

    return difflib.SequenceMatcher(None, a, b).ratio()


def _letters_in_order(short: str, word: str) -> bool:
    letters = iter(word)
    return all(letter in letters for letter in short)
