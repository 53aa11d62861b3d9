"""PipeSink write coalescing: one write per read's worth of routed messages, order kept."""

from __future__ import annotations

import anyio
import pytest
from anyio.abc import ByteSendStream

from conductor.jsonrpc.framing import FrameDecoder, OversizedFrame
from conductor.jsonrpc.message import Message, Notification, Raw
from conductor.transport.memory import memory_pipe
from conductor.transport.pipes import HIGH_WATER, PipeSink, serve_frames


class RecordingStream(ByteSendStream):
    """Records every write; a write can be held until `gate` is set."""

    def __init__(self, gate: anyio.Event | None = None) -> None:
        self.writes: list[bytes] = []
        self.gate = gate
        self.attempted = anyio.Event()

    async def send(self, item: bytes) -> None:
        self.attempted.set()
        if self.gate is not None:
            await self.gate.wait()
        self.writes.append(bytes(item))

    async def aclose(self) -> None:
        pass


def note(text: str) -> Message:
    return Notification(method="session/update", params=Raw(b'{"t":"' + text.encode() + b'"}'))


async def test_messages_routed_from_one_read_go_out_in_one_write_in_order() -> None:
    out = RecordingStream()
    sink = PipeSink(out)
    send, receive = memory_pipe()

    async def handle(frame: bytes | OversizedFrame) -> None:
        assert isinstance(frame, bytes)
        await sink.send(note(frame.decode()))

    await send.send(b"a\nb\nc\n")
    await send.aclose()
    with anyio.fail_after(5):
        await serve_frames(receive, FrameDecoder(), handle)
    await receive.aclose()
    assert out.writes == [b"".join(
        b'{"jsonrpc":"2.0","method":"session/update","params":{"t":"%s"}}\n' % t
        for t in (b"a", b"b", b"c"))]


async def test_a_send_outside_a_reader_is_written_at_once() -> None:
    out = RecordingStream()
    await PipeSink(out).send(note("now"))
    assert out.writes == [b'{"jsonrpc":"2.0","method":"session/update","params":{"t":"now"}}\n']


async def test_deferred_messages_are_written_before_a_send_that_could_block() -> None:
    gate = anyio.Event()
    small_out, big_out = RecordingStream(), RecordingStream(gate)
    small, big = PipeSink(small_out), PipeSink(big_out)
    send, receive = memory_pipe()

    async def handle(frame: bytes | OversizedFrame) -> None:
        if frame == b"small":
            await small.send(note("x"))
        else:
            await big.send(note("y" * HIGH_WATER))

    await send.send(b"small\nbig\n")
    await send.aclose()
    async with anyio.create_task_group() as tg:
        tg.start_soon(serve_frames, receive, FrameDecoder(), handle)
        with anyio.fail_after(5):
            await big_out.attempted.wait()
        # The big write is held by its peer; what was routed before it is already out.
        assert len(small_out.writes) == 1
        gate.set()
    await receive.aclose()
    assert len(big_out.writes) == 1


async def test_a_send_to_a_gone_peer_raises_broken_resource() -> None:
    class Gone(RecordingStream):
        async def send(self, item: bytes) -> None:
            raise BrokenPipeError

    sink = PipeSink(Gone())
    with pytest.raises(anyio.BrokenResourceError):
        await sink.send(note("x"))
    with pytest.raises(anyio.BrokenResourceError):  # and stays broken
        await sink.send(note("y"))


class NowaitStream(RecordingStream):
    """A stream that can also write without waiting (as FdSendStream does), taking at most
    `room` bytes at a time."""

    def __init__(self, room: int, gate: anyio.Event | None = None) -> None:
        super().__init__(gate)
        self.room = room

    def write_nowait(self, data: bytes | bytearray) -> int:
        taken = bytes(data[:self.room])
        if taken:
            self.writes.append(taken)
        return len(taken)


@pytest.mark.parametrize("room", [1 << 20, 10, 0])
async def test_a_flush_writes_what_fits_at_once_and_the_rest_in_order(room: int) -> None:
    out = NowaitStream(room)
    sink = PipeSink(out)
    await sink.send(note("one"))
    await sink.send(note("two"))
    expected = b"".join(b'{"jsonrpc":"2.0","method":"session/update","params":{"t":"%s"}}\n'
                        % t for t in (b"one", b"two"))
    assert b"".join(out.writes) == expected


@pytest.mark.parametrize("nowait", [False, True])
async def test_closing_a_sink_waits_for_a_write_in_flight(nowait: bool) -> None:
    # The first message's write is held: closing the sink meanwhile must not close the
    # stream under it (an answer sent just before shutdown would be lost).
    gate = anyio.Event()
    out = NowaitStream(0, gate) if nowait else RecordingStream(gate)
    closed: list[int] = []

    async def aclose() -> None:
        closed.append(len(out.writes))
    out.aclose = aclose  # type: ignore[method-assign]
    sink = PipeSink(out)
    async with anyio.create_task_group() as tg:
        tg.start_soon(sink.send, note("last answer"))
        with anyio.fail_after(5):
            await out.attempted.wait()
        tg.start_soon(sink.aclose)
        await anyio.sleep(0.01)
        assert closed == []
        gate.set()
    assert closed == [1]
