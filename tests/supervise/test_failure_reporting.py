"""A component's failure is said once: in the answers it fails when the client has
requests open (run/check/call report those), else in the log (docs/run.md)."""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING

import anyio
import pytest

from conductor.config import parse_chain
from conductor.jsonrpc.message import Notification, Request, Response, raw
from conductor.serve import RunOptions, serve_connection
from conductor.transport.memory import message_pipe

if TYPE_CHECKING:
    from pathlib import Path

    from conductor.config import ChainConfig
    from conductor.jsonrpc.message import Message

# Answers initialize, answers `_ask`, and exits with status 7 on `_die` (a request or a
# notification).
_AGENT = """
import json, sys
for line in sys.stdin:
    msg = json.loads(line)
    if msg.get("method") == "_die":
        raise SystemExit(7)
    if "id" in msg:
        print(json.dumps({"jsonrpc": "2.0", "id": msg["id"],
                          "result": {"protocolVersion": 1, "agentCapabilities": {}}}),
              flush=True)
"""


@pytest.mark.parametrize("open_request", [False, True])
async def test_a_failure_no_open_request_will_report_is_logged_for_the_user(
        open_request: bool, caplog: pytest.LogCaptureFixture) -> None:
    config = parse_chain({"agent": {"name": "dier", "command": [sys.executable, "-c", _AGENT]}},
                         file="<test>")
    to_chain, chain_reads = message_pipe()
    from_chain, editor_reads = message_pipe(1 << 16)
    answers: list[Message] = []
    initialized = anyio.Event()

    async def read(item: object) -> None:
        answers.append(item)  # type: ignore[arg-type]
        initialized.set()

    async def editor() -> None:
        await to_chain.send(Request(id=raw(1), method="initialize",
                                    params=raw({"protocolVersion": 1})))
        await initialized.wait()
        if open_request:
            await to_chain.send(Request(id=raw(2), method="_die", params=raw({})))
        else:
            await to_chain.send(Notification(method="_die", params=raw({})))

    with anyio.fail_after(20):
        async with anyio.create_task_group() as tg:
            tg.start_soon(editor)
            tg.start_soon(editor_reads.serve, read)
            await serve_connection(config, from_chain, chain_reads,
                                   RunOptions(handle_signals=False))
            await to_chain.aclose()
            tg.cancel_scope.cancel()
    [record] = [r for r in caplog.records if "exited with status 7" in r.getMessage()
                and r.name.startswith("acp_conductor") and r.levelname == "ERROR"]
    # Marked for the client (shown by run/check/call only at debug) only when an answer
    # will say it: with nothing open, nobody else would.
    assert getattr(record, "reaches_client", False) is open_request
    if open_request:
        [failed] = [m for m in answers if isinstance(m, Response) and bytes(m.id) == b"2"]
        assert "exited with status 7" in str(failed.error_value())


async def initialize_answer(config: ChainConfig) -> Response:
    """The answer to an editor's initialize that starts (or fails to start) `config`."""
    to_chain, chain_reads = message_pipe()
    from_chain, editor_reads = message_pipe(1 << 16)
    answers: list[Message] = []

    async def read(item: object) -> None:
        answers.append(item)  # type: ignore[arg-type]

    with anyio.fail_after(20):
        async with anyio.create_task_group() as tg:
            tg.start_soon(editor_reads.serve, read)
            await to_chain.send(Request(id=raw(1), method="initialize",
                                        params=raw({"protocolVersion": 1})))
            await serve_connection(config, from_chain, chain_reads,
                                   RunOptions(handle_signals=False))
            await to_chain.aclose()
            tg.cancel_scope.cancel()
    [answer] = [m for m in answers if isinstance(m, Response) and bytes(m.id) == b"1"]
    return answer


async def test_a_component_that_cannot_start_is_said_once_in_the_initialize_answer(
        caplog: pytest.LogCaptureFixture) -> None:
    # The editor's initialize is what starts the chain, and it is answered with the start
    # failure: run/check/call report that answer, so the log line is theirs to hide.
    config = parse_chain({"agent": {"name": "missing",
                                    "command": ["acp-conductor-no-such-program"]}},
                         file="<test>")
    failed = await initialize_answer(config)
    assert "not found" in str(failed.error_value())
    [record] = [r for r in caplog.records if "not found" in r.getMessage()
                and r.name.startswith("acp_conductor") and r.levelname == "ERROR"]
    assert getattr(record, "reaches_client", False) is True


async def test_a_plugin_whose_chain_started_fails_is_said_once_in_the_initialize_answer(
        caplog: pytest.LogCaptureFixture, tmp_path: Path) -> None:
    # docs/run.md: a component that cannot start is said once; the proxy's own line for it
    # ("proxy bad failed handling chain_started") is left to run/check/call, like the
    # conductor's.
    (tmp_path / "bad.py").write_text(
        "from conductor.plugins import Proxy\n"
        "class Bad(Proxy):\n"
        "    async def chain_started(self) -> None:\n"
        "        raise RuntimeError('db unreachable')\n", encoding="utf-8")
    config = parse_chain({"proxy": [{"plugin": "bad.py:Bad"}],
                          "agent": {"command": [sys.executable, "-c", _AGENT]}},
                         file=str(tmp_path / "c.toml"), base_dir=str(tmp_path))
    failed = await initialize_answer(config)
    assert "db unreachable" in str(failed.error_value())
    records = [r for r in caplog.records if "db unreachable" in r.getMessage()
               and r.levelname == "ERROR"]
    assert records, "the failure is logged"
    assert all(getattr(r, "reaches_client", False) for r in records), \
        [(r.name, r.getMessage()) for r in records]


async def test_a_plugin_whose_session_opened_fails_is_said_once_in_the_setup_answer(
        caplog: pytest.LogCaptureFixture, tmp_path: Path) -> None:
    # The first proxy's session_opened raising answers the editor's session/new with an
    # error naming it (docs/writing-a-proxy.md): run/check/call report that answer, so
    # the proxy's own line for it is theirs to hide, as for a handler that raised.
    (tmp_path / "bad.py").write_text(
        "from conductor.plugins import Proxy\n"
        "class Bad(Proxy):\n"
        "    async def session_opened(self, session) -> None:\n"
        "        raise RuntimeError('no state store')\n", encoding="utf-8")
    agent = ("import json, sys\n"
             "for line in sys.stdin:\n"
             "    msg = json.loads(line)\n"
             "    result = {'protocolVersion': 1, 'agentCapabilities': {}, 'sessionId': 's1'}\n"
             "    print(json.dumps({'jsonrpc': '2.0', 'id': msg['id'], 'result': result}),\n"
             "          flush=True)\n")
    config = parse_chain({"proxy": [{"plugin": "bad.py:Bad"}],
                          "agent": {"command": [sys.executable, "-c", agent]}},
                         file=str(tmp_path / "c.toml"), base_dir=str(tmp_path))
    to_chain, chain_reads = message_pipe()
    from_chain, editor_reads = message_pipe(1 << 16)
    answers: list[Message] = []
    setup_answered = anyio.Event()

    async def read(item: object) -> None:
        answers.append(item)  # type: ignore[arg-type]
        if isinstance(item, Response) and bytes(item.id) == b"2":
            setup_answered.set()

    async def editor() -> None:
        await to_chain.send(Request(id=raw(1), method="initialize",
                                    params=raw({"protocolVersion": 1})))
        await to_chain.send(Request(id=raw(2), method="session/new",
                                    params=raw({"cwd": str(tmp_path), "mcpServers": []})))
        await setup_answered.wait()
        await to_chain.aclose()

    with anyio.fail_after(20):
        async with anyio.create_task_group() as tg:
            tg.start_soon(editor)
            tg.start_soon(editor_reads.serve, read)
            await serve_connection(config, from_chain, chain_reads,
                                   RunOptions(handle_signals=False))
            tg.cancel_scope.cancel()
    [failed] = [m for m in answers if isinstance(m, Response) and bytes(m.id) == b"2"]
    assert "no state store" in str(failed.error_value())
    [record] = [r for r in caplog.records if "no state store" in r.getMessage()
                and r.levelname == "ERROR"]
    assert getattr(record, "reaches_client", False) is True
