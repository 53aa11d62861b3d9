"""permissions: a declarative policy for what the agent may do through the editor.

Rules are checked in order, first match wins, else `default`. They judge
`session/request_permission` (by tool kind, title, paths, command) and the agent's direct
requests to the editor: `fs/read_text_file`, `fs/write_text_file`, `terminal/create`. So a
`.env` rule also stops a read that goes straight through the editor's filesystem.
Every decision is logged with the rule that made it.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field
from fnmatch import fnmatchcase
from typing import TYPE_CHECKING, Any, Literal

from pydantic import BaseModel, ConfigDict

from conductor.config import Regex
from conductor.errors import RpcError
from conductor.plugins import Proxy, ProxyContext, on

if TYPE_CHECKING:
    from conductor.jsonrpc.message import JsonValue, Request

Action = Literal["allow", "deny", "ask"]
PERMISSION_DENIED = -32001  # an application error code: the policy refused


class Rule(BaseModel):
    """One rule: every condition given must match; a rule with none matches everything."""

    model_config = ConfigDict(extra="forbid")

    action: Action
    name: str | None = None                 # shown in the log; default "rule N"
    kind: str | list[str] | None = None     # tool kind: read, edit, delete, execute, fetch, ...
    title: str | None = None                # glob on the tool call's title
    path: str | None = None                 # glob on any path involved (see docs)
    command: Regex | None = None            # regex searched in the command line


class PermissionsOptions(BaseModel):
    model_config = ConfigDict(extra="forbid")

    rules: list[Rule] = []
    default: Action = "ask"


@dataclass
class Subject:
    """What a request asks to do, in the terms rules speak."""

    method: str
    kind: str | None = None
    title: str | None = None
    paths: list[str] = field(default_factory=list)
    command: str | None = None
    cwd: str | None = None

    def describe(self) -> str:
        parts = [self.method]
        if self.kind:
            parts.append(f"kind={self.kind}")
        if self.title:
            parts.append(f"title={self.title!r}")
        if self.paths:
            parts.append(f"paths={self.paths}")
        if self.command:
            parts.append(f"command={self.command!r}")
        return " ".join(parts)


def path_candidates(path: str, cwd: str | None) -> set[str]:
    """Every spelling a rule should see for `path`: normalised (so `./.env/.`, `sub/../.env`
    and `.env/` are all `.env`), with symlinks resolved, relative to the session cwd (and to
    its real path), and each one's file name. A deny rule then holds whichever spelling or
    link the agent uses."""
    full = os.path.join(cwd, path) if cwd and not os.path.isabs(path) else path
    full = os.path.normpath(full) if full else full
    spellings = {full}
    if os.path.isabs(full):
        # unnormalised too: `link/../x` goes through the link's target on the real filesystem
        raw = os.path.join(cwd, path) if cwd and not os.path.isabs(path) else path
        spellings |= {os.path.realpath(full), os.path.realpath(raw)}
    bases = [cwd, os.path.realpath(cwd)] if cwd else []
    candidates = set(spellings)
    for spelling in spellings:
        for base in bases:
            if os.path.isabs(spelling):
                rel = os.path.relpath(spelling, base)
                if rel != ".." and not rel.startswith("../"):
                    candidates.add(rel)
    candidates |= {os.path.basename(c) for c in list(candidates)}
    candidates.discard("")
    return candidates


def path_matches(pattern: str, path: str, cwd: str | None) -> bool:
    """The glob against any spelling of the path (see `path_candidates`): so `.env` and
    `*.pem` match anywhere, and `secrets/*` matches relative to the session cwd."""
    return any(fnmatchcase(c, pattern) for c in path_candidates(path, cwd))


def rule_matches(rule: Rule, subject: Subject) -> bool:
    if rule.kind is not None:
        kinds = [rule.kind] if isinstance(rule.kind, str) else rule.kind
        if subject.kind not in kinds:
            return False
    if rule.title is not None and (subject.title is None
                                   or not fnmatchcase(subject.title, rule.title)):
        return False
    if rule.path is not None and not any(path_matches(rule.path, p, subject.cwd)
                                         for p in subject.paths):
        return False
    return rule.command is None or (subject.command is not None
                                    and re.search(rule.command, subject.command) is not None)


class Permissions(Proxy[PermissionsOptions]):
    """Allow, deny or ask for tool calls and editor file/terminal access, by declarative rules."""

    options_model = PermissionsOptions

    def decide(self, subject: Subject) -> tuple[Action, str]:
        for i, rule in enumerate(self.options.rules):
            if rule_matches(rule, subject):
                return rule.action, rule.name or f"rule {i + 1}"
        return self.options.default, "default"

    def _judge(self, ctx: ProxyContext, subject: Subject) -> Action:
        session = ctx.session
        subject.cwd = session.cwd if session is not None else None
        action, by = self.decide(subject)
        self.log.info("%s %s (by %s)", action, subject.describe(), by)
        return action

    @on("session/request_permission", source="successor")
    async def request_permission(self, ctx: ProxyContext, message: Request) -> JsonValue:
        params: dict[str, Any] = message.params_value() or {}
        tool = params.get("toolCall") or {}
        raw_input = tool.get("rawInput") if isinstance(tool.get("rawInput"), dict) else {}
        command = raw_input.get("command")
        subject = Subject(
            message.method,  # type: ignore[arg-type]
            kind=tool.get("kind"), title=tool.get("title"),
            paths=[loc["path"] for loc in tool.get("locations") or []
                   if isinstance(loc, dict) and isinstance(loc.get("path"), str)],
            command=" ".join(command) if isinstance(command, list) else command)
        action = self._judge(ctx, subject)
        if action == "ask":
            return await ctx.forward()
        wanted = ("allow_once", "allow_always") if action == "allow" else \
            ("reject_once", "reject_always")
        for kind in wanted:  # prefer the one-off choice: a policy decides each time
            for option in params.get("options") or []:
                if option.get("kind") == kind:
                    return {"outcome": {"outcome": "selected", "optionId": option["optionId"]}}
        return {"outcome": {"outcome": "cancelled"}}

    @on("fs/read_text_file", source="successor")
    async def read_text_file(self, ctx: ProxyContext, message: Request) -> JsonValue:
        return await self._editor_access(ctx, message, "read")

    @on("fs/write_text_file", source="successor")
    async def write_text_file(self, ctx: ProxyContext, message: Request) -> JsonValue:
        return await self._editor_access(ctx, message, "edit")

    @on("terminal/create", source="successor")
    async def create_terminal(self, ctx: ProxyContext, message: Request) -> JsonValue:
        params: dict[str, Any] = message.params_value() or {}
        command = " ".join([str(params.get("command", "")), *map(str, params.get("args") or [])])
        subject = Subject(message.method, kind="execute", command=command,  # type: ignore[arg-type]
                          paths=[params["cwd"]] if isinstance(params.get("cwd"), str) else [])
        return await self._allow_or_refuse(ctx, subject)

    async def _editor_access(self, ctx: ProxyContext, message: Request, kind: str) -> JsonValue:
        params: dict[str, Any] = message.params_value() or {}
        path = params.get("path")
        subject = Subject(message.method, kind=kind,  # type: ignore[arg-type]
                          paths=[path] if isinstance(path, str) else [])
        return await self._allow_or_refuse(ctx, subject)

    async def _allow_or_refuse(self, ctx: ProxyContext, subject: Subject) -> JsonValue:
        # allow and ask both pass the request on: the editor has the file and its own prompts.
        if self._judge(ctx, subject) == "deny":
            raise RpcError(PERMISSION_DENIED, f"denied by the permissions policy of {self.name}",
                           {"component": self.name, "method": subject.method})
        return await ctx.forward()
