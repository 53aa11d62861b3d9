"""Command line: parse, run, map errors to exit codes. Nothing but JSON-RPC on stdout."""

from __future__ import annotations

import functools
import logging
import sys
from collections.abc import Callable
from typing import Any, TypeVar

import anyio
import click

from conductor.config import ChainConfig, chain_from_commands, load_chain
from conductor.errors import ConductorError
from conductor.logs import LEVELS, configure_logging
from conductor.serve import RunOptions, serve_chain
from conductor.tracing.sink import open_trace_sink, run_flushed
from conductor.transport.stdio import stdio_streams

log = logging.getLogger("acp_conductor")
F = TypeVar("F", bound=Callable[..., Any])

EPILOG = """\b
Exit codes:
  0   the client closed the connection and the chain shut down cleanly
  1   the run finished but failed (see `run --help`), or an internal error
  2   bad configuration or usage (the message names the file and field)
  3   a component failed to start or exited while the chain was running
  130/143  stopped by SIGINT/SIGTERM after a graceful shutdown
"""


def _fail(error: ConductorError) -> None:
    click.echo(f"acp-conductor: error: {error}", err=True)
    sys.exit(type(error).exit_code)


def handle_errors(func: F) -> F:
    """Turn our errors into a one-line message and an exit code; never a traceback."""
    @functools.wraps(func)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return func(*args, **kwargs)
        except ConductorError as e:
            _fail(e)
        except KeyboardInterrupt:
            sys.exit(130)
        except Exception as e:  # the last line of defence: a message, not a traceback
            log.debug("internal error", exc_info=True)
            click.echo(f"acp-conductor: internal error: {type(e).__name__}: {e} "
                       "(run with --log-level debug for details)", err=True)
            sys.exit(1)
    return wrapper  # type: ignore[return-value]


def serve(config: ChainConfig, ctx: click.Context, mode: str) -> None:
    obj = ctx.obj
    stdin, stdout = stdio_streams()
    with open_trace_sink(obj["trace"], config, unredacted=obj["trace_unredacted"]) as tracer:
        options = RunOptions(mode=mode, max_frame_bytes=obj["max_frame_bytes"], tracer=tracer)
        code = anyio.run(run_flushed, tracer, serve_chain, config, stdin, stdout, options)
    sys.exit(code)


@click.group(invoke_without_command=True, epilog=EPILOG,
             context_settings={"help_option_names": ["-h", "--help"]})
@click.option("--chain", "chain_file", type=click.Path(dir_okay=False),
              help="Chain file (TOML) to serve as one agent on stdin/stdout.")
@click.option("--log-level", type=click.Choice(LEVELS), default="warning", show_default=True,
              help="How much the conductor itself says on stderr.")
@click.option("--log-file", type=click.Path(dir_okay=False),
              help="Write logs and component stderr here instead of stderr.")
@click.option("--max-frame-bytes", type=click.IntRange(min=1024),
              help="Largest JSON-RPC message accepted on any hop [default: 64 MiB].")
@click.option("--trace", "trace_file", type=click.Path(dir_okay=False),
              help="Write every message on every hop, and component lifecycle, to this JSONL "
                   "file (created 0600; see docs/tracing.md).")
@click.option("--trace-unredacted", is_flag=True,
              help="Do not redact secrets (secret_env values, patterns, Authorization) "
                   "in the trace.")
@click.version_option(package_name="acp-conductor")
@click.pass_context
@handle_errors
def main(ctx: click.Context, chain_file: str | None, log_level: str, log_file: str | None,
         max_frame_bytes: int | None, trace_file: str | None, trace_unredacted: bool) -> None:
    """Run a chain of ACP proxies and an agent that an editor sees as one agent.

    \b
    Point your editor at:   acp-conductor --chain chain.toml
    Without a chain file:   acp-conductor agent "python my_proxy.py" "npx some-acp-agent"
    Try it in a terminal:   acp-conductor run --chain chains/demo.toml "hello"

    stdout carries JSON-RPC only; logs and each component's stderr (prefixed with
    its name) go to stderr or --log-file.
    """
    configure_logging(log_level, log_file)
    ctx.ensure_object(dict)
    ctx.obj.update(chain_file=chain_file, max_frame_bytes=max_frame_bytes, log_level=log_level,
                   trace=trace_file, trace_unredacted=trace_unredacted)
    if ctx.invoked_subcommand is not None:
        return
    if chain_file is None:
        click.echo(ctx.get_help(), err=True)
        click.echo("\nacp-conductor: error: give --chain FILE, or a command such as `agent`",
                   err=True)
        sys.exit(2)
    serve(load_chain(chain_file), ctx, "agent")


@main.command(context_settings={"ignore_unknown_options": True})
@click.argument("commands", nargs=-1, required=True)
@click.pass_context
@handle_errors
def agent(ctx: click.Context, commands: tuple[str, ...]) -> None:
    """Serve COMMANDS as a chain: every one a proxy, the last one the agent.

    Quote each command: acp-conductor agent "python proxy.py" "npx my-agent --flag"
    """
    serve(chain_from_commands(list(commands), with_agent=True), ctx, "agent")


@main.command(context_settings={"ignore_unknown_options": True})
@click.argument("commands", nargs=-1)
@click.pass_context
@handle_errors
def proxy(ctx: click.Context, commands: tuple[str, ...]) -> None:
    """Act as one proxy made of a chain of proxies (chains nest).

    Give proxy COMMANDS, or the global --chain with a file that has no [agent].
    """
    chain_file = ctx.obj["chain_file"]
    if chain_file and commands:
        raise click.UsageError("give either --chain or COMMANDS, not both")
    if chain_file:
        config = load_chain(chain_file)
    elif commands:
        config = chain_from_commands(list(commands), with_agent=False)
    else:
        raise click.UsageError("give proxy COMMANDS or --chain FILE")
    serve(config, ctx, "proxy")


@main.command("demo-agent")
@click.option("--protocol-version", type=int, default=None,
              help="Answer initialize with this version instead of the client's.")
@handle_errors
def demo_agent(protocol_version: int | None) -> None:
    """The built-in deterministic demo agent (speaks ACP on stdin/stdout)."""
    from conductor.demo_agent import serve_stdio

    serve_stdio(protocol_version=protocol_version)


def register(command: click.Command) -> None:
    main.add_command(command)


# Later modules add commands here (run, check, trace, proxies, serve-proxy). These imports
# stay at the bottom: the modules register their subcommands on `main`, defined above.
from conductor import cli_plugins as _cli_plugins  # noqa: E402, F401
from conductor import cli_run as _cli_run  # noqa: E402, F401
