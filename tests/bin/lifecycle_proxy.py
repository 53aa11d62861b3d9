"""A plugin proxy that logs its lifecycle hooks to a file it keeps open (buffered) from
chain_started to chain_stopped: `plugin = "tests/bin/lifecycle_proxy.py:Lifecycle"`."""

from __future__ import annotations

from typing import IO

from pydantic import BaseModel, ConfigDict

from conductor.plugins import Proxy, SessionScope


class LifecycleOptions(BaseModel):
    model_config = ConfigDict(extra="forbid")

    path: str


class Lifecycle(Proxy[LifecycleOptions]):
    """Logs chain_started, sessions and chain_stopped to options.path."""

    options_model = LifecycleOptions
    log_file: IO[str] | None = None

    async def chain_started(self) -> None:
        # Buffered on purpose: only chain_stopped's close writes it out.
        # A local file opens at once: no worker thread needed.
        self.log_file = open(self.options.path, "w", encoding="utf-8")  # noqa: ASYNC230
        self.log_file.write("chain_started\n")

    async def session_opened(self, session: SessionScope) -> None:
        assert self.log_file is not None
        self.log_file.write(f"opened {session.session_id}\n")

    async def session_closed(self, session: SessionScope) -> None:
        assert self.log_file is not None
        self.log_file.write(f"closed {session.session_id}: {session.closed_reason}\n")

    async def chain_stopped(self) -> None:
        assert self.log_file is not None
        self.log_file.write("chain_stopped\n")
        self.log_file.close()
