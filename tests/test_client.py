"""The editor-side client, reused by tests: drives a conductor subprocess in editor mode."""

from __future__ import annotations

import json
import subprocess
import sys
from typing import TYPE_CHECKING, Any

import anyio

from conductor.editor.client import EditorHandler, RpcError, open_client_connection
from tests.conftest import child_env, conductor_argv

if TYPE_CHECKING:
    from pathlib import Path


class Recorder(EditorHandler):
    def __init__(self) -> None:
        self.updates: list[dict[str, Any]] = []
        self.asked: list[str] = []

    async def handle_request(self, method: str, params: Any) -> Any:
        if method == "session/request_permission":
            self.asked.append(params["toolCall"]["title"])
            return {"outcome": {"outcome": "selected", "optionId": "allow"}}
        return await super().handle_request(method, params)

    async def handle_notification(self, method: str, params: Any) -> None:
        if method == "session/update":
            self.updates.append(params["update"])


async def test_client_drives_a_traced_conductor_in_editor_mode(tmp_path: Path) -> None:
    trace = tmp_path / "editor.jsonl"
    argv = conductor_argv("--trace", str(trace), "agent",
                          f"{sys.executable} -m conductor.demo_agent")
    handler = Recorder()
    async with await anyio.open_process(argv, env=child_env(),
                                        stderr=subprocess.DEVNULL) as proc:
        assert proc.stdout is not None and proc.stdin is not None
        with anyio.fail_after(20):
            async with open_client_connection(proc.stdout, proc.stdin, handler) as conn:
                init = await conn.request("initialize", {"protocolVersion": 1})
                assert init["agentInfo"]["name"] == "demo-agent"
                sid = (await conn.request("session/new", {"cwd": str(tmp_path),
                                                          "mcpServers": []}))["sessionId"]
                result = await conn.request("session/prompt", {
                    "sessionId": sid, "prompt": [{"type": "text", "text": "permission"}]})
                try:
                    await conn.request("no/such_method", {})
                    raise AssertionError("expected an error")
                except RpcError as e:
                    assert e.code == -32601
            await proc.wait()
    assert result == {"stopReason": "end_turn"}
    assert handler.asked == ["Write notes.txt"]
    assert handler.updates[-1]["content"]["text"] == "permission "
    assert proc.returncode == 0
    events = [json.loads(line) for line in trace.read_text().splitlines()]
    client = [e for e in events if e.get("hop") == "client"]
    assert [e["method"] for e in client if e["dir"] == "in" and e["kind"] == "request"] == [
        "initialize", "session/new", "session/prompt", "no/such_method"]
    assert any(e.get("event") == "spawned" for e in events)


DEEP = b"[" * 5000 + b"]" * 5000


async def test_an_answer_nested_too_deeply_fails_its_request_instead_of_hanging() -> None:
    from conductor.transport.memory import memory_pipe

    to_client, client_in = memory_pipe()
    client_out, from_client = memory_pipe()
    with anyio.fail_after(5):
        async with to_client, client_in, client_out, from_client, \
                open_client_connection(client_in, client_out) as conn:
            async with anyio.create_task_group() as tg:
                async def agent() -> None:
                    asked = json.loads(await from_client.receive())
                    await to_client.send(b'{"jsonrpc":"2.0","method":"x","params":' + DEEP
                                         + b',"id":"deep-q"}\n')
                    refused = json.loads(await from_client.receive())
                    assert refused["id"] == "deep-q"
                    assert refused["error"]["code"] == -32600
                    await to_client.send(b'{"jsonrpc":"2.0","id":%d,"result":' % asked["id"]
                                         + DEEP + b"}\n")
                tg.start_soon(agent)
                try:
                    await conn.request("session/prompt", {})
                    raise AssertionError("expected an error")
                except RpcError as e:
                    assert "cannot be read" in e.message
                    assert "nested too deeply" in e.message
