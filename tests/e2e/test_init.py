"""`acp-conductor init`: chain files that load as written (their commented examples too),
and a proxy package that works once `pip install -e` has installed it."""

from __future__ import annotations

import re
import subprocess
import tomllib
from typing import TYPE_CHECKING

import pytest

from conductor.cli.init import AGENTS, chain_text, proxy_files
from conductor.config import parse_chain
from conductor.plan import plan_chain as _plan
from tests import in_process
from tests.e2e.conftest import fresh_venv, user_env

if TYPE_CHECKING:
    from pathlib import Path

pytest_plugins = ["pytester"]


def conductor(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    """In this process (tests/in_process.py); the installed package's commands are run as
    a user runs them (below)."""
    return in_process.conductor(*args, cwd=cwd)


def with_examples_enabled(text: str) -> str:
    """The chain file with its commented-out [[proxy]] blocks uncommented."""
    return re.sub(r"^# (\[\[proxy\]\]\n(?:# .*\n)*)",
                  lambda m: re.sub(r"^# ", "", m.group(1), flags=re.M), text, flags=re.M)


@pytest.mark.parametrize("agent", sorted(AGENTS))
def test_the_chain_for_each_known_agent_loads_with_its_example_proxies_enabled(
        agent: str, tmp_path: Path) -> None:
    text = chain_text(agent, AGENTS[agent], tmp_path / "chain.toml")
    for variant, proxies in ((text, 0), (with_examples_enabled(text), 3)):
        config = parse_chain(tomllib.loads(variant), file="chain.toml",
                             base_dir=str(tmp_path))
        assert len(config.proxy) == proxies
        plan = _plan(config, "agent")  # plugins found, options valid, variables set
        assert [name for name in [*config.proxy_names(), config.agent_name()]] == [
            *["permissions", "redact", "transcript"][:proxies], agent]
        assert len(plan) == proxies + 1


def test_no_known_agent_is_started_with_a_deprecated_acp_flag(tmp_path: Path) -> None:
    # `npx -y` runs the newest release: Gemini CLI 0.33 made `--acp` its flag and prints a
    # deprecation warning for `--experimental-acp` (qwen-code did the same).
    for agent in AGENTS:
        text = chain_text(agent, AGENTS[agent], tmp_path / "chain.toml")
        assert "--experimental-acp" not in text, agent
    assert AGENTS["gemini"].command == '"npx -y @google/gemini-cli --acp"'


def test_init_writes_a_chain_that_runs_and_never_overwrites_one(tmp_path: Path) -> None:
    result = conductor("init", "--agent", "demo", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    written = (tmp_path / "chain.toml").read_text(encoding="utf-8")
    assert conductor("run", "--chain", "chain.toml", "hello", cwd=tmp_path).returncode == 0
    again = conductor("init", "--agent", "codex", cwd=tmp_path)
    assert again.returncode == 2
    assert "chain.toml already exists; not overwriting it" in again.stderr
    assert (tmp_path / "chain.toml").read_text(encoding="utf-8") == written


def test_init_with_an_agent_command_puts_it_in_the_chain(tmp_path: Path) -> None:
    result = conductor("init", "--agent-command", 'my-agent --acp --name "x y"', "-o",
                       "mine.toml", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    chain = tomllib.loads((tmp_path / "mine.toml").read_text(encoding="utf-8"))
    assert chain["agent"]["command"] == 'my-agent --acp --name "x y"'


def test_a_proxy_package_from_init_is_usable_by_name_once_installed(
        wheel: Path, tmp_path: Path) -> None:
    venv = fresh_venv(tmp_path / "venv")

    def sh(*argv: str, cwd: Path = tmp_path) -> subprocess.CompletedProcess[str]:
        done = subprocess.run(argv, env=user_env(venv), cwd=cwd, capture_output=True,
                              text=True, stdin=subprocess.DEVNULL, timeout=120, check=False)
        assert done.returncode == 0, f"{argv}\n{done.stdout}\n{done.stderr}"
        return done

    sh("pip", "install", "-q", str(wheel))
    sh("acp-conductor", "init", "--proxy", "shout")
    sh("pip", "install", "-q", "-e", "shout[test]")
    listed = sh("acp-conductor", "proxies").stdout
    assert re.search(r"^shout +Puts a line of text in front of every prompt\.", listed, re.M)
    (tmp_path / "chain.toml").write_text(
        '[[proxy]]\nuse = "shout"\noptions = { prefix = "Be brief." }\n'
        '[agent]\ncommand = ["${PYTHON}", "-m", "conductor.demo_agent"]\n', encoding="utf-8")
    ran = sh("acp-conductor", "run", "--chain", "chain.toml", "hello")
    assert "You said: Be brief. hello" in ran.stdout
    tests = sh("python", "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "no:randomly",
               cwd=tmp_path / "shout")
    assert re.search(r"^[1-9][0-9]* passed in ", tests.stdout, re.M), tests.stdout


@pytest.mark.parametrize("name", ["redact", "transcript"])
def test_a_proxy_package_named_as_an_installed_proxy_is_refused_and_nothing_is_written(
        tmp_path: Path, name: str) -> None:
    # `init --proxy redact` wrote a package whose `use = "redact"` was then ambiguous with
    # the built-in one: whichever entry point came first won, silently.
    done = conductor("init", "--proxy", name, cwd=tmp_path)
    assert done.returncode == 2, done.stderr
    assert f"--proxy: {name!r} is the name of an installed proxy" in done.stderr
    assert "acp_conductor_proxies." in done.stderr and "pick another name" in done.stderr
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("args", [["--agent", "demo", "-o", "missing/chain.toml"],
                                  ["--agent", "demo", "-o", "a-file/chain.toml"],
                                  ["--proxy", "shout", "-o", "a-file/shout"]])
def test_init_into_a_folder_that_is_missing_or_a_file_is_a_usage_error_naming_the_path(
        tmp_path: Path, args: list[str]) -> None:
    (tmp_path / "a-file").write_text("mine\n", encoding="utf-8")
    result = conductor("init", *args, cwd=tmp_path)
    assert result.returncode == 2, result.stderr
    assert "acp-conductor: error: --output: cannot " in result.stderr
    assert args[-1].split("/")[0] in result.stderr
    assert "internal error" not in result.stderr and "Traceback" not in result.stderr
    assert (tmp_path / "a-file").read_text(encoding="utf-8") == "mine\n"


@pytest.mark.parametrize(("args", "said"), [
    (["--agent-command", ""], "--agent-command: the command is empty"),
    (["--agent-command", "  "], "--agent-command: the command is empty"),
    (["--agent", "demo", "-o", ""], "--output: the path is empty"),
    (["--proxy", "shout", "-o", ""], "--output: the path is empty")])
def test_an_empty_agent_command_or_output_is_refused_by_name_and_nothing_is_written(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, args: list[str], said: str) -> None:
    # An empty command wrote a chain that `check` then refused; an empty -o is "." and was
    # refused as ". already exists", which says nothing about what was wrong.
    from click.testing import CliRunner

    from conductor.cli.app import main

    monkeypatch.chdir(tmp_path)
    result = CliRunner().invoke(main, ["init", *args])
    assert result.exit_code == 2, result.output
    assert said in result.stderr and result.stdout == ""
    assert list(tmp_path.iterdir()) == []


def test_an_output_that_is_a_folder_gets_chain_toml_written_inside_it(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # It was refused as "out already exists; not overwriting it".
    from click.testing import CliRunner

    from conductor.cli.app import main

    monkeypatch.chdir(tmp_path)
    (tmp_path / "out").mkdir()
    result = CliRunner().invoke(main, ["init", "--agent", "demo", "-o", "out"])
    assert result.exit_code == 0, result.output
    assert "wrote out/chain.toml" in result.stdout
    assert "[agent]" in (tmp_path / "out" / "chain.toml").read_text(encoding="utf-8")
    again = CliRunner().invoke(main, ["init", "--agent", "demo", "-o", "out"])
    assert again.exit_code == 2
    assert "out/chain.toml already exists; not overwriting it" in again.stderr


@pytest.mark.parametrize(("command", "said"), [
    ('my-agent "--acp', "--agent-command: cannot split it as a shell would: No closing "
                        "quotation (hint: close the quote"),
    ("my-agent --home ${HOME", "--agent-command: ${HOME is not closed (hint: write ${HOME}"),
])
def test_an_agent_command_no_chain_could_run_is_refused_and_nothing_is_written(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, command: str, said: str) -> None:
    # It used to write the chain, say "try check", and `check` then refused the file.
    from click.testing import CliRunner

    from conductor.cli.app import main

    monkeypatch.chdir(tmp_path)
    result = CliRunner().invoke(main, ["init", "--agent-command", command])
    assert result.exit_code == 2, result.output
    assert said in result.stderr and result.stdout == ""
    assert list(tmp_path.iterdir()) == []


def test_an_agent_program_given_by_a_relative_path_is_the_same_file_from_the_chain_elsewhere(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # Typed in a shell, `./agent.sh` is in the current folder; a chain file takes it from its
    # own folder: written as is into sub/chain.toml, `check` said "./agent.sh not found".
    from click.testing import CliRunner

    from conductor.cli.app import main
    from conductor.plan import read_chain

    (tmp_path / "agent.sh").write_text("#!/bin/sh\n", encoding="utf-8")
    (tmp_path / "sub").mkdir()
    monkeypatch.chdir(tmp_path)
    result = CliRunner().invoke(main, ["init", "--agent-command", "./agent.sh --acp",
                                       "-o", "sub/chain.toml"])
    assert result.exit_code == 0, result.output
    [(_, _, launch)] = _plan(read_chain("sub/chain.toml"), "agent")
    assert launch.argv == [str(tmp_path / "agent.sh"), "--acp"]  # type: ignore[union-attr]


def test_an_agent_command_over_several_lines_still_makes_a_chain_that_loads(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # The command is also shown in the file's first comment line: a newline in it left the
    # rest of that line outside the comment, and the file was not TOML.
    from click.testing import CliRunner

    from conductor.cli.app import main
    from conductor.plan import read_chain

    monkeypatch.chdir(tmp_path)
    result = CliRunner().invoke(main, ["init", "--agent-command", "my-agent\n  --acp"])
    assert result.exit_code == 0, result.output
    agent = read_chain("chain.toml").agent
    assert agent is not None and agent.command == "my-agent\n  --acp"


@pytest.mark.parametrize("output", ["my chain.toml", "it's.toml"])
def test_the_commands_init_suggests_work_when_pasted_for_a_path_with_spaces_or_quotes(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, output: str) -> None:
    import shlex

    from click.testing import CliRunner

    from conductor.cli.app import main

    monkeypatch.chdir(tmp_path)
    result = CliRunner().invoke(main, ["init", "--agent", "demo", "-o", output])
    assert result.exit_code == 0, result.output
    suggested = re.search(r"`(acp-conductor check [^`]*)`", result.stdout)
    assert suggested is not None and shlex.split(suggested.group(1))[-1] == output
    written = (tmp_path / output).read_text(encoding="utf-8")
    for command in re.findall(r"^#   (acp-conductor .*?)  ", written, re.M):
        assert output in shlex.split(command), command
    editor = re.search(r"starts `(acp-conductor --chain [^`]*)`", written)
    assert editor is not None and shlex.split(editor.group(1))[-1] == str(tmp_path / output)


def test_the_tests_of_a_proxy_package_from_init_run_once_each_on_asyncio(
        pytester: pytest.Pytester) -> None:
    # They ran once per installed anyio backend (trio too): a proxy written for asyncio,
    # as the conductor runs it, then failed its own generated tests.
    for relative, text in proxy_files("shout").items():
        (pytester.path / relative).parent.mkdir(parents=True, exist_ok=True)
        (pytester.path / relative).write_text(text, encoding="utf-8")
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "-v")
    result.assert_outcomes(passed=2)
    result.stdout.fnmatch_lines(["*test_the_prefix_goes_in_front_of_the_prompt?asyncio? PASSED*"])
