"""The fault matrix on real processes: faulty.py as the agent or a proxy of a real conductor.

Pairwise, not the full cross product: every fault runs at each position (agent, first
proxy, last proxy), at each chain length (0, 1, 2 proxies), and the process faults under
each way a conductor ends (EOF, SIGTERM, SIGINT, SIGKILL). Each run checks the shared
invariants: every request answered exactly once, naming the component at fault; stdout
pure UTF-8 JSON-RPC (open_conductor decodes every line strictly); other sessions
unaffected; nothing left running.
"""

from __future__ import annotations

import contextlib
import json
import signal
from collections import Counter
from typing import TYPE_CHECKING, Any

import psutil
import pytest

from tests.faults.kit import (
    COMPONENT_FAILED,
    FLOOD,
    FRAME_TOO_LARGE,
    REQUEST_TIMEOUT,
    faulty_argv,
)
from tests.wire_client import open_conductor, still_running

if TYPE_CHECKING:
    from pathlib import Path

    from tests.wire_client import ConductorProcess


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"  # real processes: the test's own backend adds nothing


def write_chain(tmp_path: Path, length: int, faulty: str, flags: list[str]) -> str:
    """`length` faulty.py proxies (p0, p1, ...) and a faulty.py agent; `faulty` gets `flags`.
    Prompts are not timed (a flood takes what it takes); other requests time out at 0.5 s."""
    body = ("[conductor]\nshutdown_grace = 0.1\nmax_frame_bytes = 1048576\n"
            "request_timeout = 0.5\n\n")
    def command(name: str, *role: str) -> str:
        return faulty_argv(*role, "--name", name, f"--flood-count={FLOOD}",
                           *(flags if faulty == name else []))

    for i in range(length):
        body += f'[[proxy]]\nname = "p{i}"\ncommand = {command(f"p{i}", "--role", "proxy")}\n\n'
    body += f"[agent]\ncommand = {command('agent')}\n"
    path = tmp_path / "chain.toml"
    path.write_text(body, encoding="utf-8")
    return str(path)


def prompt(sid: str) -> dict[str, Any]:
    return {"sessionId": sid, "prompt": [{"type": "text", "text": "hi"}]}


def answered_once(c: ConductorProcess) -> None:
    ids: Counter[str] = Counter()
    for line in c.lines:
        for msg in (lambda d: d if isinstance(d, list) else [d])(json.loads(line)):
            if "method" not in msg:
                ids[json.dumps(msg.get("id"))] += 1
    assert ids, "no answers at all"
    assert set(ids.values()) == {1}, ids


# -- faults the chain survives --------------------------------------------------------------

NON_FATAL = ["garbage", "deep", "huge", "flood", "silent"]  # at steps 4, 6, 8, 10, 12


@pytest.mark.parametrize(("faulty", "length"), [("agent", 0), ("p0", 1), ("p1", 2)])
async def test_a_misbehaving_process_answers_every_request_once_and_spares_other_sessions(
        tmp_path: Path, faulty: str, length: int) -> None:
    flags = [f"--{fault}-at={4 + 2 * i}" for i, fault in enumerate(NON_FATAL)]
    path = write_chain(tmp_path, length, faulty, flags)
    async with open_conductor("--chain", path, check_exit=True) as c:
        await c.initialize()
        a, b = await c.new_session(), await c.new_session()
        for fault in NON_FATAL:
            answer = await c.request("session/new", {"cwd": "/", "mcpServers": []}) \
                if fault == "silent" else await c.request("session/prompt", prompt(a))
            error = answer.get("error")
            if fault in ("garbage", "flood"):
                assert error is None, (fault, answer)
            else:
                code = {"deep": -32600, "huge": FRAME_TOO_LARGE, "silent": REQUEST_TIMEOUT}
                assert error["code"] == code[fault], (fault, answer)
                assert error["data"]["component"] == faulty, (fault, answer)
            other = await c.request("session/prompt", prompt(b))
            assert "result" in other, (fault, other)
    answered_once(c)
    floods = [m for m in c.inbox if m.get("method") == "session/update"
              and "flood" in json.dumps(m["params"])]
    assert len(floods) == FLOOD
    assert f"{faulty} wrote a non-JSON line on stdout (dropped)" in c.stderr_text
    assert f"{faulty} sent a message that is not valid UTF-8" in c.stderr_text


# -- faults that end the chain ----------------------------------------------------------------

@pytest.mark.parametrize(("faulty", "length", "at"), [("agent", 1, 4), ("p0", 2, 4),
                                                       ("p1", 2, 1)])
async def test_a_crash_answers_every_pending_request_naming_the_component(
        tmp_path: Path, faulty: str, length: int, at: int) -> None:
    path = write_chain(tmp_path, length, faulty, [f"--crash-at={at}", "--silent-at=3"])
    async with open_conductor("--chain", path) as c:
        if at == 1:
            answers = [await c.request("initialize", {"protocolVersion": 1}, ident=0)]
        else:
            await c.initialize()
            sid = await c.new_session()
            await c.send({"jsonrpc": "2.0", "id": "held", "method": "session/prompt",
                          "params": prompt(sid)})  # step 3: held, never answered
            answers = [await c.request("session/prompt", prompt(sid), ident="crashing"),
                       await c.response("held")]
        assert await c.wait() == 3
    for answer in answers:
        assert answer["error"]["code"] == COMPONENT_FAILED, answer
        assert answer["error"]["data"]["component"] == faulty
        assert answer["error"]["data"]["returncode"] == 9
        assert f"faulty {faulty}: crashing at step {at}" in answer["error"]["message"]
    answered_once(c)


@pytest.mark.parametrize(("faulty", "length"), [("agent", 1), ("p0", 1)])
async def test_a_component_that_dies_writing_half_an_answer_fails_it_with_its_exit(
        tmp_path: Path, faulty: str, length: int) -> None:
    # The cut frame is its death, not a protocol error: the editor is told it exited, and
    # what it said on stderr, as for any crash.
    path = write_chain(tmp_path, length, faulty, ["--cut-at=3"])
    async with open_conductor("--chain", path) as c:
        await c.initialize()
        sid = await c.new_session()
        answer = await c.request("session/prompt", prompt(sid))
        assert await c.wait() == 3
    assert answer["error"]["code"] == COMPONENT_FAILED, answer
    assert answer["error"]["data"]["component"] == faulty
    assert answer["error"]["data"]["returncode"] == 9
    assert f"faulty {faulty}: crashing at step 3" in answer["error"]["message"]
    answered_once(c)


async def test_a_component_that_dies_writing_half_an_answer_leaves_that_loss_in_the_trace(
        tmp_path: Path) -> None:
    trace = tmp_path / "t.jsonl"
    path = write_chain(tmp_path, 0, "agent", ["--cut-at=3"])
    async with open_conductor("--trace", str(trace), "--chain", path) as c:
        await c.initialize()
        await c.request("session/prompt", prompt(await c.new_session()))
        assert await c.wait() == 3
    events = [json.loads(line) for line in trace.read_text(encoding="utf-8").splitlines()]
    lost = [e for e in events if e.get("event") == "partial-frame"]
    assert len(lost) == 1 and lost[0]["component"] == "agent" and lost[0]["reason"], lost
    exited = next(e for e in events if e.get("event") == "exited")
    assert lost[0]["seq"] < exited["seq"]


# -- processes that will not go ---------------------------------------------------------------

@pytest.mark.parametrize(("faulty", "length", "end"), [
    ("agent", 0, "eof"), ("p0", 1, "sigterm"), ("p1", 2, "sigint"), ("agent", 2, "sigkill"),
    ("p0", 1, "sighup")])
async def test_nothing_outlives_the_conductor_however_it_ends(
        tmp_path: Path, faulty: str, length: int, end: str) -> None:
    pidfile, grandchild = tmp_path / "faulty.pid", tmp_path / "grandchild.pid"
    path = write_chain(tmp_path, length, faulty, [
        "--ignore-term", "--linger", f"--pidfile={pidfile}", f"--grandchild={grandchild}"])
    async with open_conductor("--chain", path) as c:
        await c.initialize()
        assert "result" in await c.request("session/prompt", prompt(await c.new_session()))
        pids = [int(pidfile.read_text()), int(grandchild.read_text())]
        if end == "eof":
            await c.close_stdin()
        else:
            c.signal({"sigterm": signal.SIGTERM, "sigint": signal.SIGINT,
                      "sigkill": signal.SIGKILL, "sighup": signal.SIGHUP}[end])
        code = await c.wait()
    assert code == {"eof": 0, "sigterm": 143, "sigint": 130, "sigkill": -9, "sighup": 129}[end]
    assert await running(pids) == []


async def running(pids: list[int]) -> list[int]:
    """Those still running after up to 10 s (after a SIGKILL the watchdog stops them,
    asynchronously); a zombie has exited: whoever adopted it reaps it, in its own time."""
    procs = []
    for pid in pids:
        with contextlib.suppress(psutil.NoSuchProcess):
            procs.append(psutil.Process(pid))
    return [p.pid for p in await still_running(procs)]


async def test_a_second_hangup_does_not_cut_the_graceful_stop_short(tmp_path: Path) -> None:
    # A closed terminal may deliver SIGHUP twice (the kernel, then the shell).
    pidfile = tmp_path / "faulty.pid"
    path = tmp_path / "chain.toml"
    # Its grace is the window the second hangup must land in: EOF, then TERM, each ignored.
    path.write_text("[conductor]\nshutdown_grace = 1.0\n\n[agent]\ncommand = "
                    + faulty_argv("--name", "agent", "--ignore-term", "--linger",
                                  f"--pidfile={pidfile}") + "\n", encoding="utf-8")
    async with open_conductor("--log-level", "info", "--chain", str(path)) as c:
        await c.initialize()
        c.signal(signal.SIGHUP)
        # The agent has its EOF: the stop is under way, so the conductor's own handler is
        # gone by now, and the agent holds the stop for two graces (it ignores EOF and TERM).
        await c.wait_stderr("faulty agent: stdin closed; lingering")
        c.signal(signal.SIGHUP)
        code = await c.wait()
    assert code == 129, c.stderr_text
    assert await running([int(pidfile.read_text())]) == []


@pytest.mark.parametrize("second", [signal.SIGTERM, signal.SIGINT])
async def test_a_second_sigterm_or_sigint_ends_a_graceful_stop_at_once(
        tmp_path: Path, second: signal.Signals) -> None:
    # A user who presses Ctrl-C again does not want to wait out every grace: the conductor
    # ends (killed by that signal, as with no handler) and the watchdog stops what is left.
    pidfile = tmp_path / "faulty.pid"
    path = tmp_path / "chain.toml"
    path.write_text("[conductor]\nshutdown_grace = 1.0\n\n[agent]\ncommand = "
                    + faulty_argv("--name", "agent", "--ignore-term", "--linger",
                                  f"--pidfile={pidfile}") + "\n", encoding="utf-8")
    async with open_conductor("--chain", str(path)) as c:
        await c.initialize()
        c.signal(signal.SIGINT)
        await c.wait_stderr("faulty agent: stdin closed; lingering")
        c.signal(second)
        code = await c.wait()
    assert code == -second, c.stderr_text
    assert "Traceback" not in c.stderr_text
    assert await running([int(pidfile.read_text())]) == []


async def test_the_editor_closing_its_input_ends_the_chain_while_a_frame_waits_on_a_stalled_agent(
        tmp_path: Path) -> None:
    # The agent stopped reading; a frame larger than its pipe is half written to it, so the
    # conductor cannot read on to its own end of input. Closing it must still end the chain.
    pidfile = tmp_path / "faulty.pid"
    path = tmp_path / "chain.toml"
    path.write_text("[conductor]\nshutdown_grace = 0.5\n\n[agent]\ncommand = "
                    + faulty_argv("--name", "agent", "--stall-at=3", f"--pidfile={pidfile}")
                    + "\n", encoding="utf-8")
    async with open_conductor("--chain", str(path)) as c:
        await c.initialize()
        sid = await c.new_session()
        await c.send({"jsonrpc": "2.0", "id": "stalled", "method": "session/prompt",
                      "params": prompt(sid)})
        await c.wait_stderr("faulty agent: stalled at step 3")
        big = {"sessionId": sid, "prompt": [{"type": "text", "text": "x" * (4 << 20)}]}
        await c.send({"jsonrpc": "2.0", "id": "big", "method": "session/prompt", "params": big})
        await c.close_stdin()
        rest = await c.read_to_end()
        code = await c.wait()
    assert code == 0, c.stderr_text
    assert sorted(m["id"] for m in rest) == ["big", "stalled"]
    for answer in rest:
        assert answer["error"]["data"]["component"] == "agent", answer
    assert "Traceback" not in c.stderr_text
    assert await running([int(pidfile.read_text())]) == []
