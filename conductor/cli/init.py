"""`acp-conductor init`: a commented chain file for an agent, or a proxy package to start from.

Nothing is overwritten: an existing file or directory is refused.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import textwrap
from pathlib import Path

import click

from conductor.cli.context import handle_errors
from conductor.errors import ConfigError
from conductor.record import Record


class KnownAgent(Record, frozen=True):
    title: str
    command: str                 # TOML for the `command` value
    secrets: tuple[str, ...]     # API key variables the agent may read
    login: str                   # how to give it credentials


# Checked against the npm registry (`npm view NAME`). The agents inherit the conductor's
# environment (what the editor starts it with), so no `env` table is needed for keys.
AGENTS = {
    "claude-code": KnownAgent(
        "Claude Code", '"npx -y @zed-industries/claude-agent-acp"', ("ANTHROPIC_API_KEY",),
        "log in once with `claude`, or export ANTHROPIC_API_KEY (the package was called "
        "@zed-industries/claude-code-acp before 0.17)"),
    "codex": KnownAgent(
        "Codex", '"npx -y @zed-industries/codex-acp"', ("OPENAI_API_KEY", "CODEX_API_KEY"),
        "log in once with `codex login`, or export OPENAI_API_KEY"),
    "gemini": KnownAgent(
        "Gemini CLI", '"npx -y @google/gemini-cli --acp"', ("GEMINI_API_KEY",),
        "log in once with `gemini`, or export GEMINI_API_KEY (with Gemini CLI 0.33 or later "
        "installed globally, `gemini --acp` starts faster)"),
    "demo": KnownAgent(
        "the built-in demo agent", '["${PYTHON}", "-m", "conductor.demo_agent"]', (),
        "it needs none: it is deterministic and local, for trying chains"),
}

CHAIN = """\
# An acp-conductor chain: {title} behind the conductor.
# Written by `acp-conductor init`; every key is in docs/configuration.md.
#
#   acp-conductor check --chain {file}             start it, initialize it, show each part
#   acp-conductor run --chain {file} "hello"       one turn, from a terminal
#   acp-conductor doctor --chain {file}            what an editor's environment must give it
#
# Your editor starts `acp-conductor --chain {absolute}` where it would start the agent.
# Relative paths in this file are relative to its folder.

# Proxies sit between the editor and the agent, in order from the editor's side. Remove the
# `# ` in front of a block to use it (`acp-conductor proxies` lists what is installed).

# [[proxy]]
# use = "permissions"          # allow / deny / ask rules for tool calls, file and terminal access
# options.default = "ask"      # what the editor is asked when no rule matches
# options.rules = [
#   {{ path = ".env*", action = "deny" }},
#   {{ kind = "read", action = "allow" }},
# ]

# [[proxy]]
# use = "redact"               # scrub secrets from prompts before the agent sees them
# options.env = [{secrets}]    # values of these variables
# options.patterns = ["sk-[A-Za-z0-9_-]{{20,}}"]

# [[proxy]]
# use = "transcript"           # a Markdown and a JSONL transcript of every session
# options.directory = "transcripts"

[agent]
name = "{name}"
command = {command}
{login}
# The agent inherits the conductor's environment; traces redact these variables' values:
secret_env = [{secrets}]
"""


def chain_text(name: str, agent: KnownAgent, file: Path) -> str:
    secrets = ", ".join(json.dumps(s) for s in agent.secrets)
    login = textwrap.fill(f"Credentials: {agent.login}.", width=92, initial_indent="# ",
                          subsequent_indent="# ")
    # shell-quoted: the comment's commands are for pasting into a terminal
    return CHAIN.format(title=agent.title, file=shlex.quote(str(file)),
                        absolute=shlex.quote(str(file.resolve())), name=name,
                        command=agent.command, secrets=secrets, login=login)


def _check_command(command: str) -> None:
    """Refuse what the chain file would be refused for, rather than write it.

    Raises:
        ConfigError: the command line cannot be split, or a `${NAME` is not closed.
    """
    from conductor.config import ComponentSpec, unclosed_variable

    try:
        ComponentSpec(command=command)
    except ValueError as e:  # "command: <problem> (hint: ...)"
        problem, _, hint = str(e).partition(": ")[2].partition(" (hint: ")
        raise ConfigError(problem, field="--agent-command",
                          hint=hint.removesuffix(")") or None) from None
    if (name := unclosed_variable(command)) is not None:
        raise ConfigError(f"${{{name} is not closed", field="--agent-command",
                          hint=f"write ${{{name}}} (or ${{{name}:-default}})")


def _command_toml(command: str, file: Path) -> str:
    """The `command` value for the chain at `file`. A program given by a relative path was
    typed from the current folder; the chain takes it from its own, so it is rewritten
    relative to that (as an argv list) when the two differ."""
    argv = shlex.split(command)
    program = argv[0]
    folder = file.absolute().parent
    if "/" not in program or "$" in program or Path(program).is_absolute() \
            or folder == Path.cwd():
        return json.dumps(command)
    moved = os.path.relpath(Path.cwd() / program, folder)
    return json.dumps([moved if "/" in moved else f"./{moved}", *argv[1:]])


def _refuse_existing(path: Path) -> None:
    if path.exists() or path.is_symlink():
        raise ConfigError(f"{path} already exists; not overwriting it", field="--output",
                          hint="give --output another path, or move it away first")


def _write_new(path: Path, text: str) -> None:
    """Create `path` with `text`; never replace a file (not even one made meanwhile).

    Raises:
        ConfigError: it exists, or its folder is missing or not writable.
    """
    try:
        with path.open("x", encoding="utf-8") as f:
            f.write(text)
    except FileExistsError:
        _refuse_existing(path)
        raise
    except OSError as e:
        raise ConfigError(f"cannot write {path}: {e.strerror}", field="--output",
                          hint="give --output a path in an existing, writable folder") from None


# -- a proxy package -----------------------------------------------------------------------

PYPROJECT = """\
[build-system]
requires = ["hatchling>=1.24"]
build-backend = "hatchling.build"

[project]
name = "acp-proxy-{name}"
version = "0.1.0"
description = "{cls}: an ACP proxy for acp-conductor"
requires-python = ">=3.11"
dependencies = ["acp-conductor"]

[project.optional-dependencies]
test = ["pytest>=8"]

# What makes `use = "{name}"` work in a chain file once the package is installed.
[project.entry-points."acp_conductor.proxies"]
{name} = "{module}:{cls}"

[tool.hatch.build.targets.wheel]
packages = ["{module}"]

[tool.pytest.ini_options]
testpaths = ["tests"]
addopts = "-ra"
filterwarnings = ["error"]
"""

MODULE = '''\
"""{cls}: an ACP proxy for acp-conductor (docs/writing-a-proxy.md is the guide)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from pydantic import BaseModel, ConfigDict

from conductor.plugins import Proxy, ProxyContext, on

if TYPE_CHECKING:
    from conductor.jsonrpc.message import Message


class {cls}Options(BaseModel):
    """What a chain file may set: `options = {{ prefix = "Be brief." }}`."""

    model_config = ConfigDict(extra="forbid")  # a misspelt option is an error, not ignored
    prefix: str = ""


class {cls}(Proxy[{cls}Options]):
    """Puts a line of text in front of every prompt."""  # shown by `acp-conductor proxies`

    options_model = {cls}Options

    @on("session/prompt")  # a request from the editor's side
    async def prompt(self, ctx: ProxyContext, message: Message) -> object:
        if not self.options.prefix:
            return await ctx.forward()  # on, untouched (byte for byte)
        params = message.params_value()  # a decoded copy; the message keeps its bytes
        params["prompt"].insert(0, {{"type": "text", "text": self.options.prefix}})
        return await ctx.forward(message.with_params(params))  # the agent's answer, as is
'''

TESTS = '''\
"""{cls} driven through the conductor's own router, in memory, with a scripted agent."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import anyio

from conductor.testing import ScriptedAgent
from {module} import {cls}, {cls}Options

if TYPE_CHECKING:
    from collections.abc import Callable

# `acp_chain` (acp-conductor's pytest plugin) runs a chain in memory; a test that uses it
# runs on asyncio, as the conductor runs proxies, with nothing to configure.


async def prompts_reaching_the_agent(
        acp_chain: Callable[..., Any], proxy: {cls}, text: str) -> list[str]:
    agent = ScriptedAgent(replies={{"session/prompt": {{"stopReason": "end_turn"}}}})
    async with acp_chain([proxy], agent) as client:
        with anyio.fail_after(5):
            session = await client.new_session("/tmp")
            await client.prompt(session, text)
    (params,) = agent.received_params("session/prompt")
    return [block["text"] for block in params["prompt"]]


async def test_the_prefix_goes_in_front_of_the_prompt(
        acp_chain: Callable[..., Any]) -> None:
    proxy = {cls}({cls}Options(prefix="Be brief."))
    prompts = await prompts_reaching_the_agent(acp_chain, proxy, "hello")
    assert prompts == ["Be brief.", "hello"]


async def test_without_a_prefix_the_prompt_reaches_the_agent_untouched(
        acp_chain: Callable[..., Any]) -> None:
    prompts = await prompts_reaching_the_agent(acp_chain, {cls}({cls}Options()), "hello")
    assert prompts == ["hello"]
'''

README = """\
# acp-proxy-{name}

`{cls}`, an ACP proxy for acp-conductor, written by `acp-conductor init --proxy {name}`.

```sh
pip install -e '.[test]'      # in the environment acp-conductor is installed in
acp-conductor proxies         # lists {name}
pytest                        # its tests, in memory
```

In a chain file:

```toml
[[proxy]]
use = "{name}"
options = {{ prefix = "Be brief." }}
```

Or stand-alone, under any conductor: `acp-conductor serve-proxy {name}`.
"""


def proxy_files(name: str) -> dict[str, str]:
    module = name.replace("-", "_") + "_proxy"
    cls = "".join(part.capitalize() for part in re.split(r"[-_]", name) if part)
    values = {"name": name, "module": module, "cls": cls}
    return {"pyproject.toml": PYPROJECT.format(**values),
            f"{module}/__init__.py": MODULE.format(**values),
            f"tests/test_{module}.py": TESTS.format(**values),
            "README.md": README.format(**values)}


@click.command("init")
@click.option("--agent", "agent", type=click.Choice(sorted(AGENTS)),
              help="The agent the chain runs (an npm ACP adapter, or the demo agent).")
@click.option("--agent-command", metavar="CMD", help="Any other ACP agent's command line.")
@click.option("--proxy", "proxy_name", metavar="NAME",
              help="Write a proxy package NAME instead (entry point, module, tests).")
@click.option("-o", "--output", "output_text", type=click.Path(),
              help="Where to write: a file [default: chain.toml] (a folder: chain.toml "
                   "in it), or with --proxy a new directory [default: NAME].")
@handle_errors
def init_command(agent: str | None, agent_command: str | None, proxy_name: str | None,
                 output_text: str | None) -> None:
    """Start a chain file for an agent, or a proxy package. Never overwrites anything.

    \b
    acp-conductor init --agent claude-code            chain.toml for Claude Code
    acp-conductor init --agent-command "my-agent --acp" -o mine.toml
    acp-conductor init --proxy guard                   ./guard: a proxy package
    """
    if output_text == "":  # Path("") is "." and would be refused as existing
        raise ConfigError("the path is empty", field="--output",
                          hint="give a file name, e.g. -o chain.toml")
    output = Path(output_text) if output_text is not None else None
    if proxy_name is not None:
        if agent or agent_command:
            raise click.UsageError("--proxy writes a proxy package; it takes no agent")
        if not re.fullmatch(r"[a-z][a-z0-9]*(?:[-_][a-z0-9]+)*", proxy_name):
            raise ConfigError(f"{proxy_name!r} is not a usable proxy name", field="--proxy",
                              hint="lower-case letters and digits, words joined by - or _")
        from conductor.plugins.registry import installed

        taken = next((p for p in installed() if p.name == proxy_name), None)
        if taken is not None:  # `use = NAME` would then load whichever is found first
            raise ConfigError(f"{proxy_name!r} is the name of an installed proxy "
                              f"({taken.value}): `use = \"{proxy_name}\"` could load either",
                              field="--proxy", hint="pick another name")
        root = output or Path(proxy_name)
        _refuse_existing(root)
        for relative, text in proxy_files(proxy_name).items():
            path = root / relative
            try:
                path.parent.mkdir(parents=True, exist_ok=True)
            except OSError as e:
                raise ConfigError(f"cannot create {path.parent}: {e.strerror}",
                                  field="--output", hint="give --output a new directory in an "
                                                         "existing, writable folder") from None
            _write_new(path, text)
        click.echo(f"wrote {root}/: pip install -e {shlex.quote(f'{root}[test]')}, then use = "
                   f'"{proxy_name}" in a chain (see {root}/README.md)')
        return
    if (agent is None) == (agent_command is None):
        raise click.UsageError("give --agent (" + ", ".join(sorted(AGENTS)) +
                               ") or --agent-command CMD")
    if agent_command is not None and not agent_command.strip():
        raise ConfigError("the command is empty", field="--agent-command",
                          hint='give the agent\'s command line, e.g. "my-agent --acp"')
    if agent_command is not None:
        _check_command(agent_command)
    file = output or Path("chain.toml")
    if file.is_dir():  # `-o chains/`: a folder to write into, as `cp` reads it
        file = file / "chain.toml"
    chosen = AGENTS[agent] if agent else KnownAgent(
        # one line: the title goes in a comment line, which a newline would end
        f"`{' '.join(str(agent_command).split())}`", _command_toml(str(agent_command), file),
        (), "give the agent what it needs in your environment")
    _refuse_existing(file)
    _write_new(file, chain_text(agent or "agent", chosen, file))
    click.echo(f"wrote {file}: try `acp-conductor check --chain {shlex.quote(str(file))}`")
