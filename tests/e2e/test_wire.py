"""Frames: big ones pass, oversized ones are refused without ending the connection, noise
on a component's stdout is logged and dropped, and the conductor's stdout stays pure."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING

import pytest

from tests.wire_client import agent_cmd, chain_args, open_conductor, open_served, proxy_cmd

if TYPE_CHECKING:
    from pathlib import Path

MiB = 1024 * 1024


@pytest.mark.parametrize("proxies", [0, 1])
async def test_a_20_mib_frame_crosses_the_chain_each_way(proxies: int) -> None:
    data = "x" * (20 * MiB)
    async with open_conductor(*chain_args(proxies)) as c:
        c.timeout = 30
        await c.initialize()
        await c.send_raw(b'{"jsonrpc":"2.0","id":1,"method":"_test/echo","params":{"d":"'
                         + data.encode() + b'"}}\n')
        line = await c.read_raw()
        assert line == b'{"jsonrpc":"2.0","id":1,"result":{"d":"' + data.encode() + b'"}}'
        await c.send({"jsonrpc": "2.0", "id": 2, "method": "_test/big",
                      "params": {"size": 20 * MiB}})
        big = await c.response(2)
        assert len(big["result"]["data"]) == 20 * MiB


async def test_an_oversized_editor_frame_is_refused_and_other_traffic_continues() -> None:
    async with open_served("--max-frame-bytes", "65536", *chain_args(1)) as c:
        await c.initialize()
        await c.send_raw(b'{"jsonrpc":"2.0","id":3,"method":"_test/echo","params":{"d":"'
                         + b"y" * 100_000 + b'"}}\n')
        refused = await c.response(3)
        assert refused["error"]["code"] == -33003  # FRAME_TOO_LARGE
        assert "65536" in refused["error"]["message"]
        assert "--max-frame-bytes" in json.dumps(refused["error"])
        assert (await c.request("_test/echo", {"ok": 1}))["result"] == {"ok": 1}
    assert "over the 65536-byte limit" in c.stderr_text


async def test_an_oversized_agent_answer_becomes_an_error_naming_the_agent() -> None:
    async with open_served("--max-frame-bytes", "65536", *chain_args(0)) as c:
        await c.initialize()
        answer = await c.request("_test/big", {"size": 100_000})
        assert answer["error"]["data"]["component"] == "agent"
        assert "65536" in answer["error"]["message"]
        # The agent's connection is still in use.
        assert (await c.request("_test/echo", {"ok": 1}))["result"] == {"ok": 1}


async def test_an_oversized_agent_notification_is_dropped_and_later_ones_arrive() -> None:
    async with open_served("--max-frame-bytes", "65536", *chain_args(1)) as c:
        await c.initialize()
        await c.request("_test/notify", {"sessionId": "s", "count": 1, "pad": 100_000})
        await c.request("_test/notify", {"sessionId": "s", "count": 1})
        assert [m["params"]["update"]["content"]["text"] for m in c.inbox] == ["note 0"]
    assert "agent sent a message of" in c.stderr_text


async def test_an_oversized_answer_fails_only_the_request_its_top_level_id_names() -> None:
    async with open_served("--max-frame-bytes", "65536", *chain_args(0)) as c:
        await c.initialize()  # agent-hop id 1
        # `_test/raw` is agent-hop id 2. It makes the agent write an oversized answer whose
        # *result* mentions id 2 but which answers id 999, then answer id 2 itself with {}.
        line = '{"jsonrpc":"2.0","result":{"id":2,"pad":"PAD"},"id":999}'
        answer = await c.request("_test/raw", {"lines": [line], "pad": 100_000})
        assert answer.get("result") == {}, answer  # not failed by the frame meant for 999
    assert "agent sent a message of" in c.stderr_text


async def test_an_oversized_notification_from_the_editor_is_never_answered() -> None:
    async with open_served("--max-frame-bytes", "65536", *chain_args(0)) as c:
        await c.initialize()
        await c.send_raw(b'{"jsonrpc":"2.0","method":"_test/note","params":{"id":5,"big":"'
                         + b"z" * 100_000 + b'"}}\n')
        assert (await c.request("_test/echo", {"ok": 1}))["result"] == {"ok": 1}
        assert not [m for m in c.inbox if "id" in m]  # nothing answered the notification
    assert "client sent a message of" in c.stderr_text


async def test_an_oversized_batch_from_the_editor_is_refused_as_a_whole() -> None:
    async with open_served("--max-frame-bytes", "65536", *chain_args(0)) as c:
        await c.initialize()
        await c.send_raw(b'[{"jsonrpc":"2.0","id":1,"method":"_test/echo","params":{"d":"'
                         + b"b" * 100_000 + b'"}}]\n')
        refused = await c.read_until(lambda m: "error" in m)
        assert refused["id"] is None
        assert refused["error"]["code"] == -33003  # FRAME_TOO_LARGE
        assert (await c.request("_test/echo", {"ok": 1}))["result"] == {"ok": 1}


async def test_an_oversized_answer_from_the_editor_fails_the_agents_question() -> None:
    async with open_served("--max-frame-bytes", "65536", *chain_args(1)) as c:
        await c.initialize()
        await c.send({"jsonrpc": "2.0", "id": "ask", "method": "_test/ask",
                      "params": {"method": "fs/read_text_file",
                                 "params": {"sessionId": "s", "path": "/big"}}})
        question = await c.read_until(lambda m: m.get("method") == "fs/read_text_file")
        await c.send_raw(b'{"jsonrpc":"2.0","id":' + json.dumps(question["id"]).encode()
                         + b',"result":{"content":"' + b"c" * 100_000 + b'"}}\n')
        asked = await c.response("ask")
        # The agent was told, instead of waiting forever for an answer that was dropped.
        error = asked["result"]["error"]
        assert error["data"]["component"] == "client"
        assert "65536" in error["message"]


@pytest.mark.parametrize("proxies", [0, 1])
async def test_noise_on_a_components_stdout_is_logged_with_its_name_and_dropped(
        tmp_path: Path, proxies: int) -> None:
    record = tmp_path / "agent.jsonl"
    flags = ("--banner",)
    async with open_served("--log-level", "debug",
                           "agent", *[proxy_cmd(*flags) for _ in range(proxies)],
                           agent_cmd("--banner", "--record", str(record))) as c:
        await c.initialize()
        await c.request("_test/raw", {"lines": ["\x1b[31mred alert\x1b[0m", "progress: 50%"]})
        assert not c.inbox  # nothing of it reached the editor
        assert (await c.request("_test/echo", {"ok": 1}))["result"] == {"ok": 1}
    err = c.stderr_text
    assert "agent wrote a non-JSON line on stdout (dropped): Welcome to scripted-agent" in err
    assert "agent wrote a non-JSON line on stdout (dropped): progress: 50%" in err
    if proxies:
        assert "proxy:0 wrote a non-JSON line on stdout (dropped): relay-proxy starting" in err
    # Never answered either: the agent got only requests, no error replies.
    received = [json.loads(x) for x in record.read_text(encoding="utf-8").splitlines()]
    assert all("method" in m for m in received)


async def test_component_stderr_reaches_the_conductors_stderr_prefixed_with_its_name(
        tmp_path: Path) -> None:
    chain = tmp_path / "chain.toml"
    chain.write_text(f"""
[[proxy]]
name = "relay"
command = {json.dumps(proxy_cmd("--crash-on", "never"))}

[agent]
name = "my-agent"
command = {json.dumps(agent_cmd("--stderr", "agent says hi"))}
""", encoding="utf-8")
    async with open_conductor("--chain", str(chain)) as c:
        await c.initialize()
        await c.request("_test/stderr", {"lines": ["first line", "second line"]})
        await c.wait_stderr("my-agent| second line")
    assert "my-agent| agent says hi" in c.stderr_text
    assert "my-agent| first line" in c.stderr_text


async def test_log_file_takes_logs_and_component_stderr_off_stderr(tmp_path: Path) -> None:
    log = tmp_path / "conductor.log"
    async with open_conductor("--log-file", str(log), "--log-level", "info",
                              *chain_args(0, "--stderr", "to the log")) as c:
        await c.initialize()
    text = log.read_text(encoding="utf-8")
    assert "agent| to the log" in text
    assert "to the log" not in c.stderr_text
