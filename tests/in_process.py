"""`acp-conductor ...` run in this test process, answered as `subprocess.run` answers.

A conductor started as a process costs about 0.15-0.3 s of CPU before it does anything
(an interpreter, then the package imported again); a test worker has it imported already.
Tests of what a command says and exits with, not of what only a process shows, run it
here: the command line goes through the same entry point (`conductor.cli.entry.main`),
with fds 0, 1 and 2 on files of its own (the command claims fd 1 as a process would), the
environment `child_env` gives a process, and the exit code as the interpreter makes it
from `SystemExit`. The components of its chain are still real processes.

What only a process shows stays tested on real processes (tests/test_run_cli.py and
tests/e2e): signals, a terminal, closed standard fds, stdout holding only the output.
"""

from __future__ import annotations

import gc
import io
import logging
import os
import subprocess
import sys
import tempfile
import warnings
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Literal, overload

from tests.conftest import REPO, child_env

if TYPE_CHECKING:
    from collections.abc import Iterator

# The loggers a command configures (conductor/cli/logs.py), the root's too: put back after.
LOGGERS = ("", "acp_conductor", "acp_conductor.stderr", "acp_conductor.proxy", "mcp")


@overload
def conductor(*args: str | bytes | os.PathLike[str], stdin: str | None = None,
              cwd: Path | None = None, text: Literal[True] = True,
              env: dict[str, str] | None = None, umask: int | None = None
              ) -> subprocess.CompletedProcess[str]: ...
@overload
def conductor(*args: str | bytes | os.PathLike[str], stdin: bytes | None = None,
              cwd: Path | None = None, text: Literal[False],
              env: dict[str, str] | None = None, umask: int | None = None
              ) -> subprocess.CompletedProcess[bytes]: ...
def conductor(*args: str | bytes | os.PathLike[str], stdin: str | bytes | None = None,
              cwd: Path | None = None, text: bool = True, env: dict[str, str] | None = None,
              umask: int | None = None
              ) -> subprocess.CompletedProcess[str] | subprocess.CompletedProcess[bytes]:
    """`acp-conductor ARGS` with `stdin` (else /dev/null) in `cwd` (else the repo), its
    stdout and stderr captured; `env`: more variables (over `child_env()`); `umask`: the
    process's, as `subprocess.run(umask=...)` sets it."""
    # Arguments as the interpreter decodes a command line (bytes: surrogate escapes).
    argv = ["acp-conductor", *(os.fsdecode(a) for a in args)]
    data = stdin.encode() if isinstance(stdin, str) else stdin
    with tempfile.TemporaryDirectory(prefix="acp-in-process-") as scratch:
        paths = [os.path.join(scratch, name) for name in ("stdin", "stdout", "stderr")]
        with open(paths[0], "wb") as f:
            f.write(data or b"")
        gc.freeze()  # the worker's heap: the collection below scans only the command's
        try:
            with _as_a_process(argv, paths, cwd or REPO, child_env(**(env or {})), umask):
                code = _exit_code()
                # What the command left behind goes now, as its exit would take it (under
                # a process's warning filters): an anyio stream it never closed is not a
                # ResourceWarning failing some later test in this worker.
                gc.collect()
        finally:
            gc.unfreeze()
        out, err = (Path(p).read_bytes() for p in paths[1:])
    if text:
        return subprocess.CompletedProcess(argv, code, _text(out), _text(err))
    return subprocess.CompletedProcess(argv, code, out, err)


def _text(data: bytes) -> str:
    # As `subprocess.run(text=True)` reads a pipe: universal newlines.
    return data.decode().replace("\r\n", "\n").replace("\r", "\n")


def _exit_code() -> int:
    """Run the entry point; its exit code as the interpreter gives it for SystemExit."""
    from conductor.cli.entry import main

    try:
        main()
    except SystemExit as e:
        status = e.code
        e.__traceback__ = None  # the command's frames (and files) go now, not at some gc
        if status is None:
            return 0
        if isinstance(status, int):
            return status
        sys.stderr.write(f"{status}\n")
        return 1
    return 0


@contextmanager
def _as_a_process(argv: list[str], paths: list[str], cwd: Path, env: dict[str, str],
                  umask: int | None) -> Iterator[None]:
    """fds 0-2 on `paths`, sys.std* on them, `argv`, `cwd`, `env` and `umask` for the body;
    after it, everything as it was (the command moves fd 1, sys.std* and logging), and the
    log file it opened closed, as its exit would."""
    saved_env, saved_cwd, saved_argv = dict(os.environ), os.getcwd(), sys.argv
    saved_std = sys.stdin, sys.stdout, sys.stderr
    for stream in saved_std[1:]:
        stream.flush()
    saved_fds = [os.dup(fd) for fd in (0, 1, 2)]
    with ExitStack() as stack:
        stack.enter_context(loggers_restored())
        try:
            for fd, (path, flags) in enumerate(zip(paths, (os.O_RDONLY, os.O_WRONLY,
                                                           os.O_WRONLY), strict=True)):
                opened = os.open(path, flags | (os.O_CREAT if fd else 0), 0o600)
                os.dup2(opened, fd)
                os.close(opened)
            sys.stdin = stack.enter_context(open(0, encoding="utf-8", closefd=False))
            sys.stdout = stack.enter_context(open(1, "w", encoding="utf-8", closefd=False))
            sys.stderr = stack.enter_context(open(2, "w", encoding="utf-8", buffering=1,
                                                  errors="backslashreplace", closefd=False))
            os.environ.clear()
            os.environ.update(env)
            os.chdir(cwd)
            sys.argv = argv
            if umask is not None:
                umask = os.umask(umask)
            # A process's warning filters: the suite's `error` is for the tests' own code.
            stack.enter_context(warnings.catch_warnings())
            warnings.resetwarnings()
            warnings.simplefilter("ignore", ResourceWarning)
            yield
        finally:
            for stream in (sys.stdout, sys.stderr):
                try:
                    stream.flush()
                except (OSError, ValueError):
                    pass
            sys.stdin, sys.stdout, sys.stderr = saved_std
            for fd, saved in enumerate(saved_fds):
                os.dup2(saved, fd)
                os.close(saved)
            sys.argv = saved_argv
            if umask is not None:
                os.umask(umask)
            os.chdir(saved_cwd)
            os.environ.clear()
            os.environ.update(saved_env)


@contextmanager
def loggers_restored() -> Iterator[None]:
    """The loggers a command configures as they were after the body, and the log file it
    opened closed, as its exit would."""
    saved = {name: _logger_state(logging.getLogger(name)) for name in LOGGERS}
    try:
        yield
    finally:
        for name, state in saved.items():
            _restore_logger(logging.getLogger(name), state)


def _logger_state(logger: logging.Logger) -> tuple[list[logging.Handler], int, bool]:
    return list(logger.handlers), logger.level, logger.propagate


def _restore_logger(logger: logging.Logger,
                    state: tuple[list[logging.Handler], int, bool]) -> None:
    for handler in logger.handlers:
        stream = getattr(handler, "stream", None)
        if handler not in state[0] and isinstance(stream, io.IOBase) and not stream.closed \
                and stream.fileno() > 2:
            stream.close()  # --log-file's
    logger.handlers[:] = state[0]
    logger.setLevel(state[1])
    logger.propagate = state[2]
