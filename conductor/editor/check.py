"""`acp-conductor check`: start a chain, initialize it, report each component, shut down.

Per-component facts come from the conductor's own trace hooks: each component's answer to
the initialize (or `_proxy/initialize`) the conductor sent it on its hop — what that
component itself said, not what the chain as a whole returned to the editor.
"""

from __future__ import annotations

from collections import deque
from typing import TYPE_CHECKING, Any

import anyio
import msgspec
from msgspec import field

from conductor import acp
from conductor.editor.client import EditorHandler, open_client_connection
from conductor.editor.inprocess import InProcessChain
from conductor.errors import ConnectionClosedError, RpcError
from conductor.jsonrpc.message import Notification, Request, Response
from conductor.record import Record
from conductor.serve import RunOptions
from conductor.tracing.sink import FanoutTraceSink

if TYPE_CHECKING:
    from msgspec import Raw

    from conductor.config import ChainConfig
    from conductor.jsonrpc.message import JsonValue, Message
    from conductor.tracing.sink import Direction, TraceSink

_INITIALIZE = {acp.INITIALIZE, *acp.PROXY_INITIALIZE_METHODS}


class ComponentReport(Record):
    name: str
    role: str = "?"
    argv: list[str] = field(default_factory=list)
    pid: int | None = None
    result: dict[str, Any] | None = None
    error: dict[str, Any] | None = None
    exit_code: int | None = None
    stderr: deque[str] = field(default_factory=lambda: deque(maxlen=20))
    asked: bool = False
    bypassed: str | None = None  # an optional proxy the chain goes on without: why

    def summary(self) -> dict[str, Any]:
        result = self.result or {}
        # As the component sent them: a broken one is what check is run to diagnose.
        caps = result.get("agentCapabilities") or result.get("capabilities") or {}
        if not isinstance(caps, dict):
            caps = {}
        auth = result.get("authMethods")
        return {"name": self.name, "role": self.role, "command": self.argv, "pid": self.pid,
                "protocolVersion": result.get("protocolVersion"),
                "agentInfo": result.get("agentInfo") or result.get("info"),
                "capabilities": caps, "mcpTransports": mcp_transports(caps),
                # v1 names a method by `id`, v2 by `methodId`
                "authMethods": [m.get("id", m.get("methodId", m.get("name")))
                                if isinstance(m, dict) else m
                                for m in (auth if isinstance(auth, list) else [])],
                "error": self.error, "exitCode": self.exit_code, "bypassed": self.bypassed}


def mcp_transports(caps: dict[str, Any]) -> list[str]:
    """v1: mcpCapabilities booleans (stdio is implied); v2: capabilities.session.mcp markers."""
    out = ["stdio"]
    v1 = caps.get("mcpCapabilities")
    if isinstance(v1, dict):
        out += [k for k, v in v1.items() if v is True and k != "_meta"]
    session = caps.get("session")
    if isinstance(session, dict) and isinstance(session.get("mcp"), dict):
        out += [k for k in session["mcp"] if k not in out and not k.startswith("_")]
    return out


class _Recorder:
    """A TraceSink keeping what `check` reports: pids, initialize answers, stderr tails."""

    def __init__(self) -> None:
        self.components: dict[str, ComponentReport] = {}
        self._asked: dict[tuple[str, bytes], str] = {}

    def get(self, name: str) -> ComponentReport:
        return self.components.setdefault(name, ComponentReport(name))

    def message(self, hop: str, direction: Direction, message: Message | list[Message], *,
                peer: str | None = None, origin: tuple[str, Raw] | None = None) -> None:
        for msg in message if isinstance(message, list) else [message]:
            if hop == "client" or isinstance(msg, Notification):
                continue
            if direction == "out" and isinstance(msg, Request) and msg.method in _INITIALIZE:
                self._asked[(hop, bytes(msg.id))] = hop
                self.get(hop).asked = True
            elif direction == "in" and isinstance(msg, Response) and \
                    self._asked.pop((hop, bytes(msg.id)), None) is not None:
                report = self.get(hop)
                try:
                    if msg.is_error:
                        report.error = msg.error_value()
                    else:
                        value = msg.result_value()
                        report.result = value if isinstance(value, dict) else {"result": value}
                except msgspec.DecodeError as e:  # nested too deeply: say so, do not crash
                    report.error = {"message": f"its initialize answer cannot be read: {e}"}

    def lifecycle(self, component: str, event: str, **fields: object) -> None:
        report = self.get(component)
        if event == "spawned":
            report.pid = fields.get("pid")  # type: ignore[assignment]
            report.argv = list(fields.get("argv") or [])  # type: ignore[call-overload]
            report.role = str(fields.get("role", "?"))
        elif event == "stderr":
            report.stderr.append(str(fields.get("line", "")))
        elif event == "exited":
            report.exit_code = fields.get("code")  # type: ignore[assignment]
        elif event == "error":
            report.error = {"message": fields.get("message")}
        elif event == "bypassed":  # optional: its failure is reported, not the chain's
            report.role, report.error = "proxy", None
            report.bypassed = str(fields.get("reason", ""))

    def waiting_on(self) -> ComponentReport | None:
        """The component deepest in the chain that was asked and has not answered."""
        waiting = [r for r in self.components.values()
                   if r.asked and r.result is None and r.error is None]
        return waiting[-1] if waiting else None


class CheckReport(Record):
    ok: bool
    components: list[ComponentReport]
    reason: str | None = None
    failed: str | None = None          # the component to blame
    stderr_tail: list[str] = field(default_factory=list)
    exit_code: int = 0
    initialize: dict[str, Any] | None = None  # what the editor would have seen
    mode: str = "agent"                # "proxy": a chain of proxies, checked as a proxy

    def to_json(self) -> dict[str, Any]:
        return {"ok": self.ok, "mode": self.mode, "reason": self.reason,
                "failedComponent": self.failed, "stderrTail": self.stderr_tail,
                "exitCode": self.exit_code,
                "components": [c.summary() for c in self.components]}


# What `check` answers in place of the successor of a chain of proxies: an agent that
# supports nothing, so each proxy's own answer shows what it adds.
STAND_IN_AGENT = {"agentCapabilities": {}, "authMethods": [],
                  "agentInfo": {"name": "acp-conductor-check (successor stand-in)",
                                "version": "1"}}


class _Successor(EditorHandler):
    """The outer conductor's side of a proxy chain: answers `initialize` arriving wrapped in
    `_proxy/successor` as a bare agent would; refuses anything else."""

    async def handle_request(self, method: str, params: JsonValue) -> JsonValue:
        if method in acp.SUCCESSOR_METHODS and isinstance(params, dict) and \
                params.get("method") == acp.INITIALIZE:
            inner = params.get("params")
            version = inner.get("protocolVersion", 1) if isinstance(inner, dict) else 1
            return {"protocolVersion": version, **STAND_IN_AGENT}
        return await super().handle_request(method, params)


# The timeout is the check's subject (a report blames whoever had not answered initialize
# in time), not a bound the caller could put around the call.
async def check_chain(config: ChainConfig, *, timeout: float = 30.0,  # noqa: ASYNC109
                      tracer: TraceSink | None = None) -> CheckReport:
    """Start, initialize and stop `config`'s chain.

    Raises:
        ConfigError: the chain cannot be planned.
    """
    # A chain with no agent is a proxy (`acp-conductor proxy --chain`): check it as one,
    # with `check` as its outer conductor and a stand-in agent as its successor.
    mode = "agent" if config.agent is not None else "proxy"
    recorder = _Recorder()
    names = [*config.proxy_names(), *([config.agent_name()] if config.agent else [])]
    for name in names:
        recorder.get(name)  # keep chain order in the report
    chain = InProcessChain(config, RunOptions(
        mode=mode, tracer=FanoutTraceSink(recorder, tracer) if tracer else recorder))
    reason: str | None = None
    blame: str | None = None
    tail: list[str] = []
    result: dict[str, Any] | None = None

    async with anyio.create_task_group() as tg:
        tg.start_soon(chain.serve)
        async with open_client_connection(chain.from_conductor, chain.to_conductor,
                                          _Successor() if mode == "proxy" else None) as conn:
            try:
                with anyio.fail_after(timeout):
                    method = acp.INITIALIZE if mode == "agent" else "_proxy/initialize"
                    result = await conn.request(method, {
                        "protocolVersion": 1,
                        "clientCapabilities": {"fs": {"readTextFile": True,
                                                      "writeTextFile": True},
                                               "terminal": True},
                        "clientInfo": {"name": "acp-conductor-check", "version": "1"}})
            except TimeoutError:
                stuck = recorder.waiting_on()
                blame = stuck.name if stuck else None
                reason = f"no answer to initialize within {timeout:g}s" + (
                    f" (waiting on {blame})" if blame else "")
            except RpcError as e:
                data = e.data if isinstance(e.data, dict) else {}
                blame = data.get("component")
                tail = list(data.get("stderrTail") or [])
                reason = e.message
            except ConnectionClosedError:
                reason = "the conductor stopped before answering initialize"
        with anyio.move_on_after(config.conductor.shutdown_grace + 10):
            await chain.done.wait()
        tg.cancel_scope.cancel()

    if chain.error is not None:
        raise chain.error
    components = [recorder.components[n] for n in recorder.components]
    if reason is None:
        for report in components:
            if report.error is not None:
                reason, blame = f"{report.name} answered initialize with an error", report.name
                break
    if blame is not None and not tail and blame in recorder.components:
        tail = list(recorder.components[blame].stderr)
    if reason is not None:
        return CheckReport(False, components, reason, blame, tail,
                           3 if blame is not None or chain.code == 3 else 1, result, mode)
    return CheckReport(True, components, exit_code=chain.code or 0, initialize=result, mode=mode)
