"""A re-attach's request to a component that has already failed fails at once."""

from __future__ import annotations

from types import SimpleNamespace
from typing import TYPE_CHECKING, Any

import anyio
import pytest
from msgspec import UNSET

from conductor.errors import ComponentExitedError
from conductor.routing.deadlines import Timeouts
from conductor.routing.recovery import Recovery
from conductor.routing.topology import Hop

if TYPE_CHECKING:
    from conductor.jsonrpc.message import Message


class NullSink:
    async def send(self, item: Message) -> None:
        pass

    async def aclose(self) -> None:
        pass


async def test_a_restarted_agent_that_died_before_it_was_asked_fails_the_reattach_at_once(
        ) -> None:
    hop = Hop("agent", NullSink())
    died = ComponentExitedError("agent", 9, [])
    await hop.fail(died)
    chain: Any = SimpleNamespace(timeouts=Timeouts(request=30.0))
    with anyio.fail_after(5), pytest.raises(ComponentExitedError):  # not after 30 s
        await Recovery(chain)._ask(hop, "initialize", UNSET)
