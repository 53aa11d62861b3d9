"""Commands the docs name inline (`acp-conductor chains permissions` in a sentence) are not
run like the ```sh blocks (tests/e2e/test_doc_commands.py runs those), but each must name
a command that exists, with options it takes: renaming one breaks this test, not a
reader's first hour. Placeholders (FILE, CMD..., AGENT) stand for the reader's values."""

from __future__ import annotations

import json
import re
import shlex
from typing import TYPE_CHECKING

import click
import pytest

from conductor.cli.app import main
from tests.conftest import REPO

if TYPE_CHECKING:
    from pathlib import Path

DOCS = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
INLINE = re.compile(r"`(acp-conductor(?: [^`]*)?)`")


def placeholder(token: str) -> bool:
    return token.isupper() or "…" in token or token.endswith("...")


def problems(line: str) -> list[str]:
    """What is wrong with the command line `line` (nothing is run): an unknown command or
    subcommand, or an option the command it is given to does not take."""
    command: click.Command = main
    ctx = click.Context(main, info_name="acp-conductor")
    tokens = shlex.split(line)[1:]
    found: list[str] = []
    i = 0
    while i < len(tokens):
        token = tokens[i]
        i += 1
        if token.startswith("-"):
            name = token.split("=", 1)[0]
            option = next((p for p in command.params if isinstance(p, click.Option)
                           and name in (*p.opts, *p.secondary_opts)), None)
            if option is None and name not in ("--help", "-h", "--version"):
                found.append(f"{command.name or 'acp-conductor'}: no option {name}")
            elif option is not None and "=" not in token and not option.is_flag \
                    and not option.count:
                i += 1  # its value
            continue
        if isinstance(command, click.Group) and not placeholder(token):
            sub = command.get_command(ctx, token)
            if sub is None:
                found.append(f"no command {token!r}")
                break
            ctx = click.Context(sub, info_name=token, parent=ctx)
            command = sub
        # anything else is an argument: a path, a prompt, a placeholder
    return found


def test_the_check_finds_a_misspelt_command_and_an_option_the_command_lacks() -> None:
    assert problems("acp-conductor chains permissions") == []
    assert problems("acp-conductor serve --chain chain.toml --allow-origin http://x") == []
    assert problems("acp-conductor chians") == ["no command 'chians'"]
    assert problems("acp-conductor serve --no-such-option") == ["serve: no option "
                                                                "--no-such-option"]
    assert problems("acp-conductor trace html --nope") == ["html: no option --nope"]


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: p.name)
def test_every_command_a_doc_names_in_its_text_exists_with_the_options_it_gives(
        doc: Path) -> None:
    text = doc.read_text(encoding="utf-8")
    found = {line: problems(line) for line in INLINE.findall(text)}
    assert {line: p for line, p in found.items() if p} == {}


def test_the_readme_s_editor_settings_are_json_that_start_a_command_that_exists() -> None:
    # Zed's settings.json and JetBrains' acp.json are pasted as they are: a stray comma
    # or a field the editor does not know costs the reader an editor that shows nothing.
    text = (REPO / "README.md").read_text(encoding="utf-8")
    blocks = [json.loads(b) for b in re.findall(r"^```json\n(.*?)^```", text, re.M | re.S)]
    servers = [s for b in blocks for s in b.get("agent_servers", {}).values()]
    assert len(servers) == 2  # Zed, JetBrains
    for server in servers:
        assert set(server) <= {"type", "command", "args", "env"}, server
        assert server["command"] == "acp-conductor"
        assert all(isinstance(a, str) for a in server["args"]) and server["env"] == {}
        assert problems(shlex.join([server["command"], *server["args"]])) == []
    assert servers[0]["type"] == "custom"  # Zed: a custom agent, not an extension's
    acpx = [b["agents"] for b in blocks if "agents" in b]
    assert [problems(a["command"]) for agents in acpx for a in agents.values()] == [[]]
