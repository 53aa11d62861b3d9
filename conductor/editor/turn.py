"""`acp-conductor run`: prompt turns through the chain, with the conductor as the editor.

The chain runs in-process (`serve_chain` over in-memory byte pipes, the same code path an
editor gets; components are real subprocesses). `RunEditor` answers the agent's requests
by policy; `run_turns` drives the turns of one session, in order, under `--timeout`,
Ctrl-C and SIGTERM, stops at the first turn that does not end with `end_turn`, and maps
the outcome to an exit code (`RunExit`, rendered in `run --help`, the README and
docs/run.md).
"""

from __future__ import annotations

import logging
import signal
import time
from typing import TYPE_CHECKING, Any

import anyio
import msgspec
from msgspec import field

from conductor import __version__
from conductor.editor.client import ClientConnection, open_client_connection
from conductor.editor.inprocess import InProcessChain
from conductor.editor.policy import RunEditor, RunEvents
from conductor.errors import (
    ConfigError,
    ConnectionClosedError,
    ExplainedCode,
    RpcError,
)
from conductor.jsonrpc.codes import ErrorCode
from conductor.record import Record
from conductor.serve import RunOptions

if TYPE_CHECKING:
    from collections.abc import Callable, Coroutine
    from pathlib import Path

    from conductor.config import ChainConfig
    from conductor.tracing.sink import TraceSink

log = logging.getLogger("acp_conductor.run")


class RunExit(ExplainedCode):
    """Exit codes of `run`: the one definition behind `run --help`, the README and
    docs/run.md."""

    END_TURN = 0, "every turn ended with `end_turn`"
    FAILED = 1, ("the agent (or a plugin proxy) answered a prompt with an error, or an "
                 "unknown stop reason")
    CONFIG = 2, ("bad chain file, proxy (unknown `use`, bad `options`) or usage (no, empty or "
                 "non-UTF-8 prompt, an unreadable prompt file, `--approve ask` off a "
                 "terminal, `--json` with another `--format`); `--session-id` but the agent "
                 "cannot reopen sessions. No `result` line")
    COMPONENT = 3, ("a component failed to start or exited (the message names it, with its "
                    "stderr tail)")
    REFUSAL = 5, "the agent refused (`stopReason: refusal`)"
    LIMIT = 6, "the agent hit a limit (`max_tokens`, `max_turn_requests`)"
    CANCELLED = 7, "the agent cancelled the turn (`stopReason: cancelled`)"
    POLICY = 8, ("policy violation: `--approve fail` was hit, or `run` itself refused a "
                 "file/terminal request (its `--cwd` sandbox, `--allow-write`, "
                 "`--allow-terminal`). Requests a proxy in the chain refuses never reach `run` "
                 "and do not count")
    TIMEOUT = 124, ("`--timeout` passed: the turn was cancelled with `session/cancel`, or "
                    "`run` gave up waiting for setup")
    INTERRUPTED = 130, ("Ctrl-C: the turn was cancelled, or `run` gave up waiting for setup; a "
                        "second Ctrl-C stops at once")
    TERMINATED = 143, ("SIGTERM: as Ctrl-C (the turn is cancelled, the result line written); "
                       "a second signal stops at once")


STOP_REASON_EXIT = {"end_turn": RunExit.END_TURN, "refusal": RunExit.REFUSAL,
                    "max_tokens": RunExit.LIMIT, "max_turn_requests": RunExit.LIMIT,
                    "cancelled": RunExit.CANCELLED}

# How long `run` waits for the answer to the session/close it sends at the end.
CLOSE_WAIT = 5.0


class TurnOptions(Record):
    """What `run` was told to do."""

    prompts: list[str]     # one turn each, in one session, in order
    cwd: Path
    session_id: str | None = None
    approve: str = "none"
    allow_write: bool = False
    allow_terminal: bool = False
    timeout: float | None = None
    cancel_grace: float = 10.0
    tracer: TraceSink | None = None
    max_frame_bytes: int | None = None
    handle_signals: bool = True


class _Turn(Record):
    trigger: str | None = None     # "timeout" | "interrupt" | "terminate" | "policy"
    result: dict[str, Any] | None = None
    error: RpcError | None = None
    closed: bool = False
    usage_error: ConfigError | None = None
    step: str = "initialize"       # the request the run is waiting on
    auth_methods: list[Any] = field(default_factory=list)  # the agent's, from initialize
    prompted: bool = False         # session/prompt was sent: a cancel has a turn to end
    turns: list[dict[str, Any]] = field(default_factory=list)  # each turn's report
    closable: str | None = None    # the session, once known that the agent can close it
    forced: anyio.Event = field(default_factory=anyio.Event)  # a second Ctrl-C: stop now
    stop: anyio.Event = field(default_factory=anyio.Event)
    done: anyio.Event = field(default_factory=anyio.Event)
    scope: anyio.CancelScope = field(default_factory=anyio.CancelScope)

    def interrupt(self, why: str) -> None:
        if self.trigger is None and not self.done.is_set():
            self.trigger = why
        self.stop.set()

    def force(self) -> None:
        self.interrupt("interrupt")
        self.forced.set()
        self.scope.cancel()


async def run_turns(config: ChainConfig, options: TurnOptions, events: RunEvents) -> int:
    """Run the prompts' turns through the chain, in one session; returns a `RunExit` code:
    the first turn's that did not end with `end_turn` (no later prompt is sent), else 0.

    Raises:
        ConfigError: the chain cannot be planned, or the agent cannot load --session-id.
    """
    started = time.monotonic()
    dropped: list[str] = []

    def on_dropped(reason: str) -> None:
        # The answer may be incomplete: say so where the run's reader looks, not only in
        # the log (an update over the size limit is otherwise simply missing).
        dropped.append(reason)
        events.notice(f"dropped: {reason}")

    chain = InProcessChain(config, RunOptions(mode="agent",
                                              max_frame_bytes=options.max_frame_bytes,
                                              tracer=options.tracer, on_dropped=on_dropped))
    turn = _Turn()
    record: dict[str, Any] = {"type": "result", "sessionId": None}  # null until one opens

    async with anyio.create_task_group() as tg:

        async def spawn(func: Callable[[], Coroutine[Any, Any, None]]) -> None:
            tg.start_soon(func)

        def policy_failure() -> None:
            turn.interrupt("policy")

        editor = RunEditor(events, cwd=options.cwd, approve=options.approve,
                           allow_write=options.allow_write,
                           allow_terminal=options.allow_terminal,
                           max_frame_bytes=options.max_frame_bytes,
                           on_policy_failure=policy_failure, spawn=spawn)
        tg.start_soon(chain.serve)
        if options.handle_signals:
            tg.start_soon(_watch_signals, turn, events)
        try:
            with turn.scope:  # a second Ctrl-C cancels it
                async with open_client_connection(chain.from_conductor, chain.to_conductor,
                                                  editor) as conn:
                    await _converse(conn, editor, options, events, turn, record)
                    await _close_session(conn, turn)
        except* ConnectionClosedError:  # arrives wrapped by the connection's task group
            turn.closed = True
        finally:
            with anyio.CancelScope(shield=True):
                await editor.aclose()
                with anyio.move_on_after(config.conductor.shutdown_grace + 10):
                    await _first(chain.done, turn.forced)
        # Forced: cancelling serve_chain still stops each component (shielded cleanup).
        tg.cancel_scope.cancel()

    if chain.error is not None:
        raise chain.error
    if turn.usage_error is not None:
        raise turn.usage_error
    code = _exit_code(turn, editor, chain.code)
    if turn.error is not None:
        record["error"] = turn.error.to_json()
    record.update(stopReason=(turn.result or {}).get("stopReason"),
                  usage=(turn.result or {}).get("usage") or _usage_of(editor.last_usage),
                  exitCode=int(code), exitReason=code.name.lower(), cancelledBy=turn.trigger,
                  violations=editor.violations, dropped=len(dropped),
                  durationMs=round((time.monotonic() - started) * 1000, 1),
                  prompts=len(options.prompts), turns=turn.turns)
    events.result(record)
    return int(code)


async def _first(*events: anyio.Event) -> None:
    """Wait until any of `events` is set."""
    async with anyio.create_task_group() as tg:
        async def wait(event: anyio.Event) -> None:
            await event.wait()
            tg.cancel_scope.cancel()
        for event in events:
            tg.start_soon(wait, event)


def _usage_of(update: dict[str, Any] | None) -> dict[str, Any] | None:
    if update is None:
        return None
    return {k: v for k, v in update.items() if k in ("used", "size", "cost")}


async def _watch_signals(turn: _Turn, events: RunEvents) -> None:
    """Ctrl-C and SIGTERM cancel the turn and stop the chain gracefully; a second one of
    either stops now. Either way the result line is written and nothing is left running."""
    with anyio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
        count = 0
        async for signum in signals:
            count += 1
            name = "interrupted" if signum == signal.SIGINT else "terminated"
            if count == 1:
                doing = "cancelling the turn" if turn.prompted else "giving up"
                again = "Ctrl-C" if signum == signal.SIGINT else "SIGTERM"
                events.notice(f"{name}: {doing} ({again} again to stop now)")
                turn.interrupt("interrupt" if signum == signal.SIGINT else "terminate")
            else:
                # Not KeyboardInterrupt: that would skip the result line and print a traceback.
                events.notice(f"{name} again: stopping now")
                turn.force()
                return


async def _converse(conn: ClientConnection, editor: RunEditor, options: TurnOptions,
                    events: RunEvents, turn: _Turn, record: dict[str, Any]) -> None:
    """The whole conversation (setup included) under --timeout and Ctrl-C."""
    sid: list[str] = []  # set once the session is open; session/cancel needs it

    async with anyio.create_task_group() as tg:
        async def talk() -> None:
            try:
                await _talk(conn, editor, options, events, turn, record, sid)
            except RpcError as e:
                # -32000 is also JSON-RPC's generic server error: read as ACP's "sign in
                # first" only from an agent that offers a sign-in or says so
                wants_auth = e.code == ErrorCode.AUTH_REQUIRED and (
                    turn.auth_methods or "auth" in e.message.lower())
                turn.error = _explain_auth(e, turn) if wants_auth else e
            except ConnectionClosedError:
                turn.closed = True
            finally:
                turn.done.set()
                turn.stop.set()

        tg.start_soon(talk)
        with anyio.move_on_after(options.timeout if options.timeout else float("inf")):
            await turn.stop.wait()
        if not turn.stop.is_set():
            turn.interrupt("timeout")
            if turn.prompted:
                events.notice(f"timeout after {options.timeout:g}s: cancelling the turn")
        if turn.done.is_set():
            return
        if not turn.prompted:
            # No turn to cancel yet: the agent is stuck answering a setup request.
            why = f"timeout after {options.timeout:g}s" if turn.trigger == "timeout" \
                else "terminated" if turn.trigger == "terminate" else "interrupted"
            events.notice(f"{why}: the agent never answered {turn.step}; giving up")
            tg.cancel_scope.cancel()
            return
        editor.cancel_pending()
        await conn.notify("session/cancel", {"sessionId": sid[0]})
        with anyio.move_on_after(options.cancel_grace):
            await turn.done.wait()
        if not turn.done.is_set():
            events.notice(f"the agent did not answer the cancel within "
                          f"{options.cancel_grace:g}s; giving up on the turn")
            tg.cancel_scope.cancel()


def _explain_auth(error: RpcError, turn: _Turn) -> RpcError:
    """The agent wants the user signed in (-32000): say what to do, which its bare
    "Authentication required" does not. `run` signs in to nothing itself: a sign-in may
    open a browser or ask for a secret, which is the agent's own business."""
    offered = []
    for method in turn.auth_methods:
        if isinstance(method, dict):
            name = str(method.get("name") or method.get("id") or "?")
            about = method.get("description")
            about = about.strip().rstrip(".") if isinstance(about, str) else ""
            offered.append(f"{name}: {about}" if about else name)
    ways = ("; it offers: " + "; ".join(offered)) if offered else ""
    return RpcError(error.code, f"the agent needs you to sign in first (it answered "
                    f"{turn.step}: {error.message}){ways}. Sign in with the agent's own "
                    "command or from an editor once, then run again", error.data)


async def _talk(conn: ClientConnection, editor: RunEditor, options: TurnOptions,
                events: RunEvents, turn: _Turn, record: dict[str, Any], sid_out: list[str]) -> None:
    turn.step = "initialize"
    init = await conn.request("initialize", cancel_on_abort=False, params={
        "protocolVersion": 1,
        "clientCapabilities": {"fs": {"readTextFile": True,
                                      "writeTextFile": options.allow_write},
                               "terminal": options.allow_terminal},
        "clientInfo": {"name": "acp-conductor-run", "title": "acp-conductor run",
                       "version": __version__}})
    if not isinstance(init, dict):
        raise RpcError(ErrorCode.INVALID_PARAMS,
                       f"the agent answered initialize with {init!r:.200}, not an object")
    version = init.get("protocolVersion")
    if isinstance(version, int) and not isinstance(version, bool) and version != 1:
        # ACP: the client disconnects from a version it does not speak (v2 answers a
        # prompt without a stopReason, and has no fs/terminal methods).
        raise RpcError(ErrorCode.INVALID_PARAMS,
                       f"the agent answered initialize with protocolVersion {version}; "
                       "run speaks ACP protocol version 1")
    caps = init.get("agentCapabilities")
    if not isinstance(caps, dict):
        caps = {}
    methods = init.get("authMethods")
    turn.auth_methods = methods if isinstance(methods, list) else []
    cwd = str(editor.root)

    def announce(sid: str, how: str) -> None:
        record["sessionId"] = sid
        events.session({"type": "session", "sessionId": sid, "how": how,
                        "protocolVersion": init.get("protocolVersion"),
                        "agentInfo": init.get("agentInfo"), "cwd": cwd})
    if options.session_id is None:
        turn.step = "session/new"
        opened = await conn.request("session/new", {"cwd": cwd, "mcpServers": []},
                                  cancel_on_abort=False)
        sid, how = opened.get("sessionId") if isinstance(opened, dict) else None, "new"
        if not isinstance(sid, str):
            raise RpcError(ErrorCode.INVALID_PARAMS,
                           f"the agent answered session/new without a sessionId: {opened!r:.200}")
    else:
        sid = options.session_id
        if caps.get("loadSession"):
            how = "load"
        elif isinstance(caps.get("sessionCapabilities"), dict) and \
                caps["sessionCapabilities"].get("resume") is not None:
            how = "resume"
        else:
            turn.usage_error = ConfigError(
                f"the agent cannot reopen session {sid!r}: it advertises neither "
                "loadSession nor sessionCapabilities.resume", field="--session-id",
                hint="drop --session-id")
            return
        # Announced before the request: the replayed history arrives before its answer.
        announce(sid, how)
        turn.step = f"session/{how}"
        await conn.request(f"session/{how}", {"sessionId": sid, "cwd": cwd, "mcpServers": []},
                           cancel_on_abort=False)
    if how == "new":
        announce(sid, how)
    sid_out.append(sid)
    for number, prompt in enumerate(options.prompts, 1):
        if not await _prompt(conn, editor, options, events, turn, sid, number, prompt):
            break
    session = caps.get("sessionCapabilities")
    if isinstance(session, dict) and session.get("close") is not None:
        turn.closable = sid


async def _close_session(conn: ClientConnection, turn: _Turn) -> None:
    """The run is done with its session: end it (when the agent can), so that every
    component releases it (proxies see session_closed). After the turns, outside
    --timeout: best effort and bounded, the turns are what count."""
    if turn.closable is None or turn.trigger is not None or turn.closed:
        return
    with anyio.move_on_after(CLOSE_WAIT):
        try:
            await conn.request("session/close", {"sessionId": turn.closable},
                               cancel_on_abort=False)
        except RpcError as e:
            # Said here or nowhere: a proxy's own line for it is left to us (REACHES_CLIENT).
            log.warning("session/close failed: %s", e)
        except ConnectionClosedError as e:  # the chain ended: its own report says why
            log.info("session/close failed: %s", e)


async def _prompt(conn: ClientConnection, editor: RunEditor, options: TurnOptions,
                  events: RunEvents, turn: _Turn, sid: str, number: int, prompt: str) -> bool:
    """One turn; reports it and says whether the next prompt may follow (it ended with
    `end_turn`, breaking no policy).

    Raises:
        RpcError: the prompt was answered with an error (reported first).
    """
    started = time.monotonic()
    violations = len(editor.violations)
    turn.step = "session/prompt"
    turn.prompted = True
    events.prompting(number)
    turn.result = None
    report: dict[str, Any] = {"type": "turn", "turn": number, "of": len(options.prompts)}
    given_up = False
    try:
        # Cancelled with session/cancel (ACP's turn cancel), never $/cancel_request: agents
        # need not understand it, and some print a traceback for it.
        answer = await conn.request("session/prompt", {
            "sessionId": sid, "prompt": [{"type": "text", "text": prompt}]},
            cancel_on_abort=False)
        if not isinstance(answer, dict):
            # A proxy that forgot its `return` (null), or returned a list or a string:
            # say so, rather than stop "failed" without a word, or crash on it.
            raise RpcError(ErrorCode.INTERNAL_ERROR, "session/prompt was answered with "
                           f"{msgspec.json.encode(answer).decode()[:200]}, "
                           "not an object with a stopReason")
        turn.result = answer
    except RpcError as e:
        report["error"] = e.to_json()
        code = RunExit.COMPONENT if e.code == ErrorCode.COMPONENT_FAILED else RunExit.FAILED
        raise
    except anyio.get_cancelled_exc_class():
        # Given up on (the cancel went unanswered, or a second Ctrl-C): the turn still
        # ended, and is reported with what ended it.
        given_up = True
        code = _turn_code(turn, len(editor.violations) > violations)
        raise
    else:
        code = _turn_code(turn, len(editor.violations) > violations)
    finally:
        if turn.result is not None or "error" in report or given_up:
            result = turn.result or {}
            report.update(stopReason=result.get("stopReason"), usage=result.get("usage"),
                          exitCode=int(code), exitReason=code.name.lower(),
                          durationMs=round((time.monotonic() - started) * 1000, 1))
            turn.turns.append({k: v for k, v in report.items() if k != "type"})
            events.turn(report)
    return code is RunExit.END_TURN


def _turn_code(turn: _Turn, violated: bool) -> RunExit:
    """A turn's own outcome (`_exit_code` decides the run's, with what else went wrong)."""
    if turn.trigger == "policy" or violated:
        return RunExit.POLICY
    trigger = {"timeout": RunExit.TIMEOUT, "interrupt": RunExit.INTERRUPTED,
               "terminate": RunExit.TERMINATED}.get(turn.trigger or "")
    if trigger is not None:
        return trigger
    return STOP_REASON_EXIT.get(str((turn.result or {}).get("stopReason")), RunExit.FAILED)


def _exit_code(turn: _Turn, editor: RunEditor, conductor_code: int | None) -> RunExit:
    error = turn.error
    # A component failure has its own code; a plugin handler that raised (HANDLER_FAILED)
    # answered the prompt with an error: that is FAILED, nothing exited.
    component_failed = conductor_code == RunExit.COMPONENT or (
        error is not None and error.code == ErrorCode.COMPONENT_FAILED)
    if component_failed or (turn.closed and turn.result is None):
        return RunExit.COMPONENT
    if turn.trigger == "policy" or editor.violations:
        return RunExit.POLICY
    if turn.trigger == "timeout":
        return RunExit.TIMEOUT
    if turn.trigger == "interrupt":
        return RunExit.INTERRUPTED
    if turn.trigger == "terminate":
        return RunExit.TERMINATED
    if turn.error is not None or turn.result is None:
        return RunExit.FAILED
    return STOP_REASON_EXIT.get(str(turn.result.get("stopReason")), RunExit.FAILED)

