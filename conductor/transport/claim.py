"""Claiming stdout for the JSON-RPC wire. Only `os` and `sys`: it is done first thing,
before the event loop (or any plugin) is imported."""

from __future__ import annotations

import os
import sys


def claim_stdout() -> int:
    """Take this process's stdout for the caller alone: return a private duplicate of fd 1,
    then point fd 1 and `sys.stdout` at stderr.

    Call it before any plugin is imported: a `print()` in user code (or a C library writing
    to fd 1) then lands on stderr instead of in the JSON-RPC wire or `run`'s output.
    """
    sys.stdout.flush()
    try:
        os.fstat(0)
    except OSError:
        # Started with stdin closed: the duplicate below would take the free number 0 and
        # be read as the client's input. An empty stdin instead: the client sent nothing.
        null = os.open(os.devnull, os.O_RDONLY)
        if null != 0:
            os.dup2(null, 0)
            os.close(null)
    private = os.dup(1)  # not inherited (PEP 446): a child never gets the wire either
    os.dup2(2, 1)
    sys.stdout = sys.stderr  # unbuffered order with our logs; fd 1 covers everything else
    return private
