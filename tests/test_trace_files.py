"""`trace show` / `trace html` on files a user really has: cut off mid-write, empty, from
another version, with a redacted error payload. Each gets events or a message naming the
file and what is wrong, never an internal error."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING

import pytest
from click.testing import CliRunner

from conductor.cli.trace import trace_group

if TYPE_CHECKING:
    from pathlib import Path

HEADER = '{"seq":1,"time":100.0,"type":"trace","version":1,"redacted":true,"pid":1}\n'
REQUEST = ('{"seq":2,"time":100.1,"type":"message","hop":"client","dir":"in","from":"client",'
           '"to":"conductor","kind":"request","method":"initialize","id":1,"flow":1,'
           '"payload":{"jsonrpc":"2.0","id":1,"method":"initialize","params":{}}}\n')


def trace_file(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "trace.jsonl"
    path.write_text(text, encoding="utf-8")
    return path


@pytest.mark.parametrize("command", [["show"], ["show", "--pending"], ["html", "-o", "x.html"]])
def test_a_trace_cut_off_mid_line_shows_the_events_before_it_and_says_so(
        tmp_path: Path, command: list[str], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    path = trace_file(tmp_path, HEADER + REQUEST + REQUEST[:40])
    done = CliRunner().invoke(trace_group, [command[0], str(path), *command[1:]])
    assert done.exit_code == 0, done.output
    assert "line 3 is incomplete" in done.stderr and str(path) in done.stderr
    assert "line 3" not in done.stdout
    if command == ["show", "--pending"]:
        assert "1 of 1 requests never got an answer" in done.stdout


@pytest.mark.parametrize("broken", [REQUEST[:40].encode(), b'{"n":1e400,"s":"\xff"}'],
                         ids=["cut", "huge-number-then-not-utf8"])
def test_a_line_that_is_not_json_in_the_middle_is_still_refused(
        tmp_path: Path, broken: bytes) -> None:
    path = tmp_path / "trace.jsonl"
    path.write_bytes(HEADER.encode() + broken + b"\n" + REQUEST.encode())
    done = CliRunner().invoke(trace_group, ["show", str(path)])
    assert done.exit_code == 2
    assert "line 2 is not JSON" in done.stderr


@pytest.mark.parametrize("command", [["show"], ["show", "--pending"], ["html", "-o", "x.html"]])
def test_a_trace_of_another_format_version_is_refused_naming_both_versions(
        tmp_path: Path, command: list[str], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    path = trace_file(tmp_path, HEADER.replace('"version":1', '"version":2') +
                      '{"seq":2,"t":1.5,"type":"message","connection":"client"}\n')
    done = CliRunner().invoke(trace_group, [command[0], str(path), *command[1:]])
    assert done.exit_code == 2, done.output
    assert "trace format version 2; this acp-conductor reads version 1" in done.stderr
    assert "internal error" not in done.stderr
    assert not (tmp_path / "x.html").exists()


@pytest.mark.parametrize("command", [["show"], ["show", "--pending"], ["html", "-o", "x.html"]])
def test_an_event_without_the_fields_a_trace_has_is_refused_naming_line_and_field(
        tmp_path: Path, command: list[str], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    path = trace_file(tmp_path, HEADER + REQUEST.replace('"hop":"client",', ""))
    done = CliRunner().invoke(trace_group, [command[0], str(path), *command[1:]])
    assert done.exit_code == 2, done.output
    assert "line 2: a 'message' event without a valid 'hop'" in done.stderr
    assert "internal error" not in done.stderr


@pytest.mark.parametrize("text", ["", "\n\n", "[1, 2, 3]\n"])
def test_a_file_with_no_trace_events_is_refused_not_shown_as_all_answered(
        tmp_path: Path, text: str) -> None:
    path = trace_file(tmp_path, text)
    done = CliRunner().invoke(trace_group, ["show", str(path), "--pending"])
    assert done.exit_code == 2
    assert "no trace events in it" in done.stderr
    assert "every request was answered" not in done.stdout


def test_an_error_whose_payload_redaction_left_out_is_shown(tmp_path: Path) -> None:
    error = ('{"seq":3,"time":100.2,"type":"message","hop":"client","dir":"out",'
             '"from":"conductor","to":"client","kind":"error","method":"initialize","id":1,'
             '"flow":1,"payload":"[redacted] (nested too deeply to check)"}\n')
    path = trace_file(tmp_path, HEADER + REQUEST + error)
    done = CliRunner().invoke(trace_group, ["show", str(path)], env={"COLUMNS": "200"})
    assert done.exit_code == 0, done.stderr
    assert "initialize #1 error" in done.stdout


@pytest.mark.parametrize("command", [["show"], ["show", "--pending"]])
def test_terminal_control_sequences_a_component_wrote_are_shown_not_obeyed(
        tmp_path: Path, command: list[str]) -> None:
    # A component's stderr, a method name or an id is the component's text: an ESC in it
    # must not clear the reader's screen, set its title or write its clipboard (OSC 52).
    esc = "\x1b]52;c;cm0gLXJmIH4=\x07\x1b[2J"
    stderr = ('{"seq":2,"time":100.1,"type":"lifecycle","component":"agent","event":"stderr",'
              f'"line":{json.dumps("boom " + esc)}}}\n')
    request = REQUEST.replace('"initialize","id":1', f'"init{json.dumps(esc)[1:-1]}","id":1')
    path = trace_file(tmp_path, HEADER + stderr + request.replace('"seq":2', '"seq":3'))
    done = CliRunner().invoke(trace_group, [command[0], str(path), *command[1:]])
    assert done.exit_code == 0, done.output
    assert "\x1b" not in done.stdout and "\x07" not in done.stdout
    assert "init" in done.stdout


LIFECYCLE = '{"seq":2,"time":100.1,"type":"lifecycle","component":"agent","event":"spawned"}\n'


@pytest.mark.parametrize(("text", "field"), [
    (HEADER + LIFECYCLE.replace('"component":"agent",', ""), "component"),
    (HEADER + LIFECYCLE.replace('"agent"', '["agent"]'), "component"),
    (HEADER + REQUEST.replace('"flow":1', '"flow":[1]'), "flow"),
    (HEADER + REQUEST.replace('"kind":"request"', '"kind":["request"]'), "kind"),
    (HEADER.replace('"time":100.0', '"time":"noon"') + LIFECYCLE, "time"),
], ids=["lifecycle-without-component", "component-not-a-name", "flow-not-a-number",
        "kind-not-a-name", "header-time-not-a-number"])
@pytest.mark.parametrize("command", [["show"], ["show", "--pending"], ["html", "-o", "x.html"]])
def test_an_event_with_a_field_of_the_wrong_shape_is_refused_naming_it_not_an_internal_error(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, text: str, field: str,
        command: list[str]) -> None:
    monkeypatch.chdir(tmp_path)
    path = trace_file(tmp_path, text)
    done = CliRunner().invoke(trace_group, [command[0], str(path), *command[1:]])
    assert done.exit_code == 2, done.output
    assert "internal error" not in done.stderr
    assert repr(field) in done.stderr and str(path) in done.stderr


def test_the_pages_close_button_reads_a_cross_not_an_escape(tmp_path: Path,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    from html.parser import HTMLParser

    monkeypatch.chdir(tmp_path)
    done = CliRunner().invoke(trace_group, ["html", str(trace_file(tmp_path, HEADER + REQUEST)),
                                            "-o", "x.html"])
    assert done.exit_code == 0, done.output

    texts: list[str] = []

    class Buttons(HTMLParser):
        inside = False

        def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
            self.inside = tag == "button"

        def handle_data(self, data: str) -> None:
            if self.inside:
                texts.append(data)
                self.inside = False

    parser = Buttons()
    parser.feed((tmp_path / "x.html").read_text(encoding="utf-8"))
    assert texts == ["\u00d7"]


def test_trace_html_given_the_trace_itself_as_output_is_refused_and_the_trace_kept(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = trace_file(tmp_path, HEADER + REQUEST)
    monkeypatch.chdir(tmp_path)
    done = CliRunner().invoke(trace_group, ["html", str(path), "-o", path.name])
    assert done.exit_code == 2
    assert f"--output: {path.name} is the trace it reads" in done.stderr
    assert path.read_text(encoding="utf-8") == HEADER + REQUEST


@pytest.mark.parametrize("frame", [
    b'{"jsonrpc":"2.0","id":7,"method":"_x/crlf","params":{"a":\r\n1}}',
    b'{"jsonrpc":"2.0","id":7,"method":"_x/huge","params":{"n":1e400}}',
    b'{"jsonrpc":"2.0","id":1e400,"method":"_x/huge-id","params":{}}',
    b'{"jsonrpc":"2.0","id":7,"method":"_x/long","params":{"n":1' + b"0" * 5000 + b'}}',
], ids=["cr-between-tokens", "huge-number", "huge-id", "5000-digit-integer"])
@pytest.mark.parametrize("redacted", [False, True], ids=["unredacted", "redacted"])
def test_a_message_with_a_cr_or_an_out_of_range_number_shows_in_the_trace_with_what_follows(
        tmp_path: Path, frame: bytes, redacted: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    # A component's frame is traced as sent: one such message made the whole trace "not
    # JSON" to `trace show` and `trace html`.
    from conductor.jsonrpc.message import Message, decode
    from conductor.tracing.redact import Redactor
    from conductor.tracing.sink import JsonlTraceSink

    message = decode(frame.replace(b"\n", b""))  # as the agent's stdout frames it
    assert isinstance(message, Message)
    path = tmp_path / "trace.jsonl"
    with JsonlTraceSink(path, redactor=Redactor() if redacted else None) as sink:
        sink.message("agent", "in", message)
        sink.lifecycle("agent", "stderr", line="still here")
    done = CliRunner().invoke(trace_group, ["show", str(path)])
    assert done.exit_code == 0, done.output
    method = json.loads(frame.replace(b"1e400", b"1").replace(b"0" * 5000, b""))["method"]
    assert method in done.stdout and "still here" in done.stdout
    assert "#7" in done.stdout if b'"id":7' in frame else "#1e400" in done.stdout
    monkeypatch.chdir(tmp_path)
    done = CliRunner().invoke(trace_group, ["html", str(path), "-o", "page.html"])
    assert done.exit_code == 0, done.output
    assert "(2 events)" in done.stderr


@pytest.mark.parametrize("shareable", [False, True])
def test_a_page_of_an_unredacted_trace_is_written_with_a_warning_that_it_holds_secrets(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, shareable: bool) -> None:
    path = trace_file(tmp_path, HEADER.replace('"redacted":true', '"redacted":false') + REQUEST)
    monkeypatch.chdir(tmp_path)
    done = CliRunner().invoke(trace_group, ["html", str(path), "-o", "page.html",
                                            *(["--shareable"] if shareable else [])])
    assert done.exit_code == 0, done.output
    assert "written with --trace-unredacted: page.html holds every secret" in done.stderr
    assert ("readable by everyone" in done.stderr) == shareable
    redacted = trace_file(tmp_path, HEADER + REQUEST)
    done = CliRunner().invoke(trace_group, ["html", str(redacted), "-o", "page.html"])
    assert "warning" not in done.stderr


@pytest.mark.parametrize("command", [["show"], ["show", "--pending"], ["html", "-o", "x.html"]])
def test_a_trace_that_misses_events_says_so_where_it_is_read(
        tmp_path: Path, command: list[str], monkeypatch: pytest.MonkeyPatch) -> None:
    # Its pipe's reader fell behind (docs/tracing.md): an answer may be among them.
    dropped = ('{"seq":9,"time":100.2,"type":"lifecycle","component":"conductor",'
               '"event":"trace-dropped","count":6}\n')
    path = trace_file(tmp_path, HEADER + REQUEST + dropped)
    monkeypatch.chdir(tmp_path)
    done = CliRunner().invoke(trace_group, [command[0], str(path), *command[1:]])
    assert done.exit_code == 0, done.output
    assert f"{path} misses 6 events (its reader fell behind)" in done.stderr
