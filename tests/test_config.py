"""Chain files: default names, and errors that report every problem at once."""

from __future__ import annotations

from conductor.config import parse_chain

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
