"""When a failed component is started again (`restart = "on-failure"`), and when not.

Bounded back-off: the first restart waits `FIRST` seconds, each consecutive failure twice as
long up to `CAP`; a run that served `STABLE` seconds or more counts as healthy and starts
the count again. It is restarted at most `max_restarts` times in a row: the failure after
that gives it up.
No clock here: the caller says how long the run served (a restart: since it was re-attached).
"""

from __future__ import annotations

from typing import Final

FIRST: Final = 0.5
CAP: Final = 30.0
STABLE: Final = 60.0


class Backoff:
    """Consecutive failures of one component, and the wait before its next start."""

    def __init__(self, max_restarts: int) -> None:
        self.max_restarts = max_restarts
        self.failures = 0

    def failed(self, ran_for: float) -> float | None:
        """It failed after running `ran_for` seconds: how long to wait before starting it
        again, or None when it is given up."""
        if ran_for >= STABLE:
            self.failures = 0
        self.failures += 1
        if self.failures > self.max_restarts:
            return None
        return min(CAP, FIRST * 2.0 ** (self.failures - 1))
