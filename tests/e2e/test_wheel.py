"""A normal (non-editable) install works: the wheel is built, installed into a fresh venv,
and the README's demo runs from it in a directory that is not this checkout."""

from __future__ import annotations

import os
import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path

import pytest

from tests.conftest import REPO

BUILT_IN_PROXIES = {"context", "passthrough", "permissions", "redact", "transcript"}


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("dist")
    subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps",
                    "--no-build-isolation", "-w", str(out), str(REPO)],
                   check=True, capture_output=True, timeout=300)
    (built,) = out.glob("acp_conductor-*.whl")
    return built


@pytest.fixture(scope="module")
def venv(wheel: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A fresh venv with the wheel installed by pip. Its dependencies are borrowed from the
    test venv: its site-packages is put on the path by a .pth line, which (unlike a site
    directory) does not run the .pth files in it, so this checkout's editable install stays
    out of sight."""
    root = tmp_path_factory.mktemp("venv")
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(root)], check=True,
                   timeout=120)
    python = root / "bin" / "python"
    subprocess.run([sys.executable, "-m", "pip", "--python", str(python), "install", "-q",
                    "--no-deps", "--no-index", str(wheel)], check=True, capture_output=True,
                   timeout=300)
    site = subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()"
                           "['purelib'])"], check=True, capture_output=True, text=True).stdout
    Path(site.strip(), "zz_test_dependencies.pth").write_text(
        sysconfig.get_paths()["purelib"] + "\n", encoding="utf-8")
    return root


def installed(venv: Path, *args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    env["PATH"] = f"{venv / 'bin'}{os.pathsep}{env.get('PATH', '')}"
    return subprocess.run(["acp-conductor", *args], env=env, cwd=cwd, capture_output=True,
                          text=True, stdin=subprocess.DEVNULL, timeout=60, check=False)


def test_the_wheel_carries_the_built_in_chains(wheel: Path) -> None:
    names = zipfile.ZipFile(wheel).namelist()
    assert "conductor/chains/demo.toml" in names
    assert {n.split("/")[0] for n in names if n.endswith(".py")} == {"conductor", "proxies"}


def test_the_readme_demo_runs_from_a_normal_install(venv: Path, tmp_path: Path) -> None:
    result = installed(venv, "run", "--chain", "demo", "hello", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert "You said: hello" in result.stdout
    where = installed(venv, "chains", cwd=tmp_path)
    assert str(venv) in where.stdout  # the installed copy answered, not this checkout


def test_every_built_in_proxy_loads_from_a_normal_install(venv: Path, tmp_path: Path) -> None:
    result = installed(venv, "proxies", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    listed = {line.split()[0] for line in result.stdout.splitlines() if line.strip()}
    assert listed >= BUILT_IN_PROXIES
    assert "cannot load" not in result.stdout
    stand_alone = installed(venv, "check", "--chain", "redact", cwd=tmp_path)
    assert stand_alone.returncode == 0, stand_alone.stderr
