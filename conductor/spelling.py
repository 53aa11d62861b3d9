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

    match = difflib.get_close_matches(word, list(choices), n=1, cutoff=0.6)
    return f"did you mean {match[0]!r}?" if match else None
