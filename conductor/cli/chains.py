"""`acp-conductor chains`: the built-in chains, usable by name (`--chain demo`)."""

from __future__ import annotations

from typing import TYPE_CHECKING

import click

from conductor.cli.context import handle_errors
from conductor.errors import ConfigError

if TYPE_CHECKING:
    from pathlib import Path

    from click.shell_completion import CompletionItem


def description(path: Path) -> str:
    """A chain file's first comment line, without its leading `name:`."""
    for line in path.read_text(encoding="utf-8").splitlines():
        if line.startswith("#"):
            text = line.lstrip("# ").strip()
            head, sep, rest = text.partition(": ")
            return rest if sep and head == path.stem else text
    return ""


def _complete_name(ctx: click.Context, param: click.Parameter,
                   incomplete: str) -> list[CompletionItem]:
    """Built-in chain names only: NAME is never a file."""
    from click.shell_completion import CompletionItem

    from conductor.config import builtin_chains

    return [CompletionItem(n) for n in builtin_chains() if n.startswith(incomplete)]


@click.command("chains")
@click.argument("name", required=False, shell_complete=_complete_name)
@handle_errors
def chains_command(name: str | None) -> None:
    """List the built-in chains, or print the one called NAME (to start your own from it).

    \b
    acp-conductor run --chain demo "hello"       # a built-in chain, by name
    acp-conductor chains permissions > my.toml   # a copy to edit
    """
    from conductor.config import BUILTIN_CHAINS, builtin_chains

    found = builtin_chains()
    if name is not None:
        # Only a built-in name: a file or folder of that name here is not what NAME means.
        if name not in found:
            raise ConfigError(f"no built-in chain {name!r} (built in: {', '.join(found)})",
                              field="NAME", hint="`acp-conductor chains` lists them")
        click.echo(found[name].read_text(encoding="utf-8"), nl=False)
        return
    width = max(map(len, found), default=0)
    for chain, path in found.items():
        click.echo(f"{chain:<{width}}  {description(path)}")
    click.echo(f"\nUse one with --chain NAME; the files are in {BUILTIN_CHAINS}")
