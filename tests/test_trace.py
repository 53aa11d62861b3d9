"""--trace: every message on every hop exactly once, causal order, redaction, 0600, viewers."""

from __future__ import annotations

import json
import os
import shutil
import stat
import subprocess
import sys
from typing import TYPE_CHECKING

import pytest

from tests.conftest import BIN, REPO
from tests.in_process import conductor

if TYPE_CHECKING:
    from pathlib import Path

SECRET = "sk-live-0123456789abcdef"


def _tee(log: Path, *argv: str) -> list[str]:
    return [sys.executable, str(BIN / "tee_stdio.py"), str(log), *argv]


@pytest.fixture(scope="module")
def recorded(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """One run through two proxies, each component's pipes logged by a tee."""
    tmp = tmp_path_factory.mktemp("trace")
    logs = {name: tmp / f"{name}.log" for name in ("first", "second", "agent")}
    proxy = [sys.executable, "-m", "acp_conductor_proxies.passthrough"]
    agent = [sys.executable, "-m", "conductor.demo_agent"]
    chain = {
        "proxy": [{"name": "first", "command": _tee(logs["first"], *proxy)},
                  {"name": "second", "command": _tee(logs["second"], *proxy)}],
        "agent": {"name": "agent", "command": _tee(logs["agent"], *agent),
                  "env": {"DEMO_TOKEN": SECRET}, "secret_env": ["DEMO_TOKEN"]},
        "conductor": {"redact": ["ticket-[0-9]+"]},
    }
    chain_file = tmp / "chain.toml"
    chain_file.write_text(_toml(chain), encoding="utf-8")
    trace = tmp / "trace.jsonl"
    trace.write_text('{"seq":1,"type":"trace","version":1}\n', encoding="utf-8")  # an old one
    trace.chmod(0o644)  # an existing file must end up owner-only too
    prompt = f"permission plan {SECRET} ticket-4711 Authorization: Bearer abc.def"
    result = conductor("--trace", str(trace), "run", "--chain", str(chain_file), prompt,
                       "--approve", "all", env={"PYTHONPATH": str(REPO)})
    assert result.returncode == 0, result.stderr
    unredacted = tmp / "unredacted.jsonl"
    result = conductor("--trace", str(unredacted), "--trace-unredacted", "run", "--chain",
                       str(chain_file), prompt, "--approve", "all")
    assert result.returncode == 0, result.stderr
    return {"trace": trace, "unredacted": unredacted, "tmp": tmp, **logs}


def _toml(chain: dict) -> str:
    def value(v: object) -> str:
        if isinstance(v, dict):
            return "{ " + ", ".join(f"{k} = {value(x)}" for k, x in v.items()) + " }"
        return json.dumps(v)
    out = []
    for p in chain["proxy"]:
        out.append("[[proxy]]")
        out += [f"{k} = {value(v)}" for k, v in p.items()]
    out.append("[agent]")
    out += [f"{k} = {value(v)}" for k, v in chain["agent"].items()]
    out.append("[conductor]")
    out += [f"{k} = {value(v)}" for k, v in chain["conductor"].items()]
    return "\n".join(out) + "\n"


def _events(path: Path) -> list[dict]:
    # bytes: str.splitlines() would also split at U+2028 inside a JSON string
    return [json.loads(line) for line in path.read_bytes().split(b"\n") if line]


def test_every_message_on_every_hop_appears_exactly_once_in_order(recorded: dict) -> None:
    events = [e for e in _events(recorded["unredacted"]) if e["type"] == "message"]
    # the unredacted run's tee logs were overwritten by that second run: same chain, same prompt
    for hop in ("first", "second", "agent"):
        log = [json.loads(line) for line in recorded[hop].read_text().splitlines()]
        received = [json.loads(e["line"]) for e in log if e["dir"] == "recv"]
        sent = [json.loads(e["line"]) for e in log if e["dir"] == "sent"]
        assert [e["payload"] for e in events if e["hop"] == hop and e["dir"] == "out"] == received
        assert [e["payload"] for e in events if e["hop"] == hop and e["dir"] == "in"] == sent
        assert len(received) >= 4
    client = [e for e in events if e["hop"] == "client"]
    assert [e["method"] for e in client if e["dir"] == "in" and e["kind"] == "request"] == [
        "initialize", "session/new", "session/prompt", "session/close"]  # the demo agent can


def test_trace_events_are_in_causal_order_with_names_flows_and_sessions(recorded: dict) -> None:
    events = _events(recorded["trace"])
    assert events[0]["type"] == "trace"
    assert [e["seq"] for e in events] == list(range(1, len(events) + 1))
    times = [e["time"] for e in events]
    assert times == sorted(times)
    messages = [e for e in events if e["type"] == "message"]
    seen_in: set[int] = set()
    for e in messages:
        if e["kind"] == "request" and e["dir"] == "in":
            seen_in.add(e["flow"])
        if e["kind"] == "request" and e["dir"] == "out" and e["from"] != "conductor":
            assert e["flow"] in seen_in, e  # forwarded only after it arrived
    prompt_flow = next(e["flow"] for e in messages if e["method"] == "session/prompt")
    hops = [(e["hop"], e["dir"], e["kind"]) for e in messages if e["flow"] == prompt_flow]
    assert hops == [("client", "in", "request"), ("first", "out", "request"),
                    ("first", "in", "request"), ("second", "out", "request"),
                    ("second", "in", "request"), ("agent", "out", "request"),
                    ("agent", "in", "response"), ("second", "out", "response"),
                    ("second", "in", "response"), ("first", "out", "response"),
                    ("first", "in", "response"), ("client", "out", "response")]
    assert {e["client_id"] for e in messages if e["flow"] == prompt_flow} == {3}
    assert all(e["session"] == "demo-session-1" for e in messages
               if e["flow"] == prompt_flow)
    forwarded = next(e for e in messages if e["flow"] == prompt_flow and e["hop"] == "agent")
    assert (forwarded["from"], forwarded["to"]) == ("second", "agent")
    ask = [e for e in messages if e["method"] == "session/request_permission"]
    assert ask[0]["from"] == "agent" and ask[-1]["hop"] == "agent"
    assert ask[-1]["kind"] == "response" and ask[-1]["client_id"] is not None
    life = [(e["component"], e["event"]) for e in events if e["type"] == "lifecycle"]
    for name in ("first", "second", "agent"):
        assert (name, "spawned") in life
        assert (name, "exited") in life
    assert life.count(("agent", "exited")) == 1


def test_a_streamed_update_is_traced_from_the_component_that_sent_it(recorded: dict) -> None:
    messages = [e for e in _events(recorded["trace"]) if e["type"] == "message"]
    updates_to_client = [e for e in messages if e["method"] == "session/update"
                         and e["hop"] == "client" and e["dir"] == "out"]
    assert updates_to_client
    assert {e["from"] for e in updates_to_client} == {"first"}  # not "conductor"


def test_secrets_are_redacted_by_default_and_kept_when_asked(recorded: dict) -> None:
    text = recorded["trace"].read_text(encoding="utf-8")
    assert SECRET not in text
    assert "ticket-4711" not in text
    # the header form is redacted where it appears whole (the demo agent's echo splits it into
    # one chunk per word, which no pattern can recognise)
    assert "Bearer abc.def" not in text
    assert "Authorization: [redacted]" in text
    assert "[redacted]" in text
    for line in text.splitlines():
        json.loads(line)  # still valid JSON after redaction
    raw = recorded["unredacted"].read_text(encoding="utf-8")
    assert SECRET in raw and "ticket-4711" in raw and "Bearer abc.def" in raw


def test_trace_files_are_owner_only(recorded: dict) -> None:
    for name in ("trace", "unredacted"):
        assert stat.S_IMODE(os.stat(recorded[name]).st_mode) == 0o600


def test_trace_show_draws_lanes_pairs_and_durations(recorded: dict) -> None:
    result = conductor("trace", "show", str(recorded["trace"]), "--method", "session/*",
                       env={"COLUMNS": "200"})
    assert result.returncode == 0, result.stderr
    header = result.stdout.splitlines()[0]
    for lane in ("client", "conductor", "first", "second", "agent"):
        assert lane in header
    assert "session/prompt #3 request" in result.stdout
    assert " ms" in result.stdout
    assert "initialize" not in result.stdout
    only_agent = conductor("trace", "show", str(recorded["trace"]), "--component", "agent",
                           "--session", "demo-session-1", env={"COLUMNS": "200"})
    assert only_agent.returncode == 0
    assert "first→second" not in only_agent.stdout
    assert "second→agent" in only_agent.stdout


def test_trace_show_marks_errors(tmp_path: Path) -> None:
    trace = tmp_path / "t.jsonl"
    chain = tmp_path / "bad.toml"
    chain.write_text(f'[agent]\nname = "crashy"\ncommand = ["{sys.executable}", "-c", '
                     '"import sys; sys.stdin.readline(); sys.exit(9)"]\n', encoding="utf-8")
    conductor("--trace", str(trace), "run", "--chain", str(chain), "x")
    result = conductor("trace", "show", str(trace), env={"COLUMNS": "200"})
    assert result.returncode == 0, result.stderr
    assert "error" in result.stdout
    assert "crashy exited" in result.stdout
    assert "code=9" in result.stdout


CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")


# Skipped only outside CI: .ci/run installs chromium, so there its absence is a failure.
@pytest.mark.skipif(CHROMIUM is None and not os.environ.get("CI"),
                    reason="chromium is not installed (.ci/run installs it)")
def test_trace_html_loads_in_headless_chromium_with_lanes_and_messages(recorded: dict,
                                                                       tmp_path: Path) -> None:
    assert CHROMIUM is not None, "CI must have chromium: .ci/run installs it"
    page = tmp_path / "trace.html"
    result = conductor("trace", "html", str(recorded["trace"]), "-o", str(page))
    assert result.returncode == 0, result.stderr
    html = page.read_text(encoding="utf-8")
    assert "http://" not in html.replace("http://www.w3.org/2000/svg", "")
    assert "https://" not in html
    assert CHROMIUM is not None
    dom = subprocess.run(
        [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu",
         "--disable-background-networking", "--disable-component-update", "--disable-sync",
         "--no-first-run", f"--user-data-dir={tmp_path / 'profile'}",
         "--virtual-time-budget=5000", "--dump-dom", page.as_uri()],
        capture_output=True, text=True, timeout=60)
    assert dom.returncode == 0, dom.stderr[-2000:]
    out = dom.stdout
    assert 'data-ready="1"' in out, out[:2000]
    assert 'data-errors="0"' in out
    messages = [e for e in _events(recorded["trace"]) if e["type"] == "message"]
    assert f'data-shown="{len(_events(recorded["trace"])) - 1}"' in out
    assert out.count('class="msg ') == len(messages)
    for lane in ("client", "conductor", "first", "second", "agent"):
        assert f'data-lane="{lane}"' in out
    assert "session/prompt #3" in out
    assert out.count('class="msg error"') == 0


HOSTILE = "<!-- </script> <script>document.body.dataset.errors = 99</script> \u2028 \u2029 &amp;"


def _dump_dom(page: Path, profile: Path) -> str:
    assert CHROMIUM is not None
    dom = subprocess.run(
        [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu",
         "--disable-background-networking", "--disable-component-update", "--disable-sync",
         "--no-first-run", f"--user-data-dir={profile}",
         "--virtual-time-budget=5000", "--dump-dom", page.as_uri()],
        capture_output=True, text=True, timeout=60)
    assert dom.returncode == 0, dom.stderr[-2000:]
    return dom.stdout


@pytest.mark.skipif(CHROMIUM is None and not os.environ.get("CI"),
                    reason="chromium is not installed (.ci/run installs it)")
def test_trace_html_renders_every_event_when_payloads_hold_markup(tmp_path: Path) -> None:
    assert CHROMIUM is not None, "CI must have chromium: .ci/run installs it"
    trace, page = tmp_path / "t.jsonl", tmp_path / "t.html"
    done = conductor("--trace", str(trace), "run", "--chain", str(REPO / "chains" / "demo.toml"),
                     HOSTILE)
    assert done.returncode == 0, done.stderr
    events = _events(trace)
    assert sum(HOSTILE in json.dumps(e, ensure_ascii=False) for e in events) >= 2  # both ways
    done = conductor("trace", "html", str(trace), "-o", str(page))
    assert done.returncode == 0, done.stderr
    html = page.read_text(encoding="utf-8")
    start = html.index('id="trace-data">') + len('id="trace-data">')
    embedded = json.loads(html[start:html.index("</script>", start)])
    # nothing lost or changed on the way into the page (which adds `pair` and `ms`)
    assert len(embedded["events"]) == len(events) - 1
    assert [{k: e[k] for k in o} for e, o in zip(embedded["events"], events[1:], strict=True)
            ] == events[1:]
    out = _dump_dom(page, tmp_path / "profile")
    assert 'data-ready="1"' in out, out[:2000]
    assert 'data-errors="0"' in out
    assert f'data-shown="{len(events) - 1}"' in out
    assert out.count('class="msg ') == sum(e["type"] == "message" for e in events)


def _agent_bound(path: Path, method: str) -> bool:
    """The trace file already holds `method` going out to the agent."""
    if not path.exists():
        return False
    for line in path.read_text(encoding="utf-8").splitlines():
        event = json.loads(line)
        if event.get("hop") == "agent" and event.get("dir") == "out" and \
                event.get("method") == method:
            return True
    return False


async def test_a_hung_agent_s_initialize_reaches_the_trace_file_while_the_conductor_waits(
        tmp_path: Path) -> None:
    import anyio

    from tests.wire_client import open_conductor

    trace = tmp_path / "hang.jsonl"
    # shutdown_grace: at the end, the initialize it never answers is not waited on for 3 s.
    chain = tmp_path / "silent.toml"
    chain.write_text("[conductor]\nshutdown_grace = 0.2\n\n[agent]\ncommand = " +
                     json.dumps([sys.executable, "-c", "import sys\nfor _ in sys.stdin: pass"]) +
                     "\n", encoding="utf-8")
    async with open_conductor("--trace", str(trace), "--chain", str(chain)) as c:
        await c.send({"jsonrpc": "2.0", "id": 0, "method": "initialize",
                      "params": {"protocolVersion": 1, "clientCapabilities": {}}})
        with anyio.fail_after(5):
            # Another process writes the file, and the file is what is under test: poll it.
            while not _agent_bound(trace, "initialize"):  # noqa: ASYNC110
                await anyio.sleep(0.01)
        assert c.process.returncode is None  # seen while the agent still hangs, not at exit


def test_a_trace_event_nested_too_deeply_to_show_is_skipped_not_fatal(tmp_path: Path) -> None:
    from conductor.tracing.view import load_trace

    path = tmp_path / "t.jsonl"
    deep = "[" * 5000 + "]" * 5000
    path.write_text('{"type":"trace","version":1}\n'
                    f'{{"type":"message","seq":1,"time":1.0,"hop":"client","dir":"in",'
                    f'"payload":{deep}}}\n'
                    '{"type":"lifecycle","seq":2,"time":1.0,"component":"agent",'
                    '"event":"spawned"}\n',
                    encoding="utf-8")
    trace = load_trace(path)
    assert [e["seq"] for e in trace.events] == [2]


@pytest.mark.skipif(not os.path.exists("/dev/full"), reason="needs /dev/full")
async def test_a_trace_that_cannot_be_written_stops_tracing_and_the_chain_goes_on(
        caplog: pytest.LogCaptureFixture) -> None:
    # A full disk under the trace is the trace's problem, not the session's.
    import anyio

    from conductor.testing import open_test_chain
    from conductor.tracing.sink import JsonlTraceSink

    with JsonlTraceSink("/dev/full") as sink:
        async with open_test_chain([], tracer=sink) as client:
            with anyio.fail_after(5):
                sid = await client.new_session()
                sink.lifecycle("agent", "exited", code=0)  # written at once: fails at once
                turn = await client.prompt(sid, "still here")
    assert turn.stop_reason == "end_turn"
    [record] = [r for r in caplog.records if "/dev/full" in r.getMessage()]
    assert "No space left on device" in record.getMessage()
    assert "tracing stopped" in record.getMessage()


async def test_messages_of_a_batch_are_traced_as_batch_members_both_ways(tmp_path: Path) -> None:
    import anyio

    from acp_conductor_proxies.passthrough import Passthrough
    from conductor.jsonrpc.message import Notification, Raw
    from conductor.testing import open_test_chain
    from conductor.tracing.sink import JsonlTraceSink

    path = tmp_path / "t.jsonl"
    with JsonlTraceSink(path) as sink:
        async with open_test_chain([Passthrough()], tracer=sink) as client:
            endpoint = client.endpoint
            assert endpoint is not None
            with anyio.fail_after(5):
                a, first = endpoint.open_request("_ext/a", Raw(b"{}"))
                b, second = endpoint.open_request("_ext/b", Raw(b"{}"))
                await endpoint.sink.send([first, Notification(method="_ext/note"), second])
                await endpoint.wait(a)
                await endpoint.wait(b)
    on_client = [e for e in _events(path) if e["type"] == "message" and e["hop"] == "client"]
    flagged = [(e["dir"], e["kind"], e["method"]) for e in on_client if e.get("batch")]
    assert flagged == [("in", "request", "_ext/a"), ("in", "notification", "_ext/note"),
                       ("in", "request", "_ext/b"), ("out", "error", "_ext/a"),
                       ("out", "error", "_ext/b")]
    assert not any(e.get("batch") for e in on_client if e["method"] == "initialize")
