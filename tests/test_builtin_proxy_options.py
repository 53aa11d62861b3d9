"""Unit tests of the built-in proxies' option handling and helpers (no processes)."""

from __future__ import annotations

from typing import TYPE_CHECKING

import pytest

from proxies.permissions import path_matches

if TYPE_CHECKING:
    from pathlib import Path


@pytest.fixture
def workspace(tmp_path: Path) -> Path:
    ws = tmp_path / "ws"
    (ws / "sub").mkdir(parents=True)
    (ws / ".env").write_text("SECRET=1", encoding="utf-8")
    (ws / "ok.txt").write_text("ok", encoding="utf-8")
    (ws / "innocent.txt").symlink_to(".env")
    (ws / "k.txt").symlink_to(ws / ".env")
    (ws / "hop").symlink_to(ws / "sub")
    return ws


@pytest.mark.parametrize("path", [
    ".env", "./.env", "./.env/", "./.env/.", "sub/../.env/.", ".env//", "innocent.txt",
    "./innocent.txt", "k.txt", "{ws}/.env", "{ws}/.env/", "{ws}/sub/../.env", "{ws}/innocent.txt",
])
def test_an_env_deny_pattern_matches_every_spelling_and_symlink_of_the_env_file(
        workspace: Path, path: str) -> None:
    assert path_matches(".env*", path.format(ws=workspace), str(workspace))


def test_an_env_deny_pattern_does_not_match_an_ordinary_file(workspace: Path) -> None:
    for path in ("ok.txt", "./ok.txt", f"{workspace}/ok.txt", "sub/../ok.txt"):
        assert not path_matches(".env*", path, str(workspace))


@pytest.mark.parametrize("path", ["secrets/a", "./secrets/a", "sub/../secrets/a",
                                  "{ws}/secrets/a", "./secrets//a"])
def test_a_pattern_with_a_slash_matches_relative_to_the_session_cwd(workspace: Path,
                                                                    path: str) -> None:
    assert path_matches("secrets/*", path.format(ws=workspace), str(workspace))
    assert not path_matches("secrets/*", "other/a", str(workspace))


def test_a_relative_spelling_without_a_cwd_is_still_normalised() -> None:
    assert path_matches(".env*", "./.env/.", None)


def test_a_path_through_a_symlinked_cwd_matches_relative_to_the_real_cwd(
        workspace: Path, tmp_path: Path) -> None:
    alias = tmp_path / "alias"
    alias.symlink_to(workspace)
    assert path_matches("sub/*", f"{workspace}/sub/x", str(alias))
    assert path_matches(".env*", f"{alias}/innocent.txt", str(workspace))
