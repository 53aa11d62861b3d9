"""Trace hooks: the router reports every message on every hop, in causal order."""

from __future__ import annotations

from typing import TYPE_CHECKING, Literal, Protocol

if TYPE_CHECKING:
    from conductor.jsonrpc.message import Message

Direction = Literal["in", "out"]  # in: component -> conductor; out: conductor -> component


class TraceSink(Protocol):
    """Receives trace events. Must not block: called from routing tasks."""

    def message(self, hop: str, direction: Direction, message: Message | list[Message]) -> None:
        """A message crossed the hop between the conductor and `hop`."""
        ...

    def lifecycle(self, component: str, event: str, **fields: object) -> None:
        """spawned / stderr / exited / error / ..."""
        ...
