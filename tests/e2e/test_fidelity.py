"""Payloads the conductor does not change cross every hop byte-identical, in both directions."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING

import pytest

from tests.bin.rawjson import members
from tests.wire_client import chain_args, open_served

if TYPE_CHECKING:
    from pathlib import Path

# Whitespace, key order, \u escapes (incl. a surrogate pair), 1e2, -0.0, a huge integer,
# unknown fields, _meta, nulls and raw non-ASCII: everything a re-encoder would "normalise".
ODD = ('{ "zeta" :1,  "alpha":[1e2, 123456789012345678901234567890, -0.0, 1E-7, 0.10],'
       '"s":"\\u00e9\\ud83d\\ude00\\n\\/", "n" : null,"unknownField":{"deep":[{}, []]},'
       '"_meta":{"trace":"\\u0041", "x":true} , "raw":"é😀"  }')
ODD_RESULT = '{"b":2 ,"a":1, "big":98765432109876543210, "e":1.5E+3, "_meta":{}, "x":null}'

INIT_V1 = ('{"protocolVersion":1, "clientCapabilities":{"fs":{"readTextFile":true,'
           '"writeTextFile":false},"terminal":false,"_meta":{"k":"\\u0041"}},'
           '"clientInfo":{"name":"ed","version":"1e2"},"futureField":[1e2,null],'
           '"_meta":{"z":1}}')
INIT_V2 = ('{"protocolVersion":2,"info":{"name":"ed", "version":"2.0", "extra":1e2},'
           '"capabilities":{"fs":{"read":{}},"_unstable":{"x":[null]}},'
           '"_meta":{"a":"\\u00e9"}, "unknown" : {"k":12345678901234567890}}')
# Both results say the agent takes acp MCP servers, so the bridge has nothing to add to
# them (test_the_bridges_advertisement_changes_nothing_else covers the edit).
RESULT_V1 = ('{"protocolVersion":1,"agentCapabilities":{"loadSession":false,"_meta":{},'
             '"mcpCapabilities":{"acp":true}},'
             '"agentInfo":{"name":"a\\u0041","version":"1e2"},"authMethods":[],"later":null}')
RESULT_V2 = ('{"protocolVersion":2, "info":{"name":"a"},"capabilities":{"session":'
             '{"mcp":{"acp":{}}}},"_meta":{"big":123456789012345678901234567890}}')

CHAINS = pytest.mark.parametrize("proxies", [0, 1, 2])


def received(record: Path, method: str) -> list[dict[str, str]]:
    """The raw members of every line the agent received with this method."""
    out = []
    for line in record.read_bytes().decode("utf-8").splitlines():
        if line.strip():
            m = members(line)
            if m.get("method") == json.dumps(method):
                out.append(m)
    return out


@CHAINS
@pytest.mark.parametrize(("params", "result"), [(INIT_V1, RESULT_V1), (INIT_V2, RESULT_V2)],
                         ids=["v1", "v2"])
async def test_initialize_params_and_result_cross_the_chain_byte_identical(
        tmp_path: Path, proxies: int, params: str, result: str) -> None:
    record = tmp_path / "agent.jsonl"
    args = chain_args(proxies, "--record", str(record), "--init-result", result)
    async with open_served(*args) as c:
        await c.send_raw(f'{{"jsonrpc":"2.0","id":0,"method":"initialize","params":{params}}}\n'
                         .encode())
        line = await c.read_raw()
    assert members(line.decode())["result"] == result
    [seen] = received(record, "initialize")
    assert seen["params"] == params


async def test_the_bridges_advertisement_changes_nothing_else(tmp_path: Path) -> None:
    """An agent without acp MCP support: the result going up says it has it (the bridge
    stands in); every other value keeps its bytes."""
    record = tmp_path / "agent.jsonl"
    result = RESULT_V1.replace(',"mcpCapabilities":{"acp":true}', "")
    assert "acp" not in result
    async with open_served(*chain_args(0, "--record", str(record), "--init-result",
                                       result)) as c:
        await c.send_raw(f'{{"jsonrpc":"2.0","id":0,"method":"initialize","params":{INIT_V1}}}\n'
                         .encode())
        line = await c.read_raw()
    got = members(line.decode())["result"]
    assert json.loads(got)["agentCapabilities"] == {"loadSession": False, "_meta": {},
                                                     "mcpCapabilities": {"acp": True}}
    for kept in ('"agentInfo":{"name":"a\\u0041","version":"1e2"}', '"later":null',
                 '"authMethods":[]'):
        assert kept in got


@CHAINS
async def test_request_params_and_result_cross_the_chain_byte_identical(
        tmp_path: Path, proxies: int) -> None:
    record = tmp_path / "agent.jsonl"
    async with open_served(*chain_args(proxies, "--record", str(record))) as c:
        await c.initialize()
        await c.send_raw(f'{{"jsonrpc":"2.0","id":5,"method":"_test/echo","params":{ODD}}}\n'
                         .encode())
        line = await c.read_raw()
    assert members(line.decode())["result"] == ODD
    [seen] = received(record, "_test/echo")
    assert seen["params"] == ODD


@CHAINS
async def test_notification_params_cross_the_chain_byte_identical_toward_the_agent(
        tmp_path: Path, proxies: int) -> None:
    record = tmp_path / "agent.jsonl"
    async with open_served(*chain_args(proxies, "--record", str(record))) as c:
        await c.initialize()
        await c.send_raw(f'{{"jsonrpc":"2.0","method":"_ext/note","params":{ODD}}}\n'.encode())
        # A request after it: answered only once the notification has been through.
        await c.request("_test/echo", {})
    [seen] = received(record, "_ext/note")
    assert seen["params"] == ODD
    assert "id" not in seen


@CHAINS
async def test_agent_notifications_reach_the_editor_byte_identical(proxies: int) -> None:
    note = f'{{"jsonrpc":"2.0","method":"session/update","params":{ODD}}}'
    async with open_served(*chain_args(proxies)) as c:
        await c.initialize()
        await c.send(
            {"jsonrpc": "2.0", "id": 1, "method": "_test/raw", "params": {"lines": [note]}})
        line = await c.read_raw()
        assert members(line.decode())["params"] == ODD
        assert (await c.read())["id"] == 1


@CHAINS
async def test_agent_request_and_editor_answer_cross_the_chain_byte_identical(
        proxies: int) -> None:
    async with open_served(*chain_args(proxies)) as c:
        await c.initialize()
        await c.send_raw(b'{"jsonrpc":"2.0","id":1,"method":"_test/ask","params":'
                         b'{"method":"fs/read_text_file","params":' + ODD.encode() + b"}}\n")
        asked = members((await c.read_raw()).decode())
        assert asked["method"] == '"fs/read_text_file"'
        assert asked["params"] == ODD
        await c.send_raw(f'{{"jsonrpc":"2.0","id":{asked["id"]},"result":{ODD_RESULT}}}\n'
                         .encode())
        answer = members((await c.read_raw()).decode())
    assert members(answer["result"]) == {"result": ODD_RESULT}


@CHAINS
async def test_agent_error_answers_reach_the_editor_byte_identical(proxies: int) -> None:
    async with open_served(*chain_args(proxies)) as c:
        await c.initialize()
        await c.send_raw(b'{"jsonrpc":"2.0","id":"x","method":"_nope/unknown","params":{}}\n')
        line = members((await c.read_raw()).decode())
    assert line["error"] == '{"code": -32601, "message": "Method not found", ' \
                           '"data": {"method": "_nope/unknown"}}'


IDS = ['"s"', '"\\u00fc-\\n"', "0", "-7", "123456789012345678901234567890", "1.5", "1e2",
       "null", '""']


@pytest.mark.parametrize("proxies", [0, 2])
async def test_editor_ids_of_any_json_type_come_back_exactly(proxies: int) -> None:
    async with open_served(*chain_args(proxies)) as c:
        await c.initialize()
        for ident in IDS:
            await c.send_raw(f'{{"jsonrpc":"2.0","id":{ident},"method":"_test/echo",'
                             f'"params":{{"i":{ident}}}}}\n'.encode())
        lines = [members((await c.read_raw()).decode()) for _ in IDS]
    assert [m["id"] for m in lines] == IDS
    assert [m["result"] for m in lines] == [f'{{"i":{i}}}' for i in IDS]


async def test_ids_that_are_equal_as_text_but_differ_in_type_stay_apart() -> None:
    async with open_served(*chain_args(1)) as c:
        await c.initialize()
        await c.send_raw(b'{"jsonrpc":"2.0","id":1,"method":"_test/echo","params":{"n":1}}\n'
                         b'{"jsonrpc":"2.0","id":"1","method":"_test/echo","params":{"s":1}}\n')
        first = members((await c.read_raw()).decode())
        second = members((await c.read_raw()).decode())
    assert (first["id"], first["result"]) == ("1", '{"n":1}')
    assert (second["id"], second["result"]) == ('"1"', '{"s":1}')
