"""Traces that answer "where is it stuck": requests never answered, where each stopped,
long silences, and a page that keeps a long chain's lanes in view."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
import tracemalloc
from typing import TYPE_CHECKING, Any

import anyio
import pytest
from click.testing import CliRunner

from conductor.jsonrpc.message import Request, Response, int_id, payload
from conductor.plugins import Proxy, ProxyContext, on
from conductor.testing import ScriptedAgent, TestClient, open_test_chain
from conductor.tracing.sink import JsonlTraceSink
from conductor.tracing.view import load_trace, pending
from tests.in_process import conductor

if TYPE_CHECKING:
    from pathlib import Path

    from conductor.jsonrpc.message import JsonValue, Message

PROXIES = 10
SILENCE = 2.5  # seconds added before the last request, as if the chain had waited


class Visit(Proxy):
    """Handles everything, so every message crosses its hop (and shows in the trace)."""

    @on("*")
    async def down(self, ctx: ProxyContext, message: Message) -> object:
        return await ctx.forward()

    @on("*", source="successor")
    async def up(self, ctx: ProxyContext, message: Message) -> object:
        return await ctx.forward()


class Hold(Visit):
    """Keeps `_ext/hold` for ever: neither forwards nor answers it."""

    @on("_ext/hold")
    async def hold(self, ctx: ProxyContext, message: Message) -> object:
        ctx.release()
        await anyio.sleep_forever()


async def _record(path: Path) -> None:
    sink = JsonlTraceSink(path)
    proxies: list[Proxy[Any]] = []
    for i in range(PROXIES):
        proxy = Hold() if i == 4 else Visit()
        proxy.rename("holder" if i == 4 else f"proxy-number-{i}")
        proxies.append(proxy)

    async def hang(agent: ScriptedAgent, message: Message) -> object:
        await anyio.sleep_forever()

    agent = ScriptedAgent(replies={"_ext/hang": hang})
    with anyio.fail_after(10):
        async with open_test_chain(proxies, agent, tracer=sink) as client, \
                anyio.create_task_group() as tg:
            sid = await client.new_session()
            tg.start_soon(client.request, "_ext/hang", {"sessionId": sid})
            tg.start_soon(client.request, "_ext/hold", {})
            await agent.wait_for("_ext/hang")
            await client.new_session()  # later: its events get the silence before them
            tg.cancel_scope.cancel()
    sink.close()


@pytest.fixture(scope="module")
def stuck_trace(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A trace of a chain of ten proxies, written by the real sink from the real router,
    where the agent never answers `_ext/hang` and the fifth proxy keeps `_ext/hold`."""
    path = tmp_path_factory.mktemp("stuck") / "stuck.jsonl"
    anyio.run(_record, path)
    lines = [json.loads(line) for line in path.read_bytes().splitlines()]
    later = [e["seq"] for e in lines if e.get("method") == "session/new"
             and e.get("hop") == "client" and e.get("dir") == "in"][-1]
    for event in lines:
        if event.get("seq", 0) >= later:
            event["time"] += SILENCE
    path.write_text("".join(json.dumps(e) + "\n" for e in lines), encoding="utf-8")
    return path


def test_each_unanswered_request_is_found_with_the_way_it_took_and_who_has_it(
        stuck_trace: Path) -> None:
    items = pending(load_trace(stuck_trace).events)
    assert [(p.first["method"], p.holder) for p in items] == [("_ext/hang", "agent"),
                                                              ("_ext/hold", "holder")]
    hang, hold = items
    assert hang.path == ["client", *(f"proxy-number-{i}" if i != 4 else "holder"
                                     for i in range(PROXIES)), "agent"]
    assert hold.path == ["client", "proxy-number-0", "proxy-number-1", "proxy-number-2",
                         "proxy-number-3", "holder"]
    assert hang.answer is None  # nobody answered the client either


def test_trace_show_pending_lists_them_and_the_timeline_marks_them(stuck_trace: Path) -> None:
    from conductor.cli.trace import trace_group

    shown = CliRunner().invoke(trace_group, ["show", str(stuck_trace), "--pending"])
    assert shown.exit_code == 0, shown.output
    out = shown.output
    assert "2 of" in out and "requests never got an answer" in out
    assert "_ext/hang #3 [session-1]  from client" in out
    assert "stopped at: agent (sent #" in out
    assert "stopped at: holder" in out
    assert "path: client → proxy-number-0 → proxy-number-1 → proxy-number-2 → " \
           "proxy-number-3 → holder\n" in out
    only = CliRunner().invoke(trace_group, ["show", str(stuck_trace), "--pending",
                                            "--method", "_ext/hold"])
    assert "_ext/hang" not in only.output and "stopped at: holder" in only.output
    timeline = CliRunner().invoke(trace_group, ["show", str(stuck_trace), "--method",
                                                "_ext/*"], env={"COLUMNS": "300"})
    assert timeline.output.count("no answer") == sum(
        1 for p in pending(load_trace(stuck_trace).events) for e in p.requests
        if "pair" not in e)


@pytest.mark.parametrize(("filters", "shown"), [
    (["--method", "_ext/hold", "--component", "proxy-number-0"], ["_ext/hold"]),
    (["--session", "session-1", "--component", "proxy-number-0"], ["_ext/hang"]),
    (["--component", "proxy-number-7"], ["_ext/hang"]),
    (["--component", "client"], ["_ext/hang", "_ext/hold"]),
    (["--method", "_ext/hang", "--component", "holder"], ["_ext/hang"]),
    (["--method", "_ext/hold", "--component", "agent"], []),
])
def test_trace_show_pending_applies_every_filter_together(
        stuck_trace: Path, filters: list[str], shown: list[str]) -> None:
    # A component on the way used to let a request past the --method and --session filters.
    from conductor.cli.trace import trace_group

    out = CliRunner().invoke(trace_group, ["show", str(stuck_trace), "--pending", *filters])
    assert out.exit_code == 0, out.output
    listed = [line.split(" ")[0] for line in out.output.splitlines() if line.startswith("_ext/")]
    assert listed == shown


def test_each_pending_request_is_set_apart_by_a_blank_line_not_a_control_symbol(
        stuck_trace: Path) -> None:
    from conductor.cli.trace import trace_group

    out = CliRunner().invoke(trace_group, ["show", str(stuck_trace), "--pending"]).output
    assert "\u240a" not in out
    assert "\n\n_ext/hang #3" in out and "\n\n_ext/hold" in out


class Swallow(Visit):
    """Forwards `_ext/slow`, then keeps whatever answer it gets: never passes it on."""

    def __init__(self) -> None:
        super().__init__()
        self.kept = anyio.Event()

    @on("_ext/slow")
    async def slow(self, ctx: ProxyContext, message: Message) -> object:
        with contextlib.suppress(Exception):
            await ctx.forward()
        self.kept.set()
        await anyio.sleep_forever()


async def test_a_request_answered_for_a_dead_agent_is_held_by_the_proxy_that_kept_the_answer(
        tmp_path: Path) -> None:
    path = tmp_path / "swallowed.jsonl"
    sink = JsonlTraceSink(path)
    swallow = Swallow()
    swallow.rename("swallow")

    async def die(agent: ScriptedAgent, message: Message) -> object:
        await agent.hang_up()
        await anyio.sleep_forever()

    agent = ScriptedAgent(replies={"_ext/slow": die})
    with anyio.fail_after(10):
        async with open_test_chain([swallow], agent, tracer=sink) as client, \
                anyio.create_task_group() as tg:
            tg.start_soon(client.request, "_ext/slow", {})
            await agent.wait_for("_ext/slow")
            await swallow.kept.wait()  # the conductor answered it for the agent
            tg.cancel_scope.cancel()
    sink.close()
    [item] = pending(load_trace(path).events)
    # the conductor answered swallow's request for the agent (it exited); swallow kept it
    assert item.holder == "swallow"
    assert item.path == ["client", "swallow"]


class Gate(Visit):
    """Answers the first `_ext/ask` itself, forwards the ones after it."""

    def __init__(self) -> None:
        super().__init__()
        self.asked = 0

    @on("_ext/ask")
    async def ask(self, ctx: ProxyContext, message: Message) -> object:
        self.asked += 1
        return {"answered": "by the gate"} if self.asked == 1 else await ctx.forward()


async def test_what_a_proxy_forwards_belongs_to_the_request_it_forwards_not_one_it_answered(
        tmp_path: Path) -> None:
    path = tmp_path / "gate.jsonl"
    sink = JsonlTraceSink(path)
    gate = Gate()
    gate.rename("gate")

    async def hang(agent: ScriptedAgent, message: Message) -> object:
        await anyio.sleep_forever()

    agent = ScriptedAgent(replies={"_ext/ask": hang})
    with anyio.fail_after(10):
        async with open_test_chain([gate], agent, tracer=sink) as client, \
                anyio.create_task_group() as tg:
            answered = await client.request("_ext/ask", {})
            tg.start_soon(client.request, "_ext/ask", {})
            await agent.wait_for("_ext/ask")
            tg.cancel_scope.cancel()
    sink.close()
    events = load_trace(path).events
    [asked] = [e for e in events if e.get("hop") == "client" and e.get("method") == "_ext/ask"
               and e["dir"] == "in" and e["id"] != json.loads(bytes(answered.id))]
    [to_agent] = [e for e in events if e.get("hop") == "agent" and e.get("method") == "_ext/ask"]
    assert (to_agent["flow"], to_agent["client_id"]) == (asked["flow"], asked["id"])
    [item] = pending(events)
    assert (item.first["id"], item.holder, item.path) == (asked["id"], "agent",
                                                          ["client", "gate", "agent"])


async def test_a_request_from_an_agent_that_died_is_not_said_to_be_never_forwarded(
        tmp_path: Path) -> None:
    from conductor.cli.trace import trace_group

    path = tmp_path / "orphan.jsonl"
    sink = JsonlTraceSink(path)
    asked, go, sent = anyio.Event(), anyio.Event(), anyio.Event()

    class Editor(TestClient):
        async def answer(self, message: Request) -> JsonValue:
            asked.set()
            await go.wait()
            return {"outcome": {"outcome": "cancelled"}}

        async def _serve(self, request: Request) -> None:
            await super()._serve(request)
            sent.set()

    agent = ScriptedAgent()
    with anyio.fail_after(10):
        async with open_test_chain([], agent, client=Editor(), tracer=sink) as client, \
                anyio.create_task_group() as tg:
            sid = await client.new_session()
            tg.start_soon(agent.request, "session/request_permission",
                          {"sessionId": sid, "toolCall": {}, "options": []})
            await asked.wait()
            await agent.hang_up()  # it dies waiting for the editor's answer
            go.set()
            await sent.wait()
            await anyio.wait_all_tasks_blocked()  # the conductor has read it
            tg.cancel_scope.cancel()
    sink.close()
    out = CliRunner().invoke(trace_group, ["show", str(path), "--pending"]).output
    assert "neither forwarded nor answered" not in out
    assert "forwarded to client, answered at +" in out


def test_a_hung_agent_is_found_in_the_trace_of_a_run_that_gave_up(tmp_path: Path) -> None:
    chain = tmp_path / "mute.toml"
    # shutdown_grace: once run gives up, the initialize nobody will answer is not waited on
    # for 3 s; shutdown still answers it (what the trace must show).
    chain.write_text('[conductor]\nshutdown_grace = 0.2\n\n'
                     '[agent]\nname = "mute"\ncommand = ["sh", "-c", "cat >/dev/null"]\n',
                     encoding="utf-8")
    trace = tmp_path / "t.jsonl"
    done = conductor("--trace", str(trace), "run", "--chain", str(chain), "hi", "--timeout",
                     "0.5")
    assert done.returncode == 124, done.stderr
    shown = conductor("trace", "show", str(trace), "--pending")
    assert shown.returncode == 0, shown.stderr
    assert shown.stdout.startswith("1 of 1 requests never got an answer")
    assert "initialize #1  from client" in shown.stdout
    assert "  path: client → mute\n" in shown.stdout
    assert "stopped at: mute (sent #1 at" in shown.stdout
    # Shutdown answered the editor for it; the agent itself never did.
    assert "client got an error from conductor: -33001: mute: was stopped before answering" \
        in shown.stdout


CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")


@pytest.mark.skipif(CHROMIUM is None and not os.environ.get("CI"),
                    reason="chromium is not installed (.ci/run installs it)")
def test_the_page_marks_where_requests_stopped_shows_the_silence_and_fits_every_lane(
        stuck_trace: Path, tmp_path: Path) -> None:
    assert CHROMIUM is not None, "CI must have chromium: .ci/run installs it"
    page = tmp_path / "stuck.html"
    done = conductor("trace", "html", str(stuck_trace), "-o", str(page))
    assert done.returncode == 0, done.stderr
    dom = subprocess.run(
        [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu",
         "--disable-background-networking", "--disable-component-update", "--disable-sync",
         "--no-first-run", f"--user-data-dir={tmp_path / 'profile'}", "--window-size=1400,900",
         "--virtual-time-budget=5000", "--dump-dom", page.as_uri()],
        capture_output=True, text=True, timeout=60)
    assert dom.returncode == 0, dom.stderr[-2000:]
    out = dom.stdout
    lanes = load_trace(stuck_trace).lanes
    assert len(lanes) == PROXIES + 3  # client, conductor, the proxies, the agent
    assert 'data-ready="1"' in out and 'data-errors="0"' in out, out[:2000]
    assert f'data-lanes-visible="{len(lanes)}"' in out  # every lane name in view at 1400 px
    assert 'data-pending="2"' in out
    assert out.count('class="pend"') == 2
    assert "stopped at agent, never answered" in out
    assert out.count('class="msg request pending stuck"') == 2  # where each stopped
    assert "stopped here: agent never answered" in out
    assert "stopped here: holder never answered" in out
    assert 'data-gaps="1"' in out
    assert f"{SILENCE:.1f} s without a message" in out


def test_requests_never_answered_do_not_grow_the_trace_sinks_memory_without_bound(
        tmp_path: Path) -> None:
    # A request timed out (or its component gone) is answered by the conductor: no answer
    # ever crosses the hop it was sent on, so its flow would be kept for the whole run.
    sink = JsonlTraceSink(tmp_path / "t.jsonl")
    sink.MAX_OPEN_REQUESTS = 1000
    params = payload({"cwd": "/", "mcpServers": []})

    def forward_unanswered(first: int, count: int) -> None:
        for ident in range(first, first + count):
            sink.message("agent", "out", Request(id=int_id(ident), method="session/new",
                                                 params=params), peer="client")

    with sink:
        tracemalloc.start()
        try:
            forward_unanswered(0, 2000)  # past the bound: what is kept from now on is all
            before = tracemalloc.get_traced_memory()[0]
            forward_unanswered(2000, 20_000)
            grown = tracemalloc.get_traced_memory()[0] - before
        finally:
            tracemalloc.stop()
        # the latest request is still followed to its answer
        sink.message("agent", "in", Response(id=int_id(21_999), result=payload({})),
                     peer="client")
    assert grown < 100_000, f"{grown} bytes kept for 20,000 requests never answered"
    answer = json.loads((tmp_path / "t.jsonl").read_text().splitlines()[-1])
    assert (answer["kind"], answer["method"]) == ("response", "session/new")
