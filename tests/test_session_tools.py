"""The session-tools proxy: its tools, as an agent calls them over MCP-over-ACP."""

from __future__ import annotations

import json
import subprocess
import sys
from typing import TYPE_CHECKING

import anyio

from acp_conductor_proxies.session_tools import SessionTools, SessionToolsOptions
from conductor.testing import ScriptedAgent, TestClient, open_test_chain
from tests.conftest import child_env
from tests.test_plugin_tools import McpAgent

if TYPE_CHECKING:
    from pathlib import Path

    from conductor.jsonrpc.message import JsonValue, Request


async def call_tool(agent: McpAgent, conn: str, name: str, **arguments: JsonValue) -> str:
    result = await agent.mcp(conn, "tools/call", {"name": name, "arguments": arguments})
    return str(result["content"][0]["text"])


async def test_search_transcript_finds_this_sessions_prompts_and_answers_only() -> None:
    agent = McpAgent()
    agent.replies["session/prompt"] = answer_with_text
    async with open_test_chain([SessionTools()], agent) as client:
        with anyio.fail_after(5):
            mine = await client.new_session()
            other = await client.new_session()
            await client.prompt(mine, "where is the config parser?")
            await client.prompt(other, "config of the other session")
            conn = await agent.open_mcp(mine)
            found = await call_tool(agent, conn, "search_transcript", query="CONFIG")
            missing = await call_tool(agent, conn, "search_transcript", query="zebra")
    assert found == ("user: where is the config parser?\n"
                     "agent: the config parser is in conductor/config.py")
    assert missing == "no line contains 'zebra'"


async def answer_with_text(agent: McpAgent, message: Request) -> JsonValue:
    sid = message.params_value()["sessionId"]
    for word in ("the config parser ", "is in conductor/config.py"):
        await agent.notify("session/update", {"sessionId": sid, "update": {
            "sessionUpdate": "agent_message_chunk", "content": {"type": "text", "text": word}}})
    return {"stopReason": "end_turn"}


async def test_chain_lists_the_components_and_sessions() -> None:
    agent = McpAgent()
    proxy = SessionTools()
    proxy.rename("tools")
    async with open_test_chain([proxy], agent) as client:
        with anyio.fail_after(5):
            sid = await client.new_session()
            text = await call_tool(agent, await agent.open_mcp(sid), "chain")
    assert "  tools: proxy (in-process), running" in text
    assert "  agent: agent, running" in text
    assert f"  {sid}: idle, 0 prompt(s), opened by client" in text
    assert "client: test-client 0" in text


async def test_ask_user_asks_the_editor_a_yes_no_question() -> None:
    answers = iter(["allow", "reject"])

    async def permission(message: Request) -> JsonValue:
        return {"outcome": {"outcome": "selected", "optionId": next(answers)}}

    agent = McpAgent()
    client = TestClient(replies={"session/request_permission": permission})
    async with open_test_chain([SessionTools(SessionToolsOptions())], agent, client=client):
        with anyio.fail_after(5):
            conn = await agent.open_mcp(await client.new_session())
            first = await call_tool(agent, conn, "ask_user", question="Deploy now?")
            second = await call_tool(agent, conn, "ask_user", question="Really?")
    assert (first, second) == ("yes", "no")
    [asked, _] = client.received_params("session/request_permission")
    assert asked["toolCall"]["title"] == "Deploy now?"


async def test_the_permissions_proxy_answers_check_when_the_chain_asks_for_its_tools() -> None:
    from acp_conductor_proxies.permissions import Permissions, PermissionsOptions, Rule

    proxy = Permissions(PermissionsOptions(rules=[
        Rule(name="protect-env", path=".env*", action="deny"),
        Rule(kind="read", action="allow")]))
    quiet = McpAgent()
    async with open_test_chain([proxy], quiet) as client:
        with anyio.fail_after(5):
            sid = await client.new_session("/work")
    assert quiet.servers[sid] == []  # opt-in: not declared unless asked for
    proxy = Permissions(proxy.options)
    proxy.mcp_requested = frozenset({"permissions"})
    agent = McpAgent()
    async with open_test_chain([proxy], agent) as client:
        with anyio.fail_after(5):
            conn = await agent.open_mcp(await client.new_session("/work"))
            denied = await call_tool(agent, conn, "check", kind="read", path="sub/../.env")
            allowed = await call_tool(agent, conn, "check", kind="read", path="README.md")
            listed = await call_tool(agent, conn, "rules")
    assert denied == "deny (by protect-env)"
    assert allowed == "allow (by rule 2)"
    assert listed.splitlines()[-1] == "otherwise: ask"


async def test_session_tools_pass_on_messages_whatever_their_shape() -> None:
    # A recorder: an update or a prompt it cannot read still reaches the other side.
    agent = ScriptedAgent()
    async with open_test_chain([SessionTools()], agent) as client:
        with anyio.fail_after(10):
            sid = await client.new_session("/tmp")
            for odd in ("a string", 5, ["x"]):
                await agent.notify("session/update", {"sessionId": sid, "update": odd})
            assert await client.prompt(sid, "hello") is not None
            answer = await client.call("session/prompt", ["not", "an", "object"])
    assert len(client.received_params("session/update")) >= 3
    assert answer is not None


async def test_the_session_forgotten_first_is_the_one_used_least_recently() -> None:
    # Sessions were forgotten in the order they were opened: the one in use all along went
    # first, while one idle since its first prompt was kept.
    agent = McpAgent()
    agent.replies["session/prompt"] = answer_with_text
    async with open_test_chain([SessionTools(SessionToolsOptions(sessions=2))], agent) as client:
        with anyio.fail_after(5):
            busy, idle, new = [await client.new_session() for _ in range(3)]
            await client.prompt(busy, "alpha one")
            await client.prompt(idle, "beta one")
            await client.prompt(busy, "alpha two")
            await client.prompt(new, "gamma one")
            found = await call_tool(agent, await agent.open_mcp(busy), "search_transcript",
                                    query="alpha")
            gone = await call_tool(agent, await agent.open_mcp(idle), "search_transcript",
                                   query="beta")
    assert found == "user: alpha one\nuser: alpha two"
    assert gone == "no line contains 'beta'"


async def test_a_loaded_sessions_replayed_history_is_searchable_message_by_message() -> None:
    # The replay of session/load streams user and agent chunks: the user's were ignored and
    # every agent message of the history was joined into one line.
    history = [("user_message_chunk", "where is "), ("user_message_chunk", "the parser?"),
               ("agent_message_chunk", "in config.py"), ("user_message_chunk", "and tests?"),
               ("agent_message_chunk", "in tests/")]

    async def load(agent: McpAgent, message: Request) -> JsonValue:
        params = message.params_value()
        agent.servers[params["sessionId"]] = params.get("mcpServers", [])
        for kind, text in history:
            await agent.notify("session/update", {"sessionId": params["sessionId"], "update": {
                "sessionUpdate": kind, "content": {"type": "text", "text": text}}})
        return {}

    agent = McpAgent()
    agent.replies["session/load"] = load
    async with open_test_chain([SessionTools()], agent) as client:
        with anyio.fail_after(5):
            await client.call("session/load", {"sessionId": "old", "cwd": "/",
                                               "mcpServers": []})
            found = await call_tool(agent, await agent.open_mcp("old"), "search_transcript",
                                    query="")
    assert found == ("user: where is the parser?\nagent: in config.py\n"
                     "user: and tests?\nagent: in tests/")


async def test_a_user_message_an_agent_echoes_during_its_turn_is_recorded_once() -> None:
    async def echo(agent: McpAgent, message: Request) -> JsonValue:
        sid = message.params_value()["sessionId"]
        for kind, text in (("user_message_chunk", "hello"), ("agent_message_chunk", "hi")):
            await agent.notify("session/update", {"sessionId": sid, "update": {
                "sessionUpdate": kind, "content": {"type": "text", "text": text}}})
        return {"stopReason": "end_turn"}

    agent = McpAgent()
    agent.replies["session/prompt"] = echo
    async with open_test_chain([SessionTools()], agent) as client:
        with anyio.fail_after(5):
            sid = await client.new_session()
            await client.prompt(sid, "hello")
            found = await call_tool(agent, await agent.open_mcp(sid), "search_transcript",
                                    query="")
    assert found == "user: hello\nagent: hi"


async def test_text_streamed_outside_a_turn_is_kept_for_no_more_sessions_than_remembered(
        ) -> None:
    agent = McpAgent()
    proxy = SessionTools(SessionToolsOptions(sessions=2))
    async with open_test_chain([proxy], agent) as client:
        with anyio.fail_after(5):
            for _ in range(5):
                sid = await client.new_session()
                await agent.notify("session/update", {"sessionId": sid, "update": {
                    "sessionUpdate": "agent_message_chunk",
                    "content": {"type": "text", "text": "welcome"}}})
            await client.prompt(sid, "hello")  # the updates above have all gone through
    assert len(proxy._lines) == 2
    assert len(proxy._streamed) <= 2


SDK_SPY = """
import atexit, runpy, sys
out = sys.argv[1]
atexit.register(lambda: open(out, "w").write(repr(sorted(
    m for m in ("mcp", "mcp_types") if m in sys.modules))))
sys.argv = ["acp-conductor", "--chain", "tools"]
runpy.run_module("conductor", run_name="__main__")
"""


def test_the_tools_chain_answers_initialize_without_importing_the_mcp_sdk(
        tmp_path: Path) -> None:
    # The SDK's import is ≈ 0.65 s of CPU: made at the agent's first connect, not before
    # the editor hears from the chain (session-tools offers its server with `build`).
    seen = tmp_path / "imported"
    init = {"jsonrpc": "2.0", "id": 0, "method": "initialize",
            "params": {"protocolVersion": 1, "clientCapabilities": {}}}
    done = subprocess.run([sys.executable, "-c", SDK_SPY, str(seen)],
                          input=json.dumps(init).encode() + b"\n", env=child_env(),
                          capture_output=True, timeout=30, check=False)
    assert json.loads(done.stdout.splitlines()[0])["result"]["protocolVersion"] == 1, done
    assert seen.read_text() == "[]"


async def v2_turn(agent: McpAgent, message: Request) -> JsonValue:
    """A v2 turn: accepted at once; then a tool call (its first titled update creates it),
    chunks of a message that a whole `agent_message` replaces, and the idle state."""
    sid = message.params_value()["sessionId"]
    for update in ({"sessionUpdate": "tool_call_update", "toolCallId": "c1",
                    "title": "Read config.py", "kind": "read", "status": "pending"},
                   {"sessionUpdate": "tool_call_update", "toolCallId": "c1",
                    "title": "Read config.py", "status": "completed"},
                   {"sessionUpdate": "agent_message_chunk", "messageId": "m1",
                    "content": {"type": "text", "text": "the config dra"}},
                   {"sessionUpdate": "agent_message", "messageId": "m1",
                    "content": [{"type": "text", "text": "the config parser is here"}]},
                   {"sessionUpdate": "state_update", "state": "idle",
                    "stopReason": "end_turn"}):
        agent.after_reply("session/update", {"sessionId": sid, "update": update})
    return {}


async def test_session_tools_record_a_v2_turn_and_name_a_v2_editor_and_agent() -> None:
    agent = McpAgent(version=2)
    agent.replies["session/prompt"] = v2_turn
    async with open_test_chain([SessionTools()], agent, initialize=False) as client:
        with anyio.fail_after(5):
            await client.initialize(2)
            sid = await client.new_session()
            await client.prompt(sid, "where is the config?")
            conn = await agent.open_mcp(sid)
            found = await call_tool(agent, conn, "search_transcript", query="config")
            chain = await call_tool(agent, conn, "chain")
    assert found == ("user: where is the config?\n"
                     "tool call: Read config.py (read)\n"
                     "agent: the config parser is here")
    assert "client: test-client 0" in chain
    assert "agent: mcp-agent 0" in chain
    assert "ACP protocol version: 2" in chain
