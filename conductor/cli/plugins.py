"""`serve-proxy` and `proxies`: plugin proxies on the command line."""

from __future__ import annotations

import json
import logging
import os
import signal
import sys
from typing import TYPE_CHECKING, Any

import click

from conductor.cli.context import global_options, globals_of, handle_errors

if TYPE_CHECKING:
    from collections.abc import Callable

    from anyio.abc import TaskStatus

    from conductor.plugins.api import Proxy

log = logging.getLogger("acp_conductor.proxy")

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


@click.command("serve-proxy")
@click.argument("plugin", metavar="NAME_OR_PATH")
@click.option("--options", "options_json", metavar="JSON",
              help='The proxy\'s options as a JSON object, e.g. \'{"patterns": ["sk-\\\\w+"]}\'.')
@click.option("--name", help="The name the proxy uses in logs and errors.")
@global_options
@click.pass_context
@handle_errors
def serve_proxy(ctx: click.Context, plugin: str, options_json: str | None,
                name: str | None) -> None:
    """Run a plugin proxy as a stand-alone stdio proxy program.

    NAME_OR_PATH is an installed proxy (see `acp-conductor proxies`), package.module:Class,
    or path/to/file.py[:Class]. It speaks `_proxy/initialize` / `_proxy/successor`, so it
    works under any conductor, including the Rust one.
    """
    from conductor.plugins.registry import load_proxy

    given = globals_of(ctx)
    # Global options, listed in --help with the rest; these two would do nothing here.
    if given.chain_file is not None:
        raise click.UsageError("serve-proxy serves the one proxy NAME_OR_PATH and takes no "
                               "--chain (to serve a chain of proxies as one: "
                               "`acp-conductor proxy --chain FILE`)")
    if given.trace is not None or given.trace_unredacted:
        raise click.UsageError("serve-proxy writes no trace: give --trace to the conductor "
                               "that starts it, whose trace shows this proxy's hop")
    options = _options(options_json)
    run_stdio(lambda: load_proxy(plugin, options, name=name, file="--options", where=""),
              max_frame_bytes=given.max_frame_bytes, named=name is not None)


@click.command("proxies")
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


def run_stdio(load: Callable[[], Proxy[Any]], *, max_frame_bytes: int | None = None,
              named: bool = False) -> None:
    """Serve a plugin on this process's stdin/stdout (the stand-alone form).

    Stdout is claimed before `load` imports any user code, so a stray `print` lands in the
    log instead of corrupting the wire; the wire keeps the real stdout. Unless `named`
    (`--name`), the proxy takes the name the conductor's chain gives it (`PROXY_NAME_ENV`).
    """
    import anyio

    from conductor.cli import loop
    from conductor.cli.logs import ProxyFormatter
    from conductor.plugins.host import serve_proxy
    from conductor.supervise.signals import EXIT_SIGNAL, stop_signals, stopping
    from conductor.transport.claim import claim_stdout
    from conductor.transport.stdio import FdReceiveStream, FdSendStream

    wire_fd = claim_stdout()
    for handler in logging.getLogger("acp_conductor.proxy").handlers:
        handler.setFormatter(ProxyFormatter(prefixed=False))  # the conductor adds our name
    proxy = load()
    _take_chain_name(proxy, named=named)
    _take_requested(proxy)

    async def serve() -> signal.Signals | None:
        # A stop signal (the conductor's TERM after its grace, `kill`) ends it as EOF does:
        # sessions closed, chain_stopped run, instead of dying with the hooks unrun.
        received: list[signal.Signals] = []
        async with anyio.create_task_group() as tg:
            async def watch(*, task_status: TaskStatus[None]) -> None:
                with anyio.open_signal_receiver(*stop_signals()) as signals:
                    task_status.started()
                    async for signum in signals:
                        received.append(signal.Signals(signum))
                        break
                stopping()
                tg.cancel_scope.cancel()
            await tg.start(watch)
            await serve_proxy(proxy, FdReceiveStream(0), FdSendStream(wire_fd),
                              max_frame_bytes=max_frame_bytes)
            tg.cancel_scope.cancel()
        return received[0] if received else None
    stopped_by = loop.run(serve)
    if stopped_by is not None:
        sys.exit(EXIT_SIGNAL[stopped_by])


def _take_chain_name(proxy: Proxy[Any], *, named: bool) -> None:
    """The name the conductor's chain gives this stand-alone proxy (`PROXY_NAME_ENV`), for
    its logs and errors. Taken out of the environment, so that nothing it starts inherits
    it (a nested conductor's own proxies get theirs)."""
    from conductor.config import PROXY_NAME_ENV

    name = os.environ.pop(PROXY_NAME_ENV, "").strip()
    if name and not named:
        proxy.rename(name)


def _take_requested(proxy: Proxy[Any]) -> None:
    """The opt-in MCP servers the conductor's chain file asks this stand-alone proxy for
    (`MCP_REQUESTED_ENV`): its `mcp_requested`, as `ask_providers` sets it in-process. Taken
    out of the environment, so that nothing this proxy starts inherits it."""
    from conductor.config import MCP_REQUESTED_ENV

    text = os.environ.pop(MCP_REQUESTED_ENV, None)
    if not text:
        return
    try:
        names = json.loads(text)
    except json.JSONDecodeError:
        names = None
    if not isinstance(names, list) or not all(isinstance(n, str) for n in names):
        log.warning("%s: %s is not a JSON list of names (ignored): %r", proxy.name,
                    MCP_REQUESTED_ENV, text)
        return
    offered = {o.declared_name for o in proxy.offered_mcp_servers()}
    for name in names:
        if name not in offered:  # the session is then refused if the server is required
            log.warning("%s: the chain asks for an MCP server %r, but this proxy offers "
                        "no server by that name (it offers: %s)", proxy.name, name,
                        ", ".join(sorted(offered)) or "none")
    proxy.mcp_requested = proxy.mcp_requested | {n for n in names if n in offered}
