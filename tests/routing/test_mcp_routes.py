"""MCP-over-ACP routing in the router itself, frame by frame: who provided which serverId,
connections between the agent and two providers (a proxy and the editor), and endings."""

from __future__ import annotations

import json
from typing import Any

import anyio
import pytest

from conductor.bridge import McpBridge, open_mcp_bridge
from conductor.errors import ComponentExitedError
from conductor.jsonrpc.message import Message, decode, encode
from conductor.routing.chain import Chain
from conductor.routing.mcp import McpInjection, McpServer
from conductor.routing.roles import Role
from conductor.routing.topology import ComponentLink, Hop

Frame = dict[str, Any]


class Outbox:
    """A MessageSink that keeps what the router sent, decoded for assertions."""

    def __init__(self) -> None:
        self.sent: list[Frame] = []

    async def send(self, item: Message | list[Message]) -> None:
        for msg in item if isinstance(item, list) else [item]:
            self.sent.append(json.loads(encode(msg)))

    async def aclose(self) -> None:
        pass

    def take(self) -> Frame:
        assert self.sent, "nothing was sent"
        return self.sent.pop(0)


class Harness:
    """client -> proxy (a scripted subprocess-like proxy) -> agent, at the wire."""

    def __init__(self, *, agent_caps: Frame | None = None, servers: list[McpServer] | None = None,
                 bridge: McpBridge | None = None, **limits: int) -> None:
        self.out = {name: Outbox() for name in ("client", "proxy", "agent")}
        self.hops = {name: Hop(name, box) for name, box in self.out.items()}
        self.agent_caps = agent_caps if agent_caps is not None else \
            {"mcpCapabilities": {"acp": True}}

        async def starter() -> list[ComponentLink]:
            return [ComponentLink("proxy", Role.PROXY, self.hops["proxy"]),
                    ComponentLink("agent", Role.AGENT, self.hops["agent"])]

        self.chain = Chain(self.hops["client"], starter, mcp=McpInjection(servers or []),
                           bridge=bridge)
        if bridge is not None:
            bridge.attach(self.chain)
        for key, value in limits.items():
            setattr(self.chain.mcp_routes, key, value)
        self._ids = 0

    async def frame(self, name: str, message: Frame) -> None:
        with anyio.fail_after(5):
            await self.chain.receive(self.hops[name], decode(json.dumps(
                {"jsonrpc": "2.0", **message}).encode()))

    def next_id(self) -> int:
        self._ids += 1
        return self._ids

    async def start(self, version: int = 1) -> None:
        """Initialized at protocol `version` (v2: the agent's caps in v2's shape)."""
        await self.frame("client", {"id": 0, "method": "initialize",
                                    "params": {"protocolVersion": version}})
        init = self.out["proxy"].take()
        await self.frame("proxy", {"id": "pi", "method": "_proxy/successor",
                                   "params": {"method": "initialize", "params": init["params"]}})
        at_agent = self.out["agent"].take()
        caps = {"agentCapabilities": self.agent_caps} if version == 1 else \
            {"capabilities": {"session": {"mcp": {"acp": {}}}}}
        await self.frame("agent", {"id": at_agent["id"], "result": {
            "protocolVersion": version, **caps}})
        self.out["proxy"].take()
        await self.frame("proxy", {"id": init["id"], "result": {"protocolVersion": version}})
        self.out["client"].take()

    async def new_session(self, sid: str, client_servers: list[Frame],
                          proxy_servers: list[Frame]) -> Frame:
        """session/new from the client (declaring `client_servers`) through the proxy (which
        adds `proxy_servers`) to the agent, answered `sid`; returns what the agent got."""
        ident = self.next_id()
        params = {"cwd": "/", "mcpServers": client_servers}
        await self.frame("client", {"id": ident, "method": "session/new", "params": params})
        at_proxy = self.out["proxy"].take()
        params = {**at_proxy["params"],
                  "mcpServers": [*at_proxy["params"]["mcpServers"], *proxy_servers]}
        await self.frame("proxy", {"id": f"p{ident}", "method": "_proxy/successor",
                                   "params": {"method": "session/new", "params": params}})
        at_agent = self.out["agent"].take()
        await self.frame("agent", {"id": at_agent["id"], "result": {"sessionId": sid}})
        self.out["proxy"].take()
        await self.frame("proxy", {"id": at_proxy["id"], "result": {"sessionId": sid}})
        assert self.out["client"].take()["result"] == {"sessionId": sid}
        return at_agent

    async def close_session(self, sid: str) -> None:
        """session/close from the client through the proxy to the agent, answered at each
        hop; what the router sent besides (mcp/disconnect) stays in the outboxes."""
        await self.frame("client", {"id": 50, "method": "session/close",
                                    "params": {"sessionId": sid}})
        at_proxy = self.out["proxy"].take()
        await self.frame("proxy", {"id": "pc", "method": "_proxy/successor", "params": {
            "method": "session/close", "params": {"sessionId": sid}}})
        await self.frame("agent", {"id": self.out["agent"].take()["id"], "result": {}})
        await self.frame("proxy", {"id": at_proxy["id"], "result": {}})

    async def agent_asks(self, method: str, params: Frame) -> int:
        ident = self.next_id() + 1000
        await self.frame("agent", {"id": ident, "method": method, "params": params})
        return ident


def acp_server(name: str, server_id: str) -> Frame:
    return {"type": "acp", "name": name, "serverId": server_id}


async def disconnected(h: Harness, provider_conn: str, agent_conn: str) -> None:
    """The editor (the provider here) was asked to disconnect `provider_conn`, and answers;
    the agent was told that `agent_conn` ended."""
    disconnect = h.out["client"].take()
    assert disconnect["method"] == "mcp/disconnect"
    assert disconnect["params"] == {"connectionId": provider_conn}
    assert h.out["agent"].take() == {"jsonrpc": "2.0", "method": "mcp/disconnect",
                                     "params": {"connectionId": agent_conn}}
    await h.frame("client", {"id": disconnect["id"], "result": {}})


async def connect_through(h: Harness, server_id: str, provider: str, answer: str) -> str:
    """The agent connects to `server_id`; `provider` answers connectionId `answer`; returns
    the connectionId the agent got."""
    ident = await h.agent_asks("mcp/connect", {"serverId": server_id})
    got = h.out[provider].take()
    if provider == "proxy":
        assert got["method"] == "_proxy/successor"
        assert got["params"]["method"] == "mcp/connect"
    else:
        assert got["method"] == "mcp/connect"
    await h.frame(provider, {"id": got["id"], "result": {"connectionId": answer}})
    reply = h.out["agent"].take()
    assert reply["id"] == ident
    return str(reply["result"]["connectionId"])


def inner(frame: Frame) -> Frame:
    """The mcp/* call in a frame, unwrapped when it came in a successor envelope."""
    if frame.get("method") == "_proxy/successor":
        return {"id": frame.get("id"), **frame["params"]}
    return frame


async def test_connections_to_a_proxy_and_the_editor_interleave_across_two_sessions() -> None:
    h = Harness()
    await h.start()
    s1 = await h.new_session("s1", [acp_server("editor-tools", "ed-1")],
                             [acp_server("proxy-tools", "px-1")])
    s2 = await h.new_session("s2", [acp_server("editor-tools", "ed-2")],
                             [acp_server("proxy-tools", "px-2")])
    # the agent sees every declaration unchanged (it takes acp itself)
    assert [s["serverId"] for s in s1["params"]["mcpServers"]] == ["ed-1", "px-1"]
    assert [s["serverId"] for s in s2["params"]["mcpServers"]] == ["ed-2", "px-2"]

    # Both providers pick the same connectionId, "c1": the agent gets distinct ones.
    ask = await h.agent_asks("mcp/connect", {"serverId": "px-2"})
    at_proxy = h.out["proxy"].take()
    assert at_proxy["params"] == {"method": "mcp/connect", "params": {
        "serverId": "px-2", "_meta": {"acpSessionId": "s2"}}}
    ask_ed = await h.agent_asks("mcp/connect", {"serverId": "ed-1"})
    at_editor = h.out["client"].take()  # straight to the editor: the proxy is skipped
    assert at_editor["method"] == "mcp/connect"
    assert at_editor["params"] == {"serverId": "ed-1", "_meta": {"acpSessionId": "s1"}}
    assert h.out["proxy"].sent == []
    await h.frame("client", {"id": at_editor["id"], "result": {"connectionId": "c1"}})
    await h.frame("proxy", {"id": at_proxy["id"], "result": {"connectionId": "c1"}})
    answers = {f["id"]: f["result"]["connectionId"] for f in h.out["agent"].sent}
    h.out["agent"].sent.clear()
    to_editor, to_proxy = answers[ask_ed], answers[ask]
    assert to_editor != to_proxy

    # A tool call on each, interleaved: each reaches its own provider, with its own id.
    call_proxy = await h.agent_asks("mcp/message", {"connectionId": to_proxy,
                                                    "method": "tools/call", "params": {"n": 1}})
    call_editor = await h.agent_asks("mcp/message", {"connectionId": to_editor,
                                                     "method": "tools/call", "params": {"n": 2}})
    got_proxy, got_editor = inner(h.out["proxy"].take()), h.out["client"].take()
    assert got_proxy["params"] == {"connectionId": "c1", "method": "tools/call",
                                   "params": {"n": 1}}
    assert got_editor["params"] == {"connectionId": "c1", "method": "tools/call",
                                    "params": {"n": 2}}
    # the editor answers first; then the proxy sends a progress notification, then answers
    await h.frame("client", {"id": got_editor["id"], "result": {"content": ["editor"]}})
    await h.frame("proxy", {"method": "_proxy/successor", "params": {
        "method": "mcp/message", "params": {"connectionId": "c1",
                                            "method": "notifications/progress",
                                            "params": {"progress": 1}}}})
    await h.frame("proxy", {"id": got_proxy["id"], "result": {"content": ["proxy"]}})
    assert h.out["agent"].take() == {"jsonrpc": "2.0", "id": call_editor,
                                     "result": {"content": ["editor"]}}
    assert h.out["agent"].take() == {"jsonrpc": "2.0", "method": "mcp/message", "params": {
        "connectionId": to_proxy, "method": "notifications/progress",
        "params": {"progress": 1}}}
    assert h.out["agent"].take() == {"jsonrpc": "2.0", "id": call_proxy,
                                     "result": {"content": ["proxy"]}}

    # The editor asks the agent something over its connection (the reverse direction).
    await h.frame("client", {"id": 77, "method": "mcp/message", "params": {
        "connectionId": "c1", "method": "roots/list"}})
    reverse = h.out["agent"].take()
    assert reverse["params"] == {"connectionId": to_editor, "method": "roots/list"}
    await h.frame("agent", {"id": reverse["id"], "result": {"roots": []}})
    assert h.out["client"].take() == {"jsonrpc": "2.0", "id": 77, "result": {"roots": []}}

    # Disconnect: the provider hears it under its own id; the connection is gone.
    await h.agent_asks("mcp/disconnect", {"connectionId": to_editor})
    assert h.out["client"].take()["params"] == {"connectionId": "c1"}
    assert to_editor not in h.chain.mcp_routes.connections
    assert to_proxy in h.chain.mcp_routes.connections


async def test_an_unknown_server_or_connection_is_refused_naming_it() -> None:
    h = Harness()
    await h.start()
    await h.new_session("s1", [], [acp_server("tools", "px-1")])
    ident = await h.agent_asks("mcp/connect", {"serverId": "nope"})
    refused = h.out["agent"].take()
    assert refused["id"] == ident
    assert refused["error"]["code"] == -32602
    assert refused["error"]["data"] == {"serverId": "nope", "method": "mcp/connect"}
    assert "nope" in refused["error"]["message"]
    ident = await h.agent_asks("mcp/message", {"connectionId": "ghost", "method": "ping"})
    refused = h.out["agent"].take()
    assert refused["error"]["code"] == -32602
    assert refused["error"]["data"]["connectionId"] == "ghost"
    # a provider cannot speak on a connection it does not hold either
    await h.frame("proxy", {"id": 5, "method": "_proxy/successor", "params": {
        "method": "mcp/message", "params": {"connectionId": "ghost", "method": "x"}}})
    assert h.out["proxy"].take()["error"]["data"]["connectionId"] == "ghost"
    assert h.out["client"].sent == [] and h.out["agent"].sent == []


async def test_a_provider_that_exits_mid_call_fails_the_call_and_disconnects_the_agent() -> None:
    h = Harness()
    await h.start()
    await h.new_session("s1", [], [acp_server("tools", "px-1")])
    conn = await connect_through(h, "px-1", "proxy", "c9")
    call = await h.agent_asks("mcp/message", {"connectionId": conn, "method": "tools/call"})
    h.out["proxy"].take()
    await h.chain.fail_hop(h.hops["proxy"], ComponentExitedError("proxy", 1, ["boom"]))
    failed = h.out["agent"].take()
    assert failed["id"] == call
    assert failed["error"]["code"] == -33001
    assert failed["error"]["data"]["component"] == "proxy"
    assert h.out["agent"].take() == {"jsonrpc": "2.0", "method": "mcp/disconnect",
                                     "params": {"connectionId": conn}}
    assert h.chain.mcp_routes.connections == {}
    assert h.chain.mcp_routes.declarations == {}  # its serverIds are gone with it


async def test_the_agent_cancelling_a_tool_call_reaches_the_provider_under_its_own_id() -> None:
    h = Harness()
    await h.start()
    await h.new_session("s1", [acp_server("tools", "ed-1")], [])
    conn = await connect_through(h, "ed-1", "client", "c1")
    call = await h.agent_asks("mcp/message", {"connectionId": conn, "method": "tools/call"})
    at_editor = h.out["client"].take()
    await h.frame("agent", {"method": "$/cancel_request", "params": {"requestId": call}})
    assert h.out["client"].take() == {"jsonrpc": "2.0", "method": "$/cancel_request",
                                      "params": {"requestId": at_editor["id"]}}
    await h.frame("client", {"id": at_editor["id"], "error": {"code": -32800,
                                                               "message": "cancelled"}})
    assert h.out["agent"].take()["error"]["code"] == -32800


async def test_closing_a_session_ends_its_connections_at_both_ends_and_frees_its_state() -> None:
    h = Harness()
    await h.start()
    await h.new_session("s1", [acp_server("tools", "ed-1")], [acp_server("p", "px-1")])
    await h.new_session("s2", [], [acp_server("p", "px-2")])
    conn = await connect_through(h, "ed-1", "client", "c1")
    other = await connect_through(h, "px-2", "proxy", "c2")
    await h.close_session("s1")
    # the editor (provider) is asked to disconnect; the agent is told
    await disconnected(h, "c1", conn)
    assert list(h.chain.mcp_routes.connections) == [other]
    assert sorted(h.chain.mcp_routes.declarations) == ["px-2"]


async def test_a_failed_session_setup_releases_what_it_declared() -> None:
    h = Harness()
    await h.start()
    await h.frame("client", {"id": 1, "method": "session/new", "params": {
        "cwd": "/", "mcpServers": [acp_server("t", "ed-1")]}})
    at_proxy = h.out["proxy"].take()
    assert "ed-1" in h.chain.mcp_routes.declarations
    await h.frame("proxy", {"id": at_proxy["id"], "error": {"code": -32000, "message": "no"}})
    assert h.chain.mcp_routes.declarations == {}


async def test_connections_over_the_limit_are_refused_with_the_limit() -> None:
    h = Harness(max_connections=1)
    await h.start()
    await h.new_session("s1", [acp_server("t", "ed-1")], [])
    await connect_through(h, "ed-1", "client", "c1")
    await h.agent_asks("mcp/connect", {"serverId": "ed-1"})
    refused = h.out["agent"].take()
    assert refused["error"]["code"] == -33007
    assert refused["error"]["data"] == {"serverId": "ed-1", "limit": 1}


async def test_connects_in_flight_count_toward_the_limit_until_they_are_answered() -> None:
    h = Harness(max_connections=1)
    await h.start()
    await h.new_session("s1", [acp_server("t", "ed-1")], [])
    first = await h.agent_asks("mcp/connect", {"serverId": "ed-1"})
    at_client = h.out["client"].take()
    await h.agent_asks("mcp/connect", {"serverId": "ed-1"})  # before the first is answered
    refused = h.out["agent"].take()
    assert refused["error"]["code"] == -33007
    assert h.out["client"].sent == []  # the provider never saw the second
    await h.frame("client", {"id": at_client["id"], "error": {"code": -32000, "message": "no"}})
    assert h.out["agent"].take()["id"] == first
    await connect_through(h, "ed-1", "client", "c1")  # a refused connect gave its place back


@pytest.mark.parametrize("version", [1, 2])
async def test_a_bridge_makes_the_chain_say_the_agent_takes_acp(version: int) -> None:
    class Bridge:
        def covers(self, support: object) -> bool:
            return True

        async def rewrite(self, params: Any, support: object, required: object) -> Any:
            return params

        def release(self, server_id: str) -> None:
            return None

    out = {name: Outbox() for name in ("client", "agent")}
    hops = {name: Hop(name, box) for name, box in out.items()}

    async def starter() -> list[ComponentLink]:
        return [ComponentLink("agent", Role.AGENT, hops["agent"])]

    chain = Chain(hops["client"], starter, bridge=Bridge())
    await chain.receive(hops["client"], decode(json.dumps(
        {"jsonrpc": "2.0", "id": 0, "method": "initialize",
         "params": {"protocolVersion": version}}).encode()))
    ident = out["agent"].take()["id"]
    caps = {"agentCapabilities": {"loadSession": True}} if version == 1 else \
        {"capabilities": {"session": {"mcp": {"http": {}}}}}
    await chain.receive(hops["agent"], decode(json.dumps(
        {"jsonrpc": "2.0", "id": ident, "result": {"protocolVersion": version, **caps}}
    ).encode()))
    result = out["client"].take()["result"]
    if version == 1:
        assert result["agentCapabilities"] == {"loadSession": True,
                                               "mcpCapabilities": {"acp": True}}
    else:
        assert result["capabilities"]["session"]["mcp"] == {"http": {}, "acp": {}}


async def test_a_bridged_server_whose_sessions_closed_makes_room_for_another(
        monkeypatch: pytest.MonkeyPatch) -> None:
    # The bridge keeps each serverId's URL (or shim key) and token; past its limit the
    # oldest goes. Those of closed sessions must go first, or a long-lived session's
    # tools are the ones dropped once enough sessions have come and gone.
    monkeypatch.setattr("conductor.bridge.MAX_SERVERS", 2)
    async with open_mcp_bridge("http") as bridge:
        h = Harness(agent_caps={"mcpCapabilities": {"http": True}}, bridge=bridge)
        await h.start()
        await h.new_session("s1", [], [acp_server("p", "px-1")])
        await h.new_session("s2", [], [acp_server("p", "px-2")])
        await h.close_session("s2")
        assert h.out["proxy"].take()["id"] == "pc"  # (answered at each hop)
        assert h.out["client"].take()["result"] == {}
        await h.new_session("s3", [], [acp_server("p", "px-3")])
        assert sorted(bridge.servers) == ["px-1", "px-3"]


async def session_new_refused(h: Harness, client_servers: list[Frame],
                              proxy_servers: list[Frame]) -> Frame:
    await h.frame("client", {"id": 9, "method": "session/new",
                             "params": {"cwd": "/", "mcpServers": client_servers}})
    at_proxy = h.out["proxy"].take()
    await h.frame("proxy", {"id": "p9", "method": "_proxy/successor", "params": {
        "method": "session/new", "params": {**at_proxy["params"], "mcpServers": [
            *at_proxy["params"]["mcpServers"], *proxy_servers]}}})
    assert h.out["agent"].sent == []  # never reached the agent
    refused = h.out["proxy"].take()
    assert refused["id"] == "p9"
    return dict(refused["error"])


async def test_a_required_acp_server_an_agent_cannot_take_refuses_the_session() -> None:
    h = Harness(agent_caps={}, servers=[McpServer("tools", "acp", provider="proxy",
                                                  required=True)])
    await h.start()
    error = await session_new_refused(h, [], [acp_server("tools", "px-1")])
    assert error["code"] == -32602
    assert error["data"]["mcpServer"] == "tools"
    assert "does not take acp MCP servers" in error["message"]


async def test_a_required_acp_server_no_proxy_declared_refuses_the_session() -> None:
    h = Harness(servers=[McpServer("tools", "acp", provider="proxy", required=True)])
    await h.start()
    error = await session_new_refused(h, [], [])
    assert error["data"] == {"mcpServer": "tools", "reason":
                             "its provider did not declare it in this session setup"}


async def test_a_required_http_server_an_agent_without_http_refuses_the_session() -> None:
    h = Harness(agent_caps={"mcpCapabilities": {"http": False}},
                servers=[McpServer("web", "http", url="http://127.0.0.1:1/mcp", required=True)])
    await h.start()
    error = await session_new_refused(h, [], [])
    assert error["code"] == -32602
    assert "'web' is required" in error["message"]


async def test_acp_servers_never_reach_an_agent_that_takes_none_without_a_bridge() -> None:
    h = Harness(agent_caps={})
    await h.start()
    at_agent = await h.new_session("s1", [acp_server("ed", "ed-1"),
                                          {"name": "files", "command": "/bin/f", "args": [],
                                           "env": []}], [acp_server("p", "px-1")])
    assert at_agent["params"]["mcpServers"] == [{"name": "files", "command": "/bin/f",
                                                 "args": [], "env": []}]


async def test_a_side_connection_reaches_a_provider_deep_in_the_chain_in_its_envelope() -> None:
    """The bridge connects from one past the agent: a provider anywhere upstream gets the
    connect wrapped, as from its successor, and its answers and messages come back."""
    out = {name: Outbox() for name in ("client", "p0", "p1", "agent", "bridge")}
    hops = {name: Hop(name, box) for name, box in out.items()}

    async def starter() -> list[ComponentLink]:
        return [ComponentLink("p0", Role.PROXY, hops["p0"]),
                ComponentLink("p1", Role.PROXY, hops["p1"]),
                ComponentLink("agent", Role.AGENT, hops["agent"])]

    chain = Chain(hops["client"], starter)
    chain.topology.add_side("bridge", hops["bridge"])  # attached before the chain starts

    async def frame(name: str, message: Frame) -> None:
        with anyio.fail_after(5):
            await chain.receive(hops[name], decode(json.dumps(
                {"jsonrpc": "2.0", **message}).encode()))

    await frame("client", {"id": 0, "method": "initialize", "params": {"protocolVersion": 1}})
    out["p0"].take()
    # p1 declares a server in a session setup it sends to the agent
    await frame("p1", {"id": "s", "method": "_proxy/successor", "params": {
        "method": "session/new", "params": {"cwd": "/", "mcpServers": [
            acp_server("deep", "p1-1")]}}})
    new = out["agent"].take()
    await frame("agent", {"id": new["id"], "result": {"sessionId": "s1"}})
    out["p1"].take()
    await frame("bridge", {"id": 1, "method": "mcp/connect", "params": {"serverId": "p1-1"}})
    at_p1 = out["p1"].take()
    assert at_p1["method"] == "_proxy/successor"
    assert at_p1["params"]["params"] == {"serverId": "p1-1", "_meta": {"acpSessionId": "s1"}}
    await frame("p1", {"id": at_p1["id"], "result": {"connectionId": "c"}})
    conn = out["bridge"].take()["result"]["connectionId"]
    await frame("p1", {"method": "_proxy/successor", "params": {"method": "mcp/message",
                       "params": {"connectionId": "c", "method": "notifications/x"}}})
    assert out["bridge"].take()["params"] == {"connectionId": conn, "method": "notifications/x"}
    await chain.fail_hop(hops["p1"], ComponentExitedError("p1", 1, []))
    assert out["bridge"].take()["method"] == "mcp/disconnect"
    assert out["p0"].sent == [] and out["client"].sent == []


async def test_an_expired_session_ends_its_connections_like_a_closed_one() -> None:
    h = Harness()
    await h.start()
    await h.new_session("s1", [acp_server("tools", "ed-1")], [])
    conn = await connect_through(h, "ed-1", "client", "c1")
    assert await h.chain.expire_idle(0.0) == ["s1"]
    await disconnected(h, "c1", conn)
    assert h.chain.mcp_routes.connections == {}
    assert h.chain.mcp_routes.declarations == {}


async def test_a_connect_answered_after_its_session_closed_is_refused_and_ended_at_the_provider(
        ) -> None:
    # The provider opened a connection nobody can reach any more (the serverId is gone): it
    # must hear mcp/disconnect, and the agent must not get the provider's own id as if the
    # connection were usable.
    h = Harness()
    await h.start()
    await h.new_session("s1", [acp_server("tools", "ed-1")], [])
    ident = await h.agent_asks("mcp/connect", {"serverId": "ed-1"})
    connect = h.out["client"].take()
    assert connect["method"] == "mcp/connect"
    await h.close_session("s1")
    assert h.chain.mcp_routes.declarations == {}
    h.out["client"].sent.clear()
    await h.frame("client", {"id": connect["id"], "result": {"connectionId": "late"}})
    refused = h.out["agent"].take()
    assert refused["id"] == ident
    assert refused["error"]["code"] == -32602
    assert "ed-1" in refused["error"]["message"]
    disconnect = h.out["client"].take()
    assert disconnect["method"] == "mcp/disconnect"
    assert disconnect["params"] == {"connectionId": "late"}
    await h.frame("client", {"id": disconnect["id"], "result": {}})
    assert h.chain.mcp_routes.connections == {}


async def test_a_connection_opened_before_its_session_new_is_answered_ends_with_that_session(
        ) -> None:
    # Agents may connect before they answer session/new (docs/mcp.md): the connection has
    # no session yet when it opens, and must still end when the session does, or the
    # router keeps it (toward the limit) and routes the agent's messages to a provider
    # that closed it.
    h = Harness()
    await h.start()
    await h.frame("client", {"id": 1, "method": "session/new", "params": {
        "cwd": "/", "mcpServers": [acp_server("tools", "ed-1")]}})
    at_proxy = h.out["proxy"].take()
    await h.frame("proxy", {"id": "p1", "method": "_proxy/successor", "params": {
        "method": "session/new", "params": at_proxy["params"]}})
    at_agent = h.out["agent"].take()
    conn = await connect_through(h, "ed-1", "client", "c1")  # session/new still unanswered
    await h.frame("agent", {"id": at_agent["id"], "result": {"sessionId": "s1"}})
    h.out["proxy"].take()
    await h.frame("proxy", {"id": at_proxy["id"], "result": {"sessionId": "s1"}})
    h.out["client"].take()
    await h.close_session("s1")
    await disconnected(h, "c1", conn)
    assert h.chain.mcp_routes.connections == {}
    assert h.chain.mcp_routes.declarations == {}


async def test_a_connection_opened_during_a_session_new_that_fails_ends_at_both_ends() -> None:
    h = Harness()
    await h.start()
    await h.frame("client", {"id": 1, "method": "session/new", "params": {
        "cwd": "/", "mcpServers": [acp_server("tools", "ed-1")]}})
    at_proxy = h.out["proxy"].take()
    await h.frame("proxy", {"id": "p1", "method": "_proxy/successor", "params": {
        "method": "session/new", "params": at_proxy["params"]}})
    at_agent = h.out["agent"].take()
    conn = await connect_through(h, "ed-1", "client", "c1")
    await h.frame("agent", {"id": at_agent["id"], "error": {"code": -32000, "message": "no"}})
    h.out["proxy"].take()
    await h.frame("proxy", {"id": at_proxy["id"], "error": {"code": -32000, "message": "no"}})
    [disconnect] = [f for f in h.out["client"].sent if f.get("method") == "mcp/disconnect"]
    assert [f["error"]["code"] for f in h.out["client"].sent if "error" in f] == [-32000]
    assert disconnect["params"] == {"connectionId": "c1"}
    assert h.out["agent"].take() == {"jsonrpc": "2.0", "method": "mcp/disconnect",
                                     "params": {"connectionId": conn}}
    assert h.chain.mcp_routes.connections == {}
    assert h.chain.mcp_routes.declarations == {}


async def test_a_refused_session_setup_leaves_no_declaration_behind() -> None:
    # Each one left held ("pending") could never be released nor evicted: after enough
    # refusals, every new serverId was over the limit and not routable.
    h = Harness(agent_caps={}, servers=[McpServer("tools", "acp", provider="proxy",
                                                  required=True)])
    await h.start()
    await session_new_refused(h, [], [acp_server("tools", "px-1")])
    assert h.chain.mcp_routes.declarations == {}


async def test_a_session_setup_for_an_agent_that_is_gone_leaves_no_declaration_behind(
        ) -> None:
    h = Harness()
    await h.start()
    await h.chain.fail_hop(h.hops["agent"], ComponentExitedError("agent", 1))
    await h.frame("proxy", {"id": "p9", "method": "_proxy/successor", "params": {
        "method": "session/new", "params": {"cwd": "/", "mcpServers": [
            acp_server("tools", "px-1")]}}})
    assert h.out["proxy"].take()["error"]["code"] == -33001
    assert h.chain.mcp_routes.declarations == {}


async def test_a_connection_to_a_server_of_two_sessions_ends_when_both_have_closed() -> None:
    h = Harness()
    await h.start()
    await h.new_session("s1", [acp_server("tools", "ed-1")], [])
    await h.new_session("s2", [acp_server("tools", "ed-1")], [])  # the editor's, in both
    conn = await connect_through(h, "ed-1", "client", "c1")
    await h.close_session("s1")
    assert list(h.chain.mcp_routes.connections) == [conn]  # s2 still has the server
    h.out["client"].sent.clear()
    await h.close_session("s2")
    [disconnect] = [f for f in h.out["client"].sent if f.get("method") == "mcp/disconnect"]
    assert disconnect["params"] == {"connectionId": "c1"}
    assert {"jsonrpc": "2.0", "method": "mcp/disconnect",
            "params": {"connectionId": conn}} in h.out["agent"].sent
    assert h.chain.mcp_routes.connections == {}
    assert h.chain.mcp_routes.declarations == {}


@pytest.mark.parametrize("version", [1, 2])
async def test_a_tool_call_in_flight_when_its_session_closes_is_answered_and_cancelled(
        version: int) -> None:
    # The editor is told to disconnect; nothing obliges it to answer what it was asked on
    # that connection, and the agent must not wait for that answer for ever. A v1 editor
    # is sent no $/cancel_request (v1 SDK clients print a traceback for it): its late
    # answer is dropped.
    h = Harness()
    await h.start(version)
    await h.new_session("s1", [acp_server("tools", "ed-1")], [])
    conn = await connect_through(h, "ed-1", "client", "c1")
    call = await h.agent_asks("mcp/message", {"connectionId": conn, "method": "tools/call"})
    at_editor = h.out["client"].take()
    await h.close_session("s1")
    answered = [f for f in h.out["agent"].sent if f.get("id") == call]
    assert [f["error"]["code"] for f in answered] == [-32800]
    assert "session closed" in answered[0]["error"]["message"]
    cancels = [f for f in h.out["client"].sent if f.get("method") == "$/cancel_request"]
    assert cancels == ([] if version == 1 else [
        {"jsonrpc": "2.0", "method": "$/cancel_request",
         "params": {"requestId": at_editor["id"]}}])
    await h.frame("client", {"id": at_editor["id"], "result": {"content": []}})  # too late
    assert [f for f in h.out["agent"].sent if f.get("id") == call] == answered


async def test_a_connect_answered_after_the_agent_exited_is_ended_at_the_provider() -> None:
    # Nobody is left to use or end the connection the provider opened: it must hear
    # mcp/disconnect now, not hold the connection (and a place under the limit) until
    # the session closes.
    h = Harness()
    await h.start()
    await h.new_session("s1", [acp_server("tools", "ed-1")], [])
    await h.agent_asks("mcp/connect", {"serverId": "ed-1"})
    connect = h.out["client"].take()
    await h.chain.fail_hop(h.hops["agent"], ComponentExitedError("agent", 1, ["boom"]))
    h.out["client"].sent.clear()
    await h.frame("client", {"id": connect["id"], "result": {"connectionId": "late"}})
    disconnects = [f for f in h.out["client"].sent if f.get("method") == "mcp/disconnect"]
    assert [f["params"] for f in disconnects] == [{"connectionId": "late"}]
    assert h.chain.mcp_routes.connections == {}


async def test_a_connection_id_the_provider_gives_again_ends_the_older_connection_at_the_agent(
        ) -> None:
    # The provider reusing an id says its older connection is over; the agent holding it
    # must hear so, not find out by a refusal of its next message.
    h = Harness()
    await h.start()
    await h.new_session("s1", [acp_server("tools", "ed-1")], [])
    first = await connect_through(h, "ed-1", "client", "c1")
    ident = await h.agent_asks("mcp/connect", {"serverId": "ed-1"})
    await h.frame("client", {"id": h.out["client"].take()["id"],
                             "result": {"connectionId": "c1"}})
    assert h.out["agent"].take() == {"jsonrpc": "2.0", "method": "mcp/disconnect",
                                     "params": {"connectionId": first}}
    second = h.out["agent"].take()
    assert second["id"] == ident and second["result"]["connectionId"] != first
    assert list(h.chain.mcp_routes.connections) == [second["result"]["connectionId"]]


async def test_a_proxy_that_is_a_connector_and_a_provider_under_one_connection_id_is_understood(
        ) -> None:
    # A nested conductor as proxy:0 mints connectionIds `mcp-1`, ... as its own provider
    # ids, and so does this conductor for the connections proxy:0 makes as a connector.
    # Which one a message means is told by the way it travels: wrapped, toward its
    # successor (it speaks as a provider to the agent); plain, toward the editor (as a
    # connector). Taken for the connector's, the agent's tool traffic went to the editor.
    h = Harness()
    await h.start()
    await h.new_session("s1", [acp_server("editor-tools", "ed-1")],
                        [acp_server("proxy-tools", "px-1")])
    await h.frame("proxy", {"id": "pc", "method": "mcp/connect", "params": {"serverId": "ed-1"}})
    at_editor = h.out["client"].take()
    await h.frame("client", {"id": at_editor["id"], "result": {"connectionId": "e7"}})
    as_connector = h.out["proxy"].take()["result"]["connectionId"]
    to_agent = await connect_through(h, "px-1", "proxy", as_connector)  # the same string
    await h.frame("proxy", {"method": "_proxy/successor", "params": {
        "method": "mcp/message", "params": {"connectionId": as_connector,
                                            "method": "notifications/progress"}}})
    assert h.out["client"].sent == []
    assert h.out["agent"].take()["params"] == {"connectionId": to_agent,
                                               "method": "notifications/progress"}
    # ... and plain, it is the connector's, to the editor
    await h.frame("proxy", {"method": "mcp/message", "params": {
        "connectionId": as_connector, "method": "notifications/initialized"}})
    assert h.out["client"].take()["params"] == {"connectionId": "e7",
                                                "method": "notifications/initialized"}
    assert h.out["agent"].sent == []
