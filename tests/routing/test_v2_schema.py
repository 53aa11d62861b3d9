"""What the conductor itself writes into ACP v2 messages, checked against the official v2
schema (tests/spec/v2: a copy of the official schema, the source of truth for field names),
and how it reads v2 capabilities."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import jsonschema
import msgspec

from conductor.routing.mcp import McpInjection, McpServer, McpSupport, advertise_acp

SPEC = Path(__file__).parent.parent / "spec" / "v2" / "schema.unstable.json"
STDIO = McpServer("files", "stdio", command="/usr/bin/files", args=("--x",), env=(("A", "1"),))
HTTP = McpServer("web", "http", url="http://127.0.0.1:1/mcp", headers=(("Authorization", "t"),))


def _validator(definition: str) -> jsonschema.protocols.Validator:
    schema: dict[str, Any] = json.loads(SPEC.read_text())
    return jsonschema.Draft202012Validator({"$ref": f"#/$defs/{definition}",
                                            "$defs": schema["$defs"]})


def _names(out: msgspec.Raw | Any) -> list[str]:
    return [s["name"] for s in json.loads(bytes(out)).get("mcpServers", [])]


def test_a_v2_agent_that_advertises_no_mcp_transport_is_sent_no_stdio_server() -> None:
    # v2 McpServer stdio: "Only available when the Agent capabilities include
    # `session.mcp.stdio`" (v1 made stdio the baseline; v2 does not).
    inj = McpInjection([STDIO, HTTP])
    inj.learn_initialize(2, msgspec.Raw(b'{"protocolVersion":2,"capabilities":{"session":{}}}'))
    assert _names(inj.apply(msgspec.Raw(b'{"cwd":"/w"}'))) == []


def test_a_meta_member_of_v2_session_mcp_is_not_taken_for_a_transport() -> None:
    support = McpSupport()
    support.learn(2, msgspec.Raw(
        b'{"capabilities":{"session":{"mcp":{"stdio":{},"_meta":{"x":1}}}}}'))
    assert support.transports == frozenset({"stdio"})


def test_a_v1_agent_takes_stdio_without_saying_so() -> None:
    support = McpSupport()
    support.learn(1, msgspec.Raw(b'{"agentCapabilities":{}}'))
    assert support.takes("stdio") is True


def test_injected_v2_servers_are_valid_v2_mcp_server_entries() -> None:
    inj = McpInjection([STDIO, HTTP])
    inj.learn_initialize(2, msgspec.Raw(
        b'{"capabilities":{"session":{"mcp":{"stdio":{},"http":{}}}}}'))
    out = json.loads(bytes(inj.apply(msgspec.Raw(b'{"cwd":"/w"}'))))
    assert [s["name"] for s in out["mcpServers"]] == ["files", "web"]
    _validator("NewSessionRequest").validate(out)


def test_the_bridge_advertises_acp_in_the_v2_capability_shape() -> None:
    result = msgspec.Raw(b'{"protocolVersion":2,"info":{"name":"a","version":"1"},'
                         b'"capabilities":{"session":{"mcp":{"http":{}}}}}')
    out = json.loads(bytes(advertise_acp(result, 2)))
    assert out["capabilities"]["session"]["mcp"] == {"http": {}, "acp": {}}
    _validator("InitializeResponse").validate(out)
