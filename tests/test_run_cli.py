"""`acp-conductor run` against real agent processes: output, --json, policies, exit codes."""

from __future__ import annotations

import json
import os
import pty
import selectors
import signal
import subprocess
import sys
import textwrap
import time
from typing import TYPE_CHECKING

import pytest

from tests.conftest import BIN, REPO, child_env, conductor_argv
from tests.in_process import conductor

if TYPE_CHECKING:
    from pathlib import Path

DEMO = str(REPO / "chains" / "demo.toml")


def run(*args: str | Path, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    """`acp-conductor ARGS` in this process (tests/in_process.py): for what a command says
    and exits with. What only a process shows is run as one (`process`, and below)."""
    return conductor(*args, stdin=stdin)


def process(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(conductor_argv(*args), capture_output=True, text=True,
                          env=child_env(), timeout=30, cwd=REPO)


def events(stdout: str) -> list[dict]:
    return [json.loads(line) for line in stdout.splitlines()]


@pytest.fixture
def sdk_chain(tmp_path: Path) -> str:
    path = tmp_path / "sdk.toml"
    path.write_text(f'[agent]\nname = "sdk"\ncommand = ["{sys.executable}", '
                    f'"{BIN / "sdk_agent.py"}"]\n', encoding="utf-8")
    return str(path)


def test_plain_run_streams_only_the_agents_text_to_stdout_without_escape_codes() -> None:
    result = process("run", "--chain", DEMO, "hello")
    assert result.returncode == 0, result.stderr
    assert result.stdout == "Hello from the demo agent. You said: hello \n"
    assert "\x1b" not in result.stdout + result.stderr
    assert "[stop] end_turn (exit 0)" in result.stderr


def test_prompt_dash_reads_the_prompt_from_stdin() -> None:
    result = run("run", "--chain", DEMO, "-", stdin="from stdin")
    assert result.returncode == 0, result.stderr
    assert "You said: from stdin" in result.stdout


def test_json_mode_prints_one_event_per_line_ending_with_the_result() -> None:
    result = run("run", "--chain", DEMO, "plan please", "--json")
    assert result.returncode == 0, result.stderr
    lines = events(result.stdout)
    assert lines[0]["type"] == "session"
    assert lines[0]["sessionId"] == "demo-session-1"
    assert lines[0]["how"] == "new"
    assert {e["type"] for e in lines} <= {"session", "update", "permission", "access",
                                          "notice", "result"}
    kinds = [e["update"]["sessionUpdate"] for e in lines if e["type"] == "update"]
    assert kinds[:3] == ["agent_thought_chunk", "plan", "usage_update"]
    text = "".join(e["update"]["content"]["text"] for e in lines
                   if e["type"] == "update"
                   and e["update"]["sessionUpdate"] == "agent_message_chunk")
    assert text == "Hello from the demo agent. You said: plan please "
    final = lines[-1]
    assert final["type"] == "result"
    assert final["stopReason"] == "end_turn"
    assert final["exitCode"] == 0
    assert final["usage"] == {"used": 42, "size": 1000,
                              "cost": {"amount": 0.01, "currency": "USD"}}
    assert set(final) >= {"sessionId", "exitReason", "cancelledBy", "violations", "durationMs"}


@pytest.mark.parametrize(("approve", "code", "option"), [
    ("all", 0, "allow"), ("none", 5, "reject"), ("reads", 5, "reject")])
def test_permission_policy_answers_the_demo_agents_edit_request(approve: str, code: int,
                                                                option: str) -> None:
    result = run("run", "--chain", DEMO, "permission", "--json", "--approve", approve)
    assert result.returncode == code, result.stderr
    decisions = [e for e in events(result.stdout) if e["type"] == "permission"]
    assert len(decisions) == 1
    assert decisions[0]["optionId"] == option
    assert decisions[0]["policy"] == approve
    assert decisions[0]["toolCall"]["kind"] == "edit"


def test_approve_fail_cancels_the_turn_and_exits_8() -> None:
    result = run("run", "--chain", DEMO, "permission", "--json", "--approve", "fail")
    assert result.returncode == 8, result.stderr
    lines = events(result.stdout)
    assert [e["outcome"] for e in lines if e["type"] == "permission"] == ["cancelled"]
    final = lines[-1]
    assert final["cancelledBy"] == "policy"
    assert final["stopReason"] == "cancelled"
    assert final["violations"][0]["op"] == "permission"


def test_sdk_agent_streams_thoughts_and_text_through_run(sdk_chain: str) -> None:
    result = run("run", "--chain", sdk_chain, "hi")
    assert result.returncode == 0, result.stderr
    assert result.stdout == "SDK agent says hi \n"
    assert "[thought] pondering" in result.stderr


def test_sdk_agent_permission_is_answered_by_policy(sdk_chain: str) -> None:
    allowed = run("run", "--chain", sdk_chain, "permission", "--approve", "all")
    assert allowed.returncode == 0, allowed.stderr
    assert "[permission] Delete things: yes" in allowed.stderr
    denied = run("run", "--chain", sdk_chain, "permission", "--approve", "reads")
    assert denied.returncode == 5, denied.stderr  # a delete is not a read


@pytest.mark.parametrize(("prompt", "code"), [
    ("stop:max_tokens", 6), ("stop:max_turn_requests", 6), ("stop:cancelled", 7),
    ("stop:something_new", 1)])
def test_stop_reasons_map_to_their_exit_codes(prompt: str, code: int) -> None:
    result = run("run", "--chain", DEMO, prompt, "--json")
    assert result.returncode == code, result.stderr
    assert events(result.stdout)[-1]["exitCode"] == code


def test_a_failing_agent_exits_3_and_names_it(tmp_path: Path) -> None:
    chain = tmp_path / "bad.toml"
    chain.write_text(f'[agent]\nname = "crashy"\ncommand = ["{sys.executable}", "-c", '
                     '"import sys; sys.stderr.write(\'boom happened\\\\n\'); sys.exit(7)"]\n',
                     encoding="utf-8")
    result = run("run", "--chain", chain, "hi", "--json")
    assert result.returncode == 3, result.stderr
    final = events(result.stdout)[-1]
    assert final["error"]["data"]["component"] == "crashy"
    assert "boom happened" in result.stderr


def test_a_bad_chain_file_exits_2_with_the_key(tmp_path: Path) -> None:
    chain = tmp_path / "typo.toml"
    chain.write_text('[agent]\ncommand = "x"\ncomand = "y"\n', encoding="utf-8")
    result = run("run", "--chain", chain, "hi")
    assert result.returncode == 2
    assert "comand" in result.stderr
    assert result.stdout == ""


def test_timeout_cancels_the_turn_and_exits_124() -> None:
    # --timeout covers set-up too: long enough that a loaded machine still sends the prompt.
    result = run("run", "--chain", DEMO, "hang", "--json", "--timeout", "2")
    assert result.returncode == 124, result.stderr
    lines = events(result.stdout)
    assert lines[-1]["cancelledBy"] == "timeout"
    assert lines[-1]["stopReason"] == "cancelled"  # the agent answered the cancel
    assert any(e["type"] == "notice" for e in lines)


def test_ctrl_c_cancels_the_turn_and_exits_130() -> None:
    proc = subprocess.Popen(conductor_argv("run", "--chain", DEMO, "hang", "--json"),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=child_env(),
                            cwd=REPO)
    try:
        lines = _read_lines_until(proc, lambda e: e.get("type") == "update", 20)
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=20)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 130, err
    final = json.loads(out.decode().splitlines()[-1])
    assert final["cancelledBy"] == "interrupt"
    assert final["stopReason"] == "cancelled"
    assert lines


def _read_lines_until(proc: subprocess.Popen[bytes], done, timeout: float) -> list[dict]:
    assert proc.stdout is not None
    sel = selectors.DefaultSelector()
    sel.register(proc.stdout, selectors.EVENT_READ)
    deadline = time.monotonic() + timeout
    buffer, seen = b"", []
    while time.monotonic() < deadline:
        if not sel.select(deadline - time.monotonic()):
            break
        chunk = os.read(proc.stdout.fileno(), 65536)
        if not chunk:
            break
        buffer += chunk
        *lines, buffer = buffer.split(b"\n")
        for line in lines:
            seen.append(json.loads(line))
            if done(seen[-1]):
                return seen
    raise AssertionError(f"not seen in {timeout}s: {seen}")


def test_fs_reads_inside_cwd_work_and_outside_are_refused(tmp_path: Path) -> None:
    (tmp_path / "notes.txt").write_text("inside text", encoding="utf-8")
    outside = tmp_path.parent / f"{tmp_path.name}-outside.txt"
    outside.write_text("outside text", encoding="utf-8")
    escape = tmp_path / "link"
    escape.symlink_to(outside)
    prompt = f"read:{tmp_path / 'notes.txt'} read:{outside} read:{escape}"
    result = run("run", "--chain", DEMO, prompt, "--cwd", str(tmp_path))
    assert result.returncode == 8, result.stderr
    assert "Read: inside text" in result.stdout
    assert "outside text" not in result.stdout
    assert result.stdout.count("is outside the run's --cwd") == 2
    assert result.stderr.count("[refused] read") == 2


def test_writes_need_allow_write_and_stay_inside_cwd(tmp_path: Path) -> None:
    target = tmp_path / "sub" / "out.txt"
    refused = run("run", "--chain", DEMO, f"writefile:{target}", "--cwd", str(tmp_path),
                  "--approve", "all", "--json")
    assert refused.returncode == 8
    assert not target.exists()
    access = [e for e in events(refused.stdout) if e["type"] == "access"]
    assert access[0]["allowed"] is False
    assert "--allow-write" in access[0]["reason"]

    allowed = run("run", "--chain", DEMO, f"writefile:{target}", "--cwd", str(tmp_path),
                  "--approve", "all", "--allow-write")
    assert allowed.returncode == 0, allowed.stderr
    assert target.read_text(encoding="utf-8") == "written by the demo agent\n"

    outside = tmp_path.parent / f"{tmp_path.name}-w.txt"
    escaped = run("run", "--chain", DEMO, f"writefile:{outside}", "--cwd", str(tmp_path),
                  "--approve", "all", "--allow-write")
    assert escaped.returncode == 8
    assert not outside.exists()


def test_terminal_is_refused_unless_allowed_and_then_runs_a_real_process(tmp_path: Path) -> None:
    refused = run("run", "--chain", DEMO, "terminal:echo_from_shell", "--cwd", str(tmp_path))
    assert refused.returncode == 8
    assert "needs --allow-terminal" in refused.stdout
    allowed = run("run", "--chain", DEMO, "terminal:echo_from_shell", "--cwd", str(tmp_path),
                  "--allow-terminal")
    assert allowed.returncode == 0, allowed.stderr
    assert "Ran: 'from shell\\n' exit 0" in allowed.stdout


def test_session_id_loads_the_session_when_the_agent_can() -> None:
    result = run("run", "--chain", DEMO, "again", "--session-id", "old-7", "--json")
    assert result.returncode == 0, result.stderr
    lines = events(result.stdout)
    assert lines[0]["how"] == "load"
    assert lines[0]["sessionId"] == "old-7"
    assert lines[-1]["sessionId"] == "old-7"


def test_session_id_is_a_usage_error_when_the_agent_cannot_reopen(tmp_path: Path) -> None:
    # The scripted agent offers neither loadSession nor resume (nor does the SDK agent, but
    # importing the SDK costs it ~0.5 s of CPU for nothing this test reads).
    chain = tmp_path / "scripted.toml"
    chain.write_text(f'[agent]\ncommand = ["{sys.executable}", "{BIN / "scripted_agent.py"}"]\n',
                     encoding="utf-8")
    result = run("run", "--chain", chain, "again", "--session-id", "old-7")
    assert result.returncode == 2
    assert "cannot reopen session" in result.stderr


def test_on_a_terminal_run_renders_live_with_rich() -> None:
    master, slave = pty.openpty()
    proc = subprocess.Popen(conductor_argv("run", "--chain", DEMO, "plan permission",
                                           "--approve", "all"),
                            stdin=subprocess.DEVNULL, stdout=slave, stderr=slave,
                            env=child_env(TERM="xterm-256color", COLUMNS="100"), cwd=REPO)
    os.close(slave)
    out = b""
    try:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            sel = selectors.DefaultSelector()
            sel.register(master, selectors.EVENT_READ)
            if not sel.select(1):
                if proc.poll() is not None:
                    break
                continue
            try:
                chunk = os.read(master, 65536)
            except OSError:  # EIO: the child closed the terminal
                break
            if not chunk:
                break
            out += chunk
        proc.wait(timeout=10)
    finally:
        os.close(master)
        if proc.poll() is None:
            proc.kill()
    text = out.decode("utf-8", "replace")
    assert proc.returncode == 0, text
    assert "\x1b[" in text
    assert "Hello from the demo agent." in text
    assert "Write notes.txt" in text
    assert "Answer it" in text
    assert "end_turn" in text


@pytest.fixture
def mute_chain(tmp_path: Path) -> str:
    path = tmp_path / "mute.toml"
    path.write_text('[agent]\nname = "mute"\ncommand = ["sh", "-c", "cat >/dev/null"]\n',
                    encoding="utf-8")
    return str(path)


def test_timeout_covers_setup_and_names_the_request_a_mute_agent_never_answered(
        mute_chain: str) -> None:
    # Once run gives up, the conductor gives the initialize still in flight the chain's
    # shutdown_grace (3 s by default) to be answered: the mute agent never will.
    with open(mute_chain, "r+", encoding="utf-8") as f:
        chain = f.read()
        f.seek(0)
        f.write("[conductor]\nshutdown_grace = 0.2\n\n" + chain)
    result = run("run", "--chain", mute_chain, "hi", "--json", "--timeout", "0.5")
    assert result.returncode == 124, result.stderr
    lines = events(result.stdout)
    assert any("never answered initialize" in e.get("message", "") for e in lines)
    assert lines[-1]["type"] == "result"
    assert lines[-1]["cancelledBy"] == "timeout"


def test_a_timeout_with_an_agent_that_floods_its_output_says_only_what_run_did(
        tmp_path: Path) -> None:
    # run stops reading when it gives up on the turn, while the agent is still writing:
    # the conductor it drives warned "the client closed its end of our output", as if
    # something had gone wrong besides the timeout run itself reports.
    chain = tmp_path / "chain.toml"
    chain.write_text(textwrap.dedent(f"""
        [conductor]
        shutdown_grace = 0.2
        [agent]
        command = [{json.dumps(sys.executable)}, {json.dumps(str(BIN / "flooding_agent.py"))}]
        shutdown_grace = 0.2
    """), encoding="utf-8")
    result = run("run", "--chain", str(chain), "hi", "--timeout", "0.5")
    assert result.returncode == 124, result.stderr
    assert "[notice] timeout after 0.5s: cancelling the turn" in result.stderr
    assert "WARNING" not in result.stderr, result.stderr


def test_ctrl_c_during_setup_gives_up_and_a_second_one_stops_at_once(mute_chain: str) -> None:
    # A grace far longer than this test's bounds: a second Ctrl-C that waited it out would
    # be caught by communicate()'s timeout, not by timing the exit.
    with open(mute_chain, "r+", encoding="utf-8") as f:
        chain = f.read()
        f.seek(0)
        f.write("[conductor]\nshutdown_grace = 300\n\n" + chain)
    proc = subprocess.Popen(conductor_argv("--log-level", "info", "run", "--chain", mute_chain,
                                           "hi", "--json"),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=child_env(),
                            cwd=REPO)
    try:
        # The agent starts at the first initialize, so once it is up initialize is pending.
        _wait_for_stderr(proc, b"started mute", 20)
        proc.send_signal(signal.SIGINT)
        lines = _read_lines_until(proc, lambda e: "never answered" in e.get("message", ""), 20)
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=20)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 130, err
    assert "never answered initialize" in lines[-1]["message"]
    assert "Traceback" not in err.decode()
    final = json.loads(out.decode().splitlines()[-1])
    assert final["type"] == "result"
    assert final["exitReason"] == "interrupted"


def _wait_for_stderr(proc: subprocess.Popen[bytes], needle: bytes, timeout: float) -> None:
    assert proc.stderr is not None
    sel = selectors.DefaultSelector()
    sel.register(proc.stderr, selectors.EVENT_READ)
    deadline, seen = time.monotonic() + timeout, b""
    while needle not in seen and time.monotonic() < deadline:
        if sel.select(deadline - time.monotonic()):
            chunk = os.read(proc.stderr.fileno(), 65536)
            if not chunk:
                break
            seen += chunk
    assert needle in seen, seen


@pytest.mark.parametrize(("proxy", "expected"), [
    ('use = "nosuch"', "no proxy named 'nosuch'"),
    ('use = "context"\noptions = { bogus = 1 }', "proxy[0].options.bogus")])
def test_a_bad_proxy_exits_2_with_the_config_message(tmp_path: Path, proxy: str,
                                                     expected: str) -> None:
    chain = tmp_path / "bad.toml"
    chain.write_text(f'[[proxy]]\n{proxy}\n[agent]\ncommand = ["{sys.executable}", "-m", '
                     f'"conductor.demo_agent"]\n', encoding="utf-8")
    result = run("run", "--chain", chain, "hi")
    assert result.returncode == 2, result.stderr
    assert expected in result.stderr
    assert "internal error" not in result.stderr


@pytest.mark.parametrize("prompt", ["", "  \n"])
def test_an_empty_prompt_is_a_usage_error(prompt: str) -> None:
    from_stdin = run("run", "--chain", DEMO, "-", stdin=prompt)
    assert from_stdin.returncode == 2, from_stdin.stderr
    assert "the prompt is empty" in from_stdin.stderr
    as_argument = run("run", "--chain", DEMO, prompt)
    assert as_argument.returncode == 2, as_argument.stderr
    assert from_stdin.stdout == as_argument.stdout == ""


def _on_a_terminal(args: list[str], *, stdout_to_pipe: bool, answer: bytes | None,
                   timeout: float = 30) -> tuple[subprocess.Popen[bytes], str, bytes, float]:
    """Run with stdin and stderr on a pty; answer the permission question if asked."""
    master, slave = pty.openpty()
    proc = subprocess.Popen(conductor_argv(*args), stdin=slave,
                            stdout=subprocess.PIPE if stdout_to_pipe else slave, stderr=slave,
                            env=child_env(TERM="xterm-256color", COLUMNS="100"), cwd=REPO)
    os.close(slave)
    tty, started = b"", time.monotonic()
    try:
        while time.monotonic() - started < timeout and proc.poll() is None:
            sel = selectors.DefaultSelector()
            sel.register(master, selectors.EVENT_READ)
            if not sel.select(0.5):
                continue
            try:
                tty += os.read(master, 65536)
            except OSError:  # EIO: the child closed the terminal
                break
            if answer is not None and b"choose a number" in tty:
                os.write(master, answer)
                answer = None
        out = proc.stdout.read() if proc.stdout else b""
        proc.wait(timeout=timeout)
        elapsed = time.monotonic() - started
    finally:
        os.close(master)
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        if proc.stdout:
            proc.stdout.close()
    return proc, tty.decode("utf-8", "replace"), out, elapsed


def test_with_stdout_redirected_the_default_ask_policy_asks_on_the_terminal() -> None:
    proc, tty, out, _ = _on_a_terminal(["run", "--chain", DEMO, "permission"],
                                       stdout_to_pipe=True, answer=b"1\n")
    assert proc.returncode == 0, tty
    assert "The agent asks: Write notes.txt (edit)" in tty
    assert "1. Allow" in tty
    assert "[permission] Write notes.txt: allow (--approve ask)" in tty
    assert b"Hello from the demo agent." in out


def test_an_unanswered_question_does_not_keep_run_alive_after_the_timeout() -> None:
    proc, tty, _, _ = _on_a_terminal(
        ["run", "--chain", DEMO, "permission", "--approve", "ask", "--timeout", "1"],
        stdout_to_pipe=False, answer=None)
    assert proc.returncode == 124, tty
    assert "The agent asks" in tty  # and it exited: _on_a_terminal fails on one that hangs


RAISER = """
    from conductor.plugins import Proxy, on

    class Raiser(Proxy):
        @on("session/prompt")
        async def prompt(self, ctx, message):
            raise ValueError("broken plugin")
    """


def plugin_chain(tmp_path: Path, source: str, *classes: str) -> str:
    """A chain of the plugin proxies `classes`, defined by `source`, before the demo agent."""
    (tmp_path / "plugins.py").write_text(textwrap.dedent(source), encoding="utf-8")
    proxies = "".join(f'[[proxy]]\nplugin = "{tmp_path / "plugins.py"}:{name}"\n\n'
                      for name in classes)
    chain = tmp_path / "chain.toml"
    chain.write_text(f'{proxies}[agent]\ncommand = ["{sys.executable}", "-m", '
                     '"conductor.demo_agent"]\n', encoding="utf-8")
    return str(chain)


def test_a_plugin_proxy_that_raises_fails_the_prompt_with_exit_1_not_as_a_component(
        tmp_path: Path) -> None:
    chain = plugin_chain(tmp_path, RAISER, "Raiser")
    result = run("run", "--chain", chain, "hello", "--json")
    assert result.returncode == 1, result.stderr  # nothing exited: the prompt failed
    final = events(result.stdout)[-1]
    assert final["exitReason"] == "failed"
    assert final["error"]["code"] == -33002  # HANDLER_FAILED
    assert "ValueError: broken plugin" in final["error"]["message"]


def test_giving_up_on_a_turn_sends_session_cancel_and_never_a_cancel_request(
        tmp_path: Path) -> None:
    record = tmp_path / "agent.jsonl"
    chain = tmp_path / "chain.toml"
    argv = [sys.executable, str(BIN / "scripted_agent.py"), "--prompt-hangs", "--record",
            str(record)]
    # shutdown_grace: after giving up, the prompt it never answers is not waited on for 3 s.
    chain.write_text(f"[conductor]\nshutdown_grace = 0.2\n\n"
                     f"[agent]\ncommand = {json.dumps(argv)}\n", encoding="utf-8")
    result = run("run", "--chain", chain, "hello", "--json", "--timeout", "2",
                 "--cancel-grace", "0.3")  # --timeout: set-up done even on a loaded machine
    assert result.returncode == 124, result.stderr
    methods = [json.loads(line).get("method") for line in record.read_text().splitlines()]
    assert "session/cancel" in methods
    assert "$/cancel_request" not in methods  # agents need not know it (issue: SDK tracebacks)


def test_quiet_prints_only_the_last_turns_answer_when_the_run_succeeds() -> None:
    result = run("run", "--chain", DEMO, "one", "--prompt", "plan two", "--format", "quiet")
    assert result.returncode == 0, result.stderr
    assert result.stdout == "Hello from the demo agent. You said: plan two \n"
    assert "[session]" not in result.stderr and "[stop]" not in result.stderr


def test_quiet_prints_nothing_on_stdout_when_a_turn_fails_and_the_exit_code_says_why() -> None:
    result = run("run", "--chain", DEMO, "one", "--prompt", "stop:refusal two", "--prompt",
                 "three", "--format", "quiet")
    assert result.returncode == 5
    assert result.stdout == ""
    assert result.stderr.strip().endswith("acp-conductor: run: refusal (exit 5)")


def test_a_prompt_file_runs_each_prompt_as_a_turn_with_a_turn_event_each(
        tmp_path: Path) -> None:
    prompts = tmp_path / "prompts.txt"
    prompts.write_text("first\n---\nsecond\nstill second\n", encoding="utf-8")
    result = run("run", "--chain", DEMO, "zeroth", "--prompt-file", str(prompts),
                 "--format", "json")
    assert result.returncode == 0, result.stderr
    lines = events(result.stdout)
    assert [(e["turn"], e["of"], e["stopReason"]) for e in lines if e["type"] == "turn"] == [
        (1, 3, "end_turn"), (2, 3, "end_turn"), (3, 3, "end_turn")]
    assert lines[-1]["type"] == "result" and len(lines[-1]["turns"]) == 3
    said = "".join(e["update"]["content"]["text"] for e in lines if e["type"] == "update"
                   and e["update"]["sessionUpdate"] == "agent_message_chunk")
    assert said.endswith("You said: second\nstill second ")


def test_json_is_format_json_and_cannot_contradict_it() -> None:
    result = run("run", "--chain", DEMO, "hi", "--json", "--format", "quiet")
    assert result.returncode == 2
    assert "--json is --format json" in result.stderr
    assert result.stdout == ""


def _with_stdin_closed(*args: str, closing: str = "<&-") -> subprocess.CompletedProcess[str]:
    # A job started with fd 0 closed (`<&-`), as some runners and daemons do.
    return subprocess.run(["sh", "-c", f'exec "$@" {closing}', "sh", *conductor_argv(*args)],
                          capture_output=True, text=True, env=child_env(), timeout=30, cwd=REPO)


def test_with_stderr_closed_a_run_still_answers_on_stdout() -> None:
    done = _with_stdin_closed("run", "--chain", DEMO, "hello", "--json", closing="2>&-")
    assert done.returncode == 0
    assert events(done.stdout)[-1]["exitCode"] == 0


def test_with_stdout_closed_a_run_says_so_and_exits_2() -> None:
    done = _with_stdin_closed("run", "--chain", DEMO, "hello", closing=">&-")
    assert done.returncode == 2
    assert "stdout: is closed" in done.stderr and "internal error" not in done.stderr


def test_with_stdin_closed_a_prompt_argument_runs_and_a_dash_prompt_is_empty() -> None:
    given = _with_stdin_closed("run", "--chain", DEMO, "hello", "--json")
    assert given.returncode == 0, given.stderr
    assert events(given.stdout)[-1]["exitCode"] == 0
    from_stdin = _with_stdin_closed("run", "--chain", DEMO, "-")
    assert from_stdin.returncode == 2, from_stdin.stderr
    assert "the prompt is empty (nothing on stdin)" in from_stdin.stderr
    assert "internal error" not in given.stderr + from_stdin.stderr


@pytest.mark.parametrize(("args", "stdin"), [
    (["-"], b"caf\xe9\n"),
    (["--prompt-file", "-"], b"one\n---\ncaf\xe9\n"),
    ([b"caf\xe9"], b""),
    (["ok", "--prompt", b"caf\xe9"], b"")])
def test_a_prompt_that_is_not_utf8_is_a_usage_error_before_anything_is_sent(
        args: list[str | bytes], stdin: bytes) -> None:
    result = conductor("run", "--chain", DEMO, "--json", *args, stdin=stdin, text=False)
    err = result.stderr.decode("utf-8", "replace")
    assert result.returncode == 2, err
    assert "not UTF-8" in err
    assert "internal error" not in err
    assert result.stdout == b""  # exit 2: no session, no result line


def test_an_update_over_the_size_limit_is_reported_as_dropped_not_silently_missing() -> None:
    # The demo agent's echo of an 880-character prompt is over 1024 bytes; the prompt is not.
    done = run("run", "--chain", DEMO, "--max-frame-bytes", "1024", "--json", "x" * 880)
    assert done.returncode == 0, done.stderr
    lines = events(done.stdout)
    [notice] = [e for e in lines if e["type"] == "notice"]
    assert notice["message"].startswith("dropped: demo-agent sent a message of ")
    assert "over the 1024-byte limit" in notice["message"]
    assert lines[-1]["dropped"] == 1
    text = run("run", "--chain", DEMO, "--max-frame-bytes", "1024", "x" * 880)
    assert "[notice] dropped: demo-agent sent a message" in text.stderr


@pytest.fixture
def crashing_chain(tmp_path: Path) -> str:
    chain = tmp_path / "crash.toml"
    chain.write_text(f'[agent]\nname = "crashy"\ncommand = ["{sys.executable}", "-c", '
                     '"import sys; sys.stderr.write(\'boom happened\\\\n\'); sys.exit(7)"]\n',
                     encoding="utf-8")
    return str(chain)


def test_a_failing_component_is_reported_once_naming_it_after_its_own_stderr(
        crashing_chain: str) -> None:
    result = run("run", "--chain", crashing_chain, "hi")
    assert result.returncode == 3, result.stderr
    assert result.stderr.count("exited with status 7") == 1, result.stderr
    assert "crashy| boom happened\n" in result.stderr
    assert "[error] crashy: exited with status 7" in result.stderr
    debug = run("--log-level", "debug", "run", "--chain", crashing_chain, "hi")
    assert "acp-conductor ERROR: crashy: exited with status 7" in debug.stderr


def test_quiet_writes_one_line_of_its_own_when_a_component_crashes(crashing_chain: str) -> None:
    result = run("run", "--chain", crashing_chain, "hi", "--format", "quiet")
    assert result.returncode == 3
    assert result.stdout == ""
    ours = [line for line in result.stderr.splitlines() if not line.startswith("crashy| ")]
    assert ours == ["acp-conductor: run: component (exit 3): crashy: exited with status 7; "
                    "last stderr: boom happened"]


def test_a_plugin_proxy_that_fails_a_prompt_is_reported_once(tmp_path: Path) -> None:
    chain = plugin_chain(tmp_path, RAISER, "Raiser")
    result = run("run", "--chain", chain, "hello")
    assert result.returncode == 1, result.stderr
    assert result.stderr.count("broken plugin") == 1, result.stderr
    assert "[error] raiser failed handling session/prompt: ValueError: broken plugin" \
        in result.stderr


def test_approve_ask_with_stderr_off_a_terminal_is_a_usage_error_naming_the_fix() -> None:
    master, slave = pty.openpty()
    try:
        done = subprocess.run(conductor_argv("run", "--chain", DEMO, "hi", "--approve", "ask"),
                              stdin=slave, capture_output=True, text=True, env=child_env(),
                              cwd=REPO, timeout=30)
    finally:
        os.close(slave)
        os.close(master)
    assert done.returncode == 2, done.stderr
    assert done.stdout == ""
    assert "--approve ask" in done.stderr
    assert "stderr" in done.stderr and "--approve none" in done.stderr


def test_a_plugin_proxy_failing_on_the_session_close_run_sends_at_its_end_is_still_reported(
        tmp_path: Path) -> None:
    # run ends its session best effort and does not report that answer: the proxy's own
    # log line is then the only word of its failure, and must not be left to the client.
    chain = plugin_chain(tmp_path, """
        from conductor.plugins import Proxy, on

        class Closer(Proxy):
            @on("session/close")
            async def close(self, ctx, message):
                raise ValueError("lost the session's notes")
        """, "Closer")
    result = run("run", "--chain", chain, "hello")
    assert result.returncode == 0, result.stderr
    assert "lost the session's notes" in result.stderr


def test_a_plugin_proxy_failing_on_another_proxy_s_own_request_is_still_reported(
        tmp_path: Path) -> None:
    # The failure is answered to the proxy before it, which asked for itself and carries
    # on without it: it never reaches run, so the failing proxy's own line must be shown.
    chain = plugin_chain(tmp_path, """
        from conductor.errors import RpcError
        from conductor.plugins import Proxy, on

        class Asker(Proxy):
            @on("session/prompt")
            async def prompt(self, ctx, message):
                try:
                    await ctx.request("_ext/judge", {})
                except RpcError:
                    pass  # no judge today: carry on
                return await ctx.forward()

        class Judge(Proxy):
            @on("_ext/judge")
            async def judge(self, ctx, message):
                raise ValueError("the judge fell over")
        """, "Asker", "Judge")
    result = run("run", "--chain", chain, "hello")
    assert result.returncode == 0, result.stderr
    assert result.stderr.count("the judge fell over") == 1, result.stderr


def test_a_prompt_over_the_frame_limit_is_a_usage_error_before_anything_starts() -> None:
    # The chain refused its request mid-run: exit 1, "client sent a message of N bytes".
    result = run("run", "--chain", DEMO, "--max-frame-bytes", "1100", "x" * 1000)
    assert result.returncode == 2, result.stderr
    assert ("PROMPT: the prompt makes a request of about 1,130 bytes, over the 1,100-byte "
            "limit on a message (hint: raise it with --max-frame-bytes") in result.stderr
    fits = run("run", "--chain", DEMO, "--max-frame-bytes", "1200", "x" * 1000)
    assert fits.returncode == 0, fits.stderr
