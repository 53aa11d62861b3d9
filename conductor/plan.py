"""A chain file resolved into what serving it starts, in order (before anything starts).

Every command's argv, environment and working directory is resolved and every plugin
loaded here, so that a chain that cannot start fails before any component does. Light on
purpose: it runs while the serving path is still importing (`early_start.py`).
"""

from __future__ import annotations

import re
import sys
from contextlib import contextmanager, redirect_stdout
from typing import TYPE_CHECKING, Any, TypeAlias, TypeGuard, TypeVar

import msgspec

from conductor.config import (
    MCP_REQUESTED_ENV,
    PROXY_NAME_ENV,
    ChainConfig,
    ComponentSpec,
    component_argv,
    component_cwd,
    component_environment,
    component_headers,
    load_chain,
    mcp_servers,
    remote_url,
)
from conductor.errors import ChainShapeError, ConductorError, ConfigError, PluginError
from conductor.record import Record
from conductor.routing.roles import Role
from conductor.supervise.spawn import LaunchSpec

if TYPE_CHECKING:
    import os
    from collections.abc import Callable, Iterator

    from conductor.plugins.api import Proxy


T = TypeVar("T")


def _each(found: list[ConductorError], resolve: Callable[[], T]) -> T | None:
    """What `resolve` gives, or None with its error added to `found`: the parts of a
    component after it are still resolved, so every problem is reported at once."""
    try:
        return resolve()
    except ConfigError as e:
        found.append(e)
        return None


def _launch_spec(spec: ComponentSpec, name: str, where: str, config: ChainConfig,
                 grace: float, *, proxy: bool = False) -> LaunchSpec:
    found: list[ConductorError] = []
    argv = _each(found, lambda: component_argv(spec, file=config.source, where=where,
                                               base_dir=config.base_dir))
    env = _each(found, lambda: component_environment(spec, file=config.source, where=where))
    cwd = _each(found, lambda: component_cwd(spec, config, where=where))
    if found:
        raise ConfigError.combine(found, config.source)
    assert argv is not None
    assert env is not None
    # A provider run as a command is told which of its opt-in servers the chain asks for
    # (in-process ones are told by `ask_providers`).
    requested = [s.name for s in config.mcp_server if s.type == "acp" and s.provider == name]
    env.pop(MCP_REQUESTED_ENV, None)
    if requested:
        env[MCP_REQUESTED_ENV] = msgspec.json.encode(requested).decode()
    env.pop(PROXY_NAME_ENV, None)
    if proxy:
        env[PROXY_NAME_ENV] = name
    return LaunchSpec(
        name=name, argv=argv, env=env, cwd=cwd,
        shutdown_grace=spec.shutdown_grace if spec.shutdown_grace is not None else grace,
    )


class RemoteSpec(Record, frozen=True):
    """A component reached over the network (`url = ...`), with its headers resolved."""

    name: str
    url: str
    headers: dict[str, str]

    @property
    def shown(self) -> str:
        """The url for logs and traces: no query string, no credentials."""
        scheme, _, rest = self.url.partition("://")
        # The authority ends at the first /, ? or #: a url without a path may carry a query.
        parts = re.match(r"([^/?#]*)([^?#]*)", rest)
        assert parts is not None  # both groups may be empty: every string matches
        authority, path = parts.groups()
        return f"{scheme}://{authority.rsplit('@', 1)[-1]}{path}"


def _remote_spec(spec: ComponentSpec, name: str, where: str, config: ChainConfig) -> RemoteSpec:
    # `${VAR}` in the url too: a host or port from the environment, like its headers' token.
    found: list[ConductorError] = []
    url = _each(found, lambda: remote_url(spec, file=config.source, where=where))
    headers = _each(found, lambda: component_headers(spec, file=config.source, where=where))
    if found:
        raise ConfigError.combine(found, config.source)
    assert url is not None
    assert headers is not None
    return RemoteSpec(name, url, headers)


if TYPE_CHECKING:
    Planned: TypeAlias = LaunchSpec | Proxy[Any] | RemoteSpec
    Plan: TypeAlias = list[tuple[Role, ComponentSpec, Planned]]


def _resolve(config: ChainConfig, mode: str | None, *, plugins: bool = True,
             ) -> tuple[Plan, list[ConductorError]]:
    """The plan, and every problem found making it (not only the first). `mode` None: a
    partial chain (`ChainShapeError.partial`), whose well-formed entries alone are resolved
    and which is not checked against a mode. `plugins` False: in-process proxies are left
    out, unloaded (the commands alone, to start early)."""
    grace = config.conductor.shutdown_grace
    plan: Plan = []
    found: list[ConductorError] = []

    @contextmanager
    def collected() -> Iterator[None]:
        try:
            yield
        except (ConfigError, PluginError) as e:
            found.extend(e.problems if isinstance(e, ConfigError) and e.problems else [e])

    for i, (spec, name) in enumerate(zip(config.proxy, config.proxy_names(), strict=True)):
        if f"proxy[{i}]" in config.malformed:
            continue
        with collected():
            if spec.in_process and not plugins:
                continue
            if spec.in_process:
                # Plugins, and pydantic for their options, are imported only when a chain
                # has one: serving a chain of commands imports neither.
                from conductor.plugins.registry import load_component_proxy

                plan.append((Role.PROXY, spec, load_component_proxy(
                    spec, name, file=config.source, where=f"proxy[{i}]",
                    base_dir=config.base_dir)))
            elif spec.remote:
                plan.append((Role.PROXY, spec,
                             _remote_spec(spec, name, f"proxy[{i}]", config)))
            else:
                plan.append((Role.PROXY, spec,
                             _launch_spec(spec, name, f"proxy[{i}]", config, grace,
                                          proxy=True)))
    if mode == "agent" and config.agent is None:
        found.append(ConfigError("the chain has no agent", file=config.source,
                                 field="agent", hint="add an [agent] table with a command"))
    elif mode == "proxy" and config.agent is not None:
        found.append(ConfigError("a chain run as a proxy ends at its successor, not an agent",
                                 file=config.source, field="agent",
                                 hint="remove the [agent] table, or run it as an agent "
                                      "chain (without `proxy` or `serve --as-proxy`)"))
    elif config.agent is not None and not config.agent.in_process:
        with collected():
            plan.append((Role.AGENT, config.agent,
                         _remote_spec(config.agent, config.agent_name(), "agent", config)
                         if config.agent.remote else
                         _launch_spec(config.agent, config.agent_name(), "agent", config,
                                      grace)))
    with collected():
        mcp_servers(config)  # resolved again by serve_chain; checked here to report it too
    return plan, found


def read_chain(ref: str | os.PathLike[str]) -> ChainConfig:
    """`load_chain`, for a chain about to be served: when the file's shape is wrong, the same
    error also names what its well-formed entries would meet at start-up (an unknown plugin,
    its options, an unset `${VAR}`, a missing command), so one run reports every problem.
    A well-shaped file costs nothing more: it is resolved when it is served.

    Raises:
        ConfigError: as `load_chain`.
    """
    try:
        return load_chain(ref)
    except ChainShapeError as e:
        if e.partial is None:
            raise
        # A plugin imported here may print: never onto the protocol stdout.
        with redirect_stdout(sys.stderr):
            _, found = _resolve(e.partial, None)
        if not found:
            raise
        raise ConfigError.combine([*(e.problems or [e]), *found], e.file) from None


def ask_providers(config: ChainConfig, plan: Plan) -> None:
    """`[[mcp_server]]` entries of type acp: an in-process provider is asked to declare
    them (its opt-in servers), and must offer one by that name.

    Raises:
        ConfigError: the provider offers no MCP server by that name (or its
            `mcp_servers` raised).
    """
    plugins = {launch.name: launch for _, _, launch in plan if is_plugin(launch)}
    for i, server in enumerate(config.mcp_server):
        proxy = plugins.get(server.provider or "") if server.type == "acp" else None
        if proxy is None:
            continue  # a subprocess provider declares its own; only `required` applies
        try:
            offered = [o.declared_name for o in proxy.offered_mcp_servers()]
        except Exception as e:  # the plugin's hook: its failure, naming it (not ours)
            raise ConfigError(f"proxy {proxy.name!r}: mcp_servers failed: "
                              f"{type(e).__name__}: {e}", file=config.source,
                              field=f"mcp_server[{i}].provider",
                              hint="fix the proxy's mcp_servers()") from None
        if server.name not in offered:
            raise ConfigError(f"proxy {proxy.name!r} offers no MCP server named "
                              f"{server.name!r} (it offers: {', '.join(offered) or 'none'})",
                              file=config.source, field=f"mcp_server[{i}].name",
                              hint="use one of the names it offers")
        proxy.mcp_requested = proxy.mcp_requested | {server.name}


def plan_chain(config: ChainConfig, mode: str, *, plugins: bool = True) -> Plan:
    """What serving `config` in `mode` starts, in order (what `serve_chain` does first);
    with `plugins` False, without its in-process proxies (which are not loaded).

    Raises:
        ConfigError: a variable is unset, plugin options are invalid, or the chain does not
            fit the mode.
        PluginError: a plugin cannot be found or is not a Proxy.
    """
    plan, found = _resolve(config, mode, plugins=plugins)
    if found:
        raise ConfigError.combine(found, config.source)
    return plan


def is_plugin(launch: Planned) -> TypeGuard[Proxy[Any]]:
    return not isinstance(launch, LaunchSpec | RemoteSpec)
