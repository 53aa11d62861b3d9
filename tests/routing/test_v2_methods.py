"""Every ACP v2 method and notification (spec meta.unstable.json) crosses the real router
byte for byte when no proxy touches it: params toward the agent, results back, and the
agent's own calls toward the editor."""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

import anyio
import msgspec
import pytest

from conductor import acp
from conductor.plugins.api import Proxy
from conductor.testing import ScriptedAgent, TestClient, open_test_chain

if TYPE_CHECKING:
    from conductor.jsonrpc.message import Request

META = json.loads((Path(__file__).parent.parent / "spec" / "v2" / "meta.unstable.json")
                  .read_text())
# Routed by serverId / connectionId (docs/mcp.md), and initialize has its own tests
# (e2e/test_fidelity.py); everything else is the conductor's business only to carry.
NOT_PLAIN = {acp.INITIALIZE, *acp.MCP_METHODS}
PARAMS = b'{"sessionId" : "s-1", "n":1e2, "big":123456789012345678901, "_meta":{"k":null}}'
RESULT = b'{"ok" : true, "x":1.50, "_meta":{}}'


class PassThrough(Proxy):
    """A proxy with no handlers: everything it sees goes on untouched."""


def _methods(side: str) -> list[str]:
    return sorted(m for m in META[side].values() if m not in NOT_PLAIN)


def _raw(call: Any) -> bytes:
    return bytes(call.params)


@pytest.mark.parametrize("proxies", [0, 1])
async def test_every_v2_editor_method_crosses_the_chain_byte_for_byte(proxies: int) -> None:
    async def answer(agent: ScriptedAgent, message: Request) -> msgspec.Raw:
        return msgspec.Raw(RESULT)

    agent = ScriptedAgent({m: answer for m in _methods("agentMethods")})
    chain = [PassThrough() for _ in range(proxies)]
    async with open_test_chain(chain, agent, initialize=False) as client:
        await client.initialize(2)
        for method in _methods("agentMethods"):
            if method in acp.NOTIFICATION_METHODS:
                await client.notify(method, msgspec.Raw(PARAMS))
                await agent.wait_for(method)
            else:
                response = await client.request(method, msgspec.Raw(PARAMS))
                assert bytes(response.result) == RESULT, method
            assert _raw([c for c in agent.received if c.method == method][-1]) == PARAMS, \
                method


@pytest.mark.parametrize("proxies", [0, 1])
async def test_every_v2_agent_method_reaches_the_editor_byte_for_byte(proxies: int) -> None:
    client = TestClient({m: msgspec.Raw(RESULT) for m in _methods("clientMethods")})
    results: dict[str, bytes] = {}

    async def prompt(agent: ScriptedAgent, message: Request) -> dict[str, str]:
        for method in _methods("clientMethods"):
            if method in acp.NOTIFICATION_METHODS:
                await agent.notify(method, msgspec.Raw(PARAMS))
            else:
                results[method] = bytes((await agent.request(method, msgspec.Raw(PARAMS)))
                                        .result)
        return {"stopReason": "end_turn"}

    agent = ScriptedAgent({"session/prompt": prompt})
    chain = [PassThrough() for _ in range(proxies)]
    async with open_test_chain(chain, agent, client=client, initialize=False):
        await client.initialize(2)
        with anyio.fail_after(5):
            await client.call("session/prompt", {"sessionId": "s-1", "prompt": []})
        for method in _methods("clientMethods"):
            assert _raw([c for c in client.received if c.method == method][-1]) == PARAMS, \
                method
            if method not in acp.NOTIFICATION_METHODS:
                assert results[method] == RESULT, method
