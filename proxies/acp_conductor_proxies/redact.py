"""redact: scrub secrets from prompts going down and from session updates, permission
requests, elicitations and prompts' answers coming up.

Secrets are regex matches and the values of named environment variables. Messages with
nothing to scrub keep their bytes; the log says what kind of secret was scrubbed and
where, never the secret.
"""

from __future__ import annotations

import os
import re
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel, ConfigDict

from conductor.jsonrpc.message import Response, payload
from conductor.plugins import Proxy, ProxyContext, on
from conductor.validation import Regex

if TYPE_CHECKING:
    from conductor.jsonrpc.message import Call, Notification, Request

MIN_SECRET = 4  # shorter env values would scrub ordinary words


class RedactOptions(BaseModel):
    model_config = ConfigDict(extra="forbid")

    patterns: list[Regex] = []   # regular expressions
    env: list[str] = []          # names of environment variables whose values are secret
    replacement: str = "[redacted]"


class Redact(Proxy[RedactOptions]):
    """Scrub secrets (regexes, env var values) from prompts and from the agent's updates."""

    options_model = RedactOptions

    def __init__(self, options: RedactOptions | None = None) -> None:
        super().__init__(options)
        self._rules: list[tuple[str, re.Pattern[str]]] = [
            (f"pattern {i + 1}", re.compile(p)) for i, p in enumerate(self.options.patterns)]
        for name in self.options.env:
            value = os.environ.get(name)
            if value is not None:  # a value read from a file often keeps its final newline
                value = value.strip()
            if value is None:  # a typo or a missing secret: say so, or nothing is scrubbed
                self.log.warning("env %s is not set: nothing to scrub for it", name)
            elif len(value) < MIN_SECRET:
                self.log.warning("env %s is shorter than %d characters: not scrubbed",
                                 name, MIN_SECRET)
            else:
                self._rules.append((f"env {name}", re.compile(re.escape(value))))

    def scrub(self, value: Any, hits: dict[str, int]) -> Any:
        """A copy of a JSON value with every string scrubbed (keys are left alone)."""
        # Walked with a stack of its own, not by recursion: a value nested as deep as the
        # JSON decoder allows would otherwise exhaust Python's stack, and the message with it.
        root = [value]
        todo: list[tuple[Any, Any]] = [(root, 0)]
        while todo:
            container, key = todo.pop()
            item = container[key]
            if isinstance(item, str):
                container[key] = self.scrub_text(item, hits)
            elif isinstance(item, list):
                container[key] = items = list(item)
                todo.extend((items, i) for i in range(len(items)))
            elif isinstance(item, dict):
                container[key] = fields = dict(item)
                todo.extend((fields, k) for k in fields)
        return root[0]

    def scrub_text(self, value: str, hits: dict[str, int]) -> str:
        # Every rule searches the original text and the spans they find are merged:
        # run one after another, a pattern matching inside an env secret would break it
        # up and let the rest of it through. The replacement is literal text, never a
        # template (`\g<0>` must not restore the secret).
        spans: list[tuple[int, int]] = []
        for label, rule in self._rules:
            found = [m.span() for m in rule.finditer(value) if m.end() > m.start()]
            if found:
                hits[label] = hits.get(label, 0) + len(found)
                spans.extend(found)
        if not spans:
            return value
        out: list[str] = []
        done = 0
        for start, end in sorted(spans):
            if start >= done:
                out.append(value[done:start])
                out.append(self.options.replacement)
            done = max(done, end)
        out.append(value[done:])
        return "".join(out)

    def _scrubbed(self, message: Call) -> Call:
        if not self._rules:
            return message
        hits: dict[str, int] = {}
        params = self.scrub(message.params_value(), hits)
        if not hits:
            return message  # nothing secret: the original bytes go on
        self.log.info("scrubbed %s in %s", ", ".join(f"{n} x {label}" for label, n in
                                                   sorted(hits.items())), message.method)
        return message.with_params(params)

    def _scrubbed_answer(self, answer: Response | None, method: str) -> Response | None:
        if answer is None or not self._rules:
            return answer
        hits: dict[str, int] = {}
        if answer.is_error:
            error = self.scrub(answer.error_value(), hits)
            scrubbed = Response(id=answer.id, error=payload(error))
        else:
            scrubbed = answer.with_result(self.scrub(answer.result_value(), hits))
        if not hits:
            return answer
        self.log.info("scrubbed %s in the answer to %s", ", ".join(
            f"{n} x {label}" for label, n in sorted(hits.items())), method)
        return scrubbed

    @on("session/prompt")
    async def prompt(self, ctx: ProxyContext, message: Request) -> object:
        # the editor shows a failed turn's error to the user like the agent's text
        answer = await ctx.forward(self._scrubbed(message))
        return self._scrubbed_answer(answer, message.method)

    @on("session/update", source="successor")
    async def update(self, ctx: ProxyContext, message: Notification) -> None:
        await ctx.forward(self._scrubbed(message))

    @on("session/request_permission", source="successor")
    async def request_permission(self, ctx: ProxyContext, message: Request) -> object:
        # the tool call's title and rawInput are shown to the user like an update
        return await ctx.forward(self._scrubbed(message))

    @on("elicitation/create", source="successor")
    async def elicitation(self, ctx: ProxyContext, message: Request) -> object:
        # ACP v2: the agent's message and form (or URL) are put in front of the user
        return await ctx.forward(self._scrubbed(message))
