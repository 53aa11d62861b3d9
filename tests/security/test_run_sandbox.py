"""`run`'s sandbox against an agent that tries to get out of --cwd, or to wedge the run.

The file and terminal handlers of `RunEditor` are called directly, in memory; only
the signal and orphan behaviour needs a real `acp-conductor run`.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import anyio
import psutil
import pytest

from conductor.editor import terminals
from conductor.editor.policy import RunEditor
from conductor.editor.sandbox import MAX_READ_BYTES, NOT_FOUND, REFUSED
from conductor.errors import RpcError
from conductor.jsonrpc.codes import ErrorCode
from tests.conftest import REPO, child_env, conductor_argv, exited

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable


class Events:
    """What the run would show: every decision and notice."""

    def __init__(self) -> None:
        self.decisions: list[dict[str, Any]] = []

    def decision(self, record: dict[str, Any]) -> None:
        self.decisions.append(record)

    def session(self, record: dict[str, Any]) -> None: ...
    def update(self, session_id: str | None, update: dict[str, Any]) -> None: ...
    def notice(self, text: str) -> None: ...
    def result(self, record: dict[str, Any]) -> None: ...

    async def ask_permission(self, tool_call: dict[str, Any],
                             options: list[dict[str, Any]]) -> str | None:
        return None


@pytest.fixture
def root(tmp_path: Path) -> Path:
    """--cwd, with a file inside, and a secret just outside."""
    root = tmp_path / "cwd"
    (root / "sub").mkdir(parents=True)
    (root / "notes.txt").write_text("one\ntwo\nthree\n", encoding="utf-8")
    (tmp_path / "secret.txt").write_text("TOP-SECRET", encoding="utf-8")
    (root / "escape").symlink_to(tmp_path / "secret.txt")
    (root / "hop1").symlink_to("hop2")
    (root / "hop2").symlink_to("../secret.txt")
    (root / "outdir").symlink_to(tmp_path)
    return root


def editor(root: Path, spawn: Callable[..., Awaitable[None]] | None = None,
           **options: Any) -> tuple[RunEditor, Events]:
    events = Events()

    async def no_spawn(func: Callable[[], Awaitable[None]]) -> None:
        raise AssertionError("nothing here starts tasks")

    settings: dict[str, Any] = {"approve": "none", "allow_write": False,
                                "allow_terminal": False, "max_frame_bytes": None, **options}
    return RunEditor(events, cwd=root, on_policy_failure=lambda: None,
                     spawn=spawn or no_spawn, **settings), events


async def refused(handler: Awaitable[Any], code: int, *words: str) -> RpcError:
    with anyio.fail_after(5), pytest.raises(RpcError) as caught:
        await handler
    assert caught.value.code == code, caught.value
    for word in words:
        assert word in caught.value.message, caught.value.message
    return caught.value


# -- paths ---------------------------------------------------------------------------------

@pytest.mark.parametrize("path", ["notes.txt", "./notes.txt", "sub/../notes.txt", "~/x",
                                  "file://{root}/notes.txt", "../secret.txt"])
async def test_a_relative_path_is_refused_as_invalid_params_naming_the_acp_rule(
        root: Path, path: str) -> None:
    ed, events = editor(root, allow_write=True)
    path = path.format(root=root)
    await refused(ed.handle_request("fs/read_text_file", {"path": path}),
                  ErrorCode.INVALID_PARAMS, "must be absolute (ACP)", repr(path))
    await refused(ed.handle_request("fs/write_text_file", {"path": path, "content": "x"}),
                  ErrorCode.INVALID_PARAMS, "must be absolute (ACP)")
    assert not (root / "notes.txt").read_text(encoding="utf-8").startswith("x")
    assert events.decisions[0]["allowed"] is False
    assert ed.violations == []  # a malformed request, not an attempt at the boundary


@pytest.mark.parametrize("path", ["{root}/notes.txt\0", "{root}/\0../../secret.txt", "\0"])
async def test_a_path_with_a_nul_byte_is_refused_as_invalid_params(root: Path,
                                                                   path: str) -> None:
    ed, _ = editor(root, allow_write=True)
    path = path.format(root=root)
    await refused(ed.handle_request("fs/read_text_file", {"path": path}),
                  ErrorCode.INVALID_PARAMS, "NUL")
    await refused(ed.handle_request("fs/write_text_file", {"path": path, "content": "x"}),
                  ErrorCode.INVALID_PARAMS, "NUL")


@pytest.mark.parametrize("path", [None, 5, ["/x"], ""])
async def test_a_path_that_is_not_a_string_is_refused_as_invalid_params(root: Path,
                                                                        path: object) -> None:
    ed, _ = editor(root)
    await refused(ed.handle_request("fs/read_text_file", {"path": path}),
                  ErrorCode.INVALID_PARAMS)


@pytest.mark.parametrize("path", ["{root}/escape", "{root}/hop1", "{root}/outdir/secret.txt",
                                  "{root}/../secret.txt", "{root}/sub/../../secret.txt",
                                  "{root}//..//secret.txt", "/proc/self/root{tmp}/secret.txt",
                                  "/proc/self/cwd/secret.txt", "/etc/passwd", "/", "{tmp}"])
async def test_a_path_that_resolves_outside_cwd_is_refused_and_counted(
        root: Path, path: str) -> None:
    ed, events = editor(root, allow_write=True)
    path = path.format(root=root, tmp=root.parent)
    for method, params in (("fs/read_text_file", {"path": path}),
                           ("fs/write_text_file", {"path": path, "content": "x"})):
        error = await refused(ed.handle_request(method, params), REFUSED, "outside")
        assert "TOP-SECRET" not in error.message + json.dumps(error.data)
    assert (root.parent / "secret.txt").read_text(encoding="utf-8") == "TOP-SECRET"
    assert len(ed.violations) == 2
    assert [d["allowed"] for d in events.decisions] == [False, False]


async def test_inside_paths_are_served_whatever_their_spelling(root: Path) -> None:
    ed, _ = editor(root)
    for path in (f"{root}/notes.txt", f"{root}//sub/../notes.txt", f"{root}/./notes.txt",
                 f"/proc/self/root{root}/notes.txt"):
        assert await ed.handle_request("fs/read_text_file", {"path": path}) == \
            {"content": "one\ntwo\nthree\n"}
    await refused(ed.handle_request("fs/read_text_file", {"path": f"{root}/missing"}),
                  NOT_FOUND)
    assert ed.violations == []


# -- what is not a plain file --------------------------------------------------------------

async def test_a_fifo_inside_cwd_is_refused_at_once_without_waiting_for_a_writer(
        root: Path) -> None:
    os.mkfifo(root / "pipe")
    ed, _ = editor(root, allow_write=True)
    await refused(ed.handle_request("fs/read_text_file", {"path": f"{root}/pipe"}),
                  REFUSED, "not a regular file")
    await refused(ed.handle_request("fs/write_text_file",
                                    {"path": f"{root}/pipe", "content": "x"}),
                  REFUSED, "not a regular file")
    assert len(ed.violations) == 2


async def test_a_socket_and_a_directory_inside_cwd_are_refused(root: Path) -> None:
    server = socket.socket(socket.AF_UNIX)
    with server:
        server.bind(str(root / "sock"))
        ed, _ = editor(root, allow_write=True)
        for path in (f"{root}/sock", f"{root}/sub", str(root)):
            await refused(ed.handle_request("fs/read_text_file", {"path": path}),
                          REFUSED, "not a regular file")
        await refused(ed.handle_request("fs/write_text_file",
                                        {"path": f"{root}/sub", "content": "x"}),
                      REFUSED, "not a regular file")


@pytest.mark.parametrize("path", ["/dev/zero", "/dev/urandom", "/dev/null", "/dev/stdin",
                                  "/proc/self/environ", "/proc/self/mem", "/sys/kernel/notes"])
async def test_devices_and_proc_files_are_refused_even_when_cwd_contains_them(
        path: str) -> None:
    ed, _ = editor(Path("/"), allow_write=True)
    await refused(ed.handle_request("fs/read_text_file", {"path": path}), REFUSED)
    await refused(ed.handle_request("fs/write_text_file", {"path": path, "content": "x"}),
                  REFUSED)


async def test_a_link_to_a_device_inside_cwd_is_refused(root: Path) -> None:
    (root / "zero").symlink_to("/dev/zero")
    ed, _ = editor(root)
    await refused(ed.handle_request("fs/read_text_file", {"path": f"{root}/zero"}), REFUSED)


# -- size and time -------------------------------------------------------------------------

async def test_a_file_over_the_read_limit_is_refused_without_being_read(
        root: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    big = root / "big.log"
    with big.open("wb") as f:
        f.truncate(MAX_READ_BYTES + 1)  # sparse: no disk used
    read: list[int] = []
    real_read = os.read

    def counting_read(fd: int, n: int) -> bytes:
        data = real_read(fd, n)
        read.append(len(data))
        return data

    monkeypatch.setattr(os, "read", counting_read)
    ed, _ = editor(root)
    await refused(ed.handle_request("fs/read_text_file", {"path": str(big), "limit": 1}),
                  REFUSED, f"over the {MAX_READ_BYTES} bytes")
    assert sum(read) == 0


async def test_an_answer_over_the_frame_limit_is_refused_with_the_limit(root: Path) -> None:
    (root / "wide.bin").write_bytes(b"\x01" * 4000)  # \u0001 in JSON: six bytes each
    ed, _ = editor(root, max_frame_bytes=16_000)
    await refused(ed.handle_request("fs/read_text_file", {"path": f"{root}/wide.bin"}),
                  REFUSED, "16000")


@pytest.mark.parametrize(("line", "limit", "content"), [
    (None, None, "one\ntwo\nthree\n"), (1, None, "one\ntwo\nthree\n"), (2, None, "two\nthree\n"),
    (2, 1, "two\n"), (3, 5, "three\n"), (4, None, ""), (99, 1, ""), (0, 1, "one\n"),
    (1, 0, ""), (-1, None, "one\ntwo\nthree\n"), ("2", None, "one\ntwo\nthree\n"),
    (None, -3, "one\ntwo\nthree\n"),
])
async def test_line_and_limit_select_whole_lines(root: Path, line: object, limit: object,
                                                 content: str) -> None:
    ed, _ = editor(root)
    params = {k: v for k, v in (("line", line), ("limit", limit)) if v is not None}
    assert await ed.handle_request("fs/read_text_file", {"path": f"{root}/notes.txt",
                                                         **params}) == {"content": content}


async def test_line_and_limit_work_on_a_file_without_newlines(root: Path) -> None:
    blob = root / "blob"
    blob.write_bytes(b"x" * (4 * 1024 * 1024) + b"\nlast")
    ed, _ = editor(root)
    assert await ed.handle_request("fs/read_text_file", {"path": str(blob), "line": 2,
                                                         "limit": 1}) == {"content": "last"}
    first = await ed.handle_request("fs/read_text_file", {"path": str(blob), "limit": 1})
    assert first == {"content": "x" * (4 * 1024 * 1024) + "\n"}


async def test_a_read_is_abandoned_when_the_turn_is_cancelled(
        root: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A read stuck in the kernel (NFS, a dying disk) must not keep the run alive."""
    entered, release = threading.Event(), threading.Event()
    real_read = os.read

    def blocking_read(fd: int, n: int) -> bytes:
        if not entered.is_set():  # only the first read blocks
            entered.set()
            release.wait(10)
        return real_read(fd, n)

    monkeypatch.setattr(os, "read", blocking_read)
    ed, _ = editor(root)
    try:
        with anyio.fail_after(5):
            async with anyio.create_task_group() as tg:
                tg.start_soon(ed.handle_request, "fs/read_text_file",
                              {"path": f"{root}/notes.txt"})
                assert await anyio.to_thread.run_sync(entered.wait, 5)
                tg.cancel_scope.cancel()
    finally:
        release.set()


# -- terminals -----------------------------------------------------------------------------

@pytest.mark.parametrize("cwd", ["sub", "../", "{tmp}", "{root}/outdir", "{root}/x\0"])
async def test_a_terminal_cwd_that_is_relative_or_outside_is_refused(root: Path,
                                                                     cwd: str) -> None:
    ed, _ = editor(root, allow_terminal=True)
    with pytest.raises(RpcError) as caught:
        await ed.handle_request("terminal/create", {"command": "true",
                                                    "cwd": cwd.format(root=root,
                                                                      tmp=root.parent)})
    assert caught.value.code in (REFUSED, ErrorCode.INVALID_PARAMS)


async def spawner(tg: anyio.abc.TaskGroup) -> Callable[..., Awaitable[None]]:
    async def spawn(func: Callable[[], Awaitable[None]]) -> None:
        tg.start_soon(func)
    return spawn


async def run_terminal(ed: RunEditor, script: str) -> tuple[str, str]:
    """Run `sh -c script` to its end; (terminalId, output)."""
    created = await ed.handle_request("terminal/create", {"command": "sh",
                                                          "args": ["-c", script]})
    tid = created["terminalId"]
    await ed.handle_request("terminal/wait_for_exit", {"terminalId": tid})
    output = await ed.handle_request("terminal/output", {"terminalId": tid})
    return tid, output["output"]




DETACH = "setsid sleep 300 >/dev/null 2>&1 & echo $!; sleep 300 >/dev/null 2>&1 & echo $!"


@pytest.mark.parametrize("how", ["release", "kill", "run end"])
async def test_a_terminal_takes_its_detached_children_with_it(root: Path, how: str) -> None:
    async with anyio.create_task_group() as tg:
        ed, _ = editor(root, spawn=await spawner(tg), allow_terminal=True)
        try:
            with anyio.fail_after(10):
                tid, output = await run_terminal(ed, DETACH)
                pids = [int(p) for p in output.split()]
                assert len(pids) == 2 and all(psutil.pid_exists(p) for p in pids)
                if how == "run end":
                    await ed.aclose()
                else:
                    await ed.handle_request(f"terminal/{how}", {"terminalId": tid})
            assert exited(pids)
        finally:
            await ed.aclose()


async def test_a_terminal_has_exited_when_its_command_has_though_a_child_keeps_its_output(
        root: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # `server &` without a redirect: the child inherits the terminal's output pipe, and
    # holds it open long after the command itself has exited. Without the grace the exit
    # would wait on the child (300 s); what it is long enough for, the exited command's
    # output, is already in the pipe: a short one is waited out just as well.
    monkeypatch.setattr(terminals, "OUTPUT_GRACE", 0.1)
    async with anyio.create_task_group() as tg:
        ed, _ = editor(root, spawn=await spawner(tg), allow_terminal=True)
        try:
            with anyio.fail_after(10):
                tid, output = await run_terminal(ed, "sleep 300 & echo $!; exit 3")
                status = await ed.handle_request("terminal/output", {"terminalId": tid})
                assert status["exitStatus"] == {"exitCode": 3, "signal": None}
                child = int(output.split()[0])
                assert psutil.pid_exists(child)
                await ed.handle_request("terminal/release", {"terminalId": tid})
            assert exited([child])
        finally:
            await ed.aclose()


async def test_a_released_terminal_is_gone_and_its_id_unknown(root: Path) -> None:
    async with anyio.create_task_group() as tg:
        ed, _ = editor(root, spawn=await spawner(tg), allow_terminal=True)
        with anyio.fail_after(10):
            tid, output = await run_terminal(ed, "echo hi")
            assert output == "hi\n"
            await ed.handle_request("terminal/release", {"terminalId": tid})
            await refused(ed.handle_request("terminal/output", {"terminalId": tid}), NOT_FOUND)
            await ed.aclose()


async def test_a_terminal_killed_by_a_real_time_signal_reports_its_exit_with_the_signal(
        root: Path) -> None:
    # Python's signal.Signals names only SIGRTMIN and SIGRTMAX: any signal between them
    # made terminal/output and terminal/wait_for_exit fail as internal errors, every time.
    async with anyio.create_task_group() as tg:
        ed, _ = editor(root, spawn=await spawner(tg), allow_terminal=True)
        try:
            with anyio.fail_after(10):
                created = await ed.handle_request("terminal/create", {
                    "command": "sh", "args": ["-c", f"kill -{signal.SIGRTMIN + 6} $$"]})
                tid = created["terminalId"]
                status = await ed.handle_request("terminal/wait_for_exit",
                                                 {"terminalId": tid})
                assert status == {"exitCode": None, "signal": "SIGRTMIN+6"}
                output = await ed.handle_request("terminal/output", {"terminalId": tid})
                assert output["exitStatus"] == status
        finally:
            await ed.aclose()


# -- a real run: SIGTERM -------------------------------------------------------------------

def chain_with_a_lingering_agent(tmp_path: Path) -> Path:
    """The demo agent behind a wrapper that ignores SIGTERM, starts a detached grandchild
    and lingers after the agent exits: what a careless npx-style agent does."""
    wrapper = tmp_path / "agent.sh"
    wrapper.write_text(
        "#!/bin/sh\n"
        "trap '' TERM\n"
        "setsid sleep 300 >/dev/null 2>&1 &\n"
        f"{sys.executable} -m conductor.demo_agent\n"
        "sleep 300\n", encoding="utf-8")
    wrapper.chmod(0o755)
    chain = tmp_path / "chain.toml"
    chain.write_text(f'[conductor]\nshutdown_grace = 0.5\n\n'
                     f'[agent]\nname = "demo"\ncommand = ["{wrapper}"]\n', encoding="utf-8")
    return chain


def marked(marker: str) -> list[psutil.Process]:
    """Live processes started under the run (they inherit its marker variable)."""
    found = []
    for proc in psutil.process_iter(["environ", "status"]):
        if (proc.info.get("environ") or {}).get("SANDBOX_TEST_RUN") == marker and \
                proc.info.get("status") != psutil.STATUS_ZOMBIE:
            found.append(proc)
    return found


def test_sigterm_cancels_the_turn_prints_the_result_and_leaves_nothing_behind(
        tmp_path: Path) -> None:
    chain = chain_with_a_lingering_agent(tmp_path)
    marker = f"run-{os.getpid()}-{tmp_path.name}"
    proc = subprocess.Popen(conductor_argv("run", "--chain", str(chain), "hang", "--json"),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd=REPO,
                            env=child_env(SANDBOX_TEST_RUN=marker))
    try:
        assert proc.stdout is not None
        first = proc.stdout.readline()  # the session line: the agent and its grandchild run
        assert json.loads(first)["type"] == "session"
        assert len([p for p in marked(marker) if p.pid != proc.pid]) >= 3
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=30)
        left = marked(marker)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        for stray in marked(marker):  # a failing run must not leak into the next tests
            stray.kill()
    assert proc.returncode == 143, err
    lines = [json.loads(line) for line in out.decode().splitlines()]
    assert any(e["type"] == "notice" and e["message"].startswith(
        "terminated: cancelling the turn") for e in lines)
    final = lines[-1]
    assert final["type"] == "result"
    assert final["exitCode"] == 143 and final["exitReason"] == "terminated"
    assert final["cancelledBy"] == "terminate"
    assert final["stopReason"] == "cancelled"  # the turn was cancelled, not cut off
    assert left == []


# -- what a hostile agent sends: held to the same rules, answered clearly ------------------

@pytest.mark.parametrize("path", ["{root}/\ud800", "{root}/sub/\udfff.txt"])
async def test_a_path_with_a_lone_surrogate_is_refused_as_invalid_params(root: Path,
                                                                         path: str) -> None:
    ed, _ = editor(root, allow_write=True, allow_terminal=True)
    path = path.format(root=root)
    await refused(ed.handle_request("fs/read_text_file", {"path": path}),
                  ErrorCode.INVALID_PARAMS, "not valid")
    await refused(ed.handle_request("fs/write_text_file", {"path": path, "content": "x"}),
                  ErrorCode.INVALID_PARAMS, "not valid")
    await refused(ed.handle_request("terminal/create", {"command": "true", "cwd": path}),
                  ErrorCode.INVALID_PARAMS, "not valid")


async def test_a_chain_of_more_symlinks_than_the_system_follows_is_refused(root: Path) -> None:
    # Python's realpath recurses once per link: a long chain raised RecursionError.
    previous = "notes.txt"
    for i in range(1200):
        (root / f"link{i}").symlink_to(previous)
        previous = f"link{i}"
    ed, _ = editor(root, allow_write=True)
    await refused(ed.handle_request("fs/read_text_file", {"path": f"{root}/{previous}"}),
                  REFUSED, "symlinks")
    await refused(ed.handle_request("fs/write_text_file",
                                    {"path": f"{root}/{previous}", "content": "x"}),
                  REFUSED, "symlinks")
    assert (root / "notes.txt").read_text(encoding="utf-8") == "one\ntwo\nthree\n"


async def test_a_write_whose_directory_is_swapped_for_a_link_outside_creates_nothing_there(
        root: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # The agent (or its terminal) swaps a checked directory for a link between the check
    # and the open: the write must be refused without creating anything outside.
    outside = root.parent / "elsewhere"
    outside.mkdir()
    ed, _ = editor(root, allow_write=True)
    real_inside = ed.sandbox.inside

    def racing_inside(op: str, raw_path: object, *, file: bool = True) -> Path:
        checked = real_inside(op, raw_path, file=file)
        (root / "sub").rmdir()
        (root / "sub").symlink_to(outside)
        return checked

    monkeypatch.setattr(ed.sandbox, "inside", racing_inside)
    for name in ("new.txt", "deeper/new.txt"):
        if (root / "sub").is_symlink():
            (root / "sub").unlink()
            (root / "sub").mkdir()
        await refused(ed.handle_request("fs/write_text_file",
                                        {"path": f"{root}/sub/{name}", "content": "x"}),
                      REFUSED)
    assert list(outside.iterdir()) == []
    assert len(ed.violations) == 2


async def test_a_terminal_without_an_output_limit_keeps_only_what_fits_one_answer(
        root: Path) -> None:
    # Unbounded, a chatty command (`yes`) grows the run's memory until it dies, and its
    # terminal/output answer could never cross the chain anyway (over the frame limit).
    async with anyio.create_task_group() as tg:
        ed, _ = editor(root, spawn=await spawner(tg), allow_terminal=True,
                       max_frame_bytes=60_000)
        try:
            with anyio.fail_after(10):
                for limit in (None, True, -1, 10**12):
                    params: dict[str, Any] = {"command": "sh", "args": [
                        "-c", "head -c 200000 /dev/zero | tr '\\0' '\\001'"]}
                    if limit is not None:
                        params["outputByteLimit"] = limit
                    tid = (await ed.handle_request("terminal/create", params))["terminalId"]
                    await ed.handle_request("terminal/wait_for_exit", {"terminalId": tid})
                    answer = await ed.handle_request("terminal/output", {"terminalId": tid})
                    assert answer["truncated"] is True
                    assert 0 < len(json.dumps(answer)) < 60_000 - 256
        finally:
            await ed.aclose()


@pytest.mark.parametrize("params", [
    {"toolCall": {"kind": ["read"]}, "options": [{"optionId": "yes", "kind": "allow_once"}]},
    {"toolCall": {"kind": {"read": 1}}, "options": [{"optionId": "yes", "kind": "allow_once"}]},
    {"toolCall": {"kind": "read"}, "options": 5},
    {"toolCall": {"kind": "read"}, "options": {"optionId": "yes", "kind": "allow_once"}},
])
async def test_a_malformed_permission_request_is_never_allowed_and_never_crashes(
        root: Path, params: dict[str, Any]) -> None:
    ed, events = editor(root, approve="reads")
    with anyio.fail_after(5):
        answer = await ed.handle_request("session/request_permission", params)
    assert answer == {"outcome": {"outcome": "cancelled"}}
    assert events.decisions[-1]["outcome"] == "cancelled"


@pytest.mark.parametrize("params", [
    {"command": "true", "args": ["a\0b"]}, {"command": "tr\0ue"},
    {"command": "true", "env": [{"name": "A\0", "value": "x"}]},
    {"command": "true", "env": [{"name": "A", "value": "x\0"}]},
    {"command": "true", "env": [{"name": "A=B", "value": "x"}]},
])
async def test_a_terminal_that_cannot_be_started_as_asked_is_invalid_params(
        root: Path, params: dict[str, Any]) -> None:
    ed, _ = editor(root, allow_terminal=True)
    await refused(ed.handle_request("terminal/create", params), ErrorCode.INVALID_PARAMS)
    assert ed.violations == []


async def test_terminal_args_and_env_of_the_wrong_type_are_skipped_as_acp_says(
        root: Path) -> None:
    async with anyio.create_task_group() as tg:
        ed, _ = editor(root, spawn=await spawner(tg), allow_terminal=True)
        try:
            with anyio.fail_after(10):
                for args, env in ((5, 5), ("abc", {"A": "1"})):
                    tid = (await ed.handle_request("terminal/create", {
                        "command": "sh", "args": args, "env": env}))["terminalId"]
                    status = await ed.handle_request("terminal/wait_for_exit",
                                                     {"terminalId": tid})
                    assert status == {"exitCode": 0, "signal": None}
                tid = (await ed.handle_request("terminal/create", {
                    "command": "sh", "args": ["-c", 5, 'echo "$A$B"', None, "sh", 7],
                    "env": [{"name": "A", "value": "a"}, {"name": "B", "value": 2}, 3,
                            {"name": 4, "value": "x"}]}))["terminalId"]
                await ed.handle_request("terminal/wait_for_exit", {"terminalId": tid})
                output = await ed.handle_request("terminal/output", {"terminalId": tid})
                assert output["output"] == "a\n"
        finally:
            await ed.aclose()


async def test_a_terminal_refused_for_want_of_allow_terminal_is_refused_whatever_its_args(
        root: Path) -> None:
    ed, _ = editor(root)
    await refused(ed.handle_request("terminal/create", {"command": "rm", "args": 5}),
                  REFUSED, "--allow-terminal")
    assert len(ed.violations) == 1


@pytest.mark.parametrize("approve", ["none", "reads", "all"])
async def test_options_sharing_one_option_id_are_never_selected(root: Path, approve: str) -> None:
    # The agent reads the id back: "x" could mean its allow option as well as its reject one.
    ed, events = editor(root, approve=approve)
    params = {"toolCall": {"kind": "edit"},
              "options": [{"optionId": "x", "kind": "reject_once"},
                          {"optionId": "x", "kind": "allow_once"}]}
    with anyio.fail_after(5):
        answer = await ed.handle_request("session/request_permission", params)
    assert answer == {"outcome": {"outcome": "cancelled"}}
    assert events.decisions[-1]["outcome"] == "cancelled"


async def test_a_terminal_method_run_does_not_implement_is_method_not_found(root: Path) -> None:
    ed, _ = editor(root, allow_terminal=True)
    error = await refused(ed.handle_request("terminal/resize", {"terminalId": "term-1-1"}),
                          ErrorCode.METHOD_NOT_FOUND)
    assert error.data == {"method": "terminal/resize"}


def test_a_run_ended_by_sighup_leaves_no_terminal_command_running(tmp_path: Path) -> None:
    # Closing the terminal window: no graceful stop, but what the agent ran must not stay.
    marker = f"run-{os.getpid()}-{tmp_path.name}"
    proc = subprocess.Popen(
        conductor_argv("run", "--chain", "demo", "terminal:sleep_300", "--allow-terminal",
                       "--json", "--cwd", str(tmp_path)),
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, cwd=REPO,
        env=child_env(SANDBOX_TEST_RUN=marker))
    try:
        deadline = time.monotonic() + 30  # a bound on the start, not a measure
        while not (started := [p.pid for p in marked(marker) if p.name() == "sleep"]):
            assert time.monotonic() < deadline, "the terminal's command never started"
            time.sleep(0.05)
        proc.send_signal(signal.SIGHUP)
        proc.wait(timeout=30)
        assert exited(started, timeout=15), [p.cmdline() for p in marked(marker)]
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        for stray in marked(marker):
            stray.kill()


async def test_an_option_without_a_string_id_is_never_offered_to_the_person_asked(
        root: Path) -> None:
    ed, events = editor(root, approve="ask")
    offered: list[list[dict[str, Any]]] = []

    async def first(tool: dict[str, Any], options: list[dict[str, Any]]) -> str | None:
        offered.append(options)  # the person picks the first one shown
        return options[0].get("optionId") if options else None

    events.ask_permission = first  # type: ignore[method-assign]
    params = {"toolCall": {"kind": "edit"},
              "options": [{"optionId": 5, "name": "Allow", "kind": "allow_once"},
                          {"optionId": "no", "name": "Reject", "kind": "reject_once"}]}
    with anyio.fail_after(5):
        answer = await ed.handle_request("session/request_permission", params)
    assert offered == [[params["options"][1]]]
    assert answer == {"outcome": {"outcome": "selected", "optionId": "no"}}


async def test_a_refusal_names_run_s_editor_as_the_component_that_refused(root: Path) -> None:
    # docs/errors.md: every -33004 names the component that refused (here the agent may sit
    # behind a permissions proxy, which answers -33004 too: data.component tells them apart).
    ed, _ = editor(root)
    error = await refused(ed.handle_request("fs/write_text_file",
                                            {"path": str(root / "x.txt"), "content": "x"}),
                          REFUSED, "--allow-write")
    assert isinstance(error.data, dict)
    assert error.data["component"] == "editor", error.data
    assert error.data["op"] == "write", error.data
