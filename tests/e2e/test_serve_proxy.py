"""A plugin served stand-alone (`acp-conductor serve-proxy`): what its predecessor (a
conductor, ours or another) sends that is not a usable message still gets its answer."""

from __future__ import annotations

from tests.wire_client import open_conductor


async def test_a_request_that_breaks_json_rpc_2_is_answered_invalid_request() -> None:
    async with open_conductor("serve-proxy", "passthrough") as c:
        await c.send_raw(b'{"jsonrpc":"2.0","id":5,"method":"_x/y","params":5}\n')
        answer = await c.response(5)
        assert answer["error"]["code"] == -32600
        assert "object or an array" in answer["error"]["data"]


async def test_a_line_that_is_not_json_is_answered_parse_error() -> None:
    async with open_conductor("serve-proxy", "passthrough") as c:
        await c.send_raw(b"not json\n")
        answer = await c.read()
        assert answer["id"] is None and answer["error"]["code"] == -32700


async def test_a_batch_is_answered_with_one_array_its_invalid_items_included() -> None:
    async with open_conductor("serve-proxy", "passthrough") as c:
        await c.send_raw(b'[{"jsonrpc":"2.0","id":6,"method":"_x/y","params":{}},'
                         b'{"jsonrpc":"2.0","id":7,"method":3}]\n')
        wrapped = await c.read_until(lambda m: isinstance(m, dict)
                                     and m.get("method") == "_proxy/successor")
        await c.send({"jsonrpc": "2.0", "id": wrapped["id"], "result": {"ok": True}})
        replies = await c.read_until(lambda m: isinstance(m, list))
        by_id = {r["id"]: r for r in replies}
        assert by_id[6]["result"] == {"ok": True}
        assert by_id[7]["error"]["code"] == -32600
        assert len(replies) == 2
