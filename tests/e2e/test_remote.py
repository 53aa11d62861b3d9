"""`acp-conductor serve` as users run it: a real server process on an ephemeral 127.0.0.1
port, driven by the official Python SDK's HTTP/WebSocket clients, and chains whose agent
is another served chain reached by `url =`."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import ssl
import subprocess
from contextlib import asynccontextmanager
from typing import TYPE_CHECKING, Any

import anyio
import httpx
import httpx_ws
import psutil
import pytest

from tests.conftest import BIN, REPO, child_env, conductor_argv
from tests.e2e.test_sdk_interop import RecordingClient
from tests.wire_client import ConductorProcess, open_conductor, still_running

if TYPE_CHECKING:
    from collections.abc import AsyncIterator
    from pathlib import Path

TOKEN = "e2e-token-" + "x" * 24
AUTH = {"Authorization": f"Bearer {TOKEN}"}
DEMO_CHAIN = """
[[proxy]]
use = "passthrough"

[agent]
name = "demo"
command = ["${PYTHON}", "-m", "conductor.demo_agent"]
"""


class Server(ConductorProcess):
    ws_url = ""
    http_url = ""


@asynccontextmanager
async def open_server(chain: Path, *args: str, token: str | None = TOKEN,
                      expect_exit: int = 143) -> AsyncIterator[Server]:
    """`acp-conductor serve` on 127.0.0.1, any free port; SIGTERM on exit, which must end it
    gracefully (143) with no component left behind."""
    env = child_env(ACP_CONDUCTOR_TOKEN=token or "")
    process = await anyio.open_process(
        conductor_argv("serve", "--chain", str(chain), "--listen", "127.0.0.1:0",
                       "--log-level", "info", *args),
        env=env, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL)
    server = Server(process)
    async with anyio.create_task_group() as tg:
        tg.start_soon(server._pump_stderr)
        try:
            await server.wait_stderr("(Streamable HTTP)")
            found = re.search(r"at (wss?://\S+) \(WebSocket\) and (https?://\S+) ",
                              server.stderr_text)
            assert found, server.stderr_text
            server.ws_url, server.http_url = found.group(1), found.group(2)
            yield server
            children: list[psutil.Process] = []
            if process.returncode is None:  # the test may have killed it
                try:
                    children = psutil.Process(process.pid).children(recursive=True)
                    server.signal(signal.SIGTERM)
                except psutil.NoSuchProcess:  # killed, and reaped before returncode was set
                    pass
            with anyio.fail_after(20):
                assert await process.wait() == expect_exit, server.stderr_text
            alive = await still_running(children)
            assert not alive, f"left behind: {alive}"
        finally:
            if process.returncode is None:
                with anyio.CancelScope(shield=True):
                    process.kill()
                    with anyio.move_on_after(5):
                        await process.wait()
            tg.cancel_scope.cancel()


@pytest.fixture
def demo_chain(tmp_path: Path) -> Path:
    path = tmp_path / "demo.toml"
    path.write_text(DEMO_CHAIN, encoding="utf-8")
    return path


async def sdk_turn(transport: Any, prompt: str) -> tuple[RecordingClient, Any]:
    # The SDK is imported here, not at the top: see tests/e2e/test_sdk_interop.py.
    from acp import PROTOCOL_VERSION, connect_to_agent, text_block
    from acp.schema import ClientCapabilities, FileSystemCapabilities, Implementation

    client = RecordingClient()
    conn = connect_to_agent(client, transport)
    try:
        with anyio.fail_after(20):
            init = await conn.initialize(
                protocol_version=PROTOCOL_VERSION,
                client_capabilities=ClientCapabilities(
                    fs=FileSystemCapabilities(read_text_file=True)),
                client_info=Implementation(name="sdk-test", version="0"))
            assert init.protocol_version == PROTOCOL_VERSION
            session = await conn.new_session(cwd="/", mcp_servers=[])
            answer = await conn.prompt(session_id=session.session_id,
                                       prompt=[text_block(prompt)])
    finally:
        await conn.close()
    return client, answer


@pytest.mark.parametrize("profile", ["ws", "http"])
async def test_the_python_sdk_drives_a_served_chain(demo_chain: Path, profile: str) -> None:
    from acp.http import create_http_stream
    from acp.ws import create_websocket_stream

    async with open_server(demo_chain) as server:
        transport = (await create_websocket_stream(server.ws_url, headers=dict(AUTH))
                     if profile == "ws" else create_http_stream(server.http_url,
                                                                headers=dict(AUTH)))
        client, answer = await sdk_turn(transport, "permission please read:/notes.txt")
    assert answer.stop_reason == "end_turn"
    assert len(client.permissions) == 1  # the agent's request crossed the chain, and back
    text = "".join(client.text)
    assert "Read: contents of /notes.txt" in text
    assert f"{profile} client" in server.stderr_text  # logged with its transport


async def test_a_wrong_or_missing_token_is_refused_and_never_logged(demo_chain: Path) -> None:
    from acp.ws import create_websocket_stream

    async with open_server(demo_chain, token=None) as server:
        await server.wait_stderr("token (send")
        found = re.search(r"token \(send `Authorization: Bearer TOKEN`\): (\S+)",
                          server.stderr_text)
        assert found, server.stderr_text
        generated = found.group(1)
        async with httpx.AsyncClient() as http:
            wrong = await http.post(server.http_url, json={"jsonrpc": "2.0", "id": 1,
                                                           "method": "initialize"},
                                    headers={"Authorization": "Bearer guess-guess-guess-1"})
            missing = await http.post(server.http_url, json={})
            with pytest.raises(httpx_ws.WebSocketUpgradeError) as refused:
                async with httpx_ws.aconnect_ws(server.http_url, http,
                                                headers={"Authorization": f"Bearer {TOKEN}"}):
                    pass
        await server.wait_stderr("wrong bearer token (401)")
        transport = await create_websocket_stream(
            server.ws_url, headers={"Authorization": f"Bearer {generated}"})
        _, answer = await sdk_turn(transport, "hello")
    assert [wrong.status_code, missing.status_code] == [401, 401]
    assert refused.value.response.status_code == 401
    assert answer.stop_reason == "end_turn"
    log = server.stderr_text
    assert log.count(generated) == 1  # printed once at start, never in a log line
    assert "guess-guess-guess-1" not in log and TOKEN not in log


async def test_a_chain_whose_agent_is_another_served_chain(demo_chain: Path,
                                                          tmp_path: Path) -> None:
    async with open_server(demo_chain) as inner:
        outer = tmp_path / "outer.toml"
        outer.write_text(f'[agent]\nname = "remote"\nurl = "{inner.ws_url}"\n'
                         'headers = { Authorization = "Bearer ${INNER_TOKEN}" }\n',
                         encoding="utf-8")
        trace = tmp_path / "t.jsonl"
        done = await anyio.run_process(
            conductor_argv("--trace", str(trace), "run", "--chain", str(outer),
                           "hello over the wire"),
            env=child_env(INNER_TOKEN=TOKEN), check=False)
    out = done.stdout.decode()
    assert done.returncode == 0, done.stderr.decode()
    assert "Hello from the demo agent. You said: hello over the wire" in out
    events = [json.loads(line) for line in trace.read_text().splitlines()]
    spawned = [e for e in events if e.get("event") == "spawned"]
    assert [(e["component"], e["transport"], e["url"]) for e in spawned] == [
        ("remote", "ws", inner.ws_url)]
    assert any(e.get("hop") == "remote" and e.get("method") == "session/prompt"
               for e in events)


async def test_a_remote_proxy_is_a_chain_served_as_a_proxy(tmp_path: Path) -> None:
    inner_chain = tmp_path / "inner.toml"
    inner_chain.write_text('[[proxy]]\nuse = "passthrough"\n', encoding="utf-8")
    async with open_server(inner_chain, "--as-proxy") as inner:
        outer = tmp_path / "outer.toml"
        outer.write_text(f'[[proxy]]\nname = "far"\nurl = "{inner.ws_url}"\n'
                         f'headers = {{ Authorization = "Bearer {TOKEN}" }}\n'
                         '[agent]\ncommand = ["${PYTHON}", "-m", "conductor.demo_agent"]\n',
                         encoding="utf-8")
        done = await anyio.run_process(
            conductor_argv("run", "--chain", str(outer), "through a remote proxy"),
            env=child_env(), check=False)
    assert done.returncode == 0, done.stderr.decode()
    assert "You said: through a remote proxy" in done.stdout.decode()


async def test_a_remote_agent_whose_connection_drops_is_answered_like_a_crash(
        demo_chain: Path, tmp_path: Path) -> None:
    async with open_server(demo_chain, expect_exit=-9) as inner:
        outer = tmp_path / "outer.toml"
        outer.write_text(f'[agent]\nurl = "{inner.ws_url}"\n'
                         f'headers = {{ Authorization = "Bearer {TOKEN}" }}\n',
                         encoding="utf-8")
        async with open_conductor("--chain", str(outer)) as conductor:
            await conductor.initialize()
            session = await conductor.new_session()
            await conductor.send({"jsonrpc": "2.0", "id": "p", "method": "session/prompt",
                                  "params": {"sessionId": session,
                                             "prompt": [{"type": "text", "text": "hang"}]}})
            await conductor.read_until(lambda m: m.get("method") == "session/update")
            inner.process.kill()  # the machine the agent runs on goes away
            answer = await conductor.response("p")
            # (stderr in the message: this failed once, in a full run under load)
            assert await conductor.wait() == 3, conductor.stderr_text
    assert "error" in answer, (answer, conductor.stderr_text)
    error = answer["error"]
    assert error["code"] == -33001
    assert error["data"] == {"component": "agent", "url": inner.ws_url}
    assert "agent: the connection to" in error["message"] and "dropped" in error["message"]


async def test_a_client_that_disconnects_mid_prompt_leaves_no_process_behind(
        tmp_path: Path) -> None:
    # The connection's chain waits its grace for the prompt nobody answers: a short one.
    chain = tmp_path / "chain.toml"
    chain.write_text("[conductor]\nshutdown_grace = 0.3\n" + DEMO_CHAIN, encoding="utf-8")
    async with open_server(chain) as server, httpx.AsyncClient() as http:
        async with httpx_ws.aconnect_ws(server.http_url, http, headers=dict(AUTH)) as ws:
            async def call(ident: int, method: str, params: Any) -> Any:
                await ws.send_text(json.dumps({"jsonrpc": "2.0", "id": ident,
                                               "method": method, "params": params}))
                while True:
                    message = json.loads(await ws.receive_text())
                    if message.get("id") == ident or message.get("method") == "session/update":
                        return message

            with anyio.fail_after(20):
                await call(1, "initialize", {"protocolVersion": 1, "clientCapabilities": {}})
                opened = await call(2, "session/new", {"cwd": "/", "mcpServers": []})
                update = await call(3, "session/prompt", {
                    "sessionId": opened["result"]["sessionId"],
                    "prompt": [{"type": "text", "text": "hang"}]})
                assert update["method"] == "session/update"  # the agent is mid-turn
                agents = [p for p in psutil.Process(server.pid).children(recursive=True)
                          if "conductor.demo_agent" in " ".join(p.cmdline())]
                assert len(agents) == 1
        # The socket is gone with the prompt unanswered: the connection's chain stops.
        assert not await still_running(agents, 15)
        await server.wait_stderr("its chain stopped")


def test_serving_beyond_loopback_without_tls_is_refused(demo_chain: Path) -> None:
    done = subprocess.run(conductor_argv("serve", "--chain", str(demo_chain), "--listen",
                                         "0.0.0.0:0"),
                          env=child_env(), capture_output=True, text=True, timeout=30,
                          check=False)
    assert done.returncode == 2
    assert "--listen: 0.0.0.0 is reachable from other machines" in done.stderr
    assert "--tls-cert" in done.stderr


def test_a_token_file_readable_by_others_is_refused(demo_chain: Path, tmp_path: Path) -> None:
    tokens = tmp_path / "tokens"
    tokens.write_text(TOKEN + "\n", encoding="utf-8")
    tokens.chmod(0o644)
    done = subprocess.run(conductor_argv("serve", "--chain", str(demo_chain),
                                         "--token-file", str(tokens)),
                          env=child_env(), capture_output=True, text=True, timeout=30,
                          check=False)
    assert done.returncode == 2 and "chmod 600" in done.stderr


async def test_a_turn_on_a_remote_agent_is_cancelled_across_the_websocket_hop(
        demo_chain: Path, tmp_path: Path) -> None:
    async with open_server(demo_chain) as inner:
        outer = tmp_path / "outer.toml"
        outer.write_text(f'[agent]\nurl = "{inner.ws_url}"\n'
                         f'headers = {{ Authorization = "Bearer {TOKEN}" }}\n',
                         encoding="utf-8")
        async with open_conductor("--chain", str(outer)) as conductor:
            await conductor.initialize()
            session = await conductor.new_session()
            await conductor.send({"jsonrpc": "2.0", "id": "p", "method": "session/prompt",
                                  "params": {"sessionId": session,
                                             "prompt": [{"type": "text", "text": "hang"}]}})
            await conductor.read_until(lambda m: m.get("method") == "session/update")
            await conductor.send({"jsonrpc": "2.0", "method": "session/cancel",
                                  "params": {"sessionId": session}})
            answer = await conductor.response("p")
            # the remote agent still serves this session after the cancelled turn
            again = await conductor.request("session/prompt", {
                "sessionId": session, "prompt": [{"type": "text", "text": "still there"}]})
    assert answer["result"] == {"stopReason": "cancelled"}
    assert again["result"] == {"stopReason": "end_turn"}


async def test_a_remote_proxy_whose_connection_drops_is_answered_naming_it(
        tmp_path: Path) -> None:
    inner_chain = tmp_path / "inner.toml"
    inner_chain.write_text('[[proxy]]\nuse = "passthrough"\n', encoding="utf-8")
    async with open_server(inner_chain, "--as-proxy", expect_exit=-9) as inner:
        outer = tmp_path / "outer.toml"
        outer.write_text(f'[[proxy]]\nname = "far"\nurl = "{inner.ws_url}"\n'
                         f'headers = {{ Authorization = "Bearer {TOKEN}" }}\n'
                         '[agent]\ncommand = ["${PYTHON}", "-m", "conductor.demo_agent"]\n',
                         encoding="utf-8")
        async with open_conductor("--chain", str(outer)) as conductor:
            await conductor.initialize()
            session = await conductor.new_session()
            await conductor.send({"jsonrpc": "2.0", "id": "p", "method": "session/prompt",
                                  "params": {"sessionId": session,
                                             "prompt": [{"type": "text", "text": "hang"}]}})
            await conductor.read_until(lambda m: m.get("method") == "session/update")
            inner.process.kill()  # the machine the proxy runs on goes away
            answer = await conductor.response("p")
            assert await conductor.wait() == 3
    error = answer["error"]
    assert error["code"] == -33001
    assert error["data"] == {"component": "far", "url": inner.ws_url}
    assert "far: the connection to" in error["message"]


async def test_sigterm_with_a_websocket_client_connected_ends_without_a_traceback(
        demo_chain: Path) -> None:
    async with open_server(demo_chain) as server, httpx.AsyncClient() as http:
        async with httpx_ws.aconnect_ws(server.http_url, http, headers=dict(AUTH)) as ws:
            with anyio.fail_after(20):
                await ws.send_text(json.dumps({"jsonrpc": "2.0", "id": 1, "method": "initialize",
                                               "params": {"protocolVersion": 1,
                                                          "clientCapabilities": {}}}))
                assert json.loads(await ws.receive_text())["id"] == 1
                server.signal(signal.SIGTERM)  # the client keeps its socket open meanwhile
                with pytest.raises(httpx_ws.WebSocketDisconnect):
                    await ws.receive_text()
                assert await server.wait() == 143
    assert "Traceback" not in server.stderr_text, server.stderr_text


# .ci/run installs the TypeScript SDK (acpx depends on it) here; skipped only outside CI.
TS_SDK = REPO / ".ci" / "node" / "node_modules" / "@agentclientprotocol" / "sdk"
NODE = shutil.which("node")


def _node_websocket_flags() -> list[str] | None:
    """The node flags that give it a global WebSocket (none on 22+, a flag on 20), or None
    when this node has none at all (18): the ws case cannot run there, CI or not."""
    assert NODE is not None
    for flags in ([], ["--experimental-websocket"]):
        probe = subprocess.run([NODE, *flags, "-e", "process.exit(typeof WebSocket === "
                                "'undefined' ? 3 : 0)"], capture_output=True, check=False)
        if probe.returncode == 0:
            return flags
    return None


@pytest.mark.skipif((NODE is None or not (TS_SDK / "dist" / "http-stream.js").exists())
                    and not os.environ.get("CI"),
                    reason="node and the TypeScript ACP SDK are not installed (.ci/run does)")
@pytest.mark.parametrize("mode", ["http", "ws"])
async def test_the_typescript_sdk_drives_a_served_chain(demo_chain: Path, mode: str) -> None:
    assert NODE is not None
    flags: list[str] | None = []
    if mode == "ws" and (flags := _node_websocket_flags()) is None:
        pytest.skip(f"{NODE} has no WebSocket (node 20 or later has)")
    async with open_server(demo_chain) as server:
        # Over ws the client authenticates as a browser does, with the subprotocol
        # `bearer.TOKEN`.
        url = server.ws_url if mode == "ws" else server.http_url
        with anyio.fail_after(30):
            done = await anyio.run_process(
                [NODE, *flags, str(BIN / "ts_sdk_client.mjs"), mode, url, "hello from node"],
                env=child_env(ACP_SDK_DIR=str(TS_SDK), ACP_TOKEN=TOKEN), check=False)
    out = done.stdout.decode()
    assert done.returncode == 0, done.stderr.decode()
    assert "You said: hello from node" in out
    assert "stop: end_turn" in out


@pytest.mark.skipif((NODE is None or not (TS_SDK / "dist" / "http-stream.js").exists())
                    and not os.environ.get("CI"),
                    reason="node and the TypeScript ACP SDK are not installed (.ci/run does)")
async def test_the_typescript_sdk_loads_a_session_over_streamable_http(demo_chain: Path
                                                                      ) -> None:
    # Its client opens the session's SSE stream before it POSTs session/load.
    assert NODE is not None
    async with open_server(demo_chain) as server:
        with anyio.fail_after(30):
            done = await anyio.run_process(
                [NODE, str(BIN / "ts_sdk_client.mjs"), "http", server.http_url, "again",
                 "earlier-session"],
                env=child_env(ACP_SDK_DIR=str(TS_SDK), ACP_TOKEN=TOKEN), check=False)
    assert done.returncode == 0, done.stderr.decode()
    assert "You said: again" in done.stdout.decode()


def _self_signed(tmp_path: Path) -> tuple[Path, Path]:
    """A certificate for 127.0.0.1 and its key (cryptography comes with the mcp SDK)."""
    import datetime
    import ipaddress

    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "127.0.0.1")])
    now = datetime.datetime.now(datetime.UTC)
    cert = (x509.CertificateBuilder().subject_name(name).issuer_name(name)
            .public_key(key.public_key()).serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + datetime.timedelta(days=1))
            .add_extension(x509.SubjectAlternativeName(
                [x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]), critical=False)
            .sign(key, hashes.SHA256()))
    cert_file, key_file = tmp_path / "cert.pem", tmp_path / "key.pem"
    cert_file.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_file.write_bytes(key.private_bytes(serialization.Encoding.PEM,
                                           serialization.PrivateFormat.PKCS8,
                                           serialization.NoEncryption()))
    return cert_file, key_file


async def test_a_chain_served_with_tls_answers_over_wss_and_https(
        demo_chain: Path, tmp_path: Path) -> None:
    cert, key = _self_signed(tmp_path)
    initialize = {"jsonrpc": "2.0", "id": 1, "method": "initialize",
                  "params": {"protocolVersion": 1, "clientCapabilities": {}}}
    async with open_server(demo_chain, "--tls-cert", str(cert), "--tls-key", str(key)) \
            as server, httpx.AsyncClient(verify=ssl.create_default_context(cafile=cert)) as http:
        assert server.ws_url.startswith("wss://") and server.http_url.startswith("https://")
        with anyio.fail_after(20):
            async with httpx_ws.aconnect_ws(server.http_url, http,
                                            headers=dict(AUTH)) as ws:
                await ws.send_text(json.dumps(initialize))
                answer = json.loads(await ws.receive_text())
            posted = await http.post(server.http_url, json=initialize,
                                     headers={**AUTH, "Accept": "application/json, "
                                              "text/event-stream"})
    assert answer["result"]["agentInfo"]["name"] == "demo-agent"
    assert posted.status_code == 200, posted.text
    assert posted.json()["result"]["agentInfo"]["name"] == "demo-agent"
    assert posted.headers["Acp-Connection-Id"]


async def test_a_wss_agent_with_a_self_signed_certificate_is_trusted_through_ssl_cert_file(
        demo_chain: Path, tmp_path: Path) -> None:
    # What docs/remote.md tells a user to do for a self-signed `wss://` server.
    cert, key = _self_signed(tmp_path)
    async with open_server(demo_chain, "--tls-cert", str(cert), "--tls-key", str(key)) \
            as server:
        outer = tmp_path / "outer.toml"
        outer.write_text(f'[agent]\nurl = "{server.ws_url}"\n'
                         f'headers = {{ Authorization = "Bearer {TOKEN}" }}\n',
                         encoding="utf-8")
        async with open_conductor("--chain", str(outer)) as untrusting:
            refused = await untrusting.request("initialize", {"protocolVersion": 1}, ident=0)
        async with open_conductor("--chain", str(outer), check_exit=True,
                                  env={"SSL_CERT_FILE": str(cert)}) as conductor:
            answer = await conductor.initialize()
    # Without it the error says how to trust the certificate, not only that it failed.
    assert "certificate verify failed" in refused["error"]["message"]
    assert "SSL_CERT_FILE" in refused["error"]["message"]
    assert answer["agentInfo"]["name"] == "demo-agent"
