"""Pydantic validation errors as problems a person can fix: the key path, what is wrong, and
a hint, with "did you mean" for a misspelt key (chain files and plugin options alike)."""

from __future__ import annotations

import difflib
import re
import types
import typing
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel

if TYPE_CHECKING:
    from collections.abc import Iterable, Sequence

    from pydantic import ValidationError

_HINTS = {
    "missing": "add it",
    "string_type": "write a string",
    "list_type": "write a list",
}
# A model-level check names its field by starting its message with `field: `.
_FIELD_PREFIX = re.compile(r"^([a-z_]+): ")


@dataclass(frozen=True, slots=True)
class Problem:
    """One thing wrong, where: `field` is a key path such as `proxy[0].options.rules.0`."""

    field: str
    message: str
    hint: str | None = None


def did_you_mean(word: str, choices: Iterable[str]) -> str | None:
    """`did you mean 'command'?` when one of `choices` is close to `word`."""
    match = difflib.get_close_matches(word, list(choices), n=1, cutoff=0.6)
    return f"did you mean {match[0]!r}?" if match else None


def _models_in(annotation: Any) -> list[type[BaseModel]]:
    """The models an annotation can hold: `X`, `X | None`, `list[X]`, `dict[str, X]`, ..."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return [annotation]
    origin = typing.get_origin(annotation)
    args = typing.get_args(annotation)
    if origin is typing.Annotated:
        return _models_in(args[0])
    if origin in (typing.Union, types.UnionType, list, tuple, set, frozenset):
        return [m for arg in args for m in _models_in(arg)]
    if origin is dict and len(args) == 2:
        return _models_in(args[1])
    return []


def keys_at(model: type[BaseModel], loc: Sequence[str | int]) -> list[str]:
    """The keys accepted at `loc` (a pydantic error location, without its last part);
    empty where the content is free-form (an `env` table, a `dict[str, Any]`)."""
    models = [model]
    for part in loc:
        if isinstance(part, int):
            continue  # an item of a list: the models stay those of the list's items
        fields = {(f.alias or name): f for m in models for name, f in m.model_fields.items()}
        if part in fields:
            models = _models_in(fields[part].annotation)
        # anything else is a union branch's name (`function-after[...]`), not a key
    return sorted({(f.alias or name) for m in models for name, f in m.model_fields.items()})


def key_path(loc: Sequence[str | int], prefix: str = "") -> str:
    """`proxy[0].options.rules[1].action`: list items in brackets, keys dotted."""
    out = prefix
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        elif part in ("str", "list[str]") or "[" in part:
            continue  # union branch names from pydantic, not keys
        else:
            out += f".{part}" if out else part
    return out


def problems(error: ValidationError, model: type[BaseModel], *, prefix: str = "",
             unknown: str = "unknown key {key!r}") -> list[Problem]:
    """Every problem `error` names, with a key path below `prefix` and a hint."""
    out: list[Problem] = []
    for item in error.errors():
        loc = tuple(item["loc"])
        where = key_path(loc, prefix)
        if item["type"] == "extra_forbidden":
            key = str(loc[-1])
            accepted = keys_at(model, loc[:-1])
            hint = did_you_mean(key, accepted) or (
                f"remove it; accepted here: {', '.join(accepted)}" if accepted else
                "remove it, or check its spelling")
            out.append(Problem(where, unknown.format(key=key), hint))
            continue
        message = item["msg"].removeprefix("Value error, ")
        named = _FIELD_PREFIX.match(message)
        if named:
            where = f"{where}.{named.group(1)}" if where else named.group(1)
            message = message[named.end():]
        out.append(Problem(where, message, _HINTS.get(item["type"])))
    return out
