"""`run`'s terminals (`terminal/*`): real processes in `--cwd`, only with `--allow-terminal`.

Each terminal runs in its own process group with an environment token of its own, so
killing or releasing it (or the end of the run) takes what it started with it, even what
left its group (`setsid`, daemons): the supervisor's token sweep.
"""

from __future__ import annotations

import os
import secrets
import signal
import subprocess
from typing import TYPE_CHECKING, Any

import anyio
from msgspec import field

from conductor.editor.sandbox import NOT_FOUND, Sandbox
from conductor.errors import RpcError
from conductor.jsonrpc.codes import ErrorCode
from conductor.record import Record
from conductor.supervise.component import sweep_strays
from conductor.supervise.spawn import TOKEN_PREFIX
from conductor.supervise.watchdog import tag

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable, Coroutine

    from anyio.abc import Process

    from conductor.jsonrpc.message import JsonValue

    # Starts a task in the run's task group (a terminal's output reader).
    Spawn = Callable[[Callable[[], Coroutine[Any, Any, None]]], Awaitable[None]]

_BY_ID = frozenset({"terminal/output", "terminal/wait_for_exit", "terminal/kill",
                    "terminal/release"})
TERMINAL_STRAY_GRACE = 1.0  # how long a terminal's strays get between SIGTERM and SIGKILL
OUTPUT_GRACE = 0.5  # after the command exits, for the end of an output pipe a child may hold


class _Terminal(Record):
    process: Process
    limit: int
    token: str  # in its environment: finds what left its process group (setsid, daemons)
    output: bytearray = field(default_factory=bytearray)
    truncated: bool = False
    done: anyio.Event = field(default_factory=anyio.Event)  # exited, and its output read
    drained: anyio.Event = field(default_factory=anyio.Event)  # its output pipe has ended

    def add(self, chunk: bytes) -> None:
        self.output += chunk
        if len(self.output) > self.limit:
            # Keep the end (the spec truncates from the beginning), at a character boundary.
            cut = len(self.output) - self.limit
            while cut < len(self.output) and (self.output[cut] & 0xC0) == 0x80:
                cut += 1
            del self.output[:cut]
            self.truncated = True

    def status(self) -> dict[str, Any] | None:
        code = self.process.returncode
        if code is None or not self.done.is_set():
            return None
        if code < 0:
            return {"exitCode": None, "signal": _signal_name(-code)}
        return {"exitCode": code, "signal": None}


def _signal_name(number: int) -> str:
    """The conventional name: `signal.Signals` knows SIGRTMIN and SIGRTMAX but none of the
    real-time signals between them, which a command may still die of."""
    try:
        return signal.Signals(number).name
    except ValueError:
        low = getattr(signal, "SIGRTMIN", None)
        if low is not None and low < number <= signal.SIGRTMAX:
            return f"SIGRTMIN+{number - low}"
        return f"SIG{number}"


class Terminals:
    """The agent's terminals, by id."""

    def __init__(self, sandbox: Sandbox, *, allowed: bool,
                 spawn: Spawn) -> None:
        self.sandbox = sandbox
        self.allowed = allowed
        self._spawn = spawn  # starts a task in the run's task group (terminal readers)
        self._terminals: dict[str, _Terminal] = {}
        self._created = 0  # ids count up: a released id (or a reused pid) never comes back

    async def handle(self, method: str, p: dict[str, Any]) -> JsonValue:
        if not self.allowed:
            command = " ".join([str(p.get("command", "")), *map(str, _items(p.get("args")))])
            self.sandbox.refuse("terminal", command.strip() or method,
                         "running commands needs --allow-terminal")
        if method == "terminal/create":
            return await self._create_terminal(p)
        if method not in _BY_ID:  # before the id: an unknown method is not an unknown terminal
            raise RpcError(ErrorCode.METHOD_NOT_FOUND, "Method not found", {"method": method})
        term = self._terminals.get(str(p.get("terminalId")))
        if term is None:
            raise RpcError(NOT_FOUND, f"unknown terminal {p.get('terminalId')!r}")
        if method == "terminal/output":
            return {"output": term.output.decode("utf-8", "replace"),
                    "truncated": term.truncated, "exitStatus": term.status()}
        if method == "terminal/wait_for_exit":
            await term.done.wait()
            return term.status() or {"exitCode": None, "signal": None}
        if method == "terminal/release":
            self._terminals.pop(str(p.get("terminalId")), None)
        await _stop_terminal(term)  # terminal/kill, terminal/release
        return {}

    async def _create_terminal(self, p: dict[str, Any]) -> JsonValue:
        command = p.get("command")
        if not isinstance(command, str) or not command:
            raise RpcError(ErrorCode.INVALID_PARAMS, "Invalid params", "command must be a string")
        cwd = self.sandbox.inside("terminal", p.get("cwd") or str(self.sandbox.root),
                                  file=False)
        env = dict(os.environ)
        for item in _items(p.get("env")):  # ACP: invalid items are skipped
            if isinstance(item, dict) and isinstance(item.get("name"), str) and \
                    isinstance(item.get("value"), str):
                env[item["name"]] = item["value"]
        token = secrets.token_hex(8)
        # After the agent's env: it cannot drop it. Its value is the conductor's tag, by
        # which the watchdog finds what is left if `run` itself is killed (SIGHUP, SIGKILL).
        env[f"{TOKEN_PREFIX}{token}"] = tag()
        argv = [command, *(a for a in _items(p.get("args")) if isinstance(a, str))]
        try:
            process = await anyio.open_process(argv, cwd=cwd, env=env, stdin=subprocess.DEVNULL,
                                               stderr=subprocess.STDOUT, start_new_session=True)
        except ValueError as e:  # a NUL byte in a word, an `=` in a variable's name
            raise RpcError(ErrorCode.INVALID_PARAMS, f"invalid params: cannot start "
                           f"{command!r}: {e}", {"op": "terminal"}) from None
        except OSError as e:
            raise RpcError(ErrorCode.INTERNAL_ERROR,
                           f"cannot start {command}: {e.strerror}") from None
        term = _Terminal(process, self._output_limit(p.get("outputByteLimit")), token)
        self._created += 1
        ident = f"term-{self._created}-{process.pid}"
        self._terminals[ident] = term
        self.sandbox.events.decision({"type": "access", "op": "terminal", "target": " ".join(argv),
                              "allowed": True, "terminalId": ident})

        async def read() -> None:
            assert process.stdout is not None
            try:
                async for chunk in process.stdout:
                    term.add(chunk)
            except (anyio.BrokenResourceError, anyio.ClosedResourceError):
                pass
            term.drained.set()

        async def pump() -> None:
            async with anyio.create_task_group() as tg:
                tg.start_soon(read)
                await process.wait()
                # The command has exited, so all it wrote is in the pipe; but a child it
                # left running (`server &`) may hold the pipe open for ever: the exit is
                # reported after the pipe's end or a short grace, and the child's output
                # is still collected until it ends or the terminal is stopped.
                with anyio.move_on_after(OUTPUT_GRACE):
                    await term.drained.wait()
                term.done.set()

        await self._spawn(pump)
        return {"terminalId": ident}

    def _output_limit(self, asked: object) -> int:
        """How much output a terminal keeps: what the agent asked (an invalid value, as
        ACP's schema says, is no limit), but never more than one terminal/output answer
        can carry: unbounded, a chatty command (`yes`) would grow the run until it died."""
        # Each byte is at most 6 in JSON (a control character: \u0001); room for the rest.
        most = max((self.sandbox.frame_limit - 1024) // 6, 1)
        if isinstance(asked, bool) or not isinstance(asked, int) or asked < 0:
            return most
        return min(asked, most)

    async def aclose(self) -> None:
        """Kill what the agent left running (released terminals were stopped already)."""
        terminals = list(self._terminals.values())
        self._terminals.clear()
        for term in terminals:
            await _stop_terminal(term)


def _items(value: object) -> list[Any]:
    """A list param; anything else is an empty one (ACP: the default on error)."""
    return value if isinstance(value, list) else []


async def _stop_terminal(term: _Terminal) -> None:
    """SIGKILL the terminal's process group, then TERM and KILL whatever still carries its
    token (descendants that left the group). Bounded; harmless when all are gone."""
    with anyio.CancelScope(shield=True):
        try:
            os.killpg(term.process.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        await sweep_strays(term.token, TERMINAL_STRAY_GRACE)
        with anyio.move_on_after(2):
            await term.process.wait()
