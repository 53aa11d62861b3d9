"""Byte-faithful JSON for test components: the raw text of each top-level member.

Test components must forward and echo payloads without re-encoding them, or they would hide
the very fidelity bugs the tests look for. `json.JSONDecoder.raw_decode` reports where each
value ends, which is enough to slice the exact text out of a line.
"""

from __future__ import annotations

import json

_decoder = json.JSONDecoder()
_WS = " \t\r\n"


def _skip(text: str, i: int) -> int:
    while i < len(text) and text[i] in _WS:
        i += 1
    return i


def members(text: str) -> dict[str, str]:
    """Top-level key -> the exact text of its value. Raises ValueError for non-objects."""
    i = _skip(text, 0)
    if text[i : i + 1] != "{":
        raise ValueError("not a JSON object")
    out: dict[str, str] = {}
    i = _skip(text, i + 1)
    if text[i : i + 1] == "}":
        return out
    while True:
        key, i = _decoder.raw_decode(text, i)
        i = _skip(text, i)
        if text[i : i + 1] != ":":
            raise ValueError("expected ':'")
        i = _skip(text, i + 1)
        _, end = _decoder.raw_decode(text, i)
        out[key] = text[i:end]
        i = _skip(text, end)
        if text[i : i + 1] == ",":
            i = _skip(text, i + 1)
        elif text[i : i + 1] == "}":
            return out
        else:
            raise ValueError("expected ',' or '}'")


def value(raw: str | None) -> object:
    return None if raw is None else json.loads(raw)
