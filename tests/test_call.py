"""`acp-conductor call`: one request through a real chain, the answer as JSON."""

from __future__ import annotations

import json
import shlex
import subprocess
import sys
from typing import TYPE_CHECKING, Any

import anyio
import pytest

from conductor.config import load_chain
from conductor.editor.call import CallExit, CallOptions, call_chain
from conductor.jsonrpc.message import Notification
from tests.conftest import BIN, REPO, child_env, conductor_argv, doc_files
from tests.in_process import conductor

if TYPE_CHECKING:
    from pathlib import Path


@pytest.fixture
def chain(tmp_path: Path) -> Path:
    path = tmp_path / "chain.toml"
    path.write_text(f'[[proxy]]\nname = "ext"\nplugin = "{BIN / "ext_proxy.py"}:Ext"\n\n'
                    '[agent]\ncommand = ["${PYTHON}", "-m", "conductor.demo_agent"]\n',
                    encoding="utf-8")
    return path


async def test_a_proxys_ext_method_is_answered_with_the_session_id_added(chain: Path) -> None:
    seen: list[tuple[str, Any]] = []
    outcome = await call_chain(load_chain(str(chain)), CallOptions(
        "_ext/echo", {"x": 1}, session=True, timeout=20,
        on_notification=lambda method, params: seen.append((method, params))))
    assert outcome.code is CallExit.RESULT
    assert outcome.answer is not None
    assert outcome.answer.result_value() == {"echo": {"sessionId": "demo-session-1", "x": 1}}
    assert seen == [("_ext/echo/progress", {"step": 1})]


async def test_an_error_answer_is_returned_as_received_and_exits_1(chain: Path) -> None:
    outcome = await call_chain(load_chain(str(chain)), CallOptions("_ext/refuse", {},
                                                                   timeout=20))
    assert outcome.code is CallExit.ERROR
    assert outcome.answer is not None
    assert outcome.answer.error_value() == {"code": -32042, "message": "not today",
                                            "data": {"why": "policy"}}


async def test_a_request_nobody_answers_times_out_naming_it(chain: Path) -> None:
    with anyio.fail_after(30):
        outcome = await call_chain(load_chain(str(chain)), CallOptions("_ext/hang", {},
                                                                       timeout=0.5))
    assert outcome.code is CallExit.TIMEOUT
    assert outcome.reason == "no answer to _ext/hang within 0.5s"


class Hops:
    """A trace sink that keeps (hop, direction, method) of every call."""

    def __init__(self) -> None:
        self.seen: list[tuple[str, str, str]] = []

    def message(self, hop: str, direction: str, message: Any, **_: object) -> None:
        for one in message if isinstance(message, list) else [message]:
            if isinstance(one, Notification):
                self.seen.append((hop, direction, one.method))

    def lifecycle(self, component: str, event: str, **fields: object) -> None:
        pass


async def test_a_notification_is_delivered_without_waiting_for_an_answer(chain: Path) -> None:
    hops = Hops()
    outcome = await call_chain(load_chain(str(chain)), CallOptions(
        "_ext/note", {"n": 2}, notify=True, timeout=20, tracer=hops))
    assert outcome.code is CallExit.RESULT
    assert outcome.answer is None
    assert ("ext", "out", "_ext/note") in hops.seen  # it reached the proxy


def test_the_command_prints_only_the_answer_on_stdout(chain: Path) -> None:
    # A real process: what only it shows (its stdout is the answer alone). The tests below
    # run the command in this process (tests/in_process.py).
    done = subprocess.run(conductor_argv("call", "--chain", str(chain), "_ext/echo",
                                         '{"x": [1, "é"]}'),
                          capture_output=True, text=True, env=child_env(), timeout=60)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout) == {"echo": {"x": [1, "é"]}}
    assert done.stdout.count("\n") == 1  # one line of JSON: not a terminal


def test_params_that_are_not_json_are_a_usage_error_with_nothing_on_stdout(chain: Path) -> None:
    done = conductor("call", "--chain", str(chain), "_ext/echo", "{x: 1}")
    assert done.returncode == 2
    assert done.stdout == ""
    assert "PARAMS is not JSON" in done.stderr


@pytest.mark.parametrize(("params", "said"), [
    ("[" * 20_000 + "]" * 20_000, "PARAMS is nested too deeply to send"),
    ('{"x": NaN}', "PARAMS is not JSON: NaN is not a JSON value"),
    ("[Infinity]", "PARAMS is not JSON: Infinity is not a JSON value")])
def test_params_nested_too_deeply_or_with_a_non_json_number_are_a_usage_error(
        chain: Path, params: str, said: str) -> None:
    done = conductor("call", "--chain", str(chain), "_ext/echo", params)
    assert (done.returncode, done.stdout) == (2, ""), done.stderr
    assert said in done.stderr
    assert "internal error" not in done.stderr


@pytest.mark.parametrize(("args", "said"), [
    (("_ext/echo", '{"x": "\\ud800"}'), "PARAMS: PARAMS is not UTF-8"),
    (("_ext/\udcff", "{}"), "METHOD: METHOD is not UTF-8")])
def test_params_or_a_method_that_are_not_utf8_are_a_usage_error_not_an_internal_one(
        chain: Path, args: tuple[str, str], said: str) -> None:
    # json.loads accepts a lone surrogate escape, and a non-UTF-8 byte in argv arrives as
    # one: neither can be encoded to send, which surfaced as an internal error (exit 1).
    done = conductor("call", "--chain", str(chain), *args)
    assert (done.returncode, done.stdout) == (2, ""), done.stderr
    assert said in done.stderr
    assert "internal error" not in done.stderr


def test_the_call_example_in_writing_a_proxy_prints_what_it_says(tmp_path: Path) -> None:
    files = doc_files("writing-a-proxy.md")
    for name in ("upper.py", "upper.toml"):
        (tmp_path / name).write_text(files[name], encoding="utf-8")
    command = "acp-conductor call --chain upper.toml _ext/upper/count '{}'"
    text = (REPO / "docs" / "writing-a-proxy.md").read_text(encoding="utf-8")
    assert f"\n{command}\n" in text and "The first prints `{\"prompts\": 0}`" in text
    done = conductor(*shlex.split(command)[1:], cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout) == {"prompts": 0}


@pytest.mark.parametrize("answer", ["[1, 2]", '"sid"', "7"])
async def test_a_session_new_answered_with_no_object_is_a_setup_failure_naming_it(
        tmp_path: Path, answer: str) -> None:
    # `(opened or {}).get` raised AttributeError on a list or a string: an internal error
    # (exit 1) instead of the documented setup failure (exit 3).
    chain = tmp_path / "chain.toml"
    argv = [sys.executable, str(BIN / "answering_agent.py"), "session/new", answer]
    chain.write_text(f"[agent]\ncommand = {json.dumps(argv)}\n", encoding="utf-8")
    outcome = await call_chain(load_chain(str(chain)), CallOptions("_ext/echo", {},
                                                                   session=True, timeout=20))
    assert outcome.code is CallExit.COMPONENT
    assert outcome.reason is not None and "session/new" in outcome.reason
    assert "sessionId" in outcome.reason


@pytest.mark.parametrize("notify", [False, True])
@pytest.mark.parametrize("params", ["5", '"text"', "true"])
def test_params_that_are_not_an_object_or_an_array_are_a_usage_error(
        chain: Path, params: str, notify: bool) -> None:
    # JSON-RPC params are structured: a scalar went out, was dropped by the conductor with
    # a warning, and a notification so dropped still exited 0.
    argv = ["call", "--chain", str(chain), "_ext/echo", params, *(["--notify"] if notify else [])]
    done = conductor(*argv)
    assert (done.returncode, done.stdout) == (2, ""), done.stderr
    assert "PARAMS must be a JSON object or array" in done.stderr
