"""The official Python ACP SDK on either end of the conductor.

The SDK is imported where it is used, not at the top: every xdist worker imports every
test module to collect it, and the SDK's pydantic schema costs each of them ~0.4 s of CPU.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
from typing import TYPE_CHECKING, Any

import anyio
import pytest

from tests.conftest import BIN, REPO, child_env, conductor_argv, py
from tests.wire_client import open_conductor

if TYPE_CHECKING:
    from acp.schema import ReadTextFileResponse, RequestPermissionResponse


class RecordingClient:
    """An SDK client that approves permissions and serves one file."""

    def __init__(self, approve: bool = True) -> None:
        self.approve = approve
        self.text: list[str] = []
        self.permissions: list[Any] = []

    async def request_permission(self, options: list[Any], session_id: str, tool_call: Any,
                                 **kwargs: Any) -> RequestPermissionResponse:
        from acp.schema import AllowedOutcome, RequestPermissionResponse

        self.permissions.append(tool_call)
        choice = "allow" if self.approve else "reject"
        option = next(o for o in options if o.option_id.startswith(choice[:3]))
        return RequestPermissionResponse(
            outcome=AllowedOutcome(outcome="selected", option_id=option.option_id))

    async def session_update(self, session_id: str, update: Any, **kwargs: Any) -> None:
        content = getattr(update, "content", None)
        if getattr(update, "session_update", None) == "agent_message_chunk" and content:
            self.text.append(content.text)

    async def read_text_file(self, path: str, session_id: str, **kwargs: Any
                             ) -> ReadTextFileResponse:
        from acp.schema import ReadTextFileResponse

        return ReadTextFileResponse(content=f"contents of {path}")

    async def write_text_file(self, *args: Any, **kwargs: Any) -> None:
        from acp import RequestError

        raise RequestError.method_not_found("fs/write_text_file")

    async def create_terminal(self, *args: Any, **kwargs: Any) -> Any:
        from acp import RequestError

        raise RequestError.method_not_found("terminal/create")

    async def ext_method(self, method: str, params: dict[str, Any]) -> dict[str, Any]:
        from acp import RequestError

        raise RequestError.method_not_found(method)

    async def ext_notification(self, method: str, params: dict[str, Any]) -> None:
        return None


async def converse(chain: list[str], prompt: str, client: RecordingClient) -> str:
    from acp import PROTOCOL_VERSION, spawn_agent_process, text_block
    from acp.schema import ClientCapabilities, FileSystemCapabilities, Implementation

    argv = conductor_argv(*chain)
    with anyio.fail_after(20):
        async with spawn_agent_process(client, argv[0], *argv[1:], env=child_env()) as (conn, _):
            init = await conn.initialize(
                protocol_version=PROTOCOL_VERSION,
                client_capabilities=ClientCapabilities(
                    fs=FileSystemCapabilities(read_text_file=True, write_text_file=False)),
                client_info=Implementation(name="sdk-client", version="0"))
            assert init.protocol_version == PROTOCOL_VERSION
            session = await conn.new_session(cwd="/", mcp_servers=[])
            answer = await conn.prompt(session_id=session.session_id,
                                       prompt=[text_block(prompt)])
            return answer.stop_reason


@pytest.mark.parametrize("proxies", [0, 1])
async def test_the_sdk_client_drives_the_demo_agent_through_the_conductor(proxies: int) -> None:
    client = RecordingClient()
    chain = ["agent", *[py("relay_proxy.py")] * proxies,
             f"{sys.executable} -m conductor.demo_agent"]
    stop = await converse(chain, "please ask permission", client)
    assert stop == "end_turn"
    assert len(client.permissions) == 1
    assert "You said: please ask permission" in "".join(client.text)


@pytest.mark.parametrize("proxies", [1, 2])
async def test_an_sdk_agent_behind_proxies_serves_the_sdk_client(proxies: int) -> None:
    client = RecordingClient()
    chain = ["agent", *[py("relay_proxy.py")] * proxies, py("sdk_interop_agent.py")]
    stop = await converse(chain, "hello", client)
    assert stop == "end_turn"
    assert "".join(client.text) == "you said: hellocontents of /notes.txt"


async def test_an_sdk_agent_behind_a_passthrough_proxy_serves_a_raw_client() -> None:
    passthrough = f"{sys.executable} -m acp_conductor_proxies.passthrough"
    async with open_conductor("agent", passthrough, py("relay_proxy.py"),
                              py("sdk_interop_agent.py")) as c:
        init = await c.initialize()
        assert init["agentInfo"]["name"] == "sdk-agent"
        sid = await c.new_session()
        await c.send({"jsonrpc": "2.0", "id": "p", "method": "session/prompt",
                      "params": {"sessionId": sid, "prompt": [{"type": "text", "text": "x"}]}})
        asked = await c.read_until(lambda m: m.get("method") == "session/request_permission")
        await c.send({"jsonrpc": "2.0", "id": asked["id"],
                      "result": {"outcome": {"outcome": "cancelled"}}})
        answer = await c.response("p")
        assert answer["result"]["stopReason"] == "refusal"
        updates = [m for m in c.inbox if m.get("method") == "session/update"]
        assert [u["params"]["sessionId"] for u in updates] == [sid, sid]


async def test_the_demo_agent_refuses_when_the_sdk_client_denies() -> None:
    client = RecordingClient(approve=False)
    stop = await converse(["agent", py("relay_proxy.py"),
                           f"{sys.executable} -m conductor.demo_agent"], "write a file", client)
    assert stop == "refusal"


# .ci/run installs the TypeScript SDK (acpx depends on it) here; skipped only outside CI.
TS_SDK = REPO / ".ci" / "node" / "node_modules" / "@agentclientprotocol" / "sdk"
NODE = shutil.which("node")


@pytest.mark.skipif((NODE is None or not (TS_SDK / "dist" / "acp.js").exists())
                    and not os.environ.get("CI"),
                    reason="node and the TypeScript ACP SDK are not installed (.ci/run does)")
async def test_every_v1_method_crosses_the_chain_between_the_typescript_and_python_sdks() -> None:
    assert NODE is not None
    argv = conductor_argv("agent", py("relay_proxy.py"), py("sdk_full_agent.py"))
    with anyio.fail_after(30):
        done = await anyio.run_process([NODE, str(BIN / "ts_sdk_full_client.mjs"), *argv],
                                       env=child_env(ACP_SDK_DIR=str(TS_SDK)), check=False)
    assert done.returncode == 0, done.stderr.decode()
    got = json.loads(done.stdout.decode().splitlines()[-1])
    answers = got["answers"]
    assert answers["initialize"]["_meta"] == {"initMeta": "t1"}
    assert answers["new"] == {"sessionId": "s1", "_meta": {"newMeta": 1}}
    assert answers["setMode"] == {"_meta": {"mode": "code"}}
    assert answers["setConfigOption"] == {"configOptions": [], "_meta": {"model": "big"}}
    assert answers["prompt"] == {"stopReason": "end_turn"}
    # The Python SDK strips the extension's leading `_`; params and `_meta` cross as sent.
    assert answers["ext"] == {"method": "x/client_ask", "params": {"z": 3, "_meta": {"e": 4}}}
    assert answers["cancelled"] == {"stopReason": "cancelled"}
    turn = 'OUT|0|R|{"got": {"q": 1}}'
    assert got["said"] == [f"{turn}|2", "replayed", f"{turn}|None"]
    assert got["asked"] == 2 * [
        "terminal/create", "terminal/output", "terminal/wait_for_exit", "terminal/kill",
        "terminal/release", "fs/write_text_file", "fs/read_text_file", "_x/agent_ask",
        "_x/agent_note"]
