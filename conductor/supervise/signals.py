"""The signals that stop a serving conductor gracefully, and the exit code each gives."""

from __future__ import annotations

import signal

from conductor.errors import ExitCode

EXIT_SIGNAL = {signal.SIGINT: ExitCode.SIGINT, signal.SIGTERM: ExitCode.SIGTERM,
               signal.SIGHUP: ExitCode.SIGHUP}


def stop_signals() -> tuple[signal.Signals, ...]:
    """SIGTERM, SIGINT, and SIGHUP (the editor's terminal closed): each stops the chain as
    EOF does, so components get EOF and their grace, and the trace is complete. SIGHUP
    only when it is not ignored now: under `nohup` it must go on being ignored."""
    if signal.getsignal(signal.SIGHUP) == signal.SIG_IGN:
        return (signal.SIGTERM, signal.SIGINT)
    return (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)
