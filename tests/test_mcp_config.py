"""Chain-file MCP settings: acp servers a proxy provides, `required`, and `mcp_bridge`."""

from __future__ import annotations

from typing import Any

import pytest

from conductor.config import MCP_REQUESTED_ENV, parse_chain
from conductor.errors import ConfigError
from conductor.plan import ask_providers as _ask_providers
from conductor.plan import plan_chain as _plan
from conductor.plugins import Proxy

AGENT = {"command": ["/bin/true"]}


def chain(**data: Any) -> dict[str, Any]:
    return {"agent": AGENT, **data}


def test_an_acp_server_needs_its_provider() -> None:
    with pytest.raises(ConfigError, match=r"mcp_server\[0\]\.provider: an acp MCP server "
                       "needs `provider`"):
        parse_chain(chain(mcp_server=[{"name": "t", "type": "acp"}]))


def test_the_provider_must_be_a_proxy_of_the_chain() -> None:
    with pytest.raises(ConfigError, match=r"mcp_server\[0\]\.provider: provider 'tools' is "
                       "not a proxy of this chain"):
        parse_chain(chain(mcp_server=[{"name": "t", "type": "acp", "provider": "tools"}]))


def test_only_acp_servers_have_a_provider() -> None:
    with pytest.raises(ConfigError, match="only acp MCP servers have a provider"):
        parse_chain(chain(proxy=[{"name": "p", "command": "x"}], mcp_server=[
            {"name": "t", "command": "/bin/t", "provider": "p"}]))


def test_a_plugin_provider_must_offer_the_named_server_and_is_asked_for_it() -> None:
    config = parse_chain(chain(proxy=[{"name": "tools", "use": "session-tools"}],
                               mcp_server=[{"name": "nope", "type": "acp",
                                            "provider": "tools"}]))
    with pytest.raises(ConfigError, match="offers no MCP server named 'nope' "
                       r"\(it offers: session-tools\)"):
        _ask_providers(config, _plan(config, "agent"))
    config = parse_chain(chain(proxy=[{"name": "tools", "use": "session-tools"}],
                               mcp_server=[{"name": "session-tools", "type": "acp",
                                            "provider": "tools", "required": True}]))
    plan = _plan(config, "agent")
    _ask_providers(config, plan)
    assert plan[0][2].mcp_requested == {"session-tools"}  # type: ignore[union-attr]


def test_a_command_provider_is_told_what_the_chain_asks_of_it_and_no_other_component_is(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(MCP_REQUESTED_ENV, '["inherited"]')  # a nested conductor's own
    config = parse_chain(chain(proxy=[{"name": "guard", "command": ["/bin/cat"]},
                                      {"name": "other", "command": ["/bin/cat"]}],
                               mcp_server=[{"name": "permissions", "type": "acp",
                                            "provider": "guard"}]))
    envs = [launch.env or {} for _, _, launch in _plan(config, "agent")]  # type: ignore[union-attr]
    assert [env.get(MCP_REQUESTED_ENV) for env in envs] == ['["permissions"]', None, None]


def test_mcp_bridge_takes_four_values() -> None:
    assert parse_chain(chain()).conductor.mcp_bridge == "auto"
    assert parse_chain(chain(conductor={"mcp_bridge": "stdio"})).conductor.mcp_bridge == "stdio"
    with pytest.raises(ConfigError, match=r"conductor\.mcp_bridge"):
        parse_chain(chain(conductor={"mcp_bridge": "ws"}))



class OffersNoTools(Proxy):
    """Cannot say which MCP servers it offers."""

    def mcp_servers(self) -> list[Any]:
        raise ValueError("no tools configured")


def test_a_provider_whose_mcp_servers_raises_is_a_chain_error_naming_it() -> None:
    # It was "acp-conductor: internal error: ValueError: no tools configured" (exit 1).
    config = parse_chain(chain(proxy=[{"name": "tools", "plugin": f"{__name__}:OffersNoTools"}],
                               mcp_server=[{"name": "t", "type": "acp", "provider": "tools"}]))
    with pytest.raises(ConfigError, match=r"mcp_server\[0\]\.provider: proxy 'tools': "
                       "mcp_servers failed: ValueError: no tools configured"):
        _ask_providers(config, _plan(config, "agent"))
