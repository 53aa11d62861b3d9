"""Protocol version negotiation across the v1/v2 boundary, through the real router."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING

import anyio
import pytest
from msgspec import Raw

from conductor.jsonrpc.codes import ErrorCode
from conductor.plugins import Proxy, ProxyContext, on
from conductor.testing import ScriptedAgent, open_test_chain

if TYPE_CHECKING:
    from conductor.jsonrpc.message import Request

INFO = {"name": "editor", "version": "1"}


def answering(version: object) -> ScriptedAgent:
    async def initialize(agent: ScriptedAgent, message: Request) -> object:
        return {"protocolVersion": version, "info": {"name": "a", "version": "1"}}
    return ScriptedAgent({"initialize": initialize})


async def test_a_refused_later_version_is_reported_as_the_client_asked_for_it() -> None:
    # A client asking for 3 is served as v2; an agent that says 3 is refused, and the
    # error must say what the client really asked for, not the 2 it was taken for.
    async with open_test_chain([], answering(3), initialize=False) as client:
        with anyio.fail_after(5):
            answer = await client.request("initialize", {"protocolVersion": 3, "info": INFO})
    error = answer.error_value()
    assert isinstance(error, dict)
    assert error["code"] == ErrorCode.INTERNAL_ERROR
    assert "asked for protocol version 3" in error["message"]
    assert error["data"] == {"component": "agent", "agentProtocolVersion": 3,
                             "clientProtocolVersion": 3}


async def test_a_later_version_answered_with_2_is_passed_on() -> None:
    async with open_test_chain([], answering(2), initialize=False) as client:
        with anyio.fail_after(5):
            result = await client.call("initialize", {"protocolVersion": 3, "info": INFO})
    assert isinstance(result, dict) and result["protocolVersion"] == 2


async def test_an_agent_answering_2_0_is_refused_as_not_an_integer_version() -> None:
    # The schema's protocolVersion is an integer: 2.0 is not version 2, and an editor that
    # reads it strictly would fail on it later, far from the cause.
    async with open_test_chain([], answering(2.0), initialize=False) as client:
        with anyio.fail_after(5):
            answer = await client.request("initialize", {"protocolVersion": 2, "info": INFO})
    error = answer.error_value()
    assert isinstance(error, dict) and error["code"] == ErrorCode.INTERNAL_ERROR
    assert error["data"]["agentProtocolVersion"] == 2.0


class SaysV1(Proxy):
    """Answers its editor protocol version 1, whatever the agent said."""

    @on("initialize")
    async def initialize(self, ctx: ProxyContext, message: Request) -> object:
        answer = await ctx.forward()
        assert answer is not None
        result = answer.result_value()
        assert isinstance(result, dict)
        return {**result, "protocolVersion": 1}


async def test_a_proxy_that_answers_a_lower_version_is_believed() -> None:
    # Only the agent's answer is checked against a v2 request: what a proxy tells its
    # editor is its own to say (it may adapt versions); the editor decides (docs/design.md).
    async with open_test_chain([SaysV1()], answering(2), initialize=False) as client:
        with anyio.fail_after(5):
            result = await client.call("initialize", {"protocolVersion": 2, "info": INFO})
    assert isinstance(result, dict) and result["protocolVersion"] == 1


@pytest.mark.parametrize(("answer", "editor_version", "method"), [
    ({"protocolVersion": 1, "agentCapabilities": {"loadSession": True}}, 2, "session/load"),
    ({"protocolVersion": 2, "capabilities": {"session": {}}}, 1, "session/resume"),
    ({"agentCapabilities": {"loadSession": True}}, 1, "session/load"),
    ({"protocolVersion": 1, "agentCapabilities": {}}, 2, None),
])
def test_a_restarted_agents_sessions_are_reopened_as_its_own_version_says(
        answer: dict[str, object], editor_version: int, method: str | None) -> None:
    from conductor.jsonrpc.message import Response
    from conductor.routing.recovery import reopen_method

    response = Response(id=Raw(b"1"), result=Raw(json.dumps(answer).encode()))
    assert reopen_method(response, editor_version) == method
