"""The conductor as a proxy (`acp-conductor proxy`): its successor is reached through its
client's own connection, wrapped in `_proxy/successor`. Driven in memory through the real
router: the client (an outer conductor) and a proxy of the inner chain are in the test's
hands."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import TYPE_CHECKING, Any

import anyio
import anyio.lowlevel
import pytest

from conductor.jsonrpc.message import Message, decode, encode
from conductor.plugins import Proxy, on
from conductor.routing.chain import Chain
from conductor.routing.deadlines import Timeouts
from conductor.routing.mcp import McpInjection, McpServer
from conductor.routing.roles import Role
from conductor.routing.topology import ComponentLink, Hop
from conductor.transport.pipes import incoming

if TYPE_CHECKING:
    from conductor.plugins import ProxyContext

Line = Callable[[Any], Awaitable[None]]


class Outbox:
    """A MessageSink that keeps what the router sent, as JSON."""

    def __init__(self) -> None:
        self.sent: list[Any] = []
        self.changed = anyio.Event()

    async def send(self, item: Message | list[Message]) -> None:
        for message in item if isinstance(item, list) else [item]:
            self.sent.append(json.loads(encode(message)))
        self.changed.set()
        self.changed = anyio.Event()

    async def aclose(self) -> None:
        pass


class ProxyMode:
    """outer conductor (the client) -> this conductor: proxy:0 -> (successor, the client)."""

    def __init__(self, *, proxies: int = 1, timeouts: Timeouts | None = None,
                 mcp: McpInjection | None = None) -> None:
        self.client = Outbox()
        self.client_wire = Hop("client", self.client)
        self.boxes = [Outbox() for _ in range(proxies)]
        self.wires = [Hop(f"proxy:{i}", box) for i, box in enumerate(self.boxes)]
        self.init_ids: list[Any] = []

        async def starter() -> list[ComponentLink]:
            return [ComponentLink(w.name, Role.PROXY, w) for w in self.wires]

        self.chain = Chain(self.client_wire, starter, proxy_mode=True, timeouts=timeouts,
                           mcp=mcp)

    async def line(self, wire: Hop, message: Any) -> None:
        with anyio.fail_after(5):
            await self.chain.receive(wire, decode(json.dumps(message).encode()))

    async def from_client(self, message: Any) -> None:
        await self.line(self.client_wire, {"jsonrpc": "2.0", **message})

    async def from_proxy(self, i: int, message: Any) -> None:
        await self.line(self.wires[i], {"jsonrpc": "2.0", **message})

    async def start(self, version: int = 1) -> None:
        """Initialized as the outer conductor does it, through every proxy and back."""
        asked = {"protocolVersion": version}
        await self.from_client({"id": 0, "method": "_proxy/initialize", "params": asked})
        for i, box in enumerate(self.boxes):
            sent = box.sent.pop()
            assert sent["method"] == "_proxy/initialize"
            self.init_ids.append(sent["id"])
            await self.from_proxy(i, {"id": f"init-{i}", "method": "_proxy/successor",
                                      "params": {"method": "initialize", "params": asked}})
        wrapped = self.client.sent.pop()
        assert wrapped["method"] == "_proxy/successor", wrapped
        await self.from_client({"id": wrapped["id"], "result": asked})
        for i in reversed(range(len(self.boxes))):
            assert self.boxes[i].sent.pop() == {"jsonrpc": "2.0", "id": f"init-{i}",
                                                "result": asked}
            await self.from_proxy(i, {"id": self.init_ids[i], "result": asked})
        assert self.client.sent.pop() == {"jsonrpc": "2.0", "id": 0, "result": asked}

    async def from_successor(self, method: str, params: Any) -> None:
        """A notification of our successor's: wrapped, on the client's connection."""
        await self.from_client({"method": "_proxy/successor",
                                "params": {"method": method, "params": params}})

    async def turn_accepted(self, sid: str = "s1") -> None:
        """The editor's session `sid` opened at our successor, through proxy:0, and a turn
        of it accepted there (answered): the outboxes are emptied."""
        await self.across(0, "session/new", {"cwd": "/w", "mcpServers": []}, {"sessionId": sid})
        await self.across(1, "session/prompt", {"sessionId": sid, "prompt": []}, {})
        self.client.sent.clear()
        self.boxes[0].sent.clear()

    async def across(self, n: int, method: str, params: Any, result: Any) -> None:
        """The editor's request `n` crosses proxy:0 to our successor, which answers it."""
        await self.from_client({"id": f"e{n}", "method": method, "params": params})
        got = self.boxes[0].sent.pop()
        await self.from_proxy(0, {"id": f"p{n}", "method": "_proxy/successor",
                                  "params": {"method": method, "params": params}})
        await self.from_client({"id": self.client.sent.pop()["id"], "result": result})
        assert self.boxes[0].sent.pop()["id"] == f"p{n}"
        await self.from_proxy(0, {"id": got["id"], "result": result})
        assert self.client.sent.pop() == {"jsonrpc": "2.0", "id": f"e{n}", "result": result}

    def state(self, sid: str = "s1") -> object:
        """The session's state as the conductor's status shows it (the session tools)."""
        sessions = self.chain.status()["sessions"]
        assert isinstance(sessions, list)
        [record] = [r for r in sessions if r["sessionId"] == sid]
        return record["state"]


def idle(sid: str = "s1", **meta: Any) -> dict[str, Any]:
    return {"sessionId": sid, "update": {"sessionUpdate": "state_update", "state": "idle",
                                         "stopReason": "end_turn", **meta}}


def wrapped(method: str, params: Any) -> dict[str, Any]:
    return {"jsonrpc": "2.0", "method": "_proxy/successor",
            "params": {"method": method, "params": params}}


@pytest.mark.parametrize("version", [1, 2])
async def test_a_turn_at_the_successor_keeps_its_session_busy_until_it_ends_as_its_version_says(
        version: int) -> None:
    # v2: the prompt's answer only accepts it; the turn runs until our successor's idle
    # state update. v1: the answer ends it, as it always did.
    h = ProxyMode()
    await h.start(version)
    await h.turn_accepted()
    assert h.state() == ("prompting" if version == 2 else "idle")
    await h.from_successor("session/update", idle())
    assert h.boxes[0].sent == [wrapped("session/update", idle())]  # passed on, unchanged
    assert h.state() == "idle"


async def test_a_turn_the_successor_holds_past_prompt_timeout_is_cancelled_at_the_successor(
        ) -> None:
    # The turn was sent on wrapped, to our successor: its session/cancel must go the same
    # way. Sent plain on the client's connection it went up, to the editor, as if the inner
    # chain asked the editor to cancel, and the successor's turn ran on.
    h = ProxyMode(timeouts=Timeouts(prompt=0.2))
    await h.start()
    async with anyio.create_task_group() as tg:
        tg.start_soon(h.chain.serve_timers)
        await h.from_client({"id": "p", "method": "session/prompt",
                             "params": {"sessionId": "s1", "prompt": []}})
        h.boxes[0].sent.clear()  # the turn, on its way through proxy:0
        await h.from_proxy(0, {"id": 7, "method": "_proxy/successor",
                               "params": {"method": "session/prompt",
                                          "params": {"sessionId": "s1", "prompt": []}}})
        [wrapped] = h.client.sent
        with anyio.fail_after(5):
            while not h.boxes[0].sent:
                await h.boxes[0].changed.wait()
        tg.cancel_scope.cancel()
    [timed_out] = h.boxes[0].sent
    assert timed_out["id"] == 7 and timed_out["error"]["code"] == -33005
    cancels = h.client.sent[1:]
    assert {"jsonrpc": "2.0", "method": "$/cancel_request",
            "params": {"requestId": wrapped["id"]}} in cancels
    assert {"jsonrpc": "2.0", "method": "_proxy/successor",
            "params": {"method": "session/cancel", "params": {"sessionId": "s1"}}} in cancels
    assert all(c.get("method") != "session/cancel" for c in cancels), cancels



async def test_a_turn_a_failed_proxy_left_at_the_successor_is_cancelled_there() -> None:
    # Nobody can take its answer, and a turn left running holds its session: a retried
    # prompt would wait behind it (as for an agent: Chain.fail_hop).
    from conductor.errors import ComponentExitedError

    h = ProxyMode()
    await h.start()
    await h.from_client({"id": "p", "method": "session/prompt",
                         "params": {"sessionId": "s1", "prompt": []}})
    h.boxes[0].sent.clear()
    await h.from_proxy(0, {"id": 7, "method": "_proxy/successor",
                           "params": {"method": "session/prompt",
                                      "params": {"sessionId": "s1", "prompt": []}}})
    [wrapped] = h.client.sent
    with anyio.fail_after(5):
        await h.chain.fail_hop(h.wires[0], ComponentExitedError("proxy:0", 7, []))
    sent = h.client.sent[1:]
    assert sent.count({"jsonrpc": "2.0", "method": "$/cancel_request",
                       "params": {"requestId": wrapped["id"]}}) == 1, sent
    assert {"jsonrpc": "2.0", "method": "_proxy/successor",
            "params": {"method": "session/cancel", "params": {"sessionId": "s1"}}} in sent
    [failed] = [m for m in sent if m.get("id") == "p"]
    assert failed["error"]["data"]["component"] == "proxy:0"


async def test_an_mcp_message_from_the_successor_for_an_unknown_server_is_refused_naming_it(
        ) -> None:
    # What was refused is the MCP method inside the envelope, not the envelope.
    h = ProxyMode()
    await h.start()
    await h.from_client({"id": "c", "method": "_proxy/successor",
                         "params": {"method": "mcp/connect", "params": {"serverId": "nope"}}})
    await h.from_client({"id": "m", "method": "_proxy/successor",
                         "params": {"method": "mcp/message",
                                    "params": {"connectionId": "gone", "method": "x"}}})
    connect, message = h.client.sent
    assert connect["error"]["code"] == -32602
    assert connect["error"]["data"] == {"serverId": "nope", "method": "mcp/connect"}
    assert message["error"]["data"] == {"connectionId": "gone", "method": "mcp/message"}


async def test_an_answer_from_the_client_that_is_not_json_fails_the_request_it_answers(
        ) -> None:
    # In proxy mode the client's pipe carries our successor's answers: one cut short (or
    # otherwise broken) must fail the envelope request it answers, naming the client, as
    # for any component; answered only with a parse error, the proxy that asked waited for
    # ever.
    h = ProxyMode()
    await h.start()
    await h.from_proxy(0, {"id": 9, "method": "_proxy/successor",
                           "params": {"method": "_x/ask", "params": {}}})
    [wrapped] = h.client.sent
    h.client.sent.clear()
    with anyio.fail_after(5):
        await h.chain.receive(h.client_wire, incoming(
            b'{"jsonrpc":"2.0","id":%d,"result":{"x": tru}}' % wrapped["id"]))
    [failed] = h.boxes[0].sent
    assert failed["id"] == 9
    assert failed["error"]["code"] == -32700
    assert failed["error"]["data"] == {"component": "client"}


@asynccontextmanager
async def initialized_past(proxy: Proxy) -> AsyncIterator[tuple[Outbox, Line]]:
    """A proxy-mode chain of one in-process `proxy`, initialized by its client (the outer
    conductor): the client's outbox, emptied, and what sends the chain a client line."""
    from conductor.plugins.host import open_inprocess_hop

    client = Outbox()
    client_wire = Hop("client", client)

    async def line(message: Any) -> None:
        with anyio.fail_after(5):
            await chain.receive(client_wire, decode(json.dumps(
                {"jsonrpc": "2.0", **message}).encode()))

    async with anyio.create_task_group() as tg:
        async def host(*, task_status: anyio.abc.TaskStatus[Hop]) -> None:
            async with open_inprocess_hop(proxy, chain.receive) as hop:
                task_status.started(hop)
                await anyio.sleep_forever()

        async def starter() -> list[ComponentLink]:
            return [ComponentLink("relay", Role.PROXY, await tg.start(host))]

        chain = Chain(client_wire, starter, proxy_mode=True)
        with anyio.fail_after(5):
            await line({"id": 0, "method": "_proxy/initialize",
                        "params": {"protocolVersion": 1}})
            while not client.sent:
                await client.changed.wait()
            init = client.sent.pop()
            await line({"id": init["id"], "result": {"protocolVersion": 1}})
            while not client.sent:
                await client.changed.wait()
            assert client.sent.pop()["id"] == 0
        yield client, line
        tg.cancel_scope.cancel()


async def test_a_turns_answer_from_the_successor_does_not_overtake_updates_in_a_plugins_dispatch(
        ) -> None:
    # The turn was routed past the in-process proxy (it has no handler for it), to our
    # successor, and its answer comes back past it too: behind the updates the proxy is
    # still handling, as in agent mode. Both ends being the client's hop, the answer went
    # straight out, before the turn's last updates.
    gate = anyio.Event()

    class SlowRelay(Proxy):
        @on("session/update", source="successor")
        async def relay(self, ctx: ProxyContext, message: Message) -> None:
            await gate.wait()
            await ctx.forward()

    async with initialized_past(SlowRelay()) as (client, line):
        with anyio.fail_after(5):
            await line({"id": "p", "method": "session/prompt",
                                     "params": {"sessionId": "s", "prompt": []}})
            [turn] = client.sent
            client.sent.clear()
            update = {"sessionId": "s", "update": {"sessionUpdate": "agent_message_chunk",
                                                   "content": {"type": "text", "text": "x"}}}
            await line({"method": "_proxy/successor", "params": {
                "method": "session/update", "params": update}})
            await line({"id": turn["id"], "result": {"stopReason": "end_turn"}})
            gate.set()
            while len(client.sent) < 2:
                await client.changed.wait()
    assert [m.get("method", m.get("id")) for m in client.sent] == ["session/update", "p"]


async def test_an_answer_to_the_successor_does_not_overtake_a_cancel_in_a_plugins_dispatch(
        ) -> None:
    # The other way: our successor's question went up past the proxy, and the answer
    # comes down past it, behind the session/cancel the editor sent before it.
    gate = anyio.Event()

    class SlowRelay(Proxy):
        @on("session/cancel")
        async def relay(self, ctx: ProxyContext, message: Message) -> None:
            await gate.wait()
            await ctx.forward()

    async with initialized_past(SlowRelay()) as (client, line):
        with anyio.fail_after(5):
            await line({"id": "q", "method": "_proxy/successor", "params": {
                "method": "session/request_permission", "params": {"sessionId": "s"}}})
            [asked] = client.sent
            client.sent.clear()
            await line({"method": "session/cancel", "params": {"sessionId": "s"}})
            await line({"id": asked["id"], "result": {"outcome": {
                "outcome": "cancelled"}}})
            gate.set()
            while len(client.sent) < 2:
                await client.changed.wait()
    assert [m.get("method", m.get("id")) for m in client.sent] == ["_proxy/successor", "q"]


async def test_a_session_setup_pipelined_behind_initialize_goes_on_to_the_successor_at_once(
        ) -> None:
    # Toward the agent a setup waits for its initialize answer (which MCP servers it takes);
    # our successor answers on the client's own connection, which that wait would block:
    # the setup sat 60 s, then went on with a warning.
    h = ProxyMode(proxies=0, mcp=McpInjection([McpServer("web", "http",
                                                         url="http://127.0.0.1:1/mcp")]))
    await h.from_client({"id": 0, "method": "_proxy/initialize",
                         "params": {"protocolVersion": 1}})
    await h.from_client({"id": 1, "method": "session/new",
                         "params": {"cwd": "/w", "mcpServers": []}})  # within 5 s
    initialize, setup = h.client.sent
    assert initialize["params"]["method"] == "initialize"
    assert setup["params"]["method"] == "session/new"


async def test_a_v2_turn_the_successor_does_not_end_within_prompt_timeout_ends_naming_it(
        ) -> None:
    h = ProxyMode(timeouts=Timeouts(prompt=0.2))
    await h.start(2)
    async with anyio.create_task_group() as tg:
        tg.start_soon(h.chain.serve_timers)
        with anyio.fail_after(5):
            while h.chain._timers is None:  # its turns' deadlines start there
                await anyio.lowlevel.checkpoint()
        await h.turn_accepted()
        with anyio.fail_after(5):
            while not h.boxes[0].sent:
                await h.boxes[0].changed.wait()
        tg.cancel_scope.cancel()
    [ended] = h.boxes[0].sent  # as from our successor: wrapped
    assert ended["method"] == "_proxy/successor"
    update = ended["params"]["params"]["update"]
    assert update["state"] == "idle" and "stopReason" not in update
    error = update["_meta"]["acp-conductor"]["error"]
    assert error["code"] == -33005
    assert error["data"] == {"component": "successor", "method": "session/prompt",
                             "timeout": 0.2}
    # The turn is stopped where it runs: at our successor, wrapped (plain, it went up).
    assert h.client.sent == [wrapped("session/cancel", {"sessionId": "s1"})]
    assert h.state() == "idle"
    await h.from_successor("session/update", idle(stopReason="cancelled"))  # its late idle
    assert len(h.boxes[0].sent) == 1  # dropped: proxy:0 was told the turn ended


async def test_a_v2_turn_at_the_successor_ends_for_the_editor_when_an_inner_proxy_fails(
        ) -> None:
    from conductor.errors import ComponentExitedError

    h = ProxyMode()
    await h.start(2)
    await h.turn_accepted()
    with anyio.fail_after(5):
        await h.chain.fail_hop(h.wires[0], ComponentExitedError("proxy:0", 7, []))
    [ended, cancel] = h.client.sent
    assert ended["method"] == "session/update"  # plain: from the failed proxy, going up
    error = ended["params"]["update"]["_meta"]["acp-conductor"]["error"]
    assert ended["params"]["update"]["state"] == "idle"
    assert error["code"] == -33001 and error["data"]["component"] == "proxy:0"
    assert cancel == wrapped("session/cancel", {"sessionId": "s1"})
    assert h.state() == "idle"
    await h.from_successor("session/update", idle(stopReason="cancelled"))
    assert len(h.client.sent) == 2  # its late idle is dropped
