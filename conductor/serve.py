"""Composition root: serves one client with a chain, wiring supervise + transport + routing.

`serve_chain` plans the chain (every plugin loaded and every command resolved before
anything starts), then serves the client until it closes its input, a signal arrives or a
component fails, and returns the exit code. `serve_connection` does the same for a client
reached by any transport (a MessageSink and a MessageSource: `acp-conductor serve`).
"""

from __future__ import annotations

import logging
import os
import signal
from typing import TYPE_CHECKING, Any

import anyio
import msgspec

from conductor.bridge import McpBridge
from conductor.config import ChainConfig, ComponentSpec, mcp_servers
from conductor.errors import (
    REACHES_CLIENT,
    ComponentDisconnectedError,
    ComponentError,
    ComponentExitedError,
    ComponentStartError,
    ComponentStoppedError,
)
from conductor.plan import RemoteSpec, ask_providers, is_plugin, plan_chain
from conductor.record import Record
from conductor.routing.chain import Chain
from conductor.routing.mcp import McpInjection
from conductor.routing.roles import Role
from conductor.routing.topology import ComponentLink, Hop
from conductor.supervise.component import EXIT_DRAIN, Component, open_component
from conductor.supervise.restart import Backoff
from conductor.supervise.signals import EXIT_SIGNAL, first_stop_signal
from conductor.supervise.spawn import LaunchSpec, stop_together
from conductor.supervise.watchdog import WATCHDOG
from conductor.transport.pipes import PipeSink, PipeSource

if TYPE_CHECKING:
    from collections.abc import Callable

    from anyio.abc import ByteReceiveStream, ByteSendStream, TaskStatus

    from conductor.early_start import EarlyStart
    from conductor.plugins.api import Proxy
    from conductor.tracing.sink import TraceSink
    from conductor.transport.base import MessageSink, MessageSource

log = logging.getLogger("acp_conductor")
stderr_log = logging.getLogger("acp_conductor.stderr")

RELAY_WAIT = 0.5  # at shutdown, how long in-process proxies get to relay a failure answer
# At shutdown, how long (beyond shutdown_grace) the answers the client is owed may take to be
# written: a client that stopped reading (an editor quitting mid-turn) never takes them.
CLIENT_READ_WAIT = 2.0


class RunOptions(Record):
    mode: str = "agent"                   # "agent": we are the editor's agent; "proxy": a proxy
    max_frame_bytes: int | None = None    # overrides the chain file
    tracer: TraceSink | None = None
    handle_signals: bool = True
    client_transport: str = "stdio"       # how the client reached us: stdio, ws, http (traces)
    early: EarlyStart | None = None       # the plan, and what was started before serving
    on_dropped: Callable[[str], None] | None = None  # a component's message refused unread
    # The client is `run`/`check`/`call` in this process: it says itself why it stopped
    # reading (a timeout, Ctrl-C), so its closing our output is no news to warn of.
    editor_in_process: bool = False


class _Outcome(Record):
    fatal: ComponentError | None = None
    signal: int | None = None
    reasons: list[str] = msgspec.field(default_factory=list)


async def serve_chain(
    config: ChainConfig,
    stdin: ByteReceiveStream,
    stdout: ByteSendStream,
    options: RunOptions | None = None,
) -> int:
    """Serve one client on (stdin, stdout) until it closes, a signal, or a component fails.

    Returns the exit code (`ExitCode`; the README's table).
    Raises:
        ConfigError: the chain cannot be planned.
    """
    options = options or RunOptions()
    max_frame = options.max_frame_bytes or config.conductor.max_frame_bytes
    unheard = anyio.Event()  # a write to `stdout` failed: its reader closed its end
    return await serve_connection(config, PipeSink(stdout, on_broken=unheard.set),
                                  PipeSource(stdin, max_frame_bytes=max_frame), options,
                                  unheard=unheard)


async def serve_connection(
    config: ChainConfig,
    client_sink: MessageSink,
    client_source: MessageSource,
    options: RunOptions | None = None,
    *,
    unheard: anyio.Event | None = None,
) -> int:
    """`serve_chain` for a client on any transport: what it sends comes from
    `client_source`, what the chain answers goes to `client_sink` (closed at the end).
    `unheard` is set when the client can no longer be written to: the chain stops.

    Raises:
        ConfigError: the chain cannot be planned.
    """
    options = options or RunOptions()
    early = options.early
    plan = early.plan if early is not None and early.plan is not None \
        else plan_chain(config, options.mode)
    if early is not None and early.started:
        # Stopped before anything starts: its replacement may need what it holds (a lock,
        # a port). Blocking (bounded by its grace), so not on the event loop.
        stale = early.stale([launch for _, _, launch in plan if isinstance(launch, LaunchSpec)])
        if stale:
            await anyio.to_thread.run_sync(stop_together, stale)
    ask_providers(config, plan)
    injection = McpInjection(mcp_servers(config))
    max_frame = options.max_frame_bytes or config.conductor.max_frame_bytes
    tracer = options.tracer
    outcome = _Outcome()
    stop = anyio.Event()
    relays_done = anyio.Event()  # shutdown answered every open request: hosts may stop
    client = Hop("client", client_sink, tracer=tracer)
    if tracer is not None and options.client_transport != "stdio":
        tracer.lifecycle("client", "connected", transport=options.client_transport)
    # The runs still going (a run leaves both when it ends: a component restarted all day
    # must not grow them).
    components: list[tuple[Component, Hop]] = []
    stopped: list[anyio.Event] = []  # one per run, set once it is fully stopped
    hosted: list[Hop] = []  # in-process plugin proxies, and remote components

    def failed(error: ComponentError, answered: bool = False) -> None:
        if outcome.fatal is None:  # the first failure is the one reported
            outcome.fatal = error
            # Said to the client in the answers it fails (run/check/call report those, so
            # they show this line only at debug), or in the answer already sent
            # (`answered`: its initialize, for a chain that could not start); with none
            # open, nobody else would say it.
            log.error("%s", error,
                      extra=REACHES_CLIENT if answered or client.inbound else None)

    def fatal(error: ComponentError, answered: bool = False) -> None:
        failed(error, answered)
        stop.set()

    def broken(hop: Hop) -> None:
        log.debug("%s stopped reading its stdin", hop.name)

    async with anyio.create_task_group() as tg:

        async def supervise(role: Role, spec: ComponentSpec, launch: LaunchSpec, *,
                            task_status: TaskStatus[tuple[Component, Hop]]) -> None:
            # One run per start; a restart policy decides whether a failed run is followed
            # by another (docs/reliability.md).
            backoff = Backoff(spec.max_restarts)
            optional = role is Role.PROXY and spec.optional
            # Since when this run has served: from its spawn for the first start, whose
            # handshake is the editor's; a restart's only once it is re-attached. A restart
            # that never came back never served, however long its re-attach waited: counted
            # from its spawn, a wait longer than STABLE (a request_timeout of 120 s) would
            # make it healthy, start the count again each time, and never give it up.
            serving_since: float | None = None

            def serving() -> None:
                nonlocal serving_since
                serving_since = anyio.current_time()

            def decide(error: ComponentError) -> float | None:
                """The run failed: how long until the next start (None: no more). Decided
                before its answers go out, so that a final failure is the outcome by the
                time the client reads them (`run` ends on them)."""
                ran_for = 0.0 if serving_since is None \
                    else anyio.current_time() - serving_since
                restarts = spec.restart == "on-failure" and not stop.is_set()
                delay = backoff.failed(ran_for) if restarts else None
                if delay is None:
                    if restarts:
                        log.warning("%s: not restarted again: it failed %d times in a row "
                                    "(max_restarts = %d)", launch.name, backoff.failures,
                                    spec.max_restarts)
                    chain.recovery.given_up(launch.name, error)
                    if not optional:
                        failed(error)
                return delay

            first = True
            while True:
                serving_since = None
                if first:
                    serving()
                # At the first start a ComponentStartError propagates to the starter.
                error, delay = await run_once(role, spec, launch, task_status, decide,
                                              serving, first=first)
                first = False
                if error is None:
                    return  # stopped with the chain
                if delay is not None:
                    log.warning("%s; restarting it in %gs (restart %d of at most %d)", error,
                                delay, backoff.failures, spec.max_restarts)
                    if tracer is not None:
                        tracer.lifecycle(launch.name, "restarting", delay=delay,
                                         attempt=backoff.failures, reason=str(error))
                    with anyio.move_on_after(delay):
                        await stop.wait()
                    if stop.is_set():
                        return
                    continue
                if optional and chain.bypass(launch.name, error):
                    return
                failed(error)  # (an optional proxy no longer in the chain: fatal after all)
                # Its answers go to its predecessor; behind proxies they still have to travel
                # up to the client, so stop the others only once the client has its answers
                # (bounded: a wedged proxy cannot hold the shutdown).
                with anyio.move_on_after(config.conductor.shutdown_grace):
                    await client.wait_quiet()
                fatal(error)
                return

        async def run_once(role: Role, spec: ComponentSpec, launch: LaunchSpec,
                           task_status: TaskStatus[tuple[Component, Hop]],
                           decide: Callable[[ComponentError], float | None],
                           serving: Callable[[], None], *, first: bool
                           ) -> tuple[ComponentError | None, float | None]:
            """Start the component once and serve it until it exits or the chain stops:
            (the error it failed with, or None when stopped; the wait before a restart).
            `serving` is called once a restart is re-attached."""
            def on_stderr(name: str, line: str) -> None:
                stderr_log.info("%s", line, extra={"component": name})
                if tracer is not None:
                    tracer.lifecycle(name, "stderr", line=line)

            outcome: list[ComponentError] = []
            delays: list[float | None] = []

            async def failing(hop: Hop, error: ComponentError) -> None:
                # Decide first: answers then say "restarting", or the outcome is recorded.
                delay = decide(error)
                outcome.append(error)
                delays.append(delay)
                await chain.fail_hop(hop, error)
                if role is Role.AGENT and bridge is not None:
                    await bridge.agent_gone()  # its MCP clients died with it
                if delay is not None:
                    chain.restarting(hop, error)

            run: tuple[Component, Hop] | None = None
            done = anyio.Event()
            try:
                taken = early.take(launch) if early is not None else None
                started = None
                if taken is not None:
                    launch, started = taken  # the spec it was started from: its token
                async with open_component(launch, on_stderr, started=started) as comp, \
                        anyio.create_task_group() as inner:
                    deaf = anyio.Event()  # writing to its stdin failed
                    hop = Hop(launch.name, PipeSink(comp.stdin, on_broken=deaf.set),
                              dialect=spec.dialect, tracer=tracer)
                    run = (comp, hop)
                    components.append(run)
                    stopped.append(done)
                    log.info("started %s (pid %s): %s", launch.name, comp.pid,
                             " ".join(launch.argv))
                    if tracer is not None:
                        tracer.lifecycle(launch.name, "spawned", pid=comp.pid,
                                         argv=list(launch.argv), role=str(role),
                                         transport="stdio")
                    exit_traced = anyio.Event()
                    wake = anyio.Event()  # the chain stops, or this run ended

                    async def read() -> None:
                        async with anyio.create_task_group() as watch:
                            watch.start_soon(_stop_reading_after_exit, comp)
                            await _serve(chain, hop, comp.stdout, max_frame)
                            watch.cancel_scope.cancel()
                        if stop.is_set():
                            return
                        with anyio.move_on_after(2.0):  # a wedged leader: report what is known
                            await comp.wait_exited()
                        with anyio.move_on_after(0.5):  # the last stderr lines complete the tail
                            await comp.stderr_closed.wait()
                        if outcome:  # its re-attach failed, and it was stopped for that:
                            return   # one failure, counted once (the back-off, the outcome)
                        code = comp.process.returncode
                        error = ComponentExitedError(launch.name, code, comp.stderr_tail,
                                                     running=code is None)
                        if tracer is not None:
                            tracer.lifecycle(launch.name, "exited", code=code, expected=False)
                            exit_traced.set()
                        await failing(hop, error)
                        wake.set()

                    attaching = anyio.CancelScope()  # a restart's re-attach

                    async def on_stop() -> None:
                        await stop.wait()
                        attaching.cancel()  # the chain stops: no point bringing it back
                        wake.set()

                    async def stop_if_deaf() -> None:
                        # Usually its stdin closed because it died, and its reader reports
                        # that. One that closed it and runs on can never be reached again:
                        # left running, what it holds and all sent to it would wait forever.
                        await deaf.wait()
                        with anyio.move_on_after(launch.shutdown_grace):
                            await comp.wait_exited()
                            return
                        if stop.is_set() or outcome:  # we closed it: it is being stopped
                            return
                        log.warning("%s closed its stdin but is still running: stopping it",
                                    launch.name)
                        await comp.stop(launch.shutdown_grace)  # its reader sees the exit

                    inner.start_soon(read)
                    inner.start_soon(on_stop)
                    inner.start_soon(stop_if_deaf)
                    if first:
                        task_status.started((comp, hop))
                    else:
                        with attaching:
                            try:
                                await chain.reattach(launch.name, hop)
                                serving()
                            except ComponentError as e:  # it came back broken, or not at all
                                if not outcome:
                                    await failing(hop, e)
                                wake.set()
                    await wake.wait()
                    # Stop while the reader still drains: a proxy may flush answers on EOF.
                    await comp.stop(launch.shutdown_grace)
                    with anyio.move_on_after(1.0):
                        await comp.stderr_closed.wait()
                    if tracer is not None and not exit_traced.is_set():
                        tracer.lifecycle(launch.name, "exited", code=comp.returncode,
                                         expected=not outcome)
                    done.set()
                    inner.cancel_scope.cancel()
            except ComponentStartError as e:
                if first:
                    raise
                if tracer is not None:  # a restart that could not even be spawned
                    tracer.lifecycle(launch.name, "error", message=str(e))
                delay = decide(e)
                if delay is not None:
                    chain.recovery.restarting(launch.name, e)
                return e, delay
            finally:
                if run is not None and done.is_set():  # (else shutdown still waits on it)
                    components.remove(run)
                    stopped.remove(done)
            if not outcome or stop.is_set():
                return None, None
            return outcome[0], delays[0]

        async def host_plugin(proxy: Proxy[Any], first: bool, *,
                              task_status: TaskStatus[Hop]) -> None:
            proxy.chain_status = chain.status
            from conductor.plugins.host import open_inprocess_hop

            async with open_inprocess_hop(proxy, chain.receive, tracer=tracer,
                                          next_to_client=first) as hop:
                hosted.append(hop)
                if tracer is not None:
                    # Same event as a subprocess, so traces and `check` treat both alike; the
                    # pid is the conductor's own, which is where the plugin runs.
                    plugin = f"{type(proxy).__module__}:{type(proxy).__qualname__}"
                    tracer.lifecycle(proxy.name, "spawned", pid=os.getpid(), role="proxy",
                                     argv=[f"(in-process) {plugin}"], in_process=True,
                                     plugin=plugin, transport="in-process")
                task_status.started(hop)
                # In-process proxies outlive the others: they relay the answers that
                # shutdown gives their successors' requests (see below).
                await relays_done.wait()

        async def connect(role: Role, spec: ComponentSpec, remote: RemoteSpec, *,
                          task_status: TaskStatus[Hop]) -> None:
            # A remote component is a process we do not own: its connection dropping while
            # the chain runs is its crash (every pending request answered, naming it).
            from conductor.transport.websocket import open_ws_client

            started = lost = False
            why = ""

            async def dropped(hop: Hop, why: str) -> None:
                nonlocal lost
                lost = True
                error = ComponentDisconnectedError(hop.name, remote.shown, why)
                await chain.fail_hop(hop, error)
                fatal(error)

            try:
                async with open_ws_client(remote.url, remote.headers,
                                          max_frame_bytes=max_frame) as (sink, source):
                    hop = Hop(remote.name, sink, dialect=spec.dialect, tracer=tracer,
                              channel="its WebSocket")
                    hosted.append(hop)
                    log.info("connected %s: %s", remote.name, remote.shown)
                    if tracer is not None:
                        tracer.lifecycle(remote.name, "spawned", pid=None, argv=[remote.shown],
                                         role=str(role), transport="ws", url=remote.shown)
                    task_status.started(hop)
                    started = True
                    async with anyio.create_task_group() as inner:
                        async def read() -> None:
                            await _serve_source(chain, hop, source)
                            if not stop.is_set():
                                await dropped(hop, source.ended)
                        inner.start_soon(read)
                        await stop.wait()
                        await sink.aclose()
                        inner.cancel_scope.cancel()
            except ConnectionError as e:
                if not started:
                    raise ComponentStartError(remote.name,
                                              f"cannot connect to {remote.shown}: {e}") from None
                why = str(e)
            if why and not stop.is_set():
                await dropped(hop, why)
            if tracer is not None:
                tracer.lifecycle(remote.name, "exited", code=None, expected=not lost)

        starting = ""  # the component the start is on (a stop answers in its name)

        async def starter() -> list[ComponentLink]:
            nonlocal starting
            links: list[ComponentLink] = []
            for role, spec, launch in plan:
                starting = launch.name
                if is_plugin(launch):
                    try:
                        hop = await tg.start(host_plugin, launch, not links)
                    except ComponentStartError as e:  # its chain_started hook failed
                        if tracer is not None:
                            tracer.lifecycle(launch.name, "error", message=str(e))
                        raise
                    links.append(ComponentLink(launch.name, role, hop))
                    continue
                if isinstance(launch, RemoteSpec):
                    try:
                        hop = await tg.start(connect, role, spec, launch)
                    except ComponentStartError as e:
                        if tracer is not None:
                            tracer.lifecycle(launch.name, "error", message=str(e))
                        raise
                    links.append(ComponentLink(launch.name, role, hop))
                    continue
                try:
                    _, hop = await tg.start(supervise, role, spec, launch)
                except ComponentStartError as e:
                    if tracer is not None:
                        tracer.lifecycle(launch.name, "error", message=str(e))
                    if role is Role.PROXY and spec.optional:
                        log.warning("%s; it is optional: the chain starts without it", e)
                        if tracer is not None:
                            tracer.lifecycle(launch.name, "bypassed", reason=str(e))
                        continue
                    raise
                links.append(ComponentLink(launch.name, role, hop))
            return links

        # acp MCP servers for an agent that lacks acp (docs/mcp.md); never in proxy mode,
        # where the outer conductor's agent is not ours to bridge.
        bridge = McpBridge(config.conductor.mcp_bridge, tg, tracer=tracer,
                           max_message_bytes=max_frame, leftovers=WATCHDOG) \
            if options.mode == "agent" and config.conductor.mcp_bridge != "off" else None
        chain = Chain(client, starter, proxy_mode=options.mode == "proxy", tracer=tracer,
                      on_fatal=fatal, on_broken=broken, mcp=injection, bridge=bridge,
                      timeouts=config.conductor.timeouts(),
                      keep_session_setup=config.agent is not None
                      and config.agent.restart == "on-failure",
                      on_dropped=options.on_dropped)
        if bridge is not None:
            bridge.attach(chain)

        def ended_because() -> str | None:
            # A server ends a network client's input for its own reasons (stopping, idle).
            why = getattr(client_source, "ended_because", None)
            return why if isinstance(why, str) else None

        async def stop_if_stuck() -> None:
            # The client closed its input, but its reader is stuck routing what came before
            # (a component that stopped reading holds a frame half written): it would never
            # see the end. Stop as at that end, which unblocks the write.
            wait_hangup = getattr(client_source, "wait_hangup", None)
            if wait_hangup is None:
                return
            await wait_hangup()
            await anyio.sleep(config.conductor.shutdown_grace)  # cancelled at its end
            if chain.started:
                log.warning("the client closed its input, but what it sent before cannot be "
                            "delivered (a component stopped reading): shutting down")
            else:
                log.warning("the client closed its input while the chain was still "
                            "starting (%s): shutting down", starting)
            stop.set()

        input_ended = False

        async def serve_client() -> None:
            nonlocal input_ended
            async with anyio.create_task_group() as watch:
                watch.start_soon(stop_if_stuck)
                await _serve_source(chain, client, client_source)
                watch.cancel_scope.cancel()
            input_ended = True
            log.info("client closed its input" if ended_because() is None
                     else f"client input ended: {ended_because()}")
            chain.disconnected()
            if options.mode == "proxy":
                # The client's pipe carries its answers and our successor's: none can come
                # now. Answered at once, so a nested chain stops without each level
                # waiting out its grace for them.
                await client.fail_pending(ComponentStoppedError(
                    client.name, "closed its input: what it owed (its own answers and its "
                    "successor's) can no longer come"), component=client.name)
            # Give the client's in-flight requests a bounded time to be answered.
            with anyio.move_on_after(config.conductor.shutdown_grace):
                await client.wait_quiet()
            stop.set()

        async def watch_signals() -> None:
            outcome.signal = await first_stop_signal()
            stop.set()

        async def stop_if_unheard(unheard: anyio.Event) -> None:
            # Nothing the chain says can reach the client again, while its side of our input
            # may stay open (another process holds it): stop as at the end of that input.
            await unheard.wait()
            if stop.is_set():
                return
            if input_ended or options.editor_in_process:
                # A client that is going away closes both ends: nothing went wrong.
                log.info("the client closed its end of our output too; shutting down")
            else:
                log.warning("the client closed its end of our output: nothing can reach it "
                            "any more; shutting down")
            stop.set()

        tg.start_soon(serve_client)
        tg.start_soon(chain.serve_timers)
        if options.handle_signals:
            tg.start_soon(watch_signals)
        if unheard is not None:
            tg.start_soon(stop_if_unheard, unheard)
        await stop.wait()
        with anyio.CancelScope(shield=True):
            # Components are stopping in their own tasks; meanwhile answer what they owed.
            why = (signal.Signals(outcome.signal).name if outcome.signal is not None
                   else ended_because() or "the client closed its input")
            longest = max((c.spec.shutdown_grace for c, _ in components), default=0.0)
            with anyio.move_on_after(2 * longest + 5):  # each stop is bounded; this is a backstop
                # Runs leave `stopped` as they end: wait on what is left, not a stale index.
                while (waiting := next((d for d in stopped if not d.is_set()), None)) \
                        is not None:
                    await waiting.wait()
            # From the agent up: each component's open requests are answered (it was stopped
            # before answering), and in-process proxies get to relay those answers before
            # the next hop up is failed, so an error names where the request really was.
            # Bounded: a client that stopped reading would hold each write to it for ever.
            answering = anyio.CancelScope(deadline=anyio.current_time()
                                          + config.conductor.shutdown_grace + CLIENT_READ_WAIT)
            with answering:
                await chain.stop_starting(outcome.fatal or ComponentStoppedError(
                    starting, f"was still starting: the conductor is shutting down ({why})"))
                for hop in reversed(chain.topology.hops()):
                    reason = outcome.fatal or ComponentStoppedError(
                        hop.name,
                        f"was stopped before answering: the conductor is shutting down ({why})")
                    await chain.fail_hop(hop, reason)
                    if hosted and client.inbound:  # the editor still waits: let it climb
                        with anyio.move_on_after(RELAY_WAIT):
                            await client.wait_quiet()
            relays_done.set()
            if bridge is not None:
                await bridge.aclose()
            with anyio.CancelScope(deadline=answering.deadline) as closing:
                await client_sink.aclose()  # writes what is still buffered first
            if answering.cancelled_caught or closing.cancelled_caught:
                log.warning("the client stopped reading: what it was still owed is not "
                            "written (exiting without it)")
        tg.cancel_scope.cancel()

    if outcome.fatal is not None:
        return outcome.fatal.exit_code
    if outcome.signal is not None:
        return EXIT_SIGNAL.get(signal.Signals(outcome.signal), 1)
    return 0


async def _stop_reading_after_exit(comp: Component) -> None:
    """A grandchild that inherited stdout keeps it open after the component died: once the
    leader has exited, read what it wrote (bounded), then end the reader so the death is seen."""
    await comp.wait_exited()
    await anyio.sleep(EXIT_DRAIN)  # cancelled at once when stdout reaches EOF first
    log.debug("%s exited but its stdout is still open (a grandchild?); closing it", comp.name)
    await comp.stdout.aclose()


async def _serve(chain: Chain, hop: Hop, stream: ByteReceiveStream, max_frame: int) -> None:
    """Feed what arrives on `stream` to the router as `hop`'s, until EOF."""
    def cut(why: str) -> None:
        log.warning("%s's output ended in the middle of a message (%s): dropped", hop.name,
                    why)
        chain.trace_lifecycle(hop.name, "partial-frame", reason=why)

    await _serve_source(chain, hop, PipeSource(stream, max_frame_bytes=max_frame,
                                               on_cut=cut))


async def _serve_source(chain: Chain, hop: Hop, source: MessageSource) -> None:
    """Feed what arrives from `source` to the router as `hop`'s, until EOF."""
    await source.serve(*chain.reader(hop))
