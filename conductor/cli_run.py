"""The user-facing commands: `run`, `check`, `trace show`, `trace html`.

Unlike serving an editor, in these modes stdout is the user's terminal (or their pipe).
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

import anyio
import click
import msgspec
from rich.console import Console
from rich.table import Table
from rich.text import Text

from conductor.cli import handle_errors, main
from conductor.config import load_chain
from conductor.errors import ConfigError
from conductor.headless import APPROVE_CHOICES, HeadlessOptions, RunExit, run_headless
from conductor.tracing import open_trace_sink

RUN_EPILOG = """\b
Exit codes of run:
  0    the turn ended with end_turn
  1    the agent answered the prompt with an error (or an unknown stop reason)
  2    bad chain file or usage; --session-id but the agent cannot reopen sessions
  3    a component failed to start or exited
  5    the agent refused (stopReason refusal)
  6    the agent hit a limit (max_tokens, max_turn_requests)
  7    the turn was cancelled by the agent (stopReason cancelled)
  8    policy violation: --approve fail was hit, or run refused a file/terminal request
  124  --timeout passed (the turn was cancelled with session/cancel)
  130  Ctrl-C (the turn was cancelled with session/cancel)
  143  SIGTERM (as Ctrl-C)
"""


def _chain_file(ctx: click.Context, local: str | None) -> str:
    chain = local or ctx.obj.get("chain_file")
    if not chain:
        raise ConfigError("give --chain FILE", field="--chain")
    return chain


@main.command("run", epilog=RUN_EPILOG)
@click.option("--chain", "chain_file", type=click.Path(dir_okay=False),
              help="Chain file to run (or the global --chain).")
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
@click.pass_context
@handle_errors
def run_command(ctx: click.Context, chain_file: str | None, prompt: str | None, cwd: str,
                session_id: str | None, approve: str | None, allow_write: bool,
                allow_terminal: bool, timeout: float | None, cancel_grace: float,
                as_json: bool) -> None:
    """Act as the editor: send PROMPT (or stdin with -) through the chain, show the turn.

    \b
    acp-conductor run --chain chains/demo.toml "hello"
    echo "summarise README.md" | acp-conductor run --chain c.toml - --json --approve reads
    """
    from conductor.render import JsonEvents, PlainEvents, RichEvents

    config = load_chain(_chain_file(ctx, chain_file))
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
        events = JsonEvents()
    elif sys.stdout.isatty():
        events = RichEvents()
    else:
        events = PlainEvents()
    options = HeadlessOptions(prompt=prompt, cwd=Path(cwd), session_id=session_id,
                              approve=approve, allow_write=allow_write,
                              allow_terminal=allow_terminal, timeout=timeout,
                              cancel_grace=cancel_grace,
                              max_frame_bytes=ctx.obj["max_frame_bytes"])
    with open_trace_sink(ctx.obj["trace"], config,
                         unredacted=ctx.obj["trace_unredacted"]) as tracer:
        options.tracer = tracer
        try:
            code = anyio.run(run_headless, config, options, events)
        finally:
            live = getattr(events, "live", None)
            if live is not None:
                live.stop()
    sys.exit(code)


# -- check --------------------------------------------------------------------------------

def _short_command(argv: list[str]) -> str:
    """The command as a person reads it: the program's name, not its full path (the full
    argv is in --json)."""
    if not argv:
        return "-"
    if argv[0].startswith("(in-process)"):
        return "in-process " + argv[0].split()[-1].rsplit(":", 1)[-1]
    return " ".join([os.path.basename(argv[0]), *argv[1:]])


def _capabilities_text(caps: dict[str, Any]) -> str:
    parts = []
    if caps.get("loadSession"):
        parts.append("loadSession")
    prompt = caps.get("promptCapabilities")
    if isinstance(prompt, dict):
        kinds = [k for k, v in prompt.items() if v is True]
        if kinds:
            parts.append("prompt: " + ",".join(kinds))
    session = caps.get("sessionCapabilities") or caps.get("session")
    if isinstance(session, dict):
        keys = [k for k, v in session.items() if v is not None and k != "mcp"]
        if keys:
            parts.append("session: " + ",".join(keys))
    return "\n".join(parts) or "-"


@main.command("check")
@click.option("--chain", "chain_file", type=click.Path(dir_okay=False),
              help="Chain file to check (or the global --chain).")
@click.option("--json", "as_json", is_flag=True, help="Print the report as one JSON object.")
@click.option("--timeout", type=click.FloatRange(min=0, min_open=True), default=30.0,
              show_default=True, help="How long initialize may take.")
@click.pass_context
@handle_errors
def check_command(ctx: click.Context, chain_file: str | None, as_json: bool,
                  timeout: float) -> None:
    """Validate a chain file, start it, initialize it, show each component, shut it down.

    Each row is what that component answered on its own hop. Exits 0 when the chain
    initializes; 2 for a bad file; 3 (with the component's stderr tail) when a
    component fails; 1 otherwise.
    """
    from conductor.check import check_chain

    path = _chain_file(ctx, chain_file)
    config = load_chain(path)
    with open_trace_sink(ctx.obj["trace"], config,
                         unredacted=ctx.obj["trace_unredacted"]) as tracer:
        report = anyio.run(lambda: check_chain(config, timeout=timeout, tracer=tracer))
    if as_json:
        click.echo(msgspec.json.encode({"chain": path, **report.to_json()}).decode())
    else:
        table = Table(title=f"{path}: {'ok' if report.ok else 'FAILED'}")
        for column in ("name", "role", "command", "pid", "protocol", "capabilities",
                       "MCP transports", "auth methods"):
            table.add_column(column, overflow="fold", min_width=len(column) if
                             column in ("name", "role", "pid", "protocol") else None)
        for c in report.components:
            s = c.summary()
            table.add_row(s["name"], s["role"], _short_command(s["command"]),
                          str(s["pid"] or "-"), str(s["protocolVersion"] or "-"),
                          _capabilities_text(s["capabilities"]),
                          ", ".join(s["mcpTransports"]) if c.result else "-",
                          ", ".join(map(str, s["authMethods"])) or "-")
        Console().print(table)
    if not report.ok:
        err = Console(stderr=True)
        err.print(Text(f"acp-conductor: check failed: {report.reason}", style="bold red"))
        if report.failed:
            err.print(f"failing component: {report.failed}")
        for line in report.stderr_tail:
            err.print(Text(f"  {report.failed}| {line}", style="dim"))
    sys.exit(report.exit_code)


# -- trace --------------------------------------------------------------------------------

@main.group("trace")
def trace_group() -> None:
    """Read a trace written with --trace FILE."""


@trace_group.command("show")
@click.argument("file", type=click.Path(dir_okay=False, exists=True))
@click.option("--session", help="Only messages of this session id.")
@click.option("--method", help="Only messages whose method matches this glob (session/*).")
@click.option("--component", help="Only messages on or to/from this component, and its lifecycle.")
@handle_errors
def trace_show(file: str, session: str | None, method: str | None,
               component: str | None) -> None:
    """A timeline with one lane per component: arrows, pairing, durations, errors in red."""
    from conductor.trace_view import load_trace, render, select

    trace = load_trace(file)
    console = Console(width=max(Console().width, 60 + 14 * len(trace.lanes)))
    render(trace, select(trace, session=session, method=method, component=component), console)


@trace_group.command("html")
@click.argument("file", type=click.Path(dir_okay=False, exists=True))
@click.option("-o", "--output", type=click.Path(dir_okay=False), required=True,
              help="Where to write the page.")
@handle_errors
def trace_html(file: str, output: str) -> None:
    """Write one self-contained HTML page (no network): lanes, arrows, click for JSON."""
    from conductor.trace_html import render_html
    from conductor.trace_view import load_trace

    trace = load_trace(file)
    Path(output).write_text(render_html(trace, f"acp-conductor trace: {os.path.basename(file)}"),
                            encoding="utf-8")
    click.echo(f"wrote {output} ({len(trace.events)} events)", err=True)


__all__ = ["RunExit", "check_command", "run_command", "trace_group"]
