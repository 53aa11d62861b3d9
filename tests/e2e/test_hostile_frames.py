"""Frames the conductor will not decode (nested too deeply, not UTF-8) or buffer (oversized,
id last): each gets its answer by id, none crosses, everything else carries on, and the
conductor's stdout stays valid UTF-8 JSON-RPC (open_conductor checks it on exit)."""

from __future__ import annotations

import json
import sys
from typing import TYPE_CHECKING

from tests.wire_client import agent_cmd, chain_args, open_conductor

if TYPE_CHECKING:
    from pathlib import Path

    from tests.wire_client import ConductorProcess, Json

DEEP = "[" * 1000 + "]" * 1000  # valid JSON, 2 KB: the reproduction
MiB = 1024 * 1024


def received(record: Path) -> list[Json]:
    """What the scripted agent read, as raw lines (its --record file)."""
    return [json.loads(line) for line in record.read_bytes().splitlines()]


def assert_stdout_is_utf8(c: ConductorProcess) -> None:
    for line in c.lines:
        line.decode("utf-8")  # raises on any byte that is not UTF-8


# -- nested too deeply -------------------------------------------------------------------------

async def test_a_deeply_nested_request_before_initialize_is_refused_and_serving_continues(
        ) -> None:
    async with open_conductor(*chain_args(0), check_exit=True) as c:
        await c.send_raw(b'{"jsonrpc":"2.0","id":"deep","method":"initialize","params":'
                         b'{"protocolVersion":1,"x":' + DEEP.encode() + b"}}\n")
        refused = await c.response("deep")
        assert refused["error"]["code"] == -32600
        assert "nested too deeply" in refused["error"]["message"]
        await c.initialize()
        assert (await c.request("_test/echo", {"ok": 1}))["result"] == {"ok": 1}


async def test_deeply_nested_frames_from_the_editor_get_one_answer_each_by_id() -> None:
    async with open_conductor(*chain_args(1), check_exit=True) as c:
        await c.initialize()
        await c.send_raw(DEEP.encode() + b"\n")  # a batch, as a whole
        batch = await c.read()
        assert batch["id"] is None
        assert batch["error"]["code"] == -32600
        await c.send_raw(b'{"jsonrpc":"2.0","method":"_ext/n","params":[' + DEEP.encode()
                         + b"]}\n")  # a notification: never answered
        await c.send_raw(b'{"jsonrpc":"2.0","method":"_test/echo","params":[' + DEEP.encode()
                         + b'],"id":"late"}\n')  # the id after the params
        refused = await c.response("late")
        assert refused["error"]["code"] == -32600
        assert "client sent a message that is nested too deeply" in refused["error"]["message"]
        assert (await c.request("_test/echo", {"ok": 1}))["result"] == {"ok": 1}
        assert c.inbox == []  # nothing answered the notification


async def test_deeply_nested_frames_from_the_agent_are_answered_and_never_reach_the_editor(
        tmp_path: Path) -> None:
    record = tmp_path / "agent.jsonl"
    async with open_conductor("agent", agent_cmd("--record", str(record)),
                              check_exit=True) as c:
        await c.initialize()  # agent-hop id 1
        lines = [
            f'{{"jsonrpc":"2.0","method":"session/update","params":{{"x":{DEEP}}}}}',
            f'{{"jsonrpc":"2.0","id":"agent-deep","method":"fs/read_text_file",'
            f'"params":{{"x":{DEEP}}}}}',
            f'{{"jsonrpc":"2.0","id":2,"result":{DEEP}}}',  # answers this _test/raw (id 2)
        ]
        answer = await c.request("_test/raw", {"lines": lines})
        assert answer["error"]["data"]["component"] == "agent"
        assert "agent sent a message that is nested too deeply" in answer["error"]["message"]
        assert (await c.request("_test/echo", {"ok": 1}))["result"] == {"ok": 1}
        assert c.inbox == []  # the notification did not cross
    [refusal] = [m for m in received(record) if m.get("id") == "agent-deep"]
    assert refusal["error"]["code"] == -32600


# -- not UTF-8 ---------------------------------------------------------------------------------

async def test_a_frame_from_the_editor_that_is_not_utf8_is_refused_and_never_forwarded(
        tmp_path: Path) -> None:
    record = tmp_path / "agent.jsonl"
    async with open_conductor("agent", agent_cmd("--record", str(record)),
                              check_exit=True) as c:
        await c.initialize()
        await c.send_raw(b'{"jsonrpc":"2.0","id":8,"method":"_test/echo","params":{"t":"\xff"}}\n')
        refused = await c.response(8)
        assert refused["error"]["code"] == -32700
        assert "not valid UTF-8 (byte 0xff" in refused["error"]["message"]
        await c.send_raw(b'{"jsonrpc":"2.0","method":"_ext/n","params":{"t":"\xc3("}}\n')
        assert (await c.request("_test/echo", {"ok": 1}))["result"] == {"ok": 1}
        assert c.inbox == []
    assert b"\xff" not in record.read_bytes()
    assert b"\xc3(" not in record.read_bytes()


async def test_frames_from_the_agent_that_are_not_utf8_never_reach_the_conductors_stdout(
        tmp_path: Path) -> None:
    record = tmp_path / "agent.jsonl"
    async with open_conductor("agent", agent_cmd("--record", str(record)),
                              check_exit=True) as c:
        await c.initialize()  # agent-hop id 1
        lines = [  # "\u00ff" is written as the byte 0xFF ("latin1")
            '{"jsonrpc":"2.0","method":"session/update","params":{"sessionId":"s","t":"\u00ff"}}',
            '{"jsonrpc":"2.0","id":"agent-bad","method":"fs/read_text_file",'
            '"params":{"path":"\u00ff"}}',
            '{"jsonrpc":"2.0","id":2,"result":{"t":"\u00ff"}}',  # answers this _test/raw
        ]
        answer = await c.request("_test/raw", {"lines": lines, "latin1": True})
        assert answer["error"]["data"]["component"] == "agent"
        assert "not valid UTF-8" in answer["error"]["message"]
        assert (await c.request("_test/echo", {"ok": 1}))["result"] == {"ok": 1}
        assert c.inbox == []
    assert_stdout_is_utf8(c)
    [refusal] = [m for m in received(record) if m.get("id") == "agent-bad"]
    assert refusal["error"]["code"] == -32700


# -- oversized, the id last --------------------------------------------------------------------

async def test_an_oversized_request_whose_id_follows_its_params_is_refused_with_that_id() -> None:
    async with open_conductor("--max-frame-bytes", "65536", *chain_args(0),
                              check_exit=True) as c:
        await c.initialize()
        await c.send_raw(b'{"jsonrpc":"2.0","method":"_test/echo","params":{"d":"'
                         + b"y" * MiB + b'"},"id":42}\n')
        # Frames are handled in order: the refusal is written before this answer.
        assert (await c.request("_test/echo", {"ok": 1}))["result"] == {"ok": 1}
        [refused] = [m for m in c.inbox if m.get("id") == 42]
        assert refused["error"]["code"] == -33003  # FRAME_TOO_LARGE
        assert "65536" in refused["error"]["message"]


async def test_a_100_mib_request_with_its_id_last_is_refused_with_that_id() -> None:
    async with open_conductor(*chain_args(0), check_exit=True) as c:  # the default 64 MiB limit
        c.timeout = 60
        await c.initialize()
        await c.send_raw(b'{"jsonrpc":"2.0","method":"session/prompt","params":{"text":"')
        chunk = b"z" * MiB
        for _ in range(100):
            await c.send_raw(chunk)
        await c.send_raw(b'"},"id":"huge"}\n')
        refused = await c.response("huge")
        assert refused["error"]["code"] == -33003  # FRAME_TOO_LARGE
        assert "over the 67108864-byte limit" in refused["error"]["message"]
        assert (await c.request("_test/echo", {"ok": 1}))["result"] == {"ok": 1}


# -- not JSON, but an answer -------------------------------------------------------------------

BROKEN_ANSWER_AGENT = r'''
import json, sys
for line in sys.stdin:
    msg = json.loads(line)
    ident = json.dumps(msg.get("id"))
    if msg.get("method") == "initialize":
        out = '{"jsonrpc":"2.0","id":%s,"result":{"protocolVersion":1}}' % ident
    elif msg.get("method") == "session/new":  # a trailing comma: not JSON to a decoder
        out = '{"jsonrpc":"2.0","id":%s,"result":{"sessionId":"s1",}}' % ident
    else:
        continue
    sys.stdout.write(out + "\n")
    sys.stdout.flush()
'''


async def test_an_answer_that_is_not_valid_json_fails_its_request_instead_of_leaving_it_waiting(
        tmp_path: Path) -> None:
    agent = tmp_path / "agent.py"
    agent.write_text(BROKEN_ANSWER_AGENT, encoding="utf-8")
    async with open_conductor("agent", f"{sys.executable} {agent}", check_exit=True) as c:
        await c.initialize()
        answer = await c.request("session/new", {"cwd": str(tmp_path), "mcpServers": []})
    assert answer["error"]["code"] == -32700
    assert answer["error"]["data"] == {"component": "agent"}
    assert "agent sent a message that is not valid JSON" in answer["error"]["message"]
