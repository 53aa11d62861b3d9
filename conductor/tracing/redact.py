"""Trace redaction: secrets (`secret_env` values, `[conductor] redact` patterns,
Authorization headers, the values of MCP servers' `env` and `headers` entries, a URL's
credentials) never reach a trace file, however the JSON spells them."""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, Any

import msgspec

if TYPE_CHECKING:
    from collections.abc import Iterable

REDACTED = "[redacted]"

_AUTH_JSON_KEY = re.compile(rb'("(?i:authorization)"\s*:\s*)"(?:[^"\\]|\\.)*"')
_AUTH_HEADER_TEXT = re.compile(
    rb'((?i:authorization)\s*:\s*)(?:(?i:bearer|basic|token)\s+)?[^\s"\\,}]+')
# The same two forms inside a decoded string (a tool's output that is itself JSON, a request
# dump): in the line their quotes are escaped, and neither line-level regex sees them.
_AUTH_IN_TEXT = re.compile(r'((?i:authorization)"?\s*:\s*)(?:("(?:[^"\\]|\\.)*")|'
                           r'(?:(?i:bearer|basic|token)\s+)?[^\s"\\,}]+)')
# The MCP bridge's shim token, handed to the agent in an MCP server's `env` (bridge.TOKEN_ENV;
# spelt out here: tracing sits below the bridge).
_SHIM_TOKEN = b"ACP_CONDUCTOR_MCP_TOKEN"
_SECRET_NAMES = ("authorization", _SHIM_TOKEN.decode().lower())
# A `{"name": ..., "value": ...}` entry (an MCP header, an env entry) that may hold one.
_NAMED_SECRET = re.compile(rb'"name"\s*:\s*"(?i:authorization|ACP_CONDUCTOR_MCP_TOKEN)"')
# Lists of such entries whose every value is hidden: an MCP server's `env` and `headers`
# (ACP's EnvVariable / HttpHeader; `terminal/create` has an `env` too) carry its tokens
# under any name (GITHUB_TOKEN, X-Api-Key), and nothing tells a token from a log level.
# The same as objects (`{"GITHUB_TOKEN": "..."}`: v1's terminal auth method `env`).
_SECRET_LISTS = frozenset(("env", "headers"))
_SECRET_LIST = re.compile(rb'"(?:env|headers)"\s*:\s*[\[{]')
# A JSON string in a line without backslashes: nothing inside it can be a quote.
_RAW_STRING = re.compile(rb'"[^"]*"')
# Syntax that makes a match depend on what is around it (anchors, lookarounds; `^` in a
# class too, to be safe): such a pattern may match a string but not the line holding it.
_CONTEXT = re.compile(r"[\^$]|\\[AZ]|\(\?<?[=!]")
# A URL's credentials: its user information (`https://user:token@host`, as git remotes and
# MCP server urls carry them), and query parameters named like one (`?access_token=...`).
# Neither class crosses a quote or a backslash: a match stays inside one JSON string.
_URL_USERINFO = re.compile(rb'://[^\s/?#@"\\]+@')  # (a literal first: a fast scan)
_QUERY_SECRETS = (b"token", b"key", b"secret", b"password", b"passwd", b"sig", b"signature",
                  b"auth", b"credential")
_URL_QUERY_SECRET = re.compile(
    rb'([?&][A-Za-z0-9_.-]*(?i:' + b"|".join(_QUERY_SECRETS) + rb')=)[^&#\s"\\]+')
_MIN_SECRET = 4  # shorter values would blank out ordinary text
_CLEAN_MAX, _CLEAN_MAX_LEN = 4096, 64
# The same two, for text (a transcript's record of a resource's URI)
_TEXT_USERINFO = re.compile(_URL_USERINFO.pattern.decode())
_TEXT_QUERY_SECRET = re.compile(_URL_QUERY_SECRET.pattern.decode())


def redact_url(text: str) -> str:
    """`text` (a URI) without its credentials: user information and query parameters named
    like one, as traces hide them."""
    text = _TEXT_USERINFO.sub("://" + REDACTED + "@", text)
    return _TEXT_QUERY_SECRET.sub(r"\1" + REDACTED, text)


class Redactor:
    """Replaces secrets in an encoded trace line, keeping it valid JSON.

    A line without a backslash is redacted byte for byte inside its strings (keys too): no
    escape can hide a character from the match, so the bytes are the text. Only strings:
    a secret that also spells a literal or a number ("true", "1234") must not break the
    line's JSON. A line with escapes (`\\u0073k-...`, `\\/`) is decoded, every string
    redacted as text, and re-encoded: a reader of the trace sees decoded strings, so that is
    what must be clean. Numbers and key order survive; a number's spelling may not (only in
    the trace: the wire is never touched).
    """

    def __init__(self, secrets: Iterable[str] = (), patterns: Iterable[str] = ()) -> None:
        # A value read from a file keeps its final newline; what is sent often has none.
        values = sorted({v for s in secrets for v in (s, s.strip()) if len(v) >= _MIN_SECRET},
                        key=len, reverse=True)
        self._texts = values
        # the same values as they appear in a line without escapes (raw UTF-8)
        self._secrets = [v.encode() for v in values]
        # Text patterns only, as `[conductor] redact` checked them: a bytes copy would refuse
        # `(?u)` and `\N{...}`, and its `.` and `\w` would see bytes, not characters.
        self._text_patterns = [re.compile(p) for p in patterns]
        # A pattern found nowhere in the whole line is in none of its strings, unless it
        # looks at what is around its match (`^`, `$`, lookarounds): those see each string.
        self._line_patterns = [p for p in self._text_patterns if not _CONTEXT.search(p.pattern)]
        self._every_string = len(self._line_patterns) < len(self._text_patterns)
        # Keys and short values repeat on every line ("jsonrpc", "sessionUpdate", ids): a
        # string found clean once is clean forever, so remember a bounded number of them.
        self._clean: set[str] = set()

    def __call__(self, line: bytes) -> bytes:
        """The line with secrets replaced.

        Raises:
            ValueError: the line has escapes but cannot be decoded (too deep, bad UTF-8, a
                number out of range), so it cannot be checked; leave its payload out.
        """
        if b"\\" in line:
            try:
                tree = msgspec.json.decode(line)
            except (msgspec.DecodeError, RecursionError):
                raise ValueError("not decodable, so not checked for secrets") from None
            line = msgspec.json.encode(self._redact_tree(tree))
        elif self._mentions_secret(line):
            line = _RAW_STRING.sub(self._redact_raw_string, line)
        # Re-encoded lines are canonical (msgspec escapes only quotes, backslashes and control
        # characters), and these regexes match whole JSON strings or stop at a backslash.
        # Cheap tests first (one lowered copy of the line): the regexes cost ~10x more.
        lowered = line.lower()
        authorization = b"authorization" in lowered
        if authorization:
            line = _AUTH_JSON_KEY.sub(rb'\1"' + REDACTED.encode() + rb'"', line)
            line = _AUTH_HEADER_TEXT.sub(rb"\1" + REDACTED.encode(), line)
        # Single characters first (memchr), then "://": a long line without a URL costs a
        # scan only if it has an `@`, or both a `?` and a `=`, in it.
        userinfo, query = b"@" in line, b"?" in line and b"=" in line
        if (userinfo or query) and b"://" in line:
            if userinfo:
                line = _URL_USERINFO.sub(b"://" + REDACTED.encode() + b"@", line)
            if query:
                line = _URL_QUERY_SECRET.sub(rb"\1" + REDACTED.encode(), line)
        if ((authorization or _SHIM_TOKEN in line) and _NAMED_SECRET.search(line)) or \
                _lists_secrets(line):
            line = _redact_named_values(line)
        return line

    def _mentions_secret(self, line: bytes) -> bool:
        """Whether a line without escapes may hold a secret anywhere, strings or not. Only
        its strings are then rewritten: a secret that also spells a literal, a number or part
        of the trace's own fields ("true", "1234") must not break the line's JSON."""
        if self._every_string or any(form in line for form in self._secrets):
            return True
        if not self._line_patterns:
            return False
        text = line.decode("utf-8", "surrogateescape")
        return any(pattern.search(text) for pattern in self._line_patterns)

    def _redact_raw_string(self, match: re.Match[bytes]) -> bytes:
        # Inside the quotes only: a pattern such as `password=\S+` must not eat the closing
        # one (the line would stop being JSON). Without a backslash in the line the bytes
        # are the text, so it is matched as the decoded path matches it.
        text = match[0][1:-1].decode("utf-8", "surrogateescape")
        out = self._redact_text(text)
        if out is text:
            return match[0]
        return b'"' + out.encode("utf-8", "surrogateescape") + b'"'

    def _redact_secrets(self, text: str) -> str:
        # Every secret and pattern searches the original text and the spans they find are
        # merged: replaced one after another, a short secret inside a key would cut the
        # pattern's match short, and a value overlapping another would leave its tail.
        spans: list[tuple[int, int]] = []
        for secret in self._texts:
            at = text.find(secret)
            while at >= 0:
                spans.append((at, at + len(secret)))
                at = text.find(secret, at + 1)
        for pattern in self._text_patterns:
            spans.extend(m.span() for m in pattern.finditer(text) if m.end() > m.start())
        if not spans:
            return text
        out: list[str] = []
        done = 0
        for start, end in sorted(spans):
            if start >= done:
                out.append(text[done:start])
                out.append(REDACTED)
            done = max(done, end)
        out.append(text[done:])
        return "".join(out)

    def _redact_text(self, text: str) -> str:
        if text in self._clean:
            return text
        out = self._redact_secrets(text)
        # both forms have a colon; lower() then: a case-blind regex scan costs ~5x more
        if ":" in out and "authorization" in out.lower():
            out = _AUTH_IN_TEXT.sub(_auth_value, out)
        if out == text and len(text) <= _CLEAN_MAX_LEN:
            if len(self._clean) >= _CLEAN_MAX:
                self._clean.clear()
            self._clean.add(text)
            return text
        return out

    def _redact_tree(self, root: Any) -> Any:
        """Every string in a decoded JSON value, keys included, redacted in place.

        Iterative, so the walk adds nothing to the routing task's stack (msgspec already
        refused what is too deep to decode).
        """
        if isinstance(root, str):
            return self._redact_text(root)
        stack = [root]
        while stack:
            node = stack.pop()
            if isinstance(node, dict):
                renamed = False
                for key, value in node.items():
                    if isinstance(value, str):
                        node[key] = self._redact_text(value)
                    elif isinstance(value, (dict, list)):
                        stack.append(value)
                    renamed = renamed or self._redact_text(key) != key
                if renamed:  # rare: rebuild in order (two keys may now collide; one is kept)
                    items = list(node.items())
                    node.clear()
                    node.update((self._redact_text(k), v) for k, v in items)
            elif isinstance(node, list):
                for i, value in enumerate(node):
                    if isinstance(value, str):
                        node[i] = self._redact_text(value)
                    elif isinstance(value, (dict, list)):
                        stack.append(value)
        return root


def _lists_secrets(line: bytes) -> bool:
    """Whether `line` has an `env` or `headers` list or object. In a short line two
    substring tests cost less than the regex, which stops at every quote; in a long one
    the regex, one scan, costs less than two."""
    if len(line) < 4096 and b'"env"' not in line and b'"headers"' not in line:
        return False
    return _SECRET_LIST.search(line) is not None


def _auth_value(match: re.Match[str]) -> str:
    return match[1] + (f'"{REDACTED}"' if match[2] else REDACTED)


def _redact_named_values(line: bytes) -> bytes:
    """The `value` of every `{"name": "Authorization" | shim token, "value": ...}` entry,
    of every `{"name": ..., "value": ...}` entry in an `env` or `headers` list, and every
    string of an `env` or `headers` object, redacted, whatever the order of the entry's
    fields (JSON objects are unordered: `value` may come first, `_meta` between them).

    Raises:
        ValueError: the line cannot be decoded, so it cannot be checked.
    """
    try:
        root = msgspec.json.decode(line)
    except (msgspec.DecodeError, RecursionError):
        raise ValueError("not decodable, so not checked for secrets") from None
    stack: list[tuple[Any, bool]] = [(root, False)]  # (node, is it an entry of a secret list)
    while stack:
        node, listed = stack.pop()
        if isinstance(node, dict):
            name = node.get("name")
            if isinstance(name, str) and isinstance(node.get("value"), str) and \
                    (listed or name.lower() in _SECRET_NAMES):
                node["value"] = REDACTED
            for key, value in node.items():
                if key in _SECRET_LISTS and isinstance(value, dict):
                    for field, text in value.items():
                        if isinstance(text, str):
                            value[field] = REDACTED
            stack.extend((v, False) for v in node.values() if isinstance(v, dict))
            stack.extend((v, k in _SECRET_LISTS) for k, v in node.items() if isinstance(v, list))
        elif isinstance(node, list):
            stack.extend((v, listed and isinstance(v, dict)) for v in node
                         if isinstance(v, (dict, list)))
    return msgspec.json.encode(root)
