"""The commands run on uvloop where it is installed, and on asyncio's own loop when asked:
the same chain works on both (conductor/cli/loop.py)."""

from __future__ import annotations

import importlib.util

import pytest

from conductor.cli.loop import LOOP_ENV, wants_uvloop
from tests.wire_client import chain_args, open_conductor

HAS_UVLOOP = importlib.util.find_spec("uvloop") is not None


@pytest.mark.parametrize("choice", ["asyncio", "uvloop"])
async def test_a_chain_serves_the_editor_on_either_event_loop(choice: str) -> None:
    if choice == "uvloop" and not HAS_UVLOOP:
        pytest.skip("uvloop is not installed here (it has no build for this platform)")
    env = {LOOP_ENV: "asyncio"} if choice == "asyncio" else {}
    async with open_conductor("--log-level", "debug", *chain_args(1), env=env,
                              check_exit=True) as c:
        await c.initialize()
        assert (await c.request("_test/echo", {"ok": 1}))["result"] == {"ok": 1}
    assert f"event loop: {choice}" in c.stderr_text


def test_asyncio_s_own_loop_is_chosen_when_asked(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(LOOP_ENV, "asyncio")
    assert not wants_uvloop()
    monkeypatch.delenv(LOOP_ENV)
    assert wants_uvloop() is HAS_UVLOOP
