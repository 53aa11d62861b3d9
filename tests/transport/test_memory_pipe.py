"""In-memory byte pipes (`run` and tests talk to the conductor through them)."""

from __future__ import annotations

import tracemalloc

from conductor.transport.memory import memory_pipe


async def test_a_large_write_is_received_in_pieces_without_copying_the_rest() -> None:
    send, receive = memory_pipe()
    item = b"x" * (8 * 1024 * 1024)
    await send.send(item)
    tracemalloc.start()
    try:
        tracemalloc.reset_peak()
        total = 0
        while total < len(item):
            total += len(await receive.receive(4096))
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
        await send.aclose()
        await receive.aclose()
    assert total == len(item)
    assert peak < 1024 * 1024  # the old receive copied the whole rest on every call
