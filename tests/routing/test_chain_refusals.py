"""What the router refuses, driven in memory through the real decoder and Chain: frames and
payloads nested too deeply to decode."""

from __future__ import annotations

import json
from typing import Any

import anyio
from hypothesis import given, settings
from hypothesis import strategies as st

from conductor.jsonrpc.message import UNSET, Message, Raw, decode, encode
from conductor.routing.chain import Chain, ComponentLink, Role
from conductor.routing.wire import Pending, Wire
from conductor.testing import ScriptedAgent, open_test_chain
from proxies.passthrough import Passthrough


class Outbox:
    """A MessageSink that keeps each send as it was made: a message, or a batch (a list)."""

    def __init__(self) -> None:
        self.sent: list[Any] = []
        self.raw: list[Message] = []  # every message, undecoded (deep payloads stay bytes)

    async def send(self, item: Message | list[Message]) -> None:
        self.raw.extend(item if isinstance(item, list) else [item])
        if isinstance(item, list):
            self.sent.append([json.loads(encode(m)) for m in item])
        else:
            try:
                self.sent.append(json.loads(encode(item)))
            except RecursionError:  # too deep for json: see `raw`
                self.sent.append({"deep": True})

    async def aclose(self) -> None:
        pass


class Harness:
    """client -> agent, both ends in the test's hands."""

    def __init__(self) -> None:
        self.client, self.agent = Outbox(), Outbox()
        self.client_wire, self.agent_wire = Wire("client", self.client), Wire("agent", self.agent)

        async def starter() -> list[ComponentLink]:
            return [ComponentLink("agent", Role.AGENT, self.agent_wire)]

        self.chain = Chain(self.client_wire, starter)

    async def line(self, wire: Wire, data: bytes) -> None:
        with anyio.fail_after(5):
            await self.chain.receive(wire, decode(data))

    async def start(self) -> None:
        await self.line(self.client_wire, b'{"jsonrpc":"2.0","id":0,"method":"initialize",'
                                          b'"params":{"protocolVersion":1}}')
        asked = self.agent.sent.pop()
        await self.line(self.agent_wire, b'{"jsonrpc":"2.0","id":%d,"result":{}}' % asked["id"])
        assert self.client.sent.pop() == {"jsonrpc": "2.0", "id": 0, "result": {}}

    async def answer_everything(self) -> None:
        """The agent answers each request it got with {"echo": <its params>}."""
        while self.agent.sent:
            asked = self.agent.sent.pop(0)
            if "id" in asked:
                await self.line(self.agent_wire, json.dumps(
                    {"jsonrpc": "2.0", "id": asked["id"],
                     "result": {"echo": asked.get("params")}}).encode())


# -- payloads nested deeper than the router's helpers can decode -------------------------------

async def test_session_traffic_with_params_too_deep_to_inspect_still_crosses_untouched(
        ) -> None:
    deep = Raw(b'{"sessionId":' + b"[" * 5000 + b"]" * 5000 + b',"prompt":[]}')
    agent = ScriptedAgent()
    async with open_test_chain([], agent) as client:
        with anyio.fail_after(5):
            for method in ("session/new", "session/prompt", "session/close"):
                answer = await client.request(method, deep)
                assert answer.error is UNSET, answer
    assert [bytes(m.params) for m in agent.received  # type: ignore[arg-type]
            if m.method != "initialize"] == [bytes(deep)] * 3


async def test_a_proxy_envelope_too_deep_to_unwrap_is_answered_and_the_chain_goes_on() -> None:
    deep = Raw(b'{"cwd":"/","x":' + b"[" * 5000 + b"]" * 5000 + b"}")
    agent = ScriptedAgent(replies={"_test/echo": {"ok": True}})
    async with open_test_chain([Passthrough()], agent) as client:
        with anyio.fail_after(5):
            answer = await client.request("session/new", deep)  # always visits the proxy
            assert answer.error is not UNSET  # the proxy's envelope could not be unwrapped
            assert "nested too deeply" in json.dumps(answer.error_value())
            assert await client.call("_test/echo", {}) == {"ok": True}


# -- any depth, through the router's own frame reader ------------------------------------------

@settings(max_examples=40, deadline=None)
@given(depth=st.integers(0, 3000), kind=st.sampled_from(["request", "id-last", "notification",
                                                          "batch", "answer"]))
def test_a_frame_of_any_nesting_depth_gets_one_answer_or_crosses_untouched(
        depth: int, kind: str) -> None:
    from conductor.run import _serve_wire
    from conductor.transport.memory import memory_pipe

    inner = b"[" * depth + b"]" * depth
    frame = {
        "request": b'{"jsonrpc":"2.0","id":5,"method":"_x/m","params":[' + inner + b"]}",
        "id-last": b'{"jsonrpc":"2.0","method":"_x/m","params":[' + inner + b'],"id":5}',
        "notification": b'{"jsonrpc":"2.0","method":"_x/m","params":[' + inner + b"]}",
        "batch": b'[{"jsonrpc":"2.0","id":5,"method":"_x/m","params":[' + inner + b"]}]",
        "answer": b'{"jsonrpc":"2.0","id":5,"result":[' + inner + b"]}",
    }[kind]

    async def not_json(frame: bytes | bytearray, error: Exception) -> None:
        raise AssertionError(f"valid JSON taken for noise: {error}")

    async def scenario() -> None:
        h = Harness()
        await h.start()
        wire = h.client_wire
        if kind == "answer":  # the agent answers a request the client made: id 5 on its hop
            for _ in range(3):  # initialize was 1: the client's request will be 5
                h.agent_wire.allocate(Pending("_x/pad", None, None))
            await h.line(h.client_wire, b'{"jsonrpc":"2.0","id":"q","method":"_x/q",'
                                        b'"params":{}}')
            wire = h.agent_wire
        send, receive = memory_pipe()
        with anyio.fail_after(10):
            async with receive, anyio.create_task_group() as tg:
                tg.start_soon(_serve_wire, h.chain, wire, receive, 1 << 20, not_json)
                await send.send(frame + b"\n")
                await send.send(b'{"jsonrpc":"2.0","id":"after","method":"_x/after",'
                                b'"params":{}}\n')
                await send.aclose()
        if kind == "answer":  # exactly one answer reaches the client: the result, or an error
            [answered] = [m for m in h.client.raw if m.is_response and bytes(m.id) == b'"q"']  # type: ignore[arg-type]
            if answered.error is UNSET:
                assert bytes(answered.result) == b"[" + inner + b"]"  # type: ignore[arg-type]
            else:
                assert b"agent sent a message that is nested too deeply" in bytes(answered.error)
            return
        forwarded = [m for m in h.agent.raw if m.method == "_x/m"]
        answers = [m for m in h.client.sent
                   if isinstance(m, list) or m.get("id") in (5, None)]
        if kind == "notification":
            assert answers == []
            assert len(forwarded) <= 1
        elif forwarded:  # it crossed: untouched, and not answered by the conductor
            assert [bytes(m.params) for m in forwarded] == [b"[" + inner + b"]"]  # type: ignore[arg-type]
            assert answers == []
        else:  # refused: exactly one answer, by id (a batch as a whole, id null)
            [refused] = answers
            assert refused["id"] == (None if kind == "batch" else 5)
            assert refused["error"]["code"] == -32600
            assert "nested too deeply" in refused["error"]["message"]
        assert [m for m in h.agent.raw if m.method == "_x/after"]  # everything else carries on

    anyio.run(scenario)
