"""A passthrough proxy built for speed, to show what a proxy process costs apart from JSON.

Same behaviour as proxies/passthrough.py (the readable reference, which decodes every
message fully with `json`), but only the envelope is decoded: payloads stay msgspec.Raw and
cross untouched, and every frame answerable from one read goes out in one write.
"""

from __future__ import annotations

import itertools
import os
import sys

import msgspec
from msgspec import UNSET, Raw, UnsetType

SUCCESSOR = "_proxy/successor"


class Message(msgspec.Struct):
    jsonrpc: str = "2.0"
    id: Raw | UnsetType = UNSET
    method: str | UnsetType = UNSET
    params: Raw | UnsetType = UNSET
    result: Raw | UnsetType = UNSET
    error: Raw | UnsetType = UNSET


class Inner(msgspec.Struct):
    method: str
    params: Raw | UnsetType = UNSET


_decode = msgspec.json.Decoder(Message).decode
_decode_inner = msgspec.json.Decoder(Inner).decode
_encoder = msgspec.json.Encoder()


def main() -> None:
    ids = itertools.count(1)
    pending: dict[bytes, Raw] = {}  # our id -> the id the conductor used
    buf = bytearray()
    out = bytearray()

    def emit(msg: Message) -> None:
        _encoder.encode_into(msg, out, -1)
        out.extend(b"\n")

    def handle(frame: bytes) -> None:
        msg = _decode(frame)
        if msg.method is UNSET:  # an answer to something we forwarded
            origin = pending.pop(bytes(msg.id), None) if msg.id is not UNSET else None
            if origin is not None:
                emit(Message(id=origin, result=msg.result, error=msg.error))
            return
        if msg.method == SUCCESSOR and msg.params is not UNSET:
            inner = _decode_inner(msg.params)
            fwd = Message(method=inner.method, params=inner.params)
        else:
            method = "initialize" if msg.method == "_proxy/initialize" else msg.method
            body = Inner(method=method, params=msg.params)
            fwd = Message(method=SUCCESSOR, params=Raw(_encoder.encode(body)))
        if msg.id is not UNSET:
            ours = str(next(ids)).encode()
            pending[ours] = msg.id
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
