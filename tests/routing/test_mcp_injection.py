"""Global [[mcp_server]] declarations are appended to session setup, shaped per version."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import anyio
import msgspec
import pytest

import conductor.routing.chain as chain_module
from conductor.config import ConfigError, load_chain, mcp_servers
from conductor.jsonrpc.message import Message, decode, encode
from conductor.routing.chain import Chain
from conductor.routing.mcp import McpInjection, McpRefusedError, McpServer
from conductor.routing.roles import Role
from conductor.routing.topology import ComponentLink, Hop
from tests.conftest import child_env, conductor_argv

STDIO = McpServer("files", "stdio", command="/usr/bin/files", args=("--x",), env=(("A", "1"),))
HTTP = McpServer("web", "http", url="http://127.0.0.1:1/mcp", headers=(("Authorization", "t"),))


def test_v1_stdio_servers_have_no_type_and_env_as_name_value_pairs() -> None:
    inj = McpInjection([STDIO])
    out = json.loads(bytes(inj.apply(msgspec.Raw(b'{"cwd":"/w","mcpServers":[]}'))))
    assert out["mcpServers"] == [{"name": "files", "command": "/usr/bin/files", "args": ["--x"],
                                  "env": [{"name": "A", "value": "1"}]}]


def test_v2_stdio_servers_carry_a_type() -> None:
    inj = McpInjection([STDIO])
    inj.learn_initialize(2, msgspec.Raw(
        b'{"protocolVersion":2,"capabilities":{"session":{"mcp":{"stdio":{}}}}}'))
    out = json.loads(bytes(inj.apply(msgspec.Raw(b'{"cwd":"/w"}'))))
    assert out["mcpServers"][0]["type"] == "stdio"


def test_injection_creates_mcp_servers_and_keeps_every_other_value_verbatim() -> None:
    inj = McpInjection([STDIO])
    out = bytes(inj.apply(msgspec.Raw(b'{"cwd" : "/w", "n": 1e2, "big": 123456789012345678901}')))
    assert b'"n":1e2' in out and b'"big":123456789012345678901' in out
    assert json.loads(out)["mcpServers"][0]["name"] == "files"


def test_a_server_the_client_already_declared_is_not_added_twice() -> None:
    inj = McpInjection([HTTP])
    params = msgspec.Raw(b'{"mcpServers":[{"type":"http","name":"web","url":"u","headers":[]}]}')
    assert inj.apply(params) is params


def test_http_servers_are_skipped_when_the_v1_agent_lacks_http_support() -> None:
    inj = McpInjection([STDIO, HTTP])
    inj.learn_initialize(
        1, msgspec.Raw(b'{"agentCapabilities":{"mcpCapabilities":{"http":false}}}'))
    out = json.loads(bytes(inj.apply(msgspec.Raw(b"{}"))))
    assert [s["name"] for s in out["mcpServers"]] == ["files"]


def test_v2_support_is_read_from_capabilities_session_mcp_markers() -> None:
    inj = McpInjection([STDIO, HTTP])
    inj.learn_initialize(2, msgspec.Raw(b'{"capabilities":{"session":{"mcp":{"http":{}}}}}'))
    out = json.loads(bytes(inj.apply(msgspec.Raw(b"{}"))))
    assert [s["name"] for s in out["mcpServers"]] == ["web"]


def test_a_stdio_server_needs_a_command_and_the_error_names_the_field(tmp_path: Path) -> None:
    chain = tmp_path / "c.toml"
    chain.write_text('[[mcp_server]]\nname = "x"\n[agent]\ncommand = "a"\n', encoding="utf-8")
    with pytest.raises(ConfigError, match=r"c\.toml: mcp_server\[0\].*needs `command`"):
        load_chain(chain)


def test_a_relative_stdio_command_is_resolved_to_an_absolute_path(tmp_path: Path) -> None:
    chain = tmp_path / "c.toml"
    chain.write_text('[[mcp_server]]\nname = "x"\ncommand = "sh"\n[agent]\ncommand = "a"\n',
                     encoding="utf-8")
    (server,) = mcp_servers(load_chain(chain))
    assert Path(server.command).is_absolute()


AGENT = textwrap.dedent("""
    import json, sys, time
    takes_http = sys.argv[1] == "http"
    for line in sys.stdin:
        m = json.loads(line)
        if m.get("method") == "initialize":
            time.sleep(0.2)  # the client's session/new is read before this answer
            r = {"protocolVersion": 1,
                 "agentCapabilities": {"mcpCapabilities": {"http": takes_http}}}
        else:
            r = {"raw": line.strip()}
        print(json.dumps({"jsonrpc": "2.0", "id": m["id"], "result": r}), flush=True)
""")


# The client sends session/new right behind initialize (JSON-RPC lets it pipeline): the
# setup waits for the agent's initialize answer, so an agent that says it does not take
# http never gets the http server.
@pytest.mark.parametrize(("takes", "expected"), [
    ("http", [{"type": "http", "name": "web", "url": "http://127.0.0.1:1/mcp", "headers": []}]),
    ("stdio-only", []),
])
def test_the_agent_receives_the_chain_files_servers_it_takes_in_session_new(
        tmp_path: Path, takes: str, expected: list[dict[str, object]]) -> None:
    (tmp_path / "agent.py").write_text(AGENT, encoding="utf-8")
    chain = tmp_path / "chain.toml"
    chain.write_text(textwrap.dedent(f"""
        [[mcp_server]]
        name = "web"
        type = "http"
        url = "http://127.0.0.1:1/mcp"
        [agent]
        command = [{json.dumps(sys.executable)}, "agent.py", "{takes}"]
        cwd = "."
    """), encoding="utf-8")
    frames = [
        {"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": {"protocolVersion": 1}},
        {"jsonrpc": "2.0", "id": 1, "method": "session/new", "params": {"cwd": "/w"}},
    ]
    stdin = "".join(json.dumps(f) + "\n" for f in frames)
    done = subprocess.run(conductor_argv("--chain", str(chain)), input=stdin, text=True,
                          capture_output=True, env=child_env(), timeout=30, check=False)
    assert done.returncode == 0, done.stderr
    answers = [json.loads(line) for line in done.stdout.splitlines()]
    seen = json.loads(answers[1]["result"]["raw"])["params"]
    assert seen.get("mcpServers", []) == expected


def test_injection_leaves_params_nested_too_deeply_as_they_are() -> None:
    inj = McpInjection([STDIO])
    deep = b"[" * 5000 + b"]" * 5000
    inj.learn_initialize(1, msgspec.Raw(b'{"agentCapabilities":' + deep + b"}"))
    params = msgspec.Raw(b'{"cwd":"/w","mcpServers":' + deep + b"}")
    assert inj.apply(params) is params


@pytest.mark.parametrize("servers", [b'{"a":1}', b'"x"', b"[" * 5000 + b"]" * 5000])
def test_a_required_server_that_cannot_be_added_refuses_the_setup_naming_it(
        servers: bytes) -> None:
    # `required` promises the agent has the server or the session is refused: a setup
    # whose mcpServers is not a list of entries cannot take it.
    inj = McpInjection([McpServer("files", "stdio", command="/usr/bin/files", required=True)])
    with pytest.raises(McpRefusedError) as refused:
        inj.apply(msgspec.Raw(b'{"cwd":"/w","mcpServers":' + servers + b"}"))
    assert refused.value.name == "files" and "mcpServers" in refused.value.reason


class _Box:
    """A MessageSink keeping what the router sent, as JSON."""

    def __init__(self) -> None:
        self.sent: list[Any] = []

    async def send(self, item: Message | list[Message]) -> None:
        for message in item if isinstance(item, list) else [item]:
            self.sent.append(json.loads(encode(message)))

    async def aclose(self) -> None:
        pass


async def _chain_with_a_mute_agent(servers: list[McpServer]) -> tuple[Chain, Hop, _Box]:
    """client -> agent, initialized by the client; the agent never answers initialize."""
    client, agent = Hop("client", _Box()), Hop("agent", box := _Box())

    async def starter() -> list[ComponentLink]:
        return [ComponentLink("agent", Role.AGENT, agent)]

    chain = Chain(client, starter, mcp=McpInjection(servers))
    await chain.receive(client, decode(b'{"jsonrpc":"2.0","id":0,"method":"initialize",'
                                       b'"params":{"protocolVersion":1}}'))
    return chain, client, box


async def _setup(chain: Chain, client: Hop, ident: int) -> None:
    with anyio.fail_after(5):
        await chain.receive(client, decode(json.dumps({
            "jsonrpc": "2.0", "id": ident, "method": "session/new",
            "params": {"cwd": "/w", "mcpServers": []}}).encode()))


@pytest.mark.anyio
async def test_setups_behind_an_initialize_the_agent_never_answers_wait_once_then_go_on(
        monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    monkeypatch.setattr(chain_module, "INITIALIZE_WAIT", 0.2)
    chain, client, agent = await _chain_with_a_mute_agent([HTTP])
    await _setup(chain, client, 1)
    await _setup(chain, client, 2)  # given up once: it does not wait again
    assert [m.get("method") for m in agent.sent] == ["initialize", "session/new", "session/new"]
    assert caplog.text.count("has not answered initialize after 0.2 s") == 1


@pytest.mark.anyio
async def test_a_setup_that_nothing_in_it_turns_on_the_agents_answer_does_not_wait() -> None:
    chain, client, agent = await _chain_with_a_mute_agent([])
    await _setup(chain, client, 1)  # INITIALIZE_WAIT is 60 s: a wait would fail here
    assert [m.get("method") for m in agent.sent] == ["initialize", "session/new"]
