"""`acp-conductor call`: send one request through a chain and print the answer as JSON."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import click

from conductor.cli import loop
from conductor.cli.context import global_options, globals_of, handle_errors
from conductor.cli.exits import epilog
from conductor.cli.logs import leave_to_the_client
from conductor.cli.run import claim_stdout, flush
from conductor.editor.call import CallExit, CallOptions, call_chain
from conductor.errors import ConfigError
from conductor.plan import read_chain
from conductor.tracing.sink import run_flushed


def _not_json(name: str) -> None:
    raise ValueError(f"{name} is not a JSON value")


@click.command("call", epilog=epilog("Exit codes of call", CallExit))
@click.argument("method")
@click.argument("params", required=False)
@click.option("--session", "open_session", is_flag=True,
              help="Open a session first (session/new in --cwd) and add its id to PARAMS "
                   "as sessionId.")
@click.option("--cwd", type=click.Path(file_okay=False, exists=True), default=".",
              show_default=True, help="The session's working directory (with --session).")
@click.option("--notify", is_flag=True, help="Send a notification: no answer, nothing printed.")
@click.option("--timeout", type=click.FloatRange(min=0, min_open=True), default=30.0,
              show_default=True, help="How long setup and the answer may take.")
@click.option("--notifications", "show_notifications", is_flag=True,
              help="Print each notification the chain sends meanwhile on stderr, as JSON.")
@global_options
@click.pass_context
@handle_errors
def call_command(ctx: click.Context, method: str, params: str | None, open_session: bool,
                 cwd: str, notify: bool, timeout: float, show_notifications: bool) -> None:
    """Send METHOD with PARAMS (JSON; - reads stdin; default none) through the chain and
    print the answer: the result, or the error object, as JSON on stdout.

    \b
    acp-conductor call --chain chain.toml _ext/shout/count '{}'
    acp-conductor call --chain chain.toml _ext/index/search '{"q": "parser"}' --session
    """
    out = claim_stdout(ctx)
    options = globals_of(ctx)
    leave_to_the_client(options.log_level)
    config = read_chain(options.chain())
    text = sys.stdin.read() if params == "-" else params
    try:
        value = None if text is None else json.loads(text, parse_constant=_not_json)
    except ValueError as e:  # JSONDecodeError, or NaN/Infinity (would go out as null)
        raise ConfigError(f"PARAMS is not JSON: {e}", field="PARAMS",
                          hint="quote it for the shell: '{\"x\": 1}'") from None
    except RecursionError:
        raise ConfigError("PARAMS is nested too deeply to send", field="PARAMS") from None
    # A lone surrogate (a "\ud800" escape, or a non-UTF-8 byte in argv) cannot go out
    # as UTF-8: refused here, not as an internal error from the encoder mid-call.
    for field, given in (("METHOD", method), ("PARAMS", value)):
        try:
            json.dumps(given, ensure_ascii=False).encode("utf-8")
        except UnicodeEncodeError:
            raise ConfigError(f"{field} is not UTF-8 (it has a lone surrogate)",
                              field=field) from None
        except RecursionError:
            raise ConfigError(f"{field} is nested too deeply to send", field=field) from None
    if not isinstance(value, dict | list | None):
        # JSON-RPC params are structured: the conductor would drop a scalar as invalid,
        # and a notification so dropped would still exit 0.
        raise ConfigError("PARAMS must be a JSON object or array (JSON-RPC), or left out",
                          field="PARAMS", hint="wrap it: '{\"value\": 5}'")
    if open_session and not (value is None or isinstance(value, dict)):
        raise ConfigError("with --session, PARAMS must be a JSON object (sessionId is added "
                          "to it)", field="PARAMS")

    def notified(name: str, value: object) -> None:
        click.echo(json.dumps({"method": name, "params": value}), err=True)

    call = CallOptions(method=method, params=value, notify=notify, session=open_session,
                       cwd=Path(cwd), timeout=timeout, max_frame_bytes=options.max_frame_bytes,
                       on_notification=notified if show_notifications else None)
    with options.trace_sink(config) as tracer:
        call.tracer = tracer
        outcome = loop.run(run_flushed, tracer, call_chain, config, call)
    if outcome.answer is not None:
        shown = outcome.answer.error_value() if outcome.answer.is_error \
            else outcome.answer.result_value()
        pretty = out.isatty()
        out.write(json.dumps(shown, indent=2 if pretty else None, ensure_ascii=False) + "\n")
        if outcome.answer.is_error:
            click.echo(f"acp-conductor: {method} was answered with an error", err=True)
    elif outcome.reason:
        click.echo(f"acp-conductor: call failed: {outcome.reason}", err=True)
    flush(out)
    sys.exit(outcome.code)
