"""One JSON-RPC connection as the conductor sees it: ids, pending replies, batches."""

from __future__ import annotations

from collections import deque
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import anyio

from conductor.jsonrpc.message import Message, Raw, id_key, int_id

if TYPE_CHECKING:
    from conductor.acp import Dialect
    from conductor.errors import ComponentError
    from conductor.transport.base import MessageSink

ResponseHook = Callable[[Message], Awaitable[Message | None]]


@dataclass(slots=True)
class Pending:
    """A request the conductor sent on a wire and owes an answer for."""

    method: str
    origin: Wire | None            # where the answer goes; None: the conductor asked itself
    origin_id: Raw | None          # the id the origin used, echoed back exactly
    hook: ResponseHook | None = None
    waiter: anyio.Event | None = None
    answer: Message | None = None
    client_id: Raw | None = None   # the editor-side id this request belongs to, when known


@dataclass(slots=True)
class BatchCollector:
    """Answers owed for one batch that arrived on a wire; sent as one array when complete.

    `wanted` counts the answers still owed per id, keyed by the id's exact bytes (answers
    echo them): a batch may repeat an id, or use ids that are not keys elsewhere (1.5).
    """

    wanted: dict[bytes, int]
    replies: list[Message] = field(default_factory=list)
    intake_open: bool = True

    @property
    def complete(self) -> bool:
        return not self.intake_open and not self.wanted

    def claim(self, ident: bytes) -> bool:
        """Count an answer with this id against the batch; False when it owes none."""
        left = self.wanted.get(ident)
        if left is None:
            return False
        if left == 1:
            del self.wanted[ident]
        else:
            self.wanted[ident] = left - 1
        return True


class _WriterTurn:
    """FIFO mutual exclusion for the writers of one wire.

    It is taken once per routed message, so when free it costs one flag test: anyio.Lock
    (even with fast_acquire) looks up the task and walks its cancel scopes every time.
    """

    __slots__ = ("_busy", "_waiters")

    def __init__(self) -> None:
        self._busy = False
        self._waiters: deque[anyio.Event] = deque()

    async def __aenter__(self) -> None:
        if not self._busy:
            self._busy = True
            return
        turn = anyio.Event()
        self._waiters.append(turn)
        try:
            await turn.wait()
        except BaseException:
            if turn.is_set():
                self._release()  # handed the turn just as we were cancelled: pass it on
            else:
                self._waiters.remove(turn)
            raise

    async def __aexit__(self, *exc_info: object) -> None:
        self._release()

    def _release(self) -> None:
        if self._waiters:
            self._waiters.popleft().set()  # stays busy: the turn goes to the next writer
        else:
            self._busy = False


class Wire:
    """Per-hop state. Routing writes through `send`; the sink does the I/O."""

    def __init__(self, name: str, sink: MessageSink, *, dialect: Dialect | None = None) -> None:
        self.name = name
        self.sink = sink
        self.dialect = dialect                 # for proxies: how they spell the envelope
        self.dialect_forced = dialect is not None
        # In-process proxies may say a message would pass them untouched (see Chain._forward).
        self.passes: Callable[..., bool] | None = getattr(sink, "passes", None)
        self.pending: dict[object, Pending] = {}
        self.inbound: dict[object, tuple[Wire, int]] = {}  # their request id -> our forward
        self._quiet = anyio.Event()  # set while nothing they asked is in flight
        self._quiet.set()
        self.failure: ComponentError | None = None
        self._next_id = 0
        # Taking a free turn does not yield to the event loop (anyio.Lock would: one loop
        # iteration per message). Fairness comes from the readers instead.
        self._lock = _WriterTurn()
        self._batches: list[BatchCollector] = []

    def __repr__(self) -> str:
        return f"Wire({self.name})"

    def track_inbound(self, ident: Raw, forwarded: tuple[Wire, int]) -> None:
        """Remember where their request went, so a cancel can follow it."""
        try:
            self.inbound[id_key(ident)] = forwarded
        except ValueError:
            return  # an id we cannot key cannot be cancelled either
        if self._quiet.is_set():
            self._quiet = anyio.Event()

    def untrack_inbound(self, ident: Raw) -> None:
        try:
            self.inbound.pop(id_key(ident), None)
        except ValueError:
            return
        if not self.inbound:
            self._quiet.set()

    async def wait_quiet(self) -> None:
        """Until every request received on this wire has been answered."""
        await self._quiet.wait()

    def allocate(self, pending: Pending) -> tuple[int, Raw]:
        self._next_id += 1
        self.pending[self._next_id] = pending
        return self._next_id, int_id(self._next_id)

    async def send(self, message: Message) -> None:
        if self._batches and message.is_response:
            batch = self._collector_for(message)
            if batch is not None:
                batch.replies.append(message)
                await self._flush_if_complete(batch)
                return
        async with self._lock:  # one writer per pipe, FIFO
            await self.sink.send(message)

    def open_batch(self, request_ids: list[Raw]) -> BatchCollector:
        """Start collecting: replies to these ids are held back until `end_batch`."""
        wanted: dict[bytes, int] = {}
        for ident in request_ids:
            key = bytes(ident)
            wanted[key] = wanted.get(key, 0) + 1
        batch = BatchCollector(wanted)
        self._batches.append(batch)
        return batch

    async def end_batch(self, batch: BatchCollector) -> None:
        batch.intake_open = False
        await self._flush_if_complete(batch)

    def _collector_for(self, message: Message) -> BatchCollector | None:
        key = bytes(message.id)  # type: ignore[arg-type]
        for batch in self._batches:
            if batch.claim(key):
                return batch
        return None

    async def _flush_if_complete(self, batch: BatchCollector) -> None:
        if not batch.complete:
            return
        self._batches.remove(batch)
        if batch.replies:  # a batch of only notifications gets nothing
            async with self._lock:
                await self.sink.send(batch.replies)
