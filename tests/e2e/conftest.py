"""e2e tests drive real subprocesses: the backend of the test process itself adds nothing
there, so they run on asyncio only (in-process tests cover both backends)."""

from __future__ import annotations

import pytest


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"
