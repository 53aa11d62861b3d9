"""The bridge in-process: rewrites that stay stable, the token at the door of its HTTP
endpoint (on both anyio backends), and what an agent that takes neither transport gets."""

from __future__ import annotations

import json
import os
import socket
import stat
import sys
import tempfile
from typing import TYPE_CHECKING, Any

import anyio
import httpx2
import mcp_types
import msgspec
import pytest
from anyio.streams.buffered import BufferedByteReceiveStream

from conductor.bridge import SOCKET_ENV, TOKEN_ENV, McpBridge, open_mcp_bridge
from conductor.bridge.relay import Relay
from conductor.jsonrpc.message import Notification, Request, Response, raw
from conductor.rpc.endpoint import Endpoint

if TYPE_CHECKING:
    from pathlib import Path

    from anyio.abc import TaskGroup
from conductor.routing.mcp import McpRefusedError, McpSupport, for_agent


def support(version: int, *transports: str) -> McpSupport:
    return McpSupport(version, frozenset(transports))


def setup(*server_ids: str, extra: list[dict[str, object]] | None = None) -> msgspec.Raw:
    servers = [{"type": "acp", "name": f"n-{s}", "serverId": s} for s in server_ids]
    return msgspec.Raw(json.dumps({"cwd": "/", "mcpServers": [*(extra or []), *servers]})
                       .encode())


def servers_of(params: object) -> list[dict[str, object]]:
    assert isinstance(params, msgspec.Raw)
    return list(json.loads(bytes(params))["mcpServers"])


async def test_http_rewrites_are_stable_per_server_and_carry_a_token_each() -> None:
    async with open_mcp_bridge("auto") as bridge:
        agent = support(1, "stdio", "http")
        first = servers_of(await bridge.rewrite(setup("a", "b"), agent, frozenset()))
        again = servers_of(await bridge.rewrite(setup("b"), agent, frozenset()))
    a, b = first
    assert again == [b]  # the same serverId, on a reload or a fork: the same declaration
    assert a["type"] == "http" and a["name"] == "n-a"
    assert str(a["url"]).startswith("http://127.0.0.1:")
    tokens = [h["value"] for s in (a, b) for h in s["headers"]]  # type: ignore[attr-defined]
    assert all(t.startswith("Bearer ") and len(t) > 40 for t in tokens)
    assert tokens[0] != tokens[1] and a["url"] != b["url"]


async def test_stdio_rewrites_run_the_shim_with_the_socket_and_token_in_its_env() -> None:
    async with open_mcp_bridge("stdio") as bridge:
        [entry] = servers_of(await bridge.rewrite(setup("a"), support(2, "stdio", "http"),
                                                  frozenset()))
        env = {e["name"]: e["value"] for e in entry["env"]}  # type: ignore[attr-defined]
        directory = os.path.dirname(env[SOCKET_ENV])
        assert stat.S_IMODE(os.stat(directory).st_mode) == 0o700
        assert stat.S_ISSOCK(os.stat(env[SOCKET_ENV]).st_mode)
    assert entry["type"] == "stdio"  # v2: every entry has a type
    assert entry["command"] == sys.executable
    assert entry["args"][:4] == ["-P", "-m", "conductor", "mcp-shim"]  # type: ignore[index]
    assert len(env[TOKEN_ENV]) > 40
    assert not await anyio.Path(directory).exists()  # removed when the bridge stops


async def test_the_shim_command_runs_the_shim_in_a_project_with_a_conductor_module_of_its_own(
        tmp_path: Path) -> None:
    # The agent runs the command in a directory of its choosing (the session's, often):
    # `python -m conductor` there imported the project's conductor.py, not the shim.
    (tmp_path / "conductor.py").write_text("print('the project, not the shim')\n")
    async with open_mcp_bridge("stdio") as bridge:
        [entry] = servers_of(await bridge.rewrite(setup("a"), support(1, "stdio"),
                                                  frozenset()))
        env = {e["name"]: e["value"] for e in entry["env"]}  # type: ignore[attr-defined]
        env[TOKEN_ENV] = "not-the-token"
        with anyio.fail_after(20):
            done = await anyio.run_process(
                [str(entry["command"]), *entry["args"]],  # type: ignore[misc]
                cwd=tmp_path, env={**os.environ, **env}, check=False)
    assert done.stdout == b""
    assert b"mcp-shim: the conductor refused" in done.stderr


async def test_the_stdio_bridge_serves_under_a_temporary_directory_too_deep_for_a_socket(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # A Unix socket's path holds about 104 bytes (sun_path): under a deep $TMPDIR (build
    # sandboxes, CI) the listener could not be made, and every session setup failed.
    deep = tmp_path / ("d" * 100)
    deep.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(deep))
    async with open_mcp_bridge("stdio") as bridge:
        provider = _Provider(bridge, bridge.tg)
        [entry] = servers_of(await bridge.rewrite(setup("a"), support(1, "stdio"),
                                                  frozenset()))
        env = {e["name"]: e["value"] for e in entry["env"]}  # type: ignore[attr-defined]
        with anyio.fail_after(10):
            answer = await _served(env[SOCKET_ENV], entry["args"][-1],  # type: ignore[index]
                                   env[TOKEN_ENV])
            await provider.disconnected.wait()  # the session ended: it is read no more
    assert json.loads(answer) == {"ok": True}


async def test_a_bridge_that_cannot_listen_leaves_the_server_out_and_says_why(
        monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    # Its listener could not be made ($TMPDIR not writable, no file descriptors left):
    # the session goes on without that server (a required one refuses it, saying why),
    # not failed as a whole with an OSError blamed on the proxy that declared it.
    def no_directory(*args: object, **kwargs: object) -> str:
        raise PermissionError(13, "Permission denied", "/tmp/acp-conductor-mcp-x")

    monkeypatch.setattr(tempfile, "mkdtemp", no_directory)
    async with open_mcp_bridge("stdio") as bridge:
        params = setup("a", extra=[{"name": "other", "command": "x", "args": [], "env": []}])
        assert servers_of(await for_agent(params, support(1, "stdio"), bridge, frozenset())
                          ) == [{"name": "other", "command": "x", "args": [], "env": []}]
        with pytest.raises(McpRefusedError, match="Permission denied") as refused:
            await for_agent(params, support(1, "stdio"), bridge, frozenset({"n-a"}))
    assert refused.value.name == "n-a"
    assert "MCP bridge cannot listen (stdio): [Errno 13] Permission denied" in caplog.text


async def test_the_http_endpoint_refuses_a_request_without_or_with_a_wrong_token() -> None:
    async with open_mcp_bridge("http") as bridge:
        [entry] = servers_of(await bridge.rewrite(setup("a"), support(1, "http"),
                                                  frozenset()))
        url = str(entry["url"])
        token = entry["headers"][0]["value"]  # type: ignore[index]
        body = {"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {}}
        accept = {"Accept": "application/json, text/event-stream"}
        with anyio.fail_after(10):
            async with httpx2.AsyncClient() as client:
                none = await client.post(url, json=body, headers=accept)
                wrong = await client.post(url, json=body, headers={
                    **accept, "Authorization": "Bearer " + "x" * 43})
                elsewhere = await client.post(url.rsplit("/", 1)[0] + "/nope", json=body,
                                              headers={**accept, "Authorization": token})
    assert (none.status_code, wrong.status_code, elsewhere.status_code) == (401, 401, 401)
    assert "token" in none.json()["error"]["message"]


@pytest.mark.parametrize("mode", ["http", "stdio"])
async def test_a_bridge_that_cannot_reach_the_agent_leaves_it_no_acp_declaration(
        mode: str) -> None:
    async with open_mcp_bridge(mode) as bridge:
        agent = support(2, "http") if mode == "stdio" else support(2, "stdio")
        assert not bridge.covers(agent)
        stdio = {"type": "stdio", "name": "files", "command": "/bin/f"}
        out = await for_agent(setup("a", extra=[stdio]), agent, bridge, frozenset())
        assert servers_of(out) == [stdio]
        with pytest.raises(McpRefusedError, match="'n-a' is required"):
            await for_agent(setup("a"), agent, bridge, frozenset({"n-a"}))


async def test_an_agent_that_takes_acp_gets_the_declaration_unchanged() -> None:
    async with open_mcp_bridge("auto") as bridge:
        params = setup("a")
        assert await for_agent(params, support(1, "stdio", "acp"), bridge, frozenset()) \
            is params
        assert bridge.servers == {}  # nothing was bridged, nothing listens


async def _hello(path: str, line: bytes) -> bytes:
    """What the bridge's socket answers a shim that opens with `line` ('' when it closes)."""
    async with await anyio.connect_unix(path) as stream:
        await stream.send(line)
        answer = b""
        while not answer.endswith(b"\n"):
            try:
                answer += await stream.receive()
            except anyio.EndOfStream:
                break
        return answer


@pytest.mark.parametrize("hello", [
    pytest.param(b'{"server": "KEY", "token": "' + b"x" * 43 + b'"}\n', id="wrong-token"),
    pytest.param(b'{"server": "nope", "token": "TOKEN"}\n', id="unknown-server"),
    pytest.param(b"[" * 2000 + b"]" * 2000 + b"\n", id="deep-json"),
    pytest.param(b"\xff\xfe\n", id="not-utf8"),
    pytest.param(b'"just a string"\n', id="not-an-object"),
])
async def test_a_shim_with_a_wrong_hello_is_refused_and_the_bridge_keeps_serving(
        hello: bytes, caplog: pytest.LogCaptureFixture) -> None:
    async with open_mcp_bridge("stdio") as bridge:
        [entry] = servers_of(await bridge.rewrite(setup("a"), support(2, "stdio"),
                                                  frozenset()))
        env = {e["name"]: e["value"] for e in entry["env"]}  # type: ignore[attr-defined]
        key = entry["args"][-1]  # type: ignore[index]
        line = hello.replace(b"KEY", key.encode()).replace(b"TOKEN", env[TOKEN_ENV].encode())
        with anyio.fail_after(10):
            answer = await _hello(env[SOCKET_ENV], line)
            assert b'"ok"' not in answer
            # the listener still takes shims: the refusal ended one connection, not the bridge
            second = await _hello(env[SOCKET_ENV], b'{"server": "x", "token": "y"}\n')
    assert b"refused" in second
    assert "MCP bridge refused a stdio request" in caplog.text
    assert env[TOKEN_ENV] not in caplog.text  # the token never reaches a log


def _provider_request(ident: int) -> Request:
    return Request(id=raw(ident), method="mcp/message", params=raw(
        {"connectionId": "c1", "method": "elicitation/create", "params": {}}))


async def test_a_provider_request_arriving_while_its_session_closes_is_answered() -> None:
    sent: list[object] = []
    entered, gate = anyio.Event(), anyio.Event()

    class Sink:  # the chain: its first send (the first refusal) waits for the test
        async def send(self, item: object) -> None:
            sent.append(item)
            if len(sent) == 1:
                entered.set()
                await gate.wait()

        async def aclose(self) -> None:
            return None

    async def to_agent(body: dict[str, Any]) -> None:
        return None

    async def close_agent() -> None:
        return None

    with anyio.fail_after(5):
        async with anyio.create_task_group() as tg:
            relay = Relay(Endpoint("mcp-bridge", Sink()), tg, "c1", "srv", to_agent,
                          close_agent)
            await relay.from_provider(_provider_request(1))
            tg.start_soon(lambda: relay.close(tell_provider=False))
            await entered.wait()
            tg.start_soon(relay.from_provider, _provider_request(2))  # while it closes
            await anyio.wait_all_tasks_blocked()
            gate.set()
    answered = sorted(json.loads(bytes(m.id)) for m in sent if isinstance(m, Response))
    assert answered == [1, 2]


async def test_a_provider_request_cancelled_is_answered_though_the_agent_may_not_answer_it(
        ) -> None:
    # MCP: a request cancelled with notifications/cancelled gets no answer from its receiver;
    # ACP: a request cancelled with $/cancel_request is still answered. The relay owes it.
    sent: list[object] = []
    to_agent_sent: list[dict[str, Any]] = []

    class Sink:
        async def send(self, item: object) -> None:
            sent.append(item)

        async def aclose(self) -> None:
            return None

    async def to_agent(body: dict[str, Any]) -> None:
        to_agent_sent.append(body)

    async def close_agent() -> None:
        return None

    with anyio.fail_after(5):
        async with anyio.create_task_group() as tg:
            endpoint = Endpoint("mcp-bridge", Sink())
            relay = Relay(endpoint, tg, "c1", "srv", to_agent, close_agent)
            await relay.from_provider(_provider_request(1))
            asked = to_agent_sent[0]["id"]
            assert await endpoint.cancel_inbound(raw({"requestId": 1}))
            assert to_agent_sent[1] == {"jsonrpc": "2.0", "method": "notifications/cancelled",
                                        "params": {"requestId": asked}}
            answers = [m for m in sent if isinstance(m, Response)]
            assert len(answers) == 1 and json.loads(bytes(answers[0].id)) == 1
            assert answers[0].error_value()["code"] == -32800
            assert endpoint.inbound == {}
            await relay.from_agent({"jsonrpc": "2.0", "id": asked, "result": {}})  # late
    assert sent == answers  # an agent that answers anyway is not heard twice


class _Provider:
    """The router and an MCP provider behind the bridge's endpoint: it opens connection
    `c1` and answers every `mcp/message` request with the method it carried."""

    def __init__(self, bridge: McpBridge, tg: TaskGroup) -> None:
        self.bridge, self.tg = bridge, tg
        self.disconnected = anyio.Event()
        bridge.endpoint = Endpoint("mcp-bridge", self)

    async def send(self, item: object) -> None:
        for message in item if isinstance(item, list) else [item]:
            if isinstance(message, Request):
                if message.method == "mcp/disconnect":
                    self.disconnected.set()
                inner = json.loads(bytes(message.params)) if message.params else {}
                result = {"connectionId": "c1"} if message.method == "mcp/connect" \
                    else {"echo": inner.get("method")}
                self.tg.start_soon(self.bridge._deliver, Response(id=message.id,
                                                                  result=raw(result)))

    async def aclose(self) -> None:
        return None


@pytest.mark.parametrize("bad", [
    pytest.param(b'{"jsonrpc":"2.0","id":1,"method":"tools/list","params":{"_meta":"x"}}',
                 id="meta-not-an-object"),
    pytest.param(b"[" * 100000 + b"]" * 100000, id="deep-json"),
    pytest.param(b'[{"jsonrpc":"2.0","id":1,"method":"ping"}]', id="a-batch"),
    pytest.param(b'"just a string"', id="not-an-object"),
])
async def test_a_bad_message_from_a_shim_is_answered_and_its_session_keeps_serving(
        bad: bytes) -> None:
    async with open_mcp_bridge("stdio") as bridge:
        provider = _Provider(bridge, bridge.tg)
        [entry] = servers_of(await bridge.rewrite(setup("a"), support(2, "stdio"),
                                                  frozenset()))
        env = {e["name"]: e["value"] for e in entry["env"]}  # type: ignore[attr-defined]
        key = entry["args"][-1]  # type: ignore[index]
        with anyio.fail_after(10):
            async with await anyio.connect_unix(env[SOCKET_ENV]) as stream:
                lines = BufferedByteReceiveStream(stream)
                hello = {"server": key, "token": env[TOKEN_ENV]}
                await stream.send(json.dumps(hello).encode() + b"\n")
                assert json.loads(await lines.receive_until(b"\n", 4096)) == {"ok": True}
                await stream.send(bad + b"\n")
                first = json.loads(await lines.receive_until(b"\n", 65536))
                assert "result" in first or "error" in first
                await stream.send(b'{"jsonrpc":"2.0","id":7,"method":"ping"}\n')
                second = json.loads(await lines.receive_until(b"\n", 65536))
            await provider.disconnected.wait()  # the session ended: it is read no more
        assert second == {"jsonrpc": "2.0", "id": 7, "result": {"echo": "ping"}}


async def test_a_message_over_the_limit_from_a_shim_is_answered_and_its_session_keeps_serving(
        ) -> None:
    # The limit is the chain's (max_frame_bytes, the largest message on any hop).
    async with open_mcp_bridge("stdio", max_message_bytes=1024) as bridge:
        provider = _Provider(bridge, bridge.tg)
        [entry] = servers_of(await bridge.rewrite(setup("a"), support(2, "stdio"),
                                                  frozenset()))
        env = {e["name"]: e["value"] for e in entry["env"]}  # type: ignore[attr-defined]
        hello = {"server": entry["args"][-1], "token": env[TOKEN_ENV]}  # type: ignore[index]
        huge = {"jsonrpc": "2.0", "id": 6, "method": "tools/call",
                "params": {"name": "write", "arguments": {"text": "x" * 200_000}}}
        with anyio.fail_after(10):
            async with await anyio.connect_unix(env[SOCKET_ENV]) as stream:
                lines = BufferedByteReceiveStream(stream)
                await stream.send(json.dumps(hello).encode() + b"\n")
                assert json.loads(await lines.receive_until(b"\n", 4096)) == {"ok": True}
                # in one write with what follows it: the rest of the read is not lost
                await stream.send(json.dumps(huge).encode() + b"\n"
                                  + b'{"jsonrpc":"2.0","id":7,"method":"ping"}\n')
                first = json.loads(await lines.receive_until(b"\n", 65536))
                second = json.loads(await lines.receive_until(b"\n", 65536))
            await provider.disconnected.wait()
    assert first["id"] == 6 and first["error"]["code"] == -33003
    assert "1024" in first["error"]["message"]
    assert second == {"jsonrpc": "2.0", "id": 7, "result": {"echo": "ping"}}


@pytest.mark.parametrize("mode", ["http", "stdio"])
async def test_two_setups_rewritten_at_once_share_one_listener(mode: str) -> None:
    agent = support(2, mode)
    found: list[str] = []

    async def rewrite(server_id: str) -> None:
        [entry] = servers_of(await bridge.rewrite(setup(server_id), agent, frozenset()))
        if mode == "http":
            found.append(str(entry["url"]).rsplit("/", 1)[0])
        else:
            env = {e["name"]: e["value"] for e in entry["env"]}  # type: ignore[attr-defined]
            found.append(env[SOCKET_ENV])

    with anyio.fail_after(10):
        async with open_mcp_bridge(mode) as bridge, anyio.create_task_group() as tg:
            tg.start_soon(rewrite, "a")
            tg.start_soon(rewrite, "b")
    assert len(found) == 2 and found[0] == found[1], found


_INITIALIZE = {"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
    "protocolVersion": "2025-06-18", "capabilities": {},
    "clientInfo": {"name": "t", "version": "1"}}}


async def http_server_entry(bridge: Any) -> tuple[dict[str, Any], dict[str, str]]:
    """The http server the bridge declares for a session, and the headers an MCP client
    sends it (the token included)."""
    [entry] = servers_of(await bridge.rewrite(setup("a"), support(1, "http"), frozenset()))
    return entry, {"Accept": "application/json, text/event-stream",
                   "Authorization": entry["headers"][0]["value"]}


async def test_the_http_sessions_of_an_agent_that_is_gone_end_with_it() -> None:
    # A restarted agent's MCP client died with it: its Streamable HTTP sessions (no TCP
    # connection marks their end) must not hold their provider connections for the idle
    # timeout, nor count toward the session limit.
    async with open_mcp_bridge("http") as bridge:
        provider = _Provider(bridge, bridge.tg)
        entry, headers = await http_server_entry(bridge)
        with anyio.fail_after(10):
            async with httpx2.AsyncClient() as client:
                opened = await client.post(str(entry["url"]), json=_INITIALIZE,
                                           headers=headers)
            assert opened.status_code == 200, opened.text
            assert opened.headers.get("mcp-session-id")
            assert bridge.relays
            await bridge.agent_gone()
            await provider.disconnected.wait()  # its provider connection was ended
        assert not bridge.relays


class _SlowProvider(_Provider):
    """A provider whose `mcp/connect` answers wait for `release`."""

    def __init__(self, bridge: McpBridge, tg: TaskGroup) -> None:
        super().__init__(bridge, tg)
        self.connects = 0
        self.asked, self.asked_again, self.release = anyio.Event(), anyio.Event(), \
            anyio.Event()

    async def send(self, item: object) -> None:
        if isinstance(item, Request) and item.method == "mcp/connect":
            self.connects += 1
            (self.asked if self.connects == 1 else self.asked_again).set()

            async def later() -> None:
                await self.release.wait()
                await super(_SlowProvider, self).send(item)
            self.tg.start_soon(later)
            return
        await super().send(item)


async def test_two_sessions_opened_at_once_cannot_both_take_the_last_place(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("conductor.bridge.http.MAX_SESSIONS", 1)
    statuses: list[int] = []
    async with open_mcp_bridge("http") as bridge:
        provider = _SlowProvider(bridge, bridge.tg)
        entry, headers = await http_server_entry(bridge)
        async def open_one(client: httpx2.AsyncClient) -> None:
            answer = await client.post(str(entry["url"]), json=_INITIALIZE, headers=headers)
            statuses.append(answer.status_code)

        with anyio.fail_after(10):
            async with httpx2.AsyncClient() as client, anyio.create_task_group() as tg:
                tg.start_soon(open_one, client)
                await provider.asked.wait()  # the first is connecting: not a session yet
                async with anyio.create_task_group() as race:
                    async def connects_too() -> None:
                        await provider.asked_again.wait()
                        race.cancel_scope.cancel()
                    race.start_soon(connects_too)
                    await open_one(client)  # refused, or stopped once it connects too
                    race.cancel_scope.cancel()
                provider.release.set()
        assert provider.connects == 1
    assert statuses == [503, 200]


async def test_two_shims_opened_at_once_cannot_both_take_the_last_place(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("conductor.bridge.stdio.MAX_SHIMS", 1)
    answers: list[bytes] = []
    async with open_mcp_bridge("stdio") as bridge:
        provider = _SlowProvider(bridge, bridge.tg)
        [entry] = servers_of(await bridge.rewrite(setup("a"), support(2, "stdio"),
                                                  frozenset()))
        env = {e["name"]: e["value"] for e in entry["env"]}  # type: ignore[attr-defined]
        hello = json.dumps({"server": entry["args"][-1],  # type: ignore[index]
                            "token": env[TOKEN_ENV]}).encode() + b"\n"
        with anyio.fail_after(10):
            async with await anyio.connect_unix(env[SOCKET_ENV]) as first:
                await first.send(hello)
                await provider.asked.wait()  # the first is connecting: not a session yet
                async with anyio.create_task_group() as race:
                    async def connects_too() -> None:
                        await provider.asked_again.wait()
                        race.cancel_scope.cancel()
                    race.start_soon(connects_too)
                    answers.append(await _hello(env[SOCKET_ENV], hello))
                    race.cancel_scope.cancel()
                provider.release.set()
        assert provider.connects == 1
    assert answers and b"too many MCP sessions" in answers[0]


async def test_a_session_whose_opening_request_fails_midway_ends_at_once() -> None:
    # The agent went away while its initialize was being answered (the server cannot
    # send): the session it never learnt of must not hold a provider connection and a
    # place for the idle timeout.
    async with open_mcp_bridge("http") as bridge:
        provider = _Provider(bridge, bridge.tg)
        [entry] = servers_of(await bridge.rewrite(setup("a"), support(1, "http"),
                                                  frozenset()))
        http = bridge._http
        assert http is not None
        url = httpx2.URL(str(entry["url"]))
        scope = {"type": "http", "method": "POST", "path": url.path, "query_string": b"",
                 "headers": [(b"host", f"127.0.0.1:{http.port}".encode()),
                             (b"authorization",
                              entry["headers"][0]["value"].encode()),  # type: ignore[index]
                             (b"accept", b"application/json, text/event-stream"),
                             (b"content-type", b"application/json")]}

        async def receive() -> dict[str, Any]:
            return {"type": "http.disconnect"}

        async def send(message: object) -> None:
            raise OSError("the agent's connection is gone")

        with anyio.fail_after(10):
            with pytest.raises(OSError):
                await http.app(scope, receive, send)
            await provider.disconnected.wait()
        assert not http.sessions and not bridge.relays


async def test_malformed_provider_messages_reach_the_agent_as_errors_not_as_a_crash() -> None:
    # The http transport hands the agent only valid MCP messages (it validates them), so a
    # provider's mcp/message or answer that is not one must become an error the agent or
    # the provider can read, never an exception in the bridge's task group.
    sent: list[Any] = []
    to_agent_sent: list[dict[str, Any]] = []

    async def to_agent(body: dict[str, Any]) -> None:
        mcp_types.jsonrpc_message_adapter.validate_python(body, by_name=False)  # as http
        to_agent_sent.append(body)

    async def close_agent() -> None:
        return None

    with anyio.fail_after(5):
        async with anyio.create_task_group() as tg:
            class Sink:  # the chain: a provider that answers with what is not MCP
                async def send(self, item: object) -> None:
                    sent.append(item)
                    if isinstance(item, Request):
                        bad = raw(5) if len(sent) == 1 else raw({"code": "x"})
                        answer = Response(id=item.id, result=bad) if len(sent) == 1 \
                            else Response(id=item.id, error=bad)
                        tg.start_soon(endpoint.settle, answer)

                async def aclose(self) -> None:
                    return None

            endpoint = Endpoint("mcp-bridge", Sink())
            relay = Relay(endpoint, tg, "c1", "srv", to_agent, close_agent)
            await relay.from_agent({"jsonrpc": "2.0", "id": 1, "method": "tools/list"})
            await relay.from_agent({"jsonrpc": "2.0", "id": 2, "method": "tools/list"})
            await relay.from_provider(Request(id=raw(9), method="mcp/message", params=raw(
                {"connectionId": "c1", "method": 7})))
            await relay.from_provider(Notification(method="mcp/message", params=raw(
                {"connectionId": "c1", "method": "notifications/message", "params": [1]})))
    answers = {body["id"]: body for body in to_agent_sent}
    for ident in (1, 2):
        assert answers[ident]["error"]["code"] == -32603
        assert "srv" in answers[ident]["error"]["message"]
    assert len(to_agent_sent) == 2  # the malformed provider messages did not reach it
    [refusal] = [m for m in sent if isinstance(m, Response)]
    assert json.loads(bytes(refusal.id)) == 9
    assert refusal.error_value()["code"] == -32602



async def test_a_provider_progress_whose_token_is_no_id_does_not_break_the_http_session(
        ) -> None:
    # A provider (of any language: the SDK's own would refuse to send it) writes a
    # progressToken that is neither a string nor a number: the agent cannot be waiting
    # for it, and the bridge must neither fail nor stop serving the session.
    async with open_mcp_bridge("http") as bridge:
        _Provider(bridge, bridge.tg)
        entry, headers = await http_server_entry(bridge)
        with anyio.fail_after(10):
            async with httpx2.AsyncClient() as client:
                opened = await client.post(str(entry["url"]), json=_INITIALIZE,
                                           headers=headers)
                [connection] = list(bridge.relays)
                for token in ([1], {"a": 1}):
                    await bridge._deliver(Notification(method="mcp/message", params=raw(
                        {"connectionId": connection, "method": "notifications/progress",
                         "params": {"progressToken": token, "progress": 1}})))
                again = await client.post(str(entry["url"]), json={
                    "jsonrpc": "2.0", "id": 2, "method": "ping"}, headers={
                        **headers, "mcp-session-id": opened.headers["mcp-session-id"]})
    assert again.status_code == 200
    assert '"echo":"ping"' in again.text


async def _served(path: str, key: str, token: str) -> bytes:
    """A shim's whole hello: what the bridge answers one that stays."""
    return await _hello(path, json.dumps({"server": key, "token": token}).encode() + b"\n")


async def test_a_shim_that_leaves_before_its_refusal_does_not_stop_the_bridge() -> None:
    # The bridge runs in the chain's task group: a broken pipe writing a refusal to a shim
    # that already left (killed by its agent) took the whole conductor down.
    refused = anyio.Event()
    async with open_mcp_bridge("stdio") as bridge:
        provider = _Provider(bridge, bridge.tg)
        [entry] = servers_of(await bridge.rewrite(setup("a"), support(2, "stdio"),
                                                  frozenset()))
        env = {e["name"]: e["value"] for e in entry["env"]}  # type: ignore[attr-defined]
        log_refusal = bridge.refused

        def refusing(how: str, detail: str) -> None:
            log_refusal(how, detail)
            refused.set()
        bridge.refused = refusing  # type: ignore[method-assign]
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as gone:  # no await: gone
            gone.connect(env[SOCKET_ENV])  # before the bridge reads a byte
            gone.sendall(b'{"server": "nope", "token": "' + env[TOKEN_ENV].encode() + b'"}\n')
        with anyio.fail_after(10):
            await refused.wait()
            answer = await _served(env[SOCKET_ENV], entry["args"][-1],  # type: ignore[index]
                                   env[TOKEN_ENV])
            await provider.disconnected.wait()  # (that shim's session is over)
    assert json.loads(answer) == {"ok": True}


async def test_a_shim_that_leaves_while_the_bridge_connects_is_disconnected_at_the_provider(
        ) -> None:
    async with open_mcp_bridge("stdio") as bridge:
        provider = _SlowProvider(bridge, bridge.tg)
        [entry] = servers_of(await bridge.rewrite(setup("a"), support(2, "stdio"),
                                                  frozenset()))
        env = {e["name"]: e["value"] for e in entry["env"]}  # type: ignore[attr-defined]
        hello = {"server": entry["args"][-1], "token": env[TOKEN_ENV]}  # type: ignore[index]
        with anyio.fail_after(10):
            async with await anyio.connect_unix(env[SOCKET_ENV]) as stream:
                await stream.send(json.dumps(hello).encode() + b"\n")
                await provider.asked.wait()
            provider.release.set()  # connected, for a shim that is gone
            await provider.disconnected.wait()
            assert bridge.relays == {}
            provider.disconnected = anyio.Event()
            assert json.loads(await _served(env[SOCKET_ENV], str(hello["server"]),
                                            str(hello["token"]))) == {"ok": True}
            await provider.disconnected.wait()


async def test_an_agent_cancel_naming_no_open_request_is_not_passed_on() -> None:
    # Its requestId is the agent's MCP id: past the relay it would be read as an id of the
    # bridge's own connection to the router, shared by every bridged session, and could
    # cancel someone else's call there.
    sent: list[object] = []

    class Sink:
        async def send(self, item: object) -> None:
            sent.append(item)

        async def aclose(self) -> None:
            return None

    async def to_agent(body: dict[str, Any]) -> None:
        return None

    async def close_agent() -> None:
        return None

    with anyio.fail_after(5):
        async with anyio.create_task_group() as tg:
            relay = Relay(Endpoint("mcp-bridge", Sink()), tg, "c1", "srv", to_agent,
                          close_agent)
            await relay.from_agent({"jsonrpc": "2.0", "method": "notifications/cancelled",
                                    "params": {"requestId": 1}})
            await relay.from_agent({"jsonrpc": "2.0", "method": "notifications/progress",
                                    "params": {"progressToken": 1, "progress": 1}})
    assert [json.loads(bytes(m.params))["method"] for m in sent  # type: ignore[attr-defined]
            ] == ["notifications/progress"]


async def test_what_an_agent_sends_reaches_the_provider_in_the_order_it_sent_it() -> None:
    # A request and the notification right behind it (its cancel, say) read from one
    # buffer: the notification must not overtake the request, or the provider gets a
    # cancel for nothing it knows and then runs the call to its end.
    sent: list[object] = []

    class Sink:
        async def send(self, item: object) -> None:
            sent.append(item)

        async def aclose(self) -> None:
            return None

    async def to_agent(body: dict[str, Any]) -> None:
        return None

    async def close_agent() -> None:
        return None

    with anyio.fail_after(5):
        async with anyio.create_task_group() as tg:
            relay = Relay(Endpoint("mcp-bridge", Sink()), tg, "c1", "srv", to_agent,
                          close_agent)
            await relay.from_agent({"jsonrpc": "2.0", "id": 1, "method": "tools/call",
                                    "params": {"name": "slow"}})
            await relay.from_agent({"jsonrpc": "2.0", "method": "notifications/cancelled",
                                    "params": {"requestId": 1}})
            await relay.from_agent({"jsonrpc": "2.0", "id": 2, "method": "ping"})
            await relay.from_agent({"jsonrpc": "2.0", "method": "notifications/progress",
                                    "params": {"progressToken": 1, "progress": 1}})
            tg.cancel_scope.cancel()
    seen = [m.method if m.method != "mcp/message"  # type: ignore[attr-defined]
            else json.loads(bytes(m.params))["method"] for m in sent]  # type: ignore[attr-defined]
    assert seen == ["tools/call", "$/cancel_request", "ping", "notifications/progress"]


async def test_errors_the_bridge_makes_for_an_agent_request_name_the_server(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("conductor.bridge.relay.MAX_PENDING", 1)
    to_agent_sent: list[dict[str, Any]] = []

    class Sink:  # the chain: takes the first request (never answered), then is gone
        def __init__(self) -> None:
            self.taken = 0

        async def send(self, item: object) -> None:
            self.taken += 1
            if self.taken > 1:
                raise anyio.BrokenResourceError

        async def aclose(self) -> None:
            return None

    async def to_agent(body: dict[str, Any]) -> None:
        to_agent_sent.append(body)

    async def close_agent() -> None:
        return None

    with anyio.fail_after(5):
        async with anyio.create_task_group() as tg:
            relay = Relay(Endpoint("mcp-bridge", Sink()), tg, "c1", "docs", to_agent,
                          close_agent)
            await relay.from_agent({"jsonrpc": "2.0", "id": 1, "method": "tools/call"})
            await relay.from_agent({"jsonrpc": "2.0", "id": 2, "method": "tools/call"})
            relay._outgoing.clear()  # (the first is no longer in flight)
            await relay.from_agent({"jsonrpc": "2.0", "id": 3, "method": "tools/call"})
            await anyio.wait_all_tasks_blocked()
            tg.cancel_scope.cancel()
    errors = {body["id"]: body["error"]["message"] for body in to_agent_sent}
    assert set(errors) == {2, 3}
    assert all("docs" in message for message in errors.values()), errors


async def test_an_agent_request_cancelled_while_handed_over_is_not_left_pending() -> None:
    # The session ends (idle, or the agent left) while the chain is slow to take the
    # request: nothing will wait for its answer, so nothing may keep it in the tables.
    class Sink:  # a chain that does not take anything now
        async def send(self, item: object) -> None:
            await anyio.sleep_forever()

        async def aclose(self) -> None:
            return None

    async def to_agent(body: dict[str, Any]) -> None:
        return None

    async def close_agent() -> None:
        return None

    endpoint = Endpoint("mcp-bridge", Sink())
    with anyio.fail_after(5):
        async with anyio.create_task_group() as tg:
            relay = Relay(endpoint, tg, "c1", "srv", to_agent, close_agent)
            with anyio.move_on_after(0.05):
                await relay.from_agent({"jsonrpc": "2.0", "id": 1, "method": "tools/call"})
    assert endpoint.pending == {}
    assert relay._outgoing == {}


async def test_a_request_with_a_progress_token_cancelled_while_handed_over_leaves_no_token(
        ) -> None:
    # As above, with a progressToken: its entry maps the token to the request for the
    # provider's progress, and would outlive it (one per such request, for the session).
    handing = anyio.CancelScope()

    class Sink:  # the session ends while the chain takes the request
        async def send(self, item: object) -> None:
            handing.cancel()
            await anyio.sleep_forever()

        async def aclose(self) -> None:
            return None

    async def to_agent(body: dict[str, Any]) -> None:
        return None

    async def close_agent() -> None:
        return None

    endpoint = Endpoint("mcp-bridge", Sink())
    with anyio.fail_after(5):
        async with anyio.create_task_group() as tg:
            relay = Relay(endpoint, tg, "c1", "srv", to_agent, close_agent)
            with handing:
                await relay.from_agent({"jsonrpc": "2.0", "id": 1, "method": "tools/call",
                                        "params": {"_meta": {"progressToken": "t1"}}})
    assert handing.cancelled_caught
    assert relay._outgoing == {}
    assert relay.progress == {}


@pytest.mark.parametrize("transport", ["stdio", "http"])
async def test_a_request_the_agent_cancelled_is_not_answered_over_stdio(
        transport: str) -> None:
    # MCP: the receiver of notifications/cancelled does not answer the request (MCP
    # clients that get an answer for an id they dropped report "a response for an
    # unknown message ID"). Over http the 2025 wire ends the request's stream only with
    # an answer, as the SDK's own transport does (-32800).
    to_agent_sent: list[dict[str, Any]] = []

    async def to_agent(body: dict[str, Any]) -> None:
        to_agent_sent.append(body)

    async def close_agent() -> None:
        return None

    with anyio.fail_after(5):
        async with anyio.create_task_group() as tg:
            class Sink:  # a provider that answers a cancelled request -32800
                async def send(self, item: object) -> None:
                    if isinstance(item, Notification) and item.method == "$/cancel_request":
                        ident = json.loads(bytes(item.params))["requestId"]
                        tg.start_soon(endpoint.settle, Response(id=raw(ident), error=raw(
                            {"code": -32800, "message": "Request cancelled"})))

                async def aclose(self) -> None:
                    return None

            endpoint = Endpoint("mcp-bridge", Sink())
            relay = Relay(endpoint, tg, "c1", "srv", to_agent, close_agent,
                          answers_cancelled=transport == "http")
            await relay.from_agent({"jsonrpc": "2.0", "id": 1, "method": "tools/call"})
            await relay.from_agent({"jsonrpc": "2.0", "method": "notifications/cancelled",
                                    "params": {"requestId": 1}})
    assert [body["id"] for body in to_agent_sent] == ([1] if transport == "http" else [])


async def test_an_agent_ending_its_http_session_after_its_server_was_released_is_not_refused(
        caplog: pytest.LogCaptureFixture) -> None:
    # The router releases a serverId once its sessions have closed; the agent's MCP client
    # ends its HTTP session (DELETE, with its token) as it cleans up, often after that.
    # That is the session's own end, not a stranger at the door: it gets "Session not
    # found" as any ended session does, not 401 and a "refused" warning.
    async with open_mcp_bridge("http") as bridge:
        _Provider(bridge, bridge.tg)
        entry, headers = await http_server_entry(bridge)
        with anyio.fail_after(10):
            async with httpx2.AsyncClient() as client:
                opened = await client.post(str(entry["url"]), json=_INITIALIZE,
                                           headers=headers)
                [connection] = list(bridge.relays)
                await bridge._deliver(Notification(method="mcp/disconnect", params=raw(
                    {"connectionId": connection})))
                bridge.release("a")
                with caplog.at_level("WARNING", logger="acp_conductor"):
                    ended = await client.delete(str(entry["url"]), headers={
                        **headers, "mcp-session-id": opened.headers["mcp-session-id"]})
    assert ended.status_code == 404, ended.text
    assert "refused" not in caplog.text


async def test_a_shim_started_after_its_server_was_released_is_told_so_not_refused(
        caplog: pytest.LogCaptureFixture) -> None:
    async with open_mcp_bridge("stdio") as bridge:
        _Provider(bridge, bridge.tg)
        [entry] = servers_of(await bridge.rewrite(setup("a"), support(2, "stdio"),
                                                  frozenset()))
        env = {e["name"]: e["value"] for e in entry["env"]}  # type: ignore[attr-defined]
        bridge.release("a")
        with anyio.fail_after(10), caplog.at_level("WARNING", logger="acp_conductor"):
            answer = await _served(env[SOCKET_ENV], entry["args"][-1],  # type: ignore[index]
                                   env[TOKEN_ENV])
    assert "the sessions that declared the MCP server n-a have closed" in \
        json.loads(answer)["error"]
    assert "refused" not in caplog.text
