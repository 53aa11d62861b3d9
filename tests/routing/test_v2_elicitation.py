"""A v2 elicitation scoped to a request names it by `requestId`: an id, mapped per hop like
every other id the conductor forwards (protocol.md §4)."""

from __future__ import annotations

from typing import TYPE_CHECKING

import anyio
import msgspec
import pytest

from conductor.plugins import Proxy, ProxyContext, on
from conductor.testing import ScriptedAgent, TestClient, open_test_chain
from tests.routing.test_v2_methods import PassThrough

if TYPE_CHECKING:
    from conductor.jsonrpc.message import JsonValue, Request


def elicitation(request_id: JsonValue) -> dict[str, JsonValue]:
    return {"mode": "form", "message": "Your one-time code?", "requestId": request_id,
            "requestedSchema": {"type": "object", "properties": {"code": {"type": "string"}}}}


@pytest.mark.parametrize("proxies", [0, 1])
@pytest.mark.parametrize("version", [1, 2])
async def test_an_elicitation_about_a_request_names_it_by_the_editors_own_id(
        proxies: int, version: int) -> None:
    async def login(agent: ScriptedAgent, message: Request) -> JsonValue:
        # About the request being handled, by the id the agent got it under.
        await agent.call("elicitation/create", elicitation(msgspec.json.decode(message.id)))
        # An id it never got crosses as it is.
        await agent.call("elicitation/create", elicitation("elsewhere-1"))
        return {}

    agent = ScriptedAgent({"auth/login": login})
    client = TestClient({"elicitation/create": {"action": "decline"}})
    async with open_test_chain([PassThrough() for _ in range(proxies)], agent, client=client,
                               initialize=False):
        with anyio.fail_after(5):
            await client.initialize(version)
            answer = await client.request("auth/login", {"methodId": "code"}, ident=77)
            assert not answer.is_error
    [agents_id] = [m.id for m in agent.received if m.method == "auth/login"]
    assert msgspec.json.decode(agents_id) != 77  # the hops' ids differ
    mine, other = client.received_params("elicitation/create")
    # v1 is carried byte for byte, as it always was (v2's scope is what this maps).
    assert mine["requestId"] == (77 if version == 2 else msgspec.json.decode(agents_id))
    assert other["requestId"] == "elsewhere-1"


class Login(Proxy):
    """Handles (forwards) the request the elicitation is about: it goes on under the
    proxy's own id."""

    @on("auth/login")
    async def login(self, ctx: ProxyContext, message: Request) -> object:
        return await ctx.forward()


async def elicitation_the_editor_gets(proxies: list[Proxy]) -> JsonValue:
    """The v2 editor sends `auth/login` (its id 77) through `proxies`; the agent asks about
    it with an elicitation naming its own id: the params the editor gets."""
    async def login(agent: ScriptedAgent, message: Request) -> JsonValue:
        await agent.call("elicitation/create", elicitation(msgspec.json.decode(message.id)))
        return {}

    client = TestClient({"elicitation/create": {"action": "decline"}})
    async with open_test_chain(proxies, ScriptedAgent({"auth/login": login}), client=client,
                               initialize=False):
        with anyio.fail_after(5):
            await client.initialize(2)
            assert not (await client.request("auth/login", {"methodId": "c"}, ident=77)).is_error
    [asked] = client.received_params("elicitation/create")
    return asked


@pytest.mark.parametrize("chain", ["handled", "handled-behind-a-pass-through"])
async def test_an_elicitation_about_a_request_a_proxy_forwarded_names_the_editors_id(
        chain: str) -> None:
    proxies: list[Proxy] = [Login()] if chain == "handled" else [Login(), PassThrough()]
    asked = await elicitation_the_editor_gets(proxies)
    assert isinstance(asked, dict) and asked["requestId"] == 77


class Asks(Proxy):
    """Handles (forwards) elicitations, and saw none of the requests they are about: those
    were routed past it."""

    def __init__(self) -> None:
        super().__init__()
        self.seen: list[JsonValue] = []

    @on("elicitation/create", source="successor")
    async def ask(self, ctx: ProxyContext, message: Request) -> object:
        self.seen.append(message.params_value()["requestId"])
        return await ctx.forward()


async def test_an_elicitation_about_a_request_routed_past_its_handling_proxy_names_the_editors_id(
        ) -> None:
    asks = Asks()
    asked = await elicitation_the_editor_gets([asks])
    # It went up through the proxy as the agent's own id (the proxy's successor side), and
    # the editor was told that: an id it never sent, or one naming another of its requests.
    assert isinstance(asked, dict) and asked["requestId"] == 77
    # The proxy never saw that request: it is named so no id on any hop is mistaken for it.
    [seen] = asks.seen
    assert isinstance(seen, str) and seen.startswith("routed-past:")
