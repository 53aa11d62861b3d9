"""Byte streams over pipe fds: what a reader gets, on both backends and both ways of waiting
(asyncio's persistent loop registration, anyio's portable wait_readable)."""

from __future__ import annotations

import os

import anyio
import pytest

from conductor.transport.stdio import FdReceiveStream, FdSendStream


@pytest.fixture(params=[True, False], ids=["loop-readiness", "portable-wait"])
def readiness(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> bool:
    monkeypatch.setattr(FdReceiveStream, "USE_LOOP_READINESS", request.param)
    return bool(request.param)


async def test_a_reader_gets_every_byte_written_in_order_then_end_of_stream(
        readiness: bool) -> None:
    r, w = os.pipe()
    reader, writer = FdReceiveStream(r, owns_fd=True), FdSendStream(w)
    chunks = [f"line {n}\n".encode() * (n + 1) for n in range(200)]
    got = bytearray()
    with anyio.fail_after(5):
        async with anyio.create_task_group() as tg:
            async def write() -> None:
                for chunk in chunks:
                    await writer.send(chunk)
                    await anyio.lowlevel.checkpoint()  # let the reader wait between writes
                await writer.aclose()
            tg.start_soon(write)
            while True:
                try:
                    got += await reader.receive(4096)
                except anyio.EndOfStream:
                    break
    await reader.aclose()
    assert bytes(got) == b"".join(chunks)


async def test_closing_a_waiting_reader_wakes_it_with_closed_resource(readiness: bool) -> None:
    r, w = os.pipe()
    reader = FdReceiveStream(r, owns_fd=True)
    with anyio.fail_after(5):
        async with anyio.create_task_group() as tg:
            outcome: list[type[BaseException]] = []

            async def read() -> None:
                try:
                    await reader.receive()
                except anyio.ClosedResourceError as e:
                    outcome.append(type(e))
            tg.start_soon(read)
            await anyio.wait_all_tasks_blocked()
            await reader.aclose()
    os.close(w)
    assert outcome == [anyio.ClosedResourceError]


@pytest.mark.parametrize("anyio_backend", ["asyncio"])
async def test_on_asyncio_a_readable_fd_nobody_reads_is_dropped_from_the_loop(
        anyio_backend: str) -> None:
    import asyncio

    r, w = os.pipe()
    reader = FdReceiveStream(r, owns_fd=True)
    selector = asyncio.get_running_loop()._selector  # type: ignore[attr-defined]
    got: list[bytes] = []

    async def read_once() -> None:
        got.append(await reader.receive())

    with anyio.fail_after(5):
        async with anyio.create_task_group() as tg:
            tg.start_soon(read_once)
            await anyio.wait_all_tasks_blocked()
            assert r in selector.get_map()  # waiting: registered
            os.write(w, b"first")
        assert got == [b"first"]
        os.write(w, b"x")  # too late for anyone: it stays in the pipe
        while r in selector.get_map():  # the loop reports it once, to nobody
            await anyio.lowlevel.checkpoint()
        assert await reader.receive() == b"x"
    await reader.aclose()
    os.close(w)


@pytest.mark.parametrize("anyio_backend", ["asyncio"])
async def test_on_asyncio_bytes_read_for_a_reader_cancelled_meanwhile_are_not_lost(
        anyio_backend: str) -> None:
    import asyncio

    r, w = os.pipe()
    reader = FdReceiveStream(r, owns_fd=True)
    task = asyncio.ensure_future(reader.receive())
    with anyio.fail_after(5):
        await anyio.wait_all_tasks_blocked()
        os.write(w, b"kept")
        assert reader._reader is not None
        reader._reader._ready()  # the loop reads it for the waiting task ...
        task.cancel()  # ... which is cancelled before it resumes
        with pytest.raises(asyncio.CancelledError):
            await task
        assert await reader.receive() == b"kept"
    await reader.aclose()
    os.close(w)
