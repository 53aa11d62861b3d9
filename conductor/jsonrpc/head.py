"""What can be read of a frame's top level without decoding it: its `id` and `method`.

Used for frames the conductor will not decode (over the size limit, nested too deeply, not
UTF-8), to answer the request (or fail the pending request) they belonged to. Only keys at
the top level count; an `"id"` inside `params` or `result` is not the id.

`HeadScanner` reads a frame fed in pieces of any size, in bounded memory, so an oversized
frame can be scanned as it is skipped: an id written after a 100 MiB `params` is still
found. Strings and nested values are skipped by regular expressions (C speed); the work
done per structural token is bounded by a budget, so a crafted frame cannot stall the
conductor.
"""

from __future__ import annotations

import re

import msgspec
from msgspec import Raw

from conductor.record import Record


class Head(Record, frozen=True):
    id: Raw | None        # the top-level id, when it was within the bytes seen and usable
    has_method: bool      # a top-level "method" key was seen: a request or notification
    id_known: bool        # the id was seen, or the object closed without one
    params_first: bool = False  # top-level params began before any id (SDKs write id first)
    is_batch: bool = False      # a JSON array: its members cannot be answered one by one
    bad_id: bool = False        # an id was present but is not a string, number or null

    @property
    def is_notification(self) -> bool:
        """Surely or (id unseen, params begun) most likely a notification: never answered."""
        if not self.has_method or self.id is not None or self.bad_id:
            return False
        return self.id_known or self.params_first


def read_head(data: bytes | bytearray) -> Head:
    """Scan a (possibly truncated) JSON object for its top-level `id` and `method` keys."""
    scanner = HeadScanner()
    scanner.feed(data)
    return scanner.head()


# Up to an unescaped quote. Possessive quantifiers (3.11): no backtracking state, 3-7x faster
# on escape-dense text.
_STRING_BODY = re.compile(rb'[^"\\]*+(?:\\.[^"\\]*+)*+', re.S)
_NESTED_NEXT = re.compile(rb'["\[\]{}]')  # all that matters below the top level
_SIGNIFICANT = re.compile(rb"[^ \t\r\n]")
_SCALAR = re.compile(rb"[^,\]} \t\r\n]*")
_BOM = frozenset(b"\xef\xbb\xbf")  # no JSON value starts with any of these bytes

# Top-level states
_KEY, _COLON, _VALUE, _AFTER = range(4)
_MAX_KEY = 64        # longer keys are none of the ones we look for
_MAX_ID = 16 * 1024  # an id longer than this is not kept (it would be echoed back)


class HeadScanner:
    """Tracks a frame's top-level `id` and `method` across pieces fed in order.

    Memory is bounded (the id and one key at most); `done` says nothing more can be learnt.
    """

    BUDGET = 1 << 18  # tokens (strings, brackets, keys) per frame before giving up

    def __init__(self, budget: int = BUDGET) -> None:
        self.done = False
        self._budget = budget
        self._depth = 0
        self._state = _KEY
        self._key: bytes | None = None
        self._in_string = False
        self._odd_backslashes = False  # the last piece ended on an escaping backslash
        self._in_scalar = False
        self._text: bytearray | None = None  # the key or id being read, across pieces
        self._text_limit = 0
        self._id: Raw | None = None
        self._id_known = self._has_method = self._params_first = False
        self._is_batch = self._bad_id = self._answer_keys = False

    def head(self) -> Head:
        return Head(self._id, self._has_method, self._id_known, self._params_first,
                    self._is_batch, self._bad_id)

    def feed(self, data: bytes | bytearray, start: int = 0, end: int | None = None) -> None:
        """Scan `data[start:end]`, the next piece of the frame."""
        i, n = start, len(data) if end is None else end
        while i < n and not self.done:
            self._budget -= 1
            if self._budget < 0:
                self.done = True  # gave up: what was found stands, the rest is unknown
                return
            if self._in_string:
                i = self._string(data, i, n)
                continue
            if self._in_scalar:
                m = _SCALAR.match(data, i, n)
                assert m is not None  # the pattern matches the empty string
                j = m.end()
                self._collect(data, i, j)
                if j == n:
                    return  # the number may go on in the next piece
                self._in_scalar = False
                self._value_done(self._take_text())
                i = j
                continue
            m = (_NESTED_NEXT if self._depth >= 2 else _SIGNIFICANT).search(data, i, n)
            if m is None:
                return
            i = m.start()
            c = data[i]
            i += 1
            if self._depth >= 2:
                if c == 0x22:
                    self._start_text(None)
                elif c in b"{[":
                    self._depth += 1
                elif self._depth == 2:  # a top-level value ends
                    self._depth = 1
                    self._value_done(None)
                else:
                    self._depth -= 1
            elif self._depth == 0:
                if c in _BOM:
                    continue  # a byte order mark before the value: skipped, as decode does
                if c == 0x7B:
                    self._depth, self._state = 1, _KEY
                else:
                    self._is_batch = c == 0x5B
                    self.done = True
            else:
                self._top(c)

    def _string(self, data: bytes | bytearray, i: int, n: int) -> int:
        """Inside a string from `i`: where scanning goes on (n when the piece ends in it).

        A quote with no backslash before it ends the string: `find` keeps the common case
        at memchr speed however long the string is. Where backslashes are in the way, the
        regex engine walks the escapes (in C, never byte by byte in Python).
        """
        if self._odd_backslashes:  # the last piece ended on a backslash: this byte is escaped
            self._odd_backslashes = False
            self._collect(data, i, i + 1)
            return i + 1
        q = data.find(b'"', i, n)
        if q >= 0 and (q == i or data[q - 1] != 0x5C):
            end = q
        elif q < 0 and data[n - 1] != 0x5C:
            self._collect(data, i, n)
            return n  # the string goes on in the next piece
        else:
            m = _STRING_BODY.match(data, i, n)
            assert m is not None  # the pattern matches the empty string
            end = m.end()
            if end == n or data[end] == 0x5C:  # the piece ends inside (maybe on a backslash)
                self._collect(data, i, n)
                self._odd_backslashes = end < n
                return n
        self._collect(data, i, end)
        self._in_string = False
        self._string_done()
        return end + 1

    def _top(self, c: int) -> None:
        """One significant byte at the top level of the object."""
        state = self._state
        if c == 0x7D and state in (_KEY, _AFTER):  # }: the object ends
            self._id_known = True  # whatever was not seen is absent
            self._depth = 0
            self.done = True
        elif state == _KEY and c == 0x22:
            self._start_text(_MAX_KEY)
        elif state == _COLON and c == 0x3A:
            self._state = _VALUE
            key = self._key
            if key == b"method":
                self._has_method = True
            elif key == b"params" and not self._id_known:
                self._params_first = True
            elif key in (b"result", b"error"):
                self._answer_keys = True
        elif state == _VALUE:
            wanted = _MAX_ID if self._key == b"id" else None
            if c == 0x22:
                self._start_text(wanted)
                if self._text is not None:
                    self._text += b'"'
            elif c in b"{[":
                self._depth = 2
            else:
                self._in_scalar = True
                self._text, self._text_limit = (bytearray([c]), _MAX_ID) if wanted else (None, 0)
        elif state == _AFTER and c == 0x2C:
            self._state, self._key = _KEY, None
        else:
            self.done = True  # not JSON we can follow: stop with what is known

    def _start_text(self, limit: int | None) -> None:
        self._in_string = True
        self._text = None if limit is None else bytearray()
        self._text_limit = limit or 0

    def _collect(self, data: bytes | bytearray, start: int, end: int) -> None:
        text = self._text
        if text is None:
            return
        if len(text) + end - start > self._text_limit:
            self._text = None  # too long to be anything we look for (or to echo back)
            return
        text += data[start:end]

    def _take_text(self) -> bytes | None:
        text, self._text = self._text, None
        return None if text is None else bytes(text)

    def _string_done(self) -> None:
        text = self._take_text()
        if self._depth >= 2:
            return
        if self._state == _KEY:
            self._key = _key_name(text)
            self._state = _COLON
        else:
            self._value_done(None if text is None else text + b'"')

    def _value_done(self, text: bytes | None) -> None:
        """A top-level value ended; `text` is its JSON text when it was the id's and kept."""
        if self._key == b"id":
            self._id_known = True
            if text is not None and _usable_id(text):
                self._id = Raw(text)
            else:  # structured, not JSON, or too long to keep: answered with id null
                self._bad_id = True
        self._state = _AFTER
        if self._id_known and (self._has_method or self._answer_keys):
            self.done = True  # a request or an answer, with its id: all that is wanted


def _key_name(text: bytes | None) -> bytes | None:
    if text is None or b"\\" not in text:
        return text
    try:  # an escaped key ("\u0069d") names the same member as a plain one
        name = msgspec.json.decode(b'"' + text + b'"')
    except msgspec.DecodeError:
        return None
    return name.encode() if isinstance(name, str) else None


def _usable_id(text: bytes) -> bool:
    """A string, number or null that decodes (so it is valid JSON and UTF-8 to echo)."""
    try:
        value = msgspec.json.decode(text)
    except msgspec.DecodeError:
        return False
    return value is None or (isinstance(value, str | int | float)
                             and not isinstance(value, bool))
