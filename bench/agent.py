"""A fast ACP agent for the benchmark: answers at once, streams on demand, echoes prompts.

It must never be the bottleneck, so it decodes only what it needs (msgspec, payloads kept
as Raw), builds its frames by concatenating bytes, and writes many frames per syscall.

What a `session/prompt` does is chosen by `params._meta.bench` (the prompt itself is not
decoded, so a 10 MB prompt costs one scan):
  {"op": "ping"}                          answer end_turn at once
  {"op": "stream", "count": N, "size": S, "burst": B}
                                          N session/update notifications of S text bytes each,
                                          then end_turn. burst=false: one write() per frame, as
                                          real agents do (every ACP SDK flushes each message);
                                          burst=true: up to 1 MiB of frames per write()
  {"op": "echo"}                          one session/update carrying the prompt's first
                                          content block back (byte for byte), then end_turn
"""

from __future__ import annotations

import os
import sys

import msgspec
from msgspec import UNSET, Raw, UnsetType

WRITE_CHUNK = 1 << 20


class Envelope(msgspec.Struct):
    id: Raw | UnsetType = UNSET
    method: str | UnsetType = UNSET
    params: Raw | UnsetType = UNSET


class BenchOp(msgspec.Struct):
    op: str = "ping"
    count: int = 0
    size: int = 0
    burst: bool = False


class PromptMeta(msgspec.Struct):
    bench: BenchOp | UnsetType = UNSET


class PromptParams(msgspec.Struct):
    sessionId: str = "bench"
    prompt: list[Raw] = []
    meta: PromptMeta | UnsetType = msgspec.field(default=UNSET, name="_meta")


class InitParams(msgspec.Struct):
    protocolVersion: int = 1


_envelope = msgspec.json.Decoder(Envelope)
_prompt = msgspec.json.Decoder(PromptParams)
_init = msgspec.json.Decoder(InitParams)
_encode = msgspec.json.encode


def write_all(data: bytes | bytearray | memoryview) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(1, view):]


def result(ident: Raw, body: bytes) -> bytes:
    return b'{"jsonrpc":"2.0","id":' + bytes(ident) + b',"result":' + body + b"}\n"


def update(session: bytes, content: bytes) -> bytes:
    return (b'{"jsonrpc":"2.0","method":"session/update","params":{"sessionId":' + session
            + b',"update":{"sessionUpdate":"agent_message_chunk","content":' + content + b"}}}\n")


END_TURN = b'{"stopReason":"end_turn"}'


def handle(frame: bytes, out: bytearray) -> None:
    msg = _envelope.decode(frame)
    if msg.method is UNSET or msg.id is UNSET:
        return  # notifications (session/cancel) and stray responses need no answer
    method, ident = msg.method, msg.id
    params = msg.params if msg.params is not UNSET else b"{}"
    if method == "session/prompt":
        p = _prompt.decode(params)
        op = p.meta.bench if p.meta is not UNSET and p.meta.bench is not UNSET else BenchOp()
        session = _encode(p.sessionId)
        if op.op == "stream":
            frame_bytes = update(session, _encode({"type": "text", "text": "x" * op.size}))
            if not op.burst:
                if out:
                    write_all(out)
                    del out[:]
                for _ in range(op.count):
                    write_all(frame_bytes)
                out += result(ident, END_TURN)
                return
            per_chunk = max(1, WRITE_CHUNK // len(frame_bytes))
            left = op.count
            while left:
                n = min(left, per_chunk)
                out += frame_bytes * n
                left -= n
                if len(out) >= WRITE_CHUNK:
                    write_all(out)
                    del out[:]
        elif op.op == "echo" and p.prompt:
            out += update(session, bytes(p.prompt[0]))
        out += result(ident, END_TURN)
    elif method == "initialize":
        version = _init.decode(params).protocolVersion
        out += result(ident, b'{"protocolVersion":' + str(version).encode()
                      + b',"agentCapabilities":{"loadSession":false},"authMethods":[]}')
    elif method == "session/new":
        out += result(ident, b'{"sessionId":"bench"}')
    else:
        out += result(ident, b"{}")


def main() -> None:
    pending = bytearray()
    out = bytearray()
    while True:
        chunk = os.read(0, 1 << 20)
        if not chunk:
            break
        scan = len(pending)  # only the new bytes can hold a newline not yet seen
        pending += chunk
        start = 0
        while (nl := pending.find(b"\n", scan)) >= 0:
            frame = bytes(pending[start:nl])
            start = scan = nl + 1
            if frame.strip():
                handle(frame, out)
        del pending[:start]
        if out:  # everything answerable from this read goes out in one write
            write_all(out)
            del out[:]


if __name__ == "__main__":
    try:
        main()
    except (BrokenPipeError, KeyboardInterrupt):
        sys.exit(0)
