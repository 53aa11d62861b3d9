"""A passthrough proxy built for speed, to show what a proxy process costs apart from JSON.

Same behaviour as proxies/acp_conductor_proxies/passthrough_stdio.py (the readable
reference, which decodes every message fully with `json`), but only the envelope is decoded:
payloads stay msgspec.Raw and cross untouched, and every frame answerable from one read goes
out in one write.

It speaks both proxy dialects of the successor envelope, so that the benchmark can put
the same proxy process behind every conductor:
- ours and the spec's: `_proxy/initialize`, then `_proxy/successor` in both directions;
- the older one (@thinkwell/conductor): plain `initialize` carrying `_meta.proxy: true`,
  answered with `_meta.proxy: true`, then `_proxy/successor/request` and
  `_proxy/successor/notification`.
The dialect is the one the proxy was initialized in.
"""

from __future__ import annotations

import itertools
import os
import sys

import msgspec
from msgspec import UNSET, Raw, UnsetType

SUCCESSOR = "_proxy/successor"
OLD_REQUEST = "_proxy/successor/request"
OLD_NOTIFICATION = "_proxy/successor/notification"
WRAPPED = frozenset({SUCCESSOR, OLD_REQUEST, OLD_NOTIFICATION})


class Message(msgspec.Struct):  # UNSET members are left out; "jsonrpc" always written
    jsonrpc: str = "2.0"
    id: Raw | UnsetType = UNSET
    method: str | UnsetType = UNSET
    params: Raw | UnsetType = UNSET
    result: Raw | UnsetType = UNSET
    error: Raw | UnsetType = UNSET


class Inner(msgspec.Struct, omit_defaults=True):
    method: str
    params: Raw | UnsetType = UNSET


_decode = msgspec.json.Decoder(Message).decode
_decode_inner = msgspec.json.Decoder(Inner).decode
_encoder = msgspec.json.Encoder()


def accept_proxy_role(result: Raw) -> Raw:
    """The older dialect's initialize answer says `_meta.proxy: true` (once per chain)."""
    body = msgspec.json.decode(result)
    if isinstance(body, dict):
        meta = body.get("_meta")
        body["_meta"] = {**(meta if isinstance(meta, dict) else {}), "proxy": True}
    return Raw(_encoder.encode(body))


def main() -> None:
    ids = itertools.count(1)
    # our id -> (the id the conductor used, whether it was an older-dialect initialize)
    pending: dict[bytes, tuple[Raw, bool]] = {}
    old_dialect = False
    buf = bytearray()
    out = bytearray()

    def emit(msg: Message) -> None:
        _encoder.encode_into(msg, out, -1)
        out.extend(b"\n")

    def handle(frame: bytes) -> None:
        nonlocal old_dialect
        msg = _decode(frame)
        if msg.method is UNSET:  # an answer to something we forwarded
            origin = pending.pop(bytes(msg.id), None) if msg.id is not UNSET else None
            if origin is not None:
                result = msg.result
                if origin[1] and result is not UNSET:
                    result = accept_proxy_role(result)
                emit(Message(id=origin[0], result=result, error=msg.error))
            return
        method = msg.method
        old_init = False
        if method in WRAPPED and msg.params is not UNSET:
            # from our successor: hand it to our predecessor plainly
            inner = _decode_inner(msg.params)
            fwd = Message(method=inner.method, params=inner.params)
        else:  # from our predecessor: wrap it for our successor
            if method == "_proxy/initialize":
                method = "initialize"
            elif method == "initialize":
                old_dialect = old_init = True
            if not old_dialect:
                wrapper = SUCCESSOR
            else:
                wrapper = OLD_REQUEST if msg.id is not UNSET else OLD_NOTIFICATION
            body = Inner(method=method, params=msg.params)
            fwd = Message(method=wrapper, params=Raw(_encoder.encode(body)))
        if msg.id is not UNSET:
            ours = str(next(ids)).encode()
            pending[ours] = (msg.id, old_init)
            fwd.id = Raw(ours)
        emit(fwd)

    while chunk := os.read(0, 1 << 20):
        scan = len(buf)
        buf += chunk
        start = 0
        while (nl := buf.find(b"\n", scan)) >= 0:
            frame = bytes(buf[start:nl])
            start = scan = nl + 1
            if frame.strip():
                handle(frame)
        del buf[:start]
        if out:
            view = memoryview(out)
            while view:
                view = view[os.write(1, view):]
            view.release()
            del out[:]


if __name__ == "__main__":
    try:
        main()
    except (BrokenPipeError, KeyboardInterrupt):
        sys.exit(0)
