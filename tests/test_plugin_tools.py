"""Proxies give the agent tools: MCP servers on the official SDK, served in-process over
MCP-over-ACP through the real router (the agent here is an MCP client speaking raw
`mcp/*`; tests/e2e/test_mcp_bridge.py has real SDK clients)."""

from __future__ import annotations

import json
import subprocess
import sys
from contextlib import asynccontextmanager
from typing import TYPE_CHECKING, Any

import anyio
import mcp_types
import pytest
from mcp.server.lowlevel import Server
from mcp.server.mcpserver import Context, MCPServer
from pydantic import BaseModel

from conductor.errors import RpcError
from conductor.jsonrpc.message import (
    Message,
    Notification,
    Request,
    Response,
    encode,
    payload,
    raw,
)
from conductor.plugins import McpOffer, Proxy, SessionSetup, tool_context
from conductor.plugins.host import open_inprocess_proxy
from conductor.testing import ScriptedAgent, TestClient, open_test_chain
from tests.conftest import REPO, child_env

if TYPE_CHECKING:
    from collections.abc import AsyncIterator, Callable
    from pathlib import Path

    from conductor.jsonrpc.message import JsonValue

INIT = {"protocolVersion": "2025-06-18", "capabilities": {},
        "clientInfo": {"name": "test-agent", "version": "0"}}


class McpAgent(ScriptedAgent):
    """An agent that takes `acp` MCP servers and talks MCP over ACP when told to."""

    def __init__(self, *, takes_acp: bool = True, version: int = 1) -> None:
        super().__init__({"initialize": self._init, "session/new": self._new})
        self.takes_acp = takes_acp
        self.version = version
        self.servers: dict[str, list[dict[str, Any]]] = {}
        self.answer_mcp: dict[str, JsonValue] = {}  # what it answers the server's requests
        self.replies["mcp/message"] = self._mcp_request

    async def _init(self, agent: ScriptedAgent, msg: Request) -> JsonValue:
        if self.version >= 2:
            mcp: JsonValue = {"acp": {}} if self.takes_acp else {}
            return {"protocolVersion": 2, "info": {"name": "mcp-agent", "version": "0"},
                    "capabilities": {"session": {"mcp": mcp}}}
        return {"protocolVersion": 1,
                "agentCapabilities": {"mcpCapabilities": {"acp": self.takes_acp}}}

    async def _new(self, agent: ScriptedAgent, msg: Request) -> JsonValue:
        sid = f"s{len(self.servers) + 1}"
        self.servers[sid] = msg.params_value().get("mcpServers", [])
        return {"sessionId": sid}

    async def _mcp_request(self, agent: ScriptedAgent, msg: Request) -> JsonValue:
        return self.answer_mcp[msg.params_value()["method"]]

    async def open_mcp(self, session: str, name: str | None = None, *,
                       capabilities: dict[str, JsonValue] | None = None) -> str:
        """Connect to a server of `session` (its first, or `name`) and initialize it, as an
        MCP client with `capabilities` (e.g. elicitation); returns the connectionId."""
        entry = next(s for s in self.servers[session] if name is None or s["name"] == name)
        conn = await self.call("mcp/connect", {"serverId": entry["serverId"]})
        ident = str(conn["connectionId"])
        await self.mcp(ident, "initialize",
                       {**INIT, "capabilities": capabilities} if capabilities else INIT)
        await self.notify("mcp/message", {"connectionId": ident,
                                          "method": "notifications/initialized"})
        return ident

    async def mcp(self, conn: str, method: str, params: JsonValue = None) -> Any:
        body: dict[str, JsonValue] = {"connectionId": conn, "method": method}
        if params is not None:
            body["params"] = params
        return await self.call("mcp/message", body)

    def mcp_notifications(self, method: str) -> list[JsonValue]:
        return [p for p in self.received_params("mcp/message") if p["method"] == method]


def docs_server(started: anyio.Event | None = None, release: anyio.Event | None = None,
                cancelled: list[str] | None = None) -> MCPServer:
    server = MCPServer("docs", instructions="search the docs")

    @server.tool()
    async def search(query: str, ctx: Context) -> str:
        """Search the docs."""
        await ctx.report_progress(1, 2, "halfway")
        await ctx.session.send_tool_list_changed()
        call = tool_context()
        return f"found {query} for session {call.session_id}"

    @server.tool()
    async def slow(ctx: Context) -> str:
        assert started is not None and release is not None and cancelled is not None
        started.set()
        try:
            await release.wait()
        except anyio.get_cancelled_exc_class():
            cancelled.append("slow")
            raise
        return "done"

    @server.tool()
    async def confirm(what: str) -> str:
        call = tool_context()
        await call.update({"sessionUpdate": "agent_message_chunk",
                           "content": {"type": "text", "text": f"asking about {what}"}})
        return "yes" if await call.ask_permission(f"Do {what}?") else "no"

    @server.resource("docs://readme")
    def readme() -> str:
        return "the readme"

    @server.prompt()
    def review(topic: str) -> str:
        return f"Review {topic}."

    return server


class Docs(Proxy):
    """Docs tools."""

    def __init__(self, server: MCPServer | Server[Any] | None = None) -> None:
        super().__init__()
        self.server = server if server is not None else docs_server()

    def mcp_servers(self) -> list[Any]:
        return [self.server]


async def test_a_proxys_tools_resources_and_prompts_reach_the_agent() -> None:
    agent = McpAgent()
    async with open_test_chain([Docs()], agent) as client:
        with anyio.fail_after(5):
            sid = await client.new_session()
            [decl] = agent.servers[sid]
            assert decl["type"] == "acp" and decl["name"] == "docs"
            conn = await agent.open_mcp(sid)
            tools = await agent.mcp(conn, "tools/list")
            assert {t["name"] for t in tools["tools"]} == {"search", "slow", "confirm"}
            result = await agent.mcp(conn, "tools/call", {
                "name": "search", "arguments": {"query": "anyio"},
                "_meta": {"progressToken": "p1"}})
            assert result["content"][0]["text"] == f"found anyio for session {sid}"
            read = await agent.mcp(conn, "resources/read", {"uri": "docs://readme"})
            assert read["contents"][0]["text"] == "the readme"
            prompt = await agent.mcp(conn, "prompts/get", {"name": "review",
                                                           "arguments": {"topic": "x"}})
            assert prompt["messages"][0]["content"]["text"] == "Review x."
            # what the server sent on its own came back as mcp/message notifications
            [progress] = agent.mcp_notifications("notifications/progress")
            assert progress["params"] == {"progressToken": "p1", "progress": 1.0,
                                          "total": 2.0, "message": "halfway"}
            assert progress["connectionId"] == conn
            assert agent.mcp_notifications("notifications/tools/list_changed")


async def test_an_inner_mcp_error_is_the_answers_error() -> None:
    agent = McpAgent()
    async with open_test_chain([Docs()], agent) as client:
        with anyio.fail_after(5):
            conn = await agent.open_mcp(await client.new_session())
            with pytest.raises(RpcError) as failed:
                await agent.mcp(conn, "no/such/method")
            assert failed.value.code == -32601


async def confirm_twice(version: int) -> tuple[str, list[JsonValue], Any, TestClient]:
    """An editor speaking ACP `version` allows both questions the `confirm` tool asks
    (deploy, roll back): the session, what it was asked, the first result, the client."""
    asked: list[JsonValue] = []

    async def permission(msg: Request) -> JsonValue:
        asked.append(msg.params_value())
        return {"outcome": {"outcome": "selected", "optionId": "allow"}}

    agent = McpAgent(version=version)
    client = TestClient(replies={"session/request_permission": permission})
    async with open_test_chain([Docs()], agent, client=client, initialize=False):
        with anyio.fail_after(5):
            await client.initialize(version)
            sid = await client.new_session()
            conn = await agent.open_mcp(sid)
            result = await agent.mcp(conn, "tools/call", {"name": "confirm",
                                                          "arguments": {"what": "deploy"}})
            await agent.mcp(conn, "tools/call", {"name": "confirm",
                                                 "arguments": {"what": "roll back"}})
    return sid, asked, result, client


async def test_a_tool_handler_sees_its_session_and_asks_the_editor() -> None:
    sid, asked, result, client = await confirm_twice(1)
    assert result["content"][0]["text"] == "yes"
    assert asked[0]["sessionId"] == sid
    assert asked[0]["toolCall"]["title"] == "Do deploy?"
    assert client.agent_text(sid) == "asking about deployasking about roll back"
    # Each question is a tool call of its own to the editor, which keys its prompt by id.
    first, second = (a["toolCall"]["toolCallId"] for a in asked)
    assert first != second and first.startswith("docs-permission-")


async def test_a_tool_asks_a_v2_editor_with_a_title_and_a_tool_call_subject() -> None:
    sid, asked, result, _ = await confirm_twice(2)
    assert result["content"][0]["text"] == "yes"
    assert "toolCall" not in asked[0]  # v2 has no such field: its editor would refuse it
    assert asked[0]["sessionId"] == sid
    assert asked[0]["title"] == "Do deploy?"
    subject = asked[0]["subject"]
    assert subject["type"] == "tool_call"
    assert subject["toolCall"]["title"] == "Do deploy?"
    assert subject["toolCall"]["toolCallId"].startswith("docs-permission-")


async def test_cancelling_an_in_flight_tool_call_cancels_the_handler() -> None:
    started, release, cancelled = anyio.Event(), anyio.Event(), []
    agent = McpAgent()
    async with open_test_chain([Docs(docs_server(started, release, cancelled))], agent) \
            as client:
        with anyio.fail_after(5):
            conn = await agent.open_mcp(await client.new_session())
            answers: list[Any] = []

            async def call() -> None:
                answers.append(await agent.request("mcp/message", {
                    "connectionId": conn, "method": "tools/call",
                    "params": {"name": "slow", "arguments": {}}}, ident=500))
            async with anyio.create_task_group() as tg:
                tg.start_soon(call)
                await started.wait()
                await agent.cancel(500)
    assert cancelled == ["slow"]
    assert answers[0].error_code() == -32800


async def test_a_server_request_is_relayed_to_the_agent_and_answered() -> None:
    class Color(BaseModel):
        color: str

    server = MCPServer("asker")

    @server.tool()
    async def pick(ctx: Context) -> str:
        answer = await ctx.elicit("Which color?", Color)
        return answer.data.color if answer.action == "accept" else answer.action

    agent = McpAgent()
    agent.answer_mcp["elicitation/create"] = {"action": "accept",
                                              "content": {"color": "blue"}}
    async with open_test_chain([Docs(server)], agent) as client:
        with anyio.fail_after(5):
            sid = await client.new_session()
            conn = await agent.open_mcp(sid, capabilities={"elicitation": {}})
            result = await agent.mcp(conn, "tools/call", {"name": "pick", "arguments": {}})
    assert result["content"][0]["text"] == "blue"
    [asked] = [p for p in agent.received_params("mcp/message")
               if p["method"] == "elicitation/create"]
    assert asked["connectionId"] == conn


async def test_a_low_level_server_works_too() -> None:
    async def list_tools(ctx: Any, params: Any) -> mcp_types.ListToolsResult:
        return mcp_types.ListToolsResult(tools=[mcp_types.Tool(
            name="ping", input_schema={"type": "object"})])

    async def call_tool(ctx: Any, params: Any) -> mcp_types.CallToolResult:
        return mcp_types.CallToolResult(content=[mcp_types.TextContent(
            type="text", text=f"pong from {tool_context().server_name}")])

    server = Server("low", on_list_tools=list_tools, on_call_tool=call_tool)
    agent = McpAgent()
    async with open_test_chain([Docs(server)], agent) as client:
        with anyio.fail_after(5):
            conn = await agent.open_mcp(await client.new_session())
            result = await agent.mcp(conn, "tools/call", {"name": "ping", "arguments": {}})
    assert result["content"][0]["text"] == "pong from low"



async def test_a_low_level_handler_that_raises_is_an_internal_error_naming_proxy_and_server(
        ) -> None:
    # The SDK answers a handler's exception with code 0, which is no JSON-RPC code, and
    # only the exception's text: the agent could not tell who failed.
    async def list_tools(ctx: Any, params: Any) -> mcp_types.ListToolsResult:
        return mcp_types.ListToolsResult(tools=[mcp_types.Tool(
            name="ping", input_schema={"type": "object"})])

    async def call_tool(ctx: Any, params: Any) -> mcp_types.CallToolResult:
        raise ValueError("the disk is full")

    server = Server("low", on_list_tools=list_tools, on_call_tool=call_tool)
    agent = McpAgent()
    async with open_test_chain([Docs(server)], agent) as client:
        with anyio.fail_after(5):
            conn = await agent.open_mcp(await client.new_session())
            with pytest.raises(RpcError) as failed:
                await agent.mcp(conn, "tools/call", {"name": "ping", "arguments": {}})
            assert await agent.mcp(conn, "tools/list")  # the connection still serves
    assert failed.value.code == -32603
    assert "proxy docs" in failed.value.message and "'low'" in failed.value.message
    assert "tools/call" in failed.value.message and "the disk is full" in failed.value.message

class PerSession(Proxy):
    """A server per session."""

    def __init__(self) -> None:
        super().__init__()
        self.setups: list[SessionSetup] = []
        self.shared = MCPServer("shared")
        self.extra = MCPServer("opt-in")

    def mcp_servers(self) -> list[Any]:
        return [self.shared, McpOffer(self.extra, declare=False)]

    async def session_mcp_servers(self, setup: SessionSetup) -> list[Any]:
        self.setups.append(setup)
        return [McpOffer(MCPServer("scratch"), name=f"scratch-{setup.cwd}")]


async def test_per_session_servers_and_a_reload_declares_the_same_server_ids() -> None:
    proxy = PerSession()
    agent = McpAgent()
    agent.replies["session/load"] = None
    async with open_test_chain([proxy], agent) as client:
        with anyio.fail_after(5):
            sid = await client.new_session("/w")
            first = agent.servers[sid]
            await client.call("session/load", {"sessionId": sid, "cwd": "/w",
                                               "mcpServers": []})
    assert [s["name"] for s in first] == ["shared", "scratch-/w"]  # opt-in one not asked for
    [load] = agent.received_params("session/load")
    assert [s["serverId"] for s in load["mcpServers"]][:1] == [first[0]["serverId"]]
    assert [s.method for s in proxy.setups] == ["session/new", "session/load"]


async def test_an_opt_in_server_is_declared_when_the_chain_asks_for_it() -> None:
    proxy = PerSession()
    proxy.mcp_requested = frozenset({"opt-in"})
    agent = McpAgent()
    async with open_test_chain([proxy], agent) as client:
        with anyio.fail_after(5):
            sid = await client.new_session("/w")
    assert [s["name"] for s in agent.servers[sid]] == ["shared", "opt-in", "scratch-/w"]


class LazyOptIn(Proxy):
    """An opt-in server made only when a chain asks for it."""

    def __init__(self) -> None:
        super().__init__()
        self.built = 0

    def mcp_servers(self) -> list[Any]:
        return [McpOffer(name="lazy", declare=False, build=self._build)]

    def _build(self) -> MCPServer:
        self.built += 1
        server = MCPServer("lazy")

        @server.tool()
        def ping() -> str:
            return "pong"

        return server


async def test_an_opt_in_server_offered_with_build_is_made_only_when_a_chain_asks() -> None:
    idle = LazyOptIn()
    agent = McpAgent()
    async with open_test_chain([idle], agent) as client:
        with anyio.fail_after(5):
            sid = await client.new_session()
    assert agent.servers[sid] == [] and idle.built == 0

    asked = LazyOptIn()
    asked.mcp_requested = frozenset({"lazy"})
    agent = McpAgent()
    async with open_test_chain([asked], agent) as client:
        with anyio.fail_after(5):
            sid = await client.new_session()
            conn = await agent.open_mcp(sid)
            result = await agent.mcp(conn, "tools/call", {"name": "ping", "arguments": {}})
            await client.new_session()
    assert [s["name"] for s in agent.servers[sid]] == ["lazy"]
    assert result["content"][0]["text"] == "pong"
    assert asked.built == 1  # made once, kept for every session


class BrokenOptIn(Proxy):
    """A shared server, and an opt-in one whose `build` fails or makes no server."""

    def __init__(self, build: Callable[[], Any]) -> None:
        super().__init__()
        self._build = build

    def mcp_servers(self) -> list[Any]:
        return [MCPServer("shared"), McpOffer(name="lazy", declare=False, build=self._build)]


def _fails() -> Any:
    raise RuntimeError("no database")


@pytest.mark.parametrize(("build", "why"), [
    (_fails, "RuntimeError: no database"),
    (lambda: 42, "TypeError: 42 is not an MCP server")])
async def test_an_opt_in_server_that_cannot_be_made_fails_the_session_naming_proxy_and_server(
        build: Callable[[], Any], why: str) -> None:
    proxy = BrokenOptIn(build)
    proxy.mcp_requested = frozenset({"lazy"})
    agent = McpAgent()
    async with open_test_chain([proxy], agent) as client:
        with anyio.fail_after(5):
            with pytest.raises(RpcError) as failed:
                await client.new_session()
            assert agent.servers == {}  # it never reached the agent
            assert failed.value.code == -33002
            assert "brokenoptin failed handling session/new: PluginError: its MCP server 'lazy' " \
                f"could not be made: {why}" in str(failed.value)
            agent.replies["_test/echo"] = {"n": 1}
            assert await client.call("_test/echo", {}) == {"n": 1}  # the chain goes on


def test_an_offer_needs_a_server_or_a_builder_and_a_name() -> None:
    with pytest.raises(TypeError, match="build= and name="):
        McpOffer(build=lambda: None)


def test_the_permissions_proxy_does_without_the_mcp_sdk_until_a_chain_asks_for_its_server(
        ) -> None:
    # The SDK costs ~0.4 s of CPU to import: every chain with permissions paid it at start.
    script = ("import sys\n"
              "from conductor.plugins.registry import load_proxy\n"
              "proxy = load_proxy('permissions', {})\n"
              "[offer] = proxy.offered_mcp_servers()\n"
              "print(offer.declared_name, offer.declare, 'mcp' in sys.modules)\n"
              "offer.instance()\n"
              "print('mcp' in sys.modules)\n")
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          env=child_env(), timeout=60, check=True)
    assert done.stdout.split() == ["permissions", "False", "False", "True"]


async def test_nothing_is_declared_to_an_agent_that_takes_no_acp_servers() -> None:
    agent = McpAgent(takes_acp=False)
    async with open_test_chain([Docs()], agent) as client:
        with anyio.fail_after(5):
            sid = await client.new_session()
    assert agent.servers[sid] == []


async def test_closing_the_session_closes_its_tool_connections() -> None:
    proxy = Docs()
    agent = McpAgent()
    async with open_test_chain([proxy], agent) as client:
        with anyio.fail_after(5):
            sid = await client.new_session()
            conn = await agent.open_mcp(sid)
            await client.call("session/close", {"sessionId": sid})
            await agent.wait_for("mcp/disconnect")
            with pytest.raises(RpcError) as refused:
                await agent.mcp(conn, "tools/list")
    assert refused.value.code == -32602


async def test_the_example_in_docs_mcp_works_as_written(tmp_path: Path) -> None:
    text = (REPO / "docs" / "mcp.md").read_text(encoding="utf-8")
    code = text.split("```python\n", 1)[1].split("```", 1)[0]
    assert len(code.splitlines()) < 30  # the promise the page makes
    module = tmp_path / "my_tools.py"
    module.write_text(code, encoding="utf-8")
    from conductor.plugins.registry import find_plugin
    proxy = find_plugin(f"{module}:Tickets")()
    agent = McpAgent()
    async with open_test_chain([proxy], agent) as client:
        with anyio.fail_after(5):
            conn = await agent.open_mcp(await client.new_session())
            looked = await agent.mcp(conn, "tools/call", {"name": "lookup",
                                                          "arguments": {"ticket": "T-1"}})
            closed = await agent.mcp(conn, "tools/call", {"name": "close",
                                                          "arguments": {"ticket": "T-1"}})
    assert looked["content"][0]["text"] == "T-1: login fails on Safari (open)"
    assert closed["content"][0]["text"] == "T-1 closed"  # the test client allows


async def test_a_server_run_that_fails_ends_its_connection_and_the_proxy_keeps_serving(
        ) -> None:
    give_up = anyio.Event()

    @asynccontextmanager
    async def broken(server: MCPServer) -> AsyncIterator[dict[str, Any]]:
        await give_up.wait()  # the agent's first request is in flight by then
        raise RuntimeError("no database")
        yield {}  # pragma: no cover (a generator)

    class Two(Proxy):
        """A server whose lifespan fails, and one that works."""

        def mcp_servers(self) -> list[Any]:
            return [MCPServer("broken", lifespan=broken), docs_server()]

    agent = McpAgent()
    async with open_test_chain([Two()], agent) as client:
        with anyio.fail_after(5):
            sid = await client.new_session()
            bad = str((await agent.call("mcp/connect", {"serverId": next(
                s["serverId"] for s in agent.servers[sid] if s["name"] == "broken")}))
                ["connectionId"])
            answers: list[Response] = []

            async def initialize() -> None:
                answers.append(await agent.request("mcp/message", {
                    "connectionId": bad, "method": "initialize", "params": INIT}, ident=900))
            async with anyio.create_task_group() as tg:
                tg.start_soon(initialize)
                await anyio.wait_all_tasks_blocked()  # the request waits on the server's answer
                give_up.set()
            assert answers[0].error_code() == -32603
            assert "its MCP server 'broken' failed: RuntimeError: no database" in \
                str(answers[0].error_value())
            [ended] = await agent.wait_for("mcp/disconnect")
            assert ended == {"connectionId": bad}
            with pytest.raises(RpcError) as refused:  # the router forgot it: no stray
                await agent.mcp(bad, "tools/list")
            assert refused.value.code == -32602
            good = await agent.open_mcp(sid, "docs")  # the proxy is still there
            assert (await agent.mcp(good, "tools/list"))["tools"]
            assert await client.new_session()


async def test_an_agent_error_answer_with_a_malformed_code_fails_only_that_request() -> None:
    class Color(BaseModel):
        color: str

    server = MCPServer("asker")

    @server.tool()
    async def pick(ctx: Context) -> str:
        answer = await ctx.elicit("Which color?", Color)
        return answer.action

    async def malformed(agent: ScriptedAgent, msg: Request) -> JsonValue:
        await agent.endpoint.send(Response(id=msg.id, error=payload(  # type: ignore[union-attr]
            {"code": "oops", "message": "no color today"})))
        return None  # (its own answer to an id already answered goes nowhere)

    agent = McpAgent()
    agent.replies["mcp/message"] = malformed
    async with open_test_chain([Docs(server)], agent) as client:
        with anyio.fail_after(5):
            sid = await client.new_session()
            conn = await agent.open_mcp(sid, capabilities={"elicitation": {}})
            with pytest.raises(RpcError) as failed:  # the SDK makes it the call's error
                await agent.mcp(conn, "tools/call", {"name": "pick", "arguments": {}})
            assert str(failed.value).startswith("no color today")
            assert (await agent.mcp(conn, "tools/list"))["tools"]  # the connection lives on
    assert not agent.received_params("mcp/disconnect")


async def test_an_mcp_message_whose_params_are_not_an_object_is_refused_naming_the_proxy(
        ) -> None:
    agent = McpAgent()
    async with open_test_chain([Docs()], agent) as client:
        with anyio.fail_after(5):
            conn = await agent.open_mcp(await client.new_session())
            for params in ([{"name": "search"}], "search"):
                with pytest.raises(RpcError) as refused:
                    await agent.call("mcp/message", {"connectionId": conn,
                                                     "method": "tools/call", "params": params})
                assert refused.value.code == -32602
                assert "proxy docs" in str(refused.value) and "object" in str(refused.value)
            assert (await agent.mcp(conn, "tools/list"))["tools"]


async def test_a_call_in_flight_when_the_agent_disconnects_is_answered_naming_the_proxy(
        ) -> None:
    started, release, cancelled = anyio.Event(), anyio.Event(), []
    agent = McpAgent()
    async with open_test_chain([Docs(docs_server(started, release, cancelled))], agent) \
            as client:
        with anyio.fail_after(5):
            conn = await agent.open_mcp(await client.new_session())
            answers: list[Response] = []

            async def call() -> None:
                answers.append(await agent.request("mcp/message", {
                    "connectionId": conn, "method": "tools/call",
                    "params": {"name": "slow", "arguments": {}}}, ident=600))
            async with anyio.create_task_group() as tg:
                tg.start_soon(call)
                await started.wait()
                assert await agent.call("mcp/disconnect", {"connectionId": conn}) == {}
    assert cancelled == ["slow"]
    assert answers[0].error_code() == -32603
    message = str(answers[0].error_value())
    assert "proxy docs" in message and "MCP server 'docs' closed" in message


async def test_a_message_crossing_the_proxys_own_disconnect_is_refused_not_passed_on() -> None:
    # Over pipes, the connector's next mcp/message can cross the mcp/disconnect the proxy
    # sends when a server run ends on its own: the proxy must answer it, not pass it on to
    # a component that never heard of the connection (as it does with what it does not
    # claim). Driven at the proxy's own wire, where the two cross.
    @asynccontextmanager
    async def broken(server: MCPServer) -> AsyncIterator[dict[str, Any]]:
        raise RuntimeError("no database")
        yield {}  # pragma: no cover (a generator)

    to_router, from_proxy = anyio.create_memory_object_stream[Message](16)

    async def next_from_proxy() -> dict[str, Any]:
        return dict(json.loads(encode(await from_proxy.receive())))

    def successor(ident: int, method: str, params: JsonValue) -> Request:
        return Request(id=raw(ident), method="_proxy/successor",
                       params=payload({"method": method, "params": params}))

    with anyio.fail_after(5):
        async with to_router, from_proxy, open_inprocess_proxy(
                Docs(MCPServer("broken", lifespan=broken)), to_router.send) as proxy:
            await proxy.send(Request(id=raw(1), method="session/new",
                                     params=payload({"cwd": "/", "mcpServers": []})))
            setup = await next_from_proxy()
            [entry] = setup["params"]["params"]["mcpServers"]
            await proxy.send(Response(id=raw(setup["id"]), result=payload({"sessionId": "s1"})))
            assert (await next_from_proxy())["result"] == {"sessionId": "s1"}
            await proxy.send(successor(2, "mcp/connect", {"serverId": entry["serverId"]}))
            connected = await next_from_proxy()
            ident = connected["result"]["connectionId"]
            ended = await next_from_proxy()  # the run failed at once: the proxy says so
            assert ended["params"] == {"method": "mcp/disconnect",
                                       "params": {"connectionId": ident}}
            await proxy.send(successor(3, "mcp/message", {  # sent before it heard
                "connectionId": ident, "method": "initialize", "params": INIT}))
            refused = await next_from_proxy()
            assert refused["id"] == 3 and refused["error"]["code"] == -32602
            assert "proxy docs" in refused["error"]["message"]
            assert "no database" in refused["error"]["message"]


async def test_an_mcp_cancel_inside_mcp_message_cancels_the_call_it_names_on_its_own_hop(
        ) -> None:
    # An agent tunnelling its MCP client sends the client's `notifications/cancelled` as
    # an mcp/message notification, naming the request by the id it used (the outer id on
    # its hop). Ids are per hop: passed on verbatim, it named nothing at the server, or
    # whichever other call had that number there.
    started = {"A": anyio.Event(), "B": anyio.Event()}
    release = anyio.Event()
    cancelled: list[str] = []
    server = MCPServer("waits")

    @server.tool()
    async def wait(tag: str) -> str:
        started[tag].set()
        try:
            await release.wait()
        except anyio.get_cancelled_exc_class():
            cancelled.append(tag)
            raise
        return tag

    agent = McpAgent()
    async with open_test_chain([Docs(server)], agent) as client:
        with anyio.fail_after(5):
            conn = await agent.open_mcp(await client.new_session())
            answers: dict[str, Response] = {}
            answered = {"A": anyio.Event(), "B": anyio.Event()}

            async def call(tag: str, ident: int) -> None:
                answers[tag] = await agent.request("mcp/message", {
                    "connectionId": conn, "method": "tools/call",
                    "params": {"name": "wait", "arguments": {"tag": tag}}}, ident=ident)
                answered[tag].set()
            async with anyio.create_task_group() as tg:
                tg.start_soon(call, "A", 900)  # the server's request 2 on this connection
                await started["A"].wait()
                tg.start_soon(call, "B", 2)
                await started["B"].wait()
                await agent.notify("mcp/message", {
                    "connectionId": conn, "method": "notifications/cancelled",
                    "params": {"requestId": 2, "reason": "the user gave up"}})
                await answered["B"].wait()
                release.set()
    assert cancelled == ["B"]
    assert answers["B"].error_code() == -32800
    assert answers["A"].result_value()["content"][0]["text"] == "A"


async def test_a_server_abandoning_its_own_request_cancels_it_at_the_agent() -> None:
    # The SDK sends `notifications/cancelled` under its own id for a request it gives up
    # on (here: the tool call that elicits is cancelled). That id means nothing past the
    # proxy: the agent must get `$/cancel_request` for the request it was asked.
    class Color(BaseModel):
        color: str

    server = MCPServer("asker")
    asking, gave_up = anyio.Event(), anyio.Event()

    @server.tool()
    async def pick(ctx: Context) -> str:
        answer = await ctx.elicit("Which color?", Color)
        return answer.action

    async def never(agent: ScriptedAgent, msg: Request) -> JsonValue:
        asking.set()
        try:
            await anyio.sleep_forever()
        finally:
            gave_up.set()

    agent = McpAgent()
    agent.replies["mcp/message"] = never
    async with open_test_chain([Docs(server)], agent) as client:
        with anyio.fail_after(5):
            sid = await client.new_session()
            conn = await agent.open_mcp(sid, capabilities={"elicitation": {}})
            answers: list[Response] = []

            async def call() -> None:
                answers.append(await agent.request("mcp/message", {
                    "connectionId": conn, "method": "tools/call",
                    "params": {"name": "pick", "arguments": {}}}, ident=800))
            async with anyio.create_task_group() as tg:
                tg.start_soon(call)
                await asking.wait()
                await agent.cancel(800)
                await gave_up.wait()
    assert answers[0].error_code() == -32800
    [elicit] = [m for m in agent.received if m.method == "mcp/message"
                and isinstance(m, Request)]
    [cancel] = agent.received_params("$/cancel_request")
    assert cancel == {"requestId": json.loads(bytes(elicit.id))}
    assert not [p for p in agent.mcp_notifications("notifications/cancelled")]


async def test_an_mcp_cancel_reaching_a_proxy_names_the_call_by_its_outer_id() -> None:
    # At the proxy's own wire (as when it runs stand-alone): the inner cancel names the
    # call by the id of the mcp/message that carried it. The server numbers its calls
    # itself, so passed on verbatim it named nothing there (or another call).
    started, release, cancelled = anyio.Event(), anyio.Event(), []
    to_router, from_proxy = anyio.create_memory_object_stream[Message](16)

    async def next_from_proxy() -> dict[str, Any]:
        return dict(json.loads(encode(await from_proxy.receive())))

    def successor(method: str, params: JsonValue, ident: int | None = None) -> Message:
        body = payload({"method": method, "params": params})
        if ident is None:
            return Notification(method="_proxy/successor", params=body)
        return Request(id=raw(ident), method="_proxy/successor", params=body)

    with anyio.fail_after(5):
        async with to_router, from_proxy, open_inprocess_proxy(
                Docs(docs_server(started, release, cancelled)), to_router.send) as proxy:
            await proxy.send(Request(id=raw(1), method="session/new",
                                     params=payload({"cwd": "/", "mcpServers": []})))
            setup = await next_from_proxy()
            [entry] = setup["params"]["params"]["mcpServers"]
            await proxy.send(Response(id=raw(setup["id"]), result=payload({"sessionId": "s1"})))
            await next_from_proxy()
            await proxy.send(successor("mcp/connect", {"serverId": entry["serverId"]}, 2))
            ident = (await next_from_proxy())["result"]["connectionId"]
            await proxy.send(successor("mcp/message", {
                "connectionId": ident, "method": "initialize", "params": INIT}, 3))
            assert "result" in await next_from_proxy()
            await proxy.send(successor("mcp/message", {
                "connectionId": ident, "method": "notifications/initialized"}))
            await proxy.send(successor("mcp/message", {
                "connectionId": ident, "method": "tools/call",
                "params": {"name": "slow", "arguments": {}}}, 77))
            await started.wait()
            await proxy.send(successor("mcp/message", {
                "connectionId": ident, "method": "notifications/cancelled",
                "params": {"requestId": 77}}))
            answer = await next_from_proxy()
    assert answer["id"] == 77 and answer["error"]["code"] == -32800
    assert cancelled == ["slow"]


@pytest.mark.parametrize("cancel", ["$/cancel_request", "notifications/cancelled"])
async def test_a_call_cancelled_right_behind_it_is_cancelled_not_run_to_its_end(
        cancel: str) -> None:
    # The call and its cancel handed over together (one read of a pipe, one inbox item):
    # the cancel must find the call, though the task that waits for its answer has not
    # run yet, or the tool runs to its end. So too what the agent sends after a request:
    # the server gets it after the request.
    started, release, cancelled = anyio.Event(), anyio.Event(), []
    to_router, from_proxy = anyio.create_memory_object_stream[Message](16)

    async def next_from_proxy() -> dict[str, Any]:
        return dict(json.loads(encode(await from_proxy.receive())))

    def successor(method: str, params: JsonValue, ident: int | None = None) -> Message:
        body = payload({"method": method, "params": params})
        if ident is None:
            return Notification(method="_proxy/successor", params=body)
        return Request(id=raw(ident), method="_proxy/successor", params=body)

    with anyio.fail_after(5):
        async with to_router, from_proxy, open_inprocess_proxy(
                Docs(docs_server(started, release, cancelled)), to_router.send) as proxy:
            await proxy.send(Request(id=raw(1), method="session/new",
                                     params=payload({"cwd": "/", "mcpServers": []})))
            setup = await next_from_proxy()
            [entry] = setup["params"]["params"]["mcpServers"]
            await proxy.send(Response(id=raw(setup["id"]), result=payload({"sessionId": "s1"})))
            await next_from_proxy()
            await proxy.send(successor("mcp/connect", {"serverId": entry["serverId"]}, 2))
            ident = (await next_from_proxy())["result"]["connectionId"]
            await proxy.send(successor("mcp/message", {
                "connectionId": ident, "method": "initialize", "params": INIT}, 3))
            assert "result" in await next_from_proxy()
            await proxy.send(successor("mcp/message", {
                "connectionId": ident, "method": "notifications/initialized"}))
            stop = successor("$/cancel_request", {"requestId": 77}) \
                if cancel == "$/cancel_request" else successor("mcp/message", {
                    "connectionId": ident, "method": "notifications/cancelled",
                    "params": {"requestId": 77}})
            await proxy.send([successor("mcp/message", {
                "connectionId": ident, "method": "tools/call",
                "params": {"name": "slow", "arguments": {}}}, 77), stop])
            answers = []
            with anyio.move_on_after(1):
                answers.append(await next_from_proxy())
            release.set()  # (a call that was not cancelled ends now, and says so)
            answer = answers[0] if answers else await next_from_proxy()
    assert answer["id"] == 77 and answer.get("error", {}).get("code") == -32800, answer
    assert cancelled == ["slow"] or not started.is_set()
