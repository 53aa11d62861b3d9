"""`serve-proxy` and `proxies`: plugin proxies on the command line."""

from __future__ import annotations

import json
from typing import Any

import click

from conductor.cli import handle_errors, main


def _options(text: str | None) -> dict[str, Any] | None:
    if text is None:
        return None
    try:
        value = json.loads(text)
    except json.JSONDecodeError as e:
        raise click.BadParameter(f"not JSON: {e}", param_hint="--options") from None
    if not isinstance(value, dict):
        raise click.BadParameter("give a JSON object", param_hint="--options")
    return value


@main.command("serve-proxy")
@click.argument("plugin", metavar="NAME_OR_PATH")
@click.option("--options", "options_json", metavar="JSON",
              help='The proxy\'s options as a JSON object, e.g. \'{"patterns": ["sk-\\\\w+"]}\'.')
@click.option("--name", help="The name the proxy uses in logs and errors.")
@click.pass_context
@handle_errors
def serve_proxy(ctx: click.Context, plugin: str, options_json: str | None,
                name: str | None) -> None:
    """Run a plugin proxy as a stand-alone stdio proxy program.

    NAME_OR_PATH is an installed proxy (see `acp-conductor proxies`), package.module:Class,
    or path/to/file.py[:Class]. It speaks `_proxy/initialize` / `_proxy/successor`, so it
    works under any conductor, including the Rust one.
    """
    from conductor.plugins.host import run_stdio
    from conductor.plugins.registry import load_proxy

    options = _options(options_json)
    run_stdio(lambda: load_proxy(plugin, options, name=name, file="--options", where=""),
              max_frame_bytes=ctx.obj.get("max_frame_bytes"))


@main.command("proxies")
@handle_errors
def list_proxies() -> None:
    """List the installed plugin proxies (entry-point group acp_conductor.proxies)."""
    from conductor.plugins.registry import installed

    found = installed()
    if not found:
        click.echo("no plugin proxies installed")
        return
    width = max(len(p.name) for p in found)
    for p in found:
        click.echo(f"{p.name:<{width}}  {p.description()}  [{p.value}]")
