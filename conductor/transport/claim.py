"""Claiming stdout for the JSON-RPC wire. Only `os` and `sys`: it is done first thing,
before the event loop (or any plugin) is imported."""

from __future__ import annotations

import os
import sys

from conductor.errors import ConfigError


def claim_stdout() -> int:
    """Take this process's stdout for the caller alone: return a private duplicate of fd 1,
    then point fd 1 and `sys.stdout` at stderr.

    Call it before any plugin is imported: a `print()` in user code (or a C library writing
    to fd 1) then lands on stderr instead of in the JSON-RPC wire or `run`'s output.

    Raises:
        ConfigError: stdout is closed: there is nowhere to write the wire (or the output).
    """
    # Started with stdin or stderr closed (`<&-`, `2>&-`, as some runners and daemons
    # do): each is opened on /dev/null first, or the duplicate below would take its free
    # number (stdin: the conductor would read its own wire as the client's input).
    _open_if_closed(0, os.O_RDONLY)
    if _open_if_closed(2, os.O_WRONLY) or sys.stderr is None:
        sys.stderr = open(2, "w", buffering=1, encoding="utf-8",
                          errors="backslashreplace", closefd=False)
    if not _is_open(1):
        raise ConfigError("is closed, and acp-conductor writes JSON-RPC there (`run`: its "
                          "output)", field="stdout",
                          hint="start it with stdout open (a pipe, a file, or /dev/null)")
    if sys.stdout is not None:
        sys.stdout.flush()
    private = os.dup(1)  # not inherited (PEP 446): a child never gets the wire either
    os.dup2(2, 1)
    sys.stdout = sys.stderr  # unbuffered order with our logs; fd 1 covers everything else
    return private


def _is_open(fd: int) -> bool:
    try:
        os.fstat(fd)
    except OSError:
        return False
    return True


def _open_if_closed(fd: int, flags: int) -> bool:
    """Open /dev/null as `fd` if it is closed; whether it was."""
    if _is_open(fd):
        return False
    null = os.open(os.devnull, flags)
    if null != fd:
        os.dup2(null, fd)
        os.close(null)
    return True
