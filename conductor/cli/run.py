"""`acp-conductor run`: the conductor as its own editor, for a terminal or a CI job.

Here stdout is the user's terminal (or their pipe). It is still claimed before any plugin
is loaded: the turn's output goes to a private copy of stdout, and whatever a plugin
prints goes to stderr.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any, TextIO

import anyio
import click
from rich.console import Console

from conductor.cli.context import global_options, globals_of, handle_errors
from conductor.cli.exits import epilog
from conductor.config import load_chain
from conductor.editor.policy import APPROVE_CHOICES
from conductor.editor.turn import RunExit, TurnOptions, run_turn
from conductor.errors import ConfigError
from conductor.tracing.sink import open_trace_sink, run_flushed


def claim_stdout() -> TextIO:
    """Our own stdout, as text; from now on fd 1 and `sys.stdout` are stderr."""
    from conductor.transport.stdio import claim_stdout

    fd = claim_stdout()
    return open(fd, "w", encoding="utf-8", buffering=1 if os.isatty(fd) else -1)


def flush(out: TextIO) -> None:
    try:
        out.flush()
    except BrokenPipeError:
        pass  # the reader went away (`| head`): nothing more to say


@click.command("run", epilog=epilog("Exit codes of run", RunExit))
@click.argument("prompt", required=False)
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
              help="Cancel the turn after this many seconds (exit 124).")
@click.option("--cancel-grace", type=click.FloatRange(min=0), default=10.0, show_default=True,
              help="How long to wait for the agent's answer after session/cancel.")
@click.option("--json", "as_json", is_flag=True,
              help="One JSON event per line on stdout (schema: docs/run.md).")
@global_options
@click.pass_context
@handle_errors
def run_command(ctx: click.Context, prompt: str | None, cwd: str,
                session_id: str | None, approve: str | None, allow_write: bool,
                allow_terminal: bool, timeout: float | None, cancel_grace: float,
                as_json: bool) -> None:
    """Act as the editor: send PROMPT (or stdin with -) through the chain, show the turn.

    \b
    acp-conductor run --chain demo "hello"
    echo "summarise README.md" | acp-conductor run --chain c.toml - --json --approve reads
    """
    from conductor.editor.render import JsonEvents, PlainEvents, RichEvents

    out = claim_stdout()
    options = globals_of(ctx)
    config = load_chain(options.chain())
    if prompt is None:
        raise ConfigError("give a PROMPT, or - to read it from stdin", field="PROMPT")
    from_stdin = prompt == "-"
    if from_stdin:
        prompt = sys.stdin.read()
    if not prompt.strip():
        raise ConfigError("the prompt is empty" + (" (nothing on stdin)" if from_stdin else ""),
                          field="PROMPT", hint="give the agent something to do")
    if approve is None:
        interactive = sys.stdin.isatty() and sys.stderr.isatty() and not from_stdin
        approve = "ask" if interactive and not as_json else "none"
    if approve == "ask" and (as_json or from_stdin or not sys.stdin.isatty()):
        raise ConfigError("--approve ask needs a terminal on stdin (and no --json)",
                          field="--approve")
    events: Any
    if as_json:
        events = JsonEvents(out)
    elif out.isatty():
        events = RichEvents(Console(file=out))
    else:
        events = PlainEvents(out)
    turn = TurnOptions(prompt=prompt, cwd=Path(cwd), session_id=session_id, approve=approve,
                       allow_write=allow_write, allow_terminal=allow_terminal, timeout=timeout,
                       cancel_grace=cancel_grace, max_frame_bytes=options.max_frame_bytes)
    with open_trace_sink(options.trace, config,
                         unredacted=options.trace_unredacted) as tracer:
        turn.tracer = tracer
        try:
            code = anyio.run(run_flushed, tracer, run_turn, config, turn, events)
        finally:
            live = getattr(events, "live", None)
            if live is not None:
                live.stop()
            flush(out)
    sys.exit(code)
