"""Remote components in chain files, and `serve`'s exposure rules: every mistake is refused
before anything starts, naming the field and a fix."""

from __future__ import annotations

import pytest

from conductor.config import component_headers, parse_chain
from conductor.errors import ConfigError
from conductor.listen import ListenSettings, check_exposure, is_loopback

TOKEN = "t" * 32


def test_a_remote_agent_takes_a_url_and_headers_with_variables(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AGENT_TOKEN", "sekrit")
    config = parse_chain({"agent": {"url": "wss://box:8765/acp",
                                    "headers": {"Authorization": "Bearer ${AGENT_TOKEN}"}}})
    assert config.agent is not None and config.agent.remote and not config.agent.in_process
    assert component_headers(config.agent, file=None, where="agent") == {
        "Authorization": "Bearer sekrit"}


@pytest.mark.parametrize(("agent", "message"), [
    ({"url": "https://box/acp"}, "agent.url: 'https://box/acp' is not a ws:// or wss://"),
    ({"url": "wss://box/acp", "command": "x"}, "give exactly one of command, use, plugin, url"),
    ({"command": "x", "headers": {"A": "b"}}, "only a remote component"),
    ({"url": "wss://box/acp", "env": {"A": "b"}}, "a remote one gets `headers`"),
])
def test_a_malformed_remote_component_is_refused_by_field(agent: dict[str, object],
                                                          message: str) -> None:
    with pytest.raises(ConfigError) as refused:
        parse_chain({"agent": agent}, file="c.toml")
    assert message in str(refused.value)


def test_an_unset_header_variable_names_the_header(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("NOPE_TOKEN", raising=False)
    config = parse_chain({"proxy": [{"url": "ws://127.0.0.1:1/acp",
                                     "headers": {"Authorization": "${NOPE_TOKEN}"}}],
                          "agent": {"command": "x"}}, file="c.toml")
    with pytest.raises(ConfigError) as refused:
        component_headers(config.proxy[0], file="c.toml", where="proxy[0]")
    assert "proxy[0].headers.Authorization: environment variable NOPE_TOKEN is not set" \
        in str(refused.value)


@pytest.mark.parametrize(("settings", "message"), [
    (ListenSettings(host="0.0.0.0", tokens=(TOKEN,)), "without TLS"),
    (ListenSettings(host="192.168.1.5", tokens=(), certfile="c", keyfile="k"),
     "a token is required"),
    (ListenSettings(certfile="c"), "both a certificate and its key"),
    (ListenSettings(tokens=("short",)), "too easy to guess"),
])
def test_serve_refuses_an_unsafe_exposure(settings: ListenSettings, message: str) -> None:
    with pytest.raises(ConfigError) as refused:
        check_exposure(settings)
    assert message in str(refused.value)


def test_loopback_without_a_token_and_an_exposed_address_with_tls_and_token_are_allowed(
        ) -> None:
    check_exposure(ListenSettings(host="127.0.0.1", tokens=()))
    check_exposure(ListenSettings(host="::", tokens=(TOKEN,), certfile="c", keyfile="k"))
    assert is_loopback("localhost") and is_loopback("::1") and not is_loopback("example.org")
