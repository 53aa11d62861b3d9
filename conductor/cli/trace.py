"""`acp-conductor trace show|html`: read a trace written with --trace FILE."""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

import click
from rich.console import Console

from conductor.cli.context import handle_errors

if TYPE_CHECKING:
    from conductor.tracing.view import Trace


@click.group("trace")
def trace_group() -> None:
    """Read a trace written with --trace FILE."""


def _say_what_is_missing(file: str, trace: Trace) -> None:
    if trace.cut_off is not None:
        click.echo(f"acp-conductor: warning: {file}: line {trace.cut_off} is incomplete (the "
                   "conductor was stopped while writing it, or still is); showing the "
                   f"{len(trace.events)} events before it", err=True)
    dropped = sum(e.get("count") or 0 for e in trace.events
                  if e.get("type") == "lifecycle" and e.get("event") == "trace-dropped"
                  and isinstance(e.get("count"), int))
    if dropped:
        click.echo(f"acp-conductor: warning: {file} misses {dropped} events (its reader fell "
                   "behind): a request whose answer is among them shows as never answered",
                   err=True)


@trace_group.command("show")
@click.argument("file", type=click.Path(dir_okay=False, exists=True))
@click.option("--session", help="Only messages of this session id.")
@click.option("--method", help="Only messages whose method matches this glob (session/*).")
@click.option("--component", help="Only messages on or to/from this component, and its lifecycle.")
@click.option("--pending", is_flag=True,
              help="Only the requests that never got an answer, and where each stopped.")
@handle_errors
def trace_show(file: str, session: str | None, method: str | None,
               component: str | None, pending: bool) -> None:
    """A timeline with one lane per component: arrows, pairing, durations, errors in red.

    With --pending: every request some component never answered (a hang), the way it took
    and who has it.
    """
    from conductor.tracing import view

    trace = view.load_trace(file)
    _say_what_is_missing(file, trace)
    if pending:
        items = view.select_pending(trace, session=session, method=method, component=component)
        view.render_pending(trace, items, Console(soft_wrap=True))
        return
    chosen = view.select(trace, session=session, method=method, component=component)
    console = Console(width=max(Console().width, 60 + 14 * len(trace.lanes)))
    view.render(trace, chosen, console)


@trace_group.command("html")
@click.argument("file", type=click.Path(dir_okay=False, exists=True))
@click.option("-o", "--output", type=click.Path(dir_okay=False), required=True,
              help="Where to write the page (created 0600: it holds every payload).")
@click.option("--shareable", is_flag=True,
              help="Make the page readable by everyone (0644), e.g. to serve or attach it.")
@handle_errors
def trace_html(file: str, output: str, shareable: bool) -> None:
    """Write one self-contained HTML page (no network): lanes, arrows, click for JSON."""
    from conductor.output import PRIVATE, open_output, refuse_overwriting
    from conductor.tracing.html import render_html
    from conductor.tracing.view import load_trace

    refuse_overwriting(output, option="--output", inputs={"the trace it reads": file})
    trace = load_trace(file)
    _say_what_is_missing(file, trace)
    page = render_html(trace, f"acp-conductor trace: {os.path.basename(file)}")
    fd = open_output(output, option="--output", mode=0o644 if shareable else PRIVATE)
    with open(fd, "w", encoding="utf-8") as f:
        f.write(page)
    click.echo(f"wrote {output} ({len(trace.events)} events)", err=True)
    if trace.header.get("redacted") is False:
        click.echo(f"acp-conductor: warning: {file} was written with --trace-unredacted: "
                   f"{output} holds every secret it saw"
                   + (", and --shareable made it readable by everyone" if shareable else ""),
                   err=True)
