"""The restart policy's back-off: bounded waits, a healthy run starts the count again."""

from __future__ import annotations

import pytest

from conductor.config import parse_chain
from conductor.errors import ConfigError
from conductor.supervise.restart import CAP, STABLE, Backoff


def test_each_consecutive_failure_waits_twice_as_long_up_to_the_cap_then_gives_up() -> None:
    backoff = Backoff(max_restarts=9)
    delays = [backoff.failed(ran_for=0.1) for _ in range(10)]
    assert delays == [0.5, 1.0, 2.0, 4.0, 8.0, 16.0, CAP, CAP, CAP, None]


def test_a_run_that_lasted_long_enough_starts_the_count_again() -> None:
    backoff = Backoff(max_restarts=2)
    assert [backoff.failed(1), backoff.failed(1)] == [0.5, 1.0]
    assert backoff.failed(STABLE) == 0.5
    assert backoff.failed(1) == 1.0
    assert backoff.failed(1) is None


@pytest.mark.parametrize(("table", "message"), [
    ({"agent": {"command": "a", "optional": True}}, "agent.optional: the agent cannot be"),
    ({"proxy": [{"use": "redact", "restart": "on-failure"}], "agent": {"command": "a"}},
     "restart and optional are for command components"),
    ({"agent": {"command": "a", "restart": "always"}}, "agent.restart"),
])
def test_restart_and_optional_are_checked_where_they_are_written(
        table: dict[str, object], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        parse_chain(table)
