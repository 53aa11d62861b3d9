"""`acp-conductor serve`: the chain over the network, one chain per client connection
(WebSocket and Streamable HTTP on `/acp`; docs/remote.md)."""

from __future__ import annotations

import os
import secrets
import stat
import sys
from pathlib import Path

import click

from conductor.cli.context import global_options, globals_of, handle_errors
from conductor.errors import ConfigError

DEFAULT_PORT = 8765


def parse_listen(value: str) -> tuple[str, int]:
    """HOST:PORT, [V6]:PORT, or a bare PORT (on 127.0.0.1).

    Raises:
        ConfigError: it is none of those.
    """
    host, sep, port = value.rpartition(":")
    if not sep:
        host, port = "127.0.0.1", value
    host = host.strip("[]") or "127.0.0.1"
    try:
        number = int(port)
    except ValueError:
        number = -1
    if not 0 <= number <= 65535:
        raise ConfigError(f"{value!r} is not HOST:PORT", field="--listen",
                          hint="e.g. 127.0.0.1:8765 (port 0: any free port)")
    return host, number


def read_tokens(token_file: str | None, token_env: str, no_token: bool) -> tuple[str, ...]:
    """The tokens clients may present: a file (one per line), else the variable, else none
    (the caller generates one).

    Raises:
        ConfigError: the file is readable by others, unreadable, or empty.
    """
    from conductor.listen import check_token

    if no_token:
        if token_file:
            raise ConfigError("--no-token and --token-file contradict each other",
                              field="--no-token")
        return ()
    if token_file:
        path = Path(token_file)
        try:
            mode = path.stat().st_mode
            text = path.read_text(encoding="utf-8-sig")  # a BOM (Windows editors) is no token
        except OSError as e:
            raise ConfigError(f"cannot read: {e.strerror}", file=token_file) from None
        except UnicodeDecodeError as e:  # say where, not a traceback
            line = e.object[:e.start].count(b"\n") + 1
            raise ConfigError(f"not UTF-8: byte 0x{e.object[e.start]:02x} on line {line}",
                              file=token_file,
                              hint="save it as UTF-8; a token is printable ASCII") from None
        if mode & (stat.S_IRWXG | stat.S_IRWXO):
            raise ConfigError("a token file must be readable by its owner only",
                              file=token_file, hint=f"chmod 600 {token_file}")
        lines = [(number, line.strip()) for number, line in enumerate(text.splitlines(), 1)
                 if line.strip() and not line.lstrip().startswith("#")]
        if not lines:
            raise ConfigError("no token in the file (one per line)", file=token_file)
        for number, token in lines:  # checked here, where the line is known
            check_token(token, field=f"line {number}", file=token_file)
        return tuple(token for _, token in lines)
    value = os.environ.get(token_env, "").strip()
    if value:
        check_token(value, field=f"${token_env}")
    return (value,) if value else ()


@click.command("serve")
@click.option("--listen", default=f"127.0.0.1:{DEFAULT_PORT}", show_default=True,
              help="HOST:PORT to listen on (port 0: any free port). Anything but loopback "
                   "needs --tls-cert/--tls-key.")
@click.option("--token-file", type=click.Path(dir_okay=False),
              help="Accepted bearer tokens, one per line (mode 0600). A connection stays "
                   "bound to the token that opened it.")
@click.option("--token-env", default="ACP_CONDUCTOR_TOKEN", show_default=True,
              help="Take the token from this variable when it is set. With neither, a token "
                   "is generated and printed on stderr.")
@click.option("--no-token", is_flag=True,
              help="No authentication (loopback only; any local process may connect).")
@click.option("--tls-cert", type=click.Path(dir_okay=False, exists=True),
              help="Certificate chain (PEM) to serve https/wss; HTTP/2 is offered by ALPN.")
@click.option("--tls-key", type=click.Path(dir_okay=False, exists=True),
              help="The certificate's private key (PEM).")
@click.option("--allow-origin", multiple=True, metavar="ORIGIN",
              help="A browser origin allowed to connect, e.g. http://localhost:5173 "
                   "(repeatable). Requests from any other origin are refused.")
@click.option("--max-connections", type=click.IntRange(min=1), default=16, show_default=True,
              help="Connections (each its own chain) open at once.")
@click.option("--idle-timeout", type=click.FloatRange(min=1), default=900.0, show_default=True,
              help="Seconds without a message, and no request open, before a connection "
                   "is closed.")
@click.option("--as-proxy", is_flag=True,
              help="Serve the chain as one proxy (a chain file without [agent]): what "
                   "another conductor reaches with [[proxy]] url = ...")
@global_options
@click.pass_context
@handle_errors
def serve_command(ctx: click.Context, listen: str, token_file: str | None, token_env: str,
                  no_token: bool, tls_cert: str | None, tls_key: str | None,
                  allow_origin: tuple[str, ...], max_connections: int, idle_timeout: float,
                  as_proxy: bool) -> None:
    """Serve the chain to clients over the network: WebSocket and Streamable HTTP on /acp.

    \b
    acp-conductor serve --chain chain.toml                       # 127.0.0.1:8765, a new token
    ACP_CONDUCTOR_TOKEN=... acp-conductor serve --chain c.toml --listen 0.0.0.0:8765 \\
        --tls-cert cert.pem --tls-key key.pem

    Every connection gets its own chain: its components start with it and stop with it.
    """
    import functools

    from conductor.cli import loop
    from conductor.listen import ListenSettings, serve_listener
    from conductor.plan import read_chain

    options = globals_of(ctx)
    config = read_chain(options.chain())
    host, port = parse_listen(listen)
    tokens = read_tokens(token_file, token_env, no_token)
    generated = not tokens and not no_token
    if generated:
        tokens = (secrets.token_urlsafe(32),)
    settings = ListenSettings(
        host=host, port=port, tokens=tokens, origins=frozenset(allow_origin),
        max_connections=max_connections, idle_timeout=idle_timeout, certfile=tls_cert,
        keyfile=tls_key, mode="proxy" if as_proxy else "agent",
        max_frame_bytes=options.max_frame_bytes, trace=options.trace,
        trace_unredacted=options.trace_unredacted)

    def ready(urls: tuple[str, str]) -> None:
        click.echo(f"acp-conductor: serving {options.chain()} at {urls[0]} (WebSocket) and "
                   f"{urls[1]} (Streamable HTTP)", err=True)
        if generated:
            click.echo(f"acp-conductor: token (send `Authorization: Bearer TOKEN`): "
                       f"{tokens[0]}", err=True)
        elif not tokens:
            click.echo("acp-conductor: warning: no token: any local process may connect",
                       err=True)

    code = loop.run(functools.partial(serve_listener, config, settings, ready=ready))
    sys.exit(code)
