"""What a plugin's handler does wrong is answered naming the plugin, and the chain goes on:
`sys.exit()`, errors from a task group, answers that are not JSON."""

from __future__ import annotations

import math
import sys
from typing import TYPE_CHECKING, Any, ClassVar

import anyio
import pytest

from conductor.errors import RpcError
from conductor.jsonrpc.codes import ErrorCode
from conductor.plugins import Proxy, ProxyContext, on
from conductor.testing import ScriptedAgent, open_test_chain

if TYPE_CHECKING:
    from conductor.jsonrpc.message import Message


async def failure(proxy: Proxy[Any], method: str, params: Any = None) -> RpcError:
    """The error `proxy` answers `method` with; the chain must still serve afterwards."""
    async with open_test_chain([proxy], ScriptedAgent()) as client:
        with anyio.fail_after(5):
            with pytest.raises(RpcError) as failed:
                await client.call(method, params if params is not None else {})
            assert await client.new_session()  # the chain lives on
    return failed.value


class Exits(Proxy):
    """Calls sys.exit() in its handlers."""

    def __init__(self) -> None:
        super().__init__()
        self.noted = anyio.Event()

    @on("_ext/exit")
    async def exit(self, ctx: ProxyContext, message: Message) -> object:
        sys.exit(3)

    @on("_ext/exit-note")
    async def exit_note(self, ctx: ProxyContext, message: Message) -> None:
        self.noted.set()
        raise SystemExit("bye")


async def test_a_handler_calling_sys_exit_is_answered_an_error_naming_the_plugin_not_an_exit(
        ) -> None:
    # In-process, SystemExit went through the host's task group: the conductor stopped.
    error = await failure(Exits(), "_ext/exit")
    assert error.code == ErrorCode.HANDLER_FAILED
    assert error.data == {"component": "exits", "method": "_ext/exit"}
    assert "exits failed handling _ext/exit" in error.message
    assert "sys.exit(3)" in error.message


async def test_a_notification_handler_calling_sys_exit_drops_it_and_the_chain_goes_on(
        ) -> None:
    proxy = Exits()
    async with open_test_chain([proxy], ScriptedAgent()) as client:
        with anyio.fail_after(5):
            await client.notify("_ext/exit-note", {})
            await proxy.noted.wait()
            assert await client.new_session()


class FailsInATaskGroup(Proxy):
    """Its handlers fail inside a task group of their own."""

    @on("_ext/one")
    async def one(self, ctx: ProxyContext, message: Message) -> object:
        async with anyio.create_task_group() as tg:
            tg.start_soon(self.fail, KeyError("missing"))
        return {}

    @on("_ext/two")
    async def two(self, ctx: ProxyContext, message: Message) -> object:
        async with anyio.create_task_group() as tg:
            tg.start_soon(self.fail, KeyError("missing"))
            tg.start_soon(self.fail, ValueError("wrong"))
        return {}

    @on("_ext/refuse")
    async def refuse(self, ctx: ProxyContext, message: Message) -> object:
        async with anyio.create_task_group() as tg:
            tg.start_soon(self.fail, RpcError(-32042, "not today", {"why": "policy"}))
        return {}

    @staticmethod
    async def fail(error: Exception) -> None:
        raise error


async def test_a_handler_failing_in_its_task_group_is_answered_with_the_real_cause() -> None:
    # It was "ExceptionGroup: unhandled errors in a TaskGroup (1 sub-exception)".
    error = await failure(FailsInATaskGroup(), "_ext/one")
    assert error.code == ErrorCode.HANDLER_FAILED
    assert error.message == "failsinataskgroup failed handling _ext/one: KeyError: 'missing'"


async def test_a_handler_failing_twice_in_its_task_group_is_answered_with_both_causes() -> None:
    error = await failure(FailsInATaskGroup(), "_ext/two")
    assert "KeyError: 'missing'" in error.message
    assert "ValueError: wrong" in error.message
    assert "TaskGroup" not in error.message


async def test_an_rpc_error_raised_in_a_handlers_task_group_is_its_answer() -> None:
    error = await failure(FailsInATaskGroup(), "_ext/refuse")
    assert (error.code, error.message, error.data) == (-32042, "not today", {"why": "policy"})


class AnswersOddly(Proxy):
    """Answers, or notifies the editor, with Python values JSON has no word for."""

    ODD: ClassVar[dict[str, Any]] = {
        "nan": {"score": math.nan}, "inf": [1, -math.inf], "bytes": {"b": b"\x00"},
        "set": {"tags": {"a", "b"}}}

    @on("_ext/answer")
    async def answer(self, ctx: ProxyContext, message: Message) -> object:
        return self.ODD[message.params_value()["odd"]]

    @on("_ext/notify")
    async def notify(self, ctx: ProxyContext, message: Message) -> object:
        await ctx.notify("_ext/note", self.ODD[message.params_value()["odd"]],
                         to="predecessor")
        return {}


@pytest.mark.parametrize("method", ["_ext/answer", "_ext/notify"])
@pytest.mark.parametrize(("odd", "says"), [
    ("nan", "nan at .score"), ("inf", "-inf at [1]"), ("bytes", "bytes at .b"),
    ("set", "a set at .tags")])
async def test_a_value_that_is_not_json_is_an_error_naming_the_proxy_not_a_silent_null(
        method: str, odd: str, says: str) -> None:
    # msgspec encoded NaN and Infinity as null, bytes as base64, a set as an array in no
    # order: the editor got something the plugin never meant, and nobody was told.
    error = await failure(AnswersOddly(), method, {"odd": odd})
    assert error.code == ErrorCode.HANDLER_FAILED
    assert error.data == {"component": "answersoddly", "method": method}
    assert f"not JSON: {says}" in error.message
