"""Start a chain's commands during the conductor's own start-up, when the client's
`initialize` is already waiting on stdin.

Nothing starts before the client's first message, and that message must be the request
`initialize` (protocol.md §3). An editor writes it as soon as it has started us, so by
the time the chain file is read it is usually in the pipe: the components are then started
at once, and their own start-up (an agent's interpreter and imports, often 40 ms or more)
overlaps the conductor's (the event loop, routing), instead of following it. The router
serves the processes started here as if it had started them when the `initialize`
reached it (`serve.py`, `open_component(started=...)`).

The check is the router's own (`acp.starts_chain`, on the frame its reader will see).
Every byte read here is handed back to the stdin stream, so the router reads the same
input whichever path was taken. In a chain that also has in-process plugins, its commands
start early and the plugins are loaded once the event loop runs, as a plugin's constructor
may expect; a chain with remote components starts as the `initialize` is routed.
"""

from __future__ import annotations

import logging
import os
import select
from typing import TYPE_CHECKING

import msgspec

from conductor import acp
from conductor.errors import ComponentStartError, ConfigError
from conductor.jsonrpc.framing import FrameDecoder
from conductor.jsonrpc.message import ParseError, Request, decode
from conductor.plan import plan_chain
from conductor.record import Record
from conductor.supervise.spawn import LaunchSpec, Started, start_process, stop_together

if TYPE_CHECKING:
    from collections.abc import Sequence

    from conductor.config import ChainConfig
    from conductor.plan import Plan

log = logging.getLogger("acp_conductor")

FIRST_READ = 65536  # one read: an initialize is a few hundred bytes
# msgspec's nesting limit is what is left of Python's recursion limit, so whether a deep
# frame decodes depends on the stack it is decoded on, and the router's reader runs on a
# deeper one than this check: near the limit, this check would start what the router then
# refuses. No initialize has this many brackets; one that does is left to the router.
MAX_OPENINGS = 256


class EarlyStart(Record):
    """The chain's plan (None: it has plugins or remote components, and is planned once
    the event loop runs), what was read from stdin before serving it, and the processes
    already started for it (each served once, by `take`)."""

    plan: Plan | None = None
    unread: bytes = b""
    started: list[tuple[LaunchSpec, Started]] = msgspec.field(default_factory=list)

    def take(self, launch: LaunchSpec) -> tuple[LaunchSpec, Started] | None:
        """The process started for `launch`, once, with the spec it was started from (its
        token is in the process's environment); None if none was. The plan made in the
        event loop (a chain with plugins) has new LaunchSpecs: one that resolved the same
        (name, argv, environment, folder, grace) is the same component. If a plugin changed
        the environment as it loaded, the component starts anew and the early process is
        discarded."""
        for i, (early, process) in enumerate(self.started):
            if early is launch or _same_launch(early, launch):
                del self.started[i]
                return early, process
        return None

    def stale(self, launches: Sequence[LaunchSpec]) -> list[tuple[LaunchSpec, Started]]:
        """Remove, and return to be stopped, the processes that none of `launches` (the plan
        made in the event loop) will take: a plugin changed their launch as it loaded. Left
        running, each would run beside its replacement for the whole session."""
        kept: list[tuple[LaunchSpec, Started]] = []
        gone: list[tuple[LaunchSpec, Started]] = []
        for entry in self.started:
            early = entry[0]
            same = any(early is launch or _same_launch(early, launch) for launch in launches)
            (kept if same else gone).append(entry)
        self.started = kept
        for launch, _ in gone:
            log.info("stopping %s: started early, but a plugin changed its launch as it "
                     "loaded (its environment): it starts anew", launch.name)
        return gone

    def discard(self) -> None:
        """Stop every process that the chain never came to serve (it stopped first)."""
        entries = list(self.started)
        self.started.clear()
        for launch, _ in entries:
            log.info("stopping %s: started early, but the chain stopped before serving it",
                     launch.name)
        stop_together(entries)


def start_early(config: ChainConfig, mode: str, *, fd: int = 0,
                max_frame_bytes: int | None = None) -> EarlyStart:
    """Plan a chain's commands for `mode`, and start them if `fd` already holds the
    `initialize` that starts the chain. Never waits for input. A chain with remote
    components is left alone. In a chain with in-process plugins, the commands alone are
    planned and started: the plugins are loaded once the event loop runs, as a plugin's
    constructor may expect, and the plan is made again then (`EarlyStart.take`).

    Raises:
        ConfigError: the chain cannot be planned (as serving it would; a plugin's own
            problems are found when it is loaded).
    """
    specs = [*config.proxy, *([config.agent] if config.agent is not None else [])]
    if any(spec.remote for spec in specs):
        return EarlyStart()
    with_plugins = any(spec.in_process for spec in specs)
    try:
        plan = plan_chain(config, mode, plugins=not with_plugins)
    except ConfigError:
        if not with_plugins:
            raise
        return EarlyStart()  # planned whole in the event loop: one report of every problem
    early = EarlyStart(None if with_plugins else plan)
    # Commands only (checked above): the isinstance is for the type checker.
    launches = [launch for _, _, launch in plan if isinstance(launch, LaunchSpec)]
    if not launches:
        return early
    try:
        if os.isatty(fd) or not select.select([fd], [], [], 0)[0]:
            return early  # nothing waiting (a terminal's end of input is not sticky either)
        data = os.read(fd, FIRST_READ)
    except (OSError, ValueError):
        return early  # not readable here: the stream's reader will say what is wrong
    early.unread = data
    if not _starts_chain(data, mode, max_frame_bytes or config.conductor.max_frame_bytes):
        return early
    started: list[tuple[LaunchSpec, Started]] = []
    try:
        for launch in launches:
            started.append((launch, start_process(launch)))
    except BaseException as e:
        stop_together(started)
        if isinstance(e, ComponentStartError):
            # Started as the initialize is routed instead, which reports it (or bypasses an
            # optional proxy) the one usual way.
            return early
        raise  # (nothing is left running: `serve`'s clean-up has not been set up yet)
    early.started = started
    log.debug("initialize was waiting: %d component(s) started during start-up",
              len(started))
    return early


def _same_launch(a: LaunchSpec, b: LaunchSpec) -> bool:
    return (a.name, list(a.argv), a.env, a.cwd, a.shutdown_grace) == \
        (b.name, list(b.argv), b.env, b.cwd, b.shutdown_grace)


def _starts_chain(data: bytes, mode: str, max_frame_bytes: int) -> bool:
    """Does `data` begin with a whole frame that the router will take as the initialize
    that starts the chain? Any doubt is a no: the router then decides, as always."""
    frames = FrameDecoder(max_frame_bytes=max_frame_bytes).feed(data)
    if not frames or not isinstance(frames[0], bytes | bytearray):
        return False
    if frames[0].count(b"{") + frames[0].count(b"[") > MAX_OPENINGS:  # bounds its depth
        return False
    try:
        msg = decode(frames[0])
    except ParseError:  # not JSON, not UTF-8, nested too deeply: the router answers it
        return False
    return isinstance(msg, Request) and acp.starts_chain(
        msg.method, msg.params, is_request=True, proxy_mode=mode == "proxy")
