"""A stderr pipe nobody reads never stops the conductor (conductor/cli/stderr_pipe.py)."""

from __future__ import annotations

import json
import os
import select
import shlex
import socket
import subprocess
import sys
import time
from typing import TYPE_CHECKING

import pytest

from conductor.cli.stderr_pipe import PipeStderr
from tests.conftest import child_env, conductor_argv

if TYPE_CHECKING:
    from pathlib import Path


def _read_all(fd: int, out: PipeStderr) -> bytes:
    got = b""
    while True:
        out.flush()  # what waited in the queue goes as the reader makes room
        if not select.select([fd], [], [], 0.05)[0]:
            return got
        got += os.read(fd, 1 << 16)


def test_lines_a_full_pipe_cannot_take_wait_in_order_and_what_overflows_is_counted() -> None:
    read, write = os.pipe()
    os.set_blocking(write, False)
    out = PipeStderr(write, max_queued=64 * 1024)
    lines = [f"line {i:05d} {'x' * 80}\n" for i in range(5000)]  # ≈ 450 KB: pipe + queue + more
    for line in lines:
        assert out.write(line) == len(line)  # never blocks: nobody reads yet
    text = _read_all(read, out).decode()
    os.close(read)
    os.close(write)
    got = text.splitlines(keepends=True)
    note = got.pop()
    assert got == lines[:len(got)]  # in order, nothing cut; the rest dropped whole
    dropped = len(lines) - len(got)
    assert dropped > 0
    assert note.startswith(f"acp-conductor WARNING: {dropped} line(s) of logs and component "
                           "stderr were dropped: nothing was reading stderr")


AGENT_THAT_TALKS = r"""
import json, sys
for line in sys.stdin:
    msg = json.loads(line)
    if msg.get("method") == "initialize":
        for i in range(20000):  # ≈ 2 MB of stderr: far more than a pipe holds
            sys.stderr.write(f"debug {i} " + "y" * 90 + "\n")
        sys.stderr.flush()
        print(json.dumps({"jsonrpc": "2.0", "id": msg["id"],
                          "result": {"protocolVersion": 1}}), flush=True)
"""


@pytest.mark.parametrize("kind", ["pipe", "socket"])
def test_a_conductor_whose_stderr_nobody_reads_still_answers_through_a_chatty_agent(
        tmp_path: Path, kind: str) -> None:
    # "socket": what an editor on Node (libuv) gives its child for a piped stderr.
    script = tmp_path / "agent.py"
    script.write_text(AGENT_THAT_TALKS, encoding="utf-8")
    agent = shlex.join([sys.executable, str(script)])
    if kind == "pipe":
        _answers_initialize(agent, subprocess.PIPE)
        return
    unread, stderr = socket.socketpair()
    with unread, stderr:
        _answers_initialize(agent, stderr.fileno())


def _answers_initialize(agent: str, stderr: int) -> None:
    with subprocess.Popen(conductor_argv("agent", agent), stdin=subprocess.PIPE,
                          stdout=subprocess.PIPE, stderr=stderr,
                          env=child_env()) as conductor:
        assert conductor.stdin is not None and conductor.stdout is not None
        try:
            conductor.stdin.write(b'{"jsonrpc":"2.0","id":0,"method":"initialize",'
                                  b'"params":{"protocolVersion":1}}\n')
            conductor.stdin.flush()
            deadline = time.monotonic() + 20
            ready: list[object] = []
            while not ready and time.monotonic() < deadline:
                ready = select.select([conductor.stdout], [], [], 0.2)[0]
            assert ready, "the conductor stopped answering: blocked on its unread stderr"
            answer = json.loads(conductor.stdout.readline())
            assert answer["result"]["protocolVersion"] == 1
        finally:
            conductor.kill()
