"""What the routing layer needs from a transport."""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from conductor.jsonrpc.message import Message


class MessageSink(Protocol):
    """Something messages can be sent to. One call at a time per sink is the caller's job."""

    async def send(self, item: Message | list[Message]) -> None:
        """Send one message, or a batch. Raises anyio.BrokenResourceError when the peer is gone."""
        ...

    async def aclose(self) -> None:
        """Signal end of input to the peer (EOF). Idempotent."""
        ...
