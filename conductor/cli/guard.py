"""What a command does around its work, without click: the global options' values, and
errors reported as one line and an exit code, never a traceback.

Click-free because the editor's own invocation (`acp-conductor --chain FILE`) is served
without importing click (cli/entry.py); the click commands use the same (cli/context.py).
"""

from __future__ import annotations

import logging
import os
import sys
from contextlib import contextmanager, nullcontext
from typing import TYPE_CHECKING, NoReturn

from conductor.errors import ConductorError, ConfigError, ExitCode
from conductor.record import Record

if TYPE_CHECKING:
    from collections.abc import Iterator
    from contextlib import AbstractContextManager

    from conductor.config import ChainConfig
    from conductor.tracing.sink import JsonlTraceSink

log = logging.getLogger("acp_conductor")
LEVELS = ("debug", "info", "warning", "error")


class Globals(Record):
    """The global options as finally given (group and subcommand merged)."""

    chain_file: str | None = None
    log_level: str = "warning"
    log_file: str | None = None
    max_frame_bytes: int | None = None
    trace: str | None = None
    trace_unredacted: bool = False

    def chain(self) -> str:
        """The chain file to use.

        Raises:
            ConfigError: none was given.
        """
        if not self.chain_file:
            # `init` writes ./chain.toml by default; it is not picked up unasked (an editor
            # starts the conductor in a folder of its choosing), so name it.
            hint = ("--chain chain.toml for the one in this folder" if
                    os.path.isfile("chain.toml") else
                    "--chain demo to try the built-in demo (`acp-conductor chains` lists the "
                    "others), or write a chain file with `acp-conductor init --agent ...`")
            raise ConfigError("give --chain FILE", field="--chain", hint=hint)
        return self.chain_file

    def trace_sink(self, config: ChainConfig | None
                   ) -> AbstractContextManager[JsonlTraceSink | None]:
        """The `--trace` file for a run of `config`'s chain (None without --trace), hiding
        its secrets unless --trace-unredacted.

        Raises:
            ConfigError: the file cannot be written, or is the chain file or the log file.
        """
        if self.trace is None:  # the usual case: before the early start, import nothing
            return nullcontext(None)
        from conductor.config import trace_redactor
        from conductor.output import refuse_overwriting
        from conductor.tracing.sink import open_trace_sink, refuse_replacing

        refuse_overwriting(self.trace, option="--trace", inputs={
            "the chain file": config.source if config is not None else None,
            "the --log-file": self.log_file})
        refuse_replacing(self.trace)
        return open_trace_sink(self.trace,
                               trace_redactor(config, unredacted=self.trace_unredacted))


def say(text: str) -> None:
    """One line on stderr, if there is one to write to."""
    if sys.stderr is None:
        return
    try:
        sys.stderr.write(text + "\n")
        sys.stderr.flush()
    except (OSError, ValueError):
        pass  # a closed or broken stderr: nothing left to say it on


def fail(error: ConductorError) -> NoReturn:
    say(f"acp-conductor: error: {error}")
    sys.exit(type(error).exit_code)


@contextmanager
def errors_reported(options: Globals | None, *,
                    passthrough: tuple[type[BaseException], ...] = ()) -> Iterator[None]:
    """Logging as `options` say, then run the body: our errors become a one-line message
    and their exit code; anything else too, as an internal error (never a traceback).
    `passthrough`: exceptions the caller reports itself (click's usage errors)."""
    from conductor.cli.logs import configure_logging

    if options is not None:
        try:
            if options.log_file and options.chain_file:  # appended to, it would not parse
                from conductor.output import refuse_overwriting

                refuse_overwriting(options.log_file, option="--log-file",
                                   inputs={"the chain file": options.chain_file})
            configure_logging(options.log_level, options.log_file)
        except ConductorError as e:
            fail(e)
    try:
        try:
            yield
        except BaseExceptionGroup as group:
            # Out of a task group, one error comes wrapped: report it as itself (its exit
            # code and message), not as "internal error: ExceptionGroup ...". A Ctrl-C
            # among several is the user's: it wins, as it would alone.
            interrupted, _ = group.split(KeyboardInterrupt)
            raise (KeyboardInterrupt() if interrupted is not None else _sole(group)) from None
    except ConductorError as e:
        fail(e)
    except passthrough:
        raise
    except KeyboardInterrupt:
        # A word, as `run` says it (its notices), so an exit 130 is never a mystery.
        say("acp-conductor: interrupted")
        sys.exit(ExitCode.SIGINT)
    except BrokenPipeError as e:
        if not _stdout_reader_gone():
            _internal_error(e)
        # `acp-conductor chains | head -1`: end as a Unix tool cut off by SIGPIPE does,
        # silently, with nothing left to flush into the dead pipe at exit.
        os.dup2(os.open(os.devnull, os.O_WRONLY), 1)
        sys.exit(128 + 13)  # 13: SIGPIPE (docs/configuration.md)
    except Exception as e:  # the last line of defence: a message, not a traceback
        _internal_error(e)


def _internal_error(e: Exception) -> NoReturn:
    log.debug("internal error", exc_info=e)
    say(f"acp-conductor: internal error: {type(e).__name__}: {e} "
        "(run with --log-level debug for details)")
    sys.exit(ExitCode.FAILED)


def _stdout_reader_gone() -> bool:
    """Is fd 1 a pipe whose reader has closed it? (False where poll() is missing.)"""
    try:
        import select

        poller = select.poll()
        poller.register(1, select.POLLOUT)
        return any(events & (select.POLLERR | select.POLLHUP) for _, events in poller.poll(0))
    except (AttributeError, OSError, ValueError):
        return False


def _sole(group: BaseExceptionGroup[BaseException]) -> BaseException:
    """The one error inside `group` (through nested groups), or `group` if it holds more."""
    error: BaseException = group
    while isinstance(error, BaseExceptionGroup) and len(error.exceptions) == 1:
        error = error.exceptions[0]
    return error
