"""The demo agent, driven over its real stdio as an editor would."""

from __future__ import annotations

import io
import json
import sys
from typing import TYPE_CHECKING

import anyio

from conductor.demo_agent import DemoAgent
from conductor.testing import TestClient, open_process_client
from tests.conftest import child_env, conductor_argv

if TYPE_CHECKING:
    from pathlib import Path

    from conductor.jsonrpc.message import JsonValue, Message
    from conductor.testing import TurnResult

DEMO = [sys.executable, "-m", "conductor.demo_agent"]


async def test_the_demo_agent_asks_for_absolute_paths_resolved_against_the_session_cwd(
        tmp_path: Path) -> None:
    asked: dict[str, object] = {}

    async def remember(message: Message) -> object:
        asked[str(message.method)] = message.params_value()
        return {"content": "text"} if message.method == "fs/read_text_file" else {}

    client = TestClient({"fs/read_text_file": remember, "fs/write_text_file": remember})
    async with open_process_client(DEMO, env=child_env(), client=client) as client:
        with anyio.fail_after(10):
            sid = await client.new_session(str(tmp_path))
            await client.prompt(sid, "read:notes.txt writefile:out/new.txt read:/abs/x")
    assert [p["path"] for p in client.received_params("fs/read_text_file")] == \
        [str(tmp_path / "notes.txt"), "/abs/x"]
    assert asked["fs/write_text_file"]["path"] == str(tmp_path / "out" / "new.txt")


async def test_the_demo_agent_runs_terminals_in_the_session_cwd(tmp_path: Path) -> None:
    client = TestClient({"terminal/create": {"terminalId": "t1"},
                         "terminal/wait_for_exit": {"exitCode": 0, "signal": None},
                         "terminal/output": {"output": "", "truncated": False},
                         "terminal/release": {}})
    async with open_process_client(DEMO, env=child_env(), client=client) as client:
        with anyio.fail_after(10):
            sid = await client.new_session(str(tmp_path))
            await client.prompt(sid, "terminal:ls")
    [created] = client.received_params("terminal/create")
    assert created["cwd"] == str(tmp_path)


def test_the_demo_agent_answers_lines_it_cannot_take_and_reads_on() -> None:
    # A batch, a bare value, a line that is not JSON (nor UTF-8), a method that is not a
    # string, params that are not an object: each crashed it with a traceback.
    lines = ["[1, 2]", '"str"', "not json", "\ufffd",
             '{"jsonrpc": "2.0", "id": 1, "method": 5}',
             '{"jsonrpc": "2.0", "id": 2, "method": "session/new", "params": [1]}',
             '{"jsonrpc": "2.0", "id": 3, "method": "session/new", "params": {"cwd": "/w"}}']
    out = io.StringIO()
    DemoAgent(out, io.StringIO("\n".join(lines) + "\n")).serve()
    answers = [json.loads(line) for line in out.getvalue().splitlines()]
    assert [(a["id"], a.get("error", {}).get("code")) for a in answers] == [
        (None, -32600), (None, -32600), (None, -32700), (None, -32700), (1, -32600),
        (2, -32602), (3, None)]
    assert answers[-1]["result"]["sessionId"].startswith("demo-session-")


async def v2_permission_turn(argv: list[str]) -> tuple[TurnResult, list[JsonValue]]:
    """A v2 editor's turn with `argv` (the demo agent, or a conductor in front of it) that
    asks for permission: the turn, and the permission requests the editor got."""
    async with open_process_client(argv, env=child_env(), initialize=False) as client:
        with anyio.fail_after(20):
            init = await client.initialize(2)
            assert init["protocolVersion"] == 2 and init["info"]["name"] == "demo-agent"
            sid = await client.new_session("/tmp")
            turn = await client.prompt(sid, "ask permission")
    return turn, client.received_params("session/request_permission")


async def test_the_demo_agent_speaks_v2_to_a_v2_editor() -> None:
    turn, [asked] = await v2_permission_turn(DEMO)
    assert turn == {}  # the answer accepts the prompt; the idle state ends the turn
    assert turn.stop_reason == "end_turn"
    assert "Hello from the demo agent" in turn.text
    assert "toolCall" not in asked and asked["title"] == "Write notes.txt"
    assert asked["subject"]["toolCall"]["toolCallId"] == "call-1"
    assert "tool_call" not in [u["sessionUpdate"] for u in turn.updates]  # v2 has none


async def test_a_v2_turn_crosses_the_demo_chain_end_to_end() -> None:
    turn, [asked] = await v2_permission_turn(conductor_argv("--chain", "demo"))
    assert turn == {} and turn.stop_reason == "end_turn"
    assert "Hello from the demo agent" in turn.text
    assert asked["subject"]["type"] == "tool_call"
