"""Global options are accepted after the subcommand too, and bad usage is a usage error.

Issue 10: `run --trace` and `proxy --chain` were refused (`No such option`), and bad JSON in
`serve-proxy --options` was reported as an internal error with exit 1.
"""

from __future__ import annotations

import json
import os
import pty
import re
import selectors
import subprocess
from typing import TYPE_CHECKING

import click
import pytest

from conductor.cli.app import main
from tests.conftest import child_env, conductor_argv
from tests.in_process import conductor
from tests.wire_client import open_conductor, proxy_cmd

if TYPE_CHECKING:
    from pathlib import Path

GLOBAL = {"--chain", "--log-level", "--log-file", "--max-frame-bytes", "--trace",
          "--trace-unredacted"}


def run(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    """In this process (tests/in_process.py): terminals and pipes are tested on real
    processes (below)."""
    return conductor(*args, cwd=cwd)


def options_of(command: click.Command) -> set[str]:
    return {name for p in command.params if isinstance(p, click.Option) for name in p.opts}


def test_every_subcommand_that_runs_a_chain_takes_every_global_option() -> None:
    ctx = click.Context(main)
    runs_a_chain = {name: command for name in main.list_commands(ctx)
                    if (command := main.get_command(ctx, name)) is not None
                    and "--chain" in options_of(command)}
    assert {"agent", "proxy", "run", "check", "call", "serve", "doctor"} <= set(runs_a_chain)
    for name, command in runs_a_chain.items():
        assert GLOBAL <= options_of(command), (name, GLOBAL - options_of(command))


def test_the_help_names_exactly_the_subcommands_that_take_global_options_after_them() -> None:
    # It said "Global options may also follow the subcommand", and `proxies --log-level
    # debug` (or chains, init, trace) was then refused with "No such option".
    ctx = click.Context(main)
    taking = {name for name in main.list_commands(ctx)
              if (command := main.get_command(ctx, name)) is not None
              and GLOBAL <= options_of(command)}
    said = re.search(r"Global options may also follow (.*?)\.", " ".join(main.help.split()))
    assert said is not None
    assert set(re.findall(r"[a-z][a-z-]+", said.group(1))) - {"and"} == taking


def test_trace_given_after_run_writes_the_trace(tmp_path: Path) -> None:
    trace = tmp_path / "t.jsonl"
    done = run("run", "--chain", "demo", "--trace", str(trace), "hello", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    methods = {json.loads(line).get("method") for line in trace.read_text().splitlines()}
    assert "session/prompt" in methods


async def test_chain_given_after_proxy_serves_that_chain(tmp_path: Path) -> None:
    chain = tmp_path / "proxies.toml"
    chain.write_text(f'[[proxy]]\nname = "relay"\ncommand = {json.dumps(proxy_cmd())}\n',
                     encoding="utf-8")
    # The test plays the outer conductor, speaking to `acp-conductor proxy --chain` directly.
    async with open_conductor("proxy", "--chain", str(chain)) as c:
        await c.send({"jsonrpc": "2.0", "id": 0, "method": "_proxy/initialize",
                      "params": {"protocolVersion": 1}})
        wrapped = await c.read_until(lambda m: m.get("method") == "_proxy/successor")
        assert wrapped["params"]["method"] == "initialize"
        await c.send({"jsonrpc": "2.0", "id": wrapped["id"], "result": {"protocolVersion": 1}})
        assert (await c.response(0))["result"] == {"protocolVersion": 1}


def test_options_that_are_not_json_are_a_usage_error_for_serve_proxy() -> None:
    done = run("serve-proxy", "redact", "--options", "{bad")
    assert done.returncode == 2, done.stderr
    assert "Invalid value for --options: not JSON" in done.stderr
    assert "internal error" not in done.stderr and done.stdout == ""


def test_a_chain_started_from_a_terminal_says_on_stderr_that_it_waits_for_an_editor() -> None:
    # `acp-conductor --chain demo` typed into a shell sat silent, waiting for JSON-RPC: a
    # newcomer took it for a hang. An editor never gives it a terminal, so it never sees this.
    controller, terminal = pty.openpty()
    proc = subprocess.Popen(conductor_argv("--chain", "demo"), env=child_env(), stdin=terminal,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    os.close(terminal)
    try:
        assert proc.stderr is not None
        with selectors.DefaultSelector() as sel:
            sel.register(proc.stderr, selectors.EVENT_READ)
            assert sel.select(timeout=30), "nothing on stderr"
        line = proc.stderr.readline().decode()
        assert "waiting for an ACP client" in line
        assert 'acp-conductor run --chain demo "hello"' in line
    finally:
        os.close(controller)  # the terminal hangs up: stdin ends
        out, _ = proc.communicate(timeout=30)
    assert out == b""  # the wire stays clean


def test_a_chain_started_by_an_editor_says_nothing_about_terminals() -> None:
    done = subprocess.run(conductor_argv("--chain", "demo"), env=child_env(),
                          stdin=subprocess.DEVNULL, capture_output=True, timeout=60,
                          check=False)
    assert (done.returncode, done.stdout, done.stderr) == (0, b"", b"")


@pytest.mark.parametrize(("args", "code"), [
    (("chains",), 141), (("proxies",), 141), (("doctor",), 141),
    (("check", "--chain", "demo"), 0)])
def test_a_reader_that_goes_away_ends_the_command_quietly(args: tuple[str, ...],
                                                         code: int) -> None:
    # `acp-conductor proxies | head -c1`, `check ... | grep -q ok`: writing to the closed
    # pipe was reported as "internal error: BrokenPipeError", exit 1. A listing now ends as
    # a Unix tool cut off by SIGPIPE does (141, silent); check keeps its verdict, as run does.
    read_end, write_end = os.pipe()
    os.close(read_end)  # the reader is gone before the command writes anything
    try:
        done = subprocess.run(conductor_argv(*args), env=child_env(), stdin=subprocess.DEVNULL,
                              stdout=write_end, stderr=subprocess.PIPE, text=True, timeout=60,
                              check=False)
    finally:
        os.close(write_end)
    assert (done.returncode, done.stderr) == (code, "")
