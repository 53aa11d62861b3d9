"""One entry point by group and name, found without importing `importlib.metadata`.

A chain that names its proxies (`use = "permissions"`) finds each through the entry-point
group, and `importlib.metadata` costs ≈ 15 ms of CPU to import (it pulls in `email`,
`zipfile`, `csv`...) plus 2-4 ms per `entry_points()` scan: most of what such a chain adds
to start-up over a chain of commands (docs/performance.md). This reads the same files the
way its path finder does (each `*.dist-info` / `*.egg-info` folder in each `sys.path`
folder, the first of a project name winning) and answers only when its answer cannot
differ: exactly one entry of that name in the group, among folders alone. Anything else
(the name twice, a zip, an egg or a custom finder on the path, an entry that is not
`module:attr`) returns None, and the caller asks `importlib.metadata` as before.
"""

from __future__ import annotations

import functools
import importlib
import os
import re
import sys
from importlib.machinery import PathFinder

# importlib.metadata's own pattern for an entry point's value.
_VALUE = re.compile(r"(?P<module>[\w.]+)\s*(:\s*(?P<attr>[\w.]+)\s*)?((?P<extras>\[.*\])\s*)?$")


class _Unsure(Exception):
    """Something only importlib.metadata reads the same way (an egg)."""


class FoundEntryPoint:
    """What `importlib.metadata.EntryPoint` offers the registry: `name`, `value`, `load()`."""

    __slots__ = ("name", "value")

    def __init__(self, name: str, value: str) -> None:
        self.name = name
        self.value = value

    def load(self) -> object:
        """Import the module and walk to the attribute, as `EntryPoint.load` does."""
        match = _VALUE.match(self.value)
        assert match is not None  # find() answers only for values that match
        module = importlib.import_module(match.group("module"))
        attrs = filter(None, (match.group("attr") or "").split("."))
        return functools.reduce(getattr, attrs, module)


def find(group: str, name: str) -> FoundEntryPoint | None:
    """The entry point `name` in `group`; None when only importlib.metadata can tell."""
    if any(f is not PathFinder and hasattr(f, "find_distributions") for f in sys.meta_path):
        return None  # a finder of distributions we would not consult
    seen: set[str] = set()
    found: list[str] = []
    for root in sys.path:
        try:
            children = os.listdir(root or ".")
        except OSError:
            if os.path.isfile(root):
                return None  # a zip on the path: its distributions are importlib's to read
            continue
        try:
            folders = _metadata_folders(root, children)
        except _Unsure:
            return None
        for folder, project in folders:
            if project in seen:
                continue  # shadowed by one earlier on the path, as importlib.metadata does
            seen.add(project)
            found += _entries(os.path.join(folder, "entry_points.txt"), group, name)
            if len(found) > 1:
                return None
    if len(found) != 1 or _VALUE.match(found[0]) is None:
        return None
    return FoundEntryPoint(name, found[0])


def _metadata_folders(root: str, children: list[str]) -> list[tuple[str, str]]:
    """(folder, normalized project name) in the order importlib.metadata's Lookup keeps."""
    infos: dict[str, list[str]] = {}
    base = os.path.basename(root).lower()
    for child in children:
        low = child.lower()
        if low.endswith((".dist-info", ".egg-info")):
            project = _normalize(low.rpartition(".")[0].partition("-")[0])
            infos.setdefault(project, []).append(os.path.join(root, child))
        elif base.endswith(".egg") and low == "egg-info":
            # an egg's project name is read from its metadata, not its folder's name
            raise _Unsure
    return [(folder, project) for project, folders in infos.items() for folder in folders]


def _normalize(name: str) -> str:
    return re.sub(r"[-_.]+", "_", name).lower()


def _entries(path: str, group: str, name: str) -> list[str]:
    """The values of `name` in section `group` of an entry_points.txt (an INI file)."""
    try:
        with open(path, encoding="utf-8") as f:
            text = f.read()
    except (OSError, UnicodeDecodeError):
        return []
    values: list[str] = []
    section = None
    for raw in text.splitlines():
        line = raw.strip()
        if not line or line.startswith(("#", ";")):
            continue
        if line.startswith("[") and line.endswith("]"):
            section = line[1:-1].strip()
        elif section == group:
            key, sep, value = line.partition("=")
            if sep and key.strip() == name:
                values.append(value.strip())
    return values
