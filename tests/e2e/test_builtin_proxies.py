"""Each built-in proxy, in-process and stand-alone, through the conductor and a real agent."""

from __future__ import annotations

import json
import re
from typing import TYPE_CHECKING, Any

import anyio
import pytest

from acp_conductor_proxies.transcript import file_stem
from conductor.testing import TestClient
from tests.conftest import BIN
from tests.wire_client import open_served_client

if TYPE_CHECKING:
    from pathlib import Path

    from conductor.jsonrpc.message import Message

DEMO_AGENT = ["${PYTHON}", "-m", "conductor.demo_agent"]
SDK_AGENT = ["${PYTHON}", str(BIN / "sdk_tool_agent.py")]
MODES = ["in-process", "stand-alone"]


def toml(value: Any) -> str:
    if isinstance(value, dict):
        return "{ " + ", ".join(f"{k} = {toml(v)}" for k, v in value.items()) + " }"
    if isinstance(value, list):
        return "[" + ", ".join(toml(v) for v in value) + "]"
    if isinstance(value, bool):
        return "true" if value else "false"
    return json.dumps(value)  # strings and numbers: JSON spelling is valid TOML here


def write_chain(tmp_path: Path, proxy: str, options: dict[str, Any], mode: str,
                agent: list[str]) -> Path:
    if mode == "in-process":
        entry = f"use = {toml(proxy)}\noptions = {toml(options)}"
    else:
        argv = ["${PYTHON}", "-m", "conductor", "serve-proxy", proxy, "--options",
                json.dumps(options)]
        entry = f"command = {toml(argv)}"
    path = tmp_path / "chain.toml"
    path.write_text(f'[[proxy]]\nname = "{proxy}"\n{entry}\n\n[agent]\ncommand = {toml(agent)}\n',
                    encoding="utf-8")
    return path


async def run_turns(tmp_path: Path, chain: Path, prompts: list[str], *, cwd: str = "/tmp",
                    client: TestClient | None = None, **env: str) -> tuple[TestClient, str]:
    """Serve `chain`, run the prompts in one session; (client, what the conductor logged)."""
    log = tmp_path / "stderr.log"
    async with open_served_client("--chain", str(chain), env=env, log=log,
                                  client=client) as client:
        with anyio.fail_after(20):
            sid = await client.new_session(cwd)
            for text in prompts:
                await client.prompt(sid, text)
    return client, log.read_text(encoding="utf-8")


@pytest.mark.parametrize("mode", MODES)
async def test_passthrough_carries_a_turn(tmp_path: Path, mode: str) -> None:
    chain = write_chain(tmp_path, "passthrough", {}, mode, DEMO_AGENT)
    client, _ = await run_turns(tmp_path, chain, ["hello"])
    assert client.agent_text() == "Hello from the demo agent. You said: hello "


@pytest.mark.parametrize("mode", MODES)
async def test_permissions_deny_env_reads_through_the_editor_with_the_sdk_agent(
        tmp_path: Path, mode: str) -> None:
    asked: list[str] = []

    async def read(message: Message) -> object:
        asked.append(message.params_value()["path"])
        return {"content": "readme text"}

    options = {"default": "ask", "rules": [
        {"name": "protect-env", "path": ".env*", "action": "deny"},
        {"name": "reads", "kind": "read", "action": "allow"}]}
    chain = write_chain(tmp_path, "permissions", options, mode, SDK_AGENT)
    client, log = await run_turns(
        tmp_path, chain, ["read /proj/.env", "read /proj/README.md"], cwd="/proj",
        client=TestClient({"fs/read_text_file": read}))
    assert asked == ["/proj/README.md"]  # the editor never saw the .env read
    text = client.agent_text()
    assert "read failed" in text and "denied by the permissions policy" in text
    assert "file says: readme text" in text
    assert "deny fs/read_text_file kind=read paths=['/proj/.env'] (by protect-env)" in log
    assert "allow fs/read_text_file kind=read paths=['/proj/README.md'] (by reads)" in log


@pytest.mark.parametrize("mode", MODES)
async def test_permissions_deny_env_reads_spelt_oddly_or_through_a_symlink(
        tmp_path: Path, mode: str) -> None:
    project = tmp_path / "project"
    project.mkdir()
    (project / ".env").write_text("SECRET=1", encoding="utf-8")
    (project / "innocent.txt").symlink_to(".env")
    asked: list[str] = []

    async def read(message: Message) -> object:
        asked.append(message.params_value()["path"])
        return {"content": "plain text"}

    options = {"default": "allow", "rules": [{"name": "protect-env", "path": ".env*",
                                              "action": "deny"}]}
    chain = write_chain(tmp_path, "permissions", options, mode, SDK_AGENT)
    client, log = await run_turns(
        tmp_path, chain, [f"read {project}/./.env/", f"read {project}/innocent.txt",
                          "read innocent.txt", f"read {project}/ok.txt"],
        cwd=str(project), client=TestClient({"fs/read_text_file": read}))
    assert asked == [f"{project}/ok.txt"]  # no spelling of .env reached the editor
    assert client.agent_text().count("denied by the permissions policy") == 3
    assert f"deny fs/read_text_file kind=read paths=['{project}/./.env/'] (by protect-env)" \
        in log
    assert f"deny fs/read_text_file kind=read paths=['{project}/innocent.txt'] " \
        "(by protect-env)" in log
    # ACP paths are absolute: the editor might resolve a relative one anywhere
    assert "deny fs/read_text_file path='innocent.txt'" in log
    assert "(cannot place it: path must be absolute (ACP), got 'innocent.txt')" in log


@pytest.mark.parametrize("mode", MODES)
async def test_permissions_answer_a_tool_permission_by_rule_without_asking_the_editor(
        tmp_path: Path, mode: str) -> None:
    options = {"rules": [{"name": "notes", "kind": "edit", "path": "notes.txt",
                          "action": "allow"}]}
    chain = write_chain(tmp_path, "permissions", options, mode, DEMO_AGENT)
    client, log = await run_turns(tmp_path, chain, ["please write"])
    assert client.received_params("session/request_permission") == []
    assert client.agent_text().startswith("Hello from the demo agent")
    assert re.search(r"allow session/request_permission kind=edit title='Write notes.txt' "
                     r"paths=\['/\S*/notes.txt'\] \(by notes\)", log), log


@pytest.mark.parametrize("mode", MODES)
async def test_context_injects_agents_md_into_the_first_prompt_only(tmp_path: Path,
                                                                     mode: str) -> None:
    project = tmp_path / "project"
    project.mkdir()
    (project / "AGENTS.md").write_text("Use tabs.", encoding="utf-8")
    chain = write_chain(tmp_path, "context", {"files": ["AGENTS.md"], "text": "Be brief."},
                        mode, DEMO_AGENT)
    client, log = await run_turns(tmp_path, chain, ["one", "two"], cwd=str(project))
    text = client.agent_text()
    first, second = text.split("You said: ")[1:]
    assert "<acp-conductor:context>" in first and "Use tabs." in first and "Be brief." in first
    assert second.strip() == "two"
    assert "injected into demo-session-1: AGENTS.md (9 bytes), text (9 bytes)" in log


@pytest.mark.parametrize("mode", MODES)
async def test_redact_scrubs_patterns_and_env_values_and_never_logs_them(tmp_path: Path,
                                                                         mode: str) -> None:
    chain = write_chain(tmp_path, "redact", {"patterns": [r"sk-[a-z0-9]{8,}"],
                                             "env": ["E2E_SECRET"]}, mode, SDK_AGENT)
    client, log = await run_turns(tmp_path, chain, ["key sk-abcdef123456 and hunter2hunter2"],
                                  E2E_SECRET="hunter2hunter2")
    text = client.agent_text()
    assert text == "sdk echo: key [redacted] and [redacted]"
    assert "scrubbed 1 x env E2E_SECRET, 1 x pattern 1 in session/prompt" in log
    assert "sk-abcdef123456" not in log and "hunter2hunter2" not in log


@pytest.mark.parametrize("mode", MODES)
async def test_transcript_writes_markdown_and_jsonl_per_session(tmp_path: Path,
                                                                mode: str) -> None:
    out = tmp_path / "transcripts"
    chain = write_chain(tmp_path, "transcript", {"directory": str(out)}, mode, DEMO_AGENT)
    await run_turns(tmp_path, chain, ["please write"],
                    client=TestClient({"session/request_permission": {
                        "outcome": {"outcome": "selected", "optionId": "allow"}}}))
    stem = file_stem("demo-session-1")
    assert stem.startswith("demo-session-1-")
    markdown = (out / f"{stem}.md").read_text(encoding="utf-8")
    for expected in ("# Session demo-session-1", "## User\n\nplease write",
                     "- Tool call `Write notes.txt` (edit): pending",
                     "- Permission for `Write notes.txt`: allow",
                     "- Tool call call-1: completed",
                     "**Agent:** Hello from the demo agent. You said: please write",
                     "_Turn ended: end_turn_"):
        assert expected in markdown
    events = [json.loads(line) for line in
              (out / f"{stem}.jsonl").read_text(encoding="utf-8").splitlines()]
    kinds = [e["type"] for e in events]
    assert kinds[:4] == ["session", "prompt", "tool_call", "permission"]
    assert kinds[-1] == "stop" and "agent_text" in kinds
