"""Chain files: default names, and errors that report every problem at once."""

from __future__ import annotations

import textwrap
from typing import TYPE_CHECKING

import pytest

from conductor.config import mcp_servers, parse_chain
from conductor.errors import ChainShapeError, ConfigError, PluginNotFoundError
from conductor.plan import plan_chain as _plan
from conductor.plan import read_chain

if TYPE_CHECKING:
    from pathlib import Path

AGENT = {"command": "agent"}


def names(*proxies: dict[str, str]) -> list[str]:
    return parse_chain({"proxy": list(proxies), "agent": AGENT}).proxy_names()


def test_a_plugin_proxy_is_named_after_what_it_runs() -> None:
    assert names({"use": "redact"}, {"plugin": "my_pkg.guards:Guard"},
                 {"plugin": "plugins/shout.py"}) == ["redact", "guard", "shout"]


def test_a_command_proxy_keeps_its_position_name() -> None:
    assert names({"use": "redact"}, {"command": "x"}) == ["redact", "proxy:1"]


def test_a_second_proxy_of_the_same_kind_gets_a_suffix() -> None:
    assert names({"use": "redact"}, {"use": "redact"}, {"use": "redact"}) == [
        "redact", "redact-2", "redact-3"]


def test_a_default_name_never_takes_a_name_given_explicitly() -> None:
    assert names({"use": "redact"}, {"name": "redact", "command": "x"}) == [
        "redact-2", "redact"]
    assert parse_chain({"proxy": [{"use": "agent"}], "agent": AGENT}).proxy_names() == [
        "agent-2"]


@pytest.mark.parametrize("name", ["client", "conductor", "successor"])
def test_the_names_the_conductor_gives_its_own_ends_are_refused_for_a_component(
        name: str) -> None:
    # A proxy named "client" drew the editor's lane in traces: "client→client" arrows and
    # requests shown as never answered.
    for table in ("proxy", "agent"):
        spec = {"name": name, "command": "x"}
        data = {"proxy": [spec], "agent": AGENT} if table == "proxy" else {"agent": spec}
        with pytest.raises(ConfigError) as caught:
            parse_chain(data, file="c.toml")
        where = "proxy[0]" if table == "proxy" else "agent"
        assert f"c.toml: {where}.name: {name!r} is the conductor's own name for " in \
            str(caught.value)


def test_a_default_name_steps_aside_for_the_conductors_own() -> None:
    assert names({"plugin": "guards.py:Client"}, {"plugin": "x.py:Conductor"}) == [
        "client-2", "conductor-2"]


def test_every_problem_of_a_chain_files_shape_is_reported_at_once() -> None:
    with pytest.raises(ConfigError) as caught:
        parse_chain({"proxy": [{"nmae": "p", "command": "x"}],
                     "agent": {"comand": "x", "command": "y"}, "agnet": {}}, file="c.toml")
    text = str(caught.value)
    assert text.startswith("c.toml: 3 problems:\n")
    assert "\n  proxy[0].nmae: unknown key 'nmae' (hint: did you mean 'name'?)" in text
    assert "\n  agent.comand: unknown key 'comand' (hint: did you mean 'command'?)" in text
    assert "\n  agnet: unknown key 'agnet' (hint: did you mean 'agent'?)" in text
    assert len(caught.value.problems) == 3


def test_a_key_with_no_near_match_lists_the_keys_accepted_there() -> None:
    with pytest.raises(ConfigError, match=r"agent.zzz: unknown key 'zzz' \(hint: remove it; "
                                          r"accepted here: command, cwd, dialect, env,"):
        parse_chain({"agent": {"command": "y", "zzz": 1}})


def test_every_problem_resolving_a_chain_is_reported_at_once(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("SURELY_UNSET_42", raising=False)
    config = parse_chain({
        "proxy": [{"use": "redcat"},
                  {"use": "permissions", "options": {"defualt": "ask"}}],
        "agent": {"command": "x", "env": {"K": "${SURELY_UNSET_42}"}},
    }, file="c.toml")
    with pytest.raises(ConfigError) as caught:
        _plan(config, "agent")
    lines = str(caught.value).splitlines()
    assert lines[0] == "c.toml: 3 problems:"
    assert lines[1].startswith("  proxy[0].use: no proxy named 'redcat' is installed "
                               "(did you mean 'redact'?")
    assert lines[2] == ("  proxy[1].options.defualt: proxy 'permissions': unknown option "
                        "'defualt' (hint: did you mean 'default'?)")
    assert lines[3].startswith("  agent.env.K: environment variable SURELY_UNSET_42 is not set")
    assert caught.value.exit_code == 2


def test_a_single_problem_stays_one_line() -> None:
    with pytest.raises(ConfigError) as caught:
        parse_chain({"agent": {"comand": "x", "command": "y"}}, file="c.toml")
    assert str(caught.value) == ("c.toml: agent.comand: unknown key 'comand' "
                                 "(hint: did you mean 'command'?)")


def write_chain(tmp_path: Path, text: str) -> Path:
    chain = tmp_path / "c.toml"
    chain.write_text(textwrap.dedent(text), encoding="utf-8")
    return chain


def test_a_misshapen_chain_file_also_reports_what_its_well_formed_entries_would_meet(
        tmp_path: Path) -> None:
    chain = write_chain(tmp_path, """
        [[proxy]]
        use = "permisions"
        [[proxy]]
        use = "redact"
        options = { patern = "x" }
        [agnet]
        command = "python agent.py"
    """)
    with pytest.raises(ConfigError) as caught:
        read_chain(chain)
    lines = str(caught.value).splitlines()
    assert lines[0] == f"{chain}: 3 problems:"
    assert lines[1] == "  agnet: unknown key 'agnet' (hint: did you mean 'agent'?)"
    assert lines[2].startswith("  proxy[0].use: no proxy named 'permisions' is installed "
                               "(did you mean 'permissions'?")
    assert lines[3] == ("  proxy[1].options.patern: proxy 'redact': unknown option 'patern' "
                        "(hint: did you mean 'patterns'?)")
    assert caught.value.exit_code == 2


def test_a_malformed_entry_is_not_resolved_and_its_siblings_keep_their_paths_and_names(
        tmp_path: Path) -> None:
    chain = write_chain(tmp_path, """
        [[proxy]]
        use = "nope"
        colour = "red"
        [[proxy]]
        use = "nope"
        [[proxy]]
        use = "nope"
        options = 3
        [agent]
        command = "x"
    """)
    with pytest.raises(ConfigError) as caught:
        read_chain(chain)
    text = str(caught.value)
    assert "proxy[0].colour: unknown key 'colour'" in text
    assert "proxy[2].options:" in text
    # only the well-formed one is looked up, under the name it has beside its siblings
    assert text.count("no proxy named 'nope'") == 1
    assert "proxy[1].use: no proxy named 'nope'" in text
    assert len(caught.value.problems) == 3


def test_a_misshapen_file_reports_its_agents_and_mcp_servers_problems_too(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("SURELY_UNSET_42", raising=False)
    chain = write_chain(tmp_path, """
        [conductor]
        shutdown_grace = "soon"
        [agent]
        command = "x"
        env = { K = "${SURELY_UNSET_42}" }
        [[mcp_server]]
        name = "files"
        command = "./no-such-mcp-server"
        [[mcp_server]]
        name = "other"
        command = "no-such-mcp-server-either-42"
    """)
    with pytest.raises(ConfigError) as caught:
        read_chain(chain)
    lines = str(caught.value).splitlines()[1:]
    assert [line.split(":")[0].strip() for line in lines] == [
        "conductor.shutdown_grace", "agent.env.K", "mcp_server[0].command",
        "mcp_server[1].command"]
    assert f"./no-such-mcp-server (relative to {tmp_path}" in lines[2]


def test_problems_between_well_formed_entries_are_reported_with_the_shape_problems() -> None:
    with pytest.raises(ChainShapeError) as caught:
        parse_chain({"proxy": [{"name": "p", "command": "x"}, {"name": "p", "command": "y"},
                               {"name": "q", "comand": "z"}],
                     "agent": {"command": "a", "optional": True}}, file="c.toml")
    assert [p.field for p in caught.value.problems] == [
        "proxy[2].comand", "agent.optional", "proxy[1].name"]


def test_a_well_shaped_file_is_read_as_it_is_and_resolved_only_when_served(
        tmp_path: Path) -> None:
    chain = write_chain(tmp_path, """
        [[proxy]]
        use = "nope"
        [agent]
        command = "x"
    """)
    config = read_chain(chain)  # the plugin is looked for when the chain is planned
    assert config.proxy_names() == ["nope"]
    with pytest.raises(PluginNotFoundError):
        _plan(config, "agent")


def test_a_plugin_imported_to_report_a_misshapen_file_cannot_print_on_stdout(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "loud.py").write_text(textwrap.dedent("""
        print("imported")
        from conductor.plugins import Proxy
        class Loud(Proxy):
            '''Loud.'''
    """), encoding="utf-8")
    chain = write_chain(tmp_path, """
        [[proxy]]
        plugin = "loud.py"
        options = { volume = 11 }
        [agnet]
        command = "x"
    """)
    with pytest.raises(ConfigError, match=r"proxy\[0\]\.options\.volume: proxy 'loud'"):
        read_chain(chain)
    out, err = capsys.readouterr()
    assert out == ""
    assert "imported" in err


def test_every_mcp_server_that_cannot_be_resolved_is_reported_at_once() -> None:
    config = parse_chain({"agent": {"command": "a"}, "mcp_server": [
        {"name": "a", "command": "no-such-mcp-server-42"},
        {"name": "b", "command": "no-such-mcp-server-43"}]}, file="c.toml")
    with pytest.raises(ConfigError) as caught:
        mcp_servers(config)
    assert [p.field for p in caught.value.problems] == [
        "mcp_server[0].command", "mcp_server[1].command"]


def test_a_well_typed_file_whose_entries_clash_also_reports_what_resolving_them_finds(
        tmp_path: Path) -> None:
    chain = write_chain(tmp_path, """
        [[proxy]]
        name = "p"
        use = "permisions"
        [[proxy]]
        name = "p"
        command = "x"
        [agent]
        command = "x"
    """)
    with pytest.raises(ConfigError) as caught:
        read_chain(chain)
    lines = str(caught.value).splitlines()
    assert lines[0] == f"{chain}: 2 problems:"
    assert lines[1].startswith("  proxy[1].name: duplicate component name 'p'")
    assert lines[2].startswith("  proxy[0].use: no proxy named 'permisions' is installed")


def test_a_chain_file_that_is_not_utf8_is_a_config_error_naming_the_byte(tmp_path: Path) -> None:
    path = tmp_path / "latin1.toml"
    path.write_bytes(b'[agent]\ncommand = ["caf\xe9"]\n')
    with pytest.raises(ConfigError, match="not UTF-8") as raised:
        read_chain(str(path))
    assert "line 2" in str(raised.value)


def test_a_chain_file_saved_with_a_byte_order_mark_is_read(tmp_path: Path) -> None:
    # Windows editors (Notepad) save UTF-8 with a BOM; it was "Invalid statement (at line
    # 1, column 1)", naming nothing a user can see.
    path = tmp_path / "bom.toml"
    path.write_bytes('\ufeff[agent]\ncommand = "agent"\n'.encode())
    assert read_chain(str(path)).agent is not None


def test_a_proxy_named_agent_is_told_the_name_is_the_agent_s_where_its_name_is_written() -> None:
    # The agent has no `name` key: the fix is the proxy's, so the error names that key.
    with pytest.raises(ConfigError) as caught:
        parse_chain({"proxy": [{"name": "agent", "use": "passthrough"}],
                     "agent": {"command": "x"}}, file="c.toml")
    error = caught.value
    assert error.field == "proxy[0].name", str(error)
    assert "agent" in error.message and "the agent's" in error.message, str(error)
