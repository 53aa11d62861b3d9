"""`run` for scripts: several turns in one session, each reported, the run stopping at the
first that does not end with end_turn; the session closed at the end; the prompt file."""

from __future__ import annotations

import io
import json
import sys
import textwrap
from typing import TYPE_CHECKING, Any

import pytest

from conductor.cli.run import read_prompt_file
from conductor.config import load_chain
from conductor.editor.render import PlainEvents, QuietEvents
from conductor.editor.turn import RunExit, TurnOptions, run_turns
from conductor.errors import ConfigError
from conductor.jsonrpc.codes import ErrorCode
from tests.conftest import BIN

if TYPE_CHECKING:
    from pathlib import Path

    from conductor.config import ChainConfig


class Recorded:
    """A renderer that keeps every record (RunEvents)."""

    def __init__(self) -> None:
        self.records: list[dict[str, Any]] = []

    def session(self, record: dict[str, Any]) -> None:
        self.records.append(record)

    def update(self, session_id: str | None, update: dict[str, Any]) -> None:
        self.records.append({"type": "update", "sessionId": session_id, "update": update})

    def decision(self, record: dict[str, Any]) -> None:
        self.records.append(record)

    def notice(self, text: str) -> None:
        self.records.append({"type": "notice", "message": text})

    def prompting(self, number: int) -> None:
        pass

    def turn(self, record: dict[str, Any]) -> None:
        self.records.append(record)

    def result(self, record: dict[str, Any]) -> None:
        self.records.append(record)

    async def ask_permission(self, tool_call: dict[str, Any],
                             options: list[dict[str, Any]]) -> str | None:
        return None

    def of(self, kind: str) -> list[dict[str, Any]]:
        return [r for r in self.records if r["type"] == kind]

    def said(self) -> str:
        return "".join(r["update"]["content"]["text"] for r in self.of("update")
                       if r["update"]["sessionUpdate"] == "agent_message_chunk")


def demo_chain(tmp_path: Path, proxy: str = "") -> ChainConfig:
    path = tmp_path / "chain.toml"
    path.write_text(f"{proxy}\n[agent]\n"
                    'command = ["${PYTHON}", "-m", "conductor.demo_agent"]\n', encoding="utf-8")
    return load_chain(str(path))


async def run(config: ChainConfig, tmp_path: Path, *prompts: str) -> tuple[int, Recorded]:
    events = Recorded()
    code = await run_turns(config, TurnOptions(prompts=list(prompts), cwd=tmp_path,
                                               handle_signals=False), events)
    return code, events


async def test_each_prompt_is_a_turn_of_the_same_session_reported_in_order(
        tmp_path: Path) -> None:
    code, events = await run(demo_chain(tmp_path), tmp_path, "one", "plan two")
    assert code == RunExit.END_TURN
    assert [s["sessionId"] for s in events.of("session")] == ["demo-session-1"]
    turns = events.of("turn")
    assert [(t["turn"], t["of"], t["stopReason"], t["exitCode"], t["exitReason"])
            for t in turns] == [(1, 2, "end_turn", 0, "end_turn"), (2, 2, "end_turn", 0,
                                                                    "end_turn")]
    assert turns[1]["usage"] is None and turns[1]["durationMs"] >= 0
    result = events.records[-1]
    assert result["type"] == "result" and result["exitCode"] == 0
    assert result["prompts"] == 2
    assert result["turns"] == [{k: v for k, v in t.items() if k != "type"} for t in turns]
    assert events.said() == ("Hello from the demo agent. You said: one "
                             "Hello from the demo agent. You said: plan two ")


async def test_the_first_turn_not_ending_with_end_turn_stops_the_run_with_its_code(
        tmp_path: Path) -> None:
    code, events = await run(demo_chain(tmp_path), tmp_path, "one", "stop:refusal two",
                             "three")
    assert code == RunExit.REFUSAL
    assert [t["exitReason"] for t in events.of("turn")] == ["end_turn", "refusal"]
    assert "three" not in events.said()  # never sent
    result = events.records[-1]
    assert (result["exitCode"], result["stopReason"], result["prompts"]) == (5, "refusal", 3)
    assert len(result["turns"]) == 2


async def test_a_turn_answered_with_an_error_is_reported_and_ends_the_run_with_exit_1(
        tmp_path: Path) -> None:
    (tmp_path / "second.py").write_text(textwrap.dedent("""
        from conductor.plugins import Proxy, on

        class FailsSecond(Proxy):
            prompts = 0

            @on("session/prompt")
            async def prompt(self, ctx, message):
                self.prompts += 1
                if self.prompts == 2:
                    raise ValueError("second prompt")
                return await ctx.forward()
        """), encoding="utf-8")
    config = demo_chain(tmp_path, f'[[proxy]]\nplugin = "{tmp_path / "second.py"}:FailsSecond"')
    code, events = await run(config, tmp_path, "one", "two", "three")
    assert code == RunExit.FAILED
    failed = events.of("turn")[-1]
    assert (failed["turn"], failed["exitReason"], failed["stopReason"]) == (2, "failed", None)
    assert "ValueError: second prompt" in failed["error"]["message"]
    assert events.records[-1]["error"]["code"] == failed["error"]["code"]


@pytest.mark.parametrize(("answer", "shown"), [("[1, 2]", "[1,2]"), ('"done"', '"done"')])
async def test_a_prompt_answered_with_something_not_an_object_fails_the_turn_saying_so(
        tmp_path: Path, answer: str, shown: str) -> None:
    # An agent answering a list or a string: `run` used to die with an internal error,
    # or stop "failed" without a word why.
    code, events = await run(answering_with(tmp_path, answer), tmp_path, "one", "two")
    assert code == RunExit.FAILED
    (failed,) = events.of("turn")
    assert failed["exitReason"] == "failed"
    assert failed["error"]["message"] == (f"session/prompt was answered with {shown}, "
                                          "not an object with a stopReason")
    assert events.records[-1]["error"] == failed["error"]


async def test_a_prompt_a_proxy_answers_with_none_fails_the_turn_naming_the_proxy(
        tmp_path: Path) -> None:
    # A forgotten `return`: the proxy's host answers the failure, naming it, not `null`.
    (tmp_path / "odd.py").write_text(textwrap.dedent("""
        from conductor.plugins import Proxy, on

        class Odd(Proxy):
            @on("session/prompt")
            async def prompt(self, ctx, message):
                return None
        """), encoding="utf-8")
    config = demo_chain(tmp_path, f'[[proxy]]\nplugin = "{tmp_path / "odd.py"}:Odd"')
    code, events = await run(config, tmp_path, "one", "two")
    assert code == RunExit.FAILED
    (failed,) = events.of("turn")
    assert failed["exitReason"] == "failed"
    assert failed["error"]["code"] == ErrorCode.HANDLER_FAILED
    assert "odd failed handling session/prompt: TypeError: Odd.prompt answered " \
        "session/prompt with None" in failed["error"]["message"]


async def test_run_closes_its_session_at_the_end_and_proxies_see_it_closed(
        tmp_path: Path) -> None:
    log = tmp_path / "hooks.log"
    config = demo_chain(tmp_path, f'[[proxy]]\nplugin = "{BIN / "lifecycle_proxy.py"}:Lifecycle"'
                                  f'\noptions = {{ path = "{log}" }}')
    code, _ = await run(config, tmp_path, "one", "two")
    assert code == 0
    # The demo agent advertises sessionCapabilities.close: run ends the session itself.
    assert log.read_text(encoding="utf-8").splitlines() == [
        "chain_started", "opened demo-session-1", "closed demo-session-1: closed",
        "chain_stopped"]


def test_a_prompt_file_holds_prompts_between_lines_of_dashes() -> None:
    text = "first line\nsecond line\n---\n\nsecond prompt\n---  \n---\nthird\n"
    assert read_prompt_file(text, "p.txt") == ["first line\nsecond line", "second prompt",
                                               "third"]


def test_a_jsonl_prompt_file_holds_strings_or_objects_and_refuses_anything_else() -> None:
    good = '"one"\n\n{"prompt": "two\\n---\\nstill two"}\n'
    assert read_prompt_file(good, "p.jsonl") == ["one", "two\n---\nstill two"]
    with pytest.raises(ConfigError, match="line 2 is not a prompt"):
        read_prompt_file('"one"\n{"text": "x"}\n', "p.jsonl")
    with pytest.raises(ConfigError, match="line 1 is not JSON"):
        read_prompt_file("one\n", "p.jsonl")


def answering_with(tmp_path: Path, answer: str, method: str = "session/prompt"
                   ) -> ChainConfig:
    """A chain whose agent (the demo agent) answers every `method` request with `answer`
    (JSON text). The agent, not a plugin: a plugin's answer that is not an object is
    refused at the plugin already."""
    path = tmp_path / "chain.toml"
    argv = [sys.executable, str(BIN / "answering_agent.py"), method, answer]
    path.write_text(f"[agent]\ncommand = {json.dumps(argv)}\n", encoding="utf-8")
    return load_chain(str(path))


async def test_an_agent_that_wants_the_user_signed_in_is_reported_with_what_to_do(
        tmp_path: Path) -> None:
    # It said only the agent's "Authentication required", and nothing of what to do.
    (tmp_path / "login.py").write_text(textwrap.dedent("""
        from conductor import RpcError
        from conductor.plugins import Proxy, on

        class Login(Proxy):
            @on("initialize")
            async def initialize(self, ctx, message):
                answer = await ctx.forward()
                return {**answer.result_value(), "authMethods": [{"id": "web", "name": "Browser",
                                                   "description": "run `agent login`."}]}

            @on("session/new")
            async def new(self, ctx, message):
                raise RpcError(-32000, "Authentication required")
        """), encoding="utf-8")
    config = demo_chain(tmp_path, f'[[proxy]]\nplugin = "{tmp_path / "login.py"}:Login"')
    code, events = await run(config, tmp_path, "one")
    assert code == RunExit.FAILED
    error = events.records[-1]["error"]
    assert error["code"] == ErrorCode.AUTH_REQUIRED
    assert error["message"] == (
        "the agent needs you to sign in first (it answered session/new: Authentication "
        "required); it offers: Browser: run `agent login`. Sign in with the agent's own "
        "command or from an editor once, then run again")


async def test_a_generic_server_error_is_not_read_as_a_sign_in_request(tmp_path: Path) -> None:
    # -32000 is also JSON-RPC's generic server error: without a sign-in offered or named,
    # the agent's own words stand.
    (tmp_path / "busy.py").write_text(textwrap.dedent("""
        from conductor import RpcError
        from conductor.plugins import Proxy, on

        class Busy(Proxy):
            @on("session/new")
            async def new(self, ctx, message):
                raise RpcError(-32000, "database is locked")
        """), encoding="utf-8")
    config = demo_chain(tmp_path, f'[[proxy]]\nplugin = "{tmp_path / "busy.py"}:Busy"')
    code, events = await run(config, tmp_path, "one")
    assert code == RunExit.FAILED
    assert events.records[-1]["error"]["message"] == "database is locked"


@pytest.mark.parametrize("answer", ['"done"', "[1, 2]", "null", "7"])
async def test_a_prompt_answered_with_no_object_fails_the_turn_with_exit_1_and_reports_it(
        tmp_path: Path, answer: str) -> None:
    code, events = await run(answering_with(tmp_path, answer), tmp_path, "one", "two")
    assert code == RunExit.FAILED
    [turn] = events.of("turn")
    assert (turn["turn"], turn["exitReason"], turn["stopReason"]) == (1, "failed", None)
    assert "session/prompt" in turn["error"]["message"]
    result = events.records[-1]
    assert result["type"] == "result" and result["exitCode"] == 1
    assert result["turns"] == [{k: v for k, v in turn.items() if k != "type"}]


@pytest.mark.parametrize("method", ["initialize", "session/new"])
async def test_a_setup_request_answered_with_no_object_ends_the_run_with_exit_1_and_a_result(
        tmp_path: Path, method: str) -> None:
    code, events = await run(answering_with(tmp_path, '"x"', method), tmp_path, "one")
    assert code == RunExit.FAILED
    result = events.records[-1]
    assert result["type"] == "result" and result["exitCode"] == 1
    assert method in result["error"]["message"]
    assert result["turns"] == []


async def test_a_turn_given_up_on_after_its_cancel_went_unanswered_is_still_reported(
        tmp_path: Path) -> None:
    # The plugin swallows session/cancel: the agent never learns of it and never answers.
    (tmp_path / "deaf.py").write_text(textwrap.dedent("""
        from conductor.plugins import Proxy, on

        class Deaf(Proxy):
            @on("session/cancel")
            async def cancel(self, ctx, message):
                return None
        """), encoding="utf-8")
    config = demo_chain(tmp_path, "[conductor]\nshutdown_grace = 0.5\n"
                                  f'[[proxy]]\nplugin = "{tmp_path / "deaf.py"}:Deaf"')
    events = Recorded()
    code = await run_turns(config, TurnOptions(prompts=["hang", "two"], cwd=tmp_path,
                                               timeout=0.5, cancel_grace=0.1,
                                               handle_signals=False), events)
    assert code == RunExit.TIMEOUT
    assert any("did not answer the cancel" in n["message"] for n in events.of("notice"))
    [turn] = events.of("turn")
    assert (turn["turn"], turn["of"], turn["exitReason"], turn["stopReason"]) == (
        1, 2, "timeout", None)
    result = events.records[-1]
    assert result["turns"] == [{k: v for k, v in turn.items() if k != "type"}]


async def test_quiet_prints_only_the_turns_answer_not_the_history_a_loaded_session_replays(
        tmp_path: Path) -> None:
    # session/load replays the conversation as session/updates (agent_message_chunk
    # included) before the turn: they were counted as the turn's answer, so
    # `run --session-id X --format quiet` printed the old conversation too.
    (tmp_path / "replay.py").write_text(textwrap.dedent("""
        from conductor.plugins import Proxy, on

        class Replay(Proxy):
            @on("session/load")
            async def load(self, ctx, message):
                sid = message.params_value()["sessionId"]
                await ctx.notify("session/update", {"sessionId": sid, "update": {
                    "sessionUpdate": "agent_message_chunk",
                    "content": {"type": "text", "text": "OLD ANSWER\\n"}}},
                    to="predecessor")
                return await ctx.forward()
        """), encoding="utf-8")
    config = demo_chain(tmp_path, f'[[proxy]]\nplugin = "{tmp_path / "replay.py"}:Replay"')
    out, err = io.StringIO(), io.StringIO()
    code = await run_turns(config, TurnOptions(prompts=["hello"], cwd=tmp_path,
                                               session_id="old-7", handle_signals=False),
                           QuietEvents(out, err))
    assert code == RunExit.END_TURN, err.getvalue()
    _, fresh = await run(demo_chain(tmp_path), tmp_path, "hello")
    assert out.getvalue() == fresh.said().rstrip("\n") + "\n"
    assert "OLD ANSWER" not in out.getvalue()


async def test_a_result_line_has_every_documented_field_even_when_no_session_was_opened(
        tmp_path: Path) -> None:
    # docs/run.md lists `sessionId` among the result's fields; a run that failed before
    # session/new answered left the key out rather than null.
    code, events = await run(answering_with(tmp_path, '"x"', "initialize"), tmp_path, "one")
    assert code == RunExit.FAILED
    result = events.records[-1]
    assert {"sessionId", "stopReason", "usage", "exitCode", "exitReason", "cancelledBy",
            "violations", "dropped", "durationMs", "prompts", "turns"} <= result.keys()
    assert result["sessionId"] is None


async def test_an_agent_answering_a_protocol_version_run_does_not_speak_ends_the_run_saying_so(
        tmp_path: Path) -> None:
    # run asks for v1; an agent that answers 2 speaks another protocol (v2: no stopReason
    # in the prompt's answer, no fs/terminal methods). ACP says the client should then
    # disconnect; run went on, and the turn "failed" for an unknown stop reason, or worse.
    config = answering_with(tmp_path, '{"protocolVersion": 2, "agentCapabilities": {}}',
                            "initialize")
    code, events = await run(config, tmp_path, "one")
    assert code == RunExit.FAILED
    result = events.records[-1]
    assert result["turns"] == [] and events.of("session") == []
    assert "protocolVersion 2" in result["error"]["message"]


@pytest.mark.parametrize("info", ['"demo 1.0"', "[1]", "7"])
async def test_an_agent_info_that_is_not_an_object_is_shown_not_a_crash_of_the_plain_view(
        tmp_path: Path, info: str) -> None:
    # The plain view read agentInfo with .get: an agent sending a string there crashed the
    # run (internal error, no result line, the turn never sent) in every CI log.
    config = answering_with(
        tmp_path, f'{{"protocolVersion": 1, "agentCapabilities": {{}}, "agentInfo": {info}}}',
        "initialize")
    out, err = io.StringIO(), io.StringIO()
    code = await run_turns(config, TurnOptions(prompts=["hello"], cwd=tmp_path,
                                               handle_signals=False), PlainEvents(out, err))
    assert code == RunExit.END_TURN, err.getvalue()
    assert "[session] demo-session-1 (new)" in err.getvalue()
    assert "You said: hello" in out.getvalue()


def test_the_plain_and_live_views_show_a_malformed_plan_and_tool_call_without_failing() -> None:
    # Plan entries that are not objects, or a status that is a list, raised in the view:
    # the rest of the update (and in the live view, every later refresh) was lost.
    from rich.console import Console

    from conductor.editor.live import RichEvents

    updates: list[dict[str, Any]] = [
        {"sessionUpdate": "plan", "entries": ["step one", {"content": "two", "status": [1]},
                                             {"content": "three", "status": "completed"}]},
        {"sessionUpdate": "tool_call", "toolCallId": "t1", "title": "grep", "kind": ["x"],
         "status": {"a": 1}}]
    out, err = io.StringIO(), io.StringIO()
    plain = PlainEvents(out, err)
    for update in updates:
        plain.update("s", update)
    assert err.getvalue().splitlines() == ["[plan]", "  [ ] two", "  [x] three",
                                           "[tool] other: grep (pending)"]
    rich = RichEvents(Console(file=io.StringIO()), Console(file=io.StringIO()))
    for update in updates:
        rich.update("s", update)
    rich.live.stop()


@pytest.mark.parametrize(("error", "shown"), [
    # Claude Code without a login: what went wrong is only in `data.details`
    ({"code": -32603, "message": "Internal error",
      "data": {"details": "Query closed before response received"}},
     "Internal error (Query closed before response received)"),
    ({"code": -32602, "message": "Invalid params", "data": "cwd must be absolute"},
     "Invalid params (cwd must be absolute)"),
    ({"code": -33001, "message": "agent: exited with status 1", "data": {"component": "agent"}},
     "agent: exited with status 1"),
    ({"code": -32603, "message": "x", "data": {"details": "d" * 400}},
     "x (" + "d" * 300 + "...)"),
])
def test_a_failed_runs_error_line_shows_the_detail_the_agent_gave_in_its_data(
        error: dict[str, Any], shown: str) -> None:
    record = {"type": "result", "error": error, "exitCode": 1, "exitReason": "failed"}
    out, err = io.StringIO(), io.StringIO()
    PlainEvents(out, err).result(record)
    assert f"[error] {shown}\n" in err.getvalue()
    out, err = io.StringIO(), io.StringIO()
    QuietEvents(out, err).result(record)
    assert err.getvalue() == f"acp-conductor: run: failed (exit 1): {shown}\n"
