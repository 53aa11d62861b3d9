"""Proxies speaking the spec and the older dialect, chains nested, the conductor as a proxy."""

from __future__ import annotations

import json
import shlex
import sys
from typing import TYPE_CHECKING

import pytest

from tests.conftest import REPO, conductor_argv
from tests.wire_client import (
    Json,
    WireClient,
    agent_cmd,
    open_conductor,
    open_served,
    proxy_cmd,
)

if TYPE_CHECKING:
    from pathlib import Path


def methods(record: Path) -> list[str]:
    return [json.loads(x).get("method", "<response>")
            for x in record.read_text(encoding="utf-8").splitlines()]


async def exercise(c: WireClient) -> None:
    """A whole conversation: initialize, session, prompt, a question back, a cancel."""
    await c.initialize()
    sid = await c.new_session()
    answer = await c.request("session/prompt", {"sessionId": sid, "prompt": []})
    assert answer["result"] == {"stopReason": "end_turn"}
    assert [m["method"] for m in c.inbox] == ["session/update", "session/update"]
    c.inbox.clear()
    await c.send({"jsonrpc": "2.0", "id": "q", "method": "_test/ask",
                  "params": {"method": "session/request_permission", "params": {"n": 1}}})
    asked = await c.read_until(lambda m: m.get("method") == "session/request_permission")
    assert asked["params"] == {"n": 1}
    await c.send({"jsonrpc": "2.0", "id": asked["id"], "result": {"ok": True}})
    assert (await c.response("q"))["result"] == {"result": {"ok": True}}
    await c.send({"jsonrpc": "2.0", "id": "h", "method": "_test/hang", "params": {}})
    await c.send({"jsonrpc": "2.0", "method": "$/cancel_request", "params": {"requestId": "h"}})
    assert (await c.response("h"))["error"]["code"] == -32800


def write_chain(tmp_path: Path, body: str) -> str:
    path = tmp_path / "chain.toml"
    path.write_text(body, encoding="utf-8")
    return str(path)


async def test_a_legacy_proxy_is_initialized_again_in_its_dialect_after_method_not_found(
        tmp_path: Path) -> None:
    record = tmp_path / "legacy.jsonl"
    async with open_served("agent", proxy_cmd("--dialect", "legacy", "--record", str(record)),
                           agent_cmd()) as c:
        await exercise(c)
    seen = methods(record)
    assert seen[:2] == ["_proxy/initialize", "initialize"]
    # Traffic from its successor is wrapped the legacy way.
    assert "_proxy/successor/request" in seen
    assert "_proxy/successor/notification" in seen
    first_init = json.loads(record.read_text(encoding="utf-8").splitlines()[1])
    assert first_init["params"]["_meta"]["proxy"] is True


async def test_the_agent_behind_a_legacy_proxy_is_not_told_it_is_a_proxy(
        tmp_path: Path) -> None:
    # A legacy proxy forwards the initialize it was given, `_meta.proxy: true` included;
    # the agent must get plain initialize (protocol.md §3), or it may act as a proxy.
    record = tmp_path / "agent.jsonl"
    async with open_served("agent", proxy_cmd("--dialect", "legacy"),
                           agent_cmd("--record", str(record))) as c:
        await c.initialize()
    init = json.loads(record.read_text(encoding="utf-8").splitlines()[0])
    assert init["method"] == "initialize"
    assert "proxy" not in init["params"].get("_meta", {})
    assert init["params"]["clientInfo"] == {"name": "wire-client", "version": "0"}


async def test_the_chain_file_dialect_key_forces_the_legacy_handshake(tmp_path: Path) -> None:
    record = tmp_path / "legacy.jsonl"
    chain = write_chain(tmp_path, f"""
[[proxy]]
name = "old"
command = {json.dumps(proxy_cmd("--dialect", "legacy", "--record", str(record)))}
dialect = "legacy"

[agent]
command = {json.dumps(agent_cmd())}
""")
    async with open_served("--chain", chain) as c:
        await exercise(c)
    assert methods(record)[0] == "initialize"


async def test_a_spec_dialect_proxy_is_answered_in_its_own_spelling(tmp_path: Path) -> None:
    record = tmp_path / "spec.jsonl"
    async with open_served("agent", proxy_cmd("--dialect", "spec", "--record", str(record),
                                              "--envelope-meta", '{"from":"spec"}'),
                           agent_cmd()) as c:
        await exercise(c)
    seen = methods(record)
    assert "proxy/successor" in seen
    assert "_proxy/successor" not in seen[1:]


async def test_the_chain_file_dialect_key_forces_the_spec_handshake(tmp_path: Path) -> None:
    record = tmp_path / "spec.jsonl"
    chain = write_chain(tmp_path, f"""
[[proxy]]
command = {json.dumps(proxy_cmd("--dialect", "spec", "--strict", "--record", str(record)))}
dialect = "spec"

[agent]
command = {json.dumps(agent_cmd())}
""")
    async with open_served("--chain", chain) as c:
        await exercise(c)
    assert methods(record)[0] == "proxy/initialize"


async def test_a_chain_mixing_all_three_dialects_works() -> None:
    async with open_served("agent", proxy_cmd("--dialect", "legacy"),
                           proxy_cmd("--dialect", "spec"), proxy_cmd(), agent_cmd()) as c:
        await exercise(c)


@pytest.mark.parametrize("inner_proxies", [1, 2])
async def test_a_conductor_nests_as_a_proxy_inside_another_conductor(
        tmp_path: Path, inner_proxies: int) -> None:
    record = tmp_path / "agent.jsonl"
    inner = shlex.join(conductor_argv("proxy", *[proxy_cmd()] * inner_proxies))
    odd = '{"b" : 1e2,"a":"\\u00e9", "n":null}'
    async with open_served("agent", proxy_cmd(), inner,
                           agent_cmd("--record", str(record))) as c:
        await exercise(c)
        await c.send_raw(f'{{"jsonrpc":"2.0","id":1,"method":"_test/echo","params":{odd}}}\n'
                         .encode())
        line = await c.read_raw()
    assert line.endswith(f'"result":{odd}}}'.encode())
    assert f'"params":{odd}}}' in record.read_text(encoding="utf-8")


async def test_as_a_proxy_the_conductor_carries_envelope_meta_to_its_predecessor() -> None:
    # The test plays the outer conductor: it speaks to `acp-conductor proxy` directly.
    async with open_served("proxy", proxy_cmd("--envelope-meta", '{"hop":"inner"}')) as c:
        await c.send({"jsonrpc": "2.0", "id": 0, "method": "_proxy/initialize",
                      "params": {"protocolVersion": 1}})
        wrapped = await c.read_until(lambda m: m.get("method") == "_proxy/successor")
        assert wrapped["params"] == {"method": "initialize", "params": {"protocolVersion": 1},
                                     "_meta": {"hop": "inner"}}
        await c.send({"jsonrpc": "2.0", "id": wrapped["id"], "result": {"protocolVersion": 1}})
        assert (await c.response(0))["result"] == {"protocolVersion": 1}
        # Our successor's messages come back wrapped to the proxy and plain from it.
        await c.send({"jsonrpc": "2.0", "method": "_proxy/successor",
                      "params": {"method": "session/update", "params": {"x": 1}}})
        note = await c.read_until(lambda m: m.get("method") == "session/update")
        assert note["params"] == {"x": 1}


async def test_a_proxy_with_no_components_passes_everything_through_unchanged() -> None:
    # Issue 10: `acp-conductor proxy` alone was refused; the Rust conductor tests that an
    # empty nested conductor is a transparent proxy. The test plays the outer conductor.
    async with open_served("proxy") as c:
        await c.send({"jsonrpc": "2.0", "id": 0, "method": "_proxy/initialize",
                      "params": {"protocolVersion": 1}})
        wrapped = await c.read_until(lambda m: m.get("method") == "_proxy/successor")
        assert wrapped["params"] == {"method": "initialize", "params": {"protocolVersion": 1}}
        await c.send({"jsonrpc": "2.0", "id": wrapped["id"], "result": {"protocolVersion": 1}})
        assert (await c.response(0))["result"] == {"protocolVersion": 1}
        await c.send({"jsonrpc": "2.0", "id": 1, "method": "session/new",
                      "params": {"cwd": "/", "mcpServers": []}})
        wrapped = await c.read_until(lambda m: m.get("method") == "_proxy/successor")
        assert wrapped["params"] == {"method": "session/new",
                                     "params": {"cwd": "/", "mcpServers": []}}
        await c.send({"jsonrpc": "2.0", "id": wrapped["id"], "result": {"sessionId": "s"}})
        assert (await c.response(1))["result"] == {"sessionId": "s"}
        await c.send({"jsonrpc": "2.0", "method": "_proxy/successor",
                      "params": {"method": "session/update", "params": {"sessionId": "s"}}})
        note = await c.read_until(lambda m: m.get("method") == "session/update")
        assert note["params"] == {"sessionId": "s"}



async def initialized_as_proxy(c: WireClient, version: int = 1) -> Json:
    """Initialize a conductor in proxy mode as its outer conductor would, answering the
    initialize it sends on through us for its successor; its answer to ours."""
    await c.send({"jsonrpc": "2.0", "id": 0, "method": "_proxy/initialize",
                  "params": {"protocolVersion": version}})
    return await answered_as_successor(c, 0, {"protocolVersion": version})


async def answered_as_successor(c: WireClient, ident: Json, result: Json) -> Json:
    """Answer, as its successor, what the conductor in proxy mode sends on for the request
    `ident` it got; its answer to that request."""
    wrapped = await c.read_until(lambda m: m.get("method") == "_proxy/successor")
    await c.send({"jsonrpc": "2.0", "id": wrapped["id"], "result": result})
    return await c.response(ident)


async def test_as_a_proxy_a_v2_turn_its_successor_does_not_end_ends_at_prompt_timeout(
        tmp_path: Path) -> None:
    # The successor accepted the prompt (answered it) and never said the session is idle:
    # the editor side is told it ended, and the successor to stop it, wrapped.
    chain = write_chain(tmp_path, f"""
[conductor]
prompt_timeout = 0.5

[[proxy]]
command = {json.dumps(proxy_cmd())}
""")
    async with open_conductor("proxy", "--chain", chain) as c:
        await initialized_as_proxy(c, version=2)
        await c.send({"jsonrpc": "2.0", "id": 1, "method": "session/new",
                      "params": {"cwd": "/", "mcpServers": []}})
        assert (await answered_as_successor(c, 1, {"sessionId": "s"}))["result"] \
            == {"sessionId": "s"}
        await c.send({"jsonrpc": "2.0", "id": 2, "method": "session/prompt",
                      "params": {"sessionId": "s", "prompt": []}})
        assert (await answered_as_successor(c, 2, {}))["result"] == {}
        ended = await c.read_until(lambda m: m.get("method") == "session/update")
        cancel = await c.read_until(lambda m: m.get("method") == "_proxy/successor")
    assert ended["params"]["update"]["state"] == "idle"
    error = ended["params"]["update"]["_meta"]["acp-conductor"]["error"]
    assert error["code"] == -33005 and error["data"]["component"] == "successor"
    assert cancel["params"] == {"method": "session/cancel", "params": {"sessionId": "s"}}

async def test_as_a_proxy_the_conductor_refuses_a_second_proxy_initialize() -> None:
    async with open_served("proxy", proxy_cmd()) as c:
        assert (await initialized_as_proxy(c))["result"] == {"protocolVersion": 1}
        again = await c.request("_proxy/initialize", {"protocolVersion": 1}, ident=1)
        assert again["error"]["code"] == -32600
        assert "only sent by the conductor" in again["error"]["data"]


async def test_as_a_proxy_the_conductor_answers_a_legacy_predecessor_in_the_legacy_dialect(
        ) -> None:
    async with open_served("proxy", proxy_cmd()) as c:
        await c.send({"jsonrpc": "2.0", "id": 0, "method": "initialize",
                      "params": {"protocolVersion": 1, "_meta": {"proxy": True}}})
        wrapped = await c.read_until(lambda m: m.get("method") == "_proxy/successor/request")
        assert wrapped["params"]["method"] == "initialize"
        await c.send({"jsonrpc": "2.0", "id": wrapped["id"], "result": {"protocolVersion": 1}})
        # The legacy dialect's proxy accepts the role in its answer: @thinkwell/conductor
        # fails the editor's initialize without it.
        assert (await c.response(0))["result"] == {"protocolVersion": 1,
                                                   "_meta": {"proxy": True}}


async def test_a_malformed_successor_envelope_is_answered_with_invalid_params() -> None:
    async with open_served("proxy", proxy_cmd()) as c:
        await initialized_as_proxy(c)
        await c.send({"jsonrpc": "2.0", "id": "bad", "method": "_proxy/successor",
                      "params": {"params": {}}})
        answer = await c.response("bad")
        assert answer["error"]["code"] == -32602
        assert "envelope" in answer["error"]["data"]


async def test_a_legacy_proxy_behind_a_restarted_proxy_is_not_initialized_twice(
        tmp_path: Path) -> None:
    # p1 speaks only the legacy dialect, so the conductor asks it again; the answer to that
    # second ask is what p0's re-initialize after its restart is answered with.
    record = tmp_path / "legacy.jsonl"
    faulty = [sys.executable, str(REPO / "tests" / "faults" / "faulty.py"),
              "--role", "proxy", "--name", "p0"]
    chain = write_chain(tmp_path, f"""
[conductor]
shutdown_grace = 1.0

[[proxy]]
name = "p0"
command = {json.dumps(faulty)}
restart = "on-failure"

[[proxy]]
name = "p1"
command = {json.dumps(proxy_cmd("--dialect", "legacy", "--record", str(record)))}

[agent]
command = {json.dumps(agent_cmd())}
""")
    async with open_conductor("--chain", chain, "--log-level", "info", check_exit=True) as c:
        await c.initialize()
        crashed = await c.request("_fault/crash", {"who": "p0"})
        assert crashed["error"]["data"]["component"] == "p0"
        await c.wait_stderr("p0 is back after its restart")
        sid = await c.new_session()
        assert sid
    assert methods(record).count("initialize") == 1


async def test_as_a_proxy_requests_owed_by_the_successor_are_answered_as_soon_as_the_client_closes(
        tmp_path: Path) -> None:
    # The successor is reached through the client's own pipe: once the client closes its
    # input, no answer from the successor can come. Waiting shutdown_grace for one made a
    # nested chain take grace x depth to stop (its editor waiting all along).
    chain = write_chain(tmp_path, f"""
[conductor]
shutdown_grace = 60

[[proxy]]
command = {json.dumps(proxy_cmd())}
""")
    async with open_conductor("proxy", "--chain", chain) as c:
        await initialized_as_proxy(c)
        await c.send({"jsonrpc": "2.0", "id": "q", "method": "session/prompt",
                      "params": {"sessionId": "s", "prompt": []}})
        await c.read_until(lambda m: m.get("method") == "_proxy/successor")  # never answered
        await c.close_stdin()
        answer = await c.response("q")
        assert answer["error"]["data"]["component"] == "client"
        assert "closed its input" in answer["error"]["message"]
        assert await c.wait() == 0
