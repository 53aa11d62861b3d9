"""ACP v2 turns: `session/prompt` is answered when the agent accepts it, and the turn runs
on until the agent's `session/update` says the session is idle (`state_update`). The
router's session table, and what it decides by it, follows the turn, not the answer."""

from __future__ import annotations

from typing import TYPE_CHECKING

import anyio

from conductor.plugins import CloseReason
from conductor.routing.deadlines import Timeouts
from conductor.testing import ScriptedAgent, TestClient, open_test_chain
from tests.routing.test_session_release import Recorder

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable

    from conductor.jsonrpc.message import Request


def idle(sid: str) -> dict[str, object]:
    return {"sessionId": sid, "update": {"sessionUpdate": "state_update", "state": "idle",
                                         "stopReason": "end_turn"}}


def accepts_then(rest: Callable[[ScriptedAgent, str], Awaitable[None]]
                 ) -> Callable[[ScriptedAgent, Request], Awaitable[object]]:
    """A v2 `session/prompt` script: accept the prompt at once (`{}`), then run `rest` of
    the turn in the agent's own task."""
    async def prompt(agent: ScriptedAgent, message: Request) -> object:
        assert agent.tg is not None
        agent.tg.start_soon(rest, agent, message.params_value()["sessionId"])
        return {}
    return prompt


async def test_a_v2_session_whose_accepted_turn_still_runs_does_not_expire_until_it_is_idle(
) -> None:
    recorder = Recorder()
    quiet_opened = anyio.Event()
    during_turn: list[tuple[str, CloseReason | None]] = []

    async def rest(agent: ScriptedAgent, sid: str) -> None:
        await quiet_opened.wait()
        await recorder.wait_ended(1)  # a session opened after the turn began expires first
        during_turn.extend(recorder.ended)
        await agent.notify("session/update", idle(sid))

    agent = ScriptedAgent({"session/prompt": accepts_then(rest)})
    expiry = Timeouts(session_idle_expiry=0.3)
    async with open_test_chain([recorder], agent, timeouts=expiry, initialize=False) as client:
        with anyio.fail_after(5):
            await client.initialize(2)
            busy = await client.new_session()
            assert await client.call("session/prompt", {"sessionId": busy, "prompt": []}) == {}
            quiet = await client.new_session()
            quiet_opened.set()
            await recorder.wait_ended(2)  # once the agent said idle, the busy one goes too
    assert during_turn == [(quiet, CloseReason.EXPIRED)]
    assert recorder.ended == [(quiet, CloseReason.EXPIRED), (busy, CloseReason.EXPIRED)]


async def test_a_v1_turn_still_ends_with_its_answer() -> None:
    recorder = Recorder()
    async with open_test_chain([recorder], timeouts=Timeouts(session_idle_expiry=0.3)) \
            as client:
        with anyio.fail_after(5):
            sid = await client.new_session()
            await client.prompt(sid, "hi")
            await recorder.wait_ended(1)
    assert recorder.ended == [(sid, CloseReason.EXPIRED)]


async def test_a_v2_agent_that_dies_mid_turn_leaves_the_editor_an_idle_session_naming_it(
) -> None:
    async def rest(agent: ScriptedAgent, sid: str) -> None:
        await agent.notify("session/update", {"sessionId": sid, "update": {
            "sessionUpdate": "agent_message_chunk", "content": {"type": "text", "text": "."}}})
        await agent.hang_up()

    client = TestClient()
    agent = ScriptedAgent({"session/prompt": accepts_then(rest)})
    async with open_test_chain([Recorder()], agent, client=client, initialize=False):
        with anyio.fail_after(5):
            await client.initialize(2)
            sid = await client.new_session()
            await client.call("session/prompt", {"sessionId": sid, "prompt": []})
            [ended] = await client.wait_for(
                "session/update", where=lambda p: p["update"]["sessionUpdate"] == "state_update")
    assert ended["sessionId"] == sid
    assert ended["update"]["state"] == "idle"
    error = ended["update"]["_meta"]["acp-conductor"]["error"]
    assert error["code"] == -33001
    assert error["data"]["component"] == "agent"


async def test_a_v2_turn_past_the_prompt_timeout_ends_for_the_editor_and_is_cancelled(
) -> None:
    async def rest(agent: ScriptedAgent, sid: str) -> None:
        await agent.wait_for("session/cancel")  # a wedged turn, until told to stop
        await agent.notify("session/update", {"sessionId": sid, "update": {
            "sessionUpdate": "state_update", "state": "idle", "stopReason": "cancelled"}})
        await agent.notify("session/update", {"sessionId": sid, "update": {
            "sessionUpdate": "agent_message_chunk", "content": {"type": "text", "text": "!"}}})

    client = TestClient()
    agent = ScriptedAgent({"session/prompt": accepts_then(rest)})
    async with open_test_chain([Recorder()], agent, client=client, initialize=False,
                               timeouts=Timeouts(prompt=0.2)):
        with anyio.fail_after(5):
            await client.initialize(2)
            sid = await client.new_session()
            assert await client.call("session/prompt", {"sessionId": sid, "prompt": []}) == {}
            await client.wait_for("session/update",  # what the agent said after its idle
                                  where=lambda p: p["update"]["sessionUpdate"] != "state_update")
    [ended] = [u for u in client.updates(sid) if u["sessionUpdate"] == "state_update"]
    error = ended["_meta"]["acp-conductor"]["error"]
    assert ended["state"] == "idle" and error["code"] == -33005
    assert error["data"] == {"component": "agent", "method": "session/prompt", "timeout": 0.2}
    assert agent.received_params("session/cancel") == [{"sessionId": sid}]
