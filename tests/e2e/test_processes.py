"""Supervision: failures answer every pending request with blame; nothing outlives the chain."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import sys
from pathlib import Path

import psutil
import pytest

from conductor.supervise.watchdog import SCRIPT as WATCHDOG_SCRIPT
from tests.conftest import BIN
from tests.faults.kit import faulty_argv
from tests.wire_client import (
    ConductorProcess,
    agent_cmd,
    chain_args,
    has_exited,
    open_conductor,
    proxy_cmd,
    still_running,
)


def components(c: ConductorProcess) -> list[psutil.Process]:
    """The conductor's children, its watchdog left out."""
    watchdog = watchdog_of(c)
    return [p for p in psutil.Process(c.pid).children() if p.pid != watchdog.pid]


def watchdog_of(c: ConductorProcess) -> psutil.Process:
    for child in psutil.Process(c.pid).children():
        if str(WATCHDOG_SCRIPT) in " ".join(child.cmdline()):
            return child
    raise AssertionError("the conductor started no watchdog")


def family(c: ConductorProcess, pidfile: Path) -> list[int]:
    """Every process the conductor started, grandchildren included."""
    pids = [p.pid for p in psutil.Process(c.pid).children(recursive=True)]
    grandchild = int(pidfile.read_text(encoding="utf-8"))
    assert grandchild in pids  # still in the tree while the agent lives
    return pids


async def wait_all_gone(pids: list[int]) -> None:
    """Each of `pids` exits (a zombie has: init reaps orphans when it gets round to it)."""
    procs = []
    for pid in pids:
        try:
            procs.append(psutil.Process(pid))
        except psutil.NoSuchProcess:
            continue
    alive = await still_running(procs)
    assert not alive, [p.pid for p in alive]


def write_chain(tmp_path: Path, body: str) -> str:
    path = tmp_path / "chain.toml"
    path.write_text(body, encoding="utf-8")
    return str(path)


# -- failures -----------------------------------------------------------------------------

@pytest.mark.parametrize("proxies", [0, 1])
async def test_agent_crash_mid_request_answers_every_pending_request_naming_the_agent(
        proxies: int) -> None:
    async with open_conductor(*chain_args(proxies)) as c:
        await c.initialize()
        await c.send({"jsonrpc": "2.0", "id": "waiting", "method": "_test/hang", "params": {}})
        await c.send({"jsonrpc": "2.0", "id": "boom", "method": "_test/crash",
                      "params": {"code": 5, "stderr": "fatal: out of tokens"}})
        answers = [await c.response("waiting"), await c.response("boom")]
        code = await c.wait()
    assert code == 3
    for answer in answers:
        error = answer["error"]
        assert "agent" in error["message"]
        assert "exited with status 5" in error["message"]
        assert "fatal: out of tokens" in error["message"]
        assert error["data"]["component"] == "agent"
        assert error["data"]["returncode"] == 5
        assert "fatal: out of tokens" in error["data"]["stderrTail"]
    assert "agent| fatal: out of tokens" in c.stderr_text


async def test_an_agent_crash_reaches_the_editor_through_the_proxies_before_they_stop(
        tmp_path: Path) -> None:
    trace = tmp_path / "trace.jsonl"
    async with open_conductor("--trace", str(trace), *chain_args(2)) as c:
        await c.initialize()
        answer = await c.request("_test/crash", {"code": 5}, ident="boom")
        code = await c.wait()
    assert code == 3
    assert answer["error"]["data"]["component"] == "agent"
    events = [json.loads(line) for line in trace.read_text(encoding="utf-8").splitlines()]

    def seq(match: dict[str, object]) -> int:
        [event] = [e for e in events if all(e.get(k) == v for k, v in match.items())]
        return int(event["seq"])

    # The answer travelled up agent -> proxy:1 -> proxy:0 -> editor while both proxies
    # still ran: only then were they stopped (their expected exits come after it).
    answered = seq({"type": "message", "hop": "client", "dir": "out", "id": "boom"})
    assert answered < seq({"type": "lifecycle", "component": "proxy:0", "event": "exited"})
    assert answered < seq({"type": "lifecycle", "component": "proxy:1", "event": "exited"})
    assert seq({"type": "message", "hop": "proxy:0", "dir": "in", "kind": "error"}) < answered


@pytest.mark.parametrize(("proxies", "crashing"), [(1, 0), (2, 1), (2, 0)])
async def test_proxy_crash_mid_request_answers_the_editor_naming_the_proxy(
        proxies: int, crashing: int) -> None:
    commands = [proxy_cmd(*(("--crash-on", "_test/echo") if i == crashing else ()))
                for i in range(proxies)]
    async with open_conductor("agent", *commands, agent_cmd()) as c:
        await c.initialize()
        await c.send({"jsonrpc": "2.0", "id": "waiting", "method": "_test/hang", "params": {}})
        await c.send({"jsonrpc": "2.0", "id": 1, "method": "_test/echo", "params": {}})
        answers = [await c.response(1), await c.response("waiting")]
        code = await c.wait()
    assert code == 3
    name = f"proxy:{crashing}"
    for answer in answers:
        error = answer["error"]
        assert error["data"]["component"] == name, error
        assert error["data"]["returncode"] == 7
        assert error["data"]["stderrTail"] == ["relay-proxy: crashing on _test/echo"]
        assert f"{name}: exited with status 7" in error["message"]
    assert f"{name}| relay-proxy: crashing on _test/echo" in c.stderr_text


@pytest.mark.parametrize(("proxies", "deaf"), [(0, "agent"), (1, "p0")])
async def test_a_component_that_closes_its_stdin_but_runs_on_is_stopped_and_answers_name_it(
        tmp_path: Path, proxies: int, deaf: str) -> None:
    # Nothing can reach it any more: without this, what it held and everything sent to it
    # after would wait forever (no request_timeout), and it would run until the chain ends.
    pidfile = tmp_path / "deaf.pid"
    flags = ["--deaf-at=3", f"--pidfile={pidfile}"]
    body = "[conductor]\nshutdown_grace = 0.2\n\n"
    for i in range(proxies):
        body += (f'[[proxy]]\nname = "p{i}"\ncommand = '
                 f'{faulty_argv("--role", "proxy", "--name", f"p{i}", *flags)}\n\n')
    body += f"[agent]\ncommand = {faulty_argv('--name', 'agent', *flags)}\n"
    async with open_conductor("--chain", write_chain(tmp_path, body)) as c:
        await c.initialize()
        sid = await c.new_session()
        await c.send({"jsonrpc": "2.0", "id": "held", "method": "session/prompt",
                      "params": {"sessionId": sid, "prompt": [{"type": "text", "text": "hi"}]}})
        await c.wait_stderr(f"faulty {deaf}: deaf at step 3")
        await c.send({"jsonrpc": "2.0", "id": "after", "method": "session/new",
                      "params": {"cwd": "/", "mcpServers": []}})
        answers = [await c.response("after"), await c.response("held")]
        assert await c.wait() == 3
    for answer in answers:
        assert answer["error"]["code"] == -33001, answer
        assert answer["error"]["data"]["component"] == deaf, answer
    assert f"{deaf} closed its stdin but is still running" in c.stderr_text
    await wait_all_gone([int(pidfile.read_text(encoding="utf-8"))])


async def test_a_component_that_closes_its_stdout_but_runs_on_is_stopped_and_answers_say_so(
        tmp_path: Path) -> None:
    pidfile = tmp_path / "mute.pid"
    body = ("[conductor]\nshutdown_grace = 0.2\n\n"
            f"[agent]\ncommand = {faulty_argv('--mute-at=3', f'--pidfile={pidfile}')}\n")
    async with open_conductor("--chain", write_chain(tmp_path, body)) as c:
        await c.initialize()
        sid = await c.new_session()
        answer = await c.request("session/prompt", {"sessionId": sid, "prompt": []})
        assert await c.wait() == 3
    error = answer["error"]
    assert error["code"] == -33001, error
    assert error["data"]["component"] == "agent"
    assert error["message"].startswith("agent: closed its stdout without exiting"), error
    await wait_all_gone([int(pidfile.read_text(encoding="utf-8"))])


@pytest.mark.parametrize("which", ["agent", "proxy"])
async def test_a_component_that_cannot_start_fails_initialize_naming_it(
        tmp_path: Path, which: str) -> None:
    missing = str(tmp_path / "no-such-agent")
    commands = [missing, agent_cmd()] if which == "proxy" else [proxy_cmd(), missing]
    async with open_conductor("agent", *commands) as c:
        answer = await c.request("initialize", {"protocolVersion": 1}, ident=0)
        code = await c.wait()
    assert code == 3
    name = "proxy:0" if which == "proxy" else "agent"
    assert answer["error"]["data"]["component"] == name
    assert name in answer["error"]["message"]
    assert "not found" in answer["error"]["message"]
    assert "Traceback" not in c.stderr_text


async def test_a_missing_working_directory_is_a_config_error_before_anything_starts(
        tmp_path: Path) -> None:
    chain = write_chain(tmp_path, f"""
[agent]
command = {json.dumps(agent_cmd())}
cwd = "does-not-exist"
""")
    async with open_conductor("--chain", chain) as c:
        assert await c.wait() == 2
    assert "agent.cwd: does-not-exist not found" in c.stderr_text


# -- shutdown without orphans ---------------------------------------------------------------

@pytest.mark.parametrize("how", ["eof", "sigterm", "sigint"])
async def test_no_process_outlives_the_conductor_grandchildren_included(
        tmp_path: Path, how: str) -> None:
    pidfile = tmp_path / "grandchild.pid"
    chain = write_chain(tmp_path, f"""
[conductor]
shutdown_grace = 0.5

[[proxy]]
command = {json.dumps(proxy_cmd())}

[agent]
command = {json.dumps(agent_cmd("--grandchild", str(pidfile)))}
""")
    async with open_conductor("--chain", chain) as c:
        await c.initialize()
        pids = family(c, pidfile)
        assert len(pids) >= 3  # proxy, agent, grandchild
        if how == "eof":
            await c.close_stdin()
        else:
            c.signal(signal.SIGTERM if how == "sigterm" else signal.SIGINT)
        code = await c.wait()
    assert code == {"eof": 0, "sigterm": 143, "sigint": 130}[how]
    await wait_all_gone(pids)


async def test_a_component_that_ignores_eof_and_sigterm_is_killed(tmp_path: Path) -> None:
    trace = tmp_path / "trace.jsonl"
    chain = write_chain(tmp_path, f"""
[conductor]
shutdown_grace = 0.3

[agent]
command = {json.dumps(agent_cmd("--ignore-term", "--linger"))}
""")
    async with open_conductor("--trace", str(trace), "--chain", chain) as c:
        await c.initialize()
        [agent] = components(c)
        await c.close_stdin()
        assert await c.wait() == 0  # bounded: the agent would linger for 300 s
    assert has_exited(agent)
    events = [json.loads(line) for line in trace.read_text(encoding="utf-8").splitlines()]
    seen = [e.get("line", f"{e['event']} {e.get('code')}") for e in events
            if e["type"] == "lifecycle" and e["component"] == "agent"
            and e["event"] in ("stderr", "exited")]
    assert seen == ["scripted-agent: stdin closed; lingering",  # EOF first, then TERM,
                    "scripted-agent: ignoring SIGTERM",
                    f"exited {-signal.SIGKILL}"]                  # then KILL


async def test_a_crashed_agents_grandchildren_are_cleaned_up_too(tmp_path: Path) -> None:
    pidfile = tmp_path / "grandchild.pid"
    async with open_conductor(*chain_args(0, "--grandchild", str(pidfile))) as c:
        await c.initialize()
        pids = family(c, pidfile)
        answer = await c.request("_test/crash", {"code": 9})
        assert answer["error"]["data"]["returncode"] == 9
        assert await c.wait() == 3
    await wait_all_gone(pids)


async def test_a_grandchild_that_left_the_process_group_is_stopped_too(tmp_path: Path) -> None:
    pidfile = tmp_path / "detached.pid"
    async with open_conductor(*chain_args(0, "--detached-grandchild", str(pidfile))) as c:
        await c.initialize()
        detached = int(pidfile.read_text(encoding="utf-8"))
        assert os.getpgid(detached) != os.getpgid(components(c)[0].pid)
        await c.close_stdin()
        assert await c.wait() == 0
    await wait_all_gone([detached])
    assert "Exception ignored" not in c.stderr_text  # no asyncio noise at exit


async def test_an_inner_conductors_agent_is_stopped_when_the_inner_conductor_is_killed(
        tmp_path: Path) -> None:
    # The inner conductor waits 5 s for its stubborn agent; the outer gives it 0.5 s, then
    # kills it. The inner agent, in a session of its own, is an orphan by then: only the
    # token it inherited through the inner conductor lets the outer find it.
    inner = tmp_path / "inner.toml"
    inner.write_text(f"""[conductor]
shutdown_grace = 5
[agent]
command = {json.dumps(agent_cmd("--ignore-term", "--linger"))}
""", encoding="utf-8")
    from tests.conftest import conductor_argv
    outer = write_chain(tmp_path, f"""[conductor]
shutdown_grace = 0.5
[agent]
command = {json.dumps(conductor_argv("--chain", str(inner)))}
""")
    async with open_conductor("--chain", outer) as c:
        await c.initialize()
        tree = [p.pid for p in psutil.Process(c.pid).children(recursive=True)]
        assert len(tree) >= 2  # the inner conductor and its agent
        await c.close_stdin()
        assert await c.wait() == 0
    await wait_all_gone(tree)


# -- a conductor that ends cleanly ----------------------------------------------------------

# Run a conductor as the child of a subreaper that never reaps on its own: any process the
# conductor leaves behind, running or a zombie, is then re-parented here and found by
# waitpid. (A VM's pid 1 may take seconds to reap an orphan; a container's may never.)
SUBREAPER = """
import ctypes, json, os, subprocess, sys
PR_SET_CHILD_SUBREAPER = 36
assert ctypes.CDLL(None, use_errno=True).prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0
init = json.dumps({"jsonrpc": "2.0", "id": 1, "method": "initialize",
                   "params": {"protocolVersion": 1, "clientCapabilities": {}}}) + "\\n"
done = subprocess.run(sys.argv[1:], input=init.encode(), capture_output=True, timeout=60)
left = []
while True:
    try:
        pid, status = os.waitpid(-1, 0)
    except ChildProcessError:
        break
    left.append(pid)
print(json.dumps({"code": done.returncode, "answered": b'"result"' in done.stdout,
                  "left": left}))
"""


def test_a_conductor_that_ends_cleanly_leaves_no_process_not_even_its_watchdog_s_zombie(
        ) -> None:
    import subprocess

    from tests.conftest import child_env, conductor_argv

    argv = conductor_argv(*chain_args(1))
    done = subprocess.run([sys.executable, "-c", SUBREAPER, *argv], capture_output=True,
                          text=True, env=child_env(), timeout=90, check=False)
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    assert report["code"] == 0 and report["answered"], report
    assert report["left"] == []  # everything it started was reaped by it before it left


# -- a conductor killed with SIGKILL ----------------------------------------------------------

async def test_a_sigkilled_conductor_takes_every_process_it_started_with_it(
        tmp_path: Path) -> None:
    # The agent outlives stdin EOF; one grandchild stays in its group, one leaves it (setsid).
    in_group, detached = tmp_path / "grandchild.pid", tmp_path / "detached.pid"
    chain = write_chain(tmp_path, f"""
[conductor]
shutdown_grace = 0.5

[[proxy]]
command = {json.dumps(proxy_cmd())}

[agent]
command = {json.dumps(agent_cmd("--linger", "--grandchild", str(in_group),
                                 "--detached-grandchild", str(detached)))}
""")
    async with open_conductor("--chain", chain) as c:
        await c.initialize()
        pids = family(c, in_group)
        stray = int(detached.read_text(encoding="utf-8"))
        assert stray in pids and len(pids) >= 4  # proxy, agent, both grandchildren
        c.signal(signal.SIGKILL)
        assert await c.wait() == -signal.SIGKILL
    if sys.platform != "linux":  # no /proc: a process that left its group is out of reach
        pids.remove(stray)
        with contextlib.suppress(ProcessLookupError):
            os.kill(stray, signal.SIGKILL)
    await wait_all_gone(pids)  # the watchdog itself included


async def test_after_a_sigkill_a_component_that_ignores_sigterm_is_killed(
        tmp_path: Path) -> None:
    chain = write_chain(tmp_path, f"""
[conductor]
shutdown_grace = 0.3

[agent]
command = {json.dumps(agent_cmd("--ignore-term", "--linger"))}
""")
    async with open_conductor("--chain", chain) as c:
        await c.initialize()
        [agent] = components(c)
        c.signal(signal.SIGKILL)
        await c.wait()
    await wait_all_gone([agent.pid])


@pytest.mark.skipif(sys.platform != "linux", reason="parent-death signals are Linux-only")
async def test_a_component_gets_a_parent_death_signal_even_when_its_watchdog_dies_too(
        tmp_path: Path) -> None:
    pidfile = tmp_path / "grandchild.pid"
    async with open_conductor(*chain_args(0, "--linger", "--grandchild", str(pidfile))) as c:
        await c.initialize()
        watchdog = watchdog_of(c)
        [agent] = components(c)
        grandchild = int(pidfile.read_text(encoding="utf-8"))
        watchdog.kill()
        c.signal(signal.SIGKILL)
        await c.wait()
    try:
        await wait_all_gone([agent.pid])
    finally:  # nothing promises this one's end without the watchdog: do not leak it
        with contextlib.suppress(ProcessLookupError):
            os.kill(grandchild, signal.SIGKILL)


# -- environment ------------------------------------------------------------------------------

async def test_env_and_cwd_from_the_chain_file_reach_the_component(tmp_path: Path) -> None:
    (tmp_path / "work").mkdir()
    chain = write_chain(tmp_path, f"""
[agent]
command = {json.dumps(agent_cmd())}
cwd = "work"
env = {{ GREETING = "hello ${{WHO}}", DEFAULTED = "${{UNSET_VAR_XYZ:-fallback}}" }}
""")
    async with open_conductor("--chain", chain, env={"WHO": "world"}) as c:
        await c.initialize()
        answer = await c.request("_test/env", {"names": ["GREETING", "DEFAULTED", "WHO"]})
    result = answer["result"]
    assert Path(result["cwd"]) == (tmp_path / "work").resolve()
    assert result["env"] == {"GREETING": "hello world", "DEFAULTED": "fallback", "WHO": "world"}


async def test_inherit_env_false_gives_the_component_only_its_own_env(tmp_path: Path) -> None:
    chain = write_chain(tmp_path, f"""
[agent]
command = {json.dumps(agent_cmd())}
inherit_env = false
env = {{ ONLY = "this" }}
""")
    async with open_conductor("--chain", chain, env={"LEAK": "no"}) as c:
        await c.initialize()
        answer = await c.request("_test/env", {"names": ["ONLY", "LEAK"]})
    assert answer["result"]["env"] == {"ONLY": "this", "LEAK": None}


# -- pending requests at shutdown --------------------------------------------------------------

async def test_sigterm_answers_requests_still_in_flight_before_exiting() -> None:
    async with open_conductor(*chain_args(1)) as c:
        await c.initialize()
        await c.send({"jsonrpc": "2.0", "id": "slow", "method": "_test/hang", "params": {}})
        await c.read_until(lambda m: m.get("method") == "_test/hanging")
        c.signal(signal.SIGTERM)
        answer = await c.response("slow")
        assert await c.wait() == 143
    assert answer["error"]["code"] < 0
    assert "shutting down" in json.dumps(answer["error"])


async def test_editor_eof_with_a_request_in_flight_still_shuts_down_cleanly(
        tmp_path: Path) -> None:
    chain = write_chain(tmp_path, f"""
[conductor]
shutdown_grace = 0.3

[agent]
command = {json.dumps(agent_cmd())}
""")
    async with open_conductor("--chain", chain) as c:
        await c.initialize()
        await c.send({"jsonrpc": "2.0", "id": "slow", "method": "_test/hang", "params": {}})
        await c.read_until(lambda m: m.get("method") == "_test/hanging")
        await c.close_stdin()
        rest = await c.read_to_end()
        assert await c.wait() == 0
    assert [m["id"] for m in rest] == ["slow"]  # answered, not dropped
    assert rest[0]["error"]["code"] < 0


async def test_a_request_the_agent_holds_at_shutdown_is_blamed_on_the_agent_not_a_proxy(
        tmp_path: Path) -> None:
    # permissions -> redact -> transcript run in-process; the prompt crosses the two that
    # handle it. Stopped mid-prompt, the editor must hear that the *agent* was stopped.
    chain = tmp_path / "chain.toml"
    chain.write_text(
        '[[proxy]]\nuse = "permissions"\n\n[[proxy]]\nuse = "redact"\n\n'
        f'[[proxy]]\nuse = "transcript"\noptions.directory = "{tmp_path / "t"}"\n\n'
        f'[agent]\ncommand = {json.dumps(agent_cmd("--prompt-hangs"))}\n', encoding="utf-8")
    async with open_conductor("--chain", str(chain)) as c:
        await c.initialize()
        sid = await c.new_session()
        await c.send({"jsonrpc": "2.0", "id": "p", "method": "session/prompt",
                      "params": {"sessionId": sid, "prompt": [{"type": "text", "text": "hi"}]}})
        await c.read_until(lambda m: m.get("method") == "_test/hanging")
        c.process.send_signal(signal.SIGTERM)
        answer = await c.response("p")
    error = answer["error"]
    assert error["data"]["component"] == "agent", error
    assert error["message"].startswith("agent: was stopped before answering"), error


def test_under_nohup_sighup_is_ignored_and_the_chain_serves_on() -> None:
    import subprocess

    from tests.conftest import child_env, conductor_argv

    init = {"jsonrpc": "2.0", "id": 1, "method": "initialize",
            "params": {"protocolVersion": 1, "clientCapabilities": {}}}
    new = {"jsonrpc": "2.0", "id": 2, "method": "session/new",
           "params": {"cwd": "/", "mcpServers": []}}
    with subprocess.Popen(["nohup", *conductor_argv("--chain", "demo")], env=child_env(),
                          stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                          stderr=subprocess.PIPE) as proc:
        assert proc.stdin is not None and proc.stdout is not None
        try:
            proc.stdin.write(json.dumps(init).encode() + b"\n")
            proc.stdin.flush()
            assert json.loads(proc.stdout.readline())["id"] == 1
            proc.send_signal(signal.SIGHUP)  # the terminal it was started from closed
            out, err = proc.communicate(json.dumps(new).encode() + b"\n", timeout=30)
        finally:
            if proc.poll() is None:
                proc.kill()
    assert proc.returncode == 0, err.decode()
    assert json.loads(out.splitlines()[0])["id"] == 2


async def test_a_turn_a_dead_proxy_had_forwarded_is_cancelled_at_the_agent(
        tmp_path: Path) -> None:
    # Nobody can take that turn's answer any more; left running it holds the session, so
    # after a restart (or a nested conductor's) the editor's retried prompt waits behind it.
    record = tmp_path / "agent.jsonl"
    async with open_conductor("agent", proxy_cmd("--crash-on", "_test/boom"),
                              agent_cmd("--prompt-hangs", "--record", str(record))) as c:
        await c.initialize()
        sid = await c.new_session()
        await c.send({"jsonrpc": "2.0", "id": "turn", "method": "session/prompt",
                      "params": {"sessionId": sid, "prompt": []}})
        await c.read_until(lambda m: m.get("method") == "_test/hanging")
        await c.send({"jsonrpc": "2.0", "id": "boom", "method": "_test/boom", "params": {}})
        assert (await c.response("turn"))["error"]["data"]["component"] == "proxy:0"
        assert await c.wait() == 3
    seen = [json.loads(line) for line in record.read_text(encoding="utf-8").splitlines()]
    assert any(m.get("method") == "session/cancel" and m.get("params") == {"sessionId": sid}
               for m in seen), seen


async def test_a_sigkilled_conductor_leaves_no_mcp_bridge_socket_behind(tmp_path: Path) -> None:
    # The stdio bridge listens on a socket in a private directory; a conductor that is
    # killed cannot remove it: its watchdog does.
    chain = write_chain(tmp_path, f"""
[[proxy]]
name = "docs"
plugin = "{BIN / 'docs_tools.py'}:Docs"

[agent]
command = {json.dumps(agent_cmd())}
""")
    async with open_conductor("--log-level", "info", "--chain", chain) as c:
        await c.initialize()
        await c.new_session()
        await c.wait_stderr("MCP bridge: shims connect to ")
        [socket] = [Path(line.rpartition(" ")[2]) for line in c.stderr_text.splitlines()
                    if "MCP bridge: shims connect to " in line]
        assert socket.exists()
        watchdog = watchdog_of(c).pid
        c.signal(signal.SIGKILL)
        assert await c.wait() == -signal.SIGKILL
    await wait_all_gone([watchdog])  # it ends once it has cleaned up
    assert not socket.parent.exists()


@pytest.mark.parametrize("how", ["eof", "sigterm"])
def test_an_editor_that_stopped_reading_does_not_hold_the_conductor_when_told_to_stop(
        tmp_path: Path, how: str) -> None:
    # An editor quitting mid-turn: its end of our stdout is full and never read again, and
    # it closes our stdin or sends SIGTERM, then waits for us to exit. What we still owe it
    # cannot be written; that must not keep us (and the editor) waiting for ever.
    import fcntl
    import subprocess
    import termios
    import time

    from tests.conftest import child_env, conductor_argv

    chain = write_chain(tmp_path, f"[conductor]\nshutdown_grace = 0.5\n\n"
                        f"[agent]\ncommand = {json.dumps(agent_cmd())}\n")
    lines = [{"jsonrpc": "2.0", "id": 1, "method": "initialize",
              "params": {"protocolVersion": 1, "clientCapabilities": {}}},
             {"jsonrpc": "2.0", "id": 2, "method": "_test/notify",
              "params": {"sessionId": "s", "count": 5000, "pad": 1000}},
             {"jsonrpc": "2.0", "id": 3, "method": "_test/hang", "params": {}}]
    with (tmp_path / "stderr").open("wb") as err, \
            subprocess.Popen(conductor_argv("--chain", chain), env=child_env(),
                             stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                             stderr=err) as proc:
        assert proc.stdin is not None and proc.stdout is not None
        try:
            proc.stdin.write(b"".join(json.dumps(m).encode() + b"\n" for m in lines))
            proc.stdin.flush()
            deadline = time.monotonic() + 30
            buf = bytearray(4)
            while time.monotonic() < deadline:  # until our end of its stdout is full
                fcntl.ioctl(proc.stdout.fileno(), termios.FIONREAD, buf)
                if int.from_bytes(buf, sys.byteorder) >= 65536:
                    break
                time.sleep(0.05)
            if how == "eof":
                proc.stdin.close()
            else:
                proc.send_signal(signal.SIGTERM)
            code = proc.wait(timeout=30)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    assert code == (0 if how == "eof" else 143)
    assert "the client stopped reading" in (tmp_path / "stderr").read_text(encoding="utf-8")


SLOW_TO_START = """
import sys

import anyio

from conductor.plugins import Proxy


class SlowToStart(Proxy):
    async def chain_started(self) -> None:
        print("slow: connecting", file=sys.stderr, flush=True)
        await anyio.sleep_forever()
"""


@pytest.mark.parametrize("how", ["eof", "sigterm"])
async def test_a_chain_stopped_while_it_starts_answers_the_initialize_naming_what_was_starting(
        tmp_path: Path, how: str) -> None:
    # The editor's initialize waits for the start; a stop then must answer it (nothing else
    # will), not close stdout on it.
    (tmp_path / "slow.py").write_text(SLOW_TO_START, encoding="utf-8")
    chain = write_chain(tmp_path, f'[conductor]\nshutdown_grace = 0.3\n\n'
                        f'[[proxy]]\nname = "slow"\nplugin = "{tmp_path / "slow.py"}:SlowToStart"'
                        f'\n\n[agent]\ncommand = {json.dumps(agent_cmd())}\n')
    async with open_conductor("--chain", chain) as c:
        await c.send({"jsonrpc": "2.0", "id": 0, "method": "initialize",
                      "params": {"protocolVersion": 1, "clientCapabilities": {}}})
        await c.wait_stderr("slow: connecting")
        if how == "eof":
            await c.close_stdin()
        else:
            c.signal(signal.SIGTERM)
        answer = await c.response(0)
        assert await c.wait() == (0 if how == "eof" else 143)
    error = answer["error"]
    assert error["code"] == -33001, error
    assert error["data"]["component"] == "slow"
    assert error["message"].startswith("slow: was still starting: the conductor is shutting "
                                       "down"), error
    assert "a component stopped reading" not in c.stderr_text


def test_a_conductor_whose_output_the_editor_closed_stops_as_at_the_end_of_its_input(
        tmp_path: Path) -> None:
    # Nothing it or its agent says can reach anyone again, while the editor's side of its
    # input may stay open (held by some other process): it must not run on, agent and all.
    import subprocess

    from tests.conftest import child_env, conductor_argv

    pidfile = tmp_path / "agent.pid"
    chain = write_chain(tmp_path, "[conductor]\nshutdown_grace = 0.3\n\n"
                        f"[agent]\ncommand = {faulty_argv(f'--pidfile={pidfile}')}\n")
    init = {"jsonrpc": "2.0", "id": 1, "method": "initialize",
            "params": {"protocolVersion": 1, "clientCapabilities": {}}}
    new = {"jsonrpc": "2.0", "id": 2, "method": "session/new",
           "params": {"cwd": "/", "mcpServers": []}}
    with subprocess.Popen(conductor_argv("--chain", chain), env=child_env(),
                          stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                          stderr=subprocess.PIPE) as proc:
        assert proc.stdin is not None and proc.stdout is not None
        try:
            proc.stdin.write(json.dumps(init).encode() + b"\n")
            proc.stdin.flush()
            assert json.loads(proc.stdout.readline())["id"] == 1
            proc.stdout.close()
            proc.stdin.write(json.dumps(new).encode() + b"\n")  # its answer cannot go out
            proc.stdin.flush()
            code = proc.wait(timeout=20)
            err = proc.stderr.read().decode() if proc.stderr else ""
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
            proc.stdin.close()
    assert code == 0, err
    assert "the client closed its end of our output" in err
    agent = int(pidfile.read_text(encoding="utf-8"))
    assert not psutil.pid_exists(agent) or has_exited(psutil.Process(agent))
