"""Composition root for `acp-conductor serve`: a chain for every client that connects over
the network (ACP's WebSocket / Streamable HTTP transport, `conductor.transport.http`).

Each connection gets its own chain (`serve_connection`: components spawned for it, stopped
with it; nothing shared), its own trace file, and an idle timer. The exposure rules are
checked before anything binds: a non-loopback address needs TLS and a token.
"""

from __future__ import annotations

import ipaddress
import logging
import signal
import socket
from pathlib import Path
from typing import TYPE_CHECKING

import anyio
from msgspec import field

from conductor.config import trace_redactor
from conductor.errors import ConfigError
from conductor.jsonrpc.codes import ErrorCode
from conductor.jsonrpc.message import Batch, Request, error_response
from conductor.plan import plan_chain
from conductor.record import Record
from conductor.serve import RunOptions, serve_connection
from conductor.supervise.signals import EXIT_SIGNAL, first_stop_signal
from conductor.tracing.sink import open_trace_sink, refuse_replacing
from conductor.transport.http import PATH, AcpEndpoint, Gate, serve_asgi

if TYPE_CHECKING:
    from collections.abc import Callable

    from conductor.config import ChainConfig
    from conductor.transport.base import Incoming
    from conductor.transport.http import RemoteClient

log = logging.getLogger("acp_conductor.remote")

MIN_TOKEN_CHARS = 16


class ListenSettings(Record):
    host: str = "127.0.0.1"
    port: int = 8765
    tokens: tuple[str, ...] = ()          # empty: no authentication (loopback only)
    origins: frozenset[str] = frozenset()
    max_connections: int = 16
    idle_timeout: float = 900.0
    certfile: str | None = None
    keyfile: str | None = None
    mode: str = "agent"
    max_frame_bytes: int | None = None
    trace: str | None = None              # one file per connection: t.jsonl -> t.1.jsonl, ...
    trace_unredacted: bool = False
    handle_signals: bool = True
    # After every chain ended, how long a socket its client left open may stay. Hypercorn
    # also waits this out for a closed WebSocket's ping task: tests shorten it.
    leftover_sockets: float = 1.0
    stop: anyio.Event = field(default_factory=anyio.Event)  # set it to shut down (tests)

    @property
    def tls(self) -> bool:
        return self.certfile is not None

    def urls(self, port: int) -> tuple[str, str]:
        host = f"[{self.host}]" if ":" in self.host else self.host
        secure = "s" if self.tls else ""
        return f"ws{secure}://{host}:{port}{PATH}", f"http{secure}://{host}:{port}{PATH}"


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False  # a name: it may resolve to anything, so it counts as exposed


def check_token(token: str, *, field: str, file: str | None = None) -> None:
    """Raises ConfigError: `token` is too short to resist guessing, or is not printable
    ASCII (`field` and `file` say where it was set)."""
    if not (token.isascii() and token.isprintable()):
        # HTTP headers (and WebSocket subprotocols) are ASCII: no client could send it.
        raise ConfigError("a token must be printable ASCII (an HTTP header cannot carry "
                          "it otherwise)", file=file, field=field,
                          hint="use e.g. `python -c 'import secrets; "
                          "print(secrets.token_urlsafe(32))'`")
    if len(token) < MIN_TOKEN_CHARS:
        raise ConfigError(f"a token of {len(token)} characters is too easy to guess",
                          file=file, field=field, hint=f"use at least {MIN_TOKEN_CHARS} "
                          "random characters, e.g. `python -c 'import secrets; "
                          "print(secrets.token_urlsafe(32))'`")


def check_exposure(settings: ListenSettings) -> None:
    """The secure-by-default rules, before anything binds.

    Raises:
        ConfigError: a non-loopback address without TLS or without a token; half a TLS
            configuration; a token too short to resist guessing.
    """
    if (settings.certfile is None) != (settings.keyfile is None):
        raise ConfigError("TLS needs both a certificate and its key", field="--tls-cert",
                          hint="give --tls-cert and --tls-key together")
    for token in settings.tokens:
        check_token(token, field="token")
    if is_loopback(settings.host):
        return
    if not settings.tls:
        raise ConfigError(
            f"{settings.host} is reachable from other machines, and without TLS the token "
            "and every prompt would cross the network in clear text", field="--listen",
            hint="give --tls-cert and --tls-key, or listen on 127.0.0.1 behind a TLS proxy")
    if not settings.tokens:
        raise ConfigError(f"{settings.host} is reachable from other machines: a token is "
                          "required there", field="--no-token",
                          hint="drop --no-token (a token is generated), or listen on 127.0.0.1")


def check_tls(settings: ListenSettings) -> None:
    """Load the certificate and key as the server will, before anything binds: a wrong
    file is the user's mistake, named by its option, not a failure after "serving" was
    announced. A key behind a passphrase is refused: OpenSSL would ask for it on the
    terminal, which a service does not have.

    Raises:
        ConfigError: a file that cannot be read, no certificate in --tls-cert, or a
            --tls-key that is not that certificate's unencrypted private key.
    """
    if settings.certfile is None or settings.keyfile is None:
        return
    import ssl

    def passphrase() -> str:
        raise ConfigError("the key is protected by a passphrase", file=settings.keyfile,
                          field="--tls-key", hint="give an unencrypted copy, readable by "
                          "this user only: `openssl pkey -in KEY -out KEY.plain`")

    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    try:
        context.load_verify_locations(cafile=settings.certfile)
    except (OSError, ssl.SSLError) as e:  # SSLError is an OSError, with a reason
        reason = "no certificate (PEM) in it" if isinstance(e, ssl.SSLError) else e.strerror
        raise ConfigError(f"cannot use: {reason}", file=settings.certfile,
                          field="--tls-cert",
                          hint="the certificate chain, -----BEGIN CERTIFICATE----- ...") from None
    try:
        context.load_cert_chain(settings.certfile, settings.keyfile, password=passphrase)
    except ssl.SSLError as e:
        # OpenSSL says "mismatch" for a key of the same type, "no certificate assigned"
        # for one of another type (RSA against EC); anything else: not a key at all.
        mismatch = e.reason in ("KEY_VALUES_MISMATCH", "NO_CERTIFICATE_ASSIGNED")
        raise ConfigError(
            f"the key does not belong to the certificate in {settings.certfile}" if mismatch
            else "not a private key (PEM)", file=settings.keyfile, field="--tls-key",
            hint="give the private key the certificate was made for") from None
    except OSError as e:
        raise ConfigError(f"cannot read: {e.strerror}", file=settings.keyfile,
                          field="--tls-key") from None


def bind(settings: ListenSettings) -> socket.socket:
    """The listening socket (port 0: any free port).

    Raises:
        ConfigError: the address cannot be bound (in use, not ours, no such interface).
    """
    try:
        info = socket.getaddrinfo(settings.host, settings.port, type=socket.SOCK_STREAM)[0]
        sock = socket.socket(info[0], socket.SOCK_STREAM)
    except OSError as e:
        raise ConfigError(f"cannot listen on {settings.host}: {e.strerror or e}",
                          field="--listen") from None
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(info[4])
        sock.listen(128)
    except OSError as e:
        sock.close()
        raise ConfigError(f"cannot listen on {settings.host}:{settings.port}: "
                          f"{e.strerror or e}", field="--listen",
                          hint="pick another port (0: any free one)") from None
    return sock


def _trace_path(template: str, number: int) -> str:
    path = Path(template)
    return str(path.with_name(f"{path.stem}.{number}{path.suffix or '.jsonl'}"))


async def serve_listener(config: ChainConfig, settings: ListenSettings, *,
                         ready: Callable[[tuple[str, str]], None] | None = None) -> int:
    """Serve `config`'s chain to every client that connects, until a signal (or
    `settings.stop`); then end every connection gracefully. Returns the exit code.

    Raises:
        ConfigError: the chain cannot be planned, or the address is refused or unusable.
    """
    check_exposure(settings)
    check_tls(settings)
    plan_chain(config, settings.mode)  # a broken chain fails now, not at the first connection
    max_frame = settings.max_frame_bytes or config.conductor.max_frame_bytes
    sock = bind(settings)
    port = sock.getsockname()[1]
    redactor = trace_redactor(config, unredacted=settings.trace_unredacted)  # one for every trace
    numbers = iter(range(1, 1 << 62))
    running: set[RemoteClient] = set()
    stop_server = anyio.Event()
    received: list[int] = []

    async def serve_client(client: RemoteClient) -> None:
        running.add(client)
        number = next(numbers)
        path = _trace_path(settings.trace, number) if settings.trace else None
        try:
            if path is not None:
                refuse_replacing(path)  # a file there that is no trace is kept
            with open_trace_sink(path, redactor) as tracer:
                options = RunOptions(mode=settings.mode, max_frame_bytes=max_frame,
                                     tracer=tracer, handle_signals=False,
                                     client_transport=client.transport)
                async with anyio.create_task_group() as tg:
                    tg.start_soon(_watch_idle, client, settings.idle_timeout)
                    if tracer is not None:
                        async with tracer.open_flusher():
                            code = await serve_connection(config, client, client, options)
                    else:
                        code = await serve_connection(config, client, client, options)
                    tg.cancel_scope.cancel()
            log.info("%s client %s: its chain stopped (status %d)", client.transport,
                     client.id, code)
        except ConfigError as e:  # e.g. a link planted where this connection's trace goes
            log.error("%s client %s: not served: %s", client.transport, client.id, e)
            # The client is told that much; the server's paths stay in the server's log.
            await _refuse(client, "the server cannot serve this connection now (its log "
                          "says why)")
        except Exception:  # one connection's failure must not stop the others
            log.exception("%s client %s: its chain failed", client.transport, client.id)
        finally:
            client.finish()
            running.discard(client)

    async def watch_signals() -> None:
        received.append(await first_stop_signal())
        settings.stop.set()

    async with anyio.create_task_group() as chains:
        def connected(client: RemoteClient) -> None:
            chains.start_soon(serve_client, client)

        endpoint = AcpEndpoint(
            Gate(settings.tokens, settings.origins, settings.max_connections), connected,
            max_frame_bytes=max_frame)
        if settings.handle_signals:
            chains.start_soon(watch_signals)
        async with anyio.create_task_group() as server:
            server.start_soon(_serve_then_close, endpoint, sock, settings, stop_server)
            if ready is not None:
                ready(settings.urls(port))
            await settings.stop.wait()
            why = signal.Signals(received[0]).name if received else "the server was stopped"
            for client in list(running):
                client.end(why)  # each chain stops as if its client had closed its input
            with anyio.move_on_after(2 * config.conductor.shutdown_grace + 5):
                for client in list(running):
                    await client.finished.wait()
            stop_server.set()  # hypercorn's own graceful shutdown is bounded
        chains.cancel_scope.cancel()
    if received:
        return EXIT_SIGNAL.get(signal.Signals(received[0]), 1)
    return 0


async def _refuse(client: RemoteClient, why: str) -> None:
    """Answer the client's first request (its initialize) with `why`, then end: a client
    the server cannot serve learns why instead of seeing its connection just close."""
    async def answer(item: Incoming) -> None:
        for message in item.items if isinstance(item, Batch) else [item]:
            if isinstance(message, Request):
                try:
                    await client.send(error_response(message.id, ErrorCode.INTERNAL_ERROR,
                                                     why))
                except (anyio.BrokenResourceError, anyio.ClosedResourceError):
                    pass  # gone already
                client.end()
    with anyio.move_on_after(5):  # a client that never sends one is not waited for
        await client.serve(answer)
    with anyio.move_on_after(1):
        await client.aclose()


async def _serve_then_close(endpoint: AcpEndpoint, sock: socket.socket,
                            settings: ListenSettings, stop: anyio.Event) -> None:
    try:
        await serve_asgi(endpoint, sock, certfile=settings.certfile, keyfile=settings.keyfile,
                         shutdown=stop.wait, graceful_timeout=settings.leftover_sockets)
    finally:
        sock.close()


async def _watch_idle(client: RemoteClient, idle: float) -> None:
    """End a connection that exchanged nothing for `idle` seconds with none of its client's
    requests still open."""
    while True:
        await anyio.sleep_until(client.last_activity + idle)
        if anyio.current_time() >= client.last_activity + idle and not client.busy:
            log.warning("%s client %s: idle for %g s, closing it", client.transport, client.id,
                        idle)
            client.end(f"the client was idle for {idle:g} s")
            return
        if client.busy:
            client.last_activity = anyio.current_time()  # look again one period later
