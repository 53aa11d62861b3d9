"""Built-in chains ship inside the package and are reachable by name after any install."""

from __future__ import annotations

import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from conductor.cli.chains import description
from conductor.config import BUILTIN_CHAINS, chain_path
from conductor.errors import ConfigError
from tests import in_process
from tests.conftest import child_env


def conductor(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    """In this process (tests/in_process.py); shell completion is tested on the real
    command (below)."""
    return in_process.conductor(*args, cwd=cwd)


def test_a_built_in_chain_runs_by_name_from_any_directory(tmp_path: Path) -> None:
    result = conductor("run", "--chain", "demo", "hello", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert "You said: hello" in result.stdout


def test_a_file_of_that_name_in_the_current_directory_wins_over_the_built_in(
        tmp_path: Path) -> None:
    (tmp_path / "demo").write_text("[agent\n", encoding="utf-8")
    assert chain_path("demo") == BUILTIN_CHAINS / "demo.toml"  # the test's cwd has none
    result = conductor("check", "--chain", "demo", cwd=tmp_path)
    assert result.returncode == 2
    assert "demo: not valid TOML" in result.stderr


def test_a_folder_of_that_name_in_the_current_directory_leaves_the_built_in_its_name(
        tmp_path: Path) -> None:
    # Only a file wins (docs/configuration.md): a `demo/` folder made `--chain demo` a usage
    # error, "File 'demo' is a directory".
    (tmp_path / "demo").mkdir()
    result = conductor("check", "--chain", "demo", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert "ok" in result.stdout


def test_a_chain_path_that_is_a_folder_is_a_config_error_naming_it(tmp_path: Path) -> None:
    (tmp_path / "chains.toml").mkdir()
    result = conductor("check", "--chain", "chains.toml", cwd=tmp_path)
    assert result.returncode == 2
    assert "acp-conductor: error: chains.toml: cannot read: Is a directory (hint: give the " \
           "path of a chain TOML file" in result.stderr


def test_an_unknown_chain_name_is_refused_with_the_built_in_names(tmp_path: Path) -> None:
    result = conductor("run", "--chain", "dmeo", "hello", cwd=tmp_path)
    assert result.returncode == 2
    assert "no built-in chain by that name (built in: context, demo," in result.stderr
    assert "acp-conductor chains" in result.stderr


def test_a_path_that_does_not_exist_is_a_missing_file_not_a_name(tmp_path: Path) -> None:
    result = conductor("run", "--chain", "demo.toml", "hello", cwd=tmp_path)
    assert result.returncode == 2
    assert "demo.toml: file not found" in result.stderr
    # the built-in of that name is reached by its name alone
    assert "(hint: `demo` is a built-in chain: give its name alone, `--chain demo`)" \
        in result.stderr


def test_built_in_chain_names_complete_in_the_shell(tmp_path: Path) -> None:
    env = child_env(COMP_WORDS="acp-conductor run --chain de", COMP_CWORD="3",
                    _ACP_CONDUCTOR_COMPLETE="bash_complete")
    script = Path(sys.executable).parent / "acp-conductor"  # completion goes by its name
    done = subprocess.run([str(script)], env=env, cwd=tmp_path, capture_output=True,
                          text=True, timeout=60, check=False)
    assert done.stdout.splitlines() == ["plain,demo", "file,de"]


def test_the_name_chains_prints_completes_to_built_in_names_only(tmp_path: Path) -> None:
    # `acp-conductor chains permissions > my.toml` is how docs say to start a chain file;
    # NAME is never a file, so no file names are offered.
    env = child_env(COMP_WORDS="acp-conductor chains per", COMP_CWORD="2",
                    _ACP_CONDUCTOR_COMPLETE="bash_complete")
    script = Path(sys.executable).parent / "acp-conductor"
    done = subprocess.run([str(script)], env=env, cwd=tmp_path, capture_output=True,
                          text=True, timeout=60, check=False)
    assert done.stdout.splitlines() == ["plain,permissions"]


def test_chains_lists_every_built_in_chain_with_what_it_does(tmp_path: Path) -> None:
    result = conductor("chains", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    for path in BUILTIN_CHAINS.glob("*.toml"):
        assert f"{path.stem}  " in result.stdout
        assert description(path) and description(path) in result.stdout
    shown = conductor("chains", "permissions", cwd=tmp_path)
    assert shown.stdout == (BUILTIN_CHAINS / "permissions.toml").read_text(encoding="utf-8")


def test_every_built_in_chain_is_listed_with_a_whole_sentence() -> None:
    # `chains` shows a file's first comment line only: a sentence that runs on into the
    # next line is shown cut off mid-way ("... an MCP server (chain,").
    for path in BUILTIN_CHAINS.glob("*.toml"):
        text = description(path)
        assert text.endswith("."), (path.name, text)
        assert text.count("(") == text.count(")"), (path.name, text)


def test_chains_name_prints_the_built_in_even_beside_a_folder_of_that_name(
        tmp_path: Path) -> None:
    (tmp_path / "demo").mkdir()
    shown = conductor("chains", "demo", cwd=tmp_path)
    assert shown.returncode == 0, shown.stderr
    assert shown.stdout == (BUILTIN_CHAINS / "demo.toml").read_text(encoding="utf-8")


def test_chains_with_a_name_that_is_not_built_in_is_a_usage_error_listing_them(
        tmp_path: Path) -> None:
    for name in ("nosuch", "../pyproject", "my.toml"):
        shown = conductor("chains", name, cwd=tmp_path)
        assert (shown.returncode, shown.stdout) == (2, ""), shown.stderr
        assert f"no built-in chain {name!r} (built in: " in shown.stderr
        assert "internal error" not in shown.stderr


def test_a_chain_name_without_its_toml_suffix_points_at_the_file_here(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # `init` wrote chain.toml; `--chain chain` is the natural slip.
    monkeypatch.chdir(tmp_path)
    (tmp_path / "chain.toml").write_text("[agent]\ncommand = 'true'\n", encoding="utf-8")
    with pytest.raises(ConfigError) as caught:
        chain_path("chain")
    assert caught.value.hint is not None and "did you mean 'chain.toml'?" in caught.value.hint


def test_a_misspelt_built_in_chain_name_is_suggested(tmp_path: Path,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ConfigError) as caught:
        chain_path("dmeo")
    assert caught.value.hint is not None and "did you mean 'demo'?" in caught.value.hint


def _commands_in_chain_comments() -> list[tuple[str, list[str]]]:
    """Each `acp-conductor run ...` line a built-in chain's comments tell a user to run."""
    found = []
    for path in sorted(BUILTIN_CHAINS.glob("*.toml")):
        for line in path.read_text(encoding="utf-8").splitlines():
            command = line.lstrip("#").strip()
            if command.startswith("acp-conductor run "):
                found.append((path.name, shlex.split(command)[1:]))
    return found


@pytest.mark.parametrize(("chain", "argv"), _commands_in_chain_comments(),
                         ids=lambda v: v if isinstance(v, str) else " ".join(v))
def test_every_command_a_built_in_chain_tells_a_user_to_run_works_as_written(
        tmp_path: Path, chain: str, argv: list[str]) -> None:
    result = conductor(*argv, cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert "[stop] end_turn (exit 0)" in result.stderr
    # what the comments promise runs without the user: nothing was put to them
    assert "[permission]" not in result.stderr
    assert "failed" not in result.stderr
