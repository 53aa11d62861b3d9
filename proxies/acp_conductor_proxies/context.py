"""context: inject rules and context (files, literal text) into prompts, as a marked block.

Files are globs relative to the session's `cwd` (from session/new or load). The block is
put in front of the prompt's content: in the first prompt of each session, or in every
prompt. The rest of the prompt keeps its bytes.
"""

from __future__ import annotations

import os
from pathlib import Path, PurePath
from typing import Literal

import anyio
import msgspec
from msgspec import Raw
from pydantic import BaseModel, ConfigDict, Field, field_validator

from conductor.jsonrpc.message import Request, payload
from conductor.plugins import Proxy, ProxyContext, on

MARK = "acp-conductor:context"


class ContextOptions(BaseModel):
    model_config = ConfigDict(extra="forbid")

    files: list[str] = []                    # globs relative to the session cwd
    text: str | None = None                  # literal text, after the files
    when: Literal["first", "every"] = "first"
    max_file_bytes: int = Field(default=256 * 1024, ge=1)

    @field_validator("files")
    @classmethod
    def _relative(cls, files: list[str]) -> list[str]:
        # Path.glob refuses absolute patterns only when the first prompt arrives: say so now.
        for pattern in files:
            if not pattern or PurePath(pattern).is_absolute():
                raise ValueError(f"files must be globs relative to the session cwd, "
                                 f"not {pattern!r}")
        return files


def prepend_block(params: Raw, block: object) -> Raw:
    """params with `block` first in `prompt`; every other value keeps its bytes."""
    obj = msgspec.json.decode(params, type=dict[str, Raw])
    prompt = msgspec.json.decode(obj.get("prompt", Raw(b"[]")), type=list[Raw])
    obj["prompt"] = payload([payload(block), *prompt])
    return payload(obj)


class Context(Proxy[ContextOptions]):
    """Inject files (e.g. AGENTS.md) and text into the first (or every) prompt of a session."""

    options_model = ContextOptions

    def collect(self, cwd: str | None) -> list[tuple[str, str]]:
        """(label, content) pieces for one prompt: files first, sorted per glob, then text."""
        pieces: list[tuple[str, str]] = []
        seen: set[Path] = set()
        if cwd is not None:
            base = Path(cwd)
            real_base = Path(os.path.realpath(cwd))
            for pattern in self.options.files:
                found = sorted(base.glob(pattern))
                if not found:  # a typo (`AGENT.md`) would otherwise pass unnoticed
                    self.log.info("no file matches %s in %s", pattern, cwd)
                for path in found:
                    label = str(path.relative_to(base))
                    try:
                        if path in seen or not path.is_file():
                            continue
                        seen.add(path)
                        # a symlink (or `..` in a glob) must not carry files from outside the
                        # project into the prompt
                        if not Path(os.path.realpath(path)).is_relative_to(real_base):
                            self.log.warning("skipped %s: it resolves outside the session cwd",
                                             label)
                            continue
                        with path.open("rb") as f:
                            data = f.read(self.options.max_file_bytes)
                    except OSError as e:  # one bad file must not fail the prompt
                        self.log.warning("skipped %s: %s", label, e.strerror or type(e).__name__)
                        continue
                    pieces.append((label, data.decode("utf-8", errors="replace")))
        elif self.options.files:
            self.log.warning("session has no cwd: files %s not injected", self.options.files)
        if self.options.text:
            pieces.append(("text", self.options.text))
        return pieces

    @on("session/prompt")
    async def prompt(self, ctx: ProxyContext, message: Request) -> object:
        session = ctx.session
        if session is None or message.params is msgspec.UNSET:
            return await ctx.forward()
        if self.options.when == "first" and session.state.get("context_injected"):
            return await ctx.forward()
        pieces = await anyio.to_thread.run_sync(self.collect, session.cwd)
        if not pieces:
            session.state["context_injected"] = True
            return await ctx.forward()
        body = "\n\n".join(f'<file path="{label}">\n{text}\n</file>' if label != "text" else text
                           for label, text in pieces)
        block = {"type": "text", "text": f"<{MARK}>\n{body}\n</{MARK}>"}
        try:
            params = prepend_block(message.params, block)
        except (msgspec.DecodeError, msgspec.ValidationError):
            # Not an ACP prompt (no list of blocks): the agent is the one to refuse it, and
            # the refusal should not read as context's own failure. Injected next time.
            self.log.warning("session/prompt params are not an ACP prompt; passed on as sent")
            return await ctx.forward()
        # only now: a prompt that the block could not be collected for, or put into, is retried
        session.state["context_injected"] = True
        self.log.info("injected into %s: %s", session.session_id,
                      ", ".join(f"{label} ({len(text.encode())} bytes)" for label, text in pieces))
        return await ctx.forward(message.with_params(params))
