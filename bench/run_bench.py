"""Benchmark acp-conductor against a byte relay and @thinkwell/conductor, side by side.

    python bench/run_bench.py              # full run: 3 interleaved rounds, a few minutes
    python bench/run_bench.py --quick      # smaller counts, one round
    python bench/run_bench.py --check      # also exit 1 when a target is missed
    python bench/run_bench.py --imports    # only: what start-up imports (python -X importtime)
    python bench/run_bench.py --only relay,acp+0 --phases startup,latency --json out.json

This script is the editor: it starts each variant over real pipes, speaks ACP to it with
blocking reads and writes (so the editor side is never the bottleneck), and prints one
table of figures with ratios against the relay measured in the same run, then the targets
of issue 9 with PASS/FAIL/SKIP. Every conductor runs chains of the same stand-alone proxy
process (bench/fast_passthrough.py) in front of the same agent (bench/agent.py).
@thinkwell/conductor is optional: `npm install --prefix bench/node`; without it, its
variants and the targets that compare against it are skipped. See docs/performance.md.

Variants are a list (`VARIANTS`); add a chain shape by appending one `Variant`.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import re
import select
import shlex
import shutil
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
    from collections.abc import Callable, Iterator

REPO = Path(__file__).resolve().parent.parent
BENCH = REPO / "bench"
PY = sys.executable
MiB = 1024 * 1024

# -- what the editor starts ----------------------------------------------------------------

AGENT = [PY, str(BENCH / "agent.py")]
# The one proxy every conductor gets: envelope-only msgspec decoding, both proxy dialects.
PROXY = [PY, str(BENCH / "fast_passthrough.py")]
JSON_PROXY = [PY, str(REPO / "proxies" / "acp_conductor_proxies" /
                     "passthrough_stdio.py")]  # stdlib json; ours only
PLUGIN_STANDALONE = [PY, "-m", "conductor", "serve-proxy", "passthrough"]

THINKWELL_DIR = BENCH / "node"
THINKWELL_PACKAGE = THINKWELL_DIR / "node_modules" / "@thinkwell" / "conductor" / "package.json"
THINKWELL_LAUNCHER = THINKWELL_DIR / "thinkwell.mjs"


def thinkwell_version() -> str | None:
    """The installed @thinkwell/conductor version, or None when it cannot run here."""
    if shutil.which("node") is None or not THINKWELL_PACKAGE.exists():
        return None
    version = json.loads(THINKWELL_PACKAGE.read_text(encoding="utf-8")).get("version")
    return str(version) if version else "?"


def acp_agent_mode(*components: list[str]) -> list[str]:
    """`acp-conductor agent PROXY... AGENT`, run from the variant's checkout."""
    return [PY, "-m", "conductor", "agent", *(shlex.join(c) for c in components)]


def chain_file(workdir: Path, n: int) -> Path:
    """A chain file with N in-process passthrough plugins (`use = "passthrough"`)."""
    chain = workdir / f"inprocess-{n}.toml"
    proxies = "".join(f'[[proxy]]\nname = "p{i}"\nuse = "passthrough"\n\n' for i in range(n))
    chain.write_text(f"{proxies}[agent]\ncommand = {json.dumps(AGENT)}\n", encoding="utf-8")
    return chain


def acp_chain_mode(workdir: Path, n: int) -> list[str]:
    return [PY, "-m", "conductor", "--chain", str(chain_file(workdir, n))]


def thinkwell(*components: list[str]) -> list[str]:
    return ["node", str(THINKWELL_LAUNCHER), *(json.dumps(c) for c in components)]


@dataclass(frozen=True)
class Variant:
    name: str                                   # row label
    about: str                                  # one line for the legend
    argv: Callable[[Path], list[str]]           # workdir -> the command the editor starts
    conductor: str                              # "relay", "acp", "thinkwell" or "direct"
    n: int = 0                                  # proxies in the chain
    default: bool = True                        # run without --only
    pythonpath: Path = REPO                     # which checkout's conductor runs
    env: dict[str, str] = field(default_factory=dict)  # set for this variant only


VARIANTS: list[Variant] = [
    Variant("direct", "the bench agent, no hop", lambda _: AGENT, "direct", default=False),
    Variant("relay", "bench/relay.py: one byte-copying process in between (the floor)",
            lambda _: [PY, str(BENCH / "relay.py"), *AGENT], "relay"),
    Variant("loop", "bench/loop_relay.py: frames moved in asyncio readiness callbacks",
            lambda _: [PY, str(BENCH / "loop_relay.py"), *AGENT], "relay", default=False),
    Variant("loop+json", "bench/loop_relay.py --json: the same, each frame decoded and encoded",
            lambda _: [PY, str(BENCH / "loop_relay.py"), "--json", *AGENT], "relay",
            default=False),
    Variant("loop+json-uvloop", "bench/loop_relay.py --json --uvloop: the same on uvloop",
            lambda _: [PY, str(BENCH / "loop_relay.py"), "--json", "--uvloop", *AGENT], "relay",
            default=False),
    Variant("acp+0", "acp-conductor agent AGENT", lambda _: acp_agent_mode(AGENT), "acp"),
    Variant("acp+0-asyncio", "the same on asyncio's own loop (ACP_CONDUCTOR_LOOP=asyncio)",
            lambda _: acp_agent_mode(AGENT), "acp", default=False,
            env={"ACP_CONDUCTOR_LOOP": "asyncio"}),
    Variant("thinkwell+0", "@thinkwell/conductor (bench/node/thinkwell.mjs) AGENT",
            lambda _: thinkwell(AGENT), "thinkwell"),
    Variant("acp+1", "acp-conductor agent PROXY AGENT (PROXY = bench/fast_passthrough.py)",
            lambda _: acp_agent_mode(PROXY, AGENT), "acp", 1),
    Variant("thinkwell+1", "@thinkwell/conductor PROXY AGENT",
            lambda _: thinkwell(PROXY, AGENT), "thinkwell", 1),
    Variant("acp+3", "acp-conductor agent PROXY PROXY PROXY AGENT",
            lambda _: acp_agent_mode(PROXY, PROXY, PROXY, AGENT), "acp", 3),
    Variant("thinkwell+3", "@thinkwell/conductor PROXY PROXY PROXY AGENT",
            lambda _: thinkwell(PROXY, PROXY, PROXY, AGENT), "thinkwell", 3),
    Variant("acp+3i", "acp-conductor --chain FILE: 3 in-process passthrough plugins",
            lambda w: acp_chain_mode(w, 3), "acp", 3),
    # Not run by default (name them with --only):
    Variant("acp+0f", "acp-conductor --chain FILE: the agent alone, from a chain file",
            lambda w: acp_chain_mode(w, 0), "acp", 0, default=False),
    Variant("acp+1i", "acp-conductor --chain FILE: 1 in-process passthrough plugin",
            lambda w: acp_chain_mode(w, 1), "acp", 1, default=False),
    Variant("acp+1j", "acp-conductor agent with passthrough_stdio.py (json)",
            lambda _: acp_agent_mode(JSON_PROXY, AGENT), "acp", 1, default=False),
    Variant("acp+3j", "three passthrough_stdio.py (json)",
            lambda _: acp_agent_mode(JSON_PROXY, JSON_PROXY, JSON_PROXY, AGENT), "acp", 3,
            default=False),
    Variant("acp+1p", "the passthrough plugin stand-alone (serve-proxy passthrough)",
            lambda _: acp_agent_mode(PLUGIN_STANDALONE, AGENT), "acp", 1, default=False),
]
BASELINE = "relay"
PHASES = ("startup", "latency", "small", "burst", "large", "big")


@dataclass(frozen=True)
class Sizes:
    rounds: int          # interleaved rounds; each figure is the median over them
    warmup: int
    requests: int        # per round
    small_count: int
    small_text: int
    large_count: int
    large_text: int
    big_prompt: int


FULL = Sizes(rounds=3, warmup=200, requests=1000, small_count=20_000, small_text=32,
             large_count=200, large_text=64 * 1024, big_prompt=10 * 1000 * 1000)
QUICK = Sizes(rounds=1, warmup=50, requests=300, small_count=5_000, small_text=32,
              large_count=50, large_text=64 * 1024, big_prompt=10 * 1000 * 1000)

# -- the editor ----------------------------------------------------------------------------


class BenchError(RuntimeError):
    pass


class _Response(msgspec.Struct):
    id: int | None = None
    result: msgspec.Raw | msgspec.UnsetType = msgspec.UNSET
    error: msgspec.Raw | msgspec.UnsetType = msgspec.UNSET


_response = msgspec.json.Decoder(_Response)


def precompile(checkout: Path) -> None:
    """Write the byte-code caches an installed package has, so that every start measures
    the same thing even where PYTHONDONTWRITEBYTECODE is set (each start would otherwise
    compile the checkout's modules from source: tens of ms)."""
    import compileall

    for package in ("conductor", "proxies"):
        if (checkout / package).is_dir():
            compileall.compile_dir(checkout / package, quiet=1)


def child_env(pythonpath: Path, extra: dict[str, str] | None = None) -> dict[str, str]:
    env = {**os.environ, **(extra or {})}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(pythonpath), str(pythonpath / "proxies"),
                                                      env.get("PYTHONPATH")]))
    return env


class Editor:
    """One running variant, driven with blocking I/O on its pipes."""

    profile_dir: Path | None = None

    def __init__(self, argv: list[str], stderr_path: Path, pythonpath: Path = REPO,
                 python_flags: tuple[str, ...] = (), env: dict[str, str] | None = None) -> None:
        if argv[1:3] == ["-m", "conductor"]:
            if self.profile_dir is not None:
                out = self.profile_dir / f"{stderr_path.stem}.prof"
                python_flags = (*python_flags, "-m", "cProfile", "-o", str(out))
            argv = [argv[0], *python_flags, *argv[1:]]
        self._stderr = stderr_path.open("ab")
        self.started = time.perf_counter()
        self.proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     stderr=self._stderr, bufsize=0, env=child_env(pythonpath, env),
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

    def close_and_time_exits(self) -> tuple[float, float | None]:
        """Close stdin (EOF) and wait for the variant and every process under it to exit.

        Returns (EOF -> variant's exit, last component's exit -> variant's exit); the second
        is None where exits cannot be watched (pidfd_open is Linux only), and negative if
        the variant left before its components did.
        """
        kids = descendants(self.proc.pid) if hasattr(os, "pidfd_open") else []
        components = [k for k in kids if is_component(k)]
        watched: dict[int, int] = {}  # pidfd -> pid
        poller = select.poll()
        for pid in [self.proc.pid, *kids]:
            try:
                fd = os.pidfd_open(pid)
            except (ProcessLookupError, AttributeError):
                continue
            watched[fd] = pid
            poller.register(fd, select.POLLIN)
        exited: dict[int, float] = {}
        eof = time.perf_counter()
        self._close_stdin()
        try:
            deadline = eof + 15
            while len(exited) < len(watched):
                left = deadline - time.perf_counter()
                events = poller.poll(max(0, left) * 1000) if left > 0 else []
                now = time.perf_counter()
                if not events:
                    raise BenchError(f"{len(watched) - len(exited)} processes still running "
                                     f"15 s after EOF; see {self.stderr_path}")
                for fd, _ in events:
                    exited[watched[fd]] = now
                    poller.unregister(fd)
        finally:
            for fd in watched:
                os.close(fd)
            self._reap()
        gone = exited.get(self.proc.pid, time.perf_counter())
        children = [exited[k] for k in components if k in exited]
        return gone - eof, (gone - max(children)) if children else None

    def _close_stdin(self) -> None:
        try:
            self.proc.stdin.close()  # type: ignore[union-attr]
        except OSError:
            pass

    def _reap(self) -> None:
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

    def close(self) -> None:
        self._close_stdin()
        self._reap()


# How a chain's components are told from a conductor's own helper processes (such as
# acp-conductor's watchdog, which exits with the conductor): by the script they run.
COMPONENT_MARKERS = (AGENT[1], PROXY[1], JSON_PROXY[1], "serve-proxy")


def is_component(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            argv = f.read().decode("utf-8", "replace").split("\0")
    except OSError:
        return False
    return any(marker in argv for marker in COMPONENT_MARKERS)


def descendants(pid: int) -> list[int]:
    """Every process under `pid` (children, their children...), from /proc."""
    parent_of: dict[int, list[int]] = {}
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            with open(f"/proc/{entry.name}/stat", "rb") as f:
                stat = f.read()
        except OSError:
            continue
        ppid = int(stat.rsplit(b")", 1)[1].split()[1])  # the name may hold spaces and ")"
        parent_of.setdefault(ppid, []).append(int(entry.name))
    out: list[int] = []
    stack = [pid]
    while stack:
        kids = parent_of.get(stack.pop(), [])
        out += kids
        stack += kids
    return out


INIT = b'{"protocolVersion":1,"clientCapabilities":{"fs":{"readTextFile":false}},' \
       b'"clientInfo":{"name":"bench","version":"0"}}'
SESSION_NEW = b'{"cwd":"/tmp","mcpServers":[]}'


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
    """None: not measured in this run (a phase left out, or not measurable here)."""

    startup_s: float | None = None
    exit_eof_s: float | None = None
    exit_after_child_s: float | None = None
    p50_s: float | None = None
    p99_s: float | None = None
    small_msgs: float | None = None
    small_mbs: float | None = None
    burst_msgs: float | None = None
    burst_mbs: float | None = None
    large_msgs: float | None = None
    large_mbs: float | None = None
    big_rt_s: float | None = None
    peak_rss: int | None = None
    largest_frame: int = 0
    notes: list[str] = field(default_factory=list)


def start_stop(variant: Variant, work: Path) -> tuple[float, float, float | None]:
    """A fresh start: (spawn -> initialize answered, EOF -> exit, last child -> exit)."""
    editor = Editor(variant.argv(work), work / f"{variant.name}.startup.stderr",
                    variant.pythonpath, env=variant.env)
    try:
        editor.call("initialize", INIT)
        startup = time.perf_counter() - editor.started
        editor.call("session/new", SESSION_NEW)
    except BaseException:
        editor.close()
        raise
    after_eof, after_child = editor.close_and_time_exits()
    return startup, after_eof, after_child


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
    # JSON-equal, not byte-equal: a proxy may re-serialise.
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


def median(xs: list[float]) -> float:
    return statistics.median(xs)


def measure_all(variants: list[Variant], work: Path, sizes: Sizes, phases: set[str],
                progress: Callable[[str], None]) -> dict[str, Figures]:
    """Every phase runs each variant in turn, round after round, so that load from anything
    else on the machine spreads over all variants instead of skewing one of them."""
    figs = {v.name: Figures() for v in variants}
    if "startup" in phases:
        progress("start-up and exit")
        runs: dict[str, list[tuple[float, float, float | None]]] = {v.name: [] for v in variants}
        for _ in range(sizes.rounds):
            for v in variants:
                runs[v.name].append(start_stop(v, work))
        for v in variants:
            f, rs = figs[v.name], runs[v.name]
            f.startup_s = median([r[0] for r in rs])
            f.exit_eof_s = median([r[1] for r in rs])
            after_child = [r[2] for r in rs if r[2] is not None]
            f.exit_after_child_s = median(after_child) if after_child else None
    if not phases - {"startup"}:
        return figs

    editors: dict[str, Editor] = {}
    try:
        for v in variants:
            editor = Editor(v.argv(work), work / f"{v.name}.stderr", v.pythonpath, env=v.env)
            editors[v.name] = editor
            editor.call("initialize", INIT)
            editor.call("session/new", SESSION_NEW)
            latencies(editor, sizes.warmup)

        if "latency" in phases:
            progress("latency")
            p50s: dict[str, list[float]] = {v.name: [] for v in variants}
            p99s: dict[str, list[float]] = {v.name: [] for v in variants}
            for _ in range(sizes.rounds):
                for v in variants:
                    xs = sorted(latencies(editors[v.name], sizes.requests))
                    p50s[v.name].append(xs[len(xs) // 2])
                    p99s[v.name].append(xs[min(len(xs) - 1, int(len(xs) * 0.99))])
            for v in variants:
                figs[v.name].p50_s = median(p50s[v.name])
                figs[v.name].p99_s = median(p99s[v.name])

        def rounds(run: Callable[[Editor], tuple[float, int]]) -> Iterator[tuple[str, float, int]]:
            got: dict[str, list[tuple[float, int]]] = {v.name: [] for v in variants}
            for _ in range(sizes.rounds):
                for v in variants:
                    got[v.name].append(run(editors[v.name]))
            for name, rs in got.items():
                yield name, median([r[0] for r in rs]), max(r[1] for r in rs)

        if "small" in phases:
            progress("small updates (one write per frame)")
            for name, secs, nbytes in rounds(
                    lambda e: stream(e, sizes.small_count, sizes.small_text)):
                figs[name].small_msgs = sizes.small_count / secs
                figs[name].small_mbs = nbytes / secs / MiB
        if "burst" in phases:
            progress("small updates, burst-written")
            for name, secs, nbytes in rounds(
                    lambda e: stream(e, sizes.small_count, sizes.small_text, burst=True)):
                figs[name].burst_msgs = sizes.small_count / secs
                figs[name].burst_mbs = nbytes / secs / MiB
        if "large" in phases:
            progress("64 KiB updates")
            for name, secs, nbytes in rounds(
                    lambda e: stream(e, sizes.large_count, sizes.large_text)):
                figs[name].large_msgs = sizes.large_count / secs
                figs[name].large_mbs = nbytes / secs / MiB
                figs[name].largest_frame = nbytes // sizes.large_count
        if "big" in phases:
            progress("10 MB round trip")
            for name, secs, nbytes in rounds(lambda e: round_trip(e, sizes.big_prompt)):
                figs[name].big_rt_s = secs
                figs[name].largest_frame = max(figs[name].largest_frame, nbytes)
        for v in variants:
            figs[v.name].peak_rss = editors[v.name].peak_rss()
    finally:
        for editor in editors.values():
            editor.close()
    return figs


# -- report --------------------------------------------------------------------------------


def _ms(v: float) -> str:
    return f"{v:.0f}" if abs(v) >= 10 else f"{v:.1f}"


# heading, value (None: not measured), format, ratio against the relay shown; LEGEND says more
COLUMNS: list[tuple[str, Callable[[Figures], float | None], Callable[[float], str], bool]] = [
    ("start ms", lambda f: f.startup_s and f.startup_s * 1e3, _ms, True),
    ("exit/EOF ms", lambda f: f.exit_eof_s and f.exit_eof_s * 1e3, _ms, False),
    ("exit/child ms",
     lambda f: None if f.exit_after_child_s is None else f.exit_after_child_s * 1e3, _ms, False),
    ("p50 µs", lambda f: f.p50_s and f.p50_s * 1e6, lambda v: f"{v:.0f}", True),
    ("p99 µs", lambda f: f.p99_s and f.p99_s * 1e6, lambda v: f"{v:.0f}", True),
    ("small msg/s", lambda f: f.small_msgs, lambda v: f"{v / 1000:.0f}k", True),
    ("burst msg/s", lambda f: f.burst_msgs, lambda v: f"{v / 1000:.0f}k", True),
    ("64 KiB MB/s", lambda f: f.large_mbs, lambda v: f"{v:.0f}", True),
    ("10 MB ms", lambda f: f.big_rt_s and f.big_rt_s * 1e3, _ms, True),
    ("RSS MB", lambda f: f.peak_rss and f.peak_rss / MiB, lambda v: f"{v:.0f}", True),
]
LEGEND = """\
start: spawn -> initialize answered. exit/EOF: stdin closed -> the variant exited.
exit/child: its last component exited -> the variant exited. p50/p99: one session/prompt
answered at once, one in flight. small: 196-byte session/update frames, the agent writing
each with its own write() (burst: up to 1 MiB of frames per write). 64 KiB: updates of
64 KiB text. 10 MB: a 10 MB prompt echoed back in one update. RSS: peak resident set of
the started process (not its children)."""


def table_cells(results: dict[str, Figures], variants: dict[str, Variant]) -> list[list[str]]:
    base = results.get(BASELINE)
    shown = [c for c in COLUMNS if any(c[1](f) is not None for f in results.values())]
    rows = [["", "N", *(heading for heading, _, _, _ in shown)]]
    for name, fig in results.items():
        row = [name, str(variants[name].n)]
        for _, value, fmt, ratio in shown:
            v = value(fig)
            if v is None:
                row.append("")
                continue
            cell = fmt(v)
            b = value(base) if base is not None and ratio and name != BASELINE else None
            if b:
                cell += f" ×{v / b:.2f}"
            row.append(cell)
        rows.append(row)
    return rows


def text_table(rows: list[list[str]]) -> str:
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    lines = []
    for k, row in enumerate(rows):
        lines.append("  ".join(c.ljust(w) if i == 0 else c.rjust(w)
                               for i, (c, w) in enumerate(zip(row, widths, strict=True))))
        if k == 0:
            lines.append("  ".join("-" * w for w in widths))
    return "\n".join(lines)


def markdown_table(rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(rows[0]) + " |",
             "|" + "|".join("---" if i == 0 else "---:" for i in range(len(rows[0]))) + "|"]
    lines += ["| " + " | ".join(r) + " |" for r in rows[1:]]
    return "\n".join(lines)


@dataclass(frozen=True)
class Target:
    group: str
    label: str
    status: str  # PASS, FAIL or SKIP
    detail: str


def targets(results: dict[str, Figures], tw: str | None) -> list[Target]:
    """Issue 9's targets, for this checkout's acp-conductor variants."""
    out: list[Target] = []

    def add(group: str, label: str, ok: bool | None, detail: str) -> None:
        status = "SKIP" if ok is None else "PASS" if ok else "FAIL"
        out.append(Target(group, label, status, detail))

    def get(name: str, attr: str) -> float | None:
        fig = results.get(name)
        return None if fig is None else getattr(fig, attr)

    def missing(*names: str) -> str:
        gone = [n for n in names if n not in results]
        if not gone:
            return "not measured in this run (--phases)"
        if tw is None and any(n.startswith("thinkwell") for n in gone):
            return f"{', '.join(gone)}: @thinkwell/conductor is not installed"
        return f"{', '.join(gone)} not run (--only)"

    def vs_relay(group: str, label: str, name: str, attr: str, limit: float, scale: float,
                 unit: str, at_most: bool = True) -> None:
        v, b = get(name, attr), get(BASELINE, attr)
        if v is None or b is None or not b:
            add(group, label, None, missing(name, BASELINE))
            return
        ratio = v / b
        ok = ratio <= limit if at_most else ratio >= limit
        add(group, label, ok, f"{v * scale:.0f} vs {b * scale:.0f} {unit} (×{ratio:.2f})")

    def vs_peer(group: str, label: str, name: str, peer: str, attr: str, scale: float,
                unit: str, strict: bool) -> None:
        v, p = get(name, attr), get(peer, attr)
        if v is None or p is None or not p:
            add(group, label, None, missing(name, peer))
            return
        ok = v < p if strict else v <= p
        add(group, label, ok, f"{v * scale:.0f} vs {p * scale:.0f} {unit} (×{v / p:.2f})")

    g = "start-up (spawn → initialize answered)"
    vs_relay(g, "agent mode (acp+0) ≤ 2× relay", "acp+0", "startup_s", 2.0, 1e3, "ms")
    vs_relay(g, "--chain mode (acp+3i) ≤ 2× relay", "acp+3i", "startup_s", 2.0, 1e3, "ms")
    for n in (0, 1, 3):
        vs_peer(g, f"acp+{n} ≤ thinkwell+{n}", f"acp+{n}", f"thinkwell+{n}", "startup_s", 1e3,
                "ms", strict=False)
    vs_peer(g, "--chain mode (acp+3i) ≤ thinkwell+0", "acp+3i", "thinkwell+0", "startup_s", 1e3,
            "ms", strict=False)

    g = "shutdown (conductor's exit after its last child's, stdin EOF)"
    for name in ("acp+0", "acp+1", "acp+3", "acp+3i"):
        v = get(name, "exit_after_child_s")
        if v is None:
            add(g, f"{name} ≤ 50 ms", None, missing(name) if name not in results
                else "child exits not watchable here (needs os.pidfd_open)")
        else:
            eof = get(name, "exit_eof_s") or 0.0
            add(g, f"{name} ≤ 50 ms", v <= 0.050,
                f"{v * 1e3:.0f} ms after its last child ({eof * 1e3:.0f} ms after EOF)")

    g = "latency (p50 request)"
    vs_relay(g, "acp+0 ≤ 1.3× relay", "acp+0", "p50_s", 1.3, 1e6, "µs")
    for n in (1, 3):
        vs_peer(g, f"acp+{n} < thinkwell+{n}", f"acp+{n}", f"thinkwell+{n}", "p50_s", 1e6, "µs",
                strict=True)

    g = "throughput"
    vs_relay(g, "acp+0 small messages (one write per frame) ≥ 0.6× relay", "acp+0",
             "small_msgs", 0.6, 1e-3, "k msg/s", at_most=False)

    g = "no regressions"
    vs_relay(g, "acp+0 10 MB round trip ≤ 1.3× relay", "acp+0", "big_rt_s", 1.3, 1e3, "ms")
    fig = results.get("acp+0")
    if fig is None or fig.peak_rss is None or not fig.largest_frame:
        add(g, "acp+0 peak RSS < 64 MB + 2× largest frame", None, missing("acp+0"))
    else:
        limit = 64 * MiB + 2 * fig.largest_frame
        add(g, "acp+0 peak RSS < 64 MB + 2× largest frame", fig.peak_rss < limit,
            f"{fig.peak_rss / MiB:.1f} MB vs limit {limit / MiB:.1f} MB "
            f"(largest frame {fig.largest_frame / MiB:.1f} MB)")
    zero, three = results.get("acp+0"), results.get("acp+3i")
    if zero is None or three is None or zero.p50_s is None or three.p50_s is None:
        add(g, "in-process acp+3i p50 ≤ 1.2× acp+0", None, missing("acp+0", "acp+3i"))
    else:
        ratio = three.p50_s / zero.p50_s
        add(g, "in-process acp+3i p50 ≤ 1.2× acp+0", ratio <= 1.2,
            f"{three.p50_s * 1e6:.0f} vs {zero.p50_s * 1e6:.0f} µs (×{ratio:.2f})")
    if zero is None or three is None or not zero.small_msgs or not three.small_msgs:
        add(g, "in-process acp+3i small msg/s ≥ acp+0 / 1.2", None, missing("acp+0", "acp+3i"))
    else:
        slower = zero.small_msgs / three.small_msgs
        add(g, "in-process acp+3i small msg/s ≥ acp+0 / 1.2", slower <= 1.2,
            f"{three.small_msgs / 1e3:.0f}k vs {zero.small_msgs / 1e3:.0f}k msg/s "
            f"(×{slower:.2f} slower)")
    return out


def print_targets(checks: list[Target]) -> None:
    group = None
    for t in checks:
        if t.group != group:
            group = t.group
            print(f"\n{group}:")
        print(f"  {t.status}  {t.label}: {t.detail}")
    counts = {s: sum(t.status == s for t in checks) for s in ("PASS", "FAIL", "SKIP")}
    print(f"\n{counts['PASS']} passed, {counts['FAIL']} failed, {counts['SKIP']} skipped")


def print_profiles(prof_dir: Path, top: int = 15) -> None:
    import pstats

    for prof in sorted(prof_dir.glob("*.prof")):
        print(f"\n--- {prof.name}: top {top} functions by own time")
        pstats.Stats(str(prof), stream=sys.stdout).sort_stats("tottime").print_stats(top)


# -- start-up imports ----------------------------------------------------------------------

_IMPORT_LINE = re.compile(r"import time:\s+(\d+) \|\s+(\d+) \|( *)(\S+)")
# What issue 9 wants off the serving path (pydantic only where a chain file is validated).
WATCHED_IMPORTS = ("rich", "pydantic", "click", "acp", "asyncio", "trio",
                   "conductor.tracing.view", "conductor.tracing.html", "conductor.editor")


def import_run(argv: list[str], work: Path, label: str) -> tuple[float, dict[str, tuple[
        int, int, int]]]:
    """One `python -X importtime` start up to the answer to `initialize`:
    (elapsed s, module -> (self µs, cumulative µs, nesting depth))."""
    stderr = work / f"imports-{label}.stderr"
    stderr.unlink(missing_ok=True)
    editor = Editor(argv, stderr, REPO, python_flags=("-X", "importtime"))
    try:
        editor.call("initialize", INIT)
        elapsed = time.perf_counter() - editor.started
        cut = stderr.stat().st_size  # imports logged after this came after the answer
    finally:
        editor.close()
    text = stderr.read_bytes()[:cut].decode("utf-8", "replace")
    return elapsed, {m[4]: (int(m[1]), int(m[2]), len(m[3]) // 2)
                     for m in _IMPORT_LINE.finditer(text)}


def import_profile(argv: list[str], work: Path, label: str, runs: int, top: int = 15) -> None:
    """Median per module over `runs` starts (import times here swing with the machine's load)."""
    Editor(argv, work / "imports-warmup.stderr").close()  # warm the byte-code and page caches
    got = [import_run(argv, work, label.split()[0]) for _ in range(runs)]
    elapsed = median([g[0] for g in got])
    modules = set().union(*(g[1] for g in got))
    rows = []
    for module in modules:
        seen = [g[1][module] for g in got if module in g[1]]
        rows.append((int(median([x[0] for x in seen])), int(median([x[1] for x in seen])),
                     seen[0][2], module))
    total = sum(r[0] for r in rows)
    by_package: dict[str, int] = {}
    for self_us, _, _, module in rows:
        package = module.split(".")[0]
        by_package[package] = by_package.get(package, 0) + self_us
    heavy = sorted(by_package.items(), key=lambda kv: -kv[1])[:12]
    cumulative = {r[3]: r[1] for r in rows}
    print(f"\n{label}: python -X importtime {shlex.join(argv[1:])}")
    print(f"  median of {runs}: spawn → initialize answered {elapsed * 1e3:.0f} ms (slowed by "
          f"-X importtime); {len(rows)} modules imported by then, {total / 1e3:.0f} ms of "
          f"import time")
    print("  own import time by top-level package (ms): "
          + ", ".join(f"{p} {us / 1e3:.0f}" for p, us in heavy))
    print("  imported? (cumulative ms): " + ", ".join(
        f"{m} {cumulative[m] / 1e3:.0f}" if m in cumulative else f"{m} no"
        for m in WATCHED_IMPORTS))
    print(f"  top {top} by cumulative time (indent = nesting):")
    print(f"    {'cumul ms':>8}  {'self ms':>7}  module")
    for self_us, cumul_us, depth, module in sorted(rows, key=lambda r: -r[1])[:top]:
        print(f"    {cumul_us / 1e3:8.1f}  {self_us / 1e3:7.1f}  {'  ' * depth}{module}")


def imports(work: Path, runs: int) -> None:
    import_profile(acp_agent_mode(AGENT), work, "agent mode", runs)
    import_profile(acp_chain_mode(work, 3), work, "--chain mode (3 in-process passthroughs)",
                   runs)


# -- main ----------------------------------------------------------------------------------


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="smaller counts, one round")
    parser.add_argument("--rounds", type=int, metavar="N",
                        help="interleaved rounds, each figure their median (default: 3; "
                             "--quick: 1); more where the machine is noisy")
    parser.add_argument("--check", action="store_true",
                        help="exit 1 when a target is missed (run by hand: timing is noisy)")
    parser.add_argument("--only", help="comma-separated variant names (default: "
                        + ", ".join(v.name for v in VARIANTS if v.default) + "; also: "
                        + ", ".join(v.name for v in VARIANTS if not v.default) + ")")
    parser.add_argument("--phases", help=f"comma-separated, of {', '.join(PHASES)} (default: all)")
    parser.add_argument("--json", type=Path, help="also write the figures here")
    parser.add_argument("--markdown", action="store_true", help="print the table as Markdown")
    parser.add_argument("--compare", type=Path, metavar="CHECKOUT",
                        help="also run the acp-conductor variants from another checkout")
    parser.add_argument("--profile", type=Path, metavar="DIR",
                        help="run each acp-conductor under cProfile, writing DIR/VARIANT.prof "
                             "(and VARIANT.startup.prof), then print the top functions (the "
                             "overhead distorts every figure: use for where, not how fast)")
    parser.add_argument("--imports", action="store_true",
                        help="only print what start-up imports (python -X importtime), in "
                             "agent mode and --chain mode")
    args = parser.parse_args()
    sizes = QUICK if args.quick else FULL
    if args.rounds:
        sizes = dataclasses.replace(sizes, rounds=max(1, args.rounds))

    precompile(REPO)
    if args.compare:
        precompile(args.compare.resolve())
    if args.imports:
        with tempfile.TemporaryDirectory(prefix="acp-bench-") as tmp:
            imports(Path(tmp), 1 if args.quick else 5)
        return 0

    phases = set(PHASES) if not args.phases else set(args.phases.split(","))
    if phases - set(PHASES):
        parser.error(f"unknown phases: {', '.join(sorted(phases - set(PHASES)))}")
    if args.profile:
        args.profile.mkdir(parents=True, exist_ok=True)
        Editor.profile_dir = args.profile.resolve()
    chosen = [v for v in VARIANTS if v.default]
    if args.only:
        wanted = args.only.split(",")
        known = {v.name: v for v in VARIANTS}
        unknown = [n for n in wanted if n not in known]
        if unknown:
            parser.error(f"unknown variants: {', '.join(unknown)}")
        chosen = [v for v in VARIANTS if v.name in wanted]
    tw = thinkwell_version()
    if tw is None and any(v.conductor == "thinkwell" for v in chosen):
        print("@thinkwell/conductor is not installed (npm install --prefix bench/node), "
              "or node is missing: its variants are skipped", file=sys.stderr)
        chosen = [v for v in chosen if v.conductor != "thinkwell"]
    if args.compare:
        # The same chain shapes run from another checkout (e.g. `mkdir /tmp/old && git archive
        # HEAD~3 | tar -x -C /tmp/old`), interleaved with this one: before/after in one table.
        with_old: list[Variant] = []
        for v in chosen:
            with_old.append(v)
            if v.conductor == "acp":
                with_old.append(Variant(f"{v.name}@{args.compare.name}",
                                        f"{v.about} ({args.compare})", v.argv, v.conductor, v.n,
                                        v.default, args.compare.resolve(), v.env))
        chosen = with_old
    if not chosen:
        parser.error("no variant left to run")

    t_all = time.perf_counter()
    print(f"variants: {', '.join(v.name for v in chosen)}", file=sys.stderr)
    with tempfile.TemporaryDirectory(prefix="acp-bench-") as tmp:
        work = Path(tmp)
        try:
            results = measure_all(chosen, work, sizes, phases, lambda phase: print(
                f"  {time.perf_counter() - t_all:5.1f}s  {phase}", file=sys.stderr))
        except BenchError as e:
            print(f"FAILED: {e}", file=sys.stderr)
            for log in sorted(work.glob("*.stderr")):
                text = log.read_text(encoding="utf-8", errors="replace")[-2000:]
                if text.strip():
                    sys.stderr.write(f"--- {log.name}\n{text}\n")
            return 2

    nproc = os.cpu_count()
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    print(f"\nacp-conductor benchmark ({'quick' if args.quick else 'full'}), "
          f"{time.strftime('%Y-%m-%d %H:%M')}: Python {sys.version.split()[0]}, "
          f"{nproc} CPUs, load average {load:.1f} at the end, "
          f"@thinkwell/conductor {tw or 'not installed'}, {time.perf_counter() - t_all:.0f} s")
    print(f"Median of {sizes.rounds} interleaved round(s): fresh starts; {sizes.requests} "
          f"requests; {sizes.small_count} × {sizes.small_text} B and {sizes.large_count} × "
          f"{sizes.large_text // 1024} KiB updates; a {sizes.big_prompt / 1e6:.0f} MB prompt. "
          f"×N = this variant / {BASELINE}. N = proxies (bench/fast_passthrough.py "
          f"processes; in-process plugins for +3i).\n")
    rows = table_cells(results, {v.name: v for v in chosen})
    print(markdown_table(rows) if args.markdown else text_table(rows))
    print(f"\n{LEGEND}")
    checks = targets(results, tw)
    print_targets(checks)
    if args.profile:
        print_profiles(args.profile)
    if args.json:
        args.json.write_text(json.dumps(
            {"python": sys.version.split()[0], "cpus": nproc, "quick": args.quick,
             "thinkwell": tw, "date": time.strftime("%Y-%m-%d %H:%M"),
             "figures": {k: vars(v) for k, v in results.items()},
             "targets": [vars(t) for t in checks]}, indent=2), encoding="utf-8")
    if args.check and any(t.status == "FAIL" for t in checks):
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
