"""A scriptable ACP agent for tests. Stdlib only, synchronous, byte-faithful.

Behaviour is chosen by flags (start-up) and by `_test/*` methods (per request), so one test
can drive one agent through exactly the situation it needs:

  _test/echo        result = the params, byte for byte as received
  _test/raw         {"lines": [...], "pad"?: N, "latin1"?: true}: write each string verbatim
                    as a stdout line (with PAD replaced by N x's, for big lines from a small
                    request; encoded as Latin-1 with "latin1", so "\u00ff" is the byte 0xFF
                    and the line is not UTF-8), then {}
  _test/ask         {"method", "params"}: ask the client; result {"result"|"error": <answer>}
  _test/ask_cancel  like _test/ask, but cancel the question at once ($/cancel_request)
  _test/hang        notify `_test/hanging`, then never answer until a $/cancel_request
                    names it; then -32800
                    (a _test/crash meanwhile is obeyed at once)
  _test/crash       {"code", "stderr"}: print stderr and exit without answering
  _test/big         {"size"}: result {"data": "x" * size}
  _test/notify      {"sessionId", "count", "pad"}: that many session/updates (text padded), then {}
  _test/env         {"names"}: result {"cwd", "env": {name: value}}
  _test/stderr      {"lines"}: print them on stderr, then {}
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import time

from rawjson import members, value


class ScriptedAgent:
    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.inp = sys.stdin.buffer
        self.out = sys.stdout.buffer
        self.record = open(args.record, "ab") if args.record else None
        self.queue: list[str] = []
        self.asked = 0
        self.sessions = 0

    # -- wire ------------------------------------------------------------------------------

    def write(self, text: str) -> None:
        self.out.write(text.encode("utf-8") + b"\n")
        self.out.flush()

    def read(self) -> str | None:
        if self.queue:
            return self.queue.pop(0)
        while True:
            line = self.inp.readline()
            if not line:
                return None
            if self.record is not None:
                self.record.write(line if line.endswith(b"\n") else line + b"\n")
                self.record.flush()
            if line.strip():
                return line.decode("utf-8").rstrip("\n")

    def reply(self, ident: str, result: str) -> None:
        self.write(f'{{"jsonrpc":"2.0","id":{ident},"result":{result}}}')

    def error(self, ident: str, code: int, message: str, data: object = None) -> None:
        err: dict[str, object] = {"code": code, "message": message}
        if data is not None:
            err["data"] = data
        self.write(f'{{"jsonrpc":"2.0","id":{ident},"error":{json.dumps(err)}}}')

    def update(self, sid: str, text: str) -> None:
        self.write(json.dumps({"jsonrpc": "2.0", "method": "session/update", "params": {
            "sessionId": sid, "update": {"sessionUpdate": "agent_message_chunk",
                                         "content": {"type": "text", "text": text}}}}))

    # -- dispatch --------------------------------------------------------------------------

    def serve(self) -> None:
        while (line := self.read()) is not None:
            self.dispatch(line)

    def dispatch(self, line: str) -> None:
        m = members(line)
        if "method" not in m:
            return  # a stray response
        method = value(m["method"])
        ident = m.get("id")
        params = m.get("params", "null")
        if method == "$/cancel_request":
            return  # nothing of ours is in flight outside _test/hang
        handler = getattr(self, "on_" + str(method).replace("/", "_"), None)
        if handler is None:
            if ident is not None:
                self.error(ident, -32601, "Method not found", {"method": method})
            return
        result = handler(params, ident)
        if ident is not None and result is not None:
            self.reply(ident, result)

    def wait_answer(self, ask_id: str) -> str:
        """Read until the client answers `ask_id`; other messages wait in the queue."""
        want = value(ask_id)
        held: list[str] = []
        while True:
            line = self.read()
            if line is None:
                sys.exit(0)
            m = members(line)
            if "method" not in m and value(m.get("id")) == want:
                self.queue[:0] = held
                key = "result" if "result" in m else "error"
                return f'{{"{key}":{m[key]}}}'
            held.append(line)

    # -- ACP -------------------------------------------------------------------------------

    def on_initialize(self, params: str, ident: str | None) -> str:
        if self.args.init_result is not None:
            return self.args.init_result
        asked = (value(params) or {}).get("protocolVersion", 1)  # type: ignore[union-attr]
        version = self.args.version
        if version is None:
            version = 2 if isinstance(asked, int) and asked >= 2 else 1
        return json.dumps({"protocolVersion": version,
                           "agentCapabilities": {"loadSession": False},
                           "agentInfo": {"name": "scripted-agent", "version": "1.0"},
                           "authMethods": []})

    def on_session_new(self, params: str, ident: str | None) -> str:
        self.sessions += 1
        sid = f"sess-{self.sessions}"
        for i in range(self.args.early_updates):  # before the session/new answer
            self.update(sid, f"early {i}")
        return json.dumps({"sessionId": sid})

    def on_session_prompt(self, params: str, ident: str | None) -> str:
        if self.args.prompt_hangs:  # never answer; keep reading (and recording) until EOF
            self.write('{"jsonrpc":"2.0","method":"_test/hanging","params":{}}')
            while self.read() is not None:
                pass
            sys.exit(0)
        sid = (value(params) or {}).get("sessionId", "")  # type: ignore[union-attr]
        for i in range(self.args.updates):
            self.update(sid, f"chunk {i}")
        return '{"stopReason":"end_turn"}'

    def on_session_cancel(self, params: str, ident: str | None) -> None:
        return None

    # -- test controls ---------------------------------------------------------------------

    def on__test_echo(self, params: str, ident: str | None) -> str:
        return params

    def on__test_raw(self, params: str, ident: str | None) -> str:
        args = value(params)
        pad = "x" * args.get("pad", 0)  # type: ignore[union-attr]
        encoding = "latin-1" if args.get("latin1") else "utf-8"  # type: ignore[union-attr]
        for line in args["lines"]:  # type: ignore[index]
            self.out.write(line.replace("PAD", pad).encode(encoding) + b"\n")
            self.out.flush()
        return "{}"

    def _ask(self, params: str, *, cancel: bool) -> str:
        p = members(params)
        self.asked += 1
        ask_id = json.dumps(f"agent-ask-{self.asked}")
        inner = f',"params":{p["params"]}' if "params" in p else ""
        self.write(f'{{"jsonrpc":"2.0","id":{ask_id},"method":{p["method"]}{inner}}}')
        if cancel:
            self.write(f'{{"jsonrpc":"2.0","method":"$/cancel_request",'
                       f'"params":{{"requestId":{ask_id}}}}}')
        return self.wait_answer(ask_id)

    def on__test_ask(self, params: str, ident: str | None) -> str:
        return self._ask(params, cancel=False)

    def on__test_ask_cancel(self, params: str, ident: str | None) -> str:
        return self._ask(params, cancel=True)

    def on__test_hang(self, params: str, ident: str | None) -> None:
        want = value(ident)
        # Tells a test the request is now in flight at the agent (no guessing, no sleeps).
        self.write('{"jsonrpc":"2.0","method":"_test/hanging","params":{}}')
        held: list[str] = []
        while True:
            line = self.read()
            if line is None:
                sys.exit(0)
            m = members(line)
            if value(m.get("method")) == "$/cancel_request":
                cancelled = (value(m.get("params")) or {}).get("requestId")  # type: ignore[union-attr]
                if cancelled == want and ident is not None:
                    self.queue[:0] = held
                    self.error(ident, -32800, "Request cancelled", {"cancel": line})
                    return None
                continue
            if value(m.get("method")) == "_test/crash":  # so a crash can leave this pending
                self.dispatch(line)
            held.append(line)

    def on__test_crash(self, params: str, ident: str | None) -> None:
        p = value(params) or {}
        sys.stderr.write(str(p.get("stderr", "crashing")) + "\n")  # type: ignore[union-attr]
        sys.stderr.flush()
        os._exit(int(p.get("code", 1)))  # type: ignore[union-attr]

    def on__test_big(self, params: str, ident: str | None) -> str:
        size = int(value(params)["size"])  # type: ignore[index]
        return '{"data":"' + "x" * size + '"}'

    def on__test_notify(self, params: str, ident: str | None) -> str:
        p = value(params) or {}
        pad = "z" * int(p.get("pad", 0))  # type: ignore[union-attr]
        for i in range(int(p.get("count", 1))):  # type: ignore[union-attr]
            self.update(str(p.get("sessionId", "")), f"note {i}{pad}")  # type: ignore[union-attr]
        return "{}"

    def on__test_env(self, params: str, ident: str | None) -> str:
        names = (value(params) or {}).get("names", [])  # type: ignore[union-attr]
        return json.dumps({"cwd": os.getcwd(), "env": {n: os.environ.get(n) for n in names}})

    def on__test_stderr(self, params: str, ident: str | None) -> str:
        for line in (value(params) or {}).get("lines", []):  # type: ignore[union-attr]
            sys.stderr.write(line + "\n")
        sys.stderr.flush()
        return "{}"


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--record", help="append every raw line received to this file")
    parser.add_argument("--version", type=int, help="answer initialize with this protocolVersion")
    parser.add_argument("--init-result", help="raw JSON text to answer initialize with")
    parser.add_argument("--early-updates", type=int, default=0,
                        help="session/update notifications sent before the session/new answer")
    parser.add_argument("--updates", type=int, default=2, help="updates per session/prompt")
    parser.add_argument("--banner", action="store_true", help="print non-JSON noise on stdout")
    parser.add_argument("--prompt-hangs", action="store_true",
                        help="notify _test/hanging, then never answer session/prompt, not "
                             "even after session/cancel")
    parser.add_argument("--stderr", help="print this on stderr at start")
    parser.add_argument("--grandchild", help="spawn a sleeping grandchild, write its pid here")
    parser.add_argument("--detached-grandchild",
                        help="like --grandchild, but in a session of its own (setsid)")
    parser.add_argument("--ignore-term", action="store_true", help="ignore SIGTERM")
    parser.add_argument("--linger", action="store_true", help="keep running after stdin EOF")
    args = parser.parse_args()
    if args.ignore_term:  # and say so on stderr, so a test sees the order of events
        signal.signal(signal.SIGTERM, lambda *_: say("scripted-agent: ignoring SIGTERM"))
    if args.stderr:
        sys.stderr.write(args.stderr + "\n")
        sys.stderr.flush()
    for pidfile, detached in ((args.grandchild, False), (args.detached_grandchild, True)):
        if not pidfile:
            continue
        # Like an npx/uvx wrapper's child: inherits our stdio; same process group unless
        # detached, in which case it escapes the group (and a group kill) with setsid.
        child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(300)"],
                                 start_new_session=detached)
        tmp = pidfile + ".tmp"
        with open(tmp, "w", encoding="utf-8") as f:
            f.write(str(child.pid))
        os.replace(tmp, pidfile)
    if args.banner:
        sys.stdout.buffer.write(b"Welcome to scripted-agent 1.0!\n\x1b[32mready\x1b[0m\n")
        sys.stdout.buffer.flush()
    ScriptedAgent(args).serve()
    if args.linger:
        say("scripted-agent: stdin closed; lingering")
        time.sleep(300)


def say(line: str) -> None:
    try:
        sys.stderr.write(line + "\n")
        sys.stderr.flush()
    except OSError:  # nobody reads stderr any more (the conductor was killed): linger anyway
        pass


if __name__ == "__main__":
    main()
