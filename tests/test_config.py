"""Chain files: default names, and errors that report every problem at once."""

from __future__ import annotations

import pytest

from conductor.config import parse_chain
from conductor.errors import ConfigError
from conductor.serve import _plan

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
