"""Run a component and log every line it receives and sends: `tee_stdio.py LOG CMD...`.

The log (one JSON object a line: {"dir": "recv"|"sent", "line": ...}) is what the component
really saw on its pipes, to check a trace against.
"""

from __future__ import annotations

import json
import subprocess
import sys
import threading


def main() -> None:
    log_path, argv = sys.argv[1], sys.argv[2:]
    log = open(log_path, "w", encoding="utf-8")
    lock = threading.Lock()
    child = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    assert child.stdin is not None and child.stdout is not None

    def record(direction: str, line: bytes) -> None:
        with lock:
            log.write(json.dumps({"dir": direction, "line": line.decode()}) + "\n")
            log.flush()

    def down() -> None:
        for line in sys.stdin.buffer:
            record("recv", line)
            child.stdin.write(line)
            child.stdin.flush()
        child.stdin.close()

    threading.Thread(target=down, daemon=True).start()
    for line in child.stdout:
        record("sent", line)
        sys.stdout.buffer.write(line)
        sys.stdout.buffer.flush()
    sys.exit(child.wait())


if __name__ == "__main__":
    main()
