"""docs/errors.md lists every error code the conductor's own code can put on the wire."""

from __future__ import annotations

import ast
import re

from conductor.jsonrpc.codes import ErrorCode
from tests.conftest import REPO


def codes_used() -> dict[ErrorCode, set[str]]:
    """Each ErrorCode member named in conductor/ (outside codes.py), with where."""
    used: dict[ErrorCode, set[str]] = {}
    for path in sorted((REPO / "conductor").rglob("*.py")):
        if path.name == "codes.py":
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name)
                    and node.value.id == "ErrorCode"):
                where = str(path.relative_to(REPO))
                used.setdefault(ErrorCode[node.attr], set()).add(where)
    return used


def documented() -> set[int]:
    text = (REPO / "docs" / "errors.md").read_text(encoding="utf-8")
    return {int(code) for code in re.findall(r"^\| (-3\d{4}) \|", text, re.M)}


def test_every_code_the_conductor_sends_has_a_row_in_errors_md() -> None:
    missing = {f"{code.name} ({code.value})": sorted(where)
               for code, where in codes_used().items() if code.value not in documented()}
    assert missing == {}


def test_every_code_of_the_conductor_s_own_range_has_a_row_in_errors_md() -> None:
    own = {code.value for code in ErrorCode if -33099 <= code.value <= -33001}
    assert own <= documented()
