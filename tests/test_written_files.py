"""Files the conductor writes (trace, log, transcripts, trace html): never through a
symbolic link, and owner-only under any umask unless the user asks otherwise."""

from __future__ import annotations

import contextlib
import logging
import os
import stat
from typing import TYPE_CHECKING

import anyio
import pytest

from tests.conftest import REPO
from tests.in_process import conductor
from tests.test_builtin_proxy_options import transcript_turn

if TYPE_CHECKING:
    import subprocess
    from collections.abc import Iterator
    from pathlib import Path

DEMO = str(REPO / "chains" / "demo.toml")


def run(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    """The conductor under umask 000: whatever it creates, it chose the mode itself (run in
    this process: tests/in_process.py)."""
    return conductor(*args, cwd=cwd, umask=0)


def mode(path: Path) -> int:
    return stat.S_IMODE(os.lstat(path).st_mode)


@pytest.fixture
def umask_000() -> Iterator[None]:
    old = os.umask(0)
    try:
        yield
    finally:
        os.umask(old)


@pytest.fixture
def victim(tmp_path: Path) -> Path:
    """A file someone else cares about, and a link to it where the conductor will write."""
    target = tmp_path / "victim.txt"
    target.write_text("precious\n", encoding="utf-8")
    return target


@pytest.mark.parametrize("option", ["--trace", "--log-file"])
def test_a_symlink_at_an_output_path_is_refused_and_its_target_left_alone(
        tmp_path: Path, victim: Path, option: str) -> None:
    link = tmp_path / "out.link"
    link.symlink_to(victim)
    done = run(option, str(link), "run", "--chain", DEMO, "hi", cwd=tmp_path)
    assert done.returncode == 2, done.stderr
    assert f"{option}: {link} is a symbolic link" in done.stderr
    assert "Traceback" not in done.stderr
    assert victim.read_text(encoding="utf-8") == "precious\n"


@pytest.mark.parametrize("other", ["--chain", "--log-file"])
def test_a_trace_given_the_chain_or_log_files_path_is_refused_and_that_file_kept(
        tmp_path: Path, other: str) -> None:
    chain = tmp_path / "chain.toml"
    chain.write_bytes((REPO / "chains" / "demo.toml").read_bytes())
    kept = chain if other == "--chain" else tmp_path / "conductor.log"
    before = chain.read_bytes()
    done = run("--log-file", str(tmp_path / "conductor.log"), "--trace", str(kept),
               "run", "--chain", str(chain), "hi", cwd=tmp_path)
    assert done.returncode == 2, done.stderr
    what = "the chain file" if other == "--chain" else "the --log-file"
    assert f"--trace: {kept} is {what}" in done.stderr and "Traceback" not in done.stderr
    assert chain.read_bytes() == before
    assert not kept.read_bytes().startswith(b'{"seq"')


def test_a_trace_given_a_file_that_is_not_a_trace_is_refused_and_the_file_kept(
        tmp_path: Path) -> None:
    # A trace is written from the start of its file: `--trace agent.py` (a slip for the
    # script beside it) destroyed the script. An earlier trace is still replaced.
    script = tmp_path / "agent.py"
    script.write_text("print('mine')\n", encoding="utf-8")
    done = run("--trace", str(script), "run", "--chain", DEMO, "hi", cwd=tmp_path)
    assert done.returncode == 2, done.stderr
    assert f"--trace: {script} is there and is not a trace" in done.stderr
    assert script.read_text(encoding="utf-8") == "print('mine')\n"
    trace = tmp_path / "t.jsonl"
    for _ in range(2):
        done = run("--trace", str(trace), "run", "--chain", DEMO, "hi", cwd=tmp_path)
        assert done.returncode == 0, done.stderr
    assert trace.read_bytes().count(b'"type":"trace"') == 1


def test_a_log_file_given_the_chain_files_path_is_refused_and_the_chain_kept(
        tmp_path: Path) -> None:
    chain = tmp_path / "chain.toml"
    chain.write_bytes((REPO / "chains" / "demo.toml").read_bytes())
    done = run("--log-file", str(chain), "run", "--chain", str(chain), "hi", cwd=tmp_path)
    assert done.returncode == 2, done.stderr
    assert f"--log-file: {chain} is the chain file" in done.stderr
    assert chain.read_bytes() == (REPO / "chains" / "demo.toml").read_bytes()


def test_trace_html_refuses_to_write_through_a_symlink(tmp_path: Path, victim: Path) -> None:
    trace = tmp_path / "t.jsonl"
    assert run("--trace", str(trace), "run", "--chain", DEMO, "hi", cwd=tmp_path).returncode == 0
    link = tmp_path / "page.html"
    link.symlink_to(victim)
    done = run("trace", "html", str(trace), "-o", str(link), cwd=tmp_path)
    assert done.returncode == 2, done.stderr
    assert f"{link} is a symbolic link" in done.stderr
    assert victim.read_text(encoding="utf-8") == "precious\n"


def test_trace_and_log_files_are_created_owner_only_under_umask_000(tmp_path: Path) -> None:
    trace, log = tmp_path / "t.jsonl", tmp_path / "conductor.log"
    done = run("--trace", str(trace), "--log-file", str(log), "--log-level", "info",
               "run", "--chain", DEMO, "hi", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert mode(trace) == 0o600
    assert mode(log) == 0o600
    assert log.read_text(encoding="utf-8")  # it was written to, not only created


def test_trace_html_is_owner_only_unless_made_shareable(tmp_path: Path) -> None:
    trace = tmp_path / "t.jsonl"
    assert run("--trace", str(trace), "run", "--chain", DEMO, "hi", cwd=tmp_path).returncode == 0
    private, shared = tmp_path / "private.html", tmp_path / "shared.html"
    assert run("trace", "html", str(trace), "-o", str(private), cwd=tmp_path).returncode == 0
    done = run("trace", "html", str(trace), "-o", str(shared), "--shareable", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert mode(private) == 0o600
    assert mode(shared) == 0o644
    assert "trace-data" in private.read_text(encoding="utf-8")


async def test_transcripts_are_created_owner_only_under_umask_000(
        tmp_path: Path, umask_000: None) -> None:
    out = tmp_path / "transcripts"
    await transcript_turn(out, "sess-1")
    assert mode(out) == 0o700
    files = sorted(out.iterdir())
    assert [f.suffix for f in files] == [".jsonl", ".md"]
    assert all(mode(f) == 0o600 for f in files)


async def test_a_transcript_never_writes_through_a_symlink(
        tmp_path: Path, victim: Path, caplog: pytest.LogCaptureFixture) -> None:
    from acp_conductor_proxies.transcript import file_stem

    out = tmp_path / "transcripts"
    out.mkdir()
    (out / f"{file_stem('sess-1')}.md").symlink_to(victim)
    with caplog.at_level(logging.WARNING):
        await transcript_turn(out, "sess-1")  # the session goes on
    assert await anyio.Path(victim).read_text(encoding="utf-8") == "precious\n"
    warnings = [r.getMessage() for r in caplog.records if "transcript" in r.getMessage()]
    assert len(warnings) == 1 and "symbolic link" in warnings[0], warnings


def test_a_trace_into_a_named_pipe_nothing_reads_is_refused_not_waited_on(tmp_path: Path) -> None:
    # Opening a FIFO for writing waits for a reader: `--trace` given one with none hung the
    # conductor before it served anything.
    fifo = tmp_path / "trace.fifo"
    os.mkfifo(fifo)
    done = run("--trace", str(fifo), "run", "--chain", DEMO, "hi", cwd=tmp_path)
    assert done.returncode == 2, done.stderr
    assert f"{fifo} is a named pipe that nothing reads" in done.stderr
    assert "start its reader first" in done.stderr


def test_a_trace_into_a_named_pipe_with_a_reader_is_written_there(tmp_path: Path) -> None:
    from conductor.output import open_output

    fifo = tmp_path / "trace.fifo"
    os.mkfifo(fifo)
    reader = os.open(fifo, os.O_RDONLY | os.O_NONBLOCK)
    try:
        fd = open_output(fifo, option="--trace")
        try:
            assert os.get_blocking(fd)  # written as any file is, once open
            os.write(fd, b'{"t": 1}\n')
        finally:
            os.close(fd)
        assert os.read(reader, 100) == b'{"t": 1}\n'
    finally:
        os.close(reader)


def test_a_trace_into_a_named_pipe_whose_reader_is_behind_drops_counted_events_never_blocks(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    # A blocking write there stopped every routing task (they trace) until the reader read.
    import json
    import threading

    from conductor.tracing.sink import JsonlTraceSink

    fifo = tmp_path / "trace.fifo"
    os.mkfifo(fifo)
    reader = os.open(fifo, os.O_RDONLY | os.O_NONBLOCK)
    sink = JsonlTraceSink(fifo)
    sink.MAX_BEHIND = 128 * 1024

    def trace_a_lot() -> None:
        for _ in range(1000):  # ~1 MB: far more than the pipe (64 KiB) and MAX_BEHIND hold
            sink.lifecycle("agent", "stderr", line="x" * 1000)

    tracing = threading.Thread(target=trace_a_lot, daemon=True)
    with caplog.at_level(logging.WARNING):
        tracing.start()
        tracing.join(30)  # a hang bound only: a blocked write never returns
    read = bytearray()
    try:
        assert not tracing.is_alive(), "tracing blocked on the pipe"
        assert any("is behind: events are dropped" in r.getMessage() for r in caplog.records)
        while b"trace-dropped" not in read:  # the reader catches up
            with contextlib.suppress(BlockingIOError):
                read += os.read(reader, 1 << 16)
            sink.flush()
        sink.close()
        with contextlib.suppress(BlockingIOError):
            read += os.read(reader, 1 << 20)
    finally:
        os.close(reader)
    events = [json.loads(line) for line in read.splitlines()]
    note = next(e for e in events if e.get("event") == "trace-dropped")
    seqs = [e["seq"] for e in events]
    assert note["count"] > 0 and len(seqs) + note["count"] == seqs[-1]


def test_a_trace_pipe_found_full_is_not_tried_again_at_every_event(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # Each event behind a full pipe tried a write and copied the whole backlog (up to
    # 4 MiB) back into the buffer: ~1.8 ms an event, for every routing task that traces.
    from conductor.tracing import sink as sink_module

    fifo = tmp_path / "trace.fifo"
    os.mkfifo(fifo)
    reader = os.open(fifo, os.O_RDONLY | os.O_NONBLOCK)  # a reader that never reads
    tries = []
    write = os.write

    def counted(fd: int, data: bytes) -> int:
        tries.append(fd)
        return write(fd, data)
    try:
        sink = sink_module.JsonlTraceSink(fifo)
        monkeypatch.setattr(sink_module.os, "write", counted)
        monkeypatch.setattr(sink_module.time, "monotonic", lambda: 1000.0)  # one moment
        for _ in range(2000):  # ~0.6 MB: the pipe (64 KiB) is full after a few hundred
            sink.lifecycle("agent", "stderr", line="x" * 300)
        monkeypatch.undo()
        assert len(tries) < 10
        sink.close()
    finally:
        os.close(reader)


async def test_what_a_slow_pipe_reader_could_not_take_reaches_it_though_no_event_follows(
        tmp_path: Path) -> None:
    # The chain hangs after a burst: what waited for the reader must not wait for an event.
    from conductor.tracing.sink import JsonlTraceSink

    fifo = tmp_path / "trace.fifo"
    os.mkfifo(fifo)
    reader = os.open(fifo, os.O_RDONLY | os.O_NONBLOCK)
    read = bytearray()
    try:
        sink = JsonlTraceSink(fifo)
        async with sink.open_flusher():
            for _ in range(200):  # ~200 KB: more than the pipe holds (64 KiB)
                sink.lifecycle("agent", "stderr", line="x" * 1000)
            with anyio.fail_after(10):
                while read.count(b"\n") < 201:
                    await anyio.wait_readable(reader)
                    read += os.read(reader, 1 << 16)
        sink.close()
    finally:
        os.close(reader)
    assert read.count(b'"event":"stderr"') == 200
