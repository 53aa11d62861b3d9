"""The router's behaviours in memory, once over message links and once over framed pipes:
cancellation hop by hop, batches, per-hop order, and answers when a component dies.
(The e2e tests check the same over real processes.)"""

from __future__ import annotations

from typing import TYPE_CHECKING

import anyio
import pytest

from acp_conductor_proxies.passthrough import Passthrough
from conductor.jsonrpc.codes import ErrorCode
from conductor.jsonrpc.message import Notification, Raw
from conductor.plugins import Proxy, ProxyContext, on
from conductor.testing import ScriptedAgent, TestClient, open_test_chain

if TYPE_CHECKING:
    from conductor.jsonrpc.message import Request
    from conductor.transport.memory import Transport


@pytest.fixture(params=["memory", "pipes"])
def transport(request: pytest.FixtureRequest) -> str:
    return str(request.param)


class Visits(Proxy):
    """Handles every request from the editor side, so each one really crosses it."""

    @on("*")
    async def everything(self, ctx: ProxyContext, message: Request) -> object:
        return await ctx.forward()


def update(sid: str, n: int) -> dict[str, object]:
    return {"sessionId": sid, "update": {"sessionUpdate": "agent_message_chunk",
                                         "content": {"type": "text", "text": f"{n} "}}}


async def test_a_cancel_reaches_the_agent_once_with_the_agents_own_id(
        transport: Transport) -> None:
    asked = anyio.Event()

    async def slow(agent: ScriptedAgent, message: Request) -> object:
        asked.set()
        await agent.wait_for("$/cancel_request")
        return {"stopped": True}

    agent = ScriptedAgent({"_ext/slow": slow})
    async with open_test_chain([Visits(), Visits()], agent, transport=transport) as client:
        with anyio.fail_after(5):
            async with anyio.create_task_group() as tg:
                answers: list[object] = []

                async def ask() -> None:
                    answers.append((await client.request("_ext/slow", {}, ident=77)).result_value())
                tg.start_soon(ask)
                await asked.wait()
                await client.cancel(77)
    assert answers == [{"stopped": True}]
    cancels = agent.received_params("$/cancel_request")
    slow_id = next(m.id for m in agent.received if m.method == "_ext/slow")  # type: ignore[union-attr]
    assert cancels == [{"requestId": int(bytes(slow_id))}]


async def test_a_batch_is_answered_as_one_array_in_which_notifications_have_no_answer(
        transport: Transport) -> None:
    async with open_test_chain([Passthrough()], transport=transport) as client:
        endpoint = client.endpoint
        assert endpoint is not None
        with anyio.fail_after(5):
            a, first = endpoint.open_request("_ext/a", Raw(b"{}"))
            b, second = endpoint.open_request("_ext/b", Raw(b"{}"))
            await endpoint.sink.send([first, Notification(method="_ext/note"), second])
            answers = [await endpoint.wait(a), await endpoint.wait(b)]
    assert client.batches == [2]  # both answers came back together, in one array
    assert [r.error_code() for r in answers] == [ErrorCode.METHOD_NOT_FOUND] * 2


async def test_updates_arrive_in_the_order_the_agent_sent_them_across_proxies(
        transport: Transport) -> None:
    async def chatty(agent: ScriptedAgent, message: Request) -> object:
        sid = message.params_value()["sessionId"]
        for n in range(200):
            await agent.notify("session/update", update(sid, n))
        return {"stopReason": "end_turn"}

    agent = ScriptedAgent({"session/prompt": chatty})
    async with open_test_chain([Visits(), Passthrough(), Visits()], agent,
                               transport=transport) as client:
        with anyio.fail_after(10):
            sid = await client.new_session()
            await client.prompt(sid, "go")
    assert client.agent_text(sid) == "".join(f"{n} " for n in range(200))


async def test_when_the_agent_dies_every_request_it_owed_is_answered_naming_it(
        transport: Transport) -> None:
    waiting = anyio.Event()

    async def never(agent: ScriptedAgent, message: Request) -> object:
        waiting.set()
        await anyio.sleep_forever()

    agent = ScriptedAgent({"_ext/never": never})
    async with open_test_chain([Visits()], agent, transport=transport) as client:
        with anyio.fail_after(5):
            async with anyio.create_task_group() as tg:
                answers: list[object] = []

                async def ask() -> None:
                    answers.append((await client.request("_ext/never", {})).error_value())
                tg.start_soon(ask)
                tg.start_soon(ask)
                await waiting.wait()
                await anyio.wait_all_tasks_blocked()
                await agent.hang_up()
            later = (await client.request("_ext/never", {})).error_value()
    assert len(answers) == 2
    for error in [*answers, later]:
        assert error["code"] == ErrorCode.COMPONENT_FAILED
        assert error["data"]["component"] == "agent"


async def test_a_notification_before_initialize_starts_nothing_and_a_request_is_refused(
        transport: Transport) -> None:
    agent = ScriptedAgent()
    async with open_test_chain([], agent, initialize=False, transport=transport) as client:
        with anyio.fail_after(5):
            await client.notify("session/update", update("s", 0))
            refused = (await client.request("session/new", {"cwd": "/"})).error_value()
            await client.initialize()
    assert refused["code"] == ErrorCode.INVALID_REQUEST
    assert [m.method for m in agent.received] == ["initialize"]


class QuotesIds(ScriptedAgent):
    """Answers with its request's id as a string ("7" for 7), as some JSON-RPC libraries
    do that keep ids as text."""

    async def _serve(self, request: Request) -> None:
        from conductor.jsonrpc.message import Response
        if request.method == "initialize":
            return await super()._serve(request)
        quoted = Raw(b'"' + bytes(request.id) + b'"')
        await self._ep.send(Response(id=quoted, result=Raw(b'{"quoted": true}')))


async def test_an_answer_whose_id_is_the_request_s_number_as_a_string_still_answers_it(
        transport: Transport) -> None:
    # Strictly it matches nothing, and the asker would wait for ever (no request_timeout
    # by default): the conductor only ever allocates integers, so "7" can only mean 7.
    async with open_test_chain([Visits()], QuotesIds(), transport=transport) as client:
        with anyio.fail_after(5):
            result = await client.call("_ext/ask", {})
    assert result == {"quoted": True}


class AsksOnward(Proxy):
    """Handles the agent's permission requests (as redact, transcript, permissions do)."""

    @on("session/request_permission", source="successor")
    async def permission(self, ctx: ProxyContext, message: Request) -> object:
        return await ctx.forward()


@pytest.mark.parametrize(("version", "proxies"), [
    (2, []), (2, [Passthrough]), (2, [AsksOnward]),
    (1, []), (1, [Passthrough]), (1, [AsksOnward])])
async def test_a_dialog_the_dead_agent_opened_is_cancelled_at_a_v2_editor_and_left_at_v1(
        transport: Transport, version: int, proxies: list[type[Proxy]]) -> None:
    # The agent asked the editor for permission and died: nobody can take the answer, so a
    # v2 editor (which acts on $/cancel_request) is told to close the dialog. A v1 editor,
    # which may ignore it, is not sent it (the SDKs' v1 clients print a traceback for it).
    asked = anyio.Event()

    async def hold(message: Request) -> object:
        asked.set()
        await anyio.sleep_forever()

    async def ask_then_die(agent: ScriptedAgent, message: Request) -> object:
        assert agent.tg is not None
        agent.tg.start_soon(agent.request, "session/request_permission",
                            {"sessionId": "s", "toolCall": {"toolCallId": "t"}, "options": []})
        await asked.wait()
        await anyio.wait_all_tasks_blocked()
        await agent.hang_up()
        return {}

    client = TestClient({"session/request_permission": hold})
    agent = ScriptedAgent({"_ext/go": ask_then_die})
    async with open_test_chain([proxy() for proxy in proxies], agent, client=client,
                               transport=transport, initialize=False) as client:
        with anyio.fail_after(5):
            await client.initialize(version)
            await client.request("_ext/go", {})
            if version >= 2:
                cancels = await client.wait_for("$/cancel_request")
            else:
                await anyio.sleep(0.2)
                cancels = client.received_params("$/cancel_request")
    asked_id = next(m.id for m in client.received if m.method == "session/request_permission")
    if version >= 2:
        assert cancels == [{"requestId": int(bytes(asked_id))}]
    else:
        assert cancels == []
