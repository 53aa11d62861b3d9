"""`acp-conductor check`: start a chain, initialize it, show each component, stop it."""

from __future__ import annotations

import functools
import os
import sys
from typing import TYPE_CHECKING, Any, TextIO

import click
import msgspec

from conductor.cli import loop
from conductor.cli.context import global_options, globals_of, handle_errors
from conductor.cli.logs import leave_to_the_client
from conductor.cli.run import claim_stdout, flush
from conductor.editor.check import CheckReport, ComponentReport, check_chain
from conductor.plan import read_chain
from conductor.terminal_text import shown
from conductor.tracing.sink import run_flushed

if TYPE_CHECKING:
    from rich.table import Table


def _short_command(argv: list[str]) -> str:
    """The command as a person reads it: the program's name, not its full path (the full
    argv is in --json)."""
    if not argv:
        return "-"
    if argv[0].startswith("(in-process)"):
        return "in-process " + argv[0].split()[-1].rsplit(":", 1)[-1]
    return " ".join([os.path.basename(argv[0]), *argv[1:]])


def _capabilities_text(caps: dict[str, Any]) -> str:
    """v1: `loadSession`, `promptCapabilities` booleans, `sessionCapabilities`; v2: object
    markers under `session` (its `prompt` ones are the prompt's, `mcp` is shown apart)."""
    parts = []
    if caps.get("loadSession"):
        parts.append("loadSession")
    session = caps.get("sessionCapabilities") or caps.get("session")
    v2 = "session" in caps and isinstance(session, dict)
    prompt = session.get("prompt") if v2 and isinstance(session, dict) \
        else caps.get("promptCapabilities")
    if isinstance(prompt, dict):
        kinds = [k for k, v in prompt.items()
                 if (isinstance(v, dict) if v2 else v is True) and not k.startswith("_")]
        if kinds:
            parts.append("prompt: " + ",".join(kinds))
    if isinstance(session, dict):
        keys = [k for k, v in session.items() if v is not None and k != "mcp"
                and not (v2 and k == "prompt")]
        if keys:
            parts.append("session: " + ",".join(keys))
    return "\n".join(parts) or "-"


def _cells(c: ComponentReport) -> dict[str, str]:
    s = c.summary()
    role = f"{s['role']} (bypassed: {s['bypassed']})" if s["bypassed"] else s["role"]
    return {"name": s["name"], "role": role, "command": _short_command(s["command"]),
            "pid": str(s["pid"] or "-"), "protocol": str(s["protocolVersion"] or "-"),
            "capabilities": _capabilities_text(s["capabilities"]),
            "MCP transports": ", ".join(s["mcpTransports"]) if c.result else "-",
            "auth methods": ", ".join(map(str, s["authMethods"])) or "-"}


def _table(report: CheckReport, path: str) -> Table:
    from rich.table import Table  # rich only for a terminal: CI logs get plain lines
    from rich.text import Text

    # Every cell as Text, never markup: commands, the path and what components answered
    # are anybody's text (a `[/]` in them would raise, a `[bold]` would vanish).
    # Shown, never obeyed (conductor/terminal_text.py): an ESC or a direction override in
    # them would reach the terminal.
    table = Table(title=Text(shown(f"{path}: {'ok' if report.ok else 'FAILED'}")))
    for column in ("name", "role", "command", "pid", "protocol", "capabilities",
                   "MCP transports", "auth methods"):
        table.add_column(column, overflow="fold", min_width=len(column) if
                         column in ("name", "role", "pid", "protocol") else None)
    for c in report.components:
        table.add_row(*(Text(shown(cell, text=True)) for cell in _cells(c).values()))
    return table


def _line(c: ComponentReport) -> str:
    """`name: role, command, pid N, protocol N, capabilities, MCP: ..., auth: ...`"""
    cells = _cells(c)
    parts = [cells["role"], cells["command"], f"pid {cells['pid']}",
             f"protocol {cells['protocol']}"]
    if cells["capabilities"] != "-":
        parts.append(cells["capabilities"].replace("\n", "; "))
    parts += [f"MCP: {cells['MCP transports']}", f"auth: {cells['auth methods']}"]
    return shown(f"{cells['name']}: {', '.join(parts)}")


def _show(report: CheckReport, path: str, *, as_json: bool, out: TextIO) -> None:
    if as_json:
        click.echo(msgspec.json.encode({"chain": path, **report.to_json()}).decode(), file=out)
    elif out.isatty():
        from rich.console import Console

        Console(file=out).print(_table(report, path))
    else:  # a CI log or a pipe: one plain line per component, nothing wrapped
        click.echo(f"{path}: {'ok' if report.ok else 'FAILED'}", file=out)
        for c in report.components:
            click.echo(_line(c), file=out)
    if report.mode == "proxy" and not as_json:
        click.echo("(a chain of proxies: checked as a proxy, with a stand-in agent as its "
                   "successor)", file=out)


@click.command("check")
@click.option("--json", "as_json", is_flag=True, help="Print the report as one JSON object.")
@click.option("--timeout", type=click.FloatRange(min=0, min_open=True), default=30.0,
              show_default=True, help="How long initialize may take.")
@global_options
@click.pass_context
@handle_errors
def check_command(ctx: click.Context, as_json: bool, timeout: float) -> None:
    """Validate a chain file, start it, initialize it, show each component, shut it down.

    Each row is what that component answered on its own hop: a table on a terminal, one
    line per component otherwise. A chain with no [agent] is checked as a proxy, with a
    stand-in agent as its successor. Exits 0 when the chain initializes; 2 for a bad file;
    3 (with the component's stderr tail) when a component fails; 1 otherwise.
    """
    out = claim_stdout(ctx)
    options = globals_of(ctx)
    leave_to_the_client(options.log_level)
    path = options.chain()
    config = read_chain(path)
    with options.trace_sink(config) as tracer:
        report = loop.run(run_flushed, tracer,
                           functools.partial(check_chain, config, timeout=timeout, tracer=tracer))
    try:
        _show(report, path, as_json=as_json, out=out)
    except BrokenPipeError:
        pass  # the reader went away (`| grep -q ok`): the exit code still says it, as in run
    if not report.ok:
        from rich.console import Console
        from rich.text import Text

        # soft_wrap: off a terminal rich would cut lines at 80 columns, splitting the one
        # line a CI log is grepped for.
        err = Console(stderr=True, soft_wrap=True)
        err.print(Text(shown(f"acp-conductor: check failed: {report.reason}"),
                       style="bold red"))
        if report.failed:
            err.print(Text(f"failing component: {report.failed}"))
        for line in report.stderr_tail:
            err.print(Text(shown(f"  {report.failed}| {line}"), style="dim"))
    flush(out)
    sys.exit(report.exit_code)
