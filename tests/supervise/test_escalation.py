"""Stopping a component, step by step, on a fake process under trio's virtual clock.

Virtual time is deterministic, so these tests assert *when* each step happens, not only
in which order; the real-process side of the same steps is in tests/e2e/test_processes.py.
"""

from __future__ import annotations

import math
import signal
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import anyio
import pytest
from trio.testing import MockClock

from conductor.supervise.escalation import GONE_POLL, KILL_WAIT, stop_escalating

if TYPE_CHECKING:
    from collections.abc import Sequence

GRACE = 3.0
TERM, KILL = signal.SIGTERM, signal.SIGKILL


@pytest.fixture
def anyio_backend() -> tuple[str, dict[str, object]]:
    # autojump: whenever every task is waiting, the clock jumps to the next deadline.
    return "trio", {"clock": MockClock(autojump_threshold=0)}


@dataclass
class FakeProcess:
    """Dies `exits_after` seconds after EOF (leader only) or after a signal it does not
    ignore; SIGKILL is never ignored, except by a process stuck in the kernel."""

    pid: int
    exits_after: float = 0.0
    exits_on_eof: bool = False
    ignores: frozenset[int] = frozenset()
    unkillable: bool = False
    dies_at: float = math.inf

    def alive(self, now: float) -> bool:
        return now < self.dies_at

    def end(self, now: float, delay: float) -> None:
        if not self.unkillable:
            self.dies_at = min(self.dies_at, now + delay)

    def receive(self, sig: int, now: float) -> None:
        if sig == KILL:
            self.end(now, 0.0)
        elif sig not in self.ignores:
            self.end(now, self.exits_after)


@dataclass
class FakeControl:
    """`ProcessControl` over fake processes: a leader, the rest of its group, and strays
    (descendants that left the group). Records what was done, and when."""

    leader: FakeProcess
    group: list[FakeProcess] = field(default_factory=list)
    strays: list[FakeProcess] = field(default_factory=list)
    log: list[tuple[float, str]] = field(default_factory=list)
    start: float = field(default_factory=anyio.current_time)

    def now(self) -> float:
        return anyio.current_time() - self.start

    def record(self, what: str) -> None:
        self.log.append((round(self.now(), 6), what))

    async def close_input(self) -> None:
        self.record("eof")
        if self.leader.exits_on_eof:
            self.leader.end(self.now(), self.leader.exits_after)

    async def wait_exited(self) -> None:
        while self.leader.alive(self.now()):
            if self.leader.dies_at == math.inf:
                await anyio.sleep_forever()
            await anyio.sleep(self.leader.dies_at - self.now())

    def signal_group(self, sig: int) -> bool:
        living = [p for p in [self.leader, *self.group] if p.alive(self.now())]
        if sig and living:
            self.record(f"group {signal.Signals(sig).name}")
        for p in living:
            if sig:
                p.receive(sig, self.now())
        return bool(living)

    async def group_running(self) -> bool:
        return self.signal_group(0)

    async def find_strays(self) -> list[int]:
        return [p.pid for p in self.strays if p.alive(self.now())]

    def signal_strays(self, pids: Sequence[int], sig: int) -> None:
        self.record(f"strays {signal.Signals(sig).name} {list(pids)}")
        for p in self.strays:
            if p.pid in pids:
                p.receive(sig, self.now())


async def stop(control: FakeControl) -> list[tuple[float, str]]:
    await stop_escalating(control, GRACE)
    control.record("stopped")
    return control.log


def assert_steps(log: list[tuple[float, str]], expected: list[tuple[float, str]]) -> None:
    """The same steps in the same order, each at its time or within one look after it
    (a group's end is noticed by looking every GONE_POLL)."""
    assert [what for _, what in log] == [what for _, what in expected]
    for (at, what), (due, _) in zip(log, expected, strict=True):
        assert due - 1e-9 <= at <= due + GONE_POLL + 1e-9, (what, at, due)


async def test_a_leader_that_exits_on_eof_is_never_signalled() -> None:
    control = FakeControl(FakeProcess(1, exits_on_eof=True, exits_after=0.5))
    assert_steps(await stop(control), [(0, "eof"), (0.5, "stopped")])


async def test_a_leader_that_ignores_eof_gets_sigterm_once_the_grace_is_over() -> None:
    control = FakeControl(FakeProcess(1, exits_after=0.1))
    assert_steps(await stop(control), [
        (0, "eof"), (GRACE, "group SIGTERM"), (GRACE + 0.1, "stopped")])


async def test_a_leader_that_ignores_sigterm_gets_sigkill_one_grace_later() -> None:
    control = FakeControl(FakeProcess(1, ignores=frozenset({TERM})))
    assert_steps(await stop(control), [
        (0, "eof"), (GRACE, "group SIGTERM"), (2 * GRACE, "group SIGKILL"),
        (2 * GRACE, "stopped")])


async def test_the_group_is_signalled_even_after_its_leader_exited() -> None:
    # npx/uvx: the wrapper exits on EOF, what it started stays in the group.
    grandchild = FakeProcess(2, exits_after=0.2)
    control = FakeControl(FakeProcess(1, exits_on_eof=True), group=[grandchild])
    assert_steps(await stop(control), [(0, "eof"), (0, "group SIGTERM"), (0.2, "stopped")])


async def test_a_grandchild_that_ignores_sigterm_is_killed_with_the_group() -> None:
    grandchild = FakeProcess(2, ignores=frozenset({TERM}))
    control = FakeControl(FakeProcess(1, exits_on_eof=True), group=[grandchild])
    assert_steps(await stop(control), [
        (0, "eof"), (0, "group SIGTERM"), (GRACE, "group SIGKILL"), (GRACE, "stopped")])


async def test_strays_are_stopped_after_the_group_term_first_then_kill() -> None:
    strays = [FakeProcess(7, exits_after=0.1), FakeProcess(8, ignores=frozenset({TERM}))]
    control = FakeControl(FakeProcess(1, exits_on_eof=True), strays=strays)
    assert_steps(await stop(control), [
        (0, "eof"), (0, "strays SIGTERM [7, 8]"), (GRACE, "strays SIGKILL [8]"),
        (GRACE, "stopped")])


async def test_a_process_that_cannot_be_killed_still_lets_stop_return_in_bounded_time() -> None:
    # Stuck in the kernel (state D): no signal ends it. Stop gives up after its waits.
    control = FakeControl(FakeProcess(1, ignores=frozenset({TERM}), unkillable=True))
    assert_steps(await stop(control), [
        (0, "eof"), (GRACE, "group SIGTERM"), (2 * GRACE, "group SIGKILL"),
        (2 * GRACE + 2 * KILL_WAIT, "stopped")])
