"""Who says it is a proxy: the legacy dialect's `_meta.proxy` marker on initialize answers."""

from __future__ import annotations

from typing import TYPE_CHECKING

import anyio

from conductor.testing import ScriptedAgent, open_test_chain

if TYPE_CHECKING:
    from conductor.jsonrpc.message import Request


async def test_an_agent_that_claims_the_proxy_role_is_not_passed_off_as_a_proxy_to_the_editor(
        ) -> None:
    # @thinkwell/conductor as our agent hands on its first proxy's acceptance of the role
    # (`_meta.proxy: true`). Run as an agent, the conductor is no proxy: an editor that is
    # a legacy conductor would take it for one and route it as one.
    async def initialize(agent: ScriptedAgent, message: Request) -> object:
        return {"protocolVersion": 1, "agentCapabilities": {},
                "_meta": {"proxy": True, "keep": 1}}

    async with open_test_chain([], ScriptedAgent({"initialize": initialize}),
                               initialize=False) as client:
        with anyio.fail_after(5):
            result = await client.call("initialize", {"protocolVersion": 1})
    assert result == {"protocolVersion": 1, "agentCapabilities": {}, "_meta": {"keep": 1}}
