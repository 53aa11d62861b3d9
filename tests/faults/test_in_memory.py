"""The fault matrix in memory: misbehaving in-process agents and proxies through the real
router, over framed pipes (so bytes an agent writes are decoded as a process's would be).

Each non-fatal run puts one faulty component at one position of a chain and makes it
misbehave at successive steps of session A, checking after each fault that session B is
unaffected; at the end every request got exactly one answer. The subprocess half of the
matrix (test_processes.py) covers what needs a process: exits, signals, orphans, frame size.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import anyio
import pytest

from conductor.jsonrpc.codes import ErrorCode
from conductor.routing.deadlines import Timeouts
from conductor.testing import ScriptedAgent, open_test_chain
from tests.faults.kit import (
    COMPONENT_FAILED,
    FLOOD,
    HANDLER_FAILED,
    REQUEST_TIMEOUT,
    CountingClient,
    FaultyAgent,
    FaultyProxy,
)

if TYPE_CHECKING:
    from conductor.jsonrpc.message import Response
    from conductor.testing import TestClient

# In this order, one every other step from step 4 (initialize, two session/new before).
AGENT_FAULTS = ["garbage", "invalid-utf8", "flood", "deep", "silent"]
PROXY_FAULTS = ["flood", "crash", "silent"]  # a plugin hands objects over: no byte faults


def prompt(sid: str) -> dict[str, Any]:
    return {"sessionId": sid, "prompt": [{"type": "text", "text": "hi"}]}


def error(answer: Response) -> dict[str, Any]:
    value = answer.error_value()
    assert isinstance(value, dict), answer
    return value


def check(fault: str, answer: Response, faulty: str, client: TestClient, sid: str) -> None:
    if fault in ("garbage", "invalid-utf8"):
        assert not answer.is_error, answer  # the noise was dropped, the answer went through
    elif fault == "flood":
        assert not answer.is_error, answer
        floods = [p for p in client.received_params("session/update")
                  if p["sessionId"] == sid and "flood" in str(p["update"])]
        assert len(floods) == FLOOD
    elif fault == "deep":
        assert error(answer)["code"] == ErrorCode.INVALID_REQUEST
        assert error(answer)["data"]["component"] == faulty
        assert "nested too deeply" in error(answer)["message"]
    elif fault == "crash":
        assert error(answer)["code"] == HANDLER_FAILED
        assert error(answer)["data"]["component"] == faulty
    elif fault == "silent":
        assert error(answer)["code"] == REQUEST_TIMEOUT
        assert error(answer)["data"]["component"] == faulty


@pytest.mark.parametrize(("position", "length"), [
    ("agent", 0), ("agent", 2), ("p0", 1), ("p1", 2)])
async def test_a_misbehaving_component_answers_every_request_once_and_spares_other_sessions(
        position: str, length: int, caplog: pytest.LogCaptureFixture) -> None:
    faults = AGENT_FAULTS if position == "agent" else PROXY_FAULTS
    at = {4 + 2 * i: fault for i, fault in enumerate(faults)}
    agent = FaultyAgent(at if position == "agent" else {})
    proxies = [FaultyProxy(f"p{i}", at if position == f"p{i}" else None)
               for i in range(length)]
    client = CountingClient()
    async with open_test_chain(proxies, agent, client=client, transport="pipes",
                               timeouts=Timeouts(request=0.15)) as client:
        with anyio.fail_after(10):
            a, b = await client.new_session(), await client.new_session()
            for fault in faults:  # a silent session/new times out; prompts are not timed
                answer = await client.request("session/new", {"cwd": "/", "mcpServers": []}) \
                    if fault == "silent" else await client.request("session/prompt", prompt(a))
                check(fault, answer, position, client, a)
                other = await client.request("session/prompt", prompt(b))
                assert not other.is_error, (fault, other)
    client.assert_each_answered_once()
    assert not [p for p in client.received_params("session/update") if "note" in p]
    if position == "agent":  # the noise reached the router, and went no further
        assert "agent wrote a non-JSON line on stdout (dropped)" in caplog.text
        assert "agent sent a message that is not valid UTF-8" in caplog.text


@pytest.mark.parametrize("length", [0, 2])
async def test_an_agent_that_hangs_up_answers_everything_pending_naming_the_agent(
        length: int) -> None:
    agent = FaultyAgent({4: "silent", 5: "crash"})
    client = CountingClient()
    async with open_test_chain([FaultyProxy(f"p{i}") for i in range(length)], agent,
                               client=client, transport="pipes") as client:
        with anyio.fail_after(10):
            a, b = await client.new_session(), await client.new_session()
            answers: dict[str, Response] = {}

            async def ask(name: str, sid: str) -> None:
                answers[name] = await client.request("session/prompt", prompt(sid))
            async with anyio.create_task_group() as tg:
                tg.start_soon(ask, "pending", a)
                await agent.wait_for("session/prompt")
                tg.start_soon(ask, "crashing", b)
            later = await client.request("session/new", {"cwd": "/", "mcpServers": []})
    for answer in (*answers.values(), later):
        assert error(answer)["code"] == COMPONENT_FAILED
        assert error(answer)["data"]["component"] == "agent"
    client.assert_each_answered_once()


async def test_well_behaved_components_trip_none_of_the_checks() -> None:
    client = CountingClient()
    async with open_test_chain([FaultyProxy("p0")], ScriptedAgent(), client=client) as client:
        with anyio.fail_after(5):
            await client.prompt(await client.new_session(), "hi")
    client.assert_each_answered_once()
