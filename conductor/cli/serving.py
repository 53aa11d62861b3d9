"""Serving an editor on our stdin/stdout (the default command, `agent`, `proxy`), without
click: the editor's own invocation reaches it from cli/entry.py, the others from cli/app.py.
"""

from __future__ import annotations

import atexit
import logging
import os
import shlex
import sys
from typing import TYPE_CHECKING, NoReturn

from conductor.cli.guard import say

if TYPE_CHECKING:
    from conductor.cli.guard import Globals
    from conductor.config import ChainConfig


def waiting_hint(mode: str, chain_file: str | None) -> str:
    """What a chain started from a terminal says: it waits for JSON-RPC, not for a prompt."""
    hint = "acp-conductor: waiting for an ACP client to send initialize on stdin"
    if mode == "agent" and chain_file is not None:
        return (f"{hint}; an editor starts this command. To try the chain from a terminal: "
                f'acp-conductor run --chain {shlex.quote(chain_file)} "hello"')
    return f"{hint}; an editor (or a conductor, for a proxy) starts this command"


def serve(config: ChainConfig, options: Globals, mode: str) -> None:
    """Serve the editor on our stdin/stdout with `config`'s chain, then exit."""
    from conductor.early_start import start_early
    from conductor.transport.claim import claim_stdout

    wire = claim_stdout()  # before any plugin is imported: a print() never reaches the wire
    # Typed into a shell, not started by an editor: say why it is quiet. (stdin may be
    # closed: sys.stdin is then None.)
    if sys.stdin is not None and sys.stdin.isatty():
        say(waiting_hint(mode, options.chain_file))
    with options.trace_sink(config) as tracer:
        # Before the event loop and the router are imported: when the editor's initialize
        # is already waiting, the components start now and boot while we do.
        early = start_early(config, mode, max_frame_bytes=options.max_frame_bytes)
        try:
            from conductor.cli import loop
            from conductor.serve import RunOptions, serve_chain
            from conductor.tracing.sink import run_flushed
            from conductor.transport.stdio import stdio_streams

            stdin, stdout = stdio_streams(wire, early.unread)
            run = RunOptions(mode=mode, max_frame_bytes=options.max_frame_bytes, tracer=tracer,
                             early=early)
            code = loop.run(run_flushed, tracer, serve_chain, config, stdin, stdout, run)
        finally:
            early.discard()  # started, but the chain stopped before serving them
    exit_now(code)


def exit_now(code: int) -> NoReturn:
    """Exit once everything is written, without tearing the interpreter down.

    The editor waits for our exit; a Python that has imported the serving modules spends
    40-50 ms after its last line (finalising modules, collecting objects) doing nothing
    anyone observes. The wire, the trace and the logs are flushed and closed first, and
    `atexit` handlers (a plugin's included) still run.
    """
    if sys.getprofile() is not None:  # under cProfile (bench --profile): let it write its file
        sys.exit(code)
    atexit._run_exitfuncs()
    logging.shutdown()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass  # a closed or broken stream: nothing left to say on it
    os._exit(code)
