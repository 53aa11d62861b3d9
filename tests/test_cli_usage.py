"""A new user's usage mistakes get an answer that says how to fix them.

`run`, `check` and `call` claim the process's stdout for the wire first: they run in this
process on fds of their own (tests/in_process.py)."""

from __future__ import annotations

from typing import TYPE_CHECKING

import pytest

from tests.in_process import conductor

if TYPE_CHECKING:
    import subprocess
    from pathlib import Path


def in_folder(folder: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return conductor(*args, cwd=folder)


@pytest.mark.parametrize("command", [["run", "hi"], ["check"]])
def test_a_command_without_chain_says_how_to_get_one(tmp_path: Path,
                                                     command: list[str]) -> None:
    done = in_folder(tmp_path, *command)
    assert done.returncode == 2 and done.stdout == ""
    assert "--chain demo" in done.stderr and "acp-conductor init" in done.stderr


def test_without_chain_the_chain_toml_init_wrote_here_is_named(tmp_path: Path) -> None:
    # `init` writes ./chain.toml by default; `run` does not pick it up on its own.
    (tmp_path / "chain.toml").write_text("[agent]\ncommand = 'true'\n", encoding="utf-8")
    done = in_folder(tmp_path, "run", "hi")
    assert done.returncode == 2
    assert "--chain chain.toml" in done.stderr


@pytest.mark.parametrize("command", [["check", "mine.toml"], ["run", "mine.toml", "hi"],
                                     ["call", "mine.toml", "_ext/x", "{}", "more"]])
def test_a_chain_file_given_as_an_argument_is_told_to_go_after_chain(
        tmp_path: Path, command: list[str]) -> None:
    # `acp-conductor check mine.toml` said only "Got unexpected extra argument (mine.toml)".
    done = in_folder(tmp_path, *command)
    assert done.returncode == 2 and done.stdout == ""
    assert "unexpected extra argument" in done.stderr
    assert f"a chain file goes after --chain: acp-conductor {command[0]} --chain mine.toml" \
        in done.stderr


def test_run_given_only_a_chain_file_says_it_goes_after_chain(tmp_path: Path) -> None:
    # `acp-conductor run mine.toml` took the file name for the prompt, and said only
    # "give --chain FILE" with a hint about the demo.
    (tmp_path / "mine.toml").write_text("[agent]\ncommand = 'true'\n", encoding="utf-8")
    done = in_folder(tmp_path, "run", "mine.toml")
    assert done.returncode == 2 and done.stdout == ""
    assert 'mine.toml is a chain file: acp-conductor run --chain mine.toml "your prompt"' \
        in done.stderr
