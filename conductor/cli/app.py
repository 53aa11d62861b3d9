"""The `acp-conductor` command: serving an editor (the default, `agent`, `proxy`), and the
other subcommands, each loaded only when it is the one asked for (start-up stays light).

Nothing but JSON-RPC ever goes to stdout while serving.
"""

from __future__ import annotations

import atexit
import importlib
import logging
import os
import shlex
import sys
from typing import TYPE_CHECKING, NoReturn

import click

from conductor.cli.context import global_options, globals_of, handle_errors
from conductor.cli.exits import epilog
from conductor.errors import ExitCode

if TYPE_CHECKING:
    from conductor.config import ChainConfig

# name -> "module:attribute"; imported on first use
LAZY_COMMANDS = {
    "run": "conductor.cli.run:run_command",
    "serve": "conductor.cli.serve:serve_command",
    "check": "conductor.cli.check:check_command",
    "call": "conductor.cli.call:call_command",
    "trace": "conductor.cli.trace:trace_group",
    "serve-proxy": "conductor.cli.plugins:serve_proxy",
    "proxies": "conductor.cli.plugins:list_proxies",
    "chains": "conductor.cli.chains:chains_command",
    "init": "conductor.cli.init:init_command",
    "doctor": "conductor.cli.doctor:doctor_command",
}


class LazyGroup(click.Group):
    """A group whose subcommands are imported only when invoked (or listed in --help)."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted([*super().list_commands(ctx), *LAZY_COMMANDS])

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        ref = LAZY_COMMANDS.get(cmd_name)
        if ref is None:
            return super().get_command(ctx, cmd_name)
        module, _, attr = ref.partition(":")
        command = getattr(importlib.import_module(module), attr)
        assert isinstance(command, click.Command)
        return command


def waiting_hint(mode: str, chain_file: str | None) -> str:
    """What a chain started from a terminal says: it waits for JSON-RPC, not for a prompt."""
    hint = "acp-conductor: waiting for an ACP client to send initialize on stdin"
    if mode == "agent" and chain_file is not None:
        return (f"{hint}; an editor starts this command. To try the chain from a terminal: "
                f'acp-conductor run --chain {shlex.quote(chain_file)} "hello"')
    return f"{hint}; an editor (or a conductor, for a proxy) starts this command"


def serve(config: ChainConfig, ctx: click.Context, mode: str) -> None:
    """Serve the editor on our stdin/stdout with `config`'s chain, then exit."""
    from conductor.early_start import start_early
    from conductor.transport.claim import claim_stdout

    options = globals_of(ctx)
    wire = claim_stdout()  # before any plugin is imported: a print() never reaches the wire
    # Typed into a shell, not started by an editor: say why it is quiet. (stdin may be
    # closed: sys.stdin is then None.)
    if sys.stdin is not None and sys.stdin.isatty():
        click.echo(waiting_hint(mode, options.chain_file), err=True)
    with options.trace_sink(config) as tracer:
        # Before the event loop and the router are imported: when the editor's initialize
        # is already waiting, the components start now and boot while we do.
        early = start_early(config, mode, max_frame_bytes=options.max_frame_bytes)
        try:
            from conductor.cli import loop
            from conductor.serve import RunOptions, serve_chain
            from conductor.tracing.sink import run_flushed
            from conductor.transport.stdio import stdio_streams

            stdin, stdout = stdio_streams(wire, early.unread)
            run = RunOptions(mode=mode, max_frame_bytes=options.max_frame_bytes, tracer=tracer,
                             early=early)
            code = loop.run(run_flushed, tracer, serve_chain, config, stdin, stdout, run)
        finally:
            early.discard()  # started, but the chain stopped before serving them
    exit_now(code)


def exit_now(code: int) -> NoReturn:
    """Exit once everything is written, without tearing the interpreter down.

    The editor waits for our exit; a Python that has imported the serving modules spends
    40-50 ms after its last line (finalising modules, collecting objects) doing nothing
    anyone observes. The wire, the trace and the logs are flushed and closed first, and
    `atexit` handlers (a plugin's included) still run.
    """
    if sys.getprofile() is not None:  # under cProfile (bench --profile): let it write its file
        sys.exit(code)
    atexit._run_exitfuncs()
    logging.shutdown()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass  # a closed or broken stream: nothing left to say on it
    os._exit(code)


@click.group(cls=LazyGroup, invoke_without_command=True,
             epilog=epilog("Exit codes", ExitCode),
             context_settings={"help_option_names": ["-h", "--help"]})
@global_options
@click.version_option(package_name="acp-conductor")
@click.pass_context
@handle_errors
def main(ctx: click.Context) -> None:
    """Run a chain of ACP proxies and an agent that an editor sees as one agent.

    \b
    Point your editor at:   acp-conductor --chain chain.toml
    Without a chain file:   acp-conductor agent "python my_proxy.py" "npx some-acp-agent"
    Try it in a terminal:   acp-conductor run --chain demo "hello"

    stdout carries JSON-RPC only; logs and each component's stderr (prefixed with
    its name) go to stderr or --log-file. Global options may also follow the subcommand.
    """
    if ctx.invoked_subcommand is not None:
        return
    from conductor.plan import read_chain

    chain_file = globals_of(ctx).chain_file
    if chain_file is None:
        click.echo(ctx.get_help(), err=True)
        click.echo("\nacp-conductor: error: give --chain FILE, or a command such as `agent`",
                   err=True)
        sys.exit(ExitCode.USAGE)
    serve(read_chain(chain_file), ctx, "agent")


@main.command(context_settings={"ignore_unknown_options": True})
@click.argument("commands", nargs=-1, required=True)
@global_options
@click.pass_context
@handle_errors
def agent(ctx: click.Context, commands: tuple[str, ...]) -> None:
    """Serve COMMANDS as a chain: every one a proxy, the last one the agent.

    Quote each command: acp-conductor agent "python proxy.py" "npx my-agent --flag"
    """
    from conductor.config import chain_from_commands

    if globals_of(ctx).chain_file:
        raise click.UsageError("give either --chain FILE or agent COMMANDS, not both")
    serve(chain_from_commands(list(commands), with_agent=True), ctx, "agent")


@main.command(context_settings={"ignore_unknown_options": True})
@click.argument("commands", nargs=-1)
@global_options
@click.pass_context
@handle_errors
def proxy(ctx: click.Context, commands: tuple[str, ...]) -> None:
    """Act as one proxy made of a chain of proxies (chains nest).

    Give proxy COMMANDS, or --chain with a file that has no [agent]. With neither, it is a
    transparent proxy: everything passes straight through to its successor.
    """
    from conductor.config import chain_from_commands
    from conductor.plan import read_chain

    chain_file = globals_of(ctx).chain_file
    if chain_file and commands:
        raise click.UsageError("give either --chain or COMMANDS, not both")
    if chain_file:
        config = read_chain(chain_file)
    else:
        config = chain_from_commands(list(commands), with_agent=False)
    serve(config, ctx, "proxy")


@main.command("mcp-shim", hidden=False)
@click.argument("key")
def mcp_shim(key: str) -> None:
    """Relay an agent's MCP stdio to the conductor's bridge (the conductor writes this
    command into the MCP server declarations it gives an agent; docs/mcp.md)."""
    from conductor.bridge.shim import run

    sys.exit(run(key))


@main.command("demo-agent")
@click.option("--protocol-version", type=int, default=None,
              help="Answer initialize with this version instead of the client's.")
@handle_errors
def demo_agent(protocol_version: int | None) -> None:
    """The built-in deterministic demo agent (speaks ACP on stdin/stdout)."""
    from conductor.demo_agent import serve_stdio

    serve_stdio(protocol_version=protocol_version)
