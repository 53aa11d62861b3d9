"""The `acp-conductor` command: serving an editor (the default, `agent`, `proxy`), and the
other subcommands, each loaded only when it is the one asked for (start-up stays light).

Nothing but JSON-RPC ever goes to stdout while serving.
"""

from __future__ import annotations

import importlib
import sys

import click

from conductor.cli.context import global_options, globals_of, handle_errors
from conductor.cli.exits import epilog
from conductor.cli.serving import serve
from conductor.errors import ExitCode

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

    def resolve_command(self, ctx: click.Context, args: list[str]
                        ) -> tuple[str | None, click.Command | None, list[str]]:
        ctx.meta["conductor.argv"] = list(args)  # the command's words, for invoke's hint
        return super().resolve_command(ctx, args)

    def invoke(self, ctx: click.Context) -> object:
        try:
            return super().invoke(ctx)
        except click.UsageError as e:
            # `check mine.toml`: "unexpected extra argument (mine.toml)" says nothing of
            # --chain, where a chain file goes.
            words = ctx.meta.get("conductor.argv") or []
            chain = next((w for w in words[1:] if w.endswith(".toml")), None)
            if chain is not None and "unexpected extra argument" in e.message \
                    and not any(w.startswith("--chain") for w in words):
                raise click.UsageError(f"{e.message} (a chain file goes after --chain: "
                                       f"acp-conductor {words[0]} --chain {chain} ...)",
                                       ctx=e.ctx) from None
            raise

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        ref = LAZY_COMMANDS.get(cmd_name)
        if ref is None:
            return super().get_command(ctx, cmd_name)
        module, _, attr = ref.partition(":")
        command = getattr(importlib.import_module(module), attr)
        assert isinstance(command, click.Command)
        return command


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
    its name) go to stderr or --log-file. Global options may also follow agent, call,
    check, doctor, proxy, run, serve and serve-proxy.
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
    serve(read_chain(chain_file), globals_of(ctx), "agent")


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
    serve(chain_from_commands(list(commands), with_agent=True), globals_of(ctx), "agent")


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
    serve(config, globals_of(ctx), "proxy")


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
