"""The command line: `acp-conductor` and its subcommands."""

from conductor.cli.app import main

__all__ = ["main"]
