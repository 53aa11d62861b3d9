"""The editor side of e2e tests: a conductor spoken to in raw JSON lines over real pipes.

`open_conductor` starts a real conductor subprocess. `open_served` serves the same command
line's chain with `serve_chain` in the test process (its components stay real processes),
for tests of what the editor receives: a conductor process costs ≈0.14 s of CPU to start
and adds nothing there. What only a process shows (its exit code, signals, stderr, orphans,
stdout holding nothing else) stays tested with `open_conductor`.

Every wait is bounded. On exit both context managers check the one invariant every e2e
test shares: each line the conductor wrote on stdout is a JSON-RPC message (or batch).
"""

from __future__ import annotations

import json
import os
import signal
import tempfile
from contextlib import asynccontextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

import anyio
import psutil

from tests.conftest import child_env, conductor_argv, py
from tests.in_process import loggers_restored

if TYPE_CHECKING:
    from collections.abc import AsyncIterator, Callable

    from anyio.abc import ByteReceiveStream, ByteSendStream, Process

    from conductor.config import ChainConfig
    from conductor.serve import RunOptions
    from conductor.testing import TestClient
    from conductor.transport.base import Incoming

TIMEOUT = 10.0  # every wait on the conductor is bounded by this (per ConductorProcess)
EXIT_TIMEOUT = 20.0
Json = Any


def same_id(a: Json, b: Json) -> bool:
    """JSON-equal *and* the same JSON type (1 is not 1.0 is not "1", True is not 1)."""
    return type(a) is type(b) and a == b


class WireClient:
    """The editor's end of a conductor's stdin and stdout (None: not a pipe of ours), and
    the bytes it read."""

    def __init__(self, stdin: ByteSendStream | None, stdout: ByteReceiveStream | None) -> None:
        self._stdin = stdin
        self._stdout = stdout
        self.lines: list[bytes] = []     # every stdout line, in order (purity check)
        self.inbox: list[Json] = []      # messages read but not yet consumed by a test
        self._buf = bytearray()
        self._eof = False
        self.timeout = TIMEOUT  # raise it for tests that move tens of MiB

    # -- writing ---------------------------------------------------------------------------

    async def send_raw(self, data: bytes) -> None:
        assert self._stdin is not None
        await self._stdin.send(data)

    async def send(self, message: Json) -> None:
        await self.send_raw(json.dumps(message).encode() + b"\n")

    async def close_stdin(self) -> None:
        assert self._stdin is not None
        await self._stdin.aclose()

    # -- reading ---------------------------------------------------------------------------

    async def read_raw(self) -> bytes:
        """The next stdout line (without its newline). Raises EOFError at end of output."""
        assert self._stdout is not None
        with anyio.fail_after(self.timeout):
            while True:
                nl = self._buf.find(b"\n")
                if nl >= 0:
                    line = bytes(self._buf[:nl])
                    del self._buf[: nl + 1]
                    self.lines.append(line)
                    return line
                if self._eof:
                    raise EOFError("the conductor closed its stdout")
                try:
                    self._buf += await self._stdout.receive(1 << 20)
                except (anyio.EndOfStream, anyio.ClosedResourceError):
                    self._eof = True

    async def read(self) -> Json:
        """The next message: from the inbox first, else from stdout."""
        if self.inbox:
            return self.inbox.pop(0)
        return json.loads(await self.read_raw())

    async def read_until(self, match: Callable[[Json], bool]) -> Json:
        """The first message matching; the others stay in the inbox, in order."""
        for i, msg in enumerate(self.inbox):
            if match(msg):
                return self.inbox.pop(i)
        with anyio.fail_after(self.timeout):
            while True:
                msg = json.loads(await self.read_raw())
                if match(msg):
                    return msg
                self.inbox.append(msg)

    async def response(self, ident: Json) -> Json:
        return await self.read_until(
            lambda m: isinstance(m, dict) and "method" not in m and same_id(m.get("id"), ident))

    async def request(self, method: str, params: Json = None, ident: Json = None) -> Json:
        """Send a request and return its response (the whole message)."""
        ident = ident if ident is not None else f"t-{len(self.lines)}-{method}"
        msg: dict[str, Json] = {"jsonrpc": "2.0", "id": ident, "method": method}
        if params is not None:
            msg["params"] = params
        await self.send(msg)
        return await self.response(ident)

    async def initialize(self, version: int = 1) -> Json:
        answer = await self.request("initialize", {
            "protocolVersion": version, "clientCapabilities": {"fs": {"readTextFile": True}},
            "clientInfo": {"name": "wire-client", "version": "0"}}, ident=0)
        assert "result" in answer, answer
        return answer["result"]

    async def new_session(self) -> str:
        answer = await self.request("session/new", {"cwd": "/", "mcpServers": []})
        return answer["result"]["sessionId"]

    async def read_to_end(self) -> list[Json]:
        """Everything left on stdout until EOF."""
        out: list[Json] = []
        with anyio.fail_after(self.timeout):
            while True:
                try:
                    out.append(json.loads(await self.read_raw()))
                except EOFError:
                    return out

    def assert_stdout_is_pure_jsonrpc(self) -> None:
        for line in self.lines:
            decoded = json.loads(line)  # raises on anything that is not JSON
            for item in decoded if isinstance(decoded, list) else [decoded]:
                assert isinstance(item, dict), line[:200]
                assert item.get("jsonrpc") == "2.0", line[:200]


class ConductorProcess(WireClient):
    """A running `acp-conductor` and the bytes it wrote."""

    def __init__(self, process: Process) -> None:
        super().__init__(process.stdin, process.stdout)
        self.process = process
        self.stderr = bytearray()
        self._stderr_changed = anyio.Event()
        self._stderr_done = anyio.Event()

    @property
    def pid(self) -> int:
        return self.process.pid

    @property
    def stderr_text(self) -> str:
        return self.stderr.decode("utf-8", "replace")

    async def wait(self) -> int:
        with anyio.fail_after(EXIT_TIMEOUT):
            return await self.process.wait()

    async def wait_stderr(self, text: str) -> None:
        with anyio.fail_after(self.timeout):
            while text not in self.stderr_text:
                if self._stderr_done.is_set():
                    raise AssertionError(f"{text!r} never appeared on stderr:\n{self.stderr_text}")
                self._stderr_changed = anyio.Event()
                await self._stderr_changed.wait()

    def signal(self, signum: int) -> None:
        os.kill(self.process.pid, signum)

    async def _pump_stderr(self) -> None:
        assert self.process.stderr is not None
        try:
            async for chunk in self.process.stderr:
                self.stderr += chunk
                self._stderr_changed.set()
        except (anyio.BrokenResourceError, anyio.ClosedResourceError):
            pass
        finally:
            self._stderr_done.set()
            self._stderr_changed.set()

    async def wait_stderr_closed(self) -> None:
        with anyio.fail_after(self.timeout):
            await self._stderr_done.wait()


@asynccontextmanager
async def open_conductor(*args: str, env: dict[str, str] | None = None,
                         cwd: str | None = None,
                         check_exit: bool = False) -> AsyncIterator[ConductorProcess]:
    """Start `acp-conductor ARGS` on real pipes; on exit close stdin, wait, check stdout."""
    process = await anyio.open_process(conductor_argv(*args), env=child_env(**(env or {})),
                                       cwd=cwd)
    conductor = ConductorProcess(process)
    async with anyio.create_task_group() as tg:
        tg.start_soon(conductor._pump_stderr)
        try:
            yield conductor
            code = await ended(conductor, stdin_open=process.returncode is None)
            await conductor.wait_stderr_closed()
            if check_exit:
                assert code == 0, conductor.stderr_text
        finally:
            if process.returncode is None:  # a failed test must not leave a conductor behind
                with anyio.CancelScope(shield=True):
                    process.send_signal(signal.SIGKILL)
                    with anyio.move_on_after(5):
                        await process.wait()
            tg.cancel_scope.cancel()


async def ended(conductor: ConductorProcess | ServedConductor, *, stdin_open: bool = True
                ) -> int:
    """What every e2e test ends with: the editor closes stdin, reads the rest of stdout, the
    conductor exits (its exit code), and all it wrote on stdout was JSON-RPC."""
    if stdin_open:
        try:
            await conductor.close_stdin()
        except (anyio.BrokenResourceError, anyio.ClosedResourceError, OSError):
            pass
    await conductor.read_to_end()
    code = await conductor.wait()
    conductor.assert_stdout_is_pure_jsonrpc()
    return code


class ServedConductor(WireClient):
    """`serve_chain` running in this process, on the far ends of two OS pipes."""

    def __init__(self, stdin: ByteSendStream, stdout: ByteReceiveStream, log: Path) -> None:
        super().__init__(stdin, stdout)
        self._pipes = stdin, stdout
        self.code: int | None = None  # serve_chain's answer: the exit code of a process
        self.done = anyio.Event()
        self._log = log
        self._logged: str | None = None  # the log, kept once serving ended (its file goes)

    @property
    def stdin(self) -> ByteSendStream:
        return self._pipes[0]

    @property
    def stdout(self) -> ByteReceiveStream:
        return self._pipes[1]

    @property
    def stderr_text(self) -> str:
        """What the process would have written on stderr: its logs and its components'
        stderr lines, as `configure_logging` formats them."""
        if self._logged is not None:
            return self._logged
        return self._log.read_text(encoding="utf-8", errors="replace")

    def keep_log(self) -> None:
        self._logged = self.stderr_text

    async def wait(self) -> int:
        with anyio.fail_after(EXIT_TIMEOUT):
            await self.done.wait()
        assert self.code is not None, "serve_chain raised"
        return self.code


def served_command(args: tuple[str, ...]) -> tuple[ChainConfig, RunOptions, str]:
    """The chain, options and log level `acp-conductor ARGS` serves with (`agent`/`proxy`
    COMMANDS, `--chain`, `--max-frame-bytes`, `--log-level`). Any other option shows on the
    process (log files, traces): refused."""
    from conductor.config import chain_from_commands
    from conductor.plan import read_chain
    from conductor.serve import RunOptions

    rest, mode, chain_file, max_frame, level = list(args), "agent", None, None, "warning"
    while rest:
        if rest[0] in ("agent", "proxy") and mode == "agent" and chain_file is None:
            mode = rest.pop(0)
        elif rest[0] == "--chain":
            chain_file = rest[1]
            del rest[:2]
        elif rest[0] == "--max-frame-bytes":
            max_frame = int(rest[1])
            del rest[:2]
        elif rest[0] == "--log-level":
            level = rest[1]
            del rest[:2]
        elif rest[0].startswith("-"):
            raise ValueError(f"{rest[0]}: only a conductor process shows it (open_conductor)")
        else:
            break
    config = read_chain(chain_file) if chain_file is not None \
        else chain_from_commands(rest, with_agent=mode == "agent")
    return config, RunOptions(mode=mode, max_frame_bytes=max_frame, handle_signals=False), level


@asynccontextmanager
async def serving(*args: str, env: dict[str, str] | None = None, log: Path | None = None
                  ) -> AsyncIterator[ServedConductor]:
    """`acp-conductor ARGS`'s chain served by `serve_chain` in this process over real OS
    pipes until the body ends (then cancelled, unless it ended): its components are real
    processes, in the environment `child_env` gives a conductor process; its logs go to
    `log` (else a file of its own: `stderr_text`) as `configure_logging` writes them."""
    from conductor.cli.logs import configure_logging
    from conductor.serve import serve_chain
    from conductor.transport.stdio import FdReceiveStream, FdSendStream

    config, options, level = served_command(args)
    in_read, in_write = os.pipe()
    out_read, out_write = os.pipe()
    conductor_in, conductor_out = FdReceiveStream(in_read, owns_fd=True), FdSendStream(out_write)
    saved_env = dict(os.environ)
    with tempfile.TemporaryDirectory(prefix="acp-served-") as scratch, loggers_restored():
        served = ServedConductor(FdSendStream(in_write), FdReceiveStream(out_read, owns_fd=True),
                                 log or Path(scratch, "stderr"))
        configure_logging(level, str(served._log))
        os.environ.update(child_env(**(env or {})))  # what its components inherit
        try:
            async with anyio.create_task_group() as tg:

                async def serve() -> None:
                    try:
                        served.code = await serve_chain(config, conductor_in, conductor_out,
                                                        options)
                    finally:
                        with anyio.CancelScope(shield=True):  # as a process's exit closes them
                            await conductor_in.aclose()
                            await conductor_out.aclose()
                        served.done.set()

                tg.start_soon(serve)
                try:
                    yield served
                finally:
                    # A failed test: cancelled, serve_chain still stops every component.
                    tg.cancel_scope.cancel()
        finally:
            with anyio.CancelScope(shield=True):
                await served.close_stdin()
                await served.stdout.aclose()
            os.environ.clear()
            os.environ.update(saved_env)
            served.keep_log()


@asynccontextmanager
async def open_served(*args: str, env: dict[str, str] | None = None
                      ) -> AsyncIterator[ServedConductor]:
    """`open_conductor(*args)` without the process (`serving`): the same stdin and stdout,
    checked the same way on exit. (An exit code is a process's: tests of it stay there.)"""
    async with serving(*args, env=env) as served:
        yield served
        await ended(served)


@asynccontextmanager
async def open_served_client(*args: str, env: dict[str, str] | None = None,
                             log: Path | None = None, client: TestClient | None = None
                             ) -> AsyncIterator[TestClient]:
    """`serving(*args)` driven by the test kit's client, initialized; on exit it closes
    the conductor's stdin and waits for the chain to end (what `open_process_client` does
    with a conductor process)."""
    from conductor.jsonrpc.message import Batch, Notification, Request, Response
    from conductor.testing import TestClient
    from conductor.transport.pipes import PipeSink, PipeSource

    client = client if client is not None else TestClient()
    async with serving(*args, env=env, log=log) as served, anyio.create_task_group() as tg:

        async def read(item: Incoming) -> None:
            assert isinstance(item, Request | Notification | Response | Batch), item
            await client.deliver(item)

        client.connect(PipeSink(served.stdin), tg)
        tg.start_soon(PipeSource(served.stdout).serve, read)
        await client.initialize()
        yield client
        await served.close_stdin()
        await served.wait()
        tg.cancel_scope.cancel()


def has_exited(proc: psutil.Process) -> bool:
    """It runs no more: gone, or a zombie. Reaping an orphaned zombie is init's business,
    and some inits (in containers, VMs) reap only every few seconds: not worth waiting for."""
    try:
        return not proc.is_running() or proc.status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


async def still_running(procs: list[psutil.Process], seconds: float = 10.0,
                        ) -> list[psutil.Process]:
    """Those of `procs` still running after waiting up to `seconds` for all to exit.
    Polled: a process we did not start has no exit to wait on."""
    with anyio.move_on_after(seconds):
        while not all(map(has_exited, procs)):  # noqa: ASYNC110 (nothing to wait on)
            await anyio.sleep(0.02)
    return [p for p in procs if not has_exited(p)]


def agent_cmd(*flags: str) -> str:
    return py("scripted_agent.py", *flags)


def proxy_cmd(*flags: str) -> str:
    return py("relay_proxy.py", *flags)


def chain_args(proxies: int, *agent_flags: str, proxy_flags: tuple[str, ...] = ()) -> list[str]:
    """`agent` command-line arguments: `proxies` relay proxies, then the scripted agent."""
    return ["agent", *[proxy_cmd(*proxy_flags) for _ in range(proxies)], agent_cmd(*agent_flags)]
