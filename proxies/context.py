"""context: inject rules and context (files, literal text) into prompts, as a marked block.

Files are globs relative to the session's `cwd` (from session/new or load). The block is
put in front of the prompt's content: in the first prompt of each session, or in every
prompt. The rest of the prompt keeps its bytes.
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

import anyio
import msgspec
from msgspec import Raw
from pydantic import BaseModel, ConfigDict, Field

from conductor.jsonrpc.message import Message, payload
from conductor.plugins import Proxy, ProxyContext, on

MARK = "acp-conductor:context"


class ContextOptions(BaseModel):
    model_config = ConfigDict(extra="forbid")

    files: list[str] = []                    # globs relative to the session cwd
    text: str | None = None                  # literal text, after the files
    when: Literal["first", "every"] = "first"
    max_file_bytes: int = Field(default=256 * 1024, ge=1)


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
            for pattern in self.options.files:
                for path in sorted(base.glob(pattern)):
                    if path in seen or not path.is_file():
                        continue
                    seen.add(path)
                    data = path.read_bytes()[: self.options.max_file_bytes]
                    pieces.append((str(path.relative_to(base)),
                                   data.decode("utf-8", errors="replace")))
        elif self.options.files:
            self.log.warning("session has no cwd: files %s not injected", self.options.files)
        if self.options.text:
            pieces.append(("text", self.options.text))
        return pieces

    @on("session/prompt")
    async def prompt(self, ctx: ProxyContext, message: Message) -> object:
        session = ctx.session
        if session is None or message.params is msgspec.UNSET:
            return await ctx.forward()
        if self.options.when == "first" and session.state.get("context_injected"):
            return await ctx.forward()
        session.state["context_injected"] = True
        pieces = await anyio.to_thread.run_sync(self.collect, session.cwd)
        if not pieces:
            return await ctx.forward()
        body = "\n\n".join(f'<file path="{label}">\n{text}\n</file>' if label != "text" else text
                           for label, text in pieces)
        block = {"type": "text", "text": f"<{MARK}>\n{body}\n</{MARK}>"}
        self.log.info("injected into %s: %s", session.session_id,
                      ", ".join(f"{label} ({len(text.encode())} bytes)" for label, text in pieces))
        return await ctx.forward(message.with_params(prepend_block(message.params, block)))
