"""A component that keeps crashing: what the supervisor keeps per run, when it gives the
component up, and what a request sent to it meanwhile is told."""

from __future__ import annotations

import logging
import sys
from typing import TYPE_CHECKING

import anyio
import msgspec

from conductor.config import parse_chain
from conductor.errors import ExitCode
from conductor.jsonrpc.message import Request, Response, raw
from conductor.serve import RunOptions, serve_connection
from conductor.supervise.component import Component
from conductor.transport.memory import message_pipe

if TYPE_CHECKING:
    from collections.abc import Callable
    from pathlib import Path

    import pytest

    from conductor.config import ChainConfig
    from conductor.supervise.restart import Backoff

RUNS = 8


async def test_a_component_restarted_again_and_again_keeps_no_more_per_run(
        monkeypatch: pytest.MonkeyPatch,
        objects_made_since_start: Callable[[], list[object]]) -> None:
    # Each run "lasts long enough" (STABLE 0) so the back-off never gives up: the crash
    # loop of an agent that fails after a minute each time, sped up (no wait between runs).
    monkeypatch.setattr("conductor.supervise.restart.STABLE", 0.0)
    monkeypatch.setattr("conductor.supervise.restart.FIRST", 0.0)
    # Log records (kept by pytest's capture) hold each run's error, whose traceback holds
    # that run's frame: not what is being measured.
    monkeypatch.setattr(logging.getLogger("acp_conductor"), "disabled", True)
    config = parse_chain({"agent": {"command": [sys.executable, "-c", "raise SystemExit(3)"],
                                    "restart": "on-failure"}}, file="<test>")
    to_chain, chain_reads = message_pipe()
    from_chain, editor_reads = message_pipe(1 << 16)
    alive: list[int] = []
    enough = anyio.Event()

    class Tracer:  # counts what is kept alive at each new run's start
        def message(self, *args: object, **kwargs: object) -> None:
            pass

        def lifecycle(self, component: str, event: str, **fields: object) -> None:
            if event == "spawned":
                alive.append(sum(isinstance(o, Component)
                                 for o in objects_made_since_start()))
                if len(alive) == RUNS:
                    enough.set()

    async def editor() -> None:
        await to_chain.send(Request(id=raw(1), method="initialize",
                                    params=raw({"protocolVersion": 1})))
        await enough.wait()
        await to_chain.aclose()  # the editor leaves: the chain stops

    async def ignore(item: object) -> None:
        pass

    with anyio.fail_after(30):
        async with anyio.create_task_group() as tg:
            tg.start_soon(editor)
            tg.start_soon(editor_reads.serve, ignore)
            await serve_connection(config, from_chain, chain_reads,
                                   RunOptions(tracer=Tracer(), handle_signals=False))
    # A few recent runs may still be referenced (the first start's result, the last
    # error); what matters is that the count stops growing with the runs.
    settled = alive[RUNS // 2]
    assert alive[RUNS // 2:] == [settled] * (RUNS - RUNS // 2), alive


# Answers the first initialize, then crashes; every later start reads and never answers.
_ONCE_THEN_DEAF = """
import json, os, sys
flag = sys.argv[1]
if os.path.exists(flag):
    for _ in sys.stdin:
        pass
    raise SystemExit(0)
open(flag, "w").close()
request = json.loads(sys.stdin.readline())
print(json.dumps({"jsonrpc": "2.0", "id": request["id"],
                  "result": {"protocolVersion": 1, "agentCapabilities": {}}}), flush=True)
raise SystemExit(3)
"""


async def test_a_restart_that_never_comes_back_is_given_up_however_long_its_reattach_waits(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    # Each restarted agent is wedged: its re-attach waits out its timeout, and fails. A wait
    # longer than STABLE (here the timeout 0.4 s against 0.1 s; in real life a 120 s
    # request_timeout against 60 s) must not make a run that never served count as healthy:
    # the count would start again at every restart, and the loop never give up.
    monkeypatch.setattr("conductor.supervise.restart.STABLE", 0.1)
    monkeypatch.setattr("conductor.supervise.restart.FIRST", 0.0)
    monkeypatch.setattr("conductor.routing.recovery.REATTACH_TIMEOUT", 0.4)
    config = parse_chain({"agent": {
        "command": [sys.executable, "-c", _ONCE_THEN_DEAF, str(tmp_path / "started")],
        "restart": "on-failure", "max_restarts": 2}}, file="<test>")
    to_chain, chain_reads = message_pipe()
    from_chain, editor_reads = message_pipe(1 << 16)
    spawned: list[str] = []

    class Tracer:
        def message(self, *args: object, **kwargs: object) -> None:
            pass

        def lifecycle(self, component: str, event: str, **fields: object) -> None:
            if event == "spawned":
                spawned.append(component)

    async def ignore(item: object) -> None:
        pass

    await to_chain.send(Request(id=raw(1), method="initialize",
                                params=raw({"protocolVersion": 1})))
    with anyio.fail_after(15):
        async with anyio.create_task_group() as tg:
            tg.start_soon(editor_reads.serve, ignore)
            code = await serve_connection(config, from_chain, chain_reads,
                                          RunOptions(tracer=Tracer(), handle_signals=False))
            await to_chain.aclose()
            tg.cancel_scope.cancel()
    assert code == ExitCode.COMPONENT
    assert spawned == ["agent"] * 3  # the first start, then max_restarts restarts


# Answers the first initialize, then crashes; every later start refuses initialize.
_ONCE_THEN_REFUSES = """
import json, os, sys
flag = sys.argv[1]
again = os.path.exists(flag)
open(flag, "w").close()
request = json.loads(sys.stdin.readline())
answer = {"error": {"code": -32603, "message": "no backend"}} if again \\
    else {"result": {"protocolVersion": 1, "agentCapabilities": {}}}
print(json.dumps({"jsonrpc": "2.0", "id": request["id"], **answer}), flush=True)
if again:
    sys.stdin.read()
raise SystemExit(3)
"""


async def _session_new_once_logged(config: ChainConfig,
                                   logged: Callable[[logging.LogRecord], bool],
                                   ) -> tuple[int, Response]:
    """Serve `config` to an editor that initializes, waits for a log record `logged`
    accepts, then asks for a session: the chain's exit code, and that answer."""
    to_chain, chain_reads = message_pipe()
    from_chain, editor_reads = message_pipe(1 << 16)
    seen = anyio.Event()
    answered = anyio.Event()
    answers: dict[int, Response] = {}

    class Watch(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            if logged(record):
                seen.set()

    async def editor() -> None:
        await to_chain.send(Request(id=raw(1), method="initialize",
                                    params=raw({"protocolVersion": 1})))
        await seen.wait()
        await to_chain.send(Request(id=raw(2), method="session/new",
                                    params=raw({"cwd": "/", "mcpServers": []})))
        await answered.wait()
        await to_chain.aclose()

    async def keep(item: object) -> None:
        if isinstance(item, Response):
            answers[int(msgspec.json.decode(item.id))] = item
            if 2 in answers:
                answered.set()

    handler = Watch()
    logging.getLogger("acp_conductor").addHandler(handler)
    try:
        with anyio.fail_after(15):
            async with anyio.create_task_group() as tg:
                tg.start_soon(editor)
                tg.start_soon(editor_reads.serve, keep)
                code = await serve_connection(config, from_chain, chain_reads,
                                              RunOptions(handle_signals=False))
                await answered.wait()
                tg.cancel_scope.cancel()
    finally:
        logging.getLogger("acp_conductor").removeHandler(handler)
    return code, answers[2]


async def test_once_a_component_is_given_up_a_request_to_it_is_not_told_to_try_again(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    # While its restarts run, a request to it is answered "being restarted, send this again
    # shortly" (data.restarting). Once it is given up, that is false: the chain is ending.
    monkeypatch.setattr("conductor.supervise.restart.FIRST", 0.0)
    config = parse_chain({"agent": {
        "command": [sys.executable, "-c", _ONCE_THEN_REFUSES, str(tmp_path / "started")],
        "restart": "on-failure", "max_restarts": 1}}, file="<test>")
    code, answer = await _session_new_once_logged(
        config, lambda record: record.levelno >= logging.ERROR)  # the give-up
    assert code == ExitCode.COMPONENT
    error = answer.error_value()
    assert error["data"]["component"] == "agent", error
    assert "restarting" not in error["data"], error
    assert "send this again" not in error["message"], error
    assert "no backend" in error["message"], error


async def test_while_a_component_waits_for_its_next_restart_a_request_is_told_its_latest_failure(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    # Start 1 crashes; restart 1 refuses initialize. During the wait before restart 2, a
    # request is answered with why restart 1 failed, not with the first crash's status.
    config = parse_chain({"agent": {
        "command": [sys.executable, "-c", _ONCE_THEN_REFUSES, str(tmp_path / "started")],
        "restart": "on-failure", "max_restarts": 3}}, file="<test>")
    # Restart 1 at once; the wait before restart 2 outlasts the exchange below (the editor
    # then closes its input, and the chain stops without waiting it out).
    monkeypatch.setattr("conductor.supervise.restart.Backoff.failed",
                        lambda self, ran_for: _first_then_long(self))
    _, answer = await _session_new_once_logged(
        config, lambda record: "restart 2 of" in record.getMessage())
    error = answer.error_value()
    assert error["data"] == {"component": "agent", "restarting": True}, error
    assert "no backend" in error["message"], error


def _first_then_long(backoff: Backoff) -> float | None:
    backoff.failures += 1
    return 0.0 if backoff.failures == 1 else 60.0
