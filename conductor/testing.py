"""A test kit for plugin authors: drive proxies through a real router, in memory.

    async def test_my_proxy_answers_prompts() -> None:
        agent = ScriptedAgent(replies={"session/prompt": {"stopReason": "end_turn"}})
        async with open_test_chain([MyProxy(MyOptions(...))], agent) as client:
            with anyio.fail_after(5):
                sid = await client.new_session("/tmp")
                await client.prompt(sid, "hello")
        assert agent.received_params("session/prompt")[0]["prompt"][0]["text"] == "hello"

The chain is the conductor's own `Chain` with each proxy hosted in-process exactly as
`use = ...` runs it; `open_process_client` drives a real conductor (or any ACP agent
command) over pipes with the same client.
"""

from __future__ import annotations

import itertools
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from contextlib import asynccontextmanager
from typing import TYPE_CHECKING, Any

import anyio

from conductor.errors import RpcError
from conductor.jsonrpc.codes import ErrorCode
from conductor.jsonrpc.framing import FrameDecoder, OversizedFrame
from conductor.jsonrpc.message import (
    UNSET,
    Batch,
    JsonValue,
    Message,
    UnreadableFrame,
    decode,
    error_response,
    id_key,
    int_id,
    payload,
)
from conductor.plugins.api import Proxy, answer_or_raise
from conductor.plugins.host import open_inprocess_wire
from conductor.routing.chain import Chain, ComponentLink, Role
from conductor.routing.wire import Wire
from conductor.transport.pipes import PipeSink, serve_frames

if TYPE_CHECKING:
    from anyio.abc import TaskGroup, TaskStatus

    from conductor.tracing import TraceSink

Script = JsonValue | Callable[["ScriptedAgent", Message], Awaitable[JsonValue]]
ClientScript = JsonValue | Callable[[Message], Awaitable[JsonValue]]


class _Endpoint:
    """One side of a connection: sends requests and matches answers; queues what arrives."""

    def __init__(self) -> None:
        self._ids = itertools.count(1)
        self._waiting: dict[object, tuple[anyio.Event, list[Message]]] = {}
        self._out: Callable[[Message], Awaitable[None]] | None = None
        self._lock = anyio.Lock()
        self._changed = anyio.Event()
        self.received: list[Message] = []   # every request and notification that arrived
        self.tg: TaskGroup | None = None

    async def _send(self, message: Message) -> None:
        assert self._out is not None, "not connected"
        async with self._lock:  # one writer: messages leave in the order they were made
            await self._out(message)

    async def request(self, method: str, params: JsonValue = None, *,
                      ident: int | None = None) -> Message:
        """Send a request (with id `ident`, else the next free one); return the response."""
        ident = ident if ident is not None else next(self._ids)
        done, box = anyio.Event(), []
        self._waiting[ident] = (done, box)
        await self._send(Message(id=int_id(ident), method=method,
                                 params=UNSET if params is None else payload(params)))
        await done.wait()
        return box[0]

    async def call(self, method: str, params: JsonValue = None) -> JsonValue:
        """request(), then the decoded result. Raises RpcError on an error answer."""
        return answer_or_raise(await self.request(method, params)).result_value()

    async def notify(self, method: str, params: JsonValue = None) -> None:
        await self._send(Message(method=method,
                                 params=UNSET if params is None else payload(params)))

    async def cancel(self, request_id: int) -> None:
        await self.notify("$/cancel_request", {"requestId": request_id})

    async def deliver(self, item: Message | list[Message]) -> None:
        for message in item if isinstance(item, list) else [item]:
            if message.is_response:
                try:
                    entry = self._waiting.pop(id_key(message.id), None)  # type: ignore[arg-type]
                except ValueError:
                    entry = None
                if entry is not None:
                    entry[1].append(message)
                    entry[0].set()
                continue
            self.received.append(message)
            self._changed.set()
            self._changed = anyio.Event()
            if message.is_request:
                assert self.tg is not None
                self.tg.start_soon(self._answer, message)

    async def _reply(self, message: Message) -> Message:
        """The response to `message`: what `answer` returns, or the RpcError it raises."""
        try:
            result = await self.answer(message)
        except RpcError as e:
            return error_response(message.id, e.code, e.message, e.data)  # type: ignore[arg-type]
        return Message(id=message.id, result=payload(result))

    async def _answer(self, message: Message) -> None:
        await self._send(await self._reply(message))

    async def answer(self, message: Message) -> JsonValue:
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


class TestClient(_Endpoint):
    """The editor end of a test chain."""

    __test__ = False  # not a pytest class

    def __init__(self, replies: dict[str, ClientScript] | None = None) -> None:
        super().__init__()
        self.replies: dict[str, ClientScript] = {
            "session/request_permission": {"outcome": {"outcome": "selected",
                                                       "optionId": "allow"}},
            "fs/read_text_file": {"content": ""},
            "fs/write_text_file": {},
            **(replies or {})}

    async def answer(self, message: Message) -> JsonValue:
        script = self.replies.get(message.method)  # type: ignore[arg-type]
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


class ScriptedAgent(_Endpoint):
    """An in-memory agent that answers from a script and records what it received.

    `replies` maps a method to a result, or to `async def (agent, message) -> result`.
    Inside such a function, `await agent.notify(...)` / `await agent.request(...)` talk to
    the client side, and `agent.after_reply(method, params)` queues a notification to be
    sent right after the response (e.g. an update immediately after session/new).
    """

    def __init__(self, replies: dict[str, Script] | None = None) -> None:
        super().__init__()
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
    async def _initialize(agent: ScriptedAgent, message: Message) -> JsonValue:
        asked = (message.params_value() or {}).get("protocolVersion", 1)
        return {"protocolVersion": asked, "agentCapabilities": {"loadSession": True},
                "authMethods": []}

    @staticmethod
    async def _new_session(agent: ScriptedAgent, message: Message) -> JsonValue:
        return {"sessionId": f"session-{next(agent._sessions)}"}

    def after_reply(self, method: str, params: JsonValue) -> None:
        self._after.append((method, params))

    async def answer(self, message: Message) -> JsonValue:
        if message.method not in self.replies:
            return await super().answer(message)
        script = self.replies[message.method]  # type: ignore[index]
        return await script(self, message) if callable(script) else script

    async def _answer(self, message: Message) -> None:
        reply = await self._reply(message)
        after, self._after = self._after, []
        async with self._lock:  # the reply and what follows it leave back to back
            assert self._out is not None
            await self._out(reply)
            for method, params in after:
                await self._out(Message(method=method, params=payload(params)))


class _EndpointSink:
    """A Wire sink that hands messages to an endpoint through its own task (like a pipe)."""

    def __init__(self, send: Any) -> None:
        self._send = send

    async def send(self, item: Message | list[Message]) -> None:
        await self._send.send(item)

    async def aclose(self) -> None:
        await self._send.aclose()


async def _pump(endpoint: _Endpoint, *, task_status: TaskStatus[_EndpointSink]) -> None:
    send, receive = anyio.create_memory_object_stream[Message | list[Message]](256)
    task_status.started(_EndpointSink(send))
    with send, receive:
        async for item in receive:
            await endpoint.deliver(item)


@asynccontextmanager
async def open_test_chain(proxies: Sequence[Proxy[Any]], agent: ScriptedAgent | None = None, *,
                          client: TestClient | None = None,
                          initialize: bool = True,
                          tracer: TraceSink | None = None) -> AsyncIterator[TestClient]:
    """client -> proxies (in-process, in order) -> agent, all in memory. Yields the client,
    initialized unless `initialize=False`. `tracer` sees every message on every hop."""
    agent = agent if agent is not None else ScriptedAgent()
    client = client if client is not None else TestClient()
    async with anyio.create_task_group() as tg:
        client.tg = agent.tg = tg
        client_wire = Wire("client", await tg.start(_pump, client))

        async def host(proxy: Proxy[Any], *, task_status: TaskStatus[Wire]) -> None:
            async with open_inprocess_wire(proxy, chain.receive) as wire:
                task_status.started(wire)
                await anyio.sleep_forever()

        async def starter() -> list[ComponentLink]:
            links = [ComponentLink(p.name, Role.PROXY, await tg.start(host, p)) for p in proxies]
            agent_wire = Wire("agent", await tg.start(_pump, agent))

            async def to_agent_chain(message: Message) -> None:
                await chain.receive(agent_wire, message)
            agent._out = to_agent_chain
            return [*links, ComponentLink("agent", Role.AGENT, agent_wire)]

        chain = Chain(client_wire, starter, tracer=tracer)

        async def to_chain(message: Message) -> None:
            await chain.receive(client_wire, message)
        client._out = to_chain
        try:
            if initialize:
                await client.initialize()
            yield client
        finally:
            tg.cancel_scope.cancel()


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
            client.tg = tg
            client._out = sink.send

            async def read() -> None:
                async def handle(frame: bytes | OversizedFrame) -> None:
                    if isinstance(frame, OversizedFrame):
                        raise AssertionError(f"oversized frame of {frame.size} bytes")
                    try:
                        item = decode(frame)
                    except UnreadableFrame as e:
                        head = e.head
                        if e.code != ErrorCode.INVALID_REQUEST or head.has_method or \
                                head.id is None:
                            raise AssertionError(f"{e}: {frame[:200]!r}") from None
                        # Valid JSON too deep to decode: the request it answers fails.
                        await client.deliver(error_response(head.id, e.code, str(e)))
                        return
                    except ValueError:
                        raise AssertionError(f"not JSON on the wire: {frame[:200]!r}") from None
                    if isinstance(item, Batch):
                        await client.deliver([m for m in item.items if isinstance(m, Message)])
                    elif isinstance(item, Message):
                        await client.deliver(item)
                assert process.stdout is not None
                await serve_frames(process.stdout, FrameDecoder(), handle)

            tg.start_soon(read)
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


__all__ = ["ScriptedAgent", "TestClient", "open_process_client", "open_test_chain"]
