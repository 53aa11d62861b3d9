"""What every command shares: the global options, error reporting, and the chain file.

Global options (`--chain`, `--log-level`, `--trace`, ...) are accepted before the
subcommand and after it alike (`acp-conductor --trace t.jsonl run ...` and
`acp-conductor run --trace t.jsonl ...`); a value given after the subcommand wins.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, TypeVar, cast

import click

from conductor.cli.guard import LEVELS, Globals, errors_reported

if TYPE_CHECKING:
    from click.shell_completion import CompletionItem

F = TypeVar("F", bound=Callable[..., Any])


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
        # A plain string: `--chain demo` names the built-in chain even beside a demo/
        # folder, and a folder given as the file is the chain's config error (load_chain).
        click.option("--chain", "chain_file", type=click.Path(),
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
    code, never a traceback (`guard.errors_reported`). Usage errors stay click's (exit 2,
    with the usage line)."""
    @functools.wraps(func)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        ctx = click.get_current_context(silent=True)
        options = globals_of(ctx) if ctx is not None else None
        with errors_reported(options, passthrough=(click.exceptions.Exit,
                                                   click.ClickException)):
            return func(*args, **kwargs)
    return cast("F", wrapper)  # functools.wraps keeps the signature
