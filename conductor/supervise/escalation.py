"""How a component is stopped: which step comes when, and how long each may take.

No OS call here: signals, exits and /proc scans go through `ProcessControl`, so the same
escalation runs on a real process (`component.py`) and on a fake one under a virtual clock
(tests/supervise).
"""

from __future__ import annotations

import logging
import signal
from typing import TYPE_CHECKING, Protocol

import anyio

if TYPE_CHECKING:
    from collections.abc import Sequence

log = logging.getLogger("acp_conductor.supervise")

KILL_WAIT = 2.0  # after SIGKILL, how long to wait for the kernel to finish the job
GONE_POLL = 0.02  # a process group, or processes we did not start, have no exit to wait on


class StrayControl(Protocol):
    """Finding and signalling processes by the token they carry."""

    async def find_strays(self) -> list[int]:
        """Live processes that carry the token: descendants that left their process group
        (setsid, double fork) or outlived their parent."""

    def signal_strays(self, pids: Sequence[int], sig: int) -> None:
        """Send `sig` to each of `pids`, ignoring the ones already gone."""


class ProcessControl(StrayControl, Protocol):
    """The OS side of stopping one component: its leader, its process group, its strays."""

    async def close_input(self) -> None:
        """EOF on the component's stdin."""

    async def wait_exited(self) -> None:
        """Until the leader has exited and been reaped. Unbounded: callers bound it."""

    def signal_group(self, sig: int) -> bool:
        """Send `sig` (0: only probe) to the component's process group; False when nobody
        is left in it."""

    async def group_running(self) -> bool:
        """Whether a member of the group has not exited yet. A zombie has exited: it only
        waits for its reaper, which for an orphan is pid 1, slow to reap in some VMs and
        never in a container whose pid 1 does not reap."""


async def stop_escalating(control: ProcessControl, grace: float) -> None:
    """EOF on stdin, wait, SIGTERM the group, wait, SIGKILL the group, then the strays.

    Every wait is bounded: at most 2 * grace + 2 * KILL_WAIT before the strays, whose
    stopping is bounded the same way.
    """
    await control.close_input()
    with anyio.move_on_after(grace):
        await control.wait_exited()
    # The group is signalled even when the leader exited: npx/uvx leave grandchildren.
    if control.signal_group(signal.SIGTERM):
        with anyio.move_on_after(grace):
            await _until_group_gone(control)
        if control.signal_group(signal.SIGKILL):
            with anyio.move_on_after(KILL_WAIT):
                await _until_group_gone(control)
    with anyio.move_on_after(KILL_WAIT):
        await control.wait_exited()
    await stop_strays(control, grace)


async def _until_group_gone(control: ProcessControl) -> None:
    while await control.group_running():  # noqa: ASYNC110 (nothing to wait on but the group)
        await anyio.sleep(GONE_POLL)


async def stop_strays(control: StrayControl, grace: float) -> None:
    """TERM, then KILL, whatever still carries the token. Bounded."""
    strays = await control.find_strays()
    if not strays:
        return
    log.warning("stopping %d process(es) that left the component's process group", len(strays))
    for sig, wait in ((signal.SIGTERM, grace), (signal.SIGKILL, KILL_WAIT)):
        control.signal_strays(strays, sig)
        with anyio.move_on_after(wait):
            while strays:
                await anyio.sleep(GONE_POLL)
                strays = await control.find_strays()
        if not strays:
            return
