"""@thinkwell/conductor (TypeScript, the older `_meta.proxy` proxy dialect) runs our proxies.

Optional, as for the benchmark: `npm install --prefix bench/node`; skipped without it.
"""

from __future__ import annotations

import json
import shutil
import sys

import anyio
import pytest

from tests.conftest import BIN, REPO, child_env
from tests.wire_client import ConductorProcess

NODE = shutil.which("node")
LAUNCHER = REPO / "bench" / "node" / "thinkwell.mjs"
PACKAGE = REPO / "bench" / "node" / "node_modules" / "@thinkwell" / "conductor"
pytestmark = pytest.mark.skipif(NODE is None or not PACKAGE.exists(),
                                reason="node or @thinkwell/conductor is not installed "
                                       "(npm install --prefix bench/node)")


async def test_our_stand_alone_proxy_and_nested_conductor_serve_a_turn_under_thinkwell() -> None:
    # thinkwell fails the editor's initialize unless each proxy's answer accepts the role
    # (`_meta.proxy: true`); then a whole turn, a question to the editor included.
    assert NODE is not None
    ours = [[sys.executable, "-m", "conductor", "serve-proxy", "passthrough"],
            [sys.executable, "-m", "conductor", "proxy"]]
    agent = [sys.executable, str(BIN / "sdk_interop_agent.py")]
    argv = [NODE, str(LAUNCHER), *(json.dumps(c) for c in [*ours, agent])]
    process = await anyio.open_process(argv, env=child_env())
    c = ConductorProcess(process)
    try:
        async with anyio.create_task_group() as tg:
            tg.start_soon(c._pump_stderr)
            init = await c.initialize()
            assert init["agentInfo"]["name"] == "sdk-agent", c.stderr_text
            sid = await c.new_session()
            await c.send({"jsonrpc": "2.0", "id": "p", "method": "session/prompt",
                          "params": {"sessionId": sid, "prompt": [{"type": "text",
                                                                   "text": "hi"}]}})
            asked = await c.read_until(lambda m: m.get("method") == "session/request_permission")
            await c.send({"jsonrpc": "2.0", "id": asked["id"],
                          "result": {"outcome": {"outcome": "selected", "optionId": "allow"}}})
            read = await c.read_until(lambda m: m.get("method") == "fs/read_text_file")
            await c.send({"jsonrpc": "2.0", "id": read["id"], "result": {"content": "notes"}})
            assert (await c.response("p"))["result"] == {"stopReason": "end_turn"}
            said = [m["params"]["update"]["content"]["text"] for m in c.inbox
                    if m.get("method") == "session/update"]
            assert said == ["you said: ", "hi", "notes"]
            await c.close_stdin()
            await c.read_to_end()
            assert await c.wait() == 0
            tg.cancel_scope.cancel()
    finally:
        if process.returncode is None:
            process.kill()
            with anyio.CancelScope(shield=True), anyio.move_on_after(5):
                await process.wait()
