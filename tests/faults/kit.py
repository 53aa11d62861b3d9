"""The fault suite's parts: misbehaving in-process components, and what every case checks.

`faulty.py` (next to this file) is the subprocess component; `FaultyAgent` and
`FaultyProxy` misbehave the same way in memory (as far as an in-process component can:
a plugin hands objects over, so it cannot write bytes). Steps count the requests a
component receives from its predecessor, from 1 (initialize).
"""

from __future__ import annotations

import json
import sys
from collections import Counter
from typing import TYPE_CHECKING, Any

import anyio

from conductor.jsonrpc.message import Batch, Request, Response
from conductor.plugins import Proxy, ProxyContext, on
from conductor.testing import ScriptedAgent, TestClient
from tests.conftest import REPO

if TYPE_CHECKING:
    from conductor.jsonrpc.message import Message
    from conductor.transport.base import Incoming

FAULTY = REPO / "tests" / "faults" / "faulty.py"
FLOOD = 300       # notifications a flooding component sends
DEEP = 5000       # nesting of a too-deep answer

COMPONENT_FAILED, HANDLER_FAILED, FRAME_TOO_LARGE, REQUEST_TIMEOUT = \
    -33001, -33002, -33003, -33005


def faulty_argv(*flags: str) -> str:
    """faulty.py as a chain file's `command` (a TOML array)."""
    return json.dumps([sys.executable, str(FAULTY), *flags])


def update(sid: str, text: str) -> dict[str, Any]:
    return {"sessionId": sid, "update": {"sessionUpdate": "agent_message_chunk",
                                         "content": {"type": "text", "text": text}}}


class CountingClient(TestClient):
    """Counts every answer, by id: each request must get exactly one."""

    def __init__(self) -> None:
        super().__init__()
        self.answers: Counter[bytes] = Counter()

    async def deliver(self, item: Incoming) -> None:
        for message in item.items if isinstance(item, Batch) else [item]:
            if isinstance(message, Response):
                self.answers[bytes(message.id)] += 1
        await super().deliver(item)

    def assert_each_answered_once(self) -> None:
        assert self.answers, "no answers at all"
        assert set(self.answers.values()) == {1}, self.answers


class FaultyAgent(ScriptedAgent):
    """An in-memory agent that misbehaves at its steps: crash (hangs up), silent, flood,
    garbage, invalid-utf8, deep (written as raw bytes on its pipe)."""

    def __init__(self, faults: dict[int, str]) -> None:
        super().__init__()
        self.faults = faults
        self.steps = 0

    async def answer(self, message: Request) -> Any:
        self.steps += 1
        fault = self.faults.get(self.steps)
        if fault == "crash":
            await self.hang_up()
            await anyio.sleep_forever()
        if fault == "silent":
            await anyio.sleep_forever()
        if fault == "flood":
            sid = (message.params_value() or {}).get("sessionId", "flood")
            for i in range(FLOOD):
                await self.notify("session/update", update(sid, f"flood {i}"))
        if fault == "garbage":
            await self.write_raw(b"garbage \x1b[31mnot json\x1b[0m\n\xff\xfe raw\n")
        if fault == "invalid-utf8":
            await self.write_raw(b'{"jsonrpc":"2.0","method":"session/update","params":'
                                 b'{"sessionId":"x","note":"bad \xff byte"}}\n')
        if fault == "deep":
            await self.write_raw(b'{"jsonrpc":"2.0","id":' + bytes(message.id)
                                 + b',"result":' + b"[" * DEEP + b"]" * DEEP + b"}\n")
            await anyio.sleep_forever()  # that was its answer
        return await super().answer(message)

    async def write_raw(self, data: bytes) -> None:
        """Bytes straight onto the agent's pipe (open_test_chain(transport="pipes"))."""
        assert self.endpoint is not None
        await self.endpoint.sink._stream.send(data)  # type: ignore[attr-defined]


class FaultyProxy(Proxy):
    """An in-process proxy that forwards everything and misbehaves at its steps: crash (its
    handler raises), silent (never answers), flood (notifies its predecessor first)."""

    def __init__(self, name: str, faults: dict[int, str] | None = None) -> None:
        super().__init__()
        self.rename(name)
        self.faults = faults or {}
        self.steps = 0

    @on("*")
    async def each(self, ctx: ProxyContext, message: Message) -> object:
        if not isinstance(message, Request):
            return await ctx.forward()
        self.steps += 1
        fault = self.faults.get(self.steps)
        if fault == "crash":
            raise RuntimeError(f"{self.name} crashed at step {self.steps}")
        if fault == "silent":
            ctx.release()
            await anyio.sleep_forever()
        if fault == "flood":
            sid = (message.params_value() or {}).get("sessionId", "flood")
            for i in range(FLOOD):
                await ctx.notify("session/update", update(sid, f"flood {i}"), to="predecessor")
        return await ctx.forward()
