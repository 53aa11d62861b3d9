"""A stand-alone stdlib-only ACP proxy that forwards everything (for benchmarks and tests).

Run it under any conductor that speaks `_proxy/initialize` / `_proxy/successor`. Set
PASSTHROUGH_LOG=1 to see each method it forwards on stderr.
"""

from __future__ import annotations

import itertools
import json
import os
import sys
from typing import Any

SUCCESSOR = "_proxy/successor"


def main() -> None:
    out = sys.stdout
    verbose = os.environ.get("PASSTHROUGH_LOG") == "1"
    ids = itertools.count(1)
    # our id -> the id the conductor used when it asked us
    pending: dict[int, Any] = {}

    def send(message: dict[str, Any]) -> None:
        out.write(json.dumps({"jsonrpc": "2.0", **message}) + "\n")
        out.flush()

    for line in open(sys.stdin.fileno(), encoding="utf-8", closefd=False):
        if not line.strip():
            continue
        msg = json.loads(line)
        method = msg.get("method")
        if method is None:  # an answer to something we forwarded
            origin = pending.pop(msg.get("id"), None)
            if origin is not None:
                send({"id": origin, **{k: msg[k] for k in ("result", "error") if k in msg}})
            continue
        if verbose:
            sys.stderr.write(f"forwarding {method}\n")
        if method == SUCCESSOR:  # from our successor: hand it to our predecessor plainly
            inner = msg["params"]
            out_msg: dict[str, Any] = {"method": inner["method"]}
            if "params" in inner:
                out_msg["params"] = inner["params"]
        else:  # from our predecessor: wrap it for our successor
            if method == "_proxy/initialize":
                method = "initialize"
            body: dict[str, Any] = {"method": method}
            if "params" in msg:
                body["params"] = msg["params"]
            out_msg = {"method": SUCCESSOR, "params": body}
        if "id" in msg:
            ours = next(ids)
            pending[ours] = msg["id"]
            out_msg["id"] = ours
        send(out_msg)


if __name__ == "__main__":
    main()
