"""What the router refuses, driven in memory through the real decoder and Chain: envelopes
that break JSON-RPC 2.0, and batches whose answers must all come back in their array."""

from __future__ import annotations

import json
from typing import Any

import anyio
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from acp_conductor_proxies.passthrough import Passthrough
from conductor.jsonrpc.message import UNSET, Message, Raw, Response, decode, encode
from conductor.routing.chain import Chain
from conductor.routing.roles import Role
from conductor.routing.topology import ComponentLink, Hop
from conductor.testing import ScriptedAgent, open_test_chain
from conductor.transport.pipes import PipeSource


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
        self.client_wire, self.agent_wire = Hop("client", self.client), Hop("agent", self.agent)

        async def starter() -> list[ComponentLink]:
            return [ComponentLink("agent", Role.AGENT, self.agent_wire)]

        self.chain = Chain(self.client_wire, starter)

    async def line(self, wire: Hop, data: bytes) -> None:
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


LENIENT = [
    pytest.param(b'{"jsonrpc":"1.0","id":7,"method":"_test/echo","params":{}}', "2.0",
                 id="jsonrpc-1.0"),
    pytest.param(b'{"id":7,"method":"_test/echo","params":{}}', "missing", id="no-jsonrpc"),
    pytest.param(b'{"jsonrpc":"2.0","id":7,"method":"_test/echo","params":5}',
                 "object or an array", id="params-5"),
    pytest.param(b'{"jsonrpc":"2.0","id":7,"method":"_test/echo","params":"x"}',
                 "object or an array", id="params-string"),
]


@pytest.mark.parametrize(("frame", "why"), LENIENT)
async def test_a_request_that_breaks_json_rpc_2_is_refused_and_not_forwarded(
        frame: bytes, why: str) -> None:
    h = Harness()
    await h.start()
    await h.line(h.client_wire, frame)
    [refused] = h.client.sent
    assert refused["id"] == 7
    assert refused["error"]["code"] == -32600
    assert why in refused["error"]["data"]
    assert h.agent.sent == []


@pytest.mark.parametrize(("frame", "why"), LENIENT)
async def test_a_notification_that_breaks_json_rpc_2_is_dropped_unanswered(
        frame: bytes, why: str) -> None:
    h = Harness()
    await h.start()
    await h.line(h.client_wire, frame.replace(b'"id":7,', b""))
    await h.line(h.agent_wire, frame.replace(b'"id":7,', b""))
    assert h.client.sent == []
    assert h.agent.sent == []


async def test_a_request_from_the_agent_that_breaks_json_rpc_2_is_refused_to_the_agent() -> None:
    h = Harness()
    await h.start()
    await h.line(h.agent_wire, b'{"id":"a1","method":"fs/read_text_file","params":{}}')
    assert h.client.sent == []
    [refused] = h.agent.sent
    assert (refused["id"], refused["error"]["code"]) == ("a1", -32600)


async def test_params_null_is_accepted_as_no_params() -> None:
    h = Harness()
    await h.start()
    await h.line(h.client_wire, b'{"jsonrpc":"2.0","id":7,"method":"_test/echo","params":null}')
    [forwarded] = h.agent.sent
    assert forwarded["method"] == "_test/echo"
    assert forwarded["params"] is None


async def test_an_answer_without_jsonrpc_still_answers_its_request() -> None:
    h = Harness()
    await h.start()
    await h.line(h.client_wire, b'{"jsonrpc":"2.0","id":7,"method":"_test/echo","params":{}}')
    [asked] = h.agent.sent
    await h.line(h.agent_wire, b'{"id":%d,"result":{"ok":true}}' % asked["id"])
    # The conductor writes its own envelope: the client gets a proper 2.0 answer.
    assert h.client.sent == [{"jsonrpc": "2.0", "id": 7, "result": {"ok": True}}]


async def test_a_cancel_sent_as_a_request_is_refused_instead_of_left_unanswered() -> None:
    h = Harness()
    await h.start()
    await h.line(h.client_wire, b'[{"jsonrpc":"2.0","id":1,"method":"_test/echo","params":{}},'
                                b'{"jsonrpc":"2.0","id":2,"method":"$/cancel_request",'
                                b'"params":{"requestId":1}}]')
    await h.answer_everything()
    [batch] = h.client.sent
    by_id = {r["id"]: r for r in batch}
    assert by_id[2]["error"]["code"] == -32600
    assert "result" in by_id[1]


@pytest.mark.parametrize("ids", [
    pytest.param([1, 1], id="duplicate"),
    pytest.param([1.5, 2], id="float"),
    pytest.param([1.0, 1], id="float-and-int"),
    pytest.param(["a", "a", "a", 3], id="three-times"),
])
async def test_every_answer_to_a_batch_comes_back_inside_its_array(ids: list[object]) -> None:
    h = Harness()
    await h.start()
    members = [f'{{"jsonrpc":"2.0","id":{json.dumps(i)},"method":"_test/echo","params":[{n}]}}'
               for n, i in enumerate(ids)]
    await h.line(h.client_wire, ("[" + ",".join(members) + "]").encode())
    await h.answer_everything()
    [batch] = h.client.sent
    assert isinstance(batch, list)
    assert sorted(r["result"]["echo"][0] for r in batch) == list(range(len(ids)))
    assert sorted(map(json.dumps, (r["id"] for r in batch))) == sorted(map(json.dumps, ids))


ident = st.sampled_from(["1", "1.0", "1.5", "-2", '"a"', '"1"', "null", "1e2"])
member = st.one_of(
    st.tuples(st.just("request"), ident),
    st.tuples(st.just("notification"), st.none()),
    st.tuples(st.just("invalid"), ident),
    st.tuples(st.just("answer"), ident))


@settings(max_examples=60, deadline=None)
@given(members=st.lists(member, min_size=1, max_size=8))
def test_a_batch_gets_all_its_answers_in_one_array_and_nothing_outside_it(
        members: list[tuple[str, str | None]]) -> None:
    async def scenario() -> None:
        h = Harness()
        await h.start()
        parts, answered = [], 0
        for n, (kind, i) in enumerate(members):
            if kind == "request":
                parts.append(f'{{"jsonrpc":"2.0","id":{i},"method":"_test/echo","params":[{n}]}}')
                answered += 1
            elif kind == "notification":
                parts.append('{"jsonrpc":"2.0","method":"_ext/note","params":{}}')
            elif kind == "invalid":  # call-shaped junk: answered inside the array
                parts.append(f'{{"jsonrpc":"2.0","id":{i},"method":"_test/echo","params":5}}')
                answered += 1
            else:  # response-shaped junk: never answered
                parts.append(f'{{"jsonrpc":"2.0","id":{i},"result":{{}}}}')
        await h.line(h.client_wire, ("[" + ",".join(parts) + "]").encode())
        await h.answer_everything()
        if answered == 0:
            assert h.client.sent == []
            return
        [batch] = h.client.sent  # one send: the array, nothing outside it
        assert isinstance(batch, list)
        assert len(batch) == answered

    anyio.run(scenario)


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
    from conductor.transport.memory import memory_pipe

    inner = b"[" * depth + b"]" * depth
    frame = {
        "request": b'{"jsonrpc":"2.0","id":5,"method":"_x/m","params":[' + inner + b"]}",
        "id-last": b'{"jsonrpc":"2.0","method":"_x/m","params":[' + inner + b'],"id":5}',
        "notification": b'{"jsonrpc":"2.0","method":"_x/m","params":[' + inner + b"]}",
        "batch": b'[{"jsonrpc":"2.0","id":5,"method":"_x/m","params":[' + inner + b"]}]",
        "answer": b'{"jsonrpc":"2.0","id":5,"result":[' + inner + b"]}",
    }[kind]

    async def scenario() -> None:
        h = Harness()
        await h.start()
        wire = h.client_wire
        if kind == "answer":  # the agent answers a request the client made: id 5 on its hop
            for _ in range(3):  # initialize was 1: the client's request will be 5
                h.agent_wire.open_request("_x/pad")
            await h.line(h.client_wire, b'{"jsonrpc":"2.0","id":"q","method":"_x/q",'
                                        b'"params":{}}')
            wire = h.agent_wire
        send, receive = memory_pipe()
        with anyio.fail_after(10):
            async with receive, anyio.create_task_group() as tg:
                async def route(item: object) -> None:
                    assert type(item).__name__ != "NotJson", f"valid JSON taken for noise: {item}"
                    await h.chain.receive(wire, item)  # type: ignore[arg-type]
                tg.start_soon(PipeSource(receive, max_frame_bytes=1 << 20).serve, route)
                await send.send(frame + b"\n")
                await send.send(b'{"jsonrpc":"2.0","id":"after","method":"_x/after",'
                                b'"params":{}}\n')
                await send.aclose()
        if kind == "answer":  # exactly one answer reaches the client: the result, or an error
            [answered] = [m for m in h.client.raw
                          if isinstance(m, Response) and bytes(m.id) == b'"q"']
            if answered.error is UNSET:
                assert bytes(answered.result) == b"[" + inner + b"]"  # type: ignore[arg-type]
            else:
                assert b"agent sent a message that is nested too deeply" in bytes(answered.error)
            return
        forwarded = [m for m in h.agent.raw if getattr(m, "method", None) == "_x/m"]
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
        assert [m for m in h.agent.raw if getattr(m, "method", None) == "_x/after"]

    anyio.run(scenario)


async def from_proxy_after_initialize(frame: bytes) -> tuple[Outbox, Outbox]:
    """A chain of one proxy and an agent, initialized; `frame` arrives from the proxy.
    Returns what the proxy and the agent were sent."""
    client, proxy, agent = Outbox(), Outbox(), Outbox()
    client_wire, proxy_wire = Hop("client", client), Hop("p0", proxy)

    async def starter() -> list[ComponentLink]:
        return [ComponentLink("p0", Role.PROXY, proxy_wire),
                ComponentLink("agent", Role.AGENT, Hop("agent", agent))]

    chain = Chain(client_wire, starter)
    with anyio.fail_after(5):
        await chain.receive(client_wire, decode(
            b'{"jsonrpc":"2.0","id":0,"method":"initialize","params":{"protocolVersion":1}}'))
        await chain.receive(proxy_wire, decode(frame))
    return proxy, agent


@pytest.mark.parametrize("inner", [b"5", b'"text"', b"true"])
async def test_an_envelope_whose_inner_params_are_not_structured_is_refused_not_forwarded(
        inner: bytes) -> None:
    # JSON-RPC 2.0 §4.2: params is an object or an array. The router refuses such a frame
    # on a plain hop; unwrapped from an envelope it must not reach the next hop either.
    proxy, agent = await from_proxy_after_initialize(
        b'{"jsonrpc":"2.0","id":"e","method":"_proxy/successor",'
        b'"params":{"method":"_x/a","params":' + inner + b"}}")
    assert agent.sent == []
    [answer] = [m for m in proxy.sent if m.get("id") == "e"]
    assert answer["error"]["code"] == -32602
    assert "params must be an object or an array" in answer["error"]["data"]


@pytest.mark.parametrize("wrapper", ["_proxy/successor", "proxy/successor",
                                     "_proxy/successor/request"])
async def test_a_wrapped_cancel_sent_as_a_request_is_answered_not_left_pending(
        wrapper: str) -> None:
    # As a plain `$/cancel_request` with an id is refused: a cancel has no answer of its
    # own, so an envelope request carrying one would wait for ever.
    proxy, _ = await from_proxy_after_initialize(
        b'{"jsonrpc":"2.0","id":"z","method":"' + wrapper.encode() + b'",'
        b'"params":{"method":"$/cancel_request","params":{"requestId":"e1"}}}')
    [answer] = [m for m in proxy.sent if m.get("id") == "z"]
    assert answer["error"]["code"] == -32600
    assert "notification" in answer["error"]["data"]


async def test_requests_after_a_failed_start_are_told_why_it_failed_not_to_send_initialize(
        ) -> None:
    # An editor writes its next requests without waiting for the initialize answer; when
    # the chain could not start, each must hear that, not "the first message must be
    # `initialize`", which it was.
    from conductor.errors import ComponentStartError

    client = Outbox()
    client_wire = Hop("client", client)

    async def starter() -> list[ComponentLink]:
        raise ComponentStartError("agent", "command not found: no-such-agent")

    chain = Chain(client_wire, starter)
    with anyio.fail_after(5):
        for frame in (b'{"jsonrpc":"2.0","id":0,"method":"initialize","params":'
                      b'{"protocolVersion":1}}',
                      b'{"jsonrpc":"2.0","id":1,"method":"session/new","params":'
                      b'{"cwd":"/","mcpServers":[]}}',
                      b'{"jsonrpc":"2.0","method":"session/cancel","params":{"sessionId":"s"}}'):
            await chain.receive(client_wire, decode(frame))
    assert [m["id"] for m in client.sent] == [0, 1]  # the notification is not answered
    for answer in client.sent:
        assert answer["error"]["data"]["component"] == "agent", answer
        assert "command not found: no-such-agent" in answer["error"]["message"], answer


SUCCESSOR_SPELLINGS = ["_proxy/successor", "proxy/successor", "_proxy/successor/request"]


@pytest.mark.parametrize("wrapper", SUCCESSOR_SPELLINGS)
async def test_a_successor_envelope_from_the_editor_or_the_agent_is_refused_not_forwarded(
        wrapper: str) -> None:
    # Only a proxy wraps for its successor. Passed on, the editor's envelope would reach the
    # first proxy as if its successor had sent it (the editor posing as the agent), and the
    # agent's would reach the last proxy wrapped twice.
    h = Harness()
    await h.start()
    envelope = {"jsonrpc": "2.0", "id": 3, "method": wrapper,
                "params": {"method": "session/request_permission",
                           "params": {"sessionId": "S"}}}
    await h.line(h.client_wire, json.dumps(envelope).encode())
    await h.line(h.agent_wire, json.dumps(envelope).encode())
    await h.line(h.agent_wire, json.dumps({k: v for k, v in envelope.items()
                                           if k != "id"}).encode())
    for refused in (h.client.sent, h.agent.sent):
        [answer] = refused
        assert answer["id"] == 3
        assert answer["error"]["code"] == -32600
        assert "only sent by a proxy" in answer["error"]["data"]


@pytest.mark.parametrize("inner", SUCCESSOR_SPELLINGS)
async def test_an_envelope_nested_in_an_envelope_is_refused_not_unwrapped_once_and_passed_on(
        inner: str) -> None:
    # Passed on, the inner envelope would reach the next proxy as if that proxy's own
    # successor had sent it: one proxy speaking for a component further down.
    proxy, agent = await from_proxy_after_initialize(
        b'{"jsonrpc":"2.0","id":"z","method":"_proxy/successor","params":{"method":"'
        + inner.encode() + b'","params":{"method":"_x/y","params":{}}}}')
    assert [m for m in agent.sent if m.get("method") != "initialize"] == []
    [answer] = [m for m in proxy.sent if m.get("id") == "z"]
    assert answer["error"]["code"] == -32600
    assert "only sent by a proxy" in answer["error"]["data"]


@pytest.mark.parametrize("ident", [b"1.5", b"1e3", b"2.0"])
async def test_a_request_whose_id_has_a_fraction_stays_open_until_answered(
        ident: bytes) -> None:
    # Such an id cannot be named by a cancel, but its request is as open as any other: the
    # editor's EOF grace (serve.py waits for `wait_quiet`) must wait for its answer too.
    h = Harness()
    await h.start()
    await h.line(h.client_wire,
                 b'{"jsonrpc":"2.0","id":' + ident + b',"method":"_x/slow","params":{}}')
    assert h.client_wire.inbound  # open: an EOF now would wait for it
    await h.line(h.client_wire, b'{"jsonrpc":"2.0","method":"$/cancel_request",'
                                b'"params":{"requestId":' + ident + b"}}")
    assert [m["method"] for m in h.agent.sent] == ["_x/slow"]  # the cancel named nothing
    await h.answer_everything()
    assert bytes(h.client.raw[-1].id) == ident  # type: ignore[union-attr]
    with anyio.fail_after(5):
        await h.client_wire.wait_quiet()
    assert not h.client_wire.inbound


@pytest.mark.parametrize("answer", [
    pytest.param('{"jsonrpc":"2.0","id":ID,"result":{},"error":{"code":1,"message":"no"}}',
                 id="result-and-error"),
    pytest.param('{"jsonrpc":"1.0","id":ID,"result":{}}', id="jsonrpc-1.0"),
    pytest.param('{"jsonrpc":"2.0","id":ID}', id="neither"),
])
async def test_an_invalid_answer_fails_the_request_it_names_naming_the_sender(
        answer: str) -> None:
    # Before, it was dropped as response-shaped junk, and the editor waited for ever for an
    # answer the agent had sent (a broken one): an answer that is not JSON already failed it.
    h = Harness()
    await h.start()
    await h.line(h.client_wire, b'{"jsonrpc":"2.0","id":7,"method":"_test/echo","params":{}}')
    asked = h.agent.sent.pop()
    await h.line(h.agent_wire, answer.replace("ID", json.dumps(asked["id"])).encode())
    [failed] = h.client.sent
    assert failed["id"] == 7
    assert failed["error"]["data"]["component"] == "agent"
    assert "agent" in failed["error"]["message"]
    assert h.agent.sent == []  # the agent is not answered for its answer


async def test_an_answer_whose_id_is_a_string_of_thousands_of_digits_is_an_unknown_id() -> None:
    # "7" is taken for 7, but int() refuses a string of more than 4,300 digits: that must
    # stay an answer for an unknown id (logged), not end the conductor with a ValueError.
    h = Harness()
    await h.start()
    await h.line(h.client_wire, b'{"jsonrpc":"2.0","id":7,"method":"_test/echo","params":{}}')
    await h.line(h.agent_wire, b'{"jsonrpc":"2.0","id":"%s","result":{}}' % (b"9" * 5000))
    await h.answer_everything()
    [answered] = h.client.sent
    assert answered["id"] == 7
    assert "result" in answered


async def test_a_request_without_its_method_is_refused_and_fails_no_request_of_the_same_id(
        ) -> None:
    # `params` and an id but no `method` (a misspelt member) is a broken request, not a
    # broken answer: it gets its -32600, and the agent's permission request that happens
    # to be open at the editor under that id is still answered by the editor.
    h = Harness()
    await h.start()
    await h.line(h.agent_wire, b'{"jsonrpc":"2.0","id":"p","method":"session/request_'
                               b'permission","params":{"sessionId":"s","options":[]}}')
    [asked] = h.client.sent
    h.client.sent.clear()
    await h.line(h.client_wire, json.dumps({"jsonrpc": "2.0", "id": asked["id"],
                                            "methd": "session/prompt",
                                            "params": {"sessionId": "s"}}).encode())
    [refused] = h.client.sent
    assert refused["id"] == asked["id"]
    assert refused["error"]["code"] == -32600
    assert h.agent.sent == []  # the agent's request is not failed
    await h.line(h.client_wire, json.dumps({"jsonrpc": "2.0", "id": asked["id"],
                                            "result": {"outcome": "ok"}}).encode())
    [answered] = h.agent.sent
    assert answered == {"jsonrpc": "2.0", "id": "p", "result": {"outcome": "ok"}}
