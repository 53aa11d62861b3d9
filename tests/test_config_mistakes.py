"""The mistakes a new user makes in a chain file: each one a configuration error that names
the file, the field and a fix, before anything starts (never a traceback, never a runtime
failure that does not say which key caused it)."""

from __future__ import annotations

import os
import textwrap
from typing import TYPE_CHECKING

import pytest

from conductor.config import (
    chain_from_commands,
    component_argv,
    component_cwd,
    expand,
    mcp_servers,
)
from conductor.errors import ConfigError
from conductor.plan import plan_chain, read_chain

if TYPE_CHECKING:
    from pathlib import Path


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "c.toml"
    path.write_text(textwrap.dedent(text), encoding="utf-8")
    return path


def problem(tmp_path: Path, text: str) -> str:
    """The configuration error reading and planning `text` as c.toml gives."""
    path = tmp_path / "c.toml"
    path.write_text(textwrap.dedent(text))
    with pytest.raises(ConfigError) as e:
        plan_chain(read_chain(path), "agent")
    return str(e.value)


def test_a_command_with_an_unclosed_quote_is_a_config_error_naming_its_field(
        tmp_path: Path) -> None:
    message = problem(tmp_path, """
        [agent]
        command = 'python "agent.py'
    """)
    assert "c.toml: agent.command:" in message
    assert "quotation" in message


def test_an_empty_program_in_an_argv_list_is_a_config_error(tmp_path: Path) -> None:
    assert "c.toml: agent.command:" in problem(tmp_path, """
        [agent]
        command = ["", "agent.py"]
    """)


def test_a_cwd_that_does_not_exist_is_a_config_error_naming_the_chain_files_folder(
        tmp_path: Path) -> None:
    message = problem(tmp_path, """
        [agent]
        command = "agent"
        cwd = "work"
    """)
    assert "c.toml: agent.cwd: work not found" in message
    assert f"relative to {tmp_path}" in message


def test_a_cwd_that_is_a_file_is_a_config_error(tmp_path: Path) -> None:
    (tmp_path / "notes.txt").write_text("")
    assert "c.toml: agent.cwd: notes.txt is not a directory" in problem(tmp_path, """
        [agent]
        command = "agent"
        cwd = "notes.txt"
    """)


AGENT = '[agent]\ncommand = "agent"\n'


@pytest.mark.parametrize("url", ["not a url", "ws://127.0.0.1:8000/mcp", "127.0.0.1:8000/mcp"])
def test_an_http_mcp_server_whose_url_is_not_http_is_a_config_error(
        tmp_path: Path, url: str) -> None:
    message = problem(tmp_path, AGENT + f"""
[[mcp_server]]
name = "search"
type = "http"
url = "{url}"
""")
    assert "c.toml: mcp_server[0].url:" in message
    assert "http://" in message


def test_an_mcp_server_with_an_empty_name_is_a_config_error(tmp_path: Path) -> None:
    assert "c.toml: mcp_server[0].name:" in problem(tmp_path, AGENT + """
[[mcp_server]]
name = ""
command = "cat"
""")


def test_two_mcp_servers_with_the_same_name_are_a_config_error(tmp_path: Path) -> None:
    message = problem(tmp_path, AGENT + """
[[mcp_server]]
name = "files"
command = "cat"

[[mcp_server]]
name = "files"
command = "cat"
""")
    assert "c.toml: mcp_server[1].name: duplicate MCP server name 'files'" in message


def test_an_mcp_server_with_a_url_but_no_type_is_told_to_set_the_type(tmp_path: Path) -> None:
    message = problem(tmp_path, AGENT + """
[[mcp_server]]
name = "search"
url = "http://127.0.0.1:8000/mcp"
""")
    assert "c.toml: mcp_server[0].type:" in message
    assert 'type = "http"' in message


def test_a_remote_components_url_expands_variables_as_its_headers_do(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from conductor.plan import RemoteSpec

    monkeypatch.setenv("AGENT_HOST", "build-box:8765")
    path = tmp_path / "c.toml"
    path.write_text('[agent]\nurl = "wss://${AGENT_HOST}/acp"\n')
    [(_, _, remote)] = plan_chain(read_chain(path), "agent")
    assert isinstance(remote, RemoteSpec)
    assert remote.url == "wss://build-box:8765/acp"
    monkeypatch.delenv("AGENT_HOST")
    assert "c.toml: agent.url: environment variable AGENT_HOST is not set" in problem(
        tmp_path, '[agent]\nurl = "wss://${AGENT_HOST}/acp"\n')


@pytest.mark.parametrize(("table", "line", "field"), [
    ("[[proxy]]\ncommand = 'p'", 'optional = "yes"', "proxy[0].optional"),
    ("[agent]\ncommand = 'a'", "inherit_env = 0", "agent.inherit_env"),
    ("[agent]\ncommand = 'a'", "max_restarts = true", "agent.max_restarts"),
    ("[agent]\ncommand = 'a'", "shutdown_grace = true", "agent.shutdown_grace"),
    ("[agent]\ncommand = 'a'", 'shutdown_grace = "3"', "agent.shutdown_grace"),
    ("[conductor]", "max_frame_bytes = 70000.0", "conductor.max_frame_bytes"),
    ("[conductor]", 'request_timeout = "30"', "conductor.request_timeout"),
    ("[[mcp_server]]\nname = 'm'\ncommand = 'sh'", 'required = "no"', "mcp_server[0].required"),
])
def test_a_value_of_the_wrong_type_is_refused_not_coerced(
        tmp_path: Path, table: str, line: str, field: str) -> None:
    # `optional = "yes"` is not the boolean true, nor `max_restarts = true` the number 1:
    # taking them as such hides the mistake (and the fast path, msgspec, refuses them).
    chain = f"{table}\n{line}\n"
    if "[agent]" not in table:
        chain += "[agent]\ncommand = 'a'\n"
    message = problem(tmp_path, chain)
    assert f"c.toml: {field}:" in message
    assert "without quotes" in message


@pytest.mark.parametrize(("text", "expected"), [
    ("[[agent]]\ncommand = 'a'\n", "c.toml: agent: should be one table, not a list of "
                                   "them (hint: write [agent], with single brackets)"),
    ("[conductor]\n[[proxy]]\ncommand = 'p'\n[agent]\ncommand = 'a'\n", None),
    ("[proxy]\ncommand = 'p'\n[agent]\ncommand = 'a'\n",
     "c.toml: proxy: should be a list of tables (hint: write [[proxy]], with double "
     "brackets, for each one)"),
    ("[agent]\ncommand = 'a'\n[mcp_server]\nname = 'm'\ncommand = 'sh'\n",
     "c.toml: mcp_server: should be a list of tables (hint: write [[mcp_server]], with "
     "double brackets, for each one)"),
    ("conductor = 3\n[agent]\ncommand = 'a'\n",
     "c.toml: conductor: should be a table (hint: write [conductor] and its keys below "
     "it)"),
    ("proxy = ['p']\n[agent]\ncommand = 'a'\n",
     "c.toml: proxy[0]: should be a table (hint: write [[proxy]] and its keys below "
     "it)"),
])
def test_a_table_written_with_the_wrong_brackets_is_told_which_to_write(
        tmp_path: Path, text: str, expected: str | None) -> None:
    # Not "Input should be a dictionary or an instance of ComponentSpec": the reader wrote
    # TOML, and the fix is in its brackets.
    path = tmp_path / "c.toml"
    path.write_text(text)
    if expected is None:  # the right brackets: read as it is
        read_chain(path)
        return
    with pytest.raises(ConfigError) as e:
        read_chain(path)
    assert str(e.value) == f"{path}: {expected.removeprefix('c.toml: ')}"


@pytest.mark.parametrize(("command", "expected"), [
    ("3", "agent.command: Input should be a valid string or a valid list "
          "(hint: write a string or a list)"),
    ('["python", 1]', "agent.command[1]: Input should be a valid string "
                      "(hint: write a string)"),
])
def test_a_command_of_the_wrong_type_is_one_problem_about_what_it_is(
        tmp_path: Path, command: str, expected: str) -> None:
    # `command` is a string or a list: a number is not "2 problems" that contradict each
    # other, and a list whose item is wrong is not told it should have been a string.
    message = problem(tmp_path, f"[agent]\ncommand = {command}\n")
    assert message == f"{tmp_path / 'c.toml'}: {expected}"


def test_a_wrong_type_for_a_union_key_and_wrong_brackets_are_both_told(
        tmp_path: Path) -> None:
    # The union's two pydantic errors are said as one: the bracket advice must still land
    # on the section it is about (it was an IndexError, "internal error", before).
    path = tmp_path / "c.toml"
    path.write_text("[[proxy]]\ncommand = 3\n[[agent]]\ncommand = 'a'\n")
    with pytest.raises(ConfigError) as e:
        read_chain(path)
    message = str(e.value)
    assert "proxy[0].command: Input should be a valid string or a valid list" in message
    assert "agent: should be one table, not a list of them (hint: write [agent], with " \
           "single brackets)" in message


@pytest.mark.parametrize(("environ", "expected"), [
    ({"HOME": "/home/me"}, "/home/me/.config/agent"),
    ({"HOME": "/home/me", "AGENT_CONFIG": "/etc/agent"}, "/etc/agent"),
])
def test_a_default_may_itself_name_a_variable(
        monkeypatch: pytest.MonkeyPatch, environ: dict[str, str], expected: str) -> None:
    # `${AGENT_CONFIG:-${HOME}/.config/agent}`, as a shell reads it: not a literal
    # "${HOME" with a stray "}" after it.
    monkeypatch.delenv("AGENT_CONFIG", raising=False)
    for name, value in environ.items():
        monkeypatch.setenv(name, value)
    assert expand("${AGENT_CONFIG:-${HOME}/.config/agent}", dict(os.environ),
                  where="agent.command", file="c.toml") == expected


@pytest.mark.parametrize(("environ", "expected"), [
    ({"A": "a"}, "a/x"), ({"B": "b"}, "b/x"), ({"C": "c"}, "c/x"),
    ({"B": "b", "C": "c"}, "b/x"),
])
def test_defaults_nest_as_deep_as_a_shell_reads_them(
        environ: dict[str, str], expected: str) -> None:
    # Two levels used to give "a}/x" (a stray brace) or the literal "${B:-c/x", silently.
    assert expand("${A:-${B:-${C}}}/x", environ, where="agent.command",
                  file="c.toml") == expected


def test_a_variable_whose_default_is_never_closed_is_a_config_error() -> None:
    # `${A:-${B}`: the `}` is B's, and A's is missing; it used to pass on `${A:-b`.
    with pytest.raises(ConfigError, match=r"agent.command: \$\{A is not closed"):
        expand("${A:-${B}", {"B": "b"}, where="agent.command", file="c.toml")


@pytest.mark.parametrize(("text", "field"), [
    ("[[proxy]]\ncommand = 'p'\noptions = { level = 1 }", "proxy[0].options"),
    ("[[proxy]]\nuse = 'redact'\ncwd = 'work'", "proxy[0].cwd"),
    ("[[proxy]]\nuse = 'redact'\ndialect = 'spec'", "proxy[0].dialect"),
    ("[[mcp_server]]\nname = 'm'\nargs = ['-v']", "mcp_server[0].command"),
    ("[[mcp_server]]\nname = 'm'\ntype = 'http'", "mcp_server[0].url"),
    ("[[mcp_server]]\nname = 'm'\ncommand = 'sh'\nheaders = { A = 'b' }",
     "mcp_server[0].headers"),
    ("[[mcp_server]]\nname = 'm'\ntype = 'sse'\nurl = 'http://h/'\nenv = { A = 'b' }",
     "mcp_server[0].env"),
    ("[[proxy]]\nname = 't'\nuse = 'redact'\n[[mcp_server]]\nname = 'm'\ntype = 'acp'\n"
     "provider = 't'\nargs = ['-v']", "mcp_server[1].args"),
])
def test_a_key_that_does_not_fit_its_entry_is_named_by_its_key_path(
        tmp_path: Path, text: str, field: str) -> None:
    # "proxy[0]: options are for plugin proxies" leaves the reader to find the key; the
    # error names it, as every other problem does.
    text += "\n[agent]\ncommand = 'a'\n"
    if "mcp_server[1]" in field:
        text = "[[mcp_server]]\nname = 'first'\ncommand = 'sh'\n" + text
    message = problem(tmp_path, text)
    assert f"c.toml: {field}:" in message


def test_an_mcp_server_whose_absolute_command_does_not_exist_is_a_config_error(
        tmp_path: Path) -> None:
    # Like a bare name not on PATH or a relative path that is not there: the agent would
    # be given a server it cannot start, and say so (if at all) far from the chain file.
    message = problem(tmp_path, f"""
        [agent]
        command = "agent"
        [[mcp_server]]
        name = "files"
        command = "{tmp_path}/bin/mcp-files"
    """)
    assert f"c.toml: mcp_server[0].command: command not found: {tmp_path}/bin/mcp-files" \
        in message


def test_an_mcp_server_command_with_its_arguments_in_it_is_told_to_use_args(
        tmp_path: Path) -> None:
    message = problem(tmp_path, """
        [agent]
        command = "agent"
        [[mcp_server]]
        name = "files"
        command = "sh -c true"
    """)
    assert "c.toml: mcp_server[0].command: command not found: sh -c true" in message
    assert "args" in message


def test_env_written_as_a_list_is_told_to_write_a_table(tmp_path: Path) -> None:
    message = problem(tmp_path, """
        [agent]
        command = "python"
        env = ["API_KEY=1"]
    """)
    assert "c.toml: agent.env:" in message
    assert 'hint: write a table: { NAME = "value" }' in message


@pytest.mark.parametrize("value", ["${HOME", "${HOME/bin", "prefix-${API_KEY"])
def test_a_variable_reference_never_closed_is_a_config_error_not_passed_on_literally(
        tmp_path: Path, value: str) -> None:
    # A missing `}` used to send the agent the text `${HOME` as the variable's value.
    message = problem(tmp_path, f"""
        [agent]
        command = "python"
        env = {{ K = "{value}" }}
    """)
    assert "c.toml: agent.env.K:" in message and "is not closed" in message
    assert "hint: write ${" in message


def test_a_shell_expression_in_braces_is_still_passed_on_for_the_shell(tmp_path: Path) -> None:
    # `${1}` or `${HOME%/}` are not the conductor's to expand: a shell the command runs
    # expands them.
    assert expand("echo ${1} ${HOME%/}", {}, where="agent.command", file=None) == \
        "echo ${1} ${HOME%/}"


@pytest.mark.parametrize("command", ['""', "[]", '"   "'])
def test_an_empty_command_is_told_what_to_write(tmp_path: Path, command: str) -> None:
    message = problem(tmp_path, f"""
        [agent]
        command = {command}
    """)
    assert "c.toml: agent.command: command is empty (hint: give the program" in message


def test_every_problem_of_one_component_is_reported_at_once(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # Each used to hide the ones after it: fix one, run again, meet the next.
    for name in ("UNSET_A", "UNSET_B", "UNSET_C", "UNSET_D"):
        monkeypatch.delenv(name, raising=False)
    message = problem(tmp_path, """
        [agent]
        command = "./missing-agent"
        env = { A = "${UNSET_A}", B = "${UNSET_B}" }
        cwd = "missing-dir"

        [[mcp_server]]
        name = "files"
        command = "${UNSET_C}"
        env = { D = "${UNSET_D}" }
    """)
    for field in ("agent.command", "agent.env.A", "agent.env.B", "agent.cwd",
                  "mcp_server[0].command", "mcp_server[0].env.D"):
        assert f"  {field}: " in message, field


@pytest.mark.parametrize(("line", "said"), [
    ('env = { "A=B" = "x" }', "agent.env: 'A=B' cannot be an environment variable's name"),
    ('env = { "" = "x" }', "agent.env: '' cannot be an environment variable's name"),
    ('env = { A = "x\\u0000y" }', "agent.env: A's value has a NUL character"),
    ('cwd = "a\\u0000b"', "agent.cwd: it has a NUL character"),
])
def test_an_environment_no_process_can_be_given_is_a_config_error(
        tmp_path: Path, line: str, said: str) -> None:
    # Before, the first two and the NUL were a start failure ("illegal environment variable
    # name", "embedded null byte") naming neither file nor key, and an empty name was dropped.
    message = problem(tmp_path, f"""
        [agent]
        command = "my-agent"
        {line}
    """)
    assert f"c.toml: {said}" in message


@pytest.mark.parametrize("command", ['"my-agent\\u0000"', '["my-agent", "a\\u0000"]'])
def test_a_command_with_a_nul_character_is_a_config_error(tmp_path: Path, command: str) -> None:
    message = problem(tmp_path, f"""
        [agent]
        command = {command}
    """)
    assert "c.toml: agent.command: it has a NUL character" in message


@pytest.mark.parametrize(("key", "meant"), [
    ("cmd", "command"), ("COMMAND", "command"), ("CWD", "cwd"), ("URL", "url")])
def test_an_abbreviated_or_capitalised_key_is_told_the_key_it_means(
        tmp_path: Path, key: str, meant: str) -> None:
    # `cmd` was told "did you mean 'cwd'?" (nearest by letters), and capitals got no hint.
    message = problem(tmp_path, f"""
        [agent]
        command = "my-agent"
        {key} = "x"
    """)
    assert f"agent.{key}: unknown key '{key}' (hint: did you mean '{meant}'?)" in message


@pytest.mark.parametrize("command", ['["${EMPTY_PROGRAM}", "--acp"]', '"${EMPTY_PROGRAM} --acp"',
                                     '"${UNSET_PROGRAM:-}"'])
def test_a_program_that_expands_to_nothing_is_a_config_error_naming_it(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, command: str) -> None:
    # It was a start failure naming neither file nor key: "cannot execute : Permission denied".
    monkeypatch.setenv("EMPTY_PROGRAM", "")
    monkeypatch.delenv("UNSET_PROGRAM", raising=False)
    message = problem(tmp_path, f"""
        [agent]
        command = {command}
    """)
    assert "c.toml: agent.command: the program is empty once its variables are expanded" \
        in message


@pytest.mark.parametrize(("headers", "field", "said"), [
    ('{ B = "café" }', "agent.headers.B", "its value is not printable ASCII"),
    ('{ B = "${HEADER_VALUE}" }', "agent.headers.B", "its value is not printable ASCII"),
    ('{ "B C" = "z" }', "agent.headers.B C", "'B C' is not a header name"),
    # An empty token leaves "Bearer ": it was "cannot connect ...: Illegal header value".
    ('{ Authorization = "Bearer ${EMPTY_TOKEN}" }', "agent.headers.Authorization",
     "its value begins or ends with a space"),
])
def test_a_header_no_http_request_can_carry_is_a_config_error_naming_it(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, headers: str, field: str,
        said: str) -> None:
    # Non-ASCII was "internal error: UnicodeEncodeError"; a space in a name, or a newline in
    # a value, a failure to connect naming no key.
    monkeypatch.setenv("HEADER_VALUE", "a\nb")
    monkeypatch.setenv("EMPTY_TOKEN", "")
    message = problem(tmp_path, f"""
        [agent]
        url = "wss://build-box:8765/acp"
        headers = {headers}
    """)
    assert f"c.toml: {field}: {said}" in message


@pytest.mark.parametrize(("text", "expected"), [
    ("${AGENT_BIN:-claude-code-acp}", "claude-code-acp"),
    ("${A:-${B:-c}}/x", "c/x"),
    ("${AGENT_BIN}", ""),  # no default: set empty is what it is
])
def test_a_variable_set_empty_takes_its_default_as_a_shell_gives_it(
        text: str, expected: str) -> None:
    # `${VAR:-default}` is the default when VAR is unset or empty, in every shell; an
    # exported-but-empty AGENT_BIN gave "", then "the program is empty ... or give a default"
    # for a command that gives one.
    environ = {"AGENT_BIN": "", "A": "", "B": ""}
    assert expand(text, environ, where="agent.command", file="c.toml") == expected


def test_a_program_and_a_cwd_written_from_home_are_taken_from_home(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # `~/bin/agent` was taken as a folder named `~` beside the chain file: "not found".
    home = tmp_path / "home"
    (home / "bin").mkdir(parents=True)
    (home / "bin" / "agent").write_text("#!/bin/sh\n", encoding="utf-8")
    monkeypatch.setenv("HOME", str(home))
    config = read_chain(write(tmp_path, '[agent]\ncommand = "~/bin/agent --x"\ncwd = "~"\n'))
    spec = config.agent
    assert spec is not None
    assert component_argv(spec, file=config.source, where="agent",
                          base_dir=config.base_dir) == [str(home / "bin" / "agent"), "--x"]
    assert component_cwd(spec, config, where="agent") == str(home)
    (home / "bin" / "mcp").write_text("#!/bin/sh\n", encoding="utf-8")
    (home / "bin" / "mcp").chmod(0o755)
    config = read_chain(write(tmp_path, '[[mcp_server]]\nname = "m"\ncommand = "~/bin/mcp"\n'
                                        '[agent]\ncommand = "true"\n'))
    assert [s.command for s in mcp_servers(config)] == [str(home / "bin" / "mcp")]
    # a `~` a variable holds is the variable's: a shell does not expand it either
    monkeypatch.setenv("AGENT", "~/bin/agent")
    config = read_chain(write(tmp_path, '[agent]\ncommand = "${AGENT}"\n'))
    assert config.agent is not None
    with pytest.raises(ConfigError, match="~/bin/agent not found"):
        component_argv(config.agent, file=config.source, where="agent",
                       base_dir=config.base_dir)


def test_a_missing_program_on_the_command_line_is_named_relative_to_the_current_folder(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # There is no chain file: the error said "relative to ..., the chain file's folder".
    monkeypatch.chdir(tmp_path)
    config = chain_from_commands(["./agent"], with_agent=True)
    assert config.agent is not None
    with pytest.raises(ConfigError) as e:
        component_argv(config.agent, file=config.source, where="agent",
                       base_dir=config.base_dir)
    assert str(e.value) == (f"<command line>: agent.command: ./agent not found (relative to "
                            f"{tmp_path}, the current folder) (hint: give a path relative "
                            "to the current folder, or an absolute one)")
