"""The floor for one extra hop: a process that copies bytes and knows nothing about JSON.

    python bench/relay.py CMD [ARGS...]

Spawns CMD and copies our stdin to its stdin and its stdout to our stdout, one thread per
direction, with os.read/os.write of whatever is available (up to 1 MiB), so a burst of
small frames moves in one syscall pair. Exits with the child's status when both directions
are done.
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading

CHUNK = 1 << 20


def pump(src: int, dst: int, close_dst: bool) -> None:
    try:
        while data := os.read(src, CHUNK):
            view = memoryview(data)
            while view:
                view = view[os.write(dst, view):]
    except (BrokenPipeError, ConnectionResetError):
        pass
    finally:
        if close_dst:
            try:
                os.close(dst)  # EOF for the child, as if the editor had closed its end
            except OSError:
                pass


def main() -> int:
    if len(sys.argv) < 2:
        print("usage: relay.py CMD [ARGS...]", file=sys.stderr)
        return 2
    child = subprocess.Popen(sys.argv[1:], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                             bufsize=0)
    assert child.stdin is not None
    assert child.stdout is not None
    # Keep our own references to the fds; Popen's file objects would close them twice.
    child_in = os.dup(child.stdin.fileno())
    child_out = os.dup(child.stdout.fileno())
    child.stdin.close()
    child.stdout.close()
    down = threading.Thread(target=pump, args=(0, child_in, True), daemon=True)
    up = threading.Thread(target=pump, args=(child_out, 1, False), daemon=True)
    down.start()
    up.start()
    up.join()  # the child's stdout closed: it exited (or will)
    return child.wait()


if __name__ == "__main__":
    sys.exit(main())
