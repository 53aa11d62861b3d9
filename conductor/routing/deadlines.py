"""Deadlines for forwarded requests: `request_timeout` and `prompt_timeout`.

A request forwarded toward the agent (to a proxy, the agent, or in proxy mode our
successor) and left unanswered for its timeout is answered by the conductor with
`REQUEST_TIMEOUT` (-33005), naming the component that holds it, and cancelled there.
Requests travelling up to the editor are never timed: they wait for a person.

The hot path pays one `heappush` per forwarded request and nothing when both timeouts are
off. One task (`serve`) scans the heap every sixteenth of the shorter timeout; answered
requests are skipped when they surface, and the heap is rebuilt when it holds mostly such
leftovers, so it stays proportional to what is really pending. Its entries refer to their
requests weakly, so such a leftover holds no payload.

Staggered deadlines name the right component: a request held by a component gets one
`STAGGER` (a quarter of the timeout if that is less) more per component after it in the
chain. When the agent is the one that does
not answer, its own timeout fires first and travels up through the proxies as their
answer; a proxy is named only when it holds the request itself.
"""

from __future__ import annotations

import heapq
import itertools
import time
import weakref
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Final

from conductor.record import Record

if TYPE_CHECKING:
    from conductor.routing.topology import Hop
    from conductor.rpc.endpoint import Outgoing

STAGGER: Final = 1.0  # seconds more per component after the one holding the request


class Timeouts(Record, frozen=True):
    """The chain's timers (`[conductor]` settings; None: off)."""

    request: float | None = None         # every request toward the agent but session/prompt
    prompt: float | None = None          # session/prompt (a turn), measured the same way
    session_idle_expiry: float | None = None

    @property
    def any_deadline(self) -> bool:
        return self.request is not None or self.prompt is not None


class Expired(Record, frozen=True):
    """A request whose deadline passed while it was still pending."""

    hop: Hop
    outgoing: Outgoing
    timeout: float
    session_id: str | None  # for a prompt: the turn to cancel


class _Timed(Record, frozen=True):
    """A request in the heap. It refers to the request weakly: an answered one, and the
    payload its forward carries (a prompt's images), are freed at once, not when its
    deadline comes up, possibly a whole prompt_timeout later."""

    hop: Hop
    outgoing: weakref.ref[Outgoing]
    timeout: float
    session_id: str | None

    def pending(self) -> Outgoing | None:
        outgoing = self.outgoing()
        if outgoing is None or self.hop.pending.get(outgoing.ident) is not outgoing:
            return None
        return outgoing


Entry = tuple[float, int, _Timed]
OnExpired = Callable[[Expired], Awaitable[None]]


class Deadlines:
    """A heap of (deadline, seq, request) with one scanning task."""

    def __init__(self, timeouts: Timeouts, clock: Callable[[], float] = time.monotonic) -> None:
        self.timeouts = timeouts
        self.clock = clock
        self._heap: list[Entry] = []
        self._seq = itertools.count()
        self._rebuild_at = 1024

    def add(self, hop: Hop, outgoing: Outgoing, *, prompt: bool, after: int,
            session_id: str | None = None) -> None:
        """Time `outgoing`, sent on `hop`, held by a component with `after` more after it."""
        timeout = self.timeouts.prompt if prompt else self.timeouts.request
        if timeout is None:
            return
        deadline = self.clock() + timeout + min(STAGGER, timeout / 4) * after
        heapq.heappush(self._heap, (deadline, next(self._seq),
                                    _Timed(hop, weakref.ref(outgoing), timeout, session_id)))
        if len(self._heap) > self._rebuild_at:
            self._heap = [e for e in self._heap if e[2].pending() is not None]
            heapq.heapify(self._heap)
            self._rebuild_at = 2 * len(self._heap) + 1024

    def __len__(self) -> int:
        return len(self._heap)

    def due(self) -> list[Expired]:
        """Pop every entry whose deadline has passed and is still pending."""
        now, heap, out = self.clock(), self._heap, []
        while heap and heap[0][0] <= now:
            timed = heapq.heappop(heap)[2]
            outgoing = timed.pending()
            if outgoing is not None:
                out.append(Expired(timed.hop, outgoing, timed.timeout, timed.session_id))
        return out

    async def serve(self, on_expired: OnExpired) -> None:
        """Scan until cancelled, handing each expired request to `on_expired`."""
        import anyio  # here: config imports this module, and chain files are read early

        shortest = min(t for t in (self.timeouts.request, self.timeouts.prompt)
                       if t is not None)
        while True:
            await anyio.sleep(shortest / 16)
            for expired in self.due():
                await on_expired(expired)
