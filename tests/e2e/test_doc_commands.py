"""Every command in the docs runs as written.

A ```sh block in README.md or docs/*.md holds commands a reader types: each line (a
trailing `\\` continues it) runs here in bash, in a scratch directory, against a normal
install of this checkout's wheel (a venv per doc), and must exit 0. Real agents are stood
in for by the demo agent: `chain.toml` in the scratch directory is the demo chain. Lines
that cannot run here are listed in NOT_RUN with the reason. Synopses and editor
configurations are not ```sh blocks (they are ```text, ```json, ```lua, ...), so they are
not run. Commands named inline in a sentence are checked against the CLI (the command and
its options exist) by tests/test_doc_inline_commands.py.

docs/ci.md is a GitHub Actions job: its ```sh block and then every `run:` step of its
workflow run in order, in one workspace, with its `chains/ci.toml` (the agent swapped for
the demo agent) and a fresh venv that its own install step installs into.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from typing import TYPE_CHECKING, Any

import pytest
import yaml

from conductor.config import BUILTIN_CHAINS
from tests.conftest import REPO, doc_files
from tests.e2e.conftest import fresh_venv, user_env

if TYPE_CHECKING:
    from pathlib import Path

DOCS = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]

# Lines that are not run, and why. A line listed here that no doc has any more fails the
# test, so the list cannot rot.
NOT_RUN = {
    "pip install -e '.[test]' && pytest -q":
        "the test suite itself: .ci/run runs exactly this line",
    "acpx --agent 'acp-conductor --chain /home/me/chains/chain.toml' exec 'summarize the "
    "changes'": "needs acpx from npm and the reader's chain; tests/e2e/test_acpx.py drives "
                "the same command",
    **{line: "pipx and uv install into the user's home with packages from PyPI; the wheel "
              "they install is tests/e2e/test_wheel.py's, and the README's `pip install .` "
              "runs here"
       for line in ("pipx install /path/to/acp-conductor",
                    "uv tool install /path/to/acp-conductor",
                    "pipx install dist/acp_conductor-0.1.0-py3-none-any.whl")},
    "acp-conductor serve --chain chain.toml":
        "a server: it listens until it is stopped; tests/e2e/test_remote.py starts `serve` "
        "and connects to it",
    'eval "$(_ACP_CONDUCTOR_COMPLETE=zsh_source acp-conductor)"':
        "zsh syntax, and zsh is not here; click writes it like the bash script, which runs",
    "_ACP_CONDUCTOR_COMPLETE=fish_source acp-conductor > "
    "~/.config/fish/completions/acp-conductor.fish":
        "fish's folder, and fish is not here; click writes it like the bash script",
    **{f"python bench/run_bench.py{args}": "a benchmark: minutes of CPU; bench/ is "
                                           "checked by ruff in tests/test_codebase.py"
       for args in ("", " --quick", " --check", " --imports",
                    " --only relay,acp+0 --phases startup,latency --json out.json",
                    " --rounds 5", " --compare /tmp/old", " --profile /tmp/prof",
                    " --markdown")},
    "python bench/stream_proxies.py": "a benchmark: tens of seconds of CPU; "
                                      "tests/e2e/test_bench_scripts.py runs it small",
}

# Placeholders for paths on the reader's machine.
SUBSTITUTE = {"/path/to/acp-conductor": str(REPO)}

# The reader runs these in their checkout of acp-conductor (`pip install .`, `-e '.[x]'`).
IN_CHECKOUT = re.compile(r"^pip install (-e )?'?\.(\[[a-z,]+\])?'?( |$)")
# Any other install changes the venv the doc's commands run in.
INSTALLS = re.compile(r"\b(pip|uv pip) install\b")


def sh_lines(text: str) -> list[str]:
    """The command lines of every ```sh block, continuations joined, comments dropped."""
    lines: list[str] = []
    for block in re.findall(r"^```sh\n(.*?)^```", text, re.M | re.S):
        pending = ""
        for raw in block.splitlines():
            if raw.rstrip().endswith("\\"):
                pending += raw.rstrip()[:-1].rstrip() + " "
                continue
            line = (pending + raw.strip()).strip()
            pending = ""
            command = re.sub(r"\s+#\s.*$", "", line).strip()  # a trailing comment
            if command and not command.startswith("#"):
                lines.append(re.sub(r"\s{2,}", " ", command))
    return lines


def example_proxy() -> str:
    """The `Shout` proxy of docs/writing-a-proxy.md, which its commands serve."""
    text = (REPO / "docs" / "writing-a-proxy.md").read_text(encoding="utf-8")
    (code,) = [b for b in re.findall(r"^```python\n(.*?)^```", text, re.M | re.S)
               if "class Shout" in b]
    return code


def workspace(root: Path) -> Path:
    """What a reader has around them: a chain file, a prompt, a project, their proxy."""
    shutil.copy(BUILTIN_CHAINS / "demo.toml", root / "chain.toml")
    (root / "prompt.txt").write_text("hello\n", encoding="utf-8")
    (root / "repo").mkdir()
    (root / "shout.py").write_text(example_proxy(), encoding="utf-8")
    (root / "my_pkg").mkdir()
    (root / "my_pkg" / "__init__.py").write_text("", encoding="utf-8")
    (root / "my_pkg" / "proxies.py").write_text(example_proxy(), encoding="utf-8")
    for name, body in doc_files("writing-a-proxy.md").items():  # its `# upper.py` etc.
        (root / name).write_text(body, encoding="utf-8")
    return root


def bash(line: str, *, cwd: Path, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["bash", "-e", "-c", line], cwd=cwd, env=env, capture_output=True,
                          text=True, stdin=subprocess.DEVNULL, timeout=120, check=False)


def run_lines(lines: list[str], *, cwd: Path, venv: Path, scratch: Path) -> None:
    for line in lines:
        if line in NOT_RUN:
            continue
        for placeholder, value in SUBSTITUTE.items():
            line = line.replace(placeholder, value)
        # my_pkg: the reader's installed package; HOME: nothing is written to the real one
        env = user_env(venv, PYTHONPATH=str(cwd), HOME=str(scratch))
        here = cwd
        if IN_CHECKOUT.match(line):  # an install: into a venv of its own, from the checkout
            env = user_env(fresh_venv(scratch / f"venv-{len(list(scratch.iterdir()))}"))
            here = REPO
        result = bash(line, cwd=here, env=env)
        assert result.returncode == 0, f"{line}\nexit {result.returncode}\n{result.stderr}"


def test_every_line_that_is_not_run_is_still_in_the_docs() -> None:
    lines = {line for doc in DOCS for line in sh_lines(doc.read_text(encoding="utf-8"))}
    assert set(NOT_RUN) <= lines, set(NOT_RUN) - lines


def test_no_doc_installs_acp_conductor_from_a_package_index() -> None:
    # acp-conductor is not published (issue 10.6): every install, in any block or inline,
    # names a checkout, a wheel or a path, never the bare package name.
    from_index = re.compile(r"\b(pip|pipx|uv tool|uv pip) install[^\n`&;|#]*?(?<![\w./-])"
                            r"'?acp-conductor\b(?![\w./-])")
    found = [f"{doc.name}: {line.strip()}" for doc in DOCS
             for line in doc.read_text(encoding="utf-8").splitlines()
             if from_index.search(line)]
    assert found == []


@pytest.mark.parametrize("doc", [d for d in DOCS if d.name != "ci.md"
                                 and "```sh" in d.read_text(encoding="utf-8")],
                         ids=lambda d: d.name)
def test_every_command_in_the_doc_runs_as_written(doc: Path, wheel: Path, tmp_path: Path,
                                                  request: pytest.FixtureRequest) -> None:
    lines = sh_lines(doc.read_text(encoding="utf-8"))
    assert lines
    (tmp_path / "work").mkdir()
    (tmp_path / "scratch").mkdir()
    if any(INSTALLS.search(line) and not IN_CHECKOUT.match(line)
           for line in lines if line not in NOT_RUN):
        venv = fresh_venv(tmp_path / "venv")  # its own: the doc's `pip install` lands here
        bash(f"pip install -q {wheel}", cwd=tmp_path, env=user_env(venv)).check_returncode()
    else:  # a doc that installs nothing into it shares the wheel's venv (one per worker)
        venv = request.getfixturevalue("installed")
    run_lines(lines, cwd=workspace(tmp_path / "work"), venv=venv, scratch=tmp_path / "scratch")


def ci_chain(text: str) -> str:
    """docs/ci.md's chains/ci.toml, with the demo agent standing in for Claude."""
    (chain,) = re.findall(r"^```toml\n(.*?)^```", text, re.M | re.S)
    stand_in, count = re.subn(r'^command = "npx [^"]*"',
                              'command = ["${PYTHON}", "-m", "conductor.demo_agent"]',
                              chain, flags=re.M)
    assert count == 1, "docs/ci.md's chain should name one npx agent"
    return stand_in


def test_the_ci_job_runs_as_written(tmp_path: Path) -> None:
    text = (REPO / "docs" / "ci.md").read_text(encoding="utf-8")
    work = tmp_path / "workspace"
    (work / "chains").mkdir(parents=True)
    (work / "chains" / "ci.toml").write_text(ci_chain(text), encoding="utf-8")
    venv = fresh_venv(tmp_path / "venv")  # the runner's Python: nothing installed yet
    (tmp_path / "scratch").mkdir()
    run_lines(sh_lines(text), cwd=work, venv=venv, scratch=tmp_path / "scratch")
    assert list((work / "wheels").glob("acp_conductor-*.whl"))

    (workflow,) = re.findall(r"^```yaml\n(.*?)^```", text, re.M | re.S)
    (job,) = yaml.safe_load(workflow)["jobs"].values()
    key = "sk-ant-" + "x" * 24
    env = {name: value.replace("${{ secrets.ANTHROPIC_API_KEY }}", key)
           for name, value in job["env"].items()}
    ran = []
    for step in job["steps"]:
        if "uses" in step:  # GitHub's own actions: checkout, setup-*, upload-artifact
            assert step["uses"].startswith("actions/"), step
            continue
        runner = {k: v for k, v in user_env(venv, GITHUB_WORKSPACE=str(work)).items()
                  if not k.endswith("_API_KEY")}  # a runner has only the secrets it is given
        result = bash(step["run"], cwd=work, env={**runner, **env})
        assert result.returncode == 0, f"{step['name']}: exit {result.returncode}\n" \
                                       f"{result.stdout}\n{result.stderr}"
        ran.append(step["name"])
    assert ran == ["Install acp-conductor", "Check the chain starts", "Run the agent headless",
                   "Render the trace"]
    for artifact in ("trace.jsonl", "trace.html", "transcript.jsonl"):
        assert (work / artifact).stat().st_size > 0, artifact
    result: dict[str, Any] = json.loads(
        (work / "transcript.jsonl").read_text(encoding="utf-8").splitlines()[-1])
    assert (result["type"], result["exitCode"], result["violations"]) == ("result", 0, [])
