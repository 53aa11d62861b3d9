"""House rules that hold for the whole source tree, checked on the source itself."""

from __future__ import annotations

import ast
import importlib.util
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _ruff() -> list[str]:
    if importlib.util.find_spec("ruff") is not None:
        return [sys.executable, "-m", "ruff"]
    # An environment without the module may still have the binary beside the interpreter.
    return [str(Path(sys.executable).with_name("ruff"))]


def _modules(*packages: str) -> list[Path]:
    return sorted(p for package in packages for p in (ROOT / package).rglob("*.py"))


def test_ruff_finds_nothing_in_the_code_tests_and_bench() -> None:
    # pyproject.toml's [tool.ruff] applies (cwd is the repository root); T201 there also
    # keeps print() out of conductor/ and proxies/, whose stdout is the JSON-RPC channel.
    done = subprocess.run(
        [*_ruff(), "check", "--no-cache", "conductor", "proxies", "bench", "tests"],
        cwd=ROOT, capture_output=True, text=True, timeout=50, check=False)
    assert done.returncode == 0, f"ruff check failed:\n{done.stdout}{done.stderr}"


def test_the_code_type_checks_under_mypy_strict() -> None:
    # [tool.mypy] in pyproject.toml: strict, over conductor/ and proxies/. mypy's own
    # incremental cache (.mypy_cache, shared with a developer's `mypy`): it rechecks what a
    # changed module's interface reaches and replays cached errors, so a warm run reports
    # what a cold one does, for 0.3 s of CPU instead of 6.
    done = subprocess.run(
        [sys.executable, "-m", "mypy"], cwd=ROOT,
        capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0, f"mypy --strict failed:\n{done.stdout}{done.stderr}"


def test_each_layer_imports_only_the_layers_below_it() -> None:
    # [tool.importlinter] in pyproject.toml: the layers docs/architecture.md draws.
    linter = Path(sys.executable).with_name("lint-imports")
    done = subprocess.run([str(linter), "--no-cache"], cwd=ROOT, capture_output=True,
                          text=True, timeout=120, check=False)
    assert done.returncode == 0, f"an import breaks the layering:\n{done.stdout}{done.stderr}"


def test_no_module_under_conductor_imports_asyncio_but_a_transports_fast_path() -> None:
    offenders = []
    for path in _modules("conductor"):
        if path.parent.name == "transport":
            continue  # a measured backend-native fast path, behind the transport interface
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0:
                names = [node.module or ""]
            else:
                continue
            if any(name == "asyncio" or name.startswith("asyncio.") for name in names):
                offenders.append(f"{path.relative_to(ROOT)}:{node.lineno}")
    assert not offenders, "the core is anyio-only; asyncio imported at " + ", ".join(offenders)


def test_conductor_and_proxies_never_print_to_stdout() -> None:
    # A print() without file= would write to stdout, which carries only JSON-RPC frames.
    offenders = [
        f"{path.relative_to(ROOT)}:{node.lineno}"
        for path in _modules("conductor", "proxies")
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path)))
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
        and node.func.id == "print" and not any(kw.arg == "file" for kw in node.keywords)
    ]
    assert not offenders, "print() to stdout at " + ", ".join(offenders)


def test_the_public_api_names_resolve_and_importing_the_package_stays_light() -> None:
    import subprocess
    import sys

    code = ("import sys, conductor; light = 'pydantic' not in sys.modules; "
            "[getattr(conductor, n) for n in conductor.__all__]; print(light)")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=60, check=False)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "True"


def test_the_exit_code_tables_in_the_docs_are_rendered_from_their_one_definition() -> None:
    from conductor.cli.exits import DOCS, synced

    for name in DOCS:
        text = (ROOT / name).read_text(encoding="utf-8")
        assert "<!-- exit-codes:" in text, f"{name} lost its exit-code table"
        assert synced(text) == text, (f"{name}: exit-code table out of date; "
                                      "run: python -m conductor.cli.exits --write")
