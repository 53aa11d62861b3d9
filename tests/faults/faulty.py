"""A fault-injecting ACP component: an agent, or a stand-alone proxy, that misbehaves on cue.

    python tests/faults/faulty.py --role agent --crash-at 3
    python tests/faults/faulty.py --role proxy --name p0 --garbage-at 2 --ignore-term
    FAULTY="--silent-at 2" python tests/faults/faulty.py        (flags from the environment too)

Steps count the requests that arrive from the predecessor (the editor's side), from 1:
initialize is step 1, the first session/new step 2, and so on. At its step, a fault does:

  --crash-at N      exit 9 without answering (after one stderr line)
  --cut-at N        write the first half of its answer (no newline), then exit 9 as above
  --silent-at N     never answer that request, nor pass it on
  --garbage-at N    write noise, raw invalid UTF-8 and a JSON line holding invalid UTF-8 on
                    stdout, then handle the request normally
  --deep-at N       answer it with a result nested --depth levels deep (valid JSON)
  --huge-at N       answer it with a result of --huge-bytes bytes
  --flood-at N      send --flood-count session/update notifications up first, then handle it
  --fail-init       answer initialize with an error (step 1)
  --deaf-at N       close its stdin and keep running (stdout open), never answering
  --mute-at N       close its stdout and keep running, never answering
  --stall-at N      never read its stdin again (it stays open) and keep running

Process behaviours: --ignore-term (SIGTERM is ignored), --linger (keeps running after
stdin EOF, saying so on stderr), --grandchild FILE (starts a sleeping grandchild in a
session of its own, setsid, and writes its pid to FILE), --pidfile FILE (its own pid).

A request `_fault/crash` {"who": NAME} crashes the component named NAME (`--name`), and
is passed on by the others. As an agent it keeps sessions in --state DIR (one file each),
so that after a restart `session/resume` (--resume) and `session/load` (--load; replays
one update first) succeed for sessions it created before; --reopen-together N holds their
answers until N are waiting, --reopen-delay S takes S seconds over each, and
--crash-reopening N crashes when asked to reopen the Nth session a run created, and
--mute-reopens-until-run N (with --runs-file) never answers a reopen in runs 1..N. Stdlib
only, synchronous.
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import json
import os
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

SUCCESSOR = "_proxy/successor"


class Faulty:
    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.out = sys.stdout.buffer
        self.steps = 0
        self.ids = itertools.count(1)
        # proxy: our id on one side -> (the side it came from, its id there)
        self.forwarded: dict[int, tuple[str, Any]] = {}
        self.sessions = 0
        self.held: list[tuple[str, Any, str]] = []  # reopens not answered yet
        self.run = 1  # which start of this agent it is (--runs-file counts them)
        if args.runs_file:
            runs = Path(args.runs_file)
            self.run = int(runs.read_text() or 0) + 1 if runs.exists() else 1
            runs.write_text(str(self.run))

    # -- wire ------------------------------------------------------------------------------

    def write(self, message: Any) -> None:
        self.out.write(json.dumps(message).encode() + b"\n")
        self.out.flush()

    def reply(self, ident: Any, result: Any) -> None:
        self.write({"jsonrpc": "2.0", "id": ident, "result": result})

    def error(self, ident: Any, code: int, message: str) -> None:
        self.write({"jsonrpc": "2.0", "id": ident, "error": {"code": code, "message": message}})

    def serve(self) -> None:
        for line in sys.stdin.buffer:
            if line.strip():
                self.dispatch(json.loads(line))

    # -- faults ----------------------------------------------------------------------------

    def fault(self, msg: dict[str, Any]) -> bool:
        """Apply the fault of this step; True when the request is dealt with."""
        self.steps += 1
        step, a, ident = self.steps, self.args, msg.get("id")
        if msg.get("method") == "_fault/crash" and \
                (msg.get("params") or {}).get("who") == a.name:
            self.crash()
        if step == a.crash_at:
            self.crash()
        if step == a.cut_at:
            self.out.write(b'{"jsonrpc":"2.0","id":' + json.dumps(ident).encode()
                           + b',"result":{"stopRea')
            self.out.flush()
            self.crash()
        if step == a.silent_at:
            return True
        if step == a.deaf_at:
            os.close(0)  # nothing can reach it any more, yet it runs on
            sys.stderr.write(f"faulty {a.name}: deaf at step {step}\n")
            sys.stderr.flush()
            time.sleep(300)
        if step == a.mute_at:
            os.close(1)  # nothing it says can arrive any more, yet it runs on
            sys.stderr.write(f"faulty {a.name}: mute at step {step}\n")
            sys.stderr.flush()
            time.sleep(300)
        if step == a.stall_at:
            sys.stderr.write(f"faulty {a.name}: stalled at step {step}\n")
            sys.stderr.flush()
            time.sleep(300)
        if step == a.garbage_at:
            self.out.write(b"faulty: garbage \x1b[31mnot json\x1b[0m\n")
            self.out.write(b"\xff\xfe\xfd raw bytes\n")
            self.out.write(b'{"jsonrpc":"2.0","method":"session/update","params":'
                           b'{"sessionId":"x","note":"bad \xff byte"}}\n')
            self.out.flush()
        if step == a.flood_at:
            sid = (msg.get("params") or {}).get("sessionId", "flood")
            for i in range(a.flood_count):
                self.write({"jsonrpc": "2.0", "method": "session/update", "params": {
                    "sessionId": sid, "update": {"sessionUpdate": "agent_message_chunk",
                                                 "content": {"type": "text",
                                                             "text": f"flood {i}"}}}})
        if step == a.deep_at:
            depth = a.depth
            self.out.write(b'{"jsonrpc":"2.0","id":' + json.dumps(ident).encode()
                           + b',"result":' + b"[" * depth + b"]" * depth + b"}\n")
            self.out.flush()
            return True
        if step == a.huge_at:
            self.out.write(b'{"jsonrpc":"2.0","id":' + json.dumps(ident).encode()
                           + b',"result":{"data":"' + b"x" * a.huge_bytes + b'"}}\n')
            self.out.flush()
            return True
        return False

    def crash(self) -> None:
        sys.stderr.write(f"faulty {self.args.name}: crashing at step {self.steps}\n")
        sys.stderr.flush()
        os._exit(9)

    # -- dispatch --------------------------------------------------------------------------

    def dispatch(self, msg: dict[str, Any]) -> None:
        if self.args.role == "agent":
            self.agent(msg)
        else:
            self.proxy(msg)

    def agent(self, msg: dict[str, Any]) -> None:
        method, ident = msg.get("method"), msg.get("id")
        if method is None or ident is None:
            return  # answers, notifications (session/cancel, $/cancel_request)
        if self.fault(msg):
            return
        params = msg.get("params") or {}
        if method == "initialize":
            if self.args.fail_init:
                self.error(ident, -32603, "faulty: initialize refused")
                return
            session_caps: dict[str, Any] = {"close": {}}
            if self.args.resume:
                session_caps["resume"] = {}
            version = params.get("protocolVersion", 1)
            if self.args.version_after_restart and self.args.state \
                    and any(Path(self.args.state).iterdir()):  # sessions of an earlier run
                version = self.args.version_after_restart
            self.reply(ident, {"protocolVersion": version,
                               "agentCapabilities": {"loadSession": self.args.load,
                                                     "sessionCapabilities": session_caps},
                               "authMethods": []})
        elif method == "session/new":
            self.sessions += 1
            sid = f"{self.args.name}-{os.getpid()}-{self.sessions}"
            if self.args.state:
                (Path(self.args.state) / sid).write_text(json.dumps(params), encoding="utf-8")
            self.reply(ident, {"sessionId": sid})
        elif method in ("session/resume", "session/load"):
            sid = params.get("sessionId", "")
            known = bool(self.args.state) and (Path(self.args.state) / sid).exists()
            allowed = self.args.resume if method == "session/resume" else self.args.load
            if not (known and allowed):
                self.error(ident, -32002, f"faulty: no session {sid}")
                return
            if self.run <= self.args.mute_reopens_until_run:
                return  # this run never answers a reopen: a restart that times out
            if self.args.crash_reopening and sid.endswith(f"-{self.args.crash_reopening}"):
                self.crash()  # a session whose reopen takes the agent down, every time
            time.sleep(self.args.reopen_delay)  # one at a time: this agent is synchronous
            self.held.append((method, ident, sid))
            if len(self.held) < self.args.reopen_together:
                return  # answered with the others, once they are all asked
            for held_method, held_ident, held_sid in self.held:
                if held_method == "session/load":
                    self.update(held_sid, "replayed")
                self.reply(held_ident, {} if held_method == "session/resume" else None)
            self.held.clear()
        elif method == "session/prompt":
            sid = params.get("sessionId", "")
            self.update(sid, f"answer from {os.getpid()}")
            self.reply(ident, {"stopReason": "end_turn"})
        elif method == "session/close":
            self.reply(ident, {})
        elif method == "_fault/pid":
            self.reply(ident, {"pid": os.getpid()})
        else:
            self.error(ident, -32601, f"Method not found: {method}")

    def update(self, sid: str, text: str) -> None:
        self.write({"jsonrpc": "2.0", "method": "session/update", "params": {
            "sessionId": sid, "update": {"sessionUpdate": "agent_message_chunk",
                                         "content": {"type": "text", "text": text}}}})

    def proxy(self, msg: dict[str, Any]) -> None:
        method, ident = msg.get("method"), msg.get("id")
        if method is None:  # an answer to something we forwarded
            side, their_id = self.forwarded.pop(ident, (None, None))
            if side is not None:
                answer = {k: v for k, v in msg.items() if k in ("result", "error")}
                self.write({"jsonrpc": "2.0", "id": their_id, **answer})
            return
        if method == SUCCESSOR:  # from our successor: plain to our predecessor
            inner = msg.get("params") or {}
            self.send(inner.get("method"), inner.get("params"), ident, side="up")
            return
        if ident is not None and self.fault(msg):
            return
        if method == "_proxy/initialize":
            method = "initialize"
        self.send(method, msg.get("params"), ident, side="down")

    def send(self, method: Any, params: Any, ident: Any, *, side: str) -> None:
        if method == "$/cancel_request" and params:  # ours on the other side, if we know it
            theirs = params.get("requestId")
            for ours, (_, their_id) in self.forwarded.items():
                if their_id == theirs:
                    params = {"requestId": ours}
        out: dict[str, Any] = {"jsonrpc": "2.0"}
        if ident is not None:
            ours = next(self.ids)
            self.forwarded[ours] = (side, ident)
            out["id"] = ours
        if side == "down":
            inner = {"method": method} | ({"params": params} if params is not None else {})
            out |= {"method": SUCCESSOR, "params": inner}
        else:
            out |= {"method": method} | ({"params": params} if params is not None else {})
        self.write(out)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--role", choices=["agent", "proxy"], default="agent")
    parser.add_argument("--name", default="faulty")
    for fault in ("crash", "cut", "silent", "garbage", "deep", "huge", "flood", "deaf",
                  "mute", "stall"):
        parser.add_argument(f"--{fault}-at", type=int, default=0, metavar="N")
    parser.add_argument("--depth", type=int, default=5000)
    parser.add_argument("--huge-bytes", type=int, default=2 * 1024 * 1024)
    parser.add_argument("--flood-count", type=int, default=2000)
    parser.add_argument("--fail-init", action="store_true")
    parser.add_argument("--load", action="store_true", help="agent: supports session/load")
    parser.add_argument("--resume", action="store_true", help="agent: supports session/resume")
    parser.add_argument("--state", help="agent: keep sessions in this directory")
    parser.add_argument("--reopen-together", type=int, default=1, metavar="N",
                        help="agent: answer session/resume and session/load only once N "
                             "of them are waiting (all at once)")
    parser.add_argument("--reopen-delay", type=float, default=0.0, metavar="S",
                        help="agent: take S seconds over each session/resume and session/load")
    parser.add_argument("--version-after-restart", type=int, default=0, metavar="N",
                        help="agent: answer initialize with protocolVersion N once --state "
                             "holds sessions of an earlier run")
    parser.add_argument("--runs-file", metavar="FILE",
                        help="count this agent's starts in FILE (for --mute-reopens-until-run)")
    parser.add_argument("--mute-reopens-until-run", type=int, default=0, metavar="N",
                        help="agent: runs 1..N (--runs-file) never answer a reopen")
    parser.add_argument("--crash-reopening", type=int, default=0, metavar="N",
                        help="agent: crash when asked to reopen the Nth session it created")
    parser.add_argument("--ignore-term", action="store_true")
    parser.add_argument("--linger", action="store_true")
    parser.add_argument("--grandchild", metavar="FILE")
    parser.add_argument("--pidfile", metavar="FILE")
    args = parser.parse_args(sys.argv[1:] + shlex.split(os.environ.get("FAULTY", "")))
    if args.ignore_term:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    if args.pidfile:
        write_atomically(args.pidfile, os.getpid())
    if args.grandchild:
        child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(300)"],
                                 start_new_session=True, stdin=subprocess.DEVNULL,
                                 stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        write_atomically(args.grandchild, child.pid)
    try:
        Faulty(args).serve()
    except BrokenPipeError:
        pass
    if args.linger:
        with contextlib.suppress(OSError):  # nobody may read stderr any more: linger anyway
            sys.stderr.write(f"faulty {args.name}: stdin closed; lingering\n")
            sys.stderr.flush()
        time.sleep(300)


def write_atomically(path: str, pid: int) -> None:
    tmp = f"{path}.tmp"
    Path(tmp).write_text(str(pid), encoding="utf-8")
    os.replace(tmp, path)


if __name__ == "__main__":
    main()
