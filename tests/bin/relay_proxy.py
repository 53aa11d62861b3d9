"""A byte-faithful forwarding proxy for tests, in any of the three proxy dialects.

  --dialect proxy   `_proxy/initialize`, `_proxy/successor` (default)
  --dialect spec    `proxy/initialize`, `proxy/successor`, envelope `meta`
                    (also accepts `_proxy/initialize` unless --strict)
  _relay/wrap {"method", "params"} from the predecessor: wrap exactly that for the successor.

  --dialect legacy  plain `initialize` with `_meta.proxy: true`,
                    `_proxy/successor/request` / `_proxy/successor/notification`;
                    answers `_proxy/initialize` with -32601 like the old SDKs did

Payloads are spliced as the exact text received (see rawjson.py). Stdlib only, synchronous.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

from rawjson import members, value

SUCCESSOR_IN = {"_proxy/successor", "proxy/successor", "_proxy/successor/request",
                "_proxy/successor/notification"}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--dialect", choices=["proxy", "spec", "legacy"], default="proxy")
    parser.add_argument("--strict", action="store_true",
                        help="spec dialect: refuse `_proxy/initialize` with -32601")
    parser.add_argument("--record", help="append every raw line received to this file")
    parser.add_argument("--crash-on", help="exit 7 (after a stderr line) on this request method")
    parser.add_argument("--envelope-meta", help="raw JSON added as the envelope's meta")
    parser.add_argument("--banner", action="store_true", help="print non-JSON noise on stdout")
    args = parser.parse_args()
    dialect = args.dialect
    inp, out = sys.stdin.buffer, sys.stdout.buffer
    record = open(args.record, "ab") if args.record else None
    pending: dict[int, str] = {}  # our id -> the conductor's id (raw text)
    next_id = 0

    if dialect == "legacy":
        init_methods = {"initialize"}
    elif dialect == "spec":
        init_methods = {"proxy/initialize"} if args.strict else {"proxy/initialize",
                                                                 "_proxy/initialize"}
    else:
        init_methods = {"_proxy/initialize"}
    meta_key = "meta" if dialect == "spec" else "_meta"

    def write(text: str) -> None:
        out.write(text.encode("utf-8") + b"\n")
        out.flush()

    def successor_method(is_request: bool) -> str:
        if dialect == "legacy":
            return "_proxy/successor/request" if is_request else "_proxy/successor/notification"
        return "proxy/successor" if dialect == "spec" else "_proxy/successor"

    def forward(ident: str | None, method_raw: str, params: str | None, *, wrap: bool) -> None:
        nonlocal next_id
        id_part = ""
        if ident is not None:
            next_id += 1
            pending[next_id] = ident
            id_part = f'"id":{next_id},'
        params_part = f',"params":{params}' if params is not None else ""
        if not wrap:
            write(f'{{"jsonrpc":"2.0",{id_part}"method":{method_raw}{params_part}}}')
            return
        meta = f',"{meta_key}":{args.envelope_meta}' if args.envelope_meta else ""
        body = f'{{"method":{method_raw}{params_part}{meta}}}'
        method = json.dumps(successor_method(ident is not None))
        write(f'{{"jsonrpc":"2.0",{id_part}"method":{method},"params":{body}}}')

    if args.banner:
        out.write(b"relay-proxy starting \x1b[1mnow\x1b[0m\n")
        out.flush()
    while True:
        line_bytes = inp.readline()
        if not line_bytes:
            break
        if record is not None:
            record.write(line_bytes)
            record.flush()
        if not line_bytes.strip():
            continue
        m = members(line_bytes.decode("utf-8"))
        ident = m.get("id")
        if "method" not in m:  # an answer to something we forwarded
            origin = pending.pop(value(ident), None)  # type: ignore[arg-type]
            if origin is not None:
                key = "result" if "result" in m else "error"
                write(f'{{"jsonrpc":"2.0","id":{origin},"{key}":{m[key]}}}')
            continue
        method = value(m["method"])
        if ident is not None and method == args.crash_on:
            sys.stderr.write(f"relay-proxy: crashing on {method}\n")
            sys.stderr.flush()
            os._exit(7)
        if method == "$/cancel_request":
            # Cancels are per hop: re-issue it for the id we used when we forwarded that request.
            wanted = (value(m.get("params")) or {}).get("requestId")  # type: ignore[union-attr]
            ours = [k for k, origin in pending.items() if value(origin) == wanted]
            if ours:
                write(f'{{"jsonrpc":"2.0","method":"$/cancel_request",'
                      f'"params":{{"requestId":{ours[0]}}}}}')
            continue
        if method == "_relay/wrap":  # tests: send the successor any inner method at all
            inner = members(m["params"])
            forward(ident, inner["method"], inner.get("params"), wrap=True)
            continue
        if method in SUCCESSOR_IN:  # from our successor: hand it up plainly
            env = members(m["params"])
            forward(ident, env["method"], env.get("params"), wrap=False)
        elif method in init_methods:
            forward(ident, '"initialize"', m.get("params"), wrap=True)
        elif method in {"_proxy/initialize", "proxy/initialize"}:
            if ident is not None:
                write(f'{{"jsonrpc":"2.0","id":{ident},"error":{{"code":-32601,'
                      f'"message":"Method not found","data":{json.dumps(method)}}}}}')
        else:  # from our predecessor: wrap it for our successor
            forward(ident, m["method"], m.get("params"), wrap=True)


if __name__ == "__main__":
    main()
