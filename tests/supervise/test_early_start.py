"""Components start during the conductor's own start-up when the editor's initialize is
already waiting (conductor/early_start.py), and never on anything else."""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
from typing import TYPE_CHECKING

import anyio
import pytest

from conductor import acp
from conductor.config import chain_from_commands
from conductor.early_start import EarlyStart, start_early
from conductor.jsonrpc.message import Notification, ParseError, Request, decode
from conductor.routing.handshake import Handshake
from conductor.transport.stdio import FdReceiveStream
from tests.conftest import child_env, conductor_argv
from tests.wire_client import agent_cmd, chain_args, proxy_cmd

if TYPE_CHECKING:
    from collections.abc import Iterator
    from pathlib import Path

    from conductor.jsonrpc.message import Response
    from conductor.supervise.spawn import LaunchSpec, Started

STARTED_EARLY = "started during start-up"


def frame(message: dict[str, object]) -> bytes:
    return json.dumps(message).encode() + b"\n"


INIT = frame({"jsonrpc": "2.0", "id": 0, "method": "initialize",
              "params": {"protocolVersion": 1, "clientCapabilities": {}}})
ECHO = frame({"jsonrpc": "2.0", "id": 1, "method": "_test/echo", "params": {"n": 1}})


def waiting_pipe(data: bytes) -> int:
    """The read end of a pipe that already holds `data`, then EOF."""
    read, write = os.pipe()
    os.write(write, data)
    os.close(write)
    return read


def start_early_on(data: bytes) -> EarlyStart:
    """`start_early` for a chain of the scripted agent, with `data` waiting on its stdin."""
    config = chain_from_commands([agent_cmd()], with_agent=True)
    fd = waiting_pipe(data)
    try:
        return start_early(config, "agent", fd=fd)
    finally:
        os.close(fd)


def serve(stdin: int, *args: str) -> tuple[list[dict[str, object]], str, int]:
    """Run the conductor on `stdin` (written before it started) to the end."""
    try:
        done = subprocess.run(conductor_argv("--log-level", "debug", *args), stdin=stdin,
                              capture_output=True, env=child_env(), timeout=60, check=False)
    finally:
        os.close(stdin)
    lines = [json.loads(line) for line in done.stdout.splitlines()]
    return lines, done.stderr.decode(), done.returncode


@pytest.mark.parametrize("proxies", [0, 1])
def test_a_chain_whose_initialize_is_waiting_starts_early_and_loses_none_of_the_input(
        proxies: int) -> None:
    answers, stderr, code = serve(waiting_pipe(INIT + ECHO), *chain_args(proxies))
    assert code == 0, stderr
    assert STARTED_EARLY in stderr
    by_id = {a["id"]: a for a in answers}
    assert by_id[0]["result"]["protocolVersion"] == 1  # type: ignore[index]
    assert by_id[1]["result"] == {"n": 1}  # read with the initialize, served after it


def test_input_from_a_file_is_read_whole_after_an_early_start(tmp_path: Path) -> None:
    path = tmp_path / "in.jsonl"
    path.write_bytes(INIT + ECHO)
    answers, stderr, code = serve(os.open(path, os.O_RDONLY), *chain_args(0))
    assert code == 0, stderr
    assert STARTED_EARLY in stderr
    assert [a["id"] for a in answers] == [0, 1]


def test_a_first_message_that_is_not_initialize_starts_nothing_early() -> None:
    answers, stderr, code = serve(waiting_pipe(ECHO + INIT), *chain_args(0))
    assert code == 0, stderr
    assert STARTED_EARLY not in stderr
    first, second = answers
    assert first["id"] == 1 and first["error"]["code"] == -32600  # type: ignore[index]
    assert second["id"] == 0 and "result" in second  # started the usual way


def test_a_command_that_cannot_start_is_left_to_the_router_to_report() -> None:
    answers, stderr, code = serve(waiting_pipe(INIT), "agent", "no-such-command-here")
    assert STARTED_EARLY not in stderr
    assert code != 0
    [answer] = answers
    assert "no-such-command-here" in answer["error"]["message"]  # type: ignore[index]


def test_processes_started_early_that_the_chain_never_serves_are_stopped() -> None:
    early = start_early_on(INIT)
    assert early.unread == INIT
    [(launch, started)] = early.started
    assert started.popen.poll() is None
    early.discard()
    assert started.popen.poll() is not None
    assert early.take(launch) is None  # discarded: nothing left to serve


def test_nothing_starts_early_when_no_initialize_is_waiting() -> None:
    config = chain_from_commands([agent_cmd()], with_agent=True)
    read, write = os.pipe()
    try:
        early = start_early(config, "agent", fd=read)
    finally:
        os.close(read)
        os.close(write)
    assert early.unread == b"" and not early.started
    assert early.plan is not None
    [(_, _, launch)] = early.plan
    assert launch.argv[-1].endswith("scripted_agent.py")


FIRST_MESSAGES = [
    INIT,
    frame({"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": {}}),
    frame({"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": {"protocolVersion": 0}}),
    frame({"jsonrpc": "2.0", "id": 0, "method": "initialize",
           "params": {"protocolVersion": 65536}}),
    frame({"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": {"protocolVersion": 2}}),
    frame({"jsonrpc": "2.0", "method": "initialize", "params": {"protocolVersion": 1}}),
    frame({"jsonrpc": "2.0", "id": 0, "method": "_proxy/initialize",
           "params": {"protocolVersion": 1}}),
    frame({"jsonrpc": "2.0", "id": 0, "method": "proxy/initialize",
           "params": {"protocolVersion": 1}}),
    frame({"jsonrpc": "2.0", "id": 0, "method": "session/new", "params": {}}),
]


def _cases() -> Iterator[tuple[bytes, bool]]:
    for data in FIRST_MESSAGES:
        for proxy_mode in (False, True):
            yield data, proxy_mode


@pytest.mark.parametrize(("data", "proxy_mode"), list(_cases()))
async def test_the_early_check_and_the_router_agree_on_what_starts_a_chain(
        data: bytes, proxy_mode: bool) -> None:
    msg = decode(data.rstrip())
    assert isinstance(msg, Request | Notification)
    early = acp.starts_chain(msg.method, msg.params, is_request=isinstance(msg, Request),
                             proxy_mode=proxy_mode)

    async def reply(answer: Response) -> None:
        pass

    routed = await Handshake(proxy_mode=proxy_mode).accept_first(msg, reply)
    assert early == routed


async def test_bytes_read_before_the_stream_existed_come_first() -> None:
    read, write = os.pipe()
    os.write(write, b"later\n")
    os.close(write)
    stream = FdReceiveStream(read, owns_fd=True, unread=b"first\n")
    got = b""
    with anyio.fail_after(5):
        try:
            while True:
                got += await stream.receive(4)
        except anyio.EndOfStream:
            pass
    await stream.aclose()
    assert got == b"first\nlater\n"


def nested_initialize(depth: int) -> bytes:
    return (b'{"jsonrpc":"2.0","id":0,"method":"initialize","params":{"protocolVersion":1,'
            b'"x":' + b"[" * depth + b"]" * depth + b"}}\n")


def decodes(data: bytes, *, deeper_by: int) -> bool:
    """Does `decode` take `data` with `deeper_by` more Python frames on the stack?"""
    if deeper_by:
        return decodes(data, deeper_by=deeper_by - 1)
    try:
        decode(data.rstrip())
    except ParseError:
        return False
    return True


def test_a_first_frame_nested_near_the_decoders_limit_starts_nothing_early() -> None:
    # msgspec's nesting limit is what is left of Python's recursion limit, so whether a deep
    # frame decodes depends on the stack it is decoded on; the router's reader runs on a
    # deeper one than the early check (measured: frames 968-978 deep were started early, then
    # refused by the router). The deepest frame the early check itself can decode:
    low, high = 1, 5000
    while low < high:
        mid = (low + high + 1) // 2
        low, high = (mid, high) if decodes(nested_initialize(mid), deeper_by=10) \
            else (low, mid - 1)
    data = nested_initialize(low)
    assert not decodes(data, deeper_by=60)  # what a reader deeper down makes of it
    early = start_early_on(data)
    try:
        assert early.unread == data
        assert not early.started
    finally:
        early.discard()


def test_an_unexpected_error_while_starting_early_stops_what_had_started(
        monkeypatch: pytest.MonkeyPatch) -> None:
    from conductor import early_start
    from conductor.supervise.spawn import start_process

    first: list[Started] = []

    def start_one_then_fail(launch: LaunchSpec) -> Started:
        if first:
            raise RuntimeError("boom")
        first.append(start_process(launch))
        return first[0]

    monkeypatch.setattr(early_start, "start_process", start_one_then_fail)
    config = chain_from_commands([proxy_cmd(), agent_cmd()], with_agent=True)
    fd = waiting_pipe(INIT)
    try:
        with pytest.raises(RuntimeError):
            start_early(config, "agent", fd=fd)
    finally:
        os.close(fd)
    [started] = first
    alive = started.popen.poll() is None
    if alive:
        started.discard(1.0)  # (the test's own clean-up)
    assert not alive


def test_a_command_with_a_nul_in_its_environment_is_refused_before_anything_starts(
        tmp_path: Path) -> None:
    # Once an internal error with no answer, then a start error; now the chain file's own
    # error, naming the key, as every value no process can be given.
    chain = tmp_path / "chain.toml"
    agent = json.dumps(shlex.split(agent_cmd()))
    chain.write_text(f'[agent]\ncommand = {agent}\nenv = {{ FOO = "a\\u0000b" }}\n')
    answers, stderr, code = serve(waiting_pipe(INIT), "--chain", chain)
    assert "internal error" not in stderr
    assert code == 2
    assert answers == []
    assert "chain.toml: agent.env: FOO's value has a NUL character" in stderr


def test_a_conductor_started_with_stdin_closed_sees_the_end_of_its_input() -> None:
    # stdout is claimed first now: its private duplicate must not take the free number 0
    # and be read as the client's input.
    argv = ["sh", "-c", 'exec "$@" <&-', "sh",
            *conductor_argv("--log-level", "debug", *chain_args(0))]
    done = subprocess.run(argv, capture_output=True, env=child_env(), timeout=60,
                          check=False)
    stderr = done.stderr.decode()
    assert "internal error" not in stderr
    assert done.returncode == 0, stderr
    assert done.stdout == b""
    assert "client closed its input" in stderr


LOOP_PLUGIN = """
import asyncio

from conductor.plugins import Proxy


class NeedsLoop(Proxy):
    def __init__(self, options):
        super().__init__(options)
        asyncio.get_running_loop()  # raises outside a running event loop
"""


def plugin_chain(tmp_path: Path, file: str, source: str, plugin: str) -> str:
    """A chain file of the plugin `source` (written to `file`) before the scripted agent."""
    (tmp_path / file).write_text(source, encoding="utf-8")
    chain = tmp_path / "chain.toml"
    chain.write_text(f'[[proxy]]\nplugin = "{plugin}"\n\n'
                     f'[agent]\ncommand = {json.dumps(agent_cmd())}\n', encoding="utf-8")
    return str(chain)


def test_a_plugin_chain_starts_its_agent_early_and_loads_the_plugin_in_the_event_loop(
        tmp_path: Path) -> None:
    chain = plugin_chain(tmp_path, "needs_loop.py", LOOP_PLUGIN, "needs_loop.py:NeedsLoop")
    answers, stderr, code = serve(waiting_pipe(INIT + ECHO), "--chain", chain)
    assert code == 0, stderr
    assert STARTED_EARLY in stderr  # the agent; the plugin's constructor had its loop
    assert "started early, but" not in stderr  # the early agent is the one served
    assert [a["id"] for a in answers] == [0, 1]


ENV_PLUGIN = """
import os

from conductor.plugins import Proxy

os.environ["SET_BY_PLUGIN"] = "yes"  # as it loads: the agent's environment changes


class SetsEnv(Proxy):
    pass
"""


def test_an_agent_started_early_is_replaced_when_a_plugin_changes_the_environment(
        tmp_path: Path) -> None:
    chain = plugin_chain(tmp_path, "sets_env.py", ENV_PLUGIN, "sets_env.py:SetsEnv")
    ask = frame({"jsonrpc": "2.0", "id": 1, "method": "_test/env",
                 "params": {"names": ["SET_BY_PLUGIN"]}})
    answers, stderr, code = serve(waiting_pipe(INIT + ask), "--chain", chain)
    assert code == 0, stderr
    assert STARTED_EARLY in stderr
    assert "stopping agent: started early, but a plugin changed its launch" in stderr
    by_id = {a["id"]: a for a in answers}
    # Served by an agent started as before: after the plugin loaded, in its environment.
    assert by_id[1]["result"]["env"] == {"SET_BY_PLUGIN": "yes"}  # type: ignore[index]


def test_a_plugin_that_fails_to_load_leaves_no_early_agent_behind(tmp_path: Path) -> None:
    chain = plugin_chain(tmp_path, "broken.py", "raise RuntimeError('no luck')\n", "broken.py")
    answers, stderr, code = serve(waiting_pipe(INIT), "--chain", chain)
    assert code == 2 and answers == [], stderr
    assert "broken.py" in stderr and "no luck" in stderr
    assert STARTED_EARLY in stderr
    assert "stopping agent: started early, but the chain stopped before serving it" in stderr


def test_a_plugin_chain_with_an_unset_variable_reports_it_with_the_plugins_problems(
        tmp_path: Path) -> None:
    chain = tmp_path / "chain.toml"
    chain.write_text('[[proxy]]\nuse = "passthrough"\noptions = { loud = true }\n\n'
                     '[agent]\ncommand = ["${NOT_SET_ANYWHERE}"]\n', encoding="utf-8")
    answers, stderr, code = serve(waiting_pipe(INIT), "--chain", str(chain))
    assert code == 2 and answers == [], stderr
    assert "NOT_SET_ANYWHERE" in stderr and "unknown option 'loud'" in stderr  # one report


def test_an_agent_started_early_that_a_plugin_made_stale_is_stopped_before_its_replacement_starts(
        tmp_path: Path) -> None:
    # Two agents at once, for a whole session, is what an agent holding a lock, a port or
    # a session store cannot survive: the stale one goes before the fresh one starts.
    chain = plugin_chain(tmp_path, "sets_env.py", ENV_PLUGIN, "sets_env.py:SetsEnv")
    answers, stderr, code = serve(waiting_pipe(INIT + ECHO), "--chain", chain)
    assert code == 0, stderr
    assert STARTED_EARLY in stderr
    stale = "stopping agent: started early, but a plugin changed its launch as it loaded"
    assert stale in stderr
    assert stderr.index(stale) < stderr.index("started agent (pid")
    assert "the chain stopped before serving it" not in stderr
    assert [a["id"] for a in answers] == [0, 1]


SPY_ON_THE_SPAWN = """
import sys
import conductor.early_start as early

OUT = sys.argv[2]

def spy(spec):  # (stdout is the wire, claimed by now: the answer goes to a file)
    with open(OUT, "w") as out:
        out.write(repr(sorted(m for m in sys.modules if m in WATCHED)))
    raise SystemExit(0)

WATCHED = {"anyio", "asyncio", "conductor.tracing.sink", "conductor.routing.chain",
           "importlib.metadata", "pydantic"}
early.start_process = spy
sys.argv = ["acp-conductor", "--chain", sys.argv[1]]
from conductor.cli.entry import main
main()
"""


@pytest.mark.parametrize("chain", ["commands", "plugin"])
def test_nothing_the_event_loop_or_the_router_needs_is_imported_before_the_early_spawn(
        chain: str, tmp_path: Path) -> None:
    # What is imported before it delays every component's start (docs/performance.md).
    path = tmp_path / "chain.toml"
    plugin = '[[proxy]]\nname = "p"\nuse = "passthrough"\n\n' if chain == "plugin" else ""
    path.write_text(f'{plugin}[agent]\ncommand = "{agent_cmd()}"\n', encoding="utf-8")
    seen = tmp_path / "imported"
    stdin = waiting_pipe(INIT)
    try:
        done = subprocess.run([sys.executable, "-c", SPY_ON_THE_SPAWN, str(path), str(seen)],
                              stdin=stdin, env=child_env(), capture_output=True, timeout=30,
                              check=False)
    finally:
        os.close(stdin)
    assert seen.exists(), done.stderr.decode()
    assert seen.read_text() == "[]"
