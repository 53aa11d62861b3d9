"""`acp-conductor doctor`: what an editor's environment must give the chain, line by line."""

from __future__ import annotations

import os
import sys
from typing import TYPE_CHECKING

from conductor.cli.doctor import (
    MINIMAL_PATH,
    Finding,
    chain_findings,
    conductor_findings,
    editor_environment,
    file_findings,
)
from conductor.config import component_environment, load_chain
from tests.in_process import conductor

if TYPE_CHECKING:
    from pathlib import Path

    import pytest


def tool(folder: Path, name: str, script: str = "exit 0") -> None:
    folder.mkdir(exist_ok=True)
    path = folder / name
    path.write_text(f"#!/bin/sh\n{script}\n", encoding="utf-8")
    path.chmod(0o755)


def findings(tmp_path: Path, chain: str, environ: dict[str, str]) -> dict[str, Finding]:
    (tmp_path / "chain.toml").write_text(chain, encoding="utf-8")
    return {f.subject: f for f in chain_findings(str(tmp_path / "chain.toml"), environ)}


NPM_AGENT = '[agent]\nname = "claude"\ncommand = "npx -y @zed-industries/claude-agent-acp"\n'


def test_an_npm_agent_needs_npx_on_the_editors_path_and_a_recent_node(tmp_path: Path) -> None:
    bin_dir = tmp_path / "bin"
    tool(bin_dir, "npx")
    tool(bin_dir, "node", "echo v20.11.1")
    found = findings(tmp_path, NPM_AGENT, {"PATH": str(bin_dir)})
    assert found["claude"] == Finding("ok", "claude", f"`npx` is {bin_dir / 'npx'}")
    assert found["node"].status == "ok" and "v20.11.1" in found["node"].detail

    tool(bin_dir, "node", "echo v16.20.0")
    assert findings(tmp_path, NPM_AGENT, {"PATH": str(bin_dir)})["node"].status == "warn"

    missing = findings(tmp_path, NPM_AGENT, {"PATH": str(tmp_path / "empty")})["claude"]
    assert missing.status == "fail"
    assert f"`npx` is not on PATH ({tmp_path / 'empty'})" in missing.detail


def test_the_variables_a_chain_references_are_looked_up_in_the_editors_environment(
        tmp_path: Path) -> None:
    chain = ('[agent]\ncommand = "true"\nenv = { A = "${NEEDED}", B = "${OPTIONAL:-x}" }\n'
             'secret_env = ["TOKEN"]\n')
    found = findings(tmp_path, chain, {"PATH": "/usr/bin:/bin"})
    assert found["${NEEDED}"].status == "fail"
    assert "agent.env.A needs it" in found["${NEEDED}"].detail
    assert found["${OPTIONAL}"].status == "ok" and "default 'x'" in found["${OPTIONAL}"].detail
    assert found["TOKEN"].status == "warn"
    given = findings(tmp_path, chain, {"PATH": "/usr/bin:/bin", "NEEDED": "1", "TOKEN": "t"})
    assert given["${NEEDED}"].status == given["TOKEN"].status == "ok"


def test_a_plugin_that_cannot_be_loaded_is_a_failure_with_the_config_error(
        tmp_path: Path) -> None:
    found = findings(tmp_path, '[[proxy]]\nuse = "redcat"\n[agent]\ncommand = "true"\n',
                     {"PATH": "/usr/bin:/bin"})
    assert found["redcat"].status == "fail"
    assert "did you mean 'redact'?" in found["redcat"].detail


def test_trace_and_log_files_must_be_writable_where_they_are_asked_for(tmp_path: Path) -> None:
    ok, missing = file_findings(str(tmp_path / "t.jsonl"), str(tmp_path / "no" / "log.txt"))
    assert ok.status == "ok" and missing.status == "fail"
    assert missing.subject == "--log-file" and "does not exist" in missing.detail


def test_acp_conductor_missing_from_the_path_is_a_warning_that_says_what_to_do() -> None:
    (finding,) = conductor_findings({"PATH": "/nonexistent"})
    assert finding.status == "warn"
    assert "not on PATH" in finding.detail and "absolute path" in finding.detail


def test_the_minimal_environment_is_a_desktop_apps(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SOME_SHELL_EXPORT", "1")
    env = editor_environment(minimal=True)
    assert env["PATH"] == MINIMAL_PATH
    assert "SOME_SHELL_EXPORT" not in env


def test_doctor_exits_1_when_a_check_fails_and_0_with_warnings_only(tmp_path: Path) -> None:
    chain = tmp_path / "chain.toml"
    chain.write_text('[agent]\ncommand = "true"\nsecret_env = ["SURELY_UNSET_TOKEN"]\n',
                     encoding="utf-8")
    ok = conductor("doctor", "--chain", str(chain))
    assert ok.returncode == 0, ok.stdout + ok.stderr
    assert "warn  SURELY_UNSET_TOKEN: not set" in ok.stdout
    chain.write_text('[agent]\ncommand = "no-such-agent-program"\n', encoding="utf-8")
    failed = conductor("doctor", "--chain", str(chain))
    assert failed.returncode == 1
    assert "fail  agent: `no-such-agent-program` is not on PATH" in failed.stdout
    assert failed.stdout.splitlines()[-1].startswith("1 failed, ")


def test_a_remote_agent_is_named_with_its_address_and_its_header_variables_checked(
        tmp_path: Path) -> None:
    chain = ('[agent]\nurl = "wss://build-box:8765/acp"\n'
             'headers = { Authorization = "Bearer ${AGENT_TOKEN}" }\n')
    found = findings(tmp_path, chain, {"PATH": "/usr/bin:/bin"})
    assert found["agent"] == Finding("ok", "agent", "remote, at wss://build-box:8765/acp")
    assert found["${AGENT_TOKEN}"].status == "fail"
    assert "agent.headers.Authorization needs it" in found["${AGENT_TOKEN}"].detail


def test_a_remote_component_without_the_remote_extra_installed_is_a_failure(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # `check` would fail on it ("remote components need the remote extra"): doctor must not
    # call the same chain ok.
    monkeypatch.setitem(sys.modules, "httpx_ws", None)  # None: `import httpx_ws` fails
    found = findings(tmp_path, '[agent]\nurl = "wss://build-box:8765/acp"\n', {"PATH": ""})
    assert found["agent"].status == "fail"
    assert "remote extra" in found["agent"].detail
    assert "docs/remote.md" in found["agent"].detail


def test_a_program_path_that_is_not_executable_or_a_folder_says_which_and_the_fix(
        tmp_path: Path) -> None:
    script = tmp_path / "agent.sh"
    script.write_text("#!/bin/sh\n", encoding="utf-8")
    script.chmod(0o644)
    found = findings(tmp_path, '[agent]\nname = "a"\ncommand = ["./agent.sh"]\n', {})
    assert found["a"].status == "fail"
    assert "is not executable" in found["a"].detail
    assert f"chmod +x {script}" in found["a"].detail
    (tmp_path / "folder").mkdir()
    found = findings(tmp_path, '[agent]\nname = "a"\ncommand = ["./folder"]\n', {})
    assert found["a"].status == "fail"
    assert "is a directory" in found["a"].detail


def test_a_variable_named_in_a_default_is_looked_up_when_the_default_is_used(
        tmp_path: Path) -> None:
    chain = '[agent]\ncommand = "true"\ncwd = "${WORK:-${HOME}/work}"\n'
    assert findings(tmp_path, chain, {"PATH": "/bin"})["${HOME}"].status == "fail"
    assert "${HOME}" not in findings(tmp_path, chain, {"PATH": "/bin", "WORK": "/w"})


def test_a_variable_reference_never_closed_fails_as_the_chain_would(tmp_path: Path) -> None:
    # `run` refuses `${HOME` (exit 2); doctor must not call the chain fine.
    found = findings(tmp_path, '[agent]\ncommand = "true"\nenv = { K = "${HOME/bin" }\n',
                     {"PATH": "/usr/bin:/bin", "HOME": "/home/me"})
    assert found["${HOME"].status == "fail"
    assert "agent.env.K" in found["${HOME"].detail and "not closed" in found["${HOME"].detail


def test_a_program_on_the_path_the_components_own_env_gives_it_is_found(tmp_path: Path) -> None:
    # The component is started with its `env`'s PATH, which finds it: doctor looked in the
    # editor's PATH alone and said it would not start.
    tool(tmp_path / "mybin", "myagent")
    chain = '[agent]\ncommand = "myagent"\nenv = { PATH = "${HERE}/mybin:${PATH}" }\n'
    found = findings(tmp_path, chain, {"PATH": "/usr/bin:/bin", "HERE": str(tmp_path)})
    assert found["agent"] == Finding("ok", "agent", f"`myagent` is {tmp_path}/mybin/myagent")


def test_every_stdio_mcp_server_command_is_looked_for_as_the_chain_will(tmp_path: Path) -> None:
    # Doctor passed over a relative path, an absolute one and one behind a ${VAR}: it said
    # "0 failed" for a chain that then would not start.
    tool(tmp_path / "bin", "mcp-here")
    chain = ('[agent]\ncommand = "true"\n'
             '[[mcp_server]]\nname = "a"\ncommand = "./missing-mcp"\n'
             '[[mcp_server]]\nname = "b"\ncommand = "${MCPBIN:-nosuch-mcp}"\n'
             '[[mcp_server]]\nname = "c"\ncommand = "/abs/missing-mcp"\n'
             '[[mcp_server]]\nname = "d"\ncommand = "./bin/mcp-here"\n'
             '[[mcp_server]]\nname = "e"\ncommand = "${MCPDIR}/mcp-here"\n')
    found = findings(tmp_path, chain, {"PATH": "/usr/bin:/bin", "MCPDIR": str(tmp_path / "bin")})
    assert found["mcp_server[0]"].status == "fail"
    assert f"./missing-mcp (relative to {tmp_path}, the chain file's folder)" in \
        found["mcp_server[0]"].detail
    assert found["mcp_server[1]"].status == "fail"
    assert "`nosuch-mcp` is not on PATH" in found["mcp_server[1]"].detail
    assert found["mcp_server[2]"].status == "fail"
    assert "/abs/missing-mcp is not an executable file" in found["mcp_server[2]"].detail
    assert found["mcp_server[3]"] == Finding("ok", "mcp_server[3]",
                                             f"`./bin/mcp-here` is {tmp_path}/bin/mcp-here")
    assert found["mcp_server[4]"] == Finding(
        "ok", "mcp_server[4]", f"`{tmp_path}/bin/mcp-here` is {tmp_path}/bin/mcp-here")


def test_a_working_directory_is_looked_for_with_its_variables_and_the_fix_is_said(
        tmp_path: Path) -> None:
    # A cwd behind a ${VAR} went unchecked, and a missing one was told no fix.
    (tmp_path / "chain.toml").write_text(
        '[[proxy]]\ncommand = "true"\ncwd = "${WORK}/src"\n'
        '[agent]\ncommand = "true"\ncwd = "missing"\n', encoding="utf-8")
    found = [f for f in chain_findings(str(tmp_path / "chain.toml"),
                                       {"PATH": "/usr/bin:/bin", "WORK": str(tmp_path)})
             if f.detail.startswith("cwd ")]
    assert found == [
        Finding("fail", "proxy:0", f"cwd {tmp_path}/src not found; give a folder relative to "
                                   "the chain file, or an absolute one"),
        Finding("fail", "agent", f"cwd missing not found (relative to {tmp_path}, the chain "
                                 "file's folder); give a folder relative to the chain file, "
                                 "or an absolute one")]


def test_a_variable_set_empty_is_said_to_take_its_default(tmp_path: Path) -> None:
    # As the chain reads `${VAR:-default}` (a shell's `:-`): empty takes the default too.
    found = findings(tmp_path, '[agent]\ncommand = "${AGENT_BIN:-sh} -c true"\n',
                     {"PATH": os.defpath, "AGENT_BIN": ""})
    assert found["${AGENT_BIN}"].status == "ok"
    assert "empty; agent.command uses its default 'sh'" in found["${AGENT_BIN}"].detail


def test_an_unset_variable_before_an_unclosed_one_is_reported_with_it(tmp_path: Path) -> None:
    # Both at once: `variables` gave nothing for a value with an unclosed `${`, so the
    # unset variable before it was met only after fixing the brace.
    found = findings(tmp_path, '[agent]\ncommand = "sh ${DOCTOR_UNSET_A} ${DOCTOR_B"\n',
                     {"PATH": os.defpath})
    assert found["${DOCTOR_B"].status == "fail"
    assert found["${DOCTOR_UNSET_A}"].status == "fail"


def test_an_env_value_with_a_shell_style_variable_is_a_warning_saying_how_to_write_it(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    # `KEY = "$API_KEY"` passed the text `$API_KEY` to the agent, without a word.
    chain = ('[agent]\ncommand = "true"\nenv = { KEY = "$API_KEY", PW = "a$Sw0rd", '
             'SSH = "ssh -i $HOME/k", OK = "${API_KEY:-x}" }\n[[mcp_server]]\nname = "w"\n'
             'type = "http"\nurl = "http://127.0.0.1:1/mcp"\nheaders = { X = "$TOKEN" }\n')
    found = findings(tmp_path, chain, {"PATH": "/usr/bin:/bin"})
    assert found["agent.env.KEY"] == Finding(
        "warn", "agent.env.KEY", "holds $API_KEY, which reaches the component as written (the "
        "conductor expands ${API_KEY}, with braces); write ${API_KEY} to pass the variable")
    assert found["mcp_server[0].headers.X"].status == "warn"
    # `$` inside a value is as likely meant (a password, a command a shell runs later)
    assert not {"agent.env.PW", "agent.env.SSH", "agent.env.OK"} & set(found)
    # and when the chain starts, whoever did not run doctor reads it in the log
    config = load_chain(tmp_path / "chain.toml")
    assert config.agent is not None
    component_environment(config.agent, file="chain.toml", where="agent")
    assert "chain.toml: agent.env.KEY holds $API_KEY, which reaches" in caplog.text
    assert "PW" not in caplog.text and "Sw0rd" not in caplog.text and "SSH" not in caplog.text
