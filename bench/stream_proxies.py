"""Streamed updates a second through one built-in in-process proxy, against passthrough.

    python bench/stream_proxies.py [--proxies passthrough,permissions,...] [--count N]

For each proxy, a chain of that proxy in front of the bench agent is started (a real
conductor, `--chain`); the agent streams `--count` small `session/update`s a prompt, one
write each, and the median over `--prompts` prompts is printed with its ratio to
passthrough's. It shows what a proxy's interest in `session/update` costs: a handler takes
the stream off the router's shortcut, a watcher does not (docs/performance.md).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

BENCH = Path(__file__).resolve().parent
PROXIES = ("passthrough", "permissions", "session-tools", "transcript", "redact")


def chain_file(work: Path, proxy: str) -> Path:
    path = work / f"{proxy}.toml"
    # The transcript writes into the temporary folder, not wherever this was run from.
    options = f"options = {{ directory = {json.dumps(str(work / 'transcripts'))} }}\n" \
        if proxy == "transcript" else ""
    path.write_text(f'[[proxy]]\nuse = "{proxy}"\n{options}\n[agent]\ncommand = '
                    f'{json.dumps([sys.executable, str(BENCH / "agent.py")])}\n',
                    encoding="utf-8")
    return path


class Editor:
    """Writes requests to a conductor and counts the frames before each answer."""

    def __init__(self, chain: Path) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "conductor", "--chain", str(chain)],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
            bufsize=0)
        assert self.proc.stdin is not None
        assert self.proc.stdout is not None
        self.stdin, self.fd = self.proc.stdin, self.proc.stdout.fileno()
        self.buf = b""

    def request(self, ident: int, method: str, params: object) -> int:
        """Send a request; the number of frames that arrived before its answer."""
        self.stdin.write(json.dumps({"jsonrpc": "2.0", "id": ident, "method": method,
                                     "params": params}).encode() + b"\n")
        key, frames = b'"id":%d,' % ident, 0
        while True:
            *lines, self.buf = self.buf.split(b"\n")
            for n, line in enumerate(lines):
                if key in line and b'"method"' not in line:
                    self.buf = b"\n".join([*lines[n + 1:], self.buf])
                    return frames
                frames += 1
            chunk = os.read(self.fd, 1 << 20)
            if not chunk:
                sys.exit(f"the conductor closed its stdout (exit {self.proc.wait()})")
            self.buf += chunk

    def close(self) -> None:
        self.stdin.close()
        self.proc.wait(timeout=10)


def measure(chain: Path, count: int, prompts: int) -> float:
    editor = Editor(chain)
    try:
        editor.request(0, "initialize", {"protocolVersion": 1, "clientCapabilities": {}})
        editor.request(1, "session/new", {"cwd": str(chain.parent), "mcpServers": []})
        rates = []
        for n in range(prompts):
            start = time.perf_counter()
            frames = editor.request(2 + n, "session/prompt", {
                "sessionId": "bench", "prompt": [],
                "_meta": {"bench": {"op": "stream", "count": count, "size": 32,
                                    "burst": False}}})
            rates.append(frames / (time.perf_counter() - start))
        return statistics.median(rates)
    finally:
        editor.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--proxies", default=",".join(PROXIES))
    parser.add_argument("--count", type=int, default=20_000, help="updates a prompt")
    parser.add_argument("--prompts", type=int, default=7)
    args = parser.parse_args()
    names = [p for p in args.proxies.split(",") if p]
    with tempfile.TemporaryDirectory() as tmp:
        rates = {name: measure(chain_file(Path(tmp), name), args.count, args.prompts)
                 for name in names}
    base = rates.get("passthrough")
    print(f"{'proxy':<16}{'updates/s':>12}{'vs passthrough':>16}")
    for name, rate in rates.items():
        ratio = f"×{rate / base:.2f}" if base else "-"
        print(f"{name:<16}{rate / 1000:>11.0f}k{ratio:>16}")


if __name__ == "__main__":
    main()
