"""A test kit for plugin authors: drive proxies through a real router, in memory.

    async def test_my_proxy_answers_prompts() -> None:
        agent = ScriptedAgent(replies={"session/prompt": {"stopReason": "end_turn"}})
        async with open_test_chain([MyProxy(MyOptions(...))], agent) as client:
            with anyio.fail_after(5):
                sid = await client.new_session("/tmp")
                await client.prompt(sid, "hello")
        assert agent.received_params("session/prompt")[0]["prompt"][0]["text"] == "hello"

The chain is the conductor's own `Chain` with each proxy hosted in-process exactly as
`use = ...` runs it. `transport="pipes"` puts real framing (encode, newline-split, decode)
on the client's and the agent's links; `open_process_client` drives a real conductor (or
any ACP agent command) over OS pipes with the same client.
"""

from __future__ import annotations

import itertools
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from contextlib import asynccontextmanager
from typing import TYPE_CHECKING, Any

import anyio

from conductor.errors import ComponentExitedError, RpcError
from conductor.jsonrpc.codes import ErrorCode
from conductor.jsonrpc.message import (
    Batch,
    JsonValue,
    Notification,
    Request,
    Response,
    payload,
)
from conductor.plugins.host import open_inprocess_hop
from conductor.routing.chain import Chain
from conductor.routing.topology import ComponentLink, Hop, Role
from conductor.rpc.endpoint import Endpoint
from conductor.transport.base import Unreadable
from conductor.transport.memory import open_link
from conductor.transport.pipes import PipeSink, PipeSource

if TYPE_CHECKING:
    from anyio.abc import TaskGroup

    from conductor.jsonrpc.message import Call
    from conductor.plugins.api import Proxy
    from conductor.tracing.sink import TraceSink
    from conductor.transport.base import Incoming, MessageSink
    from conductor.transport.memory import Transport

Script = JsonValue | Callable[["ScriptedAgent", Request], Awaitable[JsonValue]]
ClientScript = JsonValue | Callable[[Request], Awaitable[JsonValue]]


class TestPeer:
    """One end of a connection in a test: sends requests (answers matched by its
    `Endpoint`), answers what it is asked, and records every call that arrives."""

    __test__ = False  # not a pytest class

    def __init__(self, name: str) -> None:
        self.name = name
        self.endpoint: Endpoint | None = None
        self.received: list[Call] = []   # every request and notification that arrived
        self.batches: list[int] = []     # the size of every batch that arrived
        self.tg: TaskGroup | None = None
        self._changed = anyio.Event()

    def connect(self, sink: MessageSink, tg: TaskGroup) -> None:
        self.endpoint = Endpoint(self.name, sink)
        self.tg = tg

    @property
    def _ep(self) -> Endpoint:
        if self.endpoint is None:
            raise RuntimeError(f"{self.name} is not connected")
        return self.endpoint

    async def request(self, method: str, params: JsonValue = None, *,
                      ident: int | None = None) -> Response:
        """Send a request (with id `ident`, else the next free one); return the response."""
        return await self._ep.request(method, params, ident=ident)

    async def call(self, method: str, params: JsonValue = None) -> JsonValue:
        """request(), then the decoded result. Raises RpcError on an error answer."""
        return (await self._ep.call(method, params)).result_value()

    async def notify(self, method: str, params: JsonValue = None) -> None:
        await self._ep.notify(method, params)

    async def cancel(self, request_id: int) -> None:
        """Send `$/cancel_request` for one of our requests, by its id."""
        await self.notify("$/cancel_request", {"requestId": request_id})

    async def hang_up(self) -> None:
        """Close our side of the connection, as a process does when it exits (an agent that
        hangs up is a component that died: the router answers what it owed)."""
        await self._ep.sink.aclose()

    async def deliver(self, item: Incoming) -> None:
        """What arrived on the connection (called by the transport's reader)."""
        if isinstance(item, Batch):
            self.batches.append(len(item.items))
        items = item.items if isinstance(item, Batch) else [item]
        for message in items:
            if isinstance(message, Response):
                await self._ep.settle(message)
                continue
            if not isinstance(message, Request | Notification):
                raise AssertionError(f"{self.name} received something unusable: {message!r}")
            self.received.append(message)
            self._changed.set()
            self._changed = anyio.Event()
            if message.method == "$/cancel_request":
                await self._ep.cancel_inbound(message.params)
            elif isinstance(message, Request):
                assert self.tg is not None
                self.tg.start_soon(self._serve, message)

    async def _serve(self, request: Request) -> None:
        await self._ep.answer(request, self.answer)

    async def answer(self, message: Request) -> JsonValue:
        raise RpcError(ErrorCode.METHOD_NOT_FOUND, "Method not found", message.method)

    def received_params(self, method: str) -> list[JsonValue]:
        """The decoded params of every received `method` message, in order."""
        return [m.params_value() for m in self.received if m.method == method]

    async def wait_for(self, method: str, count: int = 1,
                       where: Callable[[JsonValue], bool] | None = None) -> list[JsonValue]:
        """Wait until `count` `method` messages (matching `where`) have arrived. Bound it
        with `anyio.fail_after` at the call site."""
        while True:
            found = [p for p in self.received_params(method) if where is None or where(p)]
            if len(found) >= count:
                return found
            await self._changed.wait()


class TestClient(TestPeer):
    """The editor end of a test chain."""

    __test__ = False

    def __init__(self, replies: dict[str, ClientScript] | None = None) -> None:
        super().__init__("client")
        self.replies: dict[str, ClientScript] = {
            "session/request_permission": {"outcome": {"outcome": "selected",
                                                       "optionId": "allow"}},
            "fs/read_text_file": {"content": ""},
            "fs/write_text_file": {},
            **(replies or {})}

    async def answer(self, message: Request) -> JsonValue:
        script = self.replies.get(message.method)
        if script is None:
            return await super().answer(message)
        return await script(message) if callable(script) else script

    async def initialize(self, protocol_version: int = 1) -> JsonValue:
        return await self.call("initialize", {"protocolVersion": protocol_version,
                                              "clientCapabilities": {
                                                  "fs": {"readTextFile": True,
                                                         "writeTextFile": True},
                                                  "terminal": True},
                                              "clientInfo": {"name": "test-client",
                                                             "version": "0"}})

    async def new_session(self, cwd: str = "/", **extra: JsonValue) -> str:
        result = await self.call("session/new", {"cwd": cwd, "mcpServers": [], **extra})
        return str(result["sessionId"])

    async def prompt(self, session_id: str, text: str) -> JsonValue:
        """One turn; returns the prompt's result (e.g. {"stopReason": "end_turn"})."""
        return await self.call("session/prompt", {"sessionId": session_id,
                                                  "prompt": [{"type": "text", "text": text}]})

    def agent_text(self, session_id: str | None = None) -> str:
        """All agent_message_chunk text received so far (for one session, or all)."""
        out = []
        for p in self.received_params("session/update"):
            update = p.get("update", {})
            if (session_id is None or p.get("sessionId") == session_id) and \
                    update.get("sessionUpdate") == "agent_message_chunk":
                out.append(update.get("content", {}).get("text", ""))
        return "".join(out)


class ScriptedAgent(TestPeer):
    """An in-memory agent that answers from a script and records what it received.

    `replies` maps a method to a result, or to `async def (agent, message) -> result`.
    Inside such a function, `await agent.notify(...)` / `await agent.request(...)` talk to
    the client side, and `agent.after_reply(method, params)` queues a notification to be
    sent right after the response (e.g. an update immediately after session/new).
    """

    def __init__(self, replies: dict[str, Script] | None = None) -> None:
        super().__init__("agent")
        self._sessions = itertools.count(1)
        self._after: list[tuple[str, JsonValue]] = []
        self.replies: dict[str, Script] = {
            "initialize": self._initialize,
            "session/new": self._new_session,
            "session/load": None,
            "session/resume": {},
            "session/close": {},
            "session/prompt": {"stopReason": "end_turn"},
            **(replies or {})}

    @staticmethod
    async def _initialize(agent: ScriptedAgent, message: Request) -> JsonValue:
        asked = (message.params_value() or {}).get("protocolVersion", 1)
        return {"protocolVersion": asked, "agentCapabilities": {"loadSession": True},
                "authMethods": []}

    @staticmethod
    async def _new_session(agent: ScriptedAgent, message: Request) -> JsonValue:
        return {"sessionId": f"session-{next(agent._sessions)}"}

    def after_reply(self, method: str, params: JsonValue) -> None:
        self._after.append((method, params))

    async def answer(self, message: Request) -> JsonValue:
        if message.method not in self.replies:
            return await super().answer(message)
        script = self.replies[message.method]
        return await script(self, message) if callable(script) else script

    async def _serve(self, request: Request) -> None:
        await self._ep.answer(request, self.answer)
        after, self._after = self._after, []
        for method, params in after:  # right behind the reply, in order
            await self._ep.send(Notification(method=method, params=payload(params)))


@asynccontextmanager
async def open_test_chain(proxies: Sequence[Proxy[Any]], agent: ScriptedAgent | None = None, *,
                          client: TestClient | None = None,
                          initialize: bool = True,
                          tracer: TraceSink | None = None,
                          transport: Transport = "memory") -> AsyncIterator[TestClient]:
    """client -> proxies (in-process, in order) -> agent, all in one process. Yields the
    client, initialized unless `initialize=False`. `tracer` sees every message on every
    hop. `transport="pipes"` frames the client's and the agent's links as real pipes do."""
    agent = agent if agent is not None else ScriptedAgent()
    client = client if client is not None else TestClient()
    sinks: list[MessageSink] = []
    async with anyio.create_task_group() as tg:
        chain: Chain

        async def to_chain(hop: Hop, item: Incoming) -> None:
            await chain.receive(hop, item)

        def to_chain_nowait(hop: Hop, item: Incoming) -> bool:
            return chain.receive_nowait(hop, item)

        client_hop = _link_peer(client, "client", tg, transport, tracer, to_chain, sinks,
                                nowait=to_chain_nowait)

        async def host(proxy: Proxy[Any], *, task_status: anyio.abc.TaskStatus[Hop]) -> None:
            proxy.chain_status = chain.status
            async with open_inprocess_hop(proxy, to_chain, tracer=tracer) as hop:
                task_status.started(hop)
                await anyio.sleep_forever()

        async def agent_gone(hop: Hop) -> None:
            await chain.fail_hop(hop, ComponentExitedError("agent", None))

        async def starter() -> list[ComponentLink]:
            links = [ComponentLink(p.name, Role.PROXY, await tg.start(host, p)) for p in proxies]
            agent_hop = _link_peer(agent, "agent", tg, transport, tracer, to_chain, sinks,
                                   nowait=to_chain_nowait,
                                   on_eof=agent_gone)
            return [*links, ComponentLink("agent", Role.AGENT, agent_hop)]

        chain = Chain(client_hop, starter, tracer=tracer)
        try:
            if initialize:
                await client.initialize()
            yield client
        finally:
            tg.cancel_scope.cancel()
            with anyio.CancelScope(shield=True):
                for sink in sinks:
                    await sink.aclose()


def _link_peer(peer: TestPeer, name: str, tg: TaskGroup, transport: Transport,
               tracer: TraceSink | None, to_chain: Callable[[Hop, Incoming], Awaitable[None]],
               sinks: list[MessageSink],
               on_eof: Callable[[Hop], Awaitable[None]] | None = None,
               nowait: Callable[[Hop, Incoming], bool] | None = None) -> Hop:
    """Connect `peer` to the router both ways; returns the router's hop for it."""
    to_peer, peer_in = open_link(transport)
    from_peer, chain_in = open_link(transport)
    sinks += [to_peer, from_peer]
    hop = Hop(name, to_peer, tracer=tracer)
    peer.connect(from_peer, tg)

    async def into_chain(item: Incoming) -> None:
        await to_chain(hop, item)

    def into_chain_nowait(item: Incoming) -> bool:
        return nowait is not None and nowait(hop, item)

    async def read() -> None:
        await chain_in.serve(into_chain, into_chain_nowait)  # the router's two paths
        if on_eof is not None:
            await on_eof(hop)
    tg.start_soon(peer_in.serve, peer.deliver)
    tg.start_soon(read)
    return hop


@asynccontextmanager
async def open_process_client(argv: Sequence[str], *, env: dict[str, str] | None = None,
                              stderr: Any = None, client: TestClient | None = None,
                              initialize: bool = True) -> AsyncIterator[TestClient]:
    """Start `argv` (a conductor, or any ACP agent) and drive it over real pipes.

    `stderr` is passed to the process (default: inherited). Its stdin is closed on exit
    and it gets 5 s to finish before being killed.
    """
    client = client if client is not None else TestClient()
    process = await anyio.open_process(list(argv), env=env, stderr=stderr)
    assert process.stdin is not None
    assert process.stdout is not None
    sink = PipeSink(process.stdin)
    try:
        async with anyio.create_task_group() as tg:
            client.connect(sink, tg)

            async def read(item: Incoming) -> None:
                if isinstance(item, Unreadable) and item.code == ErrorCode.INVALID_REQUEST:
                    # Valid JSON too deep to decode: the request it answers fails.
                    await client._ep.refuse_unread(item.head, item.code, item.reason)
                    return
                if not isinstance(item, Request | Notification | Response | Batch):
                    raise AssertionError(f"not JSON-RPC on the wire: {item!r}")
                await client.deliver(item)

            tg.start_soon(PipeSource(process.stdout).serve, read)
            try:
                if initialize:
                    await client.initialize()
                yield client
            finally:
                await sink.aclose()
                with anyio.move_on_after(5):
                    await process.wait()
                tg.cancel_scope.cancel()
    finally:
        if process.returncode is None:
            process.kill()
        with anyio.CancelScope(shield=True):
            await process.aclose()


__all__ = ["ScriptedAgent", "TestClient", "TestPeer", "open_process_client", "open_test_chain"]
