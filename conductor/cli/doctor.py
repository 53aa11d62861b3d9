"""`acp-conductor doctor`: will the chain start in the environment an editor gives it?

Static checks only (nothing is started; `check` starts the chain): Python, where
`acp-conductor` is and whether PATH finds it, every component's program on PATH, node for
npm agents, the remote extra for `url` components, the variables the chain references,
and that trace and log files can be written. One `ok` / `warn` / `fail` line each; exit 1
when anything fails.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING

import click

from conductor.cli.context import global_options, globals_of, handle_errors
from conductor.errors import ConductorError, ConfigError
from conductor.record import Record

if TYPE_CHECKING:
    from conductor.config import ChainConfig, ComponentSpec

# What an app started from the desktop gets on macOS (launchd), whatever the shell exports.
MINIMAL_PATH = "/usr/bin:/bin:/usr/sbin:/sbin"
_KEPT = ("HOME", "USER", "LOGNAME", "TMPDIR", "LANG", "SHELL")
NODE_PROGRAMS = {"npx", "node", "npm", "pnpm", "pnpx", "yarn"}
NODE_MIN = 18


class Finding(Record, frozen=True):
    status: str  # "ok", "warn" or "fail"
    subject: str
    detail: str


def _which(program: str, environ: dict[str, str]) -> str | None:
    return shutil.which(program, path=environ.get("PATH", ""))


def python_findings() -> list[Finding]:
    # The package requires 3.11 (pip refuses older), so running at all means it is fine.
    version = ".".join(map(str, sys.version_info[:3]))
    return [Finding("ok", "python", f"{version} at {sys.executable}")]


def conductor_findings(environ: dict[str, str]) -> list[Finding]:
    """Editors start `acp-conductor` by name: is it this one, and on the PATH they use?"""
    from importlib.metadata import PackageNotFoundError, version

    try:
        mine = f"acp-conductor {version('acp-conductor')}"
    except PackageNotFoundError:
        mine = "acp-conductor (not installed: running from a checkout)"
    here = Path(sys.executable).parent / "acp-conductor"
    found = _which("acp-conductor", environ)
    if found is None:
        where = f" at {here}" if here.exists() else ""
        return [Finding("warn", "acp-conductor",
                        f"{mine}{where} is not on PATH: an editor that starts `acp-conductor` "
                        "by name will not find it; give the editor its absolute path, or "
                        "install it with pipx or `uv tool install` (docs/install.md)")]
    if here.exists() and os.path.realpath(found) != os.path.realpath(here):
        return [Finding("warn", "acp-conductor",
                        f"PATH finds {found}, not this {mine} ({here}); an editor would "
                        "start that one")]
    return [Finding("ok", "acp-conductor", f"{mine}, on PATH at {found}")]


def _program_findings(name: str, argv0: str, spec: ComponentSpec, config: ChainConfig,
                      environ: dict[str, str]) -> list[Finding]:
    from conductor.config import relative_to_chain

    if "/" in argv0:
        path = argv0 if os.path.isabs(argv0) or not config.base_dir else \
            os.path.join(config.base_dir, argv0)
        if os.access(path, os.X_OK) and os.path.isfile(path):
            return [Finding("ok", name, f"runs {path}")]
        where = "" if os.path.isabs(argv0) else \
            f" ({relative_to_chain(config.base_dir, config.source)})"
        if os.path.isfile(path):  # there, but the conductor could not start it
            return [Finding("fail", name, f"{argv0}{where} is not executable; make it so "
                                          f"(chmod +x {path}), or start it through its "
                                          "interpreter (command = [\"python3\", ...])")]
        what = "is a directory" if os.path.isdir(path) else "does not exist"
        return [Finding("fail", name, f"{argv0}{where} {what}; give the path of the "
                                      "program in the chain file")]
    found = _which(argv0, environ)
    if found is None:
        return [Finding("fail", name, f"`{argv0}` is not on PATH "
                                      f"({environ.get('PATH', '')}); give its absolute path "
                                      "in the chain file, or add its folder to the PATH the "
                                      "editor starts the conductor with")]
    out = [Finding("ok", name, f"`{argv0}` is {found}")]
    if os.path.basename(argv0) in NODE_PROGRAMS:
        out.append(_node_finding(name, environ))
    return out


def _own_path(spec: ComponentSpec, environ: dict[str, str], *, file: str | None,
              where: str) -> dict[str, str]:
    """The environment a component's program is looked up in: with the PATH of its `env`,
    when it sets one (the component is started with that)."""
    from conductor.config import expand

    if "PATH" not in spec.env:
        return environ
    try:
        path = expand(spec.env["PATH"], environ, where=f"{where}.env.PATH", file=file)
    except ConductorError:
        return environ  # the variable findings say what is unset
    return {**environ, "PATH": path}


def _node_finding(name: str, environ: dict[str, str]) -> Finding:
    node = _which("node", environ)
    if node is None:
        return Finding("fail", "node", f"not on PATH, and {name} is an npm program")
    try:
        done = subprocess.run([node, "--version"], capture_output=True, text=True,
                              timeout=15, env=environ, check=False)
    except (OSError, subprocess.TimeoutExpired) as e:
        return Finding("fail", "node", f"{node} does not run: {e}")
    text = done.stdout.strip()
    major = re.match(r"v(\d+)", text)
    if major is None or int(major.group(1)) < NODE_MIN:
        return Finding("warn", "node", f"{node} is {text or 'of unknown version'}; npm ACP "
                                       f"agents need node {NODE_MIN} or later")
    return Finding("ok", "node", f"{text} at {node}")


def _variable_findings(config: ChainConfig, environ: dict[str, str]) -> list[Finding]:
    """Every `${VAR}` the chain references, and every `secret_env` name."""
    from conductor.config import (
        bare_variable_warning,
        bare_variables,
        unclosed_variable,
        variables,
    )

    texts: list[tuple[str, str]] = []
    verbatim: list[tuple[str, str]] = []  # passed on as written: no shell expands `$NAME`
    secrets: list[tuple[str, str]] = []
    specs = [*((f"proxy[{i}]", p) for i, p in enumerate(config.proxy)),
             *((("agent", config.agent),) if config.agent else ())]
    for where, spec in specs:
        argv = [spec.command] if isinstance(spec.command, str) else spec.command or []
        texts += [(f"{where}.command", a) for a in argv]
        verbatim += [(f"{where}.env.{k}", v) for k, v in spec.env.items()]
        texts += [(f"{where}.cwd", spec.cwd)] if spec.cwd else []
        texts += [(f"{where}.url", spec.url)] if spec.url else []
        verbatim += [(f"{where}.headers.{k}", v) for k, v in spec.headers.items()]
        secrets += [(f"{where}.secret_env", name) for name in spec.secret_env]
    for i, server in enumerate(config.mcp_server):
        values = [server.command or "", *server.args, server.url or ""]
        texts += [(f"mcp_server[{i}]", v) for v in values]
        verbatim += [(f"mcp_server[{i}].env.{k}", v) for k, v in server.env.items()]
        verbatim += [(f"mcp_server[{i}].headers.{k}", v) for k, v in server.headers.items()]
    texts += verbatim
    out: list[Finding] = [Finding("warn", where, bare_variable_warning(bare))
                          for where, value in verbatim if (bare := bare_variables(value))]
    seen: set[str] = set()
    for where, text in texts:
        if (unclosed := unclosed_variable(text)) is not None:
            out.append(Finding("fail", f"${{{unclosed}", f"not closed in {where}: the chain "
                                                         f"will not start; write ${{{unclosed}}}"))
        for name, default in variables(text):
            if name == "PYTHON" or name in seen:
                continue
            seen.add(name)
            if environ.get(name) or (name in environ and default is None):
                out.append(Finding("ok", f"${{{name}}}", f"set (used by {where})"))
            elif default is not None:
                state = "empty" if name in environ else "not set"  # `:-` takes either
                out.append(Finding("ok", f"${{{name}}}", f"{state}; {where} uses its "
                                                         f"default {default!r}"))
                texts.append((where, default))  # then its own `${VAR}`s are needed
            else:
                out.append(Finding("fail", f"${{{name}}}",
                                   f"not set, and {where} needs it: the chain will not start; "
                                   "set it where the editor starts the conductor (its env "
                                   "setting)"))
    for where, name in secrets:
        if name in seen:
            continue
        seen.add(name)
        if name in environ:
            out.append(Finding("ok", name, f"set ({where})"))
        else:
            out.append(Finding("warn", name, f"not set ({where}): the agent needs it unless "
                                             "it has a login of its own"))
    return out


def remote_finding(name: str, url: str) -> Finding:
    """A component at `url` needs the remote extra's client libraries to be reached."""
    from conductor.transport.websocket import REMOTE_EXTRA_HINT

    try:
        import httpx  # noqa: F401
        import httpx_ws  # noqa: F401
    except ImportError:
        return Finding("fail", name, f"remote, at {url}: reaching it needs the remote extra, "
                                     f"which is not installed: {REMOTE_EXTRA_HINT}")
    return Finding("ok", name, f"remote, at {url}")


def chain_findings(path: str, environ: dict[str, str]) -> list[Finding]:
    from conductor.config import component_argv
    from conductor.plan import read_chain
    from conductor.plugins.registry import load_component_proxy

    try:
        config = read_chain(path)
    except ConductorError as e:
        return [Finding("fail", "chain", str(e))]
    out = [Finding("ok", "chain", f"{config.source} reads as a chain file")]
    named = [*((f"proxy[{i}]", p, n) for i, (p, n) in
               enumerate(zip(config.proxy, config.proxy_names(), strict=True))),
             *((("agent", config.agent, config.agent_name()),) if config.agent else ())]
    for where, spec, name in named:
        if spec.in_process:
            try:
                proxy = load_component_proxy(spec, name, file=config.source, where=where,
                                             base_dir=config.base_dir)
            except ConductorError as e:
                out.append(Finding("fail", name, str(e)))
            else:
                out.append(Finding("ok", name, f"in-process {type(proxy).__module__}:"
                                               f"{type(proxy).__qualname__}"))
            continue
        if spec.remote:  # reached over the network: `check` tries the connection
            out.append(remote_finding(name, spec.url or ""))
            continue
        try:
            argv = component_argv(spec, file=config.source, where=where,
                                  base_dir=config.base_dir, environ=environ)
        except ConductorError as e:
            out.append(Finding("fail", name, str(e)))
            continue
        out += _program_findings(name, argv[0], spec, config,
                                 _own_path(spec, environ, file=config.source, where=where))
        if spec.cwd is not None:
            out += _cwd_findings(name, where, spec, config, environ)
    for i, server in enumerate(config.mcp_server):
        if server.command:
            out += _mcp_command_findings(f"mcp_server[{i}]", server.command, config, environ)
    return out + _variable_findings(config, environ)


def _cwd_findings(name: str, where: str, spec: ComponentSpec, config: ChainConfig,
                  environ: dict[str, str]) -> list[Finding]:
    """A missing working directory, found as the chain will (`component_cwd`)."""
    from conductor.config import component_cwd, expand

    assert spec.cwd is not None
    try:
        expand(spec.cwd, environ, where=f"{where}.cwd", file=config.source)
    except ConductorError:
        return []  # the variable findings say what is unset
    try:
        component_cwd(spec, config, where=where, environ=environ)
    except ConfigError as e:
        return [Finding("fail", name, f"cwd {e.message}; {e.hint}")]
    return []


def _mcp_command_findings(where: str, command: str, config: ChainConfig,
                          environ: dict[str, str]) -> list[Finding]:
    """A stdio MCP server's program, looked for as the chain will (`config._mcp_server`)."""
    from conductor.config import expand, relative_to_chain

    try:
        command = expand(os.path.expanduser(command), environ, where=f"{where}.command",
                         file=config.source)
    except ConductorError:
        return []  # the variable findings say what is unset
    if "/" in command:  # a path, as a shell would see it; a relative one from the chain's
        relative = not os.path.isabs(command) and config.base_dir
        path = os.path.normpath(os.path.join(config.base_dir or "", command))
        if os.path.isfile(path) and os.access(path, os.X_OK):
            return [Finding("ok", where, f"`{command}` is {path}")]
        shown = f"{command} ({relative_to_chain(config.base_dir, config.source)})" \
            if relative else command
        return [Finding("fail", where, f"{shown} is not an executable file; give the path of "
                                       "the MCP server's program in the chain file")]
    found = _which(command, environ)
    if found is None:
        return [Finding("fail", where, f"`{command}` is not on PATH ({environ.get('PATH', '')})"
                                       "; give its absolute path in the chain file, or add "
                                       "its folder to the PATH the editor starts the "
                                       "conductor with")]
    return [Finding("ok", where, f"`{command}` is {found}")]


def file_findings(trace: str | None, log_file: str | None) -> list[Finding]:
    """Where traces and logs go must be writable (a trace is what shows a hang)."""
    targets = [("--trace", trace), ("--log-file", log_file)]
    given = [(option, Path(p)) for option, p in targets if p]
    if not given:
        temp = tempfile.gettempdir()
        ok = os.access(temp, os.W_OK)
        return [Finding("ok" if ok else "warn", "traces",
                        f"{temp} is {'' if ok else 'not '}writable "
                        f"(e.g. --trace {os.path.join(temp, 'acp-trace.jsonl')})")]
    out = []
    for option, path in given:
        folder = path.parent if str(path.parent) else Path()
        if not folder.is_dir():
            out.append(Finding("fail", option, f"{folder} does not exist"))
        elif not os.access(folder, os.W_OK):
            out.append(Finding("fail", option, f"{folder} is not writable"))
        else:
            out.append(Finding("ok", option, f"{path} can be written"))
    return out


def editor_environment(minimal: bool) -> dict[str, str]:
    if not minimal:
        return dict(os.environ)
    env = {k: os.environ[k] for k in _KEPT if k in os.environ}
    env["PATH"] = MINIMAL_PATH
    return env


@click.command("doctor")
@click.option("--minimal-env", is_flag=True,
              help="Check with the environment an app started from the desktop gets (macOS "
                   f"Dock or Finder): PATH={MINIMAL_PATH} and none of your shell's exports.")
@global_options
@click.pass_context
@handle_errors
def doctor_command(ctx: click.Context, minimal_env: bool) -> None:
    """Check the environment an editor will start the conductor in (nothing is started).

    \b
    acp-conductor doctor --chain chain.toml
    acp-conductor doctor --chain chain.toml --minimal-env    as a desktop app sees it

    Python, acp-conductor on PATH, every component's program (and node for npm agents),
    the variables the chain references, and where traces and logs go. Exits 1 when a
    check fails, 0 otherwise (warnings included). `check` then starts the chain.
    """
    options = globals_of(ctx)
    environ = editor_environment(minimal_env)
    findings = [*python_findings(), *conductor_findings(environ)]
    if options.chain_file:
        findings += chain_findings(options.chain_file, environ)
    findings += file_findings(options.trace, options.log_file)
    colour = {"ok": "green", "warn": "yellow", "fail": "red"}
    tty = sys.stdout.isatty()
    for f in findings:
        status = f"{f.status:<4}"
        click.echo(f"{click.style(status, fg=colour[f.status]) if tty else status}  "
                   f"{f.subject}: {f.detail}")
    fails = sum(f.status == "fail" for f in findings)
    warns = sum(f.status == "warn" for f in findings)
    click.echo(f"{fails} failed, {warns} warning{'' if warns == 1 else 's'}" + (
        "" if options.chain_file else " (give --chain FILE to check a chain too)"))
    sys.exit(1 if fails else 0)
