"""Trace redaction sees what a reader of the trace sees: decoded JSON strings, whatever
escapes the sender used. The wire itself is never changed."""

from __future__ import annotations

import json
import os
import re
import tempfile
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st
from msgspec import Raw

from conductor.bridge import TOKEN_ENV
from conductor.jsonrpc.message import Message, Request, decode, int_id
from conductor.tracing.redact import REDACTED, Redactor
from conductor.tracing.sink import JsonlTraceSink

SHORT = {'"': '\\"', "\\": "\\\\", "/": "\\/", "\b": "\\b", "\f": "\\f", "\n": "\\n",
         "\r": "\\r", "\t": "\\t"}
TEXT = st.characters(blacklist_categories=("Cs",))  # lone surrogates are not text


@st.composite
def spelled(draw: st.DrawFn, text: str) -> str:
    """`text` as a JSON string literal, each character spelled any way JSON allows."""
    out = []
    for ch in text:
        cp = ord(ch)
        ways = [ch] if ch not in '"\\' and cp >= 0x20 else []
        if ch in SHORT:
            ways.append(SHORT[ch])
        if cp < 0x10000:
            ways += [f"\\u{cp:04x}", f"\\u{cp:04X}"]
        else:
            hi, lo = 0xD800 + ((cp - 0x10000) >> 10), 0xDC00 + ((cp - 0x10000) & 0x3FF)
            ways.append(f"\\u{hi:04x}\\u{lo:04x}")
        out.append(draw(st.sampled_from(ways)))
    return '"' + "".join(out) + '"'


def _traced(frame: str, redactor: Redactor) -> list[Any]:
    """The trace lines the sink writes for one message from the agent, decoded."""
    message = decode(frame.encode())
    assert isinstance(message, Message)
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "t.jsonl"
        with JsonlTraceSink(path, redactor=redactor) as sink:
            sink.message("agent", "in", message)
        lines = path.read_bytes().splitlines()
    return [json.loads(line) for line in lines]


def _strings(value: Any) -> list[str]:
    """Every string a reader of the decoded JSON sees: values and keys."""
    if isinstance(value, str):
        return [value]
    if isinstance(value, list):
        return [s for v in value for s in _strings(v)]
    if isinstance(value, dict):
        return [s for k, v in value.items() for s in (k, *_strings(v))]
    return []


def _update(text: str, key: str) -> str:
    return ('{"jsonrpc":"2.0","method":"session/update","params":{"sessionId":"s",'
            '"update":{"sessionUpdate":"agent_message_chunk","content":{"type":"text",'
            f'"text":{text}}}}},"_meta":{{{key}:1}}}}}}')


@settings(max_examples=300, suppress_health_check=[HealthCheck.too_slow])
@given(secret=st.text(TEXT, min_size=4, max_size=12), before=st.text(TEXT, max_size=6),
       after=st.text(TEXT, max_size=6), data=st.data())
def test_a_secret_is_never_readable_in_the_trace_however_it_is_escaped(
        secret: str, before: str, after: str, data: st.DataObject) -> None:
    # A secret with brackets could be re-formed around the marker; one inside it is the marker.
    assume("[" not in secret and "]" not in secret and secret not in REDACTED)
    text = data.draw(spelled(before + secret + after))
    key = data.draw(spelled(secret))
    for event in _traced(_update(text, key), Redactor([secret])):
        for s in _strings(event):
            assert secret not in s, (secret, s)


@settings(max_examples=200, suppress_health_check=[HealthCheck.too_slow])
@given(token=st.from_regex(r"sk-[A-Za-z0-9]{20,30}", fullmatch=True),
       before=st.text(TEXT, max_size=6), after=st.text(TEXT, max_size=6), data=st.data())
def test_a_pattern_match_is_never_readable_in_the_trace_however_it_is_escaped(
        token: str, before: str, after: str, data: st.DataObject) -> None:
    pattern = r"sk-[A-Za-z0-9]{20,}"
    text = data.draw(spelled(before + token + after))
    for event in _traced(_update(text, '"k"'), Redactor(patterns=[pattern])):
        for s in _strings(event):
            assert not re.search(pattern, s), s


def test_redaction_changes_the_trace_copy_only_never_the_message() -> None:
    frame = _update('"key \\u0073k-0123456789abcdefghijXYZ"', '"k"').encode()
    message = decode(frame)
    assert isinstance(message, Message)
    events = _traced(frame.decode(), Redactor(patterns=[r"sk-[A-Za-z0-9]{20,}"]))
    assert events[1]["payload"]["params"]["update"]["content"]["text"] == f"key {REDACTED}"
    assert bytes(message.params) in frame  # what goes on the wire keeps its exact bytes


def test_a_line_without_escapes_is_redacted_byte_for_byte_in_place() -> None:
    line = b'{"seq":1,"payload":{"text":"a sk-0123456789abcdefghij b","n":1e2}}'
    assert Redactor(patterns=[r"sk-[A-Za-z0-9]{20,}"])(line) == \
        b'{"seq":1,"payload":{"text":"a [redacted] b","n":1e2}}'


TOKEN = b'"\\u0073k-0123456789abcdefghij"'


@pytest.mark.parametrize("params", [b"[" * 5000 + TOKEN + b"]" * 5000,
                                    b"[1e400," + TOKEN + b"]"], ids=["deep", "huge-number"])
def test_an_escaped_payload_that_cannot_be_decoded_is_left_out_of_the_trace_not_leaked(
        params: bytes) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "t.jsonl"
        with JsonlTraceSink(path, redactor=Redactor(patterns=[r"sk-[A-Za-z0-9]{20,}"])) as sink:
            sink.message("agent", "in", Request(id=int_id(1), method="_x/deep", params=Raw(params)))
            sink.lifecycle("agent", "stderr", line="still tracing")
        written = path.read_bytes()
    assert b"0123456789abcdefghij" not in written
    events = [json.loads(line) for line in written.splitlines()]
    assert events[1]["method"] == "_x/deep" and isinstance(events[1]["payload"], str)
    assert events[2]["line"] == "still tracing"


def test_a_secret_that_also_spells_json_outside_a_string_leaves_the_line_valid() -> None:
    # "true" and "1234" occur outside strings in most trace lines (flags, numbers, seq).
    line = b'{"seq":1234,"ok":true,"payload":{"text":"pin 1234 is true","n":1e2}}'
    out = Redactor(["1234", "true"])(line)
    assert json.loads(out) == {"seq": 1234, "ok": True,
                               "payload": {"text": f"pin {REDACTED} is {REDACTED}", "n": 100}}
    assert b'"n":1e2' in out  # a number's spelling survives the byte-for-byte path


@pytest.mark.parametrize("escaped", [False, True], ids=["plain", "escaped"])
def test_the_mcp_bridges_shim_token_never_reaches_the_trace(escaped: bool) -> None:
    # The stdio bridge hands the agent its token in the server's env: as secret as the
    # http bridge's Authorization header, which is redacted.
    token = "gJ1aASXuzSUO6n29AO9v7giDLjGmmmf5uehWKu_D-fc"
    server = {"name": "docs", "command": "python", "args": ["-m", "conductor", "mcp-shim", "k"],
              "env": [{"name": "ACP_CONDUCTOR_MCP_SOCKET", "value": "/tmp/x/bridge.sock"},
                      {"name": TOKEN_ENV, "value": token}]}
    line = json.dumps({"payload": {"params": {"cwd": "/\\" if escaped else "/",
                                              "mcpServers": [server]}}},
                      separators=(",", ":")).encode()
    out = Redactor()(line)
    assert token.encode() not in out
    assert json.loads(out)["payload"]["params"]["mcpServers"][0]["env"][1] == {
        "name": TOKEN_ENV, "value": REDACTED}


@pytest.mark.parametrize("escaped", [False, True], ids=["plain", "escaped"])
def test_a_session_setups_mcp_server_env_and_header_values_never_reach_the_trace(
        escaped: bool) -> None:
    # What the editor declares, and what `[[mcp_server]]` injects, holds tokens under any
    # name: every value is hidden, every name kept, so the trace says what was hidden.
    # (An object of them too, as v1's terminal auth method `env` is.)
    servers = [{"name": "gh", "command": "/usr/bin/gh-mcp", "args": [],
                "env": [{"name": "GITHUB_TOKEN", "value": "ghp_s3cretvalue"}],
                "_meta": {"env": {"GITLAB_TOKEN": "glpat-s3cret", "depth": 2}}},
               {"type": "http", "name": "search", "url": "https://x/mcp",
                "headers": [{"value": "k3y-v4lue", "name": "X-Api-Key"}]}]
    params = {"cwd": "/\\" if escaped else "/", "mcpServers": servers}
    frame = json.dumps({"jsonrpc": "2.0", "id": 1, "method": "session/new", "params": params})
    events = _traced(frame, Redactor())
    text = json.dumps(events)
    assert "ghp_s3cretvalue" not in text and "k3y-v4lue" not in text and "glpat" not in text
    traced = events[1]["payload"]["params"]["mcpServers"]
    assert traced[0]["env"] == [{"name": "GITHUB_TOKEN", "value": REDACTED}]
    assert traced[0]["_meta"]["env"] == {"GITLAB_TOKEN": REDACTED, "depth": 2}
    assert traced[1]["headers"] == [{"value": REDACTED, "name": "X-Api-Key"}]
    assert traced[1]["url"] == "https://x/mcp" and events[1]["method"] == "session/new"


@pytest.mark.parametrize("escaped", [False, True], ids=["plain", "escaped"])
def test_a_urls_credentials_never_reach_the_trace_its_host_path_and_other_parameters_do(
        escaped: bool) -> None:
    # An MCP server's url, a git remote in a tool's output: tokens ride in URLs too.
    server = {"type": "http", "name": "docs", "headers": [],
              "url": "https://bob:s3cr3tpw@mcp.example/v1?access_token=tok123abc&mode=ro"}
    output = "cloning https://x-access-token:ghs_t0ken@github.com/o/r.git\n"
    params = {"cwd": "/\\" if escaped else "/", "mcpServers": [server], "note": output}
    frame = json.dumps({"jsonrpc": "2.0", "id": 1, "method": "session/new", "params": params},
                       ensure_ascii=False)
    text = json.dumps(_traced(frame, Redactor()))
    for secret in ("bob", "s3cr3tpw", "tok123abc", "x-access-token", "ghs_t0ken"):
        assert secret not in text
    assert f"https://{REDACTED}@mcp.example/v1?access_token={REDACTED}&mode=ro" in text
    assert f"https://{REDACTED}@github.com/o/r.git" in text


def test_a_variable_named_like_a_credential_is_redacted_wherever_the_chain_file_uses_it(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # `${GH_TOKEN}` in an MCP server's args reaches the trace in every session/new, and in
    # a command in its `spawned` argv: secret_env covers only what its author listed.
    from conductor.config import load_chain, trace_redactor

    monkeypatch.setenv("GH_TOKEN", "ghp_fromtheenv123")
    monkeypatch.setenv("DB_PASSWORD", "hunter2hunter2")
    monkeypatch.setenv("GIT_AUTHOR_NAME", "Ada Lovelace")
    monkeypatch.setenv("PWD", "/work/some/project")
    # named so by a word, not a part of one: these were blanked wherever "4096" or
    # "false" appeared in the trace (a short value of a credential's name still is not)
    monkeypatch.setenv("MAX_TOKENS", "4096")
    monkeypatch.setenv("TOKENIZERS_PARALLELISM", "false")
    monkeypatch.setenv("API_TOKEN2", "hunter2")
    chain = tmp_path / "chain.toml"
    chain.write_text(
        '[agent]\ncommand = ["agent", "--author", "${GIT_AUTHOR_NAME}", '
        '"--db", "${DB_URL:-postgres://${DB_PASSWORD}@h}", "--max", "${MAX_TOKENS}", '
        '"${TOKENIZERS_PARALLELISM}", "${API_TOKEN2}"]\n\n'
        '[[mcp_server]]\nname = "gh"\ncommand = "/bin/gh-mcp"\n'
        'args = ["--token", "${GH_TOKEN}", "--home", "${HOME}", "--in", "${PWD}"]\n',
        encoding="utf-8")
    redactor = trace_redactor(load_chain(str(chain)))
    assert redactor is not None
    args = ["--token", "ghp_fromtheenv123", "--home", os.environ["HOME"], "--in",
            "/work/some/project"]
    frame = json.dumps({"jsonrpc": "2.0", "id": 1, "method": "session/new", "params": {
        "cwd": "/", "mcpServers": [{"name": "gh", "command": "/bin/gh-mcp", "args": args,
                                    "env": []}]}})
    events = _traced(frame, redactor)
    assert events[1]["payload"]["params"]["mcpServers"][0]["args"] == [
        "--token", REDACTED, *args[2:]]
    line = b'{"argv":["agent","--author","Ada Lovelace","--db","hunter2hunter2","4096 false",' \
        b'"hunter2"]}'
    assert json.loads(redactor(line))["argv"] == ["agent", "--author", "Ada Lovelace", "--db",
                                                  REDACTED, "4096 false", REDACTED]


def test_a_pattern_that_could_run_past_a_strings_end_leaves_the_line_valid() -> None:
    # `\S+` also matches the closing quote of the string it starts in: the trace line must
    # stay JSON, or `trace show` refuses the whole file.
    frame = _update('"login password=hunter2"', '"k"')
    events = _traced(frame, Redactor(patterns=[r"password=\S+"]))
    assert events[1]["payload"]["params"]["update"]["content"]["text"] == \
        f"login {REDACTED}"
    assert events[1]["method"] == "session/update"



@pytest.mark.parametrize("entry", [
    '{"value":"Bearer abc123","name":"Authorization"}',
    '{"name":"authorization","_meta":{"x":1},"value":"Bearer abc123"}',
    '{"value":"abc123abc","name":"ACP_CONDUCTOR_MCP_TOKEN"}',
], ids=["value-first", "meta-between", "shim-token-value-first"])
def test_a_secret_name_value_entry_is_redacted_whatever_the_order_of_its_fields(
        entry: str) -> None:
    # JSON objects are unordered: an editor may send a header's value before its name.
    line = ('{"payload":{"params":{"mcpServers":[{"name":"docs","type":"http",'
            f'"url":"http://x","headers":[{entry}],"env":[{entry}]}}]}}}}}}').encode()
    out = Redactor()(line)
    assert b"abc123" not in out
    server = json.loads(out)["payload"]["params"]["mcpServers"][0]
    assert server["headers"][0]["value"] == REDACTED and server["env"][0]["value"] == REDACTED
    assert server["name"] == "docs"


@pytest.mark.parametrize("escaped", [False, True], ids=["plain", "escaped"])
@pytest.mark.parametrize("pattern", [r"^ghp_[A-Za-z0-9]{36}$", r"\Aghp_[A-Za-z0-9]{36}\Z",
                                     r"(?<!\w)ghp_[A-Za-z0-9]{36}(?![\w\"])"])
def test_a_pattern_tied_to_where_a_string_starts_or_ends_hides_it_in_any_line(
        pattern: str, escaped: bool) -> None:
    # Patterns are matched against each decoded string, escaped line or not: `^...$` (a
    # whole-string token) must not depend on a backslash elsewhere in the line.
    token = "ghp_" + "a1B2c3D4" * 4 + "zZ9x"
    frame = _update(json.dumps(token), '"k\\n"' if escaped else '"k"')
    events = _traced(frame, Redactor(patterns=[pattern]))
    assert token[4:] not in json.dumps(events)


@pytest.mark.parametrize("pattern", [r"(?u)sk-\w{8,}", r"sk-\N{DIGIT ONE}{8,}"])
def test_any_pattern_the_config_accepts_redacts_and_never_crashes_the_trace(
        pattern: str) -> None:
    # `[conductor] redact` is checked as a Python regex; the trace must take the same ones.
    frame = _update('"key sk-1111111111 and sk-11111111"', '"k"')
    events = _traced(frame, Redactor(patterns=[pattern]))
    assert events[1]["payload"]["params"]["update"]["content"]["text"] == \
        f"key {REDACTED} and {REDACTED}"


def test_a_secret_env_value_with_a_final_newline_is_still_redacted() -> None:
    # A value read from a file keeps its newline; the token the agent sends has none
    # (the redact proxy strips it the same way).
    frame = _update('"using sk-live-0123456789"', '"k"')
    events = _traced(frame, Redactor(["sk-live-0123456789\n"]))
    assert "0123456789" not in json.dumps(events)


@pytest.mark.parametrize("escaped", [False, True], ids=["plain", "escaped"])
def test_secrets_that_overlap_are_all_hidden_none_breaks_another_up(escaped: bool) -> None:
    # A PIN inside an API key must not cut the key's match short; two values that overlap
    # must not leave the second one's tail.
    redactor = Redactor(["4242", "abcdefgh", "efghijkl"], [r"sk-[A-Za-z0-9]{20,}"])
    text = "key sk-Zq4242Xv9Lm3Np8Rt5Wy2Bc7 and abcdefghijkl"
    frame = _update(json.dumps(text), '"k\\n"' if escaped else '"k"')
    events = _traced(frame, redactor)
    assert events[1]["payload"]["params"]["update"]["content"]["text"] == \
        f"key {REDACTED} and {REDACTED}"


def test_a_message_with_an_out_of_range_id_and_an_escape_elsewhere_is_traced_not_fatal() -> None:
    # The id is copied into the event beside the payload: leaving the payload out did not
    # make the line decodable, and the sink's ValueError ended the conductor.
    frame = (b'{"jsonrpc":"2.0","id":1e400,"method":"_x/a\\nb",'
             b'"params":{"k":"sk-0123456789abcdefghij"}}')
    message = decode(frame)
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "t.jsonl"
        with JsonlTraceSink(path, redactor=Redactor(patterns=[r"sk-[A-Za-z0-9]{20,}"])) as sink:
            sink.message("client", "in", message)  # type: ignore[arg-type]
            sink.lifecycle("agent", "stderr", line="still tracing")
        written = path.read_bytes()
    assert b"0123456789abcdefghij" not in written
    events = [json.loads(line) for line in written.splitlines()]
    assert events[1]["method"] == "_x/a\nb" and events[1]["id"] == "1e400"
    assert isinstance(events[1]["payload"], str)
    assert events[2]["line"] == "still tracing"


@pytest.mark.parametrize("text", [
    '{"headers": {"Authorization": "Bearer abc123secret"}}',
    '{"authorization":"abc123secret"}',
    "> GET / HTTP/1.1\n> Authorization: Bearer abc123secret\n",
])
def test_an_authorization_value_in_json_text_inside_a_string_never_reaches_the_trace(
        text: str) -> None:
    # A tool's output that is itself JSON (a request dump) holds the header as escaped
    # quotes in the line: `\"Authorization\":\"...\"` matched neither the key nor the text form.
    frame = _update(json.dumps(text), '"k"')
    events = _traced(frame, Redactor())
    assert "abc123secret" not in json.dumps(events)
    assert "Authorization" in events[1]["payload"]["params"]["update"]["content"]["text"] or \
        "authorization" in events[1]["payload"]["params"]["update"]["content"]["text"]
