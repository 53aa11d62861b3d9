"""A write cancelled half-way through a frame never leaves half a frame on the wire: what the
pipe did not take yet goes out first on the next write, so every line stays one message."""

from __future__ import annotations

import os

import anyio
import msgspec
import pytest
from anyio import wait_all_tasks_blocked
from msgspec import Raw

from conductor.jsonrpc.message import Notification
from conductor.transport.pipes import LARGE_PAYLOAD, PipeSink
from conductor.transport.stdio import FdReceiveStream, FdSendStream


def _big(size: int) -> Notification:
    return Notification(method="big", params=Raw(b'{"x":"' + b"y" * size + b'"}'))


@pytest.mark.parametrize("size", [LARGE_PAYLOAD // 2, 3 * LARGE_PAYLOAD],
                         ids=["buffered", "large-payload"])
async def test_a_send_cancelled_mid_frame_leaves_whole_frames_on_the_pipe(size: int) -> None:
    r, w = os.pipe()
    reader, sink = FdReceiveStream(r, owns_fd=True), PipeSink(FdSendStream(w))
    # Fill the pipe nearly full, so the big frame can only be written in part.
    while True:
        try:
            os.write(w, b"\n" * 4096)
        except BlockingIOError:
            break
    got = bytearray()
    with anyio.fail_after(10):
        async with anyio.create_task_group() as tg:
            stuck = anyio.CancelScope()
            tg.start_soon(_send_in, stuck, sink, _big(size))
            # Let some room appear, so part of the frame goes out, then cancel the rest.
            got += await reader.receive(8192)
            await wait_all_tasks_blocked()
            stuck.cancel()
            await wait_all_tasks_blocked()

            async def after() -> None:
                await sink.send(Notification(method="after", params=Raw(b"{}")))
                await sink.aclose()
            tg.start_soon(after)
            while True:
                try:
                    got += await reader.receive(1 << 20)
                except anyio.EndOfStream:
                    break
    await reader.aclose()
    lines = [line for line in bytes(got).split(b"\n") if line]
    methods = [msgspec.json.decode(line)["method"] for line in lines]  # each one whole
    assert methods[-1] == "after"


async def _send_in(scope: anyio.CancelScope, sink: PipeSink, message: Notification) -> None:
    with scope:
        await sink.send(message)
