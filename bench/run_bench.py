"""Benchmark the conductor against the same agent talked to directly and through a byte relay.

    python bench/run_bench.py            # full run (about 2-3 minutes on 2 cores)
    python bench/run_bench.py --quick    # a smaller run, for a quick check
    python bench/run_bench.py --only relay,conductor+0 --json out.json

This script is the editor: it starts each variant over real pipes, speaks ACP to it with
blocking reads and writes (so the editor side is never the bottleneck), and prints one
table of figures with ratios against the relay measured in the same run, then the targets
with PASS/FAIL. See docs/performance.md for what each figure means.

Variants are a list (`VARIANTS`); add a chain shape by appending one `Variant`.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import msgspec

if TYPE_CHECKING:
    from collections.abc import Callable

REPO = Path(__file__).resolve().parent.parent
BENCH = REPO / "bench"
PY = sys.executable
MiB = 1024 * 1024

# -- what the editor starts --------------------------------------------------------------

AGENT = [PY, str(BENCH / "agent.py")]
PASSTHROUGH = [PY, str(REPO / "proxies" / "passthrough_stdio.py")]  # stdlib json stdio proxy
# the plugin, as a process
PLUGIN_STANDALONE = [PY, "-m", "conductor", "serve-proxy", "passthrough"]
FAST_PASSTHROUGH = [PY, str(BENCH / "fast_passthrough.py")]         # msgspec, Raw payloads


def in_process_chain(workdir: Path, n: int) -> list[str]:
    """`acp-conductor --chain` with N in-process passthrough plugins (`use = "passthrough"`)."""
    chain = workdir / f"inprocess-{n}.toml"
    proxies = "".join(f'[[proxy]]\nname = "p{i}"\nuse = "passthrough"\n\n' for i in range(n))
    chain.write_text(f"{proxies}[agent]\ncommand = {json.dumps(AGENT)}\n", encoding="utf-8")
    return [PY, "-m", "conductor", "--chain", str(chain)]


def conductor(*components: list[str]) -> list[str]:
    """`acp-conductor agent PROXY... AGENT` run from this checkout."""
    return [PY, "-m", "conductor", "agent", *(shlex.join(c) for c in components)]


@dataclass(frozen=True)
class Variant:
    name: str                                   # column header
    about: str                                  # one line for the legend
    argv: Callable[[Path], list[str]]           # workdir -> the command the editor starts
    quick: bool = True                          # also run under --quick
    pythonpath: Path = REPO                     # which checkout's conductor runs


VARIANTS: list[Variant] = [
    Variant("direct", "the bench agent, no hop", lambda _: AGENT),
    Variant("relay", "bench/relay.py: one byte-copying process in between (the floor)",
            lambda _: [PY, str(BENCH / "relay.py"), *AGENT]),
    Variant("conductor+0", "acp-conductor agent AGENT",
            lambda _: conductor(AGENT)),
    Variant("conductor+1i", "one in-process passthrough plugin (use = \"passthrough\")",
            lambda w: in_process_chain(w, 1)),
    Variant("conductor+3i", "three in-process passthrough plugins",
            lambda w: in_process_chain(w, 3)),
    Variant("conductor+1p", "the passthrough plugin stand-alone (serve-proxy passthrough)",
            lambda _: conductor(PLUGIN_STANDALONE, AGENT), quick=False),
    Variant("conductor+1", "one proxies/passthrough_stdio.py (json) in front of the agent",
            lambda _: conductor(PASSTHROUGH, AGENT)),
    Variant("conductor+3", "three proxies/passthrough.py (json)",
            lambda _: conductor(PASSTHROUGH, PASSTHROUGH, PASSTHROUGH, AGENT), quick=False),
    Variant("conductor+1f", "one bench/fast_passthrough.py (msgspec, Raw payloads)",
            lambda _: conductor(FAST_PASSTHROUGH, AGENT)),
    Variant("conductor+3f", "three bench/fast_passthrough.py",
            lambda _: conductor(FAST_PASSTHROUGH, FAST_PASSTHROUGH, FAST_PASSTHROUGH, AGENT)),
]
BASELINE = "relay"
TARGET_VARIANT = "conductor+0"


@dataclass(frozen=True)
class Sizes:
    startups: int
    warmup: int
    requests: int
    small_count: int
    small_text: int
    large_count: int
    large_text: int
    big_prompt: int
    reps: int


FULL = Sizes(startups=3, warmup=200, requests=2000, small_count=20_000, small_text=32,
             large_count=200, large_text=64 * 1024, big_prompt=10 * 1000 * 1000, reps=5)
QUICK = Sizes(startups=1, warmup=50, requests=300, small_count=5_000, small_text=32,
              large_count=50, large_text=64 * 1024, big_prompt=10 * 1000 * 1000, reps=1)

# -- the editor ----------------------------------------------------------------------------


class BenchError(RuntimeError):
    pass


class _Response(msgspec.Struct):
    id: int | None = None
    result: msgspec.Raw | msgspec.UnsetType = msgspec.UNSET
    error: msgspec.Raw | msgspec.UnsetType = msgspec.UNSET


_response = msgspec.json.Decoder(_Response)


def child_env(pythonpath: Path) -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(pythonpath), env.get("PYTHONPATH")]))
    return env


class Editor:
    """One running variant, driven with blocking I/O on its pipes."""

    profile_dir: Path | None = None

    def __init__(self, argv: list[str], stderr_path: Path, pythonpath: Path = REPO) -> None:
        if self.profile_dir is not None and argv[1:3] == ["-m", "conductor"]:
            out = self.profile_dir / f"{stderr_path.stem}.prof"
            argv = [argv[0], "-m", "cProfile", "-o", str(out), *argv[1:]]
        self._stderr = stderr_path.open("ab")
        self.started = time.perf_counter()
        self.proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     stderr=self._stderr, bufsize=0, env=child_env(pythonpath),
                                     cwd=pythonpath)  # `-m` puts the cwd first on sys.path
        assert self.proc.stdin is not None
        assert self.proc.stdout is not None
        self.wfd = self.proc.stdin.fileno()
        self.rfd = self.proc.stdout.fileno()
        self.buf = bytearray()
        self.ids = 0
        self.stderr_path = stderr_path

    # raw I/O
    def write(self, data: bytes) -> None:
        view = memoryview(data)
        while view:
            view = view[os.write(self.wfd, view):]

    def _fill(self) -> int:
        chunk = os.read(self.rfd, 1 << 20)
        if not chunk:
            raise BenchError(f"the variant closed its stdout; see {self.stderr_path}")
        self.buf += chunk
        return len(chunk)

    def read_frame(self) -> bytes:
        scan = 0
        while (nl := self.buf.find(b"\n", scan)) < 0:
            scan = len(self.buf)
            self._fill()
        frame = bytes(self.buf[:nl])
        del self.buf[:nl + 1]
        return frame

    def skip_frames(self, n: int) -> int:
        """Consume `n` frames without decoding them; return their bytes (newlines included)."""
        total = 0
        while n:
            if not self.buf:
                self._fill()
            count = self.buf.count(b"\n")
            if count <= n:
                cut = self.buf.rfind(b"\n") + 1
                n -= count
            else:
                cut = 0
                for _ in range(n):
                    cut = self.buf.index(b"\n", cut) + 1
                n = 0
            total += cut
            del self.buf[:cut]
            if n and not self.buf:
                continue
            if n:
                self._fill()
        return total

    # JSON-RPC
    def send_request(self, method: str, params: bytes) -> int:
        self.ids += 1
        self.write(b'{"jsonrpc":"2.0","id":%d,"method":"%s","params":%s}\n'
                   % (self.ids, method.encode(), params))
        return self.ids

    def expect_response(self, ident: int, frame: bytes) -> bytes:
        try:
            msg = _response.decode(frame)
        except msgspec.MsgspecError as e:
            raise BenchError(f"expected the response to {ident}, got {frame[:200]!r}") from e
        if msg.id != ident or msg.result is msgspec.UNSET:
            raise BenchError(f"expected a result for id {ident}, got {frame[:300]!r}")
        return bytes(msg.result)

    def call(self, method: str, params: bytes) -> bytes:
        ident = self.send_request(method, params)
        return self.expect_response(ident, self.read_frame())

    def peak_rss(self) -> int:
        """VmHWM of the process the editor started: its peak resident set so far."""
        with open(f"/proc/{self.proc.pid}/status", encoding="utf-8") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024
        raise BenchError("no VmHWM in /proc status")

    def close(self) -> None:
        try:
            self.proc.stdin.close()  # type: ignore[union-attr]
        except OSError:
            pass
        try:
            self.proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
            raise BenchError(
                f"the variant did not exit within 15 s of EOF; see {self.stderr_path}") from None
        finally:
            self.proc.stdout.close()  # type: ignore[union-attr]
            self._stderr.close()


INIT = b'{"protocolVersion":1,"clientCapabilities":{"fs":{"readTextFile":false}},' \
       b'"clientInfo":{"name":"bench","version":"0"}}'


def prompt(op: dict[str, object], text: str = "hi") -> bytes:
    return msgspec.json.encode({"sessionId": "bench",
                                "prompt": [{"type": "text", "text": text}],
                                "_meta": {"bench": op}})


def end_turn(result: bytes) -> None:
    if b"end_turn" not in result:
        raise BenchError(f"expected end_turn, got {result[:200]!r}")


# -- measurements --------------------------------------------------------------------------


@dataclass
class Figures:
    startup_s: float = 0.0
    p50_s: float = 0.0
    p99_s: float = 0.0
    small_msgs: float = 0.0
    small_mbs: float = 0.0
    burst_msgs: float = 0.0
    burst_mbs: float = 0.0
    large_msgs: float = 0.0
    large_mbs: float = 0.0
    big_rt_s: float = 0.0
    peak_rss: int = 0
    largest_frame: int = 0
    notes: list[str] = field(default_factory=list)


def measure_startup(variant: Variant, work: Path) -> float:
    editor = Editor(variant.argv(work), work / f"{variant.name}.stderr", variant.pythonpath)
    editor.call("initialize", INIT)
    elapsed = time.perf_counter() - editor.started
    editor.close()
    return elapsed


def stream(editor: Editor, count: int, size: int, burst: bool = False) -> tuple[float, int]:
    """Ask for `count` updates of `size` text bytes; return (seconds, bytes received)."""
    t0 = time.perf_counter()
    ident = editor.send_request("session/prompt", prompt({"op": "stream", "count": count,
                                                           "size": size, "burst": burst}))
    got = editor.skip_frames(count)
    last = editor.read_frame()
    elapsed = time.perf_counter() - t0
    end_turn(editor.expect_response(ident, last))
    return elapsed, got + len(last) + 1


def round_trip(editor: Editor, size: int) -> tuple[float, int]:
    """Send a prompt of `size` text bytes; the agent echoes it back in one update."""
    text = "y" * size
    params = prompt({"op": "echo"}, text)
    editor.ids += 1
    ident = editor.ids
    frame = b'{"jsonrpc":"2.0","id":%d,"method":"session/prompt","params":%s}\n' % (ident, params)
    t0 = time.perf_counter()
    writer = threading.Thread(target=editor.write, args=(frame,))  # read while we write
    writer.start()
    echoed = editor.read_frame()
    last = editor.read_frame()
    elapsed = time.perf_counter() - t0
    writer.join()
    # JSON-equal, not byte-equal: proxies/passthrough.py re-serialises with `json`.
    content = msgspec.json.decode(echoed)["params"]["update"]["content"]
    if content != {"type": "text", "text": text}:
        raise BenchError("the echoed prompt is not the one sent")
    end_turn(editor.expect_response(ident, last))
    return elapsed, max(len(frame), len(echoed) + 1)


def latencies(editor: Editor, count: int) -> list[float]:
    ping = prompt({"op": "ping"})
    clock = time.perf_counter
    out = []
    for _ in range(count):
        t0 = clock()
        result = editor.call("session/prompt", ping)
        out.append(clock() - t0)
        end_turn(result)
    return out


def measure_all(variants: list[Variant], work: Path, sizes: Sizes,
                progress: Callable[[str], None]) -> dict[str, Figures]:
    """Every phase runs each variant in turn, round after round, so that load from anything
    else on the machine spreads over all variants instead of skewing one of them."""
    figs = {v.name: Figures() for v in variants}
    progress("startup")
    starts: dict[str, list[float]] = {v.name: [] for v in variants}
    for _ in range(sizes.startups):
        for v in variants:
            starts[v.name].append(measure_startup(v, work))
    for v in variants:
        figs[v.name].startup_s = statistics.median(starts[v.name])

    editors: dict[str, Editor] = {}
    try:
        for v in variants:
            editor = Editor(v.argv(work), work / f"{v.name}.stderr", v.pythonpath)
            editors[v.name] = editor
            editor.call("initialize", INIT)
            editor.call("session/new", b'{"cwd":"/tmp","mcpServers":[]}')
            latencies(editor, sizes.warmup)

        progress("latency")
        lat: dict[str, list[float]] = {v.name: [] for v in variants}
        blocks = 4
        for _ in range(blocks):
            for v in variants:
                lat[v.name] += latencies(editors[v.name], sizes.requests // blocks)
        for v in variants:
            xs = sorted(lat[v.name])
            figs[v.name].p50_s = xs[len(xs) // 2]
            figs[v.name].p99_s = xs[min(len(xs) - 1, int(len(xs) * 0.99))]

        def rounds(run: Callable[[Editor], tuple[float, int]]) -> dict[str, tuple[float, int]]:
            got: dict[str, list[tuple[float, int]]] = {v.name: [] for v in variants}
            for _ in range(sizes.reps):
                for v in variants:
                    got[v.name].append(run(editors[v.name]))
            return {k: (statistics.median(r[0] for r in rs), max(r[1] for r in rs))
                    for k, rs in got.items()}

        progress("small updates")
        for name, (secs, nbytes) in rounds(
                lambda e: stream(e, sizes.small_count, sizes.small_text)).items():
            figs[name].small_msgs, figs[name].small_mbs = sizes.small_count / secs, \
                nbytes / secs / MiB
        progress("small updates, burst-written")
        for name, (secs, nbytes) in rounds(
                lambda e: stream(e, sizes.small_count, sizes.small_text, burst=True)).items():
            figs[name].burst_msgs, figs[name].burst_mbs = sizes.small_count / secs, \
                nbytes / secs / MiB
        progress("64 KiB updates")
        for name, (secs, nbytes) in rounds(
                lambda e: stream(e, sizes.large_count, sizes.large_text)).items():
            figs[name].large_msgs, figs[name].large_mbs = sizes.large_count / secs, \
                nbytes / secs / MiB
            figs[name].largest_frame = nbytes // sizes.large_count
        progress("10 MB round trip")
        for name, (secs, nbytes) in rounds(lambda e: round_trip(e, sizes.big_prompt)).items():
            figs[name].big_rt_s = secs
            figs[name].largest_frame = max(figs[name].largest_frame, nbytes)
        for v in variants:
            figs[v.name].peak_rss = editors[v.name].peak_rss()
    finally:
        for editor in editors.values():
            editor.close()
    return figs


# -- report --------------------------------------------------------------------------------

ROWS: list[tuple[str, str, Callable[[Figures], float], Callable[[float], str]]] = [
    # label, unit, value, format
    ("startup to initialize", "ms", lambda f: f.startup_s * 1e3, lambda v: f"{v:.0f}"),
    ("request latency p50", "µs", lambda f: f.p50_s * 1e6, lambda v: f"{v:.0f}"),
    ("request latency p99", "µs", lambda f: f.p99_s * 1e6, lambda v: f"{v:.0f}"),
    ("small updates", "msg/s", lambda f: f.small_msgs, lambda v: f"{v / 1000:.1f}k"),
    ("small updates", "MB/s", lambda f: f.small_mbs, lambda v: f"{v:.1f}"),
    ("small updates, burst-written", "msg/s", lambda f: f.burst_msgs,
     lambda v: f"{v / 1000:.1f}k"),
    ("small updates, burst-written", "MB/s", lambda f: f.burst_mbs, lambda v: f"{v:.1f}"),
    ("64 KiB updates", "msg/s", lambda f: f.large_msgs, lambda v: f"{v:.0f}"),
    ("64 KiB updates", "MB/s", lambda f: f.large_mbs, lambda v: f"{v:.0f}"),
    ("10 MB prompt round trip", "ms", lambda f: f.big_rt_s * 1e3, lambda v: f"{v:.0f}"),
    ("peak RSS of started proc", "MB", lambda f: f.peak_rss / MiB, lambda v: f"{v:.1f}"),
]


def table(results: dict[str, Figures]) -> str:
    names = list(results)
    base = results.get(BASELINE)
    label_w = max(len(f"{label} ({unit})") for label, unit, _, _ in ROWS)
    cells: list[list[str]] = []
    for label, unit, value, fmt in ROWS:
        row = [f"{label} ({unit})"]
        for name in names:
            v = value(results[name])
            cell = fmt(v)
            if base is not None and name != BASELINE and value(base):
                cell += f" ×{v / value(base):.2f}"
            row.append(cell)
        cells.append(row)
    widths = [label_w] + [max(len(n), *(len(r[i + 1]) for r in cells)) for i, n in
                          enumerate(names)]
    lines = ["  ".join(h.rjust(w) if i else h.ljust(w)
                       for i, (h, w) in enumerate(zip(["", *names], widths, strict=True)))]
    lines.append("  ".join("-" * w for w in widths))
    for row in cells:
        lines.append("  ".join(c.rjust(w) if i else c.ljust(w)
                               for i, (c, w) in enumerate(zip(row, widths, strict=True))))
    return "\n".join(lines)


def in_process_targets(results: dict[str, Figures]) -> list[tuple[str, bool, str]]:
    """Issue 4: three in-process passthroughs cost at most 1.2x the bare conductor."""
    zero, three = results.get(TARGET_VARIANT), results.get("conductor+3i")
    if zero is None or three is None:
        return []
    return [
        ("p50 latency ≤ 1.2× conductor+0", three.p50_s <= 1.2 * zero.p50_s,
         f"{three.p50_s * 1e6:.0f} µs vs {zero.p50_s * 1e6:.0f} µs "
         f"(×{three.p50_s / zero.p50_s:.2f})"),
        ("small-message throughput ≥ 1/1.2 of conductor+0",
         three.small_msgs * 1.2 >= zero.small_msgs,
         f"{three.small_msgs:.0f} vs {zero.small_msgs:.0f} msg/s "
         f"(×{zero.small_msgs / three.small_msgs:.2f} slower)"),
    ]


def targets(results: dict[str, Figures]) -> list[tuple[str, bool, str]]:
    base, fig = results.get(BASELINE), results.get(TARGET_VARIANT)
    if base is None or fig is None:
        return []
    rss_limit = 64 * MiB + 2 * fig.largest_frame
    return [
        ("p50 latency ≤ 1.5× relay", fig.p50_s <= 1.5 * base.p50_s,
         f"{fig.p50_s * 1e6:.0f} µs vs {base.p50_s * 1e6:.0f} µs (×{fig.p50_s / base.p50_s:.2f})"),
        ("small-message throughput ≥ 50% of relay", fig.small_msgs >= 0.5 * base.small_msgs,
         f"{fig.small_msgs:.0f} vs {base.small_msgs:.0f} msg/s "
         f"({100 * fig.small_msgs / base.small_msgs:.0f}%)"),
        ("  the same, agent writing 1 MiB bursts", fig.burst_msgs >= 0.5 * base.burst_msgs,
         f"{fig.burst_msgs:.0f} vs {base.burst_msgs:.0f} msg/s "
         f"({100 * fig.burst_msgs / base.burst_msgs:.0f}%)"),
        ("10 MB round trip ≤ 1.5× relay", fig.big_rt_s <= 1.5 * base.big_rt_s,
         f"{fig.big_rt_s * 1e3:.0f} ms vs {base.big_rt_s * 1e3:.0f} ms "
         f"(×{fig.big_rt_s / base.big_rt_s:.2f})"),
        ("peak RSS < 64 MB + 2× largest frame", fig.peak_rss < rss_limit,
         f"{fig.peak_rss / MiB:.1f} MB vs limit {rss_limit / MiB:.1f} MB "
         f"(largest frame {fig.largest_frame / MiB:.1f} MB)"),
    ]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="smaller counts, one repetition")
    parser.add_argument("--only", help="comma-separated variant names (default: all)")
    parser.add_argument("--json", type=Path, help="also write the figures here")
    parser.add_argument("--compare", type=Path, metavar="CHECKOUT",
                        help="also run the conductor variants from another checkout")
    parser.add_argument("--profile", type=Path, metavar="DIR",
                        help="run each conductor under cProfile, writing DIR/VARIANT.prof "
                             "(the overhead distorts every figure: use for where, not how fast)")
    args = parser.parse_args()
    sizes = QUICK if args.quick else FULL
    if args.profile:
        args.profile.mkdir(parents=True, exist_ok=True)
        Editor.profile_dir = args.profile.resolve()
    chosen = [v for v in VARIANTS if args.quick is False or v.quick]
    if args.only:
        wanted = set(args.only.split(","))
        chosen = [v for v in VARIANTS if v.name in wanted]
        unknown = wanted - {v.name for v in chosen}
        if unknown:
            parser.error(f"unknown variants: {', '.join(sorted(unknown))}")

    if args.compare:
        # The same chain shapes run from another checkout (e.g. `mkdir /tmp/old && git archive
        # HEAD~3 | tar -x -C /tmp/old`), interleaved with this one: before/after in one table.
        for v in [v for v in chosen if v.name.startswith("conductor")]:
            chosen.append(Variant(f"{v.name}@{args.compare.name}", f"{v.about} ({args.compare})",
                                  v.argv, v.quick, args.compare.resolve()))

    t_all = time.perf_counter()
    print(f"variants: {', '.join(v.name for v in chosen)}", file=sys.stderr)
    with tempfile.TemporaryDirectory(prefix="acp-bench-") as tmp:
        work = Path(tmp)
        try:
            results = measure_all(chosen, work, sizes, lambda phase: print(
                f"  {time.perf_counter() - t_all:5.1f}s  {phase}", file=sys.stderr))
        except BenchError as e:
            print(f"FAILED: {e}", file=sys.stderr)
            for log in sorted(work.glob("*.stderr")):
                text = log.read_text(encoding="utf-8", errors="replace")[-2000:]
                if text.strip():
                    sys.stderr.write(f"--- {log.name}\n{text}\n")
            return 1

    nproc = os.cpu_count()
    print(f"\nacp-conductor benchmark ({'quick' if args.quick else 'full'}): "
          f"Python {sys.version.split()[0]}, {nproc} CPUs, {time.perf_counter() - t_all:.0f}s")
    print(f"{sizes.requests} requests; {sizes.small_count} × {sizes.small_text} B and "
          f"{sizes.large_count} × {sizes.large_text // 1024} KiB updates; "
          f"{sizes.big_prompt / 1e6:.0f} MB prompt; median of {sizes.reps}. "
          f"×N = this variant / {BASELINE}.\n")
    print(table(results))
    checks = targets(results)
    if checks:
        print(f"\ntargets ({TARGET_VARIANT} vs {BASELINE}):")
        for label, ok, detail in checks:
            print(f"  {'PASS' if ok else 'FAIL'}  {label}: {detail}")
    inproc = in_process_targets(results)
    if inproc:
        print("\ntargets (3 in-process passthroughs vs conductor+0):")
        for label, ok, detail in inproc:
            print(f"  {'PASS' if ok else 'FAIL'}  {label}: {detail}")
    checks = [*checks, *inproc]
    if args.json:
        args.json.write_text(json.dumps(
            {"python": sys.version.split()[0], "cpus": nproc, "quick": args.quick,
             "figures": {k: vars(v) for k, v in results.items()},
             "targets": [{"target": t, "pass": ok, "detail": d} for t, ok, d in checks]},
            indent=2), encoding="utf-8")
    return 0 if all(ok for _, ok, _ in checks) else 1


if __name__ == "__main__":
    sys.exit(main())
