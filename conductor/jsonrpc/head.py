"""What can be read of a frame from its first bytes alone: its top-level `id` and `method`.

Used for a frame over the size limit, which is skipped without being buffered: the
conductor still wants to answer the request (or fail the pending request) it belonged to.
Only keys at the top level count; an `"id"` inside `params` or `result` is not the id.
"""

from __future__ import annotations

from dataclasses import dataclass

from msgspec import Raw

_SCALAR_END = frozenset(b",}] \t\r\n")


@dataclass(frozen=True, slots=True)
class Head:
    id: Raw | None        # the top-level id, when it was within the bytes seen
    has_method: bool      # a top-level "method" key was seen: a request or notification
    id_known: bool        # the id was seen, or the object closed without one
    params_first: bool = False  # top-level params began before any id (SDKs write id first)
    is_batch: bool = False      # a JSON array: its members cannot be answered one by one

    @property
    def is_notification(self) -> bool:
        """Surely or (id unseen, params begun) most likely a notification: never answered."""
        if not self.has_method or self.id is not None:
            return False
        return self.id_known or self.params_first


def read_head(data: bytes) -> Head:
    """Scan a (possibly truncated) JSON object for its top-level `id` and `method` keys."""
    if data.lstrip()[:1] == b"[":
        return Head(None, False, False, is_batch=True)
    ident: Raw | None = None
    has_method = id_known = params_first = False
    depth = 0
    i, n = 0, len(data)
    expect_key = False
    key: bytes | None = None
    while i < n:
        c = data[i]
        if c == 0x22:  # a string: a key at depth 1, or a value
            end = _string_end(data, i)
            if end < 0:
                break
            text = data[i + 1:end]
            if depth == 1 and expect_key:
                key, expect_key = text, False
            elif depth == 1 and key == b"id":
                ident, id_known = Raw(data[i:end + 1]), True
            i = end + 1
            continue
        if c in b"{[":
            depth += 1
            expect_key = c == 0x7B and depth == 1
            if depth == 2 and key == b"method":
                has_method = True
        elif c in b"}]":
            depth -= 1
            if depth == 0:
                id_known = True  # the object ended: whatever was not seen is absent
                break
        elif c == 0x2C and depth == 1:  # ,
            expect_key, key = True, None
        elif c == 0x3A and depth == 1:  # :
            if key == b"method":
                has_method = True
            elif key == b"params" and not id_known:
                params_first = True
        elif depth == 1 and key == b"id" and c not in b" \t\r\n":
            end = i
            while end < n and data[end] not in _SCALAR_END:
                end += 1
            if end == n:
                break  # the number may go on past what we have
            ident, id_known = Raw(data[i:end]), True
            i = end
            continue
        i += 1
    return Head(ident, has_method, id_known, params_first)


def _string_end(data: bytes, start: int) -> int:
    i = start + 1
    while i < len(data):
        c = data[i]
        if c == 0x5C:  # backslash
            i += 2
            continue
        if c == 0x22:
            return i
        i += 1
    return -1
