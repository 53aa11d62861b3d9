"""Lazy start, protocol version selection and who may send `_proxy/initialize`."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING

import pytest

from tests.wire_client import agent_cmd, chain_args, open_served, proxy_cmd

if TYPE_CHECKING:
    from pathlib import Path


def init(version: object, ident: object = 0) -> dict[str, object]:
    params: dict[str, object] = {"clientCapabilities": {}}
    if version is not ...:
        params["protocolVersion"] = version
    return {"jsonrpc": "2.0", "id": ident, "method": "initialize", "params": params}


@pytest.mark.parametrize("version", [..., "1", 1.5, -1, 65536, 2**70, None, True, [1]],
                         ids=lambda v: "missing" if v is ... else repr(v))
async def test_an_invalid_protocol_version_is_answered_with_invalid_params(
        version: object) -> None:
    async with open_served(*chain_args(1)) as c:
        await c.send(init(version))
        answer = await c.response(0)
        assert answer["error"]["code"] == -32602
        assert "protocolVersion" in json.dumps(answer["error"])
        # Nothing started, and the editor can still initialize properly.
        await c.initialize()


async def test_protocol_version_zero_is_answered_with_invalid_request() -> None:
    async with open_served(*chain_args(0)) as c:
        await c.send(init(0))
        answer = await c.response(0)
        assert answer["error"]["code"] == -32600
        await c.initialize()


@pytest.mark.parametrize(("asked", "expected"), [(1, 1), (2, 2), (7, 2), (65535, 2)])
async def test_protocol_version_one_selects_v1_and_two_or_later_selects_v2(
        tmp_path: Path, asked: int, expected: int) -> None:
    record = tmp_path / "agent.jsonl"
    async with open_served(*chain_args(1, "--record", str(record))) as c:
        await c.send(init(asked))
        answer = await c.response(0)
    # The agent echoes the version family it was asked for; the conductor accepted it.
    assert answer["result"]["protocolVersion"] == expected
    assert f'"protocolVersion": {asked}' in record.read_text(encoding="utf-8")


@pytest.mark.parametrize("proxies", [0, 1])
async def test_a_v2_client_gets_an_error_when_the_agent_answers_protocol_version_1(
        proxies: int) -> None:
    async with open_served(*chain_args(proxies, "--version", "1")) as c:
        await c.send(init(2))
        answer = await c.response(0)
    error = answer["error"]
    assert "protocolVersion" in error["message"]
    assert "2" in error["message"]
    assert error["data"]["component"] == "agent"


async def test_a_v1_client_accepts_whatever_version_the_agent_answers() -> None:
    async with open_served(*chain_args(0, "--version", "1")) as c:
        assert (await c.initialize(1))["protocolVersion"] == 1


@pytest.mark.parametrize("first", ["session/new", "_proxy/initialize", "_ext/hello"])
async def test_a_first_request_that_is_not_initialize_is_refused_and_serving_continues(
        tmp_path: Path, first: str) -> None:
    started = tmp_path / "agent.jsonl"  # the agent creates it as it starts
    async with open_served(*chain_args(0, "--record", str(started))) as c:
        await c.send({"jsonrpc": "2.0", "id": 9, "method": first, "params": {}})
        answer = await c.response(9)
        assert answer["error"]["code"] == -32600
        assert not started.exists()  # lazy: nothing was spawned for it
        await c.send({"jsonrpc": "2.0", "method": "session/cancel", "params": {}})  # ignored
        await c.initialize()
        assert started.exists()


async def test_proxy_initialize_from_the_editor_after_start_is_invalid_request() -> None:
    async with open_served(*chain_args(1)) as c:
        await c.initialize()
        answer = await c.request("_proxy/initialize", {"protocolVersion": 1})
        assert answer["error"]["code"] == -32600
        assert "_proxy/initialize" in answer["error"]["data"]
        assert "result" in await c.request("_test/echo", {})


async def test_proxy_initialize_inside_a_proxys_envelope_is_invalid_request() -> None:
    async with open_served("agent", proxy_cmd(), agent_cmd()) as c:
        await c.initialize()
        for method in ("_proxy/initialize", "proxy/initialize"):
            answer = await c.request("_relay/wrap", {"method": method,
                                                     "params": {"protocolVersion": 1}})
            assert answer["error"]["code"] == -32600
            assert "only sent by the conductor" in answer["error"]["data"]
        assert "result" in await c.request("_test/echo", {})


async def test_repeated_initialize_goes_to_the_chain_again() -> None:
    async with open_served(*chain_args(1)) as c:
        await c.initialize()
        assert (await c.initialize())["protocolVersion"] == 1
