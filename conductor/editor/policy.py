"""`run`'s editor: answers the agent's requests to the editor by the run's policies.

Permission requests by `--approve`; file requests through the sandbox (`--cwd`,
`--allow-write`); terminals only with `--allow-terminal`. Every decision is reported to the
renderer, and every refusal by policy is a violation (exit 8).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol

import anyio

from conductor.editor.client import EditorHandler
from conductor.editor.sandbox import Sandbox
from conductor.editor.terminals import Terminals
from conductor.jsonrpc.framing import DEFAULT_MAX_FRAME_BYTES

if TYPE_CHECKING:
    from collections.abc import Callable
    from pathlib import Path

    from conductor.editor.terminals import Spawn
    from conductor.jsonrpc.message import JsonValue

APPROVE_CHOICES = ("all", "reads", "none", "fail", "ask")
READ_KINDS = frozenset({"read", "search", "think"})


class RunEvents(Protocol):
    """What a renderer (rich, plain, JSON lines) is told about the turn."""

    def session(self, record: dict[str, Any]) -> None: ...
    def update(self, session_id: str | None, update: dict[str, Any]) -> None: ...
    def decision(self, record: dict[str, Any]) -> None: ...
    def notice(self, text: str) -> None: ...
    # A turn's prompt goes out: what arrives before it (a loaded session's replayed
    # history) is not that turn's answer.
    def prompting(self, number: int) -> None: ...
    def turn(self, record: dict[str, Any]) -> None: ...
    def result(self, record: dict[str, Any]) -> None: ...
    async def ask_permission(self, tool_call: dict[str, Any],
                             options: list[dict[str, Any]]) -> str | None: ...


class RunEditor(EditorHandler):
    """Answers the agent's requests by the run's policies; reports every decision."""

    def __init__(self, events: RunEvents, *, cwd: Path, approve: str, allow_write: bool,
                 allow_terminal: bool, max_frame_bytes: int | None,
                 on_policy_failure: Callable[[], None],
                 spawn: Spawn) -> None:
        self.events = events
        self.approve = approve
        self.sandbox = Sandbox(cwd, events, allow_write=allow_write,
                               frame_limit=max_frame_bytes or DEFAULT_MAX_FRAME_BYTES)
        self.terminals = Terminals(self.sandbox, allowed=allow_terminal, spawn=spawn)
        self.root = self.sandbox.root
        self.violations = self.sandbox.violations
        self.cancelling = False
        self._on_policy_failure = on_policy_failure
        self._asking: set[anyio.CancelScope] = set()
        self.last_usage: dict[str, Any] | None = None

    # dispatch ------------------------------------------------------------------------------

    async def handle_notification(self, method: str, params: JsonValue) -> None:
        if method == "session/update" and isinstance(params, dict):
            update = params.get("update")
            if isinstance(update, dict):
                if update.get("sessionUpdate") == "usage_update":
                    self.last_usage = update
                self.events.update(params.get("sessionId"), update)

    async def handle_request(self, method: str, params: JsonValue) -> JsonValue:
        p = params if isinstance(params, dict) else {}
        if method == "session/request_permission":
            return await self._permission(p)
        if method == "fs/read_text_file":
            return await self.sandbox.read(p)
        if method == "fs/write_text_file":
            return await self.sandbox.write(p)
        if method.startswith("terminal/"):
            return await self.terminals.handle(method, p)
        return await super().handle_request(method, params)

    def cancel_pending(self) -> None:
        """The turn is being cancelled: open questions get the `cancelled` outcome (ACP rule)."""
        self.cancelling = True
        for scope in list(self._asking):
            scope.cancel()

    async def aclose(self) -> None:
        """Kill what the agent left running in its terminals."""
        await self.terminals.aclose()

    # permissions ---------------------------------------------------------------------------

    async def _permission(self, p: dict[str, Any]) -> JsonValue:
        tool = p.get("toolCall")
        if not isinstance(tool, dict):
            tool = {}
        given = p.get("options")
        # Only options the answer can name: an id that is not a string is no answer.
        options = [o for o in given if isinstance(o, dict) and isinstance(o.get("optionId"), str)
                   ] if isinstance(given, list) else []
        ids = [o["optionId"] for o in options]
        if len(set(ids)) != len(ids):
            # The agent reads the id back: a shared one could mean its allow option as well
            # as the reject option a policy picked. Malformed: nothing can be chosen.
            options = []
        policy = self.approve
        chosen: str | None = None
        if not self.cancelling:
            if policy == "all":
                chosen = _pick(options, ("allow_once", "allow_always"))
            elif policy == "reads":
                chosen = _pick(options,
                               ("allow_once", "allow_always") if _is_read(tool.get("kind"))
                               else ("reject_once", "reject_always"))
            elif policy == "none":
                chosen = _pick(options, ("reject_once", "reject_always"))
            elif policy == "ask":
                scope = anyio.CancelScope()
                self._asking.add(scope)
                try:
                    with scope:
                        chosen = await self.events.ask_permission(tool, options)
                finally:
                    self._asking.discard(scope)
            elif policy == "fail":
                self.sandbox.violation("permission",
                                       "--approve fail: the agent asked for permission",
                                       tool=tool)
                self._on_policy_failure()
        kind = next((o.get("kind") for o in options if o.get("optionId") == chosen), None)
        self.events.decision({"type": "permission", "sessionId": p.get("sessionId"),
                              "toolCall": tool, "policy": policy,
                              "outcome": "selected" if chosen is not None else "cancelled",
                              "optionId": chosen, "optionKind": kind})
        if chosen is None:
            return {"outcome": {"outcome": "cancelled"}}
        return {"outcome": {"outcome": "selected", "optionId": chosen}}


def _is_read(kind: object) -> bool:
    return isinstance(kind, str) and kind in READ_KINDS  # a list or object is no kind


def _pick(options: list[dict[str, Any]], kinds: tuple[str, ...]) -> str | None:
    for kind in kinds:
        for option in options:
            chosen = option.get("optionId")
            if option.get("kind") == kind and isinstance(chosen, str):
                return chosen
    return None
