"""`acp-conductor run`: the conductor as its own editor, for a terminal or a CI job.

Here stdout is the user's terminal (or their pipe). It is still claimed before any plugin
is loaded: the turn's output goes to a private copy of stdout, and whatever a plugin
prints goes to stderr.
"""

from __future__ import annotations

import json
import os
import re
import sys
from pathlib import Path
from typing import Any, TextIO

import click

from conductor.cli import loop
from conductor.cli.context import global_options, globals_of, handle_errors
from conductor.cli.exits import epilog
from conductor.cli.logs import leave_to_the_client
from conductor.editor.policy import APPROVE_CHOICES
from conductor.editor.turn import RunExit, TurnOptions, run_turns
from conductor.errors import ConfigError
from conductor.plan import read_chain
from conductor.tracing.sink import run_flushed


def claim_stdout(ctx: click.Context) -> TextIO:
    """Our own stdout, as text; from now on fd 1 and `sys.stdout` are stderr. It is closed
    when the command (`ctx`) ends, as the exit would close it: run in-process (as tests
    run commands), a command leaves no file open behind it."""
    from conductor.transport.claim import claim_stdout

    fd = claim_stdout()
    if sys.stdin is None:
        # Started with fd 0 closed (`<&-`): claim_stdout put /dev/null there; read it as an
        # empty stdin rather than failing on the missing `sys.stdin`.
        sys.stdin = open(os.devnull, encoding="utf-8")
    out = open(fd, "w", encoding="utf-8", buffering=1 if os.isatty(fd) else -1)
    ctx.call_on_close(lambda: _close(out))
    return out


def _close(out: TextIO) -> None:
    try:
        out.close()
    except BrokenPipeError:
        pass  # the reader went away (`| head`): what is left is for nobody


def flush(out: TextIO) -> None:
    try:
        out.flush()
    except BrokenPipeError:
        pass  # the reader went away (`| head`): nothing more to say


FORMATS = ("text", "json", "quiet")


def read_prompt_file(text: str, name: str) -> list[str]:
    """The prompts in a prompt file: JSON lines (`.jsonl`: each a string, or an object with
    a string `prompt`), else plain text with prompts separated by lines of `---`.

    Raises:
        ConfigError: a JSON line is not a prompt.
    """
    if not name.endswith(".jsonl"):
        chunks = re.split(r"^---[ \t]*$", text, flags=re.MULTILINE)
        return [chunk.strip() for chunk in chunks if chunk.strip()]
    prompts = []
    for number, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            value = json.loads(line)
        except json.JSONDecodeError as e:
            raise ConfigError(f"line {number} is not JSON: {e.msg}", file=name) from None
        prompt = value.get("prompt") if isinstance(value, dict) else value
        if not isinstance(prompt, str):
            raise ConfigError(f"line {number} is not a prompt", file=name,
                              hint='each line: a JSON string, or {"prompt": "..."}')
        prompts.append(prompt)
    return prompts


def _stdin() -> str:
    """All of stdin, as UTF-8 text.

    Raises:
        ConfigError: it is not UTF-8.
    """
    data = sys.stdin.buffer.read()
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise ConfigError(f"stdin is not UTF-8 text (byte 0x{data[e.start]:02x} at offset "
                          f"{e.start})", field="PROMPT") from None
    return text.replace("\r\n", "\n").replace("\r", "\n")  # as text mode reads it


def _prompts(prompt: str | None, more: tuple[str, ...], prompt_file: str | None) -> list[str]:
    """PROMPT, then each --prompt, then the file's, in order; stdin read where `-` says.

    Raises:
        ConfigError: none, an empty one, or stdin asked for twice.
    """
    if prompt == "-" and prompt_file == "-":
        raise ConfigError("stdin can be read once: give PROMPT - or --prompt-file -, not both",
                          field="PROMPT")
    prompts = [_stdin() if prompt == "-" else prompt] if prompt is not None else []
    prompts += more
    if prompt_file is not None:
        if prompt_file == "-":
            prompts += read_prompt_file(_stdin(), "-")
        else:
            try:
                text = Path(prompt_file).read_text(encoding="utf-8")
            except (OSError, UnicodeDecodeError) as e:
                raise ConfigError(f"cannot read the prompt file: {e}", file=prompt_file,
                                  field="--prompt-file") from None
            prompts += read_prompt_file(text, prompt_file)
    if not prompts:
        raise ConfigError("give a PROMPT (- reads stdin), --prompt, or --prompt-file",
                          field="PROMPT")
    for number, text in enumerate(prompts, 1):
        try:
            # An argument in another encoding arrives with surrogate escapes, which could
            # never be sent as JSON: refuse it here rather than fail mid-run.
            text.encode("utf-8")
        except UnicodeEncodeError:
            which = "the prompt" if len(prompts) == 1 else f"prompt {number}"
            raise ConfigError(f"{which} is not UTF-8 text", field="PROMPT") from None
        if not text.strip():
            which = "the prompt" if len(prompts) == 1 else f"prompt {number}"
            raise ConfigError(f"{which} is empty" + (" (nothing on stdin)" if prompt == "-"
                                                     and number == 1 else ""),
                              field="PROMPT", hint="give the agent something to do")
    return prompts


PROMPT_ENVELOPE = 128  # bytes of a session/prompt request around its text (a short session id)


def _refuse_oversized(prompts: list[str], limit: int) -> None:
    """A prompt whose request the chain would refuse as over its frame limit is a usage
    error before anything starts (else exit 1, "client sent a message of N bytes")."""
    for number, text in enumerate(prompts, 1):
        size = len(json.dumps(text, ensure_ascii=False).encode("utf-8")) + PROMPT_ENVELOPE
        if size > limit:
            which = "the prompt" if len(prompts) == 1 else f"prompt {number}"
            raise ConfigError(f"{which} makes a request of about {size:,} bytes, over the "
                              f"{limit:,}-byte limit on a message", field="PROMPT",
                              hint="raise it with --max-frame-bytes (or [conductor] "
                                   "max_frame_bytes), or send less")


@click.command("run", epilog=epilog("Exit codes of run", RunExit))
@click.argument("prompt", required=False)
@click.option("--prompt", "more_prompts", multiple=True, metavar="TEXT",
              help="Another turn, after PROMPT (repeat it; one session, in order).")
@click.option("--prompt-file", type=click.Path(dir_okay=False, allow_dash=True),
              help="More turns from a file: prompts separated by lines of ---, or JSON lines "
                   "(.jsonl: strings or {\"prompt\": ...}); - reads stdin.")
@click.option("--cwd", type=click.Path(file_okay=False, exists=True), default=".",
              show_default=True, help="The session's working directory; file access stays inside.")
@click.option("--session-id", help="Reopen this session (session/load, or session/resume).")
@click.option("--approve", type=click.Choice(APPROVE_CHOICES),
              help="Answer permission requests: all, reads (read/search/think kinds), none, "
                   "fail (cancel the turn, exit 8), ask. Default: ask on a terminal, else none.")
@click.option("--allow-write", is_flag=True, help="Let the agent write files inside --cwd.")
@click.option("--allow-terminal", is_flag=True,
              help="Let the agent run commands (terminal/*) inside --cwd.")
@click.option("--timeout", type=click.FloatRange(min=0, min_open=True),
              help="Cancel the turn after this many seconds, counted from the start for all "
                   "turns (exit 124).")
@click.option("--cancel-grace", type=click.FloatRange(min=0), default=10.0, show_default=True,
              help="How long to wait for the agent's answer after session/cancel.")
@click.option("--format", "output_format", type=click.Choice(FORMATS),
              help="text: live on a terminal, plain in a pipe (default); json: one event per "
                   "line (docs/run.md); quiet: only the last turn's answer, on success.")
@click.option("--json", "as_json", is_flag=True, help="Same as --format json.")
@global_options
@click.pass_context
@handle_errors
def run_command(ctx: click.Context, prompt: str | None, more_prompts: tuple[str, ...],
                prompt_file: str | None, cwd: str, session_id: str | None,
                approve: str | None, allow_write: bool, allow_terminal: bool,
                timeout: float | None, cancel_grace: float, output_format: str | None,
                as_json: bool) -> None:
    """Act as the editor: send PROMPT (or stdin with -) through the chain, show the turn.
    More prompts (--prompt, --prompt-file) are more turns in the same session; the run
    stops at the first that does not end with end_turn, and exits with its code.

    \b
    acp-conductor run --chain demo "hello"
    echo "summarise README.md" | acp-conductor run --chain c.toml - --json --approve reads
    acp-conductor run --chain c.toml "review the diff" --prompt "suggest a test" --format quiet
    """
    from conductor.editor.render import JsonEvents, PlainEvents, QuietEvents

    out = claim_stdout(ctx)
    options = globals_of(ctx)
    leave_to_the_client(options.log_level)
    if not options.chain_file and prompt is not None and prompt.endswith(".toml") \
            and os.path.isfile(prompt):
        # `run mine.toml`: the chain file given where the prompt goes (it would have been
        # sent to the agent as the prompt, had a --chain been given too)
        raise ConfigError("give --chain FILE", field="--chain",
                          hint=f"{prompt} is a chain file: acp-conductor run --chain "
                               f"{prompt} \"your prompt\"")
    config = read_chain(options.chain())
    if as_json and output_format not in (None, "json"):
        raise ConfigError(f"--json is --format json: it contradicts --format {output_format}",
                          field="--format")
    fmt = "json" if as_json else output_format or "text"
    prompts = _prompts(prompt, more_prompts, prompt_file)
    _refuse_oversized(prompts, options.max_frame_bytes or config.conductor.max_frame_bytes)
    from_stdin = "-" in (prompt, prompt_file)
    if approve is None:
        interactive = sys.stdin.isatty() and sys.stderr.isatty() and not from_stdin
        approve = "ask" if interactive and fmt == "text" else "none"
    if approve == "ask" and (fmt != "text" or from_stdin or not sys.stdin.isatty()
                             or not sys.stderr.isatty()):
        # The question goes to stderr and the answer comes from stdin: off a terminal
        # nobody may see it, and the run would wait out its --timeout for nothing.
        raise ConfigError("--approve ask needs a terminal on stdin and stderr, the prompt "
                          "not from stdin, and --format text", field="--approve",
                          hint="off a terminal, choose the answer: --approve none, reads, "
                               "all or fail")
    events: Any
    if fmt == "json":
        events = JsonEvents(out)
    elif fmt == "quiet":
        events = QuietEvents(out)
    elif out.isatty():
        from rich.console import Console

        from conductor.editor.live import RichEvents

        events = RichEvents(Console(file=out))
    else:
        events = PlainEvents(out)
    turn = TurnOptions(prompts=prompts, cwd=Path(cwd), session_id=session_id,
                       approve=approve, allow_write=allow_write, allow_terminal=allow_terminal,
                       timeout=timeout, cancel_grace=cancel_grace,
                       max_frame_bytes=options.max_frame_bytes)
    with options.trace_sink(config) as tracer:
        turn.tracer = tracer
        try:
            code = loop.run(run_flushed, tracer, run_turns, config, turn, events)
        finally:
            live = getattr(events, "live", None)
            if live is not None:
                live.stop()
            flush(out)
    sys.exit(code)
