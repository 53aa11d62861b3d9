"""The test kit's pieces: peers (a test client, a scripted agent) and the chains they drive.

`conductor.testing` re-exports everything here; the pytest plugin
(`conductor.testing.pytest_plugin`) wraps it in fixtures.

The chain is the conductor's own `Chain` with each proxy hosted in-process exactly as
`use = ...` runs it. `transport="pipes"` puts real framing (encode, newline-split, decode)
on the client's and the agent's links; `open_process_client` drives a real conductor (or
any ACP agent command) over OS pipes with the same client.
"""

from __future__ import annotations

import itertools
import os
import sys
import warnings
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from contextlib import asynccontextmanager
from typing import TYPE_CHECKING, Any

import anyio

from conductor.errors import ComponentExitedError, ConnectionClosedError, RpcError
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
from conductor.routing.roles import Role
from conductor.routing.topology import ComponentLink, Hop
from conductor.rpc.endpoint import Endpoint
from conductor.rpc.failure import raise_for_error
from conductor.spelling import did_you_mean
from conductor.transport.base import Unreadable
from conductor.transport.memory import open_link
from conductor.transport.pipes import PipeSink, PipeSource

if TYPE_CHECKING:
    from anyio.abc import TaskGroup

    from conductor.jsonrpc.message import Call
    from conductor.plugins.api import Proxy
    from conductor.routing.deadlines import Timeouts
    from conductor.tracing.sink import TraceSink
    from conductor.transport.base import Incoming, MessageSink
    from conductor.transport.memory import Transport

Script = JsonValue | Callable[["ScriptedAgent", Request], Awaitable[JsonValue]]
ClientScript = JsonValue | Callable[[Request], Awaitable[JsonValue]]


# How long a test peer waits for an answer (or for `wait_for`) before failing the test with
# what it did receive: a hang in a test becomes a message, not a pytest timeout.
DEFAULT_TIMEOUT = 30.0


class TestPeer:
    """One end of a connection in a test: sends requests (answers matched by its
    `Endpoint`), answers what it is asked, and records every call that arrives.

    Every wait (`request`, `call`, `wait_for`, ...) is bounded by `timeout` seconds (None:
    unbounded); past it the test fails with a TimeoutError saying what was awaited and
    what this peer received meanwhile.
    """

    __test__ = False  # not a pytest class

    def __init__(self, name: str, *, timeout: float | None = DEFAULT_TIMEOUT) -> None:
        self.name = name
        self.timeout = timeout
        self.endpoint: Endpoint | None = None
        self.received: list[Call] = []   # every request and notification that arrived
        self.batches: list[int] = []     # the size of every batch that arrived
        self.tg: TaskGroup | None = None
        self._changed = anyio.Event()

    def __repr__(self) -> str:
        methods = self.received_methods()
        shown = ", ".join(methods[-8:])
        return f"<{type(self).__name__} {self.name}: received {len(methods)} ({shown})>" \
            if methods else f"<{type(self).__name__} {self.name}: received nothing>"

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
        """Send a request (with id `ident`, else the next free one); return the response,
        an error answer included (`response.is_error`, `.result_value()`, `.error_value()`).

        Raises:
            TimeoutError: no answer within `timeout` seconds (the request is cancelled).
        """
        with anyio.move_on_after(_bound(self.timeout)) as scope:
            return await self._ep.request(method, params, ident=ident)
        assert scope.cancelled_caught
        raise TimeoutError(self._waited(f"an answer to {method}"))

    async def call(self, method: str, params: JsonValue = None) -> JsonValue:
        """request(), then the decoded result: e.g. `await client.call("_ext/foo", {"x": 1})`.

        Raises:
            RpcError: the answer is an error (`.code`, `.message`, `.data`).
            TimeoutError: no answer within `timeout` seconds.
        """
        return raise_for_error(await self.request(method, params)).result_value()

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

    def received_methods(self) -> list[str]:
        """The method of every request and notification received, in order."""
        return [m.method for m in self.received]

    def last_params(self, method: str) -> JsonValue:
        """The decoded params of the last `method` message received.

        Raises:
            AssertionError: none arrived (the message lists what did).
        """
        found = self.received_params(method)
        if not found:
            raise AssertionError(f"{self.name} never received {method}; it received: "
                                 f"{self.received_methods() or 'nothing'}")
        return found[-1]

    async def wait_for(self, method: str, count: int = 1,
                       where: Callable[[JsonValue], bool] | None = None) -> list[JsonValue]:
        """Wait until `count` `method` messages (matching `where`) have arrived; returns
        their params.

        Raises:
            TimeoutError: not within `timeout` seconds.
        """
        with anyio.move_on_after(_bound(self.timeout)):
            while True:
                found = [p for p in self.received_params(method) if where is None or where(p)]
                if len(found) >= count:
                    return found
                await self._changed.wait()
        # Say what fell short: too few arrived, or they failed the condition.
        params = self.received_params(method)
        arrived = len(params)
        what = f"{count} {method} message(s)"
        if where is not None:
            matched = sum(1 for p in params if where(p))
            what += (f" where {getattr(where, '__name__', repr(where))}; "
                     f"{arrived} arrived, {matched} matched")
        elif arrived:
            what += f"; {arrived} arrived"
        raise TimeoutError(self._waited(what))

    def _waited(self, what: str) -> str:
        return (f"{self.name} waited {self.timeout:g}s for {what}; it received: "
                f"{self.received[-20:] or 'nothing'}")


def _bound(timeout: float | None) -> float:
    return float("inf") if timeout is None else timeout


class TurnResult(dict[str, JsonValue]):
    """The result of `session/prompt` (a dict, as the agent sent it), with what the turn
    streamed: `text` (the agent's message chunks), `stop_reason`, `updates`. In ACP v2 the
    result is the agent's acceptance (`{}`): the stop reason is its idle state update's."""

    def __init__(self, result: JsonValue, updates: list[JsonValue],
                 idle: JsonValue = None) -> None:
        super().__init__(result if isinstance(result, dict) else {})
        self.updates: list[JsonValue] = updates  # each session/update's `update` object
        self.idle = idle  # v2: the `state_update` that ended the turn

    @property
    def stop_reason(self) -> str | None:
        reason = self.idle.get("stopReason") if isinstance(self.idle, dict) \
            else self.get("stopReason")
        return reason if isinstance(reason, str) else None

    @property
    def text(self) -> str:
        """The agent's text of this turn (every `agent_message_chunk`, joined)."""
        return _chunks(self.updates, "agent_message_chunk")

    @property
    def thoughts(self) -> str:
        return _chunks(self.updates, "agent_thought_chunk")


def _is_idle(params: JsonValue, session_id: str | None = None) -> bool:
    """Whether `session/update` params say (v2) that a session (`session_id`, or any) is idle:
    the end of its turn."""
    if not isinstance(params, dict) or session_id not in (None, params.get("sessionId")):
        return False
    update = params.get("update")
    return isinstance(update, dict) and update.get("sessionUpdate") == "state_update" \
        and update.get("state") == "idle"


def _chunks(updates: list[JsonValue], kind: str) -> str:
    return "".join(str((u.get("content") or {}).get("text", "")) for u in updates
                   if isinstance(u, dict) and u.get("sessionUpdate") == kind)


class TestClient(TestPeer):
    """The editor end of a test chain."""

    __test__ = False

    def __init__(self, replies: dict[str, ClientScript] | None = None, *,
                 timeout: float | None = DEFAULT_TIMEOUT) -> None:
        super().__init__("client", timeout=timeout)
        self.protocol_version = 1  # as its last `initialize` asked
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
        """`initialize` in the shape of `protocol_version` (v2: `info` and `capabilities`);
        returns the result. `prompt` follows the version asked for."""
        self.protocol_version = protocol_version
        info = {"name": "test-client", "version": "0"}
        if protocol_version >= 2:
            return await self.call("initialize", {"protocolVersion": protocol_version,
                                                  "info": info, "capabilities": {}})
        return await self.call("initialize", {"protocolVersion": protocol_version,
                                              "clientCapabilities": {
                                                  "fs": {"readTextFile": True,
                                                         "writeTextFile": True},
                                                  "terminal": True},
                                              "clientInfo": info})

    async def new_session(self, cwd: str = "/", **extra: JsonValue) -> str:
        result = await self.call("session/new", {"cwd": cwd, "mcpServers": [], **extra})
        return str(result["sessionId"])

    async def prompt(self, session_id: str, prompt: str | list[JsonValue],
                     **extra: JsonValue) -> TurnResult:
        """One turn (a text, or a list of content blocks). Returns the prompt's result,
        e.g. {"stopReason": "end_turn"}, with `.text`, `.stop_reason` and `.updates` of
        the turn. In ACP v2 (`initialize(2)`) the answer only accepts the prompt: this
        waits on for the agent's `state_update` saying the session is idle (`.idle`).

        Raises:
            RpcError: the prompt was answered with an error.
            TimeoutError: (v2) no idle state within `timeout` seconds.
        """
        blocks = [{"type": "text", "text": prompt}] if isinstance(prompt, str) else prompt
        start = len(self.received)
        result = await self.call("session/prompt", {"sessionId": session_id,
                                                    "prompt": blocks, **extra})
        if self.protocol_version < 2:
            # An agent streams a turn's updates before its answer: they arrived first.
            return TurnResult(result, self.updates(session_id, since=start))
        before = sum(1 for m in self.received[:start] if m.method == "session/update"
                     and _is_idle(m.params_value(), session_id))
        await self.wait_for("session/update", before + 1,
                            where=lambda p: _is_idle(p, session_id))
        updates = self.updates(session_id, since=start)
        end = next(i for i, u in enumerate(updates)
                   if _is_idle({"sessionId": session_id, "update": u}, session_id))
        return TurnResult(result, updates[:end], updates[end])

    def updates(self, session_id: str | None = None, *, since: int = 0) -> list[JsonValue]:
        """The `update` object of every session/update received (for one session, or all),
        from `received[since]` on."""
        out = []
        for message in self.received[since:]:
            if message.method != "session/update":
                continue
            params = message.params_value()
            if isinstance(params, dict) and (session_id is None
                                             or params.get("sessionId") == session_id):
                out.append(params.get("update"))
        return out

    def agent_text(self, session_id: str | None = None) -> str:
        """All agent_message_chunk text received so far (for one session, or all)."""
        return _chunks(self.updates(session_id), "agent_message_chunk")


def _check_replies(replies: dict[str, Script]) -> None:
    """The easy slips in a script: a text for `session/prompt` (meaning `says(text)`), a
    method misspelt (the default answer is used, silently). Said when the agent is made."""
    from conductor import acp

    for method, script in replies.items():
        if method in acp.AGENT_METHODS - acp.NOTIFICATION_METHODS and not callable(script) \
                and not isinstance(script, dict):
            fix = f" (to stream text: says({script!r}))" if isinstance(script, str) \
                and method == "session/prompt" else ""
            raise TypeError(f"ScriptedAgent: replies[{method!r}] is {script!r}, and an ACP "
                            f"result is an object: a dict, or a script{fix}")
        if not method.startswith(("_", "$/")) and method not in acp.AGENT_METHODS:
            guess = did_you_mean(method, acp.AGENT_METHODS)
            warnings.warn(f"ScriptedAgent: replies[{method!r}]: not an ACP method an agent "
                          f"answers ({guess + ' ' if guess else ''}extension methods start "
                          "with '_'); as written it would never be used", UserWarning,
                          stacklevel=3)


class ScriptedAgent(TestPeer):
    """An in-memory agent that answers from a script and records what it received.

    `replies` maps a method to a result, or to `async def (agent, message) -> result`.
    Inside such a function, `await agent.notify(...)` / `await agent.request(...)` talk to
    the client side, and `agent.after_reply(method, params)` queues a notification to be
    sent right after the response (e.g. an update immediately after session/new).
    """

    def __init__(self, replies: dict[str, Script] | None = None, *,
                 timeout: float | None = DEFAULT_TIMEOUT) -> None:
        super().__init__("agent", timeout=timeout)
        _check_replies(replies or {})
        self.protocol_version = 1  # as the last `initialize` it received asked
        self._sessions = itertools.count(1)
        self._after: list[tuple[str, JsonValue]] = []
        self.replies: dict[str, Script] = {
            "initialize": self._initialize,
            "session/new": self._new_session,
            "session/load": {},
            "session/resume": {},
            "session/close": {},
            "session/prompt": _end_turn,
            **(replies or {})}

    @staticmethod
    async def _initialize(agent: ScriptedAgent, message: Request) -> JsonValue:
        asked = (message.params_value() or {}).get("protocolVersion", 1)
        if agent.protocol_version >= 2:  # (resume: any `capabilities.session`)
            return {"protocolVersion": asked, "info": {"name": "scripted-agent",
                                                       "version": "0"},
                    "capabilities": {"session": {}}, "authMethods": []}
        return {"protocolVersion": asked, "agentCapabilities": {"loadSession": True},
                "authMethods": []}

    @staticmethod
    async def _new_session(agent: ScriptedAgent, message: Request) -> JsonValue:
        return {"sessionId": f"session-{next(agent._sessions)}"}

    def after_reply(self, method: str, params: JsonValue) -> None:
        self._after.append((method, params))

    async def answer(self, message: Request) -> JsonValue:
        if message.method == "initialize":
            asked = (message.params_value() or {}).get("protocolVersion")
            self.protocol_version = 2 if isinstance(asked, int) and asked >= 2 else 1
        if message.method not in self.replies:
            return await super().answer(message)
        script = self.replies[message.method]
        return await script(self, message) if callable(script) else script

    async def _serve(self, request: Request) -> None:
        await self._ep.answer(request, self.answer)
        after, self._after = self._after, []
        for method, params in after:  # right behind the reply, in order
            await self._ep.send(Notification(method=method, params=payload(params)))


def says(text: str, *, stop_reason: str = "end_turn",
         thought: str | None = None) -> Callable[[ScriptedAgent, Request], Awaitable[JsonValue]]:
    """A `session/prompt` script: stream `text` (after a `thought`, if given) as the agent's
    message, then end the turn with `stop_reason`. In ACP v2 the prompt is accepted first
    (`{}`), and the turn streams after it and ends with a `state_update` to idle.

        ScriptedAgent(replies={"session/prompt": says("Hello!")})
    """
    chunks = [(kind, chunk) for kind, chunk in (("agent_thought_chunk", thought),
                                                ("agent_message_chunk", text))
              if chunk is not None]
    return _turn(chunks, stop_reason)


def _turn(chunks: list[tuple[str, str]], stop_reason: str
          ) -> Callable[[ScriptedAgent, Request], Awaitable[JsonValue]]:
    async def reply(agent: ScriptedAgent, message: Request) -> JsonValue:
        v2 = agent.protocol_version >= 2
        if not chunks and not v2:
            return {"stopReason": stop_reason}  # (params unread: they may be any shape)
        params = message.params_value()
        sid = params.get("sessionId") if isinstance(params, dict) else None
        updates: list[JsonValue] = [
            {"sessionId": sid, "update": {"sessionUpdate": kind,
                                          "content": {"type": "text", "text": chunk}}}
            for kind, chunk in chunks]
        if v2:
            for params in [*updates, {"sessionId": sid, "update": {
                    "sessionUpdate": "state_update", "state": "idle",
                    "stopReason": stop_reason}}]:
                agent.after_reply("session/update", params)
            return {}
        for params in updates:
            await agent.notify("session/update", params)
        return {"stopReason": stop_reason}
    return reply


# The default turn: v1 answers end_turn; v2 accepts, then says the session is idle.
_end_turn = _turn([], "end_turn")


def _check_proxies(proxies: Sequence[object]) -> None:
    """The easy slips (`[Upper]`, a lone `Upper()`) failed deep in the router's task group
    ("type object 'Upper' has no attribute 'name'"); said here, with what to write."""
    from conductor.plugins.api import Proxy

    if isinstance(proxies, Proxy):
        name = type(proxies).__name__
        raise TypeError(f"open_test_chain: proxies is one proxy, not a list of them: write "
                        f"[{name}()] (the acp_proxies fixture returns a list)")
    for i, proxy in enumerate(proxies):
        if isinstance(proxy, type) and issubclass(proxy, Proxy):
            raise TypeError(f"open_test_chain: proxies[{i}] is the class {proxy.__name__}, "
                            f"not a proxy: write {proxy.__name__}()")
        if not isinstance(proxy, Proxy):
            raise TypeError(f"open_test_chain: proxies[{i}] is {proxy!r}, not a "
                            "conductor.plugins.Proxy")


@asynccontextmanager
async def open_test_chain(proxies: Sequence[Proxy[Any]], agent: ScriptedAgent | None = None, *,
                          client: TestClient | None = None,
                          initialize: bool = True,
                          tracer: TraceSink | None = None,
                          transport: Transport = "memory",
                          timeouts: Timeouts | None = None,
                          ) -> AsyncIterator[TestClient]:
    """client -> proxies (in-process, in order) -> agent, all in one process. Yields the
    client, initialized unless `initialize=False`. `tracer` sees every message on every
    hop. `transport="pipes"` frames the client's and the agent's links as real pipes do.
    `timeouts` are the chain file's `request_timeout`, `prompt_timeout` and
    `session_idle_expiry` (`SettingsSpec.timeouts()`)."""
    from conductor.plugins.api import Proxy

    if not isinstance(proxies, Proxy):
        proxies = list(proxies)  # a generator would be used up by the check
    _check_proxies(proxies)
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

        chain = Chain(client_hop, starter, tracer=tracer, timeouts=timeouts)
        tg.start_soon(chain.serve_timers)
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
    sink, stdout = PipeSink(process.stdin), process.stdout
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

            async def serve() -> None:
                await PipeSource(stdout).serve(read)
                # Its stdout ended: nothing it owes can come. Say so now, not after the
                # whole timeout as a bare "waited 30s ... received nothing".
                owed = sorted({o.method for o in client._ep.pending.values()})
                if not owed:
                    return
                with anyio.move_on_after(1):
                    await process.wait()
                how = "closed its stdout" if process.returncode is None \
                    else f"exited with code {process.returncode}"
                await client._ep.fail(ConnectionClosedError(
                    f"{os.path.basename(argv[0])} {how} with {', '.join(owed)} unanswered "
                    "(its stderr says why)"))

            tg.start_soon(serve)
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


def conductor_command(chain: str | os.PathLike[str], *args: str) -> list[str]:
    """The command line of this interpreter's `acp-conductor --chain CHAIN ARGS...`."""
    return [sys.executable, "-m", "conductor", "--chain", os.fspath(chain), *args]


@asynccontextmanager
async def open_conductor(chain: str | os.PathLike[str], *args: str,
                         env: dict[str, str] | None = None, stderr: Any = None,
                         client: TestClient | None = None,
                         initialize: bool = True) -> AsyncIterator[TestClient]:
    """A real conductor process serving the chain file `chain` (every component as the
    file says: subprocesses, in-process plugins), driven over its stdin/stdout as an
    editor would. `args` are more options (e.g. "--trace", "t.jsonl")."""
    async with open_process_client(conductor_command(chain, *args), env=env, stderr=stderr,
                                   client=client, initialize=initialize) as connected:
        yield connected


__all__ = ["DEFAULT_TIMEOUT", "ScriptedAgent", "TestClient", "TestPeer", "TurnResult",
           "conductor_command", "open_conductor", "open_process_client", "open_test_chain",
           "says"]
