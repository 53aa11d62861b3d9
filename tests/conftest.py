"""Shared fixtures: how tests start the conductor and the repo's test components."""

from __future__ import annotations

import gc
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING

# Where PYTHONDONTWRITEBYTECODE is set (as on many CI images), pytest would not cache the
# test modules and plugins it rewrites for assert messages (hypothesis, the conductor,
# these tests: ~270 modules), and every xdist worker would rewrite them all again on every
# run, ~2 s of CPU each. The sources are compiled up front anyway (pytest_sessionstart).
sys.dont_write_bytecode = False

import pytest  # noqa: E402
from hypothesis import settings  # noqa: E402

if TYPE_CHECKING:
    from collections.abc import Callable, Iterable, Iterator

# Hypothesis' per-example deadline is a wall-clock assertion: on a loaded 2-core machine it
# fails tests that are correct. Examples are bounded by max_examples instead.
settings.register_profile("acp-conductor", deadline=None)
settings.load_profile("acp-conductor")

REPO = Path(__file__).resolve().parent.parent
BIN = REPO / "tests" / "bin"


def pytest_xdist_auto_num_workers(config: pytest.Config) -> int:
    # `-n auto` (pyproject.toml): two workers per core. Most end-to-end tests spend their
    # time waiting on the processes they start; on 2 cores, 4 workers took 104 s where 2 took
    # 145 s and 6 took 116 s.
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else \
        (os.cpu_count() or 1)
    return min(2 * cores, 16)


def pytest_sessionstart(session: pytest.Session) -> None:
    # Most end-to-end tests start a new interpreter (a conductor, a proxy, an agent). Where
    # PYTHONDONTWRITEBYTECODE is set (as on many CI images) each would compile the package
    # from source again, about 50 ms a start: compile it once, up front.
    import compileall

    for package in ("conductor", "proxies", "tests/bin"):
        compileall.compile_dir(REPO / package, quiet=1)


def conductor_argv(*args: str) -> list[str]:
    """Run this checkout's conductor (not whatever is installed) as a subprocess."""
    return [sys.executable, "-m", "conductor", *args]


def child_env(**extra: str) -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), str(REPO / "proxies"),
                                                      env.get("PYTHONPATH")]))
    env["PYTHONUNBUFFERED"] = "1"
    env.update(extra)
    return env


def py(script: str, *args: str) -> str:
    """A chain command running one of tests/bin's scripts with this interpreter."""
    import shlex

    return shlex.join([sys.executable, str(BIN / script), *args])


def exited(pids: Iterable[int], timeout: float = 5) -> bool:
    """True once every pid has exited, within `timeout` in all (a bound: they were just
    stopped). A zombie has exited: reaping orphans is their reaper's job, and the reaper
    here (the container's pid 1) may take a second or more to do it. Waits on a pidfd,
    which becomes readable at the exit itself."""
    import select
    import time

    deadline = time.monotonic() + timeout
    for pid in pids:
        try:
            fd = os.pidfd_open(pid)
        except ProcessLookupError:
            continue  # exited and reaped already
        try:
            ready, _, _ = select.select([fd], [], [], max(deadline - time.monotonic(), 0))
        finally:
            os.close(fd)
        if not ready:
            return False
    return True


def doc_files(page: str) -> dict[str, str]:
    """The code blocks of docs/PAGE that start with a `# FILE` line, by file name: the
    files a page shows, for tests that run them as written."""
    files = {}
    text = (REPO / "docs" / page).read_text(encoding="utf-8")
    for block in text.split("```")[1::2]:
        body = block.split("\n", 1)[1]
        first = body.split("\n", 1)[0]
        if first.startswith("# ") and "." in first and " " not in first[2:]:
            files[first[2:]] = body
    return files


@pytest.fixture(params=[pytest.param("asyncio", id="asyncio"),
                        pytest.param("trio", id="trio")])
def anyio_backend(request: pytest.FixtureRequest) -> str:
    """The core is backend-neutral: in-process tests run on both of anyio's backends."""
    return str(request.param)


@pytest.fixture
def objects_made_since_start() -> Iterator[Callable[[], list[object]]]:
    """A function giving the objects made since the test started that are still alive,
    after a full collection: for tests that count what a run leaves behind.

    The heap from before is collected and then frozen (set aside): a count collects and
    scans only what the test made, not the ~1.6 million objects of a worker that has
    imported every test module (0.2 s a count). What is frozen was alive, and keeps alive
    only what it would anyway."""
    gc.collect()
    gc.freeze()

    def alive() -> list[object]:
        gc.collect()
        return [o for generation in range(3) for o in gc.get_objects(generation)]

    try:
        yield alive
    finally:
        gc.unfreeze()
