"""The one request correlator: ids, answers, cancellation both ways, failure, batches, and
the single place an exception becomes a wire error. Two endpoints joined in memory."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import anyio
import pytest

from conductor.errors import ComponentExitedError, ConnectionClosedError, RpcError
from conductor.jsonrpc.codes import ErrorCode
from conductor.jsonrpc.message import Notification, Raw, Request, Response
from conductor.rpc.endpoint import Endpoint
from conductor.transport.memory import open_link

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable

    from anyio.abc import TaskGroup

    from conductor.transport.base import Incoming
    from conductor.transport.memory import Transport

class Side:
    """An endpoint that answers requests with `handler` and records notifications."""

    def __init__(self, name: str, tg: TaskGroup,
                 handler: Callable[[Request], Awaitable[object]] | None = None) -> None:
        self.name, self.tg = name, tg
        self.handler = handler
        self.endpoint: Endpoint
        self.notes: list[Notification] = []

    async def receive(self, item: Incoming) -> None:
        if isinstance(item, Response):
            await self.endpoint.settle(item)
        elif isinstance(item, Request):
            assert self.handler is not None
            self.tg.start_soon(self.endpoint.answer, item, self.handler)
        elif isinstance(item, Notification):
            if item.method == "$/cancel_request":
                await self.endpoint.cancel_inbound(item.params)
            self.notes.append(item)


async def pair(tg: TaskGroup, transport: Transport,
               handler: Callable[[Request], Awaitable[object]]) -> tuple[Side, Side]:
    """(asker, answerer) joined both ways; the links close when `tg` ends."""
    asker, answerer = Side("asker", tg), Side("answerer", tg, handler)
    a_out, b_in = open_link(transport)
    b_out, a_in = open_link(transport)
    asker.endpoint, answerer.endpoint = Endpoint("asker", a_out), Endpoint("answerer", b_out)
    tg.start_soon(b_in.serve, answerer.receive)
    tg.start_soon(a_in.serve, asker.receive)

    async def close_at_end() -> None:
        try:
            await anyio.sleep_forever()
        finally:
            with anyio.CancelScope(shield=True):
                await a_out.aclose()
                await b_out.aclose()
    tg.start_soon(close_at_end)
    return asker, answerer


async def ignore(item: Incoming) -> None:
    pass


@pytest.fixture(params=["memory", "pipes"])
def transport(request: pytest.FixtureRequest) -> str:
    return str(request.param)


async def test_answers_reach_the_request_they_answer_whatever_order_they_come_in(
        transport: Transport) -> None:
    gates = {"a": anyio.Event(), "b": anyio.Event()}

    async def handler(request: Request) -> object:
        await gates[request.method].wait()
        return {"for": request.method}

    async with anyio.create_task_group() as tg:
        asker, _ = await pair(tg, transport, handler)
        results: dict[str, object] = {}

        async def ask(method: str) -> None:
            results[method] = (await asker.endpoint.call(method)).result_value()
        with anyio.fail_after(5):
            async with anyio.create_task_group() as calls:
                calls.start_soon(ask, "a")
                calls.start_soon(ask, "b")
                await anyio.wait_all_tasks_blocked()
                gates["b"].set()
                await anyio.wait_all_tasks_blocked()
                gates["a"].set()
        tg.cancel_scope.cancel()
    assert results == {"a": {"for": "a"}, "b": {"for": "b"}}


async def test_what_a_handler_raises_is_answered_never_raised(transport: Transport) -> None:
    async def handler(request: Request) -> object:
        if request.method == "rpc":
            raise RpcError(-32042, "not today", {"why": "policy"})
        if request.method == "component":
            raise ComponentExitedError("agent", 3, ["boom"])
        raise KeyError("bug")

    async with anyio.create_task_group() as tg:
        asker, _ = await pair(tg, transport, handler)
        with anyio.fail_after(5):
            rpc = (await asker.endpoint.request("rpc")).error_value()
            component = (await asker.endpoint.request("component")).error_value()
            bug = (await asker.endpoint.request("bug")).error_value()
        tg.cancel_scope.cancel()
    assert rpc == {"code": -32042, "message": "not today", "data": {"why": "policy"}}
    assert component["code"] == ErrorCode.COMPONENT_FAILED
    assert component["data"] == {"component": "agent", "returncode": 3, "stderrTail": ["boom"]}
    assert bug["code"] == ErrorCode.HANDLER_FAILED
    assert bug["data"] == {"component": "answerer", "method": "bug"}
    assert "KeyError" in bug["message"]


async def test_call_raises_the_error_answer_as_rpc_error(transport: Transport) -> None:
    async def handler(request: Request) -> object:
        raise RpcError(ErrorCode.RESOURCE_NOT_FOUND, "no such file", {"path": "/x"})

    async with anyio.create_task_group() as tg:
        asker, _ = await pair(tg, transport, handler)
        with anyio.fail_after(5), pytest.raises(RpcError) as caught:
            await asker.endpoint.call("fs/read_text_file", {"path": "/x"})
        tg.cancel_scope.cancel()
    assert (caught.value.code, caught.value.data) == (-32002, {"path": "/x"})


async def test_cancelling_the_asker_sends_one_cancel_and_the_handler_answers_cancelled(
        transport: Transport) -> None:
    started, finished = anyio.Event(), anyio.Event()

    async def handler(request: Request) -> object:
        started.set()
        try:
            await anyio.sleep_forever()
        finally:
            finished.set()

    async with anyio.create_task_group() as tg:
        asker, answerer = await pair(tg, transport, handler)
        with anyio.fail_after(5):
            async with anyio.create_task_group() as calls:
                calls.start_soon(asker.endpoint.request, "slow")
                await started.wait()
                calls.cancel_scope.cancel()
            await finished.wait()
            await anyio.wait_all_tasks_blocked()
        tg.cancel_scope.cancel()
    cancels = [n for n in answerer.notes if n.method == "$/cancel_request"]
    assert len(cancels) == 1
    assert cancels[0].params_value() == {"requestId": 1}


async def test_a_cancel_for_an_unknown_or_finished_request_is_ignored(
        transport: Transport) -> None:
    async def handler(request: Request) -> object:
        return {}

    async with anyio.create_task_group() as tg:
        asker, answerer = await pair(tg, transport, handler)
        with anyio.fail_after(5):
            await asker.endpoint.call("quick")
            assert not await answerer.endpoint.cancel_inbound(Raw(b'{"requestId":1}'))
            assert not await answerer.endpoint.cancel_inbound(Raw(b'{"requestId":"nope"}'))
        tg.cancel_scope.cancel()


async def test_without_cancel_on_abort_an_abandoned_request_sends_no_cancel(
        transport: Transport) -> None:
    started = anyio.Event()

    async def handler(request: Request) -> object:
        started.set()
        await anyio.sleep_forever()

    async with anyio.create_task_group() as tg:
        asker, answerer = await pair(tg, transport, handler)
        with anyio.fail_after(5):
            async with anyio.create_task_group() as calls:
                calls.start_soon(lambda: asker.endpoint.request("slow", cancel_on_abort=False))
                await started.wait()
                calls.cancel_scope.cancel()
            await anyio.wait_all_tasks_blocked()
        tg.cancel_scope.cancel()
    assert not [n for n in answerer.notes if n.method == "$/cancel_request"]
    assert asker.endpoint.pending == {}


async def test_a_failed_connection_fails_every_waiter_and_every_later_request() -> None:
    async with anyio.create_task_group() as tg:
        sink, source = open_link("memory")
        tg.start_soon(source.serve, ignore)
        endpoint = Endpoint("agent", sink)
        failures: list[BaseException] = []

        async def ask() -> None:
            try:
                await endpoint.request("prompt")
            except ConnectionClosedError as e:
                failures.append(e)
        tg.start_soon(ask)
        await anyio.wait_all_tasks_blocked()
        await endpoint.fail(ConnectionClosedError("gone"))
        await anyio.wait_all_tasks_blocked()
        with pytest.raises(ConnectionClosedError):
            await endpoint.request("later")
        await sink.aclose()
    assert [str(f) for f in failures] == ["gone"]


async def test_a_forwarded_request_gets_its_connections_failure_as_an_error_answer() -> None:
    delivered: list[Response] = []

    async def deliver(outgoing: object, answer: Response) -> None:
        delivered.append(answer)

    sink, source = open_link("memory")
    endpoint = Endpoint("agent", sink)
    endpoint.open_request("session/prompt", deliver=deliver)
    await sink.aclose()
    await source.serve(ignore)
    await endpoint.fail(ComponentExitedError("agent", -9), component="agent")
    await endpoint.fail(ComponentExitedError("agent", 1))  # once is enough
    assert len(delivered) == 1
    error = delivered[0].error_value()
    assert error["code"] == ErrorCode.COMPONENT_FAILED
    assert "killed by signal 9" in error["message"]


async def test_a_recipient_that_cannot_take_its_failure_answer_does_not_cost_the_others_theirs(
        ) -> None:
    delivered: list[str] = []

    async def broken(outgoing: object, answer: Response) -> None:
        raise anyio.BrokenResourceError("the editor went away too")

    async def deliver(outgoing: object, answer: Response) -> None:
        delivered.append(answer.error_value()["message"])

    sink, source = open_link("memory")
    endpoint = Endpoint("agent", sink)
    endpoint.open_request("session/prompt", deliver=broken)
    endpoint.open_request("session/prompt", deliver=deliver)
    waiting, _ = endpoint.open_request("fs/read_text_file")
    await sink.aclose()
    await source.serve(ignore)
    await endpoint.fail(ComponentExitedError("agent", 1), component="agent")
    assert len(delivered) == 1 and "agent" in delivered[0]
    assert waiting.failure is not None


class RecordingSink:
    """A MessageSink that keeps what is sent to it."""

    def __init__(self) -> None:
        self.sent: list[Any] = []

    async def send(self, item: object) -> None:
        self.sent.append(item)

    async def aclose(self) -> None:
        pass


async def test_replies_to_a_batch_leave_as_one_array_even_with_duplicate_and_float_ids(
        ) -> None:
    sink = RecordingSink()
    sent = sink.sent
    endpoint = Endpoint("client", sink)
    ids = [Raw(b"1"), Raw(b"1"), Raw(b"1.5")]
    batch = endpoint.open_batch(ids)
    for ident in reversed(ids):
        await endpoint.send(Response(id=ident, result=Raw(b"{}")))
    assert sent == []  # held until the batch is complete
    await endpoint.end_batch(batch)
    assert len(sent) == 1 and isinstance(sent[0], list) and len(sent[0]) == 3


async def test_a_large_batch_answered_out_of_order_is_matched_without_stalling_the_loop(
        ) -> None:
    # One batch of 20,000 requests is a 1 MB frame, far under the frame limit; each reply
    # must find its place in the batch at once, not by a scan of what is still owed (the
    # event loop, every session and connection on it, would stall for the square of it).
    sink = RecordingSink()
    endpoint = Endpoint("client", sink)
    ids = [Raw(str(i).encode()) for i in range(20_000)]
    batch = endpoint.open_batch(ids)
    await endpoint.end_batch(batch)
    with anyio.fail_after(5):
        for ident in reversed(ids):  # the last asked answered first, as agents may
            await endpoint.send(Response(id=ident, result=Raw(b"{}")))
            await anyio.lowlevel.checkpoint()  # where the bound can stop a stalled loop
    assert len(sink.sent) == 1 and len(sink.sent[0]) == len(ids)


async def test_a_request_reusing_an_id_stays_cancellable_and_awaited_after_the_first_is_answered(
        ) -> None:
    # A client may use an id again once it is answered (or, wrongly, while it is in
    # flight): answering the first must not forget the second.
    sink = RecordingSink()
    sent = sink.sent
    endpoint = Endpoint("agent", sink)
    release_first = anyio.Event()

    async def handler(request: Request) -> object:
        if request.method == "first":
            await release_first.wait()
            return "first done"
        await anyio.sleep_forever()

    same = Raw(b"7")
    async with anyio.create_task_group() as tg:
        tg.start_soon(endpoint.answer, Request(id=same, method="first"), handler)
        await anyio.wait_all_tasks_blocked()
        tg.start_soon(endpoint.answer, Request(id=same, method="second"), handler)
        await anyio.wait_all_tasks_blocked()
        release_first.set()
        await anyio.wait_all_tasks_blocked()
        assert [r.result for r in sent] == [Raw(b'"first done"')]
        quiet = anyio.Event()

        async def until_quiet() -> None:
            await endpoint.wait_quiet()
            quiet.set()
        tg.start_soon(until_quiet)
        await anyio.wait_all_tasks_blocked()
        assert not quiet.is_set()  # the second is still awaited ...
        assert await endpoint.cancel_inbound(Raw(b'{"requestId":7}'))  # ... and cancellable
        with anyio.fail_after(5):
            await quiet.wait()
    assert sent[1].id == same and sent[1].error_code() == ErrorCode.REQUEST_CANCELLED
