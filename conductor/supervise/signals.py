"""The signals that stop a serving conductor gracefully, and the exit code each gives."""

from __future__ import annotations

import logging
import signal

import anyio

from conductor.errors import ExitCode

log = logging.getLogger("acp_conductor")

EXIT_SIGNAL = {signal.SIGINT: ExitCode.SIGINT, signal.SIGTERM: ExitCode.SIGTERM,
               signal.SIGHUP: ExitCode.SIGHUP}


def stop_signals() -> tuple[signal.Signals, ...]:
    """SIGTERM, SIGINT, and SIGHUP (the editor's terminal closed): each stops the chain as
    EOF does, so components get EOF and their grace, and the trace is complete. SIGHUP
    only when it is not ignored now: under `nohup` it must go on being ignored."""
    if signal.getsignal(signal.SIGHUP) == signal.SIG_IGN:
        return (signal.SIGTERM, signal.SIGINT)
    return (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)


def stopping() -> None:
    """A stop signal came and the chain stops gracefully: a hangup from now on is ignored
    (a closed terminal may deliver SIGHUP twice: from the kernel and from the shell), while
    a second SIGTERM or SIGINT still ends the conductor at once."""
    if signal.getsignal(signal.SIGHUP) in (signal.SIG_DFL, None):
        signal.signal(signal.SIGHUP, signal.SIG_IGN)
    # The event loop gave SIGINT back to Python's KeyboardInterrupt, which asyncio turns
    # into a cancellation that the shielded stop waits out, every grace of it: SIG_DFL
    # ends us as a second SIGTERM does (the watchdog stops what is left).
    if signal.getsignal(signal.SIGINT) is signal.default_int_handler:
        signal.signal(signal.SIGINT, signal.SIG_DFL)


async def first_stop_signal() -> signal.Signals:
    """Wait for the first stop signal (`stop_signals`), then ignore hangups (`stopping`)."""
    with anyio.open_signal_receiver(*stop_signals()) as signals:
        async for signum in signals:
            received = signal.Signals(signum)
            log.info("received %s: shutting down", received.name)
            break
    stopping()  # the receiver is closed: SIGHUP would end us mid-stop
    return received
