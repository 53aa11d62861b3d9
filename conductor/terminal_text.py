"""Text from a component (an agent's words, a tool title, stderr, a method name) made fit
for a person's terminal: shown, never obeyed.

An ESC, CR or BEL in it would reach the terminal (repaint a permission question, so the
person approves what they did not see; retitle the window; write the clipboard), and a
Unicode direction override would make a terminal that honours it show `rm -rf ~`
backwards after harmless words ("Trojan Source"). Each such character becomes one visible
one, so the text keeps its length and styles their places.
"""

from __future__ import annotations

from typing import Final

_BIDI: Final = (0x061C, 0x200E, 0x200F, *range(0x202A, 0x202F), *range(0x2066, 0x206A))

# C0 controls as their Unicode pictures (␛, ␍...), DEL as ␡, C1 controls and direction
# controls as �.
SHOWN: Final[dict[int, int]] = {**{c: 0x2400 + c for c in range(0x20)}, 0x7F: 0x2421,
                                **{c: 0xFFFD for c in range(0x80, 0xA0)},
                                **{c: 0xFFFD for c in _BIDI}}
# The same for running text (an agent's thoughts), whose lines and tabs are kept.
SHOWN_TEXT: Final[dict[int, int]] = {c: v for c, v in SHOWN.items() if c not in (0x09, 0x0A)}


def shown(value: object, *, text: bool = False) -> str:
    """`value` as a string fit for the terminal (`text`: running text, lines kept)."""
    return str(value).translate(SHOWN_TEXT if text else SHOWN)
