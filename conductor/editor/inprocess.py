"""The conductor that `run`, `check` and `call` drive: `serve_chain` in this process, over
in-memory byte pipes, so the editor side and the chain share one event loop and the chain
runs exactly the code an editor's conductor process runs."""

from __future__ import annotations

from typing import TYPE_CHECKING

import anyio
import msgspec

from conductor.errors import ConductorError
from conductor.serve import RunOptions, serve_chain
from conductor.transport.memory import memory_pipe

if TYPE_CHECKING:
    from conductor.config import ChainConfig


class InProcessChain:
    """Start `serve` in a task; talk to it through `to_conductor` / `from_conductor`.

    When it ends, `done` is set with its exit `code`, or the ConductorError it raised in
    `error` (its output is closed then, so the editor side sees EOF instead of waiting)."""

    def __init__(self, config: ChainConfig, options: RunOptions) -> None:
        self._config = config
        # The editor side watches signals itself (a Ctrl-C cancels the turn first).
        self._options = msgspec.structs.replace(options, handle_signals=False,
                                                editor_in_process=True)
        self.to_conductor, self._conductor_in = memory_pipe()
        self._conductor_out, self.from_conductor = memory_pipe()
        self.code: int | None = None
        self.error: ConductorError | None = None
        self.done = anyio.Event()

    async def serve(self) -> None:
        try:
            self.code = await serve_chain(self._config, self._conductor_in,
                                          self._conductor_out, self._options)
        except ConductorError as e:
            self.error = e
            await self._conductor_out.aclose()
        finally:
            self.done.set()
