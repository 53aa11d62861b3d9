"""The floor for one hop on an event loop: the smallest asyncio program that does the part
of the conductor's job that costs time per message.

    python bench/loop_relay.py [--json] [--uvloop] CMD [ARGS...]

Spawns CMD and moves newline-delimited frames between our stdio and its stdio, reading
each fd in the loop's readiness callback (`add_reader`) and writing with one os.write: no
tasks, no streams, no routing. With --json every frame is decoded and encoded again with
msgspec, as a conductor that reads the message must. The benchmark runs it next to the
thread relay (bench/relay.py) and the conductor, so the figures show what the event loop
itself costs on this machine before any conductor code runs (docs/performance.md).
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys

import msgspec

CHUNK = 1 << 20


def _write_all(fd: int, data: bytes) -> None:
    # The bench's frames fit in a pipe; a blocking fd keeps this as small as the thread relay.
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]


def pump(loop: asyncio.AbstractEventLoop, src: int, dst: int, decode: bool,
         done: asyncio.Future[None]) -> None:
    decoder, encoder = msgspec.json.Decoder(), msgspec.json.Encoder()
    pending = bytearray()

    def ready() -> None:
        try:
            data = os.read(src, CHUNK)
        except BlockingIOError:
            return
        if not data:
            loop.remove_reader(src)
            if not done.done():
                done.set_result(None)
            return
        if not decode:
            _write_all(dst, data)
            return
        pending.extend(data)
        end = pending.rfind(b"\n")
        if end < 0:
            return
        frames = bytes(pending[:end])
        del pending[:end + 1]
        out = [encoder.encode(decoder.decode(line)) for line in frames.split(b"\n") if line]
        _write_all(dst, b"\n".join(out) + b"\n")

    os.set_blocking(src, False)
    loop.add_reader(src, ready)


async def main(child: subprocess.Popen[bytes], decode: bool) -> int:
    assert child.stdin is not None
    assert child.stdout is not None
    child_in, child_out = child.stdin.fileno(), child.stdout.fileno()
    loop = asyncio.get_running_loop()
    down: asyncio.Future[None] = loop.create_future()
    up: asyncio.Future[None] = loop.create_future()
    pump(loop, 0, child_in, decode, down)
    pump(loop, child_out, 1, decode, up)
    await down
    child.stdin.close()  # EOF for the child, as if the editor had closed its end
    await up
    return child.wait()


if __name__ == "__main__":
    args = sys.argv[1:]
    decode = "--json" in args
    fast = "--uvloop" in args
    args = [a for a in args if a not in ("--json", "--uvloop")]
    if not args:
        print("usage: loop_relay.py [--json] [--uvloop] CMD [ARGS...]", file=sys.stderr)
        sys.exit(2)
    # Spawned before the loop starts, as the thread relay does: the same start-up work.
    proc = subprocess.Popen(args, stdin=subprocess.PIPE, stdout=subprocess.PIPE, bufsize=0)
    if fast:
        import uvloop
        sys.exit(uvloop.run(main(proc, decode)))
    sys.exit(asyncio.run(main(proc, decode)))
