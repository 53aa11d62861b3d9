"""`acp-conductor call`: one request (e.g. a proxy's own `_ext/...` method) through a chain.

The chain is served in-process as `run` serves it (real components); the conductor, as
the editor, initializes it, opens a session if asked (its id goes into the params as
`sessionId`), sends the request and returns the answer as received. Requests from the
agent side are refused (a permission question is answered `cancelled`: nobody is there
to ask).
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import anyio

from conductor.editor.client import EditorHandler, open_client_connection
from conductor.editor.inprocess import InProcessChain
from conductor.errors import ConnectionClosedError, ExplainedCode, RpcError
from conductor.jsonrpc.codes import ErrorCode
from conductor.record import Record
from conductor.serve import RunOptions

if TYPE_CHECKING:
    from collections.abc import Callable

    from conductor.config import ChainConfig
    from conductor.jsonrpc.message import JsonValue, Response
    from conductor.tracing.sink import TraceSink


class CallExit(ExplainedCode):
    """Exit codes of `call` (rendered in `call --help`)."""

    RESULT = 0, "the request was answered with a result (printed on stdout)"
    ERROR = 1, "the request was answered with an error (the error object printed on stdout)"
    USAGE = 2, ("bad chain file, proxy or usage (PARAMS not JSON, not an object or array, or "
                "not an object with --session); nothing on stdout")
    COMPONENT = 3, ("a component failed to start or exited, or setup (initialize, "
                    "session/new) failed; nothing on stdout")
    TIMEOUT = 124, "no answer within --timeout; nothing on stdout"


class CallOptions(Record):
    method: str
    params: JsonValue = None
    notify: bool = False            # a notification: nothing to wait for
    session: bool = False           # open a session first; its id goes into params
    cwd: Path = Path()
    timeout: float = 30.0
    max_frame_bytes: int | None = None
    tracer: TraceSink | None = None
    on_notification: Callable[[str, JsonValue], None] | None = None


class CallOutcome(Record):
    code: CallExit
    answer: Response | None = None  # the answer to the request (RESULT and ERROR)
    reason: str | None = None       # why there is none, for the user
    session_id: str | None = None


class _CallEditor(EditorHandler):
    """Nobody sits at this editor: questions are answered `cancelled`, the rest refused."""

    def __init__(self, options: CallOptions) -> None:
        self._options = options

    async def handle_request(self, method: str, params: JsonValue) -> JsonValue:
        if method == "session/request_permission":
            return {"outcome": {"outcome": "cancelled"}}
        return await super().handle_request(method, params)

    async def handle_notification(self, method: str, params: JsonValue) -> None:
        if self._options.on_notification is not None:
            self._options.on_notification(method, params)


async def call_chain(config: ChainConfig, options: CallOptions) -> CallOutcome:
    """Serve `config`'s chain, send one request through it, stop it.

    Raises:
        ConfigError: the chain cannot be planned, or PARAMS do not fit --session.
    """
    chain = InProcessChain(config, RunOptions(max_frame_bytes=options.max_frame_bytes,
                                              tracer=options.tracer))
    outcome = CallOutcome(CallExit.TIMEOUT, reason=f"no answer to {options.method} within "
                                                   f"{options.timeout:g}s")
    step = "initialize"

    async with anyio.create_task_group() as tg:
        tg.start_soon(chain.serve)
        async with open_client_connection(chain.from_conductor, chain.to_conductor,
                                          _CallEditor(options)) as conn:
            with anyio.move_on_after(options.timeout):
                try:
                    await conn.request("initialize", {
                        "protocolVersion": 1,
                        "clientCapabilities": {"fs": {"readTextFile": False,
                                                      "writeTextFile": False},
                                               "terminal": False},
                        "clientInfo": {"name": "acp-conductor-call", "version": "1"}})
                    params = options.params
                    if options.session:
                        step = "session/new"
                        opened = await conn.request("session/new", {
                            "cwd": str(options.cwd.resolve()), "mcpServers": []})
                        sid = opened.get("sessionId") if isinstance(opened, dict) else None
                        if not isinstance(sid, str):
                            raise RpcError(ErrorCode.INVALID_PARAMS,
                                           f"session/new answered without a sessionId: "
                                           f"{opened!r}")
                        outcome.session_id = sid
                        params = {"sessionId": sid, **(params or {})}
                    step = options.method
                    if options.notify:
                        await conn.notify(options.method, params)
                        outcome = CallOutcome(CallExit.RESULT, session_id=outcome.session_id)
                    else:
                        answer = await conn.endpoint.request(options.method, params)
                        outcome = CallOutcome(
                            CallExit.ERROR if answer.is_error else CallExit.RESULT, answer,
                            session_id=outcome.session_id)
                except RpcError as e:  # setup failed: initialize or session/new
                    outcome = CallOutcome(CallExit.COMPONENT, reason=f"{step} failed: {e}")
                except ConnectionClosedError:
                    outcome = CallOutcome(CallExit.COMPONENT,
                                          reason=f"the chain stopped before answering {step}")
            if outcome.code is CallExit.TIMEOUT and step != options.method:
                outcome.reason = f"no answer to {step} within {options.timeout:g}s"
        with anyio.move_on_after(config.conductor.shutdown_grace + 10):
            await chain.done.wait()
        tg.cancel_scope.cancel()

    if chain.error is not None:
        raise chain.error
    if chain.code == CallExit.COMPONENT and outcome.answer is None:
        outcome.code = CallExit.COMPONENT
    return outcome
