"""The editor side of e2e tests: a real conductor subprocess spoken to in raw JSON lines.

Every wait is bounded. On exit the context manager checks the one invariant every e2e test
shares: each line the conductor wrote on stdout is a JSON-RPC message (or batch).
"""

from __future__ import annotations

import json
import os
import signal
from contextlib import asynccontextmanager
from typing import TYPE_CHECKING, Any

import anyio
import psutil

from tests.conftest import child_env, conductor_argv, py

if TYPE_CHECKING:
    from collections.abc import AsyncIterator, Callable

    from anyio.abc import Process

TIMEOUT = 10.0  # every wait on the conductor is bounded by this (per ConductorProcess)
EXIT_TIMEOUT = 20.0
Json = Any


def same_id(a: Json, b: Json) -> bool:
    """JSON-equal *and* the same JSON type (1 is not 1.0 is not "1", True is not 1)."""
    return type(a) is type(b) and a == b


class ConductorProcess:
    """A running `acp-conductor` and the bytes it wrote."""

    def __init__(self, process: Process) -> None:
        self.process = process
        self.lines: list[bytes] = []     # every stdout line, in order (purity check)
        self.inbox: list[Json] = []      # messages read but not yet consumed by a test
        self._buf = bytearray()
        self._eof = False
        self.stderr = bytearray()
        self._stderr_changed = anyio.Event()
        self._stderr_done = anyio.Event()
        self.timeout = TIMEOUT  # raise it for tests that move tens of MiB

    @property
    def pid(self) -> int:
        return self.process.pid

    @property
    def stderr_text(self) -> str:
        return self.stderr.decode("utf-8", "replace")

    # -- writing ---------------------------------------------------------------------------

    async def send_raw(self, data: bytes) -> None:
        assert self.process.stdin is not None
        await self.process.stdin.send(data)

    async def send(self, message: Json) -> None:
        await self.send_raw(json.dumps(message).encode() + b"\n")

    async def close_stdin(self) -> None:
        assert self.process.stdin is not None
        await self.process.stdin.aclose()

    # -- reading ---------------------------------------------------------------------------

    async def read_raw(self) -> bytes:
        """The next stdout line (without its newline). Raises EOFError at end of output."""
        assert self.process.stdout is not None
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
                    self._buf += await self.process.stdout.receive(1 << 20)
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

    # -- process ---------------------------------------------------------------------------

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

    def assert_stdout_is_pure_jsonrpc(self) -> None:
        for line in self.lines:
            decoded = json.loads(line)  # raises on anything that is not JSON
            for item in decoded if isinstance(decoded, list) else [decoded]:
                assert isinstance(item, dict), line[:200]
                assert item.get("jsonrpc") == "2.0", line[:200]


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
            if process.returncode is None:
                try:
                    await conductor.close_stdin()
                except (anyio.BrokenResourceError, anyio.ClosedResourceError, OSError):
                    pass
            await conductor.read_to_end()
            code = await conductor.wait()
            await conductor.wait_stderr_closed()
            conductor.assert_stdout_is_pure_jsonrpc()
            if check_exit:
                assert code == 0, conductor.stderr_text
        finally:
            if process.returncode is None:  # a failed test must not leave a conductor behind
                with anyio.CancelScope(shield=True):
                    process.send_signal(signal.SIGKILL)
                    with anyio.move_on_after(5):
                        await process.wait()
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
