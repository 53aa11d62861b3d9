"""Endpoint.send: one writer at a time, first come first served, even across cancellation."""

from __future__ import annotations

import anyio
from anyio import wait_all_tasks_blocked
from anyio.lowlevel import checkpoint

from conductor.jsonrpc.message import Message, Notification, Raw, id_key
from conductor.rpc.endpoint import Endpoint


class SlowSink:
    """A sink whose first send is held until `release` is set."""

    def __init__(self) -> None:
        self.sent: list[str] = []
        self.release = anyio.Event()
        self.active = 0

    async def send(self, item: Message | list[Message]) -> None:
        assert isinstance(item, Notification)
        self.active += 1
        assert self.active == 1, "two writers at once"
        if not self.sent:
            await self.release.wait()
        await checkpoint()
        assert isinstance(item.params, Raw)
        self.sent.append(bytes(item.params).decode())
        self.active -= 1

    async def aclose(self) -> None:
        pass


def msg(n: int) -> Notification:
    return Notification(method="n", params=Raw(str(n).encode()))


async def test_waiting_writers_go_in_arrival_order_and_a_cancelled_one_is_skipped() -> None:
    sink = SlowSink()
    wire = Endpoint("agent", sink)
    async with anyio.create_task_group() as tg:
        tg.start_soon(wire.send, msg(1))
        await wait_all_tasks_blocked()
        tg.start_soon(wire.send, msg(2))
        await wait_all_tasks_blocked()
        with anyio.CancelScope() as doomed:
            doomed.cancel()
            await wire.send(msg(99))  # queued behind 1 and cancelled while waiting
        tg.start_soon(wire.send, msg(3))
        await wait_all_tasks_blocked()
        sink.release.set()
    assert sink.sent == ["1", "2", "3"]


def test_ids_the_conductor_allocates_key_as_ints_and_other_ids_keep_their_type() -> None:
    assert id_key(Raw(b"17")) == 17
    assert id_key(Raw(b"123456789012345678901234567890")) == 123456789012345678901234567890
    assert id_key(Raw(b'"17"')) == "17"
    assert id_key(Raw(b"-3")) == -3
    assert id_key(Raw(b"null")) is None


class HeldSink:
    """A sink whose sends wait until `release` is set (a full pipe)."""

    def __init__(self) -> None:
        self.release = anyio.Event()

    async def send(self, item: Message | list[Message]) -> None:
        await self.release.wait()

    async def aclose(self) -> None:
        pass


async def test_a_request_cancelled_before_it_was_written_is_not_left_pending() -> None:
    sink = HeldSink()
    endpoint = Endpoint("peer", sink)
    with anyio.fail_after(5):
        async with anyio.create_task_group() as tg:
            tg.start_soon(endpoint.notify, "first")  # holds the writer's turn
            await wait_all_tasks_blocked()
            with anyio.CancelScope() as scope:
                async def cancel_when_queued() -> None:
                    await wait_all_tasks_blocked()  # the request waits for the turn
                    scope.cancel()
                    await wait_all_tasks_blocked()
                    sink.release.set()  # the pipe drains: its cancel goes out too
                tg.start_soon(cancel_when_queued)
                await endpoint.request("never/sent")
            assert scope.cancelled_caught
            tg.cancel_scope.cancel()
    assert endpoint.pending == {}  # no answer can come for it: nothing may wait for one


async def test_a_plugin_request_cancelled_before_it_was_written_is_not_left_pending() -> None:
    from conductor.plugins.api import Proxy, Side
    from conductor.plugins.host import ProxyHost

    class Quiet(Proxy[None]):
        name = "quiet"

    host = ProxyHost(Quiet(), HeldSink())
    with anyio.fail_after(5):
        async with anyio.create_task_group() as tg:
            tg.start_soon(host.endpoint.notify, "first")  # holds the writer's turn
            await wait_all_tasks_blocked()
            with anyio.CancelScope() as scope:
                async def cancel_when_queued() -> None:
                    await wait_all_tasks_blocked()  # the request waits for the turn
                    scope.cancel()
                tg.start_soon(cancel_when_queued)
                await host.start_request("_ext/never_sent", Raw(b"{}"), Side.SUCCESSOR)
            assert scope.cancelled_caught
            tg.cancel_scope.cancel()
    assert host.endpoint.pending == {}


async def test_a_request_cancelled_while_the_pipe_is_full_is_still_written_and_so_is_its_cancel(
        ) -> None:
    import os

    import msgspec

    from conductor.transport.pipes import PipeSink
    from conductor.transport.stdio import FdReceiveStream, FdSendStream

    r, w = os.pipe()
    reader, sink = FdReceiveStream(r, owns_fd=True), PipeSink(FdSendStream(w))
    while True:  # a peer that is not reading: the pipe is full
        try:
            os.write(w, b"\n" * 4096)
        except BlockingIOError:
            break
    endpoint = Endpoint("peer", sink)
    got = bytearray()
    with anyio.fail_after(5):
        async with anyio.create_task_group() as tg:
            with anyio.CancelScope() as scope:
                async def cancel_when_stuck() -> None:
                    await wait_all_tasks_blocked()  # the request waits for room in the pipe
                    scope.cancel()
                    await wait_all_tasks_blocked()
                    while True:  # the peer reads again
                        try:
                            got.extend(await reader.receive(1 << 20))
                        except anyio.EndOfStream:
                            return
                tg.start_soon(cancel_when_stuck)
                await endpoint.request("slow/work")
            assert scope.cancelled_caught
            await sink.aclose()
    await reader.aclose()
    frames = [msgspec.json.decode(line) for line in bytes(got).split(b"\n") if line]
    methods = [frame["method"] for frame in frames]
    # The pipe keeps what it was given (a frame is never cut): the request reaches the peer,
    # so the peer must be told that nobody waits for it any more.
    assert methods[0] == "slow/work"
    assert methods[1:] == ["$/cancel_request"]
    assert frames[1]["params"] == {"requestId": frames[0]["id"]}
    assert endpoint.pending == {}
