"""Whole frames, fuzzed, through a running router: both of its wires are arbitrary.

Hypothesis writes frames onto the pipes of a real router (framing, decoding, routing):
the editor's, and the agent's. Requests, notifications, answers and batches with
arbitrary JSON (any depth, including past what can be decoded) as params, ids and
`_meta`, and arbitrary bytes between frames (invalid UTF-8, noise). Whatever arrives:
- the router does not crash, and still serves a request afterwards;
- every request with an id of its own gets exactly one answer (from the far end, or an
  error from the conductor) or crosses to the other side (an agent's request to the
  editor);
- every line the router writes, on either wire, is UTF-8 JSON-RPC.
"""

from __future__ import annotations

import json
from typing import Any

import anyio
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from conductor.jsonrpc.message import Batch, Request
from conductor.routing.chain import Chain
from conductor.routing.roles import Role
from conductor.routing.topology import ComponentLink, Hop
from conductor.transport.memory import memory_pipe
from conductor.transport.pipes import PipeSink, PipeSource

METHODS = ["initialize", "session/new", "session/load", "session/resume", "session/prompt",
           "session/close", "session/cancel", "$/cancel_request", "_proxy/initialize",
           "_proxy/successor", "fs/read_text_file", "_ext/anything", ""]

json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner,
                                                               max_size=4),
    max_leaves=12)


@st.composite
def params(draw: st.DrawFn) -> str:
    """Params as JSON text: any value, a session-shaped object, or nesting past decoding."""
    kind = draw(st.sampled_from(["value", "session", "deep"]))
    if kind == "deep":
        # Past msgspec's limit (Python's recursion limit) even where Hypothesis raises it.
        depth = draw(st.integers(5000, 20000))
        return "[" * depth + "]" * depth
    value: Any = draw(json_values)
    if kind == "session":
        value = {"sessionId": draw(st.text(max_size=6)), "cwd": "/", "mcpServers": [],
                 "prompt": [], "_meta": draw(json_values), "requestId": draw(json_values)}
    return json.dumps(value, ensure_ascii=draw(st.booleans()))


@st.composite
def wire(draw: st.DrawFn, side: str) -> tuple[list[bytes], set[str]]:
    """A wire's frames, and the ids (JSON text) of the requests that must each get one
    answer or cross. `side`: "client" (ids n and "rn") or "agent" (ids "an", and each such
    request's method is `_fuzz/an`, so that its crossing can be recognised)."""
    out: list[bytes] = []
    tracked: set[str] = set()
    for n in range(draw(st.integers(0, 10))):
        shape = draw(st.sampled_from(["request", "request", "notification", "wild-id",
                                      "answer", "batch", "bytes"]))
        if side == "agent":
            method = json.dumps(f"_fuzz/a{n}")
        else:
            method = json.dumps(draw(st.sampled_from(METHODS) | st.text(max_size=5)))
        body = draw(params())
        if shape == "bytes":
            out.append(draw(st.binary(max_size=40)).replace(b"\n", b" "))
            continue
        if shape == "notification":
            out.append(f'{{"jsonrpc":"2.0","method":{method},"params":{body}}}'.encode(
                "utf-8", "surrogatepass"))
            continue
        if shape == "answer":  # to a request nobody sent, or with a wild id
            ident = json.dumps(draw(json_values))
            out.append(f'{{"jsonrpc":"2.0","id":{ident},"result":{body}}}'.encode(
                "utf-8", "surrogatepass"))
            continue
        if shape == "wild-id":  # never an int or a string: those are the tracked ids
            ident = json.dumps(draw(json_values.filter(
                lambda v: isinstance(v, bool) or not isinstance(v, int | str))))
        elif side == "agent":
            ident = json.dumps(f"a{n}")
        else:
            ident = json.dumps(draw(st.sampled_from([n, f"r{n}"])))
        # The id before or after the params: a scanner must find it either way.
        members = [f'"id":{ident}', f'"method":{method}', f'"params":{body}']
        if draw(st.booleans()):
            members.reverse()
        data = ("{" + ",".join(['"jsonrpc":"2.0"', *members]) + "}").encode(
            "utf-8", "surrogatepass")
        if shape == "batch":
            data = b"[" + data + b"]"
            # A batch that cannot be read gets one error, id null: its ids are unknown.
            if body.startswith("[" * 5000) or not _utf8(data):
                out.append(data)
                continue
        out.append(data)
        if shape != "wild-id":
            tracked.add(ident)
    return out, tracked


def _utf8(data: bytes) -> bool:
    try:
        data.decode("utf-8")
    except UnicodeDecodeError:
        return False
    return True


def messages(lines: list[bytes]) -> list[dict[str, Any]]:
    """Every message on a wire the router wrote, checked to be UTF-8 JSON-RPC."""
    out = []
    for line in lines:
        decoded = json.loads(line.decode("utf-8"))  # strict: the wire is UTF-8
        for msg in decoded if isinstance(decoded, list) else [decoded]:
            assert isinstance(msg, dict), line[:200]
            assert msg.get("jsonrpc") == "2.0", line[:200]
            out.append(msg)
    return out


def answers_by_id(lines: list[bytes]) -> dict[str, int]:
    counts: dict[str, int] = {}
    for msg in messages(lines):
        if "method" not in msg:
            key = json.dumps(msg.get("id"))
            counts[key] = counts.get(key, 0) + 1
    return counts


class Wires:
    """What the router wrote to the client and to the agent, line by line."""

    def __init__(self) -> None:
        self.client: list[bytes] = []
        self.agent: list[bytes] = []
        self.changed = anyio.Event()

    async def collect(self, stream: Any, into: list[bytes], tee: Any = None) -> None:
        """Record the lines read from `stream` (and pass the bytes on to `tee`)."""
        pending = b""
        async for chunk in stream:
            if tee is not None:
                await tee.send(chunk)
            *done, pending = (pending + chunk).split(b"\n")
            into.extend(done)
            self.changed.set()
            self.changed = anyio.Event()

    def settled(self, client_ids: set[str], agent_ids: set[str]) -> bool:
        """Each tracked request answered (or, for the agent's, crossed to the client)."""
        if not client_ids <= set(answers_by_id(self.client)):
            return False
        crossed = {json.dumps(m["method"].removeprefix("_fuzz/")) for m in
                   messages(self.client) if str(m.get("method", "")).startswith("_fuzz/")}
        return agent_ids <= set(answers_by_id(self.agent)) | crossed


async def run_router(client_wire: list[bytes], client_ids: set[str], agent_wire: list[bytes],
                     agent_ids: set[str]) -> Wires:
    """A router with a raw client and a raw agent. The agent answers initialize, then
    writes `agent_wire`, then answers every request with {}; the client writes
    `client_wire` after its initialize. Returns both wires once every tracked request
    has its answer (or crossed), and a last request after them all has been answered."""
    to_router, router_in = memory_pipe()       # the client's wire, in and out
    router_out, from_router = memory_pipe()
    agent_to_router, router_from_agent = memory_pipe()  # the agent's wire
    router_to_agent, agent_in = memory_pipe()
    agent_tee, agent_reads = memory_pipe()
    closing: list[Any] = [to_router, router_in, router_out, from_router, agent_to_router,
                          router_from_agent, router_to_agent, agent_in, agent_tee,
                          agent_reads]
    client = Hop("client", PipeSink(router_out))
    agent_hop = Hop("agent", PipeSink(router_to_agent))
    wires = Wires()
    started = anyio.Event()

    async def agent(item: Any) -> None:
        for msg in item.items if isinstance(item, Batch) else [item]:
            if not isinstance(msg, Request):
                continue  # answers to its requests, notifications, junk: nothing to do
            result = b'{"protocolVersion":1}' if msg.method == "initialize" else b"{}"
            await agent_to_router.send(b'{"jsonrpc":"2.0","id":' + bytes(msg.id)
                                       + b',"result":' + result + b"}\n")
            if msg.method == "initialize" and not started.is_set():
                for frame in agent_wire:
                    await agent_to_router.send(frame + b"\n")
                started.set()

    async with anyio.create_task_group() as tg:
        async def starter() -> list[ComponentLink]:
            return [ComponentLink("agent", Role.AGENT, agent_hop)]

        chain = Chain(client, starter)

        async def serve(source: Any, hop: Hop) -> None:
            async def handle(item: Any) -> None:
                await chain.receive(hop, item)
            await PipeSource(source).serve(handle)

        tg.start_soon(serve, router_in, client)
        tg.start_soon(serve, router_from_agent, agent_hop)
        tg.start_soon(PipeSource(agent_reads).serve, agent)
        tg.start_soon(wires.collect, from_router, wires.client)
        tg.start_soon(wires.collect, agent_in, wires.agent, agent_tee)
        try:
            with anyio.fail_after(5):
                await to_router.send(b'{"jsonrpc":"2.0","id":"init","method":"initialize",'
                                     b'"params":{"protocolVersion":1}}\n')
                await started.wait()
                for frame in client_wire:
                    await to_router.send(frame + b"\n")
                await to_router.send(b'{"jsonrpc":"2.0","id":"last","method":"session/new",'
                                     b'"params":{"cwd":"/","mcpServers":[]}}\n')
                want = client_ids | {'"init"', '"last"'}
                while not wires.settled(want, agent_ids):
                    await wires.changed.wait()
        except TimeoutError:
            raise AssertionError(f"not settled: client {sorted(client_ids)}, agent "
                                 f"{sorted(agent_ids)}; wires: {wires.client}, "
                                 f"{wires.agent}") from None
        finally:
            tg.cancel_scope.cancel()
            with anyio.CancelScope(shield=True):
                for stream in closing:
                    await stream.aclose()
    return wires


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(client=wire("client"), agent=wire("agent"))
def test_any_frames_on_either_wire_get_one_answer_per_request_and_stay_json_rpc(
        client: tuple[list[bytes], set[str]], agent: tuple[list[bytes], set[str]]) -> None:
    wires = anyio.run(run_router, *client, *agent)
    for ident, count in answers_by_id(wires.client).items():
        if ident in client[1]:
            assert count == 1, (ident, wires.client)
    for ident, count in answers_by_id(wires.agent).items():
        if ident in agent[1]:
            assert count == 1, (ident, wires.agent)
