"""e2e tests drive real subprocesses: the backend of the test process itself adds nothing
there, so they run on asyncio only (in-process tests cover both backends)."""

from __future__ import annotations

import fcntl
import os
import shlex
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

from tests.conftest import REPO


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture(scope="session")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """This checkout's wheel, built as `pip wheel` builds it (offline: no build isolation);
    once per run, whichever xdist worker asks first."""
    base = tmp_path_factory.getbasetemp()
    shared = base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base  # this run's
    out = shared / "dist"
    with (shared / "dist.lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not list(out.glob("acp_conductor-*.whl")):
            subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps",
                            "--no-build-isolation", "-w", str(out), str(REPO)],
                           check=True, capture_output=True, timeout=300)
    (built,) = out.glob("acp_conductor-*.whl")
    return built


def fresh_venv(root: Path) -> Path:
    """An empty venv, as a user starts with, whose `pip` installs offline.

    Dependencies are borrowed from the test venv: its site-packages is put on the path by a
    .pth line, which (unlike a site directory) does not run the .pth files in it, so this
    checkout's editable install stays out of sight. The venv's `pip` is the test venv's pip
    aimed at the new venv, with no index and no build isolation (the build backend is
    borrowed too); everything else about it is pip's own. It runs under the new venv's
    Python directly, which is what `pip --python` does after starting once more to find that
    Python (a pip start costs a few tenths of a second of CPU, and the docs run pip often).
    """
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(root)], check=True,
                   timeout=120)
    python = root / "bin" / "python"
    site = subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()"
                           "['purelib'])"], check=True, capture_output=True, text=True).stdout
    Path(site.strip(), "zz_test_dependencies.pth").write_text(
        sysconfig.get_paths()["purelib"] + "\n", encoding="utf-8")
    pip = root / "bin" / "pip"
    pip.write_text(f'#!/bin/sh\nexec {shlex.quote(str(python))} -m pip "$@" --no-deps '
                   "--no-index --no-build-isolation\n", encoding="utf-8")
    pip.chmod(0o755)
    return root


def user_env(venv: Path, **extra: str) -> dict[str, str]:
    """The environment of a user whose shell has `venv` activated (not this checkout)."""
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    env["PATH"] = f"{venv / 'bin'}{os.pathsep}{env.get('PATH', '')}"
    env["VIRTUAL_ENV"] = str(venv)
    env.update(extra)
    return env


@pytest.fixture(scope="session")
def installed(wheel: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A fresh venv with the wheel installed by pip: a normal (non-editable) install; once
    per run, whichever xdist worker asks first (tests only run commands in it: a doc that
    installs something gets a venv of its own)."""
    base = tmp_path_factory.getbasetemp()
    shared = base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base  # this run's
    venv = shared / "installed-venv"
    with (shared / "installed.lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not (venv / "done").exists():
            shutil.rmtree(venv, ignore_errors=True)  # a worker that died half-way
            fresh_venv(venv)
            subprocess.run([str(venv / "bin" / "pip"), "install", "-q", str(wheel)],
                           check=True, capture_output=True, timeout=300)
            (venv / "done").touch()
    return venv
