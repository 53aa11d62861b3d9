"""Requests both ways, cancellation per hop, notification order, batches, sessions."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING

import pytest

from tests.bin.rawjson import members
from tests.wire_client import Json, chain_args, open_served

if TYPE_CHECKING:
    from pathlib import Path

CHAINS = pytest.mark.parametrize("proxies", [0, 1, 2])


def is_method(name: str):
    return lambda m: isinstance(m, dict) and m.get("method") == name


@CHAINS
async def test_agent_requests_travel_up_every_proxy_and_the_answer_returns_to_the_asker(
        proxies: int) -> None:
    async with open_served(*chain_args(proxies)) as c:
        await c.initialize()
        for method in ("session/request_permission", "fs/read_text_file", "terminal/create",
                       "_vendor/anything"):
            await c.send({"jsonrpc": "2.0", "id": "q", "method": "_test/ask",
                          "params": {"method": method, "params": {"sessionId": "s", "k": [1]}}})
            asked = await c.read_until(is_method(method))
            assert asked["params"] == {"sessionId": "s", "k": [1]}
            assert asked["id"] != "agent-ask-1"  # the editor sees the conductor's id
            await c.send({"jsonrpc": "2.0", "id": asked["id"],
                          "result": {"outcome": {"outcome": "selected", "optionId": method}}})
            answer = await c.response("q")
            assert answer["result"] == {
                "result": {"outcome": {"outcome": "selected", "optionId": method}}}


@CHAINS
async def test_an_editor_error_answer_returns_to_the_asking_agent(proxies: int) -> None:
    async with open_served(*chain_args(proxies)) as c:
        await c.initialize()
        await c.send({"jsonrpc": "2.0", "id": 1, "method": "_test/ask",
                      "params": {"method": "fs/write_text_file", "params": {}}})
        asked = await c.read_until(is_method("fs/write_text_file"))
        await c.send({"jsonrpc": "2.0", "id": asked["id"],
                      "error": {"code": -32002, "message": "denied", "data": None}})
        answer = await c.response(1)
    assert answer["result"] == {"error": {"code": -32002, "message": "denied", "data": None}}


@CHAINS
async def test_an_editor_cancel_reaches_the_agent_once_with_the_agents_own_id(
        tmp_path: Path, proxies: int) -> None:
    record = tmp_path / "agent.jsonl"
    async with open_served(*chain_args(proxies, "--record", str(record))) as c:
        await c.initialize()
        await c.send({"jsonrpc": "2.0", "id": "h1", "method": "_test/hang", "params": {}})
        await c.send({"jsonrpc": "2.0", "method": "$/cancel_request",
                      "params": {"requestId": "h1"}})
        answer = await c.response("h1")
        assert answer["error"]["code"] == -32800
        # A cancel for a finished or unknown id is ignored, not forwarded.
        await c.send({"jsonrpc": "2.0", "method": "$/cancel_request",
                      "params": {"requestId": "h1"}})
        await c.send({"jsonrpc": "2.0", "method": "$/cancel_request",
                      "params": {"requestId": "never"}})
        assert "result" in await c.request("_test/echo", {})
    lines = [json.loads(x) for x in record.read_text(encoding="utf-8").splitlines()]
    [hang] = [m for m in lines if m.get("method") == "_test/hang"]
    cancels = [m for m in lines if m.get("method") == "$/cancel_request"]
    assert [m["params"] for m in cancels] == [{"requestId": hang["id"]}]


@CHAINS
async def test_an_agent_cancel_reaches_the_editor_once_with_the_editors_id(
        proxies: int) -> None:
    async with open_served(*chain_args(proxies)) as c:
        await c.initialize()
        await c.send({"jsonrpc": "2.0", "id": 7, "method": "_test/ask_cancel",
                      "params": {"method": "session/request_permission", "params": {}}})
        asked = await c.read_until(is_method("session/request_permission"))
        cancel = await c.read_until(is_method("$/cancel_request"))
        assert cancel["params"] == {"requestId": asked["id"]}
        await c.send({"jsonrpc": "2.0", "id": asked["id"],
                      "error": {"code": -32800, "message": "Request cancelled"}})
        answer = await c.response(7)
        assert answer["result"]["error"]["code"] == -32800
        assert "result" in await c.request("_test/echo", {})
        leftover = list(c.inbox)
    assert not [m for m in leftover if m.get("method") == "$/cancel_request"]


@CHAINS
async def test_session_updates_sent_before_the_session_new_answer_reach_the_editor_in_order(
        proxies: int) -> None:
    async with open_served(*chain_args(proxies, "--early-updates", "3")) as c:
        await c.initialize()
        await c.send({"jsonrpc": "2.0", "id": "n", "method": "session/new",
                      "params": {"cwd": "/", "mcpServers": []}})
        seen: list[Json] = []
        while True:
            msg = await c.read()
            seen.append(msg)
            if msg.get("id") == "n":
                break
    texts = [m["params"]["update"]["content"]["text"] for m in seen[:-1]]
    assert texts == ["early 0", "early 1", "early 2"]
    assert seen[-1]["result"] == {"sessionId": "sess-1"}
    assert all(m["params"]["sessionId"] == "sess-1" for m in seen[:-1])


@CHAINS
async def test_notifications_keep_their_order_across_every_hop(proxies: int) -> None:
    async with open_served(*chain_args(proxies)) as c:
        await c.initialize()
        sid = await c.new_session()
        await c.send({"jsonrpc": "2.0", "id": "n", "method": "_test/notify",
                      "params": {"sessionId": sid, "count": 300}})
        await c.response("n")
        notes = [m["params"]["update"]["content"]["text"] for m in c.inbox]
    assert notes == [f"note {i}" for i in range(300)]


async def test_a_prompt_streams_updates_then_ends_the_turn() -> None:
    async with open_served(*chain_args(2, "--updates", "5")) as c:
        await c.initialize()
        sid = await c.new_session()
        answer = await c.request("session/prompt", {"sessionId": sid,
                                                    "prompt": [{"type": "text", "text": "hi"}]})
        assert answer["result"] == {"stopReason": "end_turn"}
        assert len(c.inbox) == 5


# -- batches (protocol.md §1) ------------------------------------------------------------------

async def send_line(c, line: bytes) -> None:
    await c.send_raw(line + b"\n")


async def test_a_batch_of_requests_is_answered_with_one_array() -> None:
    async with open_served(*chain_args(1)) as c:
        await c.initialize()
        await send_line(c, b'[{"jsonrpc":"2.0","id":1,"method":"_test/echo","params":{"a":1}},'
                           b'{"jsonrpc":"2.0","method":"_ext/note","params":{}},'
                           b'{"jsonrpc":"2.0","id":"two","method":"_test/echo","params":[2]}]')
        reply = await c.read()
    assert isinstance(reply, list)
    assert sorted((json.dumps(r["id"]), json.dumps(r["result"])) for r in reply) == \
        [('"two"', "[2]"), ("1", '{"a": 1}')]


async def test_a_batch_of_only_notifications_gets_no_answer() -> None:
    async with open_served(*chain_args(1)) as c:
        await c.initialize()
        await send_line(c, b'[{"jsonrpc":"2.0","method":"_ext/a"},'
                           b'{"jsonrpc":"2.0","method":"_ext/b","params":{}}]')
        await send_line(c, b'{"jsonrpc":"2.0","id":"after","method":"_test/echo","params":{}}')
        assert (await c.read())["id"] == "after"  # nothing came before it


async def test_an_empty_batch_gets_one_invalid_request_error() -> None:
    async with open_served(*chain_args(0)) as c:
        await c.initialize()
        await send_line(c, b"[]")
        reply = await c.read()
        assert isinstance(reply, dict)
        assert reply["id"] is None
        assert reply["error"]["code"] == -32600
        assert "result" in await c.request("_test/echo", {})


async def test_invalid_items_in_a_batch_get_invalid_request_in_the_array() -> None:
    async with open_served(*chain_args(0)) as c:
        await c.initialize()
        await send_line(c, b'[1, {"jsonrpc":"2.0","id":5,"method":"_test/echo","params":{}}]')
        reply = await c.read()
    assert isinstance(reply, list)
    by_id = {json.dumps(r["id"]): r for r in reply}
    assert by_id["null"]["error"]["code"] == -32600
    assert by_id["5"]["result"] == {}


# -- malformed input from the editor ------------------------------------------------------------

async def test_non_json_from_the_editor_gets_a_parse_error_and_serving_continues() -> None:
    async with open_served(*chain_args(1)) as c:
        await send_line(c, b"this is not json")  # before initialize, too
        first = await c.read()
        await c.initialize()
        await send_line(c, b'{"jsonrpc":"2.0","id":1,"method":')
        second = await c.read()
        assert "result" in await c.request("_test/echo", {})
    # A request whose id can be read is answered under it: its sender would wait for ever
    # for an answer with `id: null` (as a frame that is not UTF-8 is, by the same scan).
    assert (first["id"], second["id"]) == (None, 1)
    for reply in (first, second):
        assert reply["error"]["code"] == -32700


async def test_call_shaped_junk_is_invalid_request_and_stray_responses_are_ignored() -> None:
    async with open_served(*chain_args(0)) as c:
        await c.initialize()
        await send_line(c, b'{"jsonrpc":"2.0","id":4,"method":5}')
        junk = await c.read()
        assert junk["error"]["code"] == -32600
        await send_line(c, b'{"jsonrpc":"2.0","id":999,"result":{}}')  # nobody asked
        await send_line(c, b'{"jsonrpc":"2.0","method":"_x/unknown_note"}')  # never answered
        assert (await c.request("_test/echo", {}, ident="next"))["id"] == "next"
        assert not c.inbox


async def test_envelope_members_reach_the_agent_only_once_unwrapped(tmp_path: Path) -> None:
    record = tmp_path / "agent.jsonl"
    async with open_served(*chain_args(2, "--record", str(record))) as c:
        await c.initialize()
        await c.request("_test/echo", {"x": 1})
    methods = [members(line)["method"] for line in record.read_text("utf-8").splitlines()]
    assert methods == ['"initialize"', '"_test/echo"']
