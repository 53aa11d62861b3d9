"""The command line: `acp-conductor` (cli/app.py) and its subcommands."""
