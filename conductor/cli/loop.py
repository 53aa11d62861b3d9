"""The event loop every command runs on: uvloop where it is installed (a dependency on
Linux and macOS), else asyncio's own. The code is the same either way (anyio); uvloop's
loop is written in C, and a message that crosses the conductor wakes it twice, so it cuts
the median latency per hop by about a fifth (`bench/run_bench.py --only acp+0,acp+0-asyncio`,
docs/performance.md).

`ACP_CONDUCTOR_LOOP=asyncio` picks asyncio's own loop, e.g. to rule uvloop out when
chasing a bug.
"""

from __future__ import annotations

import importlib.util
import logging
import os
from typing import TYPE_CHECKING, Any, TypeVar

import anyio

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable

T = TypeVar("T")
LOOP_ENV = "ACP_CONDUCTOR_LOOP"
log = logging.getLogger("acp_conductor")


def wants_uvloop() -> bool:
    choice = os.environ.get(LOOP_ENV, "").strip().lower()
    if choice == "asyncio":
        return False
    return importlib.util.find_spec("uvloop") is not None


def run(func: Callable[..., Awaitable[T]], *args: Any) -> T:
    """`anyio.run(func, *args)` on the chosen loop."""
    fast = wants_uvloop()
    log.debug("event loop: %s", "uvloop" if fast else "asyncio")
    return anyio.run(func, *args, backend="asyncio", backend_options={"use_uvloop": fast})
