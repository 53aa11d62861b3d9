"""Soak: open and close many sessions through a real conductor and print its RSS as it goes.

    python bench/soak.py                         # 30,000 sessions, the four built-in proxies
    python bench/soak.py --sessions 100000 --every 20000
    python bench/soak.py --proxies none          # the router alone
    python bench/soak.py --end forget --idle-expiry 1
                                                 # never close: idle expiry releases them
    python bench/soak.py --checkout ../other-worktree   # another checkout's conductor

The conductor runs `--chain` with the built-in in-process proxies (permissions, context,
redact, transcript; transcripts go to a temporary directory) in front of a small agent
(this file, `--agent`) that gives every session its own id. This script is the editor:
per session it sends `session/new`, one `session/prompt` (the agent streams one update
back) and `session/close`, a hundred sessions at a time, and prints the conductor's
resident set size every `--every` sessions. A conductor that releases what each session
holds stays flat after warm-up; one that keeps something per session grows by that much
per session (issue 11.4: 3.5 KB per session before the fix).

However the soak ends (finished, an error answer, the conductor too slow to exit, Ctrl-C,
SIGTERM or SIGHUP), it leaves no process behind: the conductor gets EOF on its stdin, then
`--exit-timeout` seconds later SIGTERM (it stops its components), then as long again
SIGKILL (its watchdog stops them). Killed with SIGKILL itself, the soak cannot clean up,
but its end closes the conductor's stdin, on which the conductor shuts down.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
PY = sys.executable
BUILT_INS = ("permissions", "context", "redact", "transcript")
BATCH = 100
EXIT_TIMEOUT = 30.0  # seconds the conductor gets to exit at each step of `Editor.reap`


# -- the agent (--agent) ----------------------------------------------------------------------

def serve_agent() -> None:
    """Every session/new gets a fresh id; prompts stream one update; close succeeds."""
    sessions = 0
    out = sys.stdout.buffer
    for line in sys.stdin.buffer:
        if not line.strip():
            continue
        msg = json.loads(line)
        if "id" not in msg or "method" not in msg:
            continue
        method, params = msg["method"], msg.get("params") or {}
        result: object = {}
        if method == "initialize":
            result = {"protocolVersion": params.get("protocolVersion", 1),
                      "agentCapabilities": {"loadSession": True,
                                            "sessionCapabilities": {"close": {}}},
                      "authMethods": []}
        elif method == "session/new":
            sessions += 1
            result = {"sessionId": f"soak-{sessions}"}
        elif method == "session/prompt":
            update = {"jsonrpc": "2.0", "method": "session/update", "params": {
                "sessionId": params.get("sessionId"),
                "update": {"sessionUpdate": "agent_message_chunk",
                           "content": {"type": "text", "text": "ok"}}}}
            out.write(json.dumps(update).encode() + b"\n")
            result = {"stopReason": "end_turn"}
        out.write(json.dumps({"jsonrpc": "2.0", "id": msg["id"], "result": result}).encode()
                  + b"\n")
        out.flush()


# -- the editor -------------------------------------------------------------------------------

def chain_file(work: Path, proxies: list[str], idle_expiry: float | None) -> Path:
    lines = []
    if idle_expiry is not None:
        lines += ["[conductor]", f"session_idle_expiry = {idle_expiry}", ""]
    options = {
        "permissions": '{ default = "allow", rules = [{ path = ".env*", action = "deny" }] }',
        "context": '{ text = "Answer briefly.", when = "first" }',
        "redact": '{ patterns = ["sk-[A-Za-z0-9]{8,}"] }',
        "transcript": "{ directory = " + json.dumps(str(work / "transcripts")) + " }",
    }
    for name in proxies:
        lines += ["[[proxy]]", f'use = "{name}"', f"options = {options[name]}", ""]
    lines += ["[agent]", f"command = {json.dumps([PY, str(Path(__file__).resolve()), '--agent'])}"]
    path = work / "soak.toml"
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


class Editor:
    """The conductor, driven with blocking reads and writes. A context manager: on the way
    out, however that happens, the conductor is reaped (`reap`)."""

    def __init__(self, chain: Path, stderr: Path, checkout: Path = REPO,
                 exit_timeout: float = EXIT_TIMEOUT) -> None:
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(checkout),
                                                          env.get("PYTHONPATH")]))
        self.exit_timeout = exit_timeout
        self._stderr = stderr.open("wb")
        # In our process group, as an editor's agent is: Ctrl-C reaches it too, and it stops
        # its components itself (each in a group of its own, which a group kill would miss).
        self.proc = subprocess.Popen([PY, "-m", "conductor", "--chain", str(chain)],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     stderr=self._stderr, env=env, cwd=chain.parent)
        self._next = 0
        self._pending: list[bytes] = []

    def __enter__(self) -> Editor:
        return self

    def __exit__(self, *exc: object) -> None:
        self.reap()

    def send(self, method: str, params: object) -> int:
        self._next += 1
        self._pending.append(json.dumps({"jsonrpc": "2.0", "id": self._next, "method": method,
                                         "params": params}).encode() + b"\n")
        return self._next

    def flush_and_wait(self) -> dict[int, dict[str, object]]:
        """Write what was queued; read until each of those requests has its answer."""
        assert self.proc.stdin is not None
        assert self.proc.stdout is not None
        wanted = len(self._pending)
        self.proc.stdin.write(b"".join(self._pending))
        self.proc.stdin.flush()
        self._pending.clear()
        answers: dict[int, dict[str, object]] = {}
        while len(answers) < wanted:
            line = self.proc.stdout.readline()
            if not line:
                raise SystemExit(f"the conductor exited ({self.proc.wait()}); see its stderr")
            msg = json.loads(line)
            if "id" in msg and "method" not in msg:
                if "error" in msg:
                    raise SystemExit(f"error answer: {msg}")
                answers[msg["id"]] = msg
        return answers

    def rss(self) -> int:
        with open(f"/proc/{self.proc.pid}/status", encoding="utf-8") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) * 1024
        raise RuntimeError("no VmRSS")

    def close(self) -> int:
        """EOF on the conductor's stdin, its cue to shut down; its exit code once it has."""
        self._close_stdin()
        try:
            return self.proc.wait(timeout=self.exit_timeout)
        except subprocess.TimeoutExpired:
            raise SystemExit(f"the conductor did not exit within {self.exit_timeout:g}s of "
                             "its stdin closing") from None

    def reap(self) -> None:
        """Leave no process behind: EOF, then SIGTERM (the conductor stops its components),
        then SIGKILL (its watchdog stops them), each after `exit_timeout` seconds."""
        again: BaseException | None = None
        for step in (self._close_stdin, self.proc.terminate, self.proc.kill):
            if self.proc.poll() is not None:
                break
            try:
                step()
                self.proc.wait(timeout=self.exit_timeout)
            except subprocess.TimeoutExpired:
                continue
            except (KeyboardInterrupt, SystemExit) as e:  # asked again: stop waiting
                again = e
                self.proc.kill()
                break
        self.proc.wait()  # after SIGKILL: at once
        for stream in (self.proc.stdin, self.proc.stdout):
            if stream is not None:
                with contextlib.suppress(OSError):
                    stream.close()
        self._stderr.close()
        if again is not None:
            raise again

    def _close_stdin(self) -> None:
        # The pipe itself, not its buffer: flushing a write that was cut off half-way could
        # block for ever on a conductor that no longer reads.
        stdin = self.proc.stdin
        if stdin is not None:
            with contextlib.suppress(OSError):
                getattr(stdin, "raw", stdin).close()


def _exit_on_signal(signum: int, frame: object) -> None:
    """SIGTERM and SIGHUP end the soak as Ctrl-C does: through the cleanup, not around it."""
    raise SystemExit(128 + signum)


def soak(args: argparse.Namespace) -> None:
    proxies = [] if args.proxies == "none" else args.proxies.split(",")
    for signum in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(signum, _exit_on_signal)
    with tempfile.TemporaryDirectory(prefix="acp-soak-") as tmp:
        work = Path(tmp)
        try:
            with Editor(chain_file(work, proxies, args.idle_expiry), work / "stderr.log",
                        Path(args.checkout), args.exit_timeout) as editor:
                run(args, editor, work, proxies)
        except (SystemExit, Exception):  # the conductor is reaped: its stderr is complete
            log = (work / "stderr.log").read_text(encoding="utf-8", errors="replace")
            tail = log[-4000:]
            sys.stderr.write(tail if tail == log else tail[tail.find("\n") + 1:])  # whole lines
            raise


def run(args: argparse.Namespace, editor: Editor, work: Path, proxies: list[str]) -> None:
    """One soak: the editor's side, and the figures it prints."""
    editor.send("initialize", {"protocolVersion": 1, "clientCapabilities": {},
                               "clientInfo": {"name": "soak", "version": "0"}})
    editor.flush_and_wait()
    print(f"chain: {', '.join(proxies) or 'no proxies'} -> agent; "
          f"sessions {'closed' if args.end == 'close' else 'forgotten'}, "
          f"{'one prompt each' if args.prompt else 'no prompts'}")
    print(f"{'sessions':>9}  {'RSS MB':>7}  {'since last':>10}  {'per session':>11}  "
          f"{'seconds':>7}")
    start, last_rss, last_n = time.perf_counter(), editor.rss(), 0
    print(f"{0:>9}  {last_rss / 2**20:>7.1f}")
    done = 0
    while done < args.sessions:
        n = min(BATCH, args.sessions - done)
        ids = [editor.send("session/new", {"cwd": str(work), "mcpServers": []})
               for _ in range(n)]
        answers = editor.flush_and_wait()
        sessions = [answers[i]["result"]["sessionId"] for i in ids]  # type: ignore[index]
        if args.prompt:
            for sid in sessions:
                editor.send("session/prompt", {"sessionId": sid, "prompt": [
                    {"type": "text", "text": "hello sk-abcdefgh1234"}]})
            editor.flush_and_wait()
        if args.end == "close":
            for sid in sessions:
                editor.send("session/close", {"sessionId": sid})
            editor.flush_and_wait()
        done += n
        if done % args.every == 0 or done == args.sessions:
            if args.end == "forget" and args.idle_expiry is not None:
                time.sleep(args.idle_expiry * 2.5)  # let expiry run before measuring
            rss = editor.rss()
            print(f"{done:>9}  {rss / 2**20:>7.1f}  {(rss - last_rss) / 2**20:>+9.1f}M  "
                  f"{(rss - last_rss) / (done - last_n):>10.0f}B  "
                  f"{time.perf_counter() - start:>7.1f}", flush=True)
            last_rss, last_n = rss, done
    closing = time.perf_counter()
    code = editor.close()
    print(f"the conductor exited {code} in {time.perf_counter() - closing:.1f}s")
    if code != 0:
        raise SystemExit(f"the conductor exited {code}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--agent", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--sessions", type=int, default=30_000)
    parser.add_argument("--every", type=int, default=10_000, help="print RSS every N sessions")
    parser.add_argument("--proxies", default=",".join(BUILT_INS),
                        help="comma-separated built-in proxies, or none")
    parser.add_argument("--no-prompt", dest="prompt", action="store_false",
                        help="open and close only")
    parser.add_argument("--end", choices=("close", "forget"), default="close",
                        help="session/close each session, or just stop using it")
    parser.add_argument("--idle-expiry", type=float, default=None,
                        help="[conductor] session_idle_expiry, in seconds")
    parser.add_argument("--checkout", default=str(REPO),
                        help="run the conductor of this checkout (compare before/after)")
    parser.add_argument("--exit-timeout", type=float, default=EXIT_TIMEOUT,
                        help="seconds the conductor gets to exit after its stdin closes "
                             "(then SIGTERM, as long again, then SIGKILL)")
    args = parser.parse_args()
    if args.agent:
        serve_agent()
    else:
        soak(args)


if __name__ == "__main__":
    main()
