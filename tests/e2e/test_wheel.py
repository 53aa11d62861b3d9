"""A normal (non-editable) install works: the wheel is built, installed into a fresh venv,
and the README's demo runs from it in a directory that is not this checkout."""

from __future__ import annotations

import subprocess
import zipfile
from typing import TYPE_CHECKING

from tests.e2e.conftest import user_env

if TYPE_CHECKING:
    from pathlib import Path

BUILT_IN_PROXIES = {"context", "passthrough", "permissions", "redact", "transcript"}


def acp_conductor(venv: Path, *args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["acp-conductor", *args], env=user_env(venv), cwd=cwd,
                          capture_output=True, text=True, stdin=subprocess.DEVNULL, timeout=60,
                          check=False)


def test_the_wheel_carries_the_built_in_chains(wheel: Path) -> None:
    names = zipfile.ZipFile(wheel).namelist()
    assert "conductor/chains/demo.toml" in names
    # The built-in proxies are namespaced: no top-level `proxies` to shadow a user's own.
    assert {n.split("/")[0] for n in names if n.endswith(".py")} == {
        "conductor", "acp_conductor_proxies"}


def test_the_readme_demo_runs_from_a_normal_install(installed: Path, tmp_path: Path) -> None:
    result = acp_conductor(installed, "run", "--chain", "demo", "hello", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert "You said: hello" in result.stdout
    where = acp_conductor(installed, "chains", cwd=tmp_path)
    assert str(installed) in where.stdout  # the installed copy answered, not this checkout


def test_every_built_in_proxy_loads_from_a_normal_install(installed: Path,
                                                          tmp_path: Path) -> None:
    result = acp_conductor(installed, "proxies", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    listed = {line.split()[0] for line in result.stdout.splitlines() if line.strip()}
    assert listed >= BUILT_IN_PROXIES
    assert "cannot load" not in result.stdout
    stand_alone = acp_conductor(installed, "check", "--chain", "redact", cwd=tmp_path)
    assert stand_alone.returncode == 0, stand_alone.stderr
