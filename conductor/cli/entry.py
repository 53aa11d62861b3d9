"""The `acp-conductor` command's entry point: the editor's own invocation, without click.

An editor starts `acp-conductor --chain FILE` (or `acp-conductor agent CMD...`) and waits
for its `initialize` to be answered; importing click is ≈ 7-13 ms of that start-up
(docs/performance.md). Exactly those command lines are served here; every other one, and
anything unusual about these (an option, a directory), goes to click (cli/app.py), which
would do the same with them (tests/test_cli_entry.py holds the two to that).
"""

from __future__ import annotations

import os
import sys

COMPLETION_VAR = "_ACP_CONDUCTOR_COMPLETE"  # click's shell completion for this command


def main() -> None:
    argv = sys.argv[1:]
    chain_file = editor_invocation(argv)
    commands = agent_invocation(argv) if chain_file is None else None
    if chain_file is None and commands is None:
        from conductor.cli.app import main as with_click

        with_click()
        return
    from conductor.cli.guard import Globals, errors_reported
    from conductor.cli.serving import serve

    options = Globals(chain_file=chain_file)
    with errors_reported(options):
        if commands is not None:
            from conductor.config import chain_from_commands

            serve(chain_from_commands(commands, with_agent=True), options, "agent")
        else:
            from conductor.plan import read_chain

            assert chain_file is not None
            serve(read_chain(chain_file), options, "agent")


def editor_invocation(argv: list[str]) -> str | None:
    """The chain file of `--chain FILE` / `--chain=FILE` alone; None for anything else."""
    if len(argv) == 2 and argv[0] == "--chain":
        value = argv[1]
    elif len(argv) == 1 and argv[0].startswith("--chain="):
        value = argv[0].removeprefix("--chain=")
    else:
        return None
    if not value or value.startswith("-") or os.environ.get(COMPLETION_VAR) \
            or os.path.isdir(value) or _unreadable(value):
        return None  # click's own answer (a usage error, completion): not the editor's case
    return value


def agent_invocation(argv: list[str]) -> list[str] | None:
    """The commands of `agent CMD...` with no option anywhere; None for anything else."""
    if len(argv) < 2 or argv[0] != "agent" or os.environ.get(COMPLETION_VAR):
        return None
    commands = argv[1:]
    if any(c.startswith("-") for c in commands):
        return None  # an option (global, or --help): click's
    return commands


def _unreadable(path: str) -> bool:
    """A file there that we may not read: click's `--chain` type refuses it (usage, exit 2)."""
    return os.path.exists(path) and not os.access(path, os.R_OK)
