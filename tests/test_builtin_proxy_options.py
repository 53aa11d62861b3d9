"""Unit tests of the built-in proxies' option handling and helpers (no processes)."""

from __future__ import annotations

import json
import logging
import os
import re
from pathlib import Path
from typing import Any

import anyio
import pytest
from pydantic import ValidationError

from acp_conductor_proxies.context import Context, ContextOptions
from acp_conductor_proxies.permissions import (
    TOOL_KINDS,
    Permissions,
    PermissionsOptions,
    path_matches,
)
from acp_conductor_proxies.redact import Redact, RedactOptions
from acp_conductor_proxies.transcript import Transcript, TranscriptOptions, file_stem
from conductor.errors import RpcError
from conductor.testing import ScriptedAgent, TestClient, open_test_chain, says


@pytest.fixture
def workspace(tmp_path: Path) -> Path:
    ws = tmp_path / "ws"
    (ws / "sub").mkdir(parents=True)
    (ws / ".env").write_text("SECRET=1", encoding="utf-8")
    (ws / "ok.txt").write_text("ok", encoding="utf-8")
    (ws / "innocent.txt").symlink_to(".env")
    (ws / "k.txt").symlink_to(ws / ".env")
    (ws / "hop").symlink_to(ws / "sub")
    return ws


@pytest.mark.parametrize("path", [
    ".env", "./.env", "./.env/", "./.env/.", "sub/../.env/.", ".env//", "innocent.txt",
    "./innocent.txt", "k.txt", "{ws}/.env", "{ws}/.env/", "{ws}/sub/../.env", "{ws}/innocent.txt",
])
def test_an_env_deny_pattern_matches_every_spelling_and_symlink_of_the_env_file(
        workspace: Path, path: str) -> None:
    assert path_matches(".env*", path.format(ws=workspace), str(workspace))


def test_an_env_deny_pattern_does_not_match_an_ordinary_file(workspace: Path) -> None:
    for path in ("ok.txt", "./ok.txt", f"{workspace}/ok.txt", "sub/../ok.txt"):
        assert not path_matches(".env*", path, str(workspace))


@pytest.mark.parametrize("path", ["secrets/a", "./secrets/a", "sub/../secrets/a",
                                  "{ws}/secrets/a", "./secrets//a"])
def test_a_pattern_with_a_slash_matches_relative_to_the_session_cwd(workspace: Path,
                                                                    path: str) -> None:
    assert path_matches("secrets/*", path.format(ws=workspace), str(workspace))
    assert not path_matches("secrets/*", "other/a", str(workspace))


def test_a_relative_spelling_without_a_cwd_is_still_normalised() -> None:
    assert path_matches(".env*", "./.env/.", None)


def test_a_path_through_a_symlinked_cwd_matches_relative_to_the_real_cwd(
        workspace: Path, tmp_path: Path) -> None:
    alias = tmp_path / "alias"
    alias.symlink_to(workspace)
    assert path_matches("sub/*", f"{workspace}/sub/x", str(alias))
    assert path_matches(".env*", f"{alias}/innocent.txt", str(workspace))


# --- context -----------------------------------------------------------------------------

def context(**options: Any) -> Context:
    return Context(ContextOptions(**options))


@pytest.mark.parametrize(("kind", "hint"), [
    ("exec", "did you mean 'execute'?"), (["read", "Edit"], "did you mean 'edit'?"),
    ("reads", "did you mean 'read'?"),
])
def test_permissions_refuses_a_misspelt_rule_kind_when_options_are_read(
        kind: str | list[str], hint: str) -> None:
    # Such a rule matched nothing: a deny `kind = "exec"` let every command through.
    with pytest.raises(ValidationError, match="is not an ACP tool kind") as refused:
        PermissionsOptions(rules=[{"kind": kind, "action": "deny"}])
    assert hint in str(refused.value)
    assert "the kinds are read, edit, delete, move, search, execute, think" in str(refused.value)


async def test_permissions_warns_of_a_rule_kind_acp_does_not_name_yet(
        caplog: pytest.LogCaptureFixture) -> None:
    # v2 reserves other kinds for later versions: a rule may name one ahead of its time.
    options = PermissionsOptions(rules=[{"name": "b", "kind": "browse", "action": "ask"}])
    async with open_test_chain([Permissions(options)], ScriptedAgent()):
        pass
    assert "rule b names tool kind 'browse', which ACP does not name" in caplog.text


def test_permissions_takes_every_acp_tool_kind_and_an_agents_own() -> None:
    kinds = [*TOOL_KINDS, "_acme_deploy"]
    assert PermissionsOptions(rules=[{"kind": kinds, "action": "deny"}]).rules[0].kind == kinds


@pytest.mark.parametrize("pattern", ["/etc/passwd", "/tmp/*.md", ""])
def test_context_rejects_absolute_or_empty_file_patterns_when_options_are_read(
        pattern: str) -> None:
    with pytest.raises(ValidationError, match="relative to the session cwd"):
        ContextOptions(files=["AGENTS.md", pattern])


def test_context_says_which_pattern_matched_no_file(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    (tmp_path / "AGENTS.md").write_text("rules", encoding="utf-8")
    with caplog.at_level(logging.INFO):
        pieces = context(files=["AGENT.md", "AGENTS.md"]).collect(str(tmp_path))
    assert pieces == [("AGENTS.md", "rules")]
    assert f"no file matches AGENT.md in {tmp_path}" in caplog.text
    assert "no file matches AGENTS.md" not in caplog.text


def test_context_skips_an_unreadable_file_with_a_warning_naming_it(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    (tmp_path / "a.md").write_text("alpha", encoding="utf-8")
    (tmp_path / "b.md").write_text("beta-secret", encoding="utf-8")
    real_open = Path.open

    def failing_open(self: Path, *args: Any, **kwargs: Any) -> Any:
        if self.name == "b.md":  # root ignores file modes, so fail the open itself
            raise PermissionError(13, "Permission denied")
        return real_open(self, *args, **kwargs)

    monkeypatch.setattr(Path, "open", failing_open)
    with caplog.at_level(logging.WARNING):
        pieces = context(files=["*.md"]).collect(str(tmp_path))
    assert pieces == [("a.md", "alpha")]
    assert "skipped b.md: Permission denied" in caplog.text
    assert "beta-secret" not in caplog.text


def test_context_reads_no_more_than_max_file_bytes(tmp_path: Path,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "big.md").write_bytes(b"x" * 10_000)
    asked: list[int] = []
    real_open = Path.open

    def recording_open(self: Path, *args: Any, **kwargs: Any) -> Any:
        f = real_open(self, *args, **kwargs)
        real_read = f.read

        def read(n: int = -1) -> bytes:
            asked.append(n)
            return real_read(n)

        f.read = read
        return f

    monkeypatch.setattr(Path, "open", recording_open)
    assert context(files=["big.md"], max_file_bytes=100).collect(str(tmp_path)) == \
        [("big.md", "x" * 100)]
    assert asked == [100]  # never the whole file


def test_context_skips_symlinks_that_resolve_outside_the_session_cwd(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    project, outside = tmp_path / "project", tmp_path / "outside"
    project.mkdir()
    outside.mkdir()
    (outside / "secret.md").write_text("private", encoding="utf-8")
    (project / "inside.md").write_text("shared", encoding="utf-8")
    (project / "leak.md").symlink_to(outside / "secret.md")
    (project / "alias.md").symlink_to("inside.md")
    with caplog.at_level(logging.WARNING):
        pieces = context(files=["*.md", "../outside/*.md"]).collect(str(project))
    assert pieces == [("alias.md", "shared"), ("inside.md", "shared")]
    assert "skipped leak.md: it resolves outside the session cwd" in caplog.text
    assert "skipped ../outside/secret.md: it resolves outside the session cwd" in caplog.text


async def test_context_retries_injection_after_a_prompt_whose_collection_failed(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "AGENTS.md").write_text("Use tabs.", encoding="utf-8")
    proxy = context(files=["AGENTS.md"])
    real_collect = proxy.collect
    calls = 0

    def flaky_collect(cwd: str | None) -> list[tuple[str, str]]:
        nonlocal calls
        calls += 1
        if calls == 1:
            raise RuntimeError("transient failure")
        return real_collect(cwd)

    monkeypatch.setattr(proxy, "collect", flaky_collect)
    agent = ScriptedAgent()
    async with open_test_chain([proxy], agent) as client:
        with anyio.fail_after(10):
            sid = await client.new_session(str(tmp_path))
            with pytest.raises(RpcError):
                await client.prompt(sid, "one")
            await client.prompt(sid, "two")
            await client.prompt(sid, "three")
    prompts = [p["prompt"] for p in agent.received_params("session/prompt")]
    assert "Use tabs." in prompts[0][0]["text"] and prompts[0][1]["text"] == "two"
    assert prompts[1] == [{"type": "text", "text": "three"}]


async def test_context_passes_on_a_prompt_it_cannot_inject_into_and_injects_into_the_next(
        tmp_path: Path) -> None:
    # The session was marked injected before the block was put into the prompt: a prompt
    # the block could not go into (here, not a list) used up the session's one injection.
    (tmp_path / "AGENTS.md").write_text("Use tabs.", encoding="utf-8")
    agent = ScriptedAgent()
    async with open_test_chain([context(files=["AGENTS.md"])], agent) as client:
        with anyio.fail_after(10):
            sid = await client.new_session(str(tmp_path))
            # Passed on as sent, for the agent to judge (this one takes anything).
            await client.call("session/prompt", {"sessionId": sid, "prompt": "one"})
            await client.prompt(sid, "two")
    odd, prompt = [p["prompt"] for p in agent.received_params("session/prompt")]
    assert odd == "one"
    assert "Use tabs." in prompt[0]["text"] and prompt[1]["text"] == "two"


# --- transcript --------------------------------------------------------------------------

@pytest.mark.parametrize("session_id", ["s" * 5000, "a/b", "a_b", "..", "../../etc/x", "é/ü",
                                        "", ".hidden"])
def test_transcript_file_names_are_short_safe_and_visible(session_id: str) -> None:
    stem = file_stem(session_id)
    assert len(stem) <= 64 + 1 + 8
    assert not stem.startswith(".") and "/" not in stem
    assert re.fullmatch(r"([A-Za-z0-9._-]+-)?[0-9a-f]{8}", stem)


def test_transcript_ids_that_read_alike_get_different_files() -> None:
    assert file_stem("a/b") != file_stem("a_b")
    assert file_stem("x" * 64 + "1") != file_stem("x" * 64 + "2")


async def transcript_turn(directory: Path, session_id: str, *,
                          version: int = 1) -> ScriptedAgent:
    """Two turns ("one", "two"; the agent says "hi") of `session_id` through a transcript
    into `directory`, with an editor speaking ACP `version`."""
    agent = ScriptedAgent({"session/new": {"sessionId": session_id},
                           "session/prompt": says("hi")})
    async with open_test_chain([Transcript(TranscriptOptions(directory=str(directory)))],
                               agent, initialize=False) as client:
        with anyio.fail_after(10):
            await client.initialize(version)
            sid = await client.new_session("/tmp")
            assert (await client.prompt(sid, "one")).stop_reason == "end_turn"
            assert (await client.prompt(sid, "two")).stop_reason == "end_turn"
            assert client.agent_text() == "hihi"
    return agent


def transcript_of(directory: Path, session_id: str) -> tuple[str, list[dict[str, Any]]]:
    """A session's transcript: its Markdown, and its JSONL events."""
    stem = file_stem(session_id)
    lines = (directory / f"{stem}.jsonl").read_text(encoding="utf-8").splitlines()
    return ((directory / f"{stem}.md").read_text(encoding="utf-8"),
            [json.loads(line) for line in lines])


async def test_a_prompts_resources_are_recorded_by_their_uri_without_credentials(
        tmp_path: Path) -> None:
    # An embedded resource has its uri in `resource`: it was recorded as "[resource: ]".
    blocks: list[Any] = [
        {"type": "text", "text": "see "},
        {"type": "resource", "resource": {"uri": "file:///src/a.py", "text": "print(1)"}},
        {"type": "resource_link", "name": "b", "uri": "https://bob:hunter2@git.example/b.py"},
        {"type": "resource_link", "name": "c", "uri": "https://x.example/c?api_key=k3y&v=2"}]
    agent = ScriptedAgent({"session/new": {"sessionId": "s1"}})
    async with open_test_chain([Transcript(TranscriptOptions(directory=str(tmp_path)))],
                               agent) as client:
        with anyio.fail_after(10):
            await client.prompt(await client.new_session("/tmp"), blocks)
    markdown, events = transcript_of(tmp_path, "s1")
    recorded = ("see [resource: file:///src/a.py]"
                "[resource_link: https://[redacted]@git.example/b.py]"
                "[resource_link: https://x.example/c?api_key=[redacted]&v=2]")
    assert f"## User\n\n{recorded}\n\n" in markdown
    assert [e["text"] for e in events if e["type"] == "prompt"] == [recorded]
    assert "hunter2" not in markdown + json.dumps(events) and "k3y" not in markdown


@pytest.mark.parametrize("method", ["session/load", "session/resume"])
async def test_a_loaded_sessions_replayed_history_is_not_recorded_again_as_a_new_turn(
        tmp_path: Path, method: str) -> None:
    def said(kind: str, text: str) -> dict[str, Any]:
        return {"sessionId": "s1", "update": {"sessionUpdate": kind,
                                              "content": {"type": "text", "text": text}}}

    agent = ScriptedAgent({"session/new": {"sessionId": "s1"}})
    answers = iter(["hi", "bye"])

    async def prompt(agent: ScriptedAgent, message: Any) -> Any:
        await agent.notify("session/update", said("agent_message_chunk", next(answers)))
        return {"stopReason": "end_turn"}

    async def load(agent: ScriptedAgent, message: Any) -> Any:  # ACP: history, then the answer
        await agent.notify("session/update", said("user_message_chunk", "one"))
        await agent.notify("session/update", said("agent_message_chunk", "hi"))
        return {}
    agent.replies.update({"session/prompt": prompt, method: load})
    async with open_test_chain([Transcript(TranscriptOptions(directory=str(tmp_path)))],
                               agent) as client:
        with anyio.fail_after(10):
            await client.prompt(await client.new_session("/tmp"), "one")
            await client.call(method, {"sessionId": "s1", "cwd": "/tmp", "mcpServers": []})
            await client.prompt("s1", "two")
    markdown, events = transcript_of(tmp_path, "s1")
    assert markdown.count("**Agent:** hi") == 1
    assert markdown.endswith("not recorded again_\n\n## User\n\ntwo\n\n**Agent:** bye\n\n"
                             "_Turn ended: end_turn_\n\n")
    assert [e["text"] for e in events if e["type"] == "agent_text"] == ["hi", "bye"]
    assert [e["updates"] for e in events if e["type"] == "replayed"] == [2]


@pytest.mark.parametrize("version", [1, 2])
async def test_a_transcript_ends_each_turn_after_what_the_agent_said_in_it(
        tmp_path: Path, version: int) -> None:
    # ACP v2 answers a prompt when it accepts it; the turn ends with the idle state. The
    # transcript ended it at the answer ("Turn ended: None"), before the agent said a word.
    await transcript_turn(tmp_path, "sess-1", version=version)
    [md] = [name for name in os.listdir(tmp_path) if name.endswith(".md")]
    turn = "**Agent:** hi\n\n_Turn ended: end_turn_\n\n"
    assert f"## User\n\none\n\n{turn}## User\n\ntwo\n\n" in \
        (tmp_path / md).read_text(encoding="utf-8")


async def test_transcript_of_a_very_long_session_id_is_written(tmp_path: Path) -> None:
    await transcript_turn(tmp_path, "s" * 5000)
    [md] = [name for name in os.listdir(tmp_path) if name.endswith(".md")]
    assert "## User\n\none" in (tmp_path / md).read_text(encoding="utf-8")


async def test_transcript_that_cannot_be_written_warns_once_and_the_session_goes_on(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("", encoding="utf-8")  # a directory under a file: fails even for root
    with caplog.at_level(logging.WARNING):
        await transcript_turn(blocker / "transcripts", "sess-1")
    warnings = [r for r in caplog.records if "cannot write the transcript" in r.getMessage()]
    assert len(warnings) == 1 and "sess-1" in warnings[0].getMessage()


async def test_transcript_of_a_dot_dot_session_id_stays_a_visible_file_in_the_directory(
        tmp_path: Path) -> None:
    out = tmp_path / "out"
    await transcript_turn(out, "..")
    names = sorted(os.listdir(out))
    assert names == [f"{file_stem('..')}.jsonl", f"{file_stem('..')}.md"]
    assert not any(n.startswith(".") for n in names)
    assert os.listdir(tmp_path) == ["out"]



async def test_a_permission_request_naming_only_its_tool_call_is_recorded_by_the_announced_title(
        tmp_path: Path) -> None:
    # ACP's request_permission carries a ToolCallUpdate: all but the id may be left out, and
    # the editor shows the title the tool call announced. The transcript said `None`.
    agent = ScriptedAgent({"session/new": {"sessionId": "s1"}})
    answer = {"outcome": {"outcome": "selected", "optionId": "yes"}}
    async with open_test_chain([Transcript(TranscriptOptions(directory=str(tmp_path)))],
                               agent, client=TestClient({
                                   "session/request_permission": answer})) as client:
        with anyio.fail_after(10):
            sid = await client.new_session("/tmp")
            await agent.notify("session/update", {"sessionId": sid, "update": {
                "sessionUpdate": "tool_call", "toolCallId": "c1", "title": "Read .env",
                "kind": "read"}})
            await agent.call("session/request_permission", {
                "sessionId": sid, "toolCall": {"toolCallId": "c1"}, "options": []})
            await agent.call("session/request_permission", {
                "sessionId": sid, "toolCall": {"toolCallId": "never-announced"},
                "options": []})
    stem = file_stem("s1")
    markdown = (tmp_path / f"{stem}.md").read_text(encoding="utf-8")
    assert "- Permission for `Read .env`: yes\n" in markdown
    assert "- Permission for `never-announced`: yes\n" in markdown
    assert "None" not in markdown
    events = [json.loads(line) for line in
              (tmp_path / f"{stem}.jsonl").read_text(encoding="utf-8").splitlines()]
    assert [e["title"] for e in events if e["type"] == "permission"] == \
        ["Read .env", "never-announced"]


async def test_a_v2_permission_request_is_recorded_by_the_title_the_editor_shows(
        tmp_path: Path) -> None:
    # ACP v2 moved the prompt's title to the request itself, and the tool call into
    # `subject`: the transcript read only v1's `toolCall` and recorded `None`.
    agent = ScriptedAgent({"session/new": {"sessionId": "s1"}})
    answer = {"outcome": {"outcome": "selected", "optionId": "yes"}}
    async with open_test_chain([Transcript(TranscriptOptions(directory=str(tmp_path)))],
                               agent, client=TestClient({
                                   "session/request_permission": answer})) as client:
        with anyio.fail_after(10):
            await client.initialize(2)
            sid = await client.new_session("/tmp")
            await agent.notify("session/update", {"sessionId": sid, "update": {
                "sessionUpdate": "tool_call_update", "toolCallId": "c1", "title": "Read .env",
                "kind": "read", "status": "pending"}})
            await agent.call("session/request_permission", {
                "sessionId": sid, "title": "Allow reading .env?",
                "subject": {"type": "tool_call", "toolCall": {"toolCallId": "c1"}},
                "options": [{"optionId": "yes", "name": "Yes", "kind": "allow_once"}]})
            await agent.call("session/request_permission", {
                "sessionId": sid, "title": "Run make?",
                "subject": {"type": "command", "command": "make", "cwd": "/tmp"},
                "options": [{"optionId": "yes", "name": "Yes", "kind": "allow_once"}]})
    stem = file_stem("s1")
    markdown = (tmp_path / f"{stem}.md").read_text(encoding="utf-8")
    assert "- Permission for `Allow reading .env?`: yes\n" in markdown
    assert "- Permission for `Run make?`: yes\n" in markdown
    assert "None" not in markdown


async def test_a_v2_tool_call_announced_by_its_first_update_is_recorded_with_its_title(
        tmp_path: Path) -> None:
    # ACP v2 has no `tool_call` update: a tool call is created by its first
    # `tool_call_update`. The transcript recorded only "Tool call c1: pending", never
    # what the tool was.
    agent = ScriptedAgent({"session/new": {"sessionId": "s1"}})
    async with open_test_chain([Transcript(TranscriptOptions(directory=str(tmp_path)))],
                               agent) as client:
        with anyio.fail_after(10):
            await client.initialize(2)
            sid = await client.new_session("/tmp")
            for update in ({"title": "Read notes.md", "kind": "read", "status": "pending"},
                           {"status": "completed"}):
                await agent.notify("session/update", {"sessionId": sid, "update": {
                    "sessionUpdate": "tool_call_update", "toolCallId": "c1", **update}})
            await client.prompt(sid, "go")
    stem = file_stem("s1")
    markdown = (tmp_path / f"{stem}.md").read_text(encoding="utf-8")
    assert "- Tool call `Read notes.md` (read): pending\n" in markdown
    assert "- Tool call c1: completed\n" in markdown
    events = [json.loads(line) for line in
              (tmp_path / f"{stem}.jsonl").read_text(encoding="utf-8").splitlines()]
    assert [(e["type"], e["status"]) for e in events if "status" in e] == \
        [("tool_call", "pending"), ("tool_call_update", "completed")]


async def test_a_long_streamed_message_is_recorded_in_linear_time(tmp_path: Path) -> None:
    # The message being streamed was kept as one string grown by each chunk, copying it
    # whole every time: ~100 GB of copying for this 20 MB message. Kept in chunks, it is
    # written well within the bound.
    chunk, count = "x" * 2047 + " ", 10_000
    agent = ScriptedAgent({"session/new": {"sessionId": "s1"}})

    async def prompt(agent: ScriptedAgent, message: Any) -> Any:
        for _ in range(count):
            await agent.notify("session/update", {"sessionId": "s1", "update": {
                "sessionUpdate": "agent_message_chunk",
                "content": {"type": "text", "text": chunk}}})
        return {"stopReason": "end_turn"}
    agent.replies["session/prompt"] = prompt
    async with open_test_chain([Transcript(TranscriptOptions(directory=str(tmp_path)))],
                               agent) as client:
        with anyio.fail_after(30):
            sid = await client.new_session("/tmp")
            assert await client.prompt(sid, "go") == {"stopReason": "end_turn"}
    markdown = (tmp_path / f"{file_stem('s1')}.md").read_text(encoding="utf-8")
    assert f"**Agent:** {chunk * count}\n\n_Turn ended: end_turn_" in markdown



async def test_transcripts_of_more_sessions_than_stay_open_are_each_complete_and_in_order(
        tmp_path: Path) -> None:
    # Each session's files stay open between writes, but only for the last MAX_OPEN
    # sessions written: the rest are closed and opened again, appending where they were.
    from acp_conductor_proxies import transcript

    agent = ScriptedAgent()  # sessions session-1, session-2, ...

    async def prompt(agent: ScriptedAgent, message: Any) -> Any:
        sid = message.params_value()["sessionId"]
        await agent.notify("session/update", {"sessionId": sid, "update": {
            "sessionUpdate": "agent_message_chunk", "content": {"type": "text",
                                                                "text": f"to {sid}"}}})
        return {"stopReason": "end_turn"}
    agent.replies["session/prompt"] = prompt
    proxy = Transcript(TranscriptOptions(directory=str(tmp_path)))
    async with open_test_chain([proxy], agent) as client:
        with anyio.fail_after(20):
            ids = [await client.new_session("/tmp") for _ in range(transcript.MAX_OPEN + 8)]
            for turn in ("first", "second"):  # every session's files closed in between
                for sid in ids:
                    assert await client.prompt(sid, f"{turn} {sid}") == \
                        {"stopReason": "end_turn"}
            assert len(proxy._open) == transcript.MAX_OPEN
    assert proxy._open == {}  # all closed when the chain stopped
    for sid in ids:
        markdown = (tmp_path / f"{file_stem(sid)}.md").read_text(encoding="utf-8")
        assert markdown.index(f"## User\n\nfirst {sid}") < \
            markdown.index(f"**Agent:** to {sid}") < markdown.index(f"## User\n\nsecond {sid}")
        events = [json.loads(line) for line in
                  (tmp_path / f"{file_stem(sid)}.jsonl").read_text(encoding="utf-8").splitlines()]
        assert [e["type"] for e in events] == ["session", "prompt", "agent_text", "stop",
                                               "prompt", "agent_text", "stop"]


async def test_the_agents_text_of_a_turn_cut_short_by_the_end_of_the_chain_is_recorded(
        tmp_path: Path) -> None:
    # The Markdown gets the agent's text when the next event comes: at the end of a chain
    # stopped mid-turn none comes, and the last words were only in the JSONL.
    agent = ScriptedAgent({"session/new": {"sessionId": "s1"}})
    streamed = anyio.Event()

    async def prompt(agent: ScriptedAgent, message: Any) -> Any:
        await agent.notify("session/update", {"sessionId": "s1", "update": {
            "sessionUpdate": "agent_message_chunk", "content": {"type": "text",
                                                                "text": "last words"}}})
        streamed.set()
        await anyio.sleep_forever()
    agent.replies["session/prompt"] = prompt
    async with open_test_chain([Transcript(TranscriptOptions(directory=str(tmp_path)))],
                               agent) as client, anyio.create_task_group() as tg:
        with anyio.fail_after(10):
            sid = await client.new_session("/tmp")
            tg.start_soon(client.prompt, sid, "go")
            await streamed.wait()
            await anyio.wait_all_tasks_blocked()  # the update has reached the transcript
            tg.cancel_scope.cancel()
    markdown = (tmp_path / f"{file_stem('s1')}.md").read_text(encoding="utf-8")
    assert markdown.endswith("## User\n\ngo\n\n**Agent:** last words\n\n")

# --- redact ------------------------------------------------------------------------------

@pytest.mark.parametrize("replacement", [r"\g<0>", "\\", r"\1", "<$0>"])
def test_redact_uses_the_replacement_literally(replacement: str) -> None:
    proxy = Redact(RedactOptions(patterns=[r"sk-[a-z0-9]{8,}"], replacement=replacement))
    hits: dict[str, int] = {}
    assert proxy.scrub({"t": "key sk-abcdef123456 end"}, hits) == \
        {"t": f"key {replacement} end"}
    assert hits == {"pattern 1": 1}


def test_redact_warns_about_unset_and_short_env_vars_by_name_only(
        monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    monkeypatch.delenv("REDACT_UNSET", raising=False)
    monkeypatch.setenv("REDACT_SHORT", "abc")
    with caplog.at_level(logging.WARNING):
        Redact(RedactOptions(env=["REDACT_UNSET", "REDACT_SHORT"]))
    assert "env REDACT_UNSET is not set" in caplog.text
    assert "env REDACT_SHORT is shorter than 4 characters" in caplog.text
    assert "abc" not in caplog.text


async def test_redact_scrubs_permission_requests_coming_up(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("REDACT_TOKEN", "tok-123456")

    async def prompt(agent: ScriptedAgent, message: Any) -> Any:
        answer = await agent.call("session/request_permission", {
            "sessionId": "session-1",
            "toolCall": {"toolCallId": "c1", "title": "curl -H tok-123456",
                         "rawInput": {"command": ["curl", "tok-123456"]}},
            "options": [{"optionId": "ok", "name": "Allow", "kind": "allow_once"}]})
        assert answer == {"outcome": {"outcome": "selected", "optionId": "ok"}}
        return {"stopReason": "end_turn"}

    agent = ScriptedAgent({"session/prompt": prompt})
    client_replies = {"session/request_permission": {
        "outcome": {"outcome": "selected", "optionId": "ok"}}}
    async with open_test_chain([Redact(RedactOptions(env=["REDACT_TOKEN"]))], agent,
                               client=TestClient(client_replies)) as client:
        with anyio.fail_after(10):
            sid = await client.new_session("/tmp")
            await client.prompt(sid, "go")
    [asked] = client.received_params("session/request_permission")
    assert asked["toolCall"]["title"] == "curl -H [redacted]"
    assert asked["toolCall"]["rawInput"]["command"] == ["curl", "[redacted]"]


async def test_redact_scrubs_a_v2_elicitation_shown_to_the_user(
        monkeypatch: pytest.MonkeyPatch) -> None:
    # ACP v2's elicitation/create puts the agent's message (and a form, or a URL) in front of
    # the user, as a permission request does: it went up unscrubbed.
    monkeypatch.setenv("REDACT_TOKEN", "tok-123456")

    async def prompt(agent: ScriptedAgent, message: Any) -> Any:
        answer = await agent.call("elicitation/create", {
            "sessionId": "session-1", "mode": "form",
            "message": "Confirm the key tok-123456?",
            "requestedSchema": {"type": "object", "properties": {
                "key": {"type": "string", "default": "tok-123456"}}}})
        assert answer == {"action": "accept", "content": {"key": "ok"}}
        agent.after_reply("session/update", {"sessionId": "session-1", "update": {
            "sessionUpdate": "state_update", "state": "idle"}})  # a v2 turn's end
        return {}

    agent = ScriptedAgent({"session/prompt": prompt})
    client_replies = {"elicitation/create": {"action": "accept", "content": {"key": "ok"}}}
    async with open_test_chain([Redact(RedactOptions(env=["REDACT_TOKEN"]))], agent,
                               client=TestClient(client_replies)) as client:
        with anyio.fail_after(10):
            await client.initialize(2)
            sid = await client.new_session("/tmp")
            await client.prompt(sid, "go")
    [asked] = client.received_params("elicitation/create")
    assert asked["message"] == "Confirm the key [redacted]?"
    assert "tok-123456" not in json.dumps(asked)


def test_redact_scrubs_every_secret_whole_when_a_pattern_matches_inside_an_env_value(
        monkeypatch: pytest.MonkeyPatch) -> None:
    # Each rule used to run on what the one before left: a pattern inside an env secret
    # broke the value up, and the rest of the secret went through.
    monkeypatch.setenv("REDACT_DSN", "postgres://admin:sk-abcdef123456@db.internal/prod")
    proxy = Redact(RedactOptions(patterns=[r"sk-[a-z0-9]{8,}"], env=["REDACT_DSN"]))
    hits: dict[str, int] = {}
    text = "url=postgres://admin:sk-abcdef123456@db.internal/prod; again sk-zzzzzzzz9"
    assert proxy.scrub(text, hits) == "url=[redacted]; again [redacted]"
    assert hits == {"pattern 1": 2, "env REDACT_DSN": 1}


@pytest.mark.parametrize("tool_call", ["a string", 5, ["x"]])
async def test_transcript_passes_the_editors_answer_back_whatever_the_shape_of_the_request(
        tmp_path: Path, tool_call: object) -> None:
    # The transcript is a recorder: a request or an update it cannot read is forwarded and
    # answered as if it were not there, never turned into the proxy's own error.
    agent = ScriptedAgent()
    answer = {"outcome": {"outcome": "selected", "optionId": "ok"}}
    async with open_test_chain([Transcript(TranscriptOptions(directory=str(tmp_path)))],
                               agent, client=TestClient({
                                   "session/request_permission": answer})) as client:
        with anyio.fail_after(10):
            sid = await client.new_session("/tmp")
            await agent.notify("session/update", {"sessionId": sid, "update": tool_call})
            await agent.notify("session/update", {"sessionId": sid, "update": {
                "sessionUpdate": "agent_message_chunk", "content": tool_call}})
            assert await agent.call("session/request_permission", {
                "sessionId": sid, "toolCall": tool_call, "options": []}) == answer
            assert await client.prompt(sid, tool_call) is not None  # type: ignore[arg-type]
    assert len(client.received_params("session/update")) == 2


async def test_redact_scrubs_an_update_nested_deeply_and_forwards_it(
        caplog: pytest.LogCaptureFixture) -> None:
    # scrub recursed two Python frames per level: a tool call's rawInput nested 500 deep,
    # which the chain carries without redact, exhausted the stack and the update was lost.
    nested: Any = "sk-abcdef123456"
    for _ in range(500):
        nested = [nested]
    agent = ScriptedAgent()
    async with open_test_chain([Redact(RedactOptions(patterns=[r"sk-[a-z0-9]{8,}"]))],
                               agent) as client:
        with anyio.fail_after(10):
            sid = await client.new_session("/tmp")
            await agent.notify("session/update", {"sessionId": sid, "update": {
                "sessionUpdate": "tool_call", "toolCallId": "c1", "title": "t",
                "rawInput": {"tree": nested}}})
            await client.prompt(sid, "go")
    [update] = client.updates(sid)
    inner = update["rawInput"]["tree"]
    for _ in range(500):
        [inner] = inner
    assert inner == "[redacted]"
    assert "failed" not in caplog.text


def test_redact_scrubs_an_env_secret_whose_value_ends_in_a_newline(
        monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    # A secret loaded from a file (a Kubernetes secret, `--env-file`) often keeps the file's
    # final newline; the token as it appears in text has none, and went through unscrubbed.
    monkeypatch.setenv("REDACT_FILE_TOKEN", "tok-123456\n")
    monkeypatch.setenv("REDACT_BLANK", " \n\t ")
    with caplog.at_level(logging.WARNING):
        proxy = Redact(RedactOptions(env=["REDACT_FILE_TOKEN", "REDACT_BLANK"]))
    hits: dict[str, int] = {}
    assert proxy.scrub("use tok-123456 now", hits) == "use [redacted] now"
    assert hits == {"env REDACT_FILE_TOKEN": 1}
    assert "env REDACT_BLANK is shorter than 4 characters" in caplog.text
    assert proxy.scrub("a \n\t b", {}) == "a \n\t b"  # whitespace alone is no secret


async def test_redact_scrubs_the_agents_error_answer_to_a_prompt(
        monkeypatch: pytest.MonkeyPatch) -> None:
    # The editor shows a failed turn's error as it shows the agent's text: an agent that
    # echoed a secret in its error put it on the user's screen past redact.
    monkeypatch.setenv("REDACT_TOKEN", "tok-123456")

    async def prompt(agent: ScriptedAgent, message: Any) -> Any:
        raise RpcError(-32000, "upstream refused key tok-123456",
                       {"request": {"headers": ["Authorization: Bearer tok-123456"]}})

    agent = ScriptedAgent({"session/prompt": prompt})
    async with open_test_chain([Redact(RedactOptions(env=["REDACT_TOKEN"]))], agent) as client:
        with anyio.fail_after(10):
            sid = await client.new_session("/tmp")
            with pytest.raises(RpcError) as failed:
                await client.prompt(sid, "go")
    assert failed.value.code == -32000
    assert failed.value.message == "upstream refused key [redacted]"
    assert failed.value.data == {"request": {"headers": ["Authorization: Bearer [redacted]"]}}


async def test_redact_scrubs_a_secret_spelt_with_json_escapes() -> None:
    # What the editor shows is the decoded string: `\u0073k-...` is `sk-...`.
    from msgspec import Raw

    from conductor.jsonrpc.message import Notification

    agent = ScriptedAgent()
    async with open_test_chain([Redact(RedactOptions(patterns=[r"sk-[a-z0-9]{8,}"]))],
                               agent, transport="pipes") as client:
        with anyio.fail_after(10):
            sid = await client.new_session("/tmp")
            await agent._ep.send(Notification(method="session/update", params=Raw(
                b'{"sessionId":"' + sid.encode() + b'","update":{"sessionUpdate":'
                b'"agent_message_chunk","content":{"type":"text",'
                b'"text":"key \\u0073k-abc\\u0064ef123456"}}}')))
            await client.prompt(sid, "go")
    assert client.agent_text() == "key [redacted]"


async def test_a_v2_agent_message_is_recorded_and_replaces_the_chunks_of_its_message(
        tmp_path: Path) -> None:
    # ACP v2: `agent_message` is an upsert; its `content` replaces what the chunks of the
    # same messageId built. An agent that sends only whole messages must not leave the
    # transcript without its words.
    def text(t: str) -> dict[str, str]:
        return {"type": "text", "text": t}

    updates = [{"sessionUpdate": "agent_message_chunk", "messageId": "m1", "content": text("hel")},
               {"sessionUpdate": "agent_message", "messageId": "m1",
                "content": [text("hello world")]},
               {"sessionUpdate": "agent_message", "messageId": "m2", "content": [text("bye")]},
               {"sessionUpdate": "agent_message", "messageId": "m2", "_meta": {"x": 1}}]
    agent = ScriptedAgent({"session/new": {"sessionId": "s2"}})

    async def prompt(agent: ScriptedAgent, message: Any) -> Any:
        for update in updates:
            await agent.notify("session/update", {"sessionId": "s2", "update": update})
        return {"stopReason": "end_turn"}
    agent.replies["session/prompt"] = prompt
    async with open_test_chain([Transcript(TranscriptOptions(directory=str(tmp_path)))],
                               agent) as client:
        with anyio.fail_after(10):
            await client.prompt(await client.new_session("/tmp"), "go")
    stem = file_stem("s2")
    markdown = (tmp_path / f"{stem}.md").read_text(encoding="utf-8")
    assert "**Agent:** hello world\n\n**Agent:** bye\n\n_Turn ended: end_turn_" in markdown
    assert "hel\n" not in markdown and "helhello" not in markdown
    events = [json.loads(line) for line in (tmp_path / f"{stem}.jsonl").read_text().splitlines()]
    assert [(e["type"], e.get("text")) for e in events if e["type"].startswith("agent")] == [
        ("agent_text", "hel"), ("agent_message", "hello world"), ("agent_message", "bye")]
