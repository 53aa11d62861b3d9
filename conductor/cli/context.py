"""What every command shares: the global options, error reporting, and the chain file.

Global options (`--chain`, `--log-level`, `--trace`, ...) are accepted before the
subcommand and after it alike (`acp-conductor --trace t.jsonl run ...` and
`acp-conductor run --trace t.jsonl ...`); a value given after the subcommand wins.
"""

from __future__ import annotations

import functools
import logging
import sys
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeVar, cast

import click

from conductor.errors import ConductorError, ConfigError, ExitCode

if TYPE_CHECKING:
    from contextlib import AbstractContextManager

    from click.shell_completion import CompletionItem

    from conductor.config import ChainConfig
    from conductor.tracing.sink import JsonlTraceSink

log = logging.getLogger("acp_conductor")
F = TypeVar("F", bound=Callable[..., Any])
LEVELS = ("debug", "info", "warning", "error")


@dataclass
class Globals:
    """The global options as finally given (group and subcommand merged)."""

    chain_file: str | None = None
    log_level: str = "warning"
    log_file: str | None = None
    max_frame_bytes: int | None = None
    trace: str | None = None
    trace_unredacted: bool = False

    def chain(self) -> str:
        """The chain file to use.

        Raises:
            ConfigError: none was given.
        """
        if not self.chain_file:
            raise ConfigError("give --chain FILE", field="--chain")
        return self.chain_file

    def trace_sink(self, config: ChainConfig | None
                   ) -> AbstractContextManager[JsonlTraceSink | None]:
        """The `--trace` file for a run of `config`'s chain (None without --trace), hiding
        its secrets unless --trace-unredacted."""
        from conductor.config import trace_redactor
        from conductor.tracing.sink import open_trace_sink

        return open_trace_sink(self.trace,
                               trace_redactor(config, unredacted=self.trace_unredacted))


def _record(field: str) -> Callable[[click.Context, click.Parameter, Any], None]:
    def callback(ctx: click.Context, param: click.Parameter, value: Any) -> None:
        if value is None or value is False:
            return  # not given here: the group's value (or the default) stands
        ctx.ensure_object(Globals)
        setattr(ctx.find_object(Globals), field, value)
    return callback


def _complete_chain(ctx: click.Context, param: click.Parameter,
                    incomplete: str) -> list[CompletionItem]:
    """Built-in chain names, then files (the shell completes those itself)."""
    from click.shell_completion import CompletionItem

    from conductor.config import builtin_chains

    names = [CompletionItem(n, help="built-in chain") for n in builtin_chains()
             if n.startswith(incomplete)]
    return [*names, CompletionItem(incomplete, type="file")]


def global_options(func: F) -> F:
    """Add the global options to a command (the group or any subcommand)."""
    options = [
        click.option("--chain", "chain_file", type=click.Path(dir_okay=False),
                     expose_value=False, callback=_record("chain_file"),
                     shell_complete=_complete_chain,
                     help="Chain file (TOML), or a built-in chain's name (demo, ...)."),
        click.option("--log-level", type=click.Choice(LEVELS), expose_value=False,
                     callback=_record("log_level"),
                     help="How much the conductor itself says on stderr [default: warning]."),
        click.option("--log-file", type=click.Path(dir_okay=False), expose_value=False,
                     callback=_record("log_file"),
                     help="Write logs and component stderr here instead of stderr."),
        click.option("--max-frame-bytes", type=click.IntRange(min=1024), expose_value=False,
                     callback=_record("max_frame_bytes"),
                     help="Largest JSON-RPC message accepted on any hop [default: 64 MiB]."),
        click.option("--trace", "trace", type=click.Path(dir_okay=False), expose_value=False,
                     callback=_record("trace"),
                     help="Write every message on every hop, and component lifecycle, to "
                          "this JSONL file (created 0600; see docs/tracing.md)."),
        click.option("--trace-unredacted", is_flag=True, default=None, expose_value=False,
                     callback=_record("trace_unredacted"),
                     help="Do not redact secrets (secret_env values, patterns, "
                          "Authorization) in the trace."),
    ]
    for option in reversed(options):
        func = option(func)
    return func


def globals_of(ctx: click.Context) -> Globals:
    ctx.ensure_object(Globals)
    return ctx.find_object(Globals) or Globals()


def handle_errors(func: F) -> F:
    """Logging as the options say, then: our errors as a one-line message and an exit
    code, never a traceback. Usage errors stay click's (exit 2, with the usage line)."""
    @functools.wraps(func)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        from conductor.cli.logs import configure_logging

        ctx = click.get_current_context(silent=True)
        if ctx is not None:
            options = globals_of(ctx)
            try:
                configure_logging(options.log_level, options.log_file)
            except ConductorError as e:
                _fail(e)
        try:
            return func(*args, **kwargs)
        except ConductorError as e:
            _fail(e)
        except click.exceptions.Exit:
            raise
        except click.ClickException:
            raise  # bad usage: click prints it with the usage line, exit 2
        except KeyboardInterrupt:
            sys.exit(ExitCode.SIGINT)
        except Exception as e:  # the last line of defence: a message, not a traceback
            log.debug("internal error", exc_info=True)
            click.echo(f"acp-conductor: internal error: {type(e).__name__}: {e} "
                       "(run with --log-level debug for details)", err=True)
            sys.exit(ExitCode.FAILED)
    return cast("F", wrapper)  # functools.wraps keeps the signature


def _fail(error: ConductorError) -> None:
    click.echo(f"acp-conductor: error: {error}", err=True)
    sys.exit(type(error).exit_code)
