"""Pydantic validation errors as problems a person can fix: the key path, what is wrong, and
a hint, with "did you mean" for a misspelt key (chain files and plugin options alike).

Chain files are dataclasses (conductor/config.py) and plugin options pydantic models: both
are walked here to say which keys a place accepts.
"""

from __future__ import annotations

import dataclasses
import re
import types
import typing
from dataclasses import dataclass
from typing import TYPE_CHECKING, Annotated, Any

from pydantic import AfterValidator, BaseModel

from conductor.spelling import did_you_mean

if TYPE_CHECKING:
    from collections.abc import Sequence

    from pydantic import ValidationError

def compile_check(pattern: str) -> str:
    """`pattern`, when it compiles as a regular expression.

    Raises:
        ValueError: it does not (named by pydantic at the field that holds it).
    """
    try:
        re.compile(pattern)
    except re.error as e:
        raise ValueError(f"{pattern!r} is not a regular expression: {e}") from None
    return pattern


# A string that must compile as a regular expression, so a bad pattern fails at load, by
# field (plugin options: `patterns: list[Regex]`).
Regex = Annotated[str, AfterValidator(compile_check)]
# An unknown key, as pydantic names it for a model and for a dataclass.
_UNKNOWN = frozenset({"extra_forbidden", "unexpected_keyword_argument"})

_HINTS = {
    "missing": "add it",
    "string_type": "write a string",
    "list_type": "write a list",
    "dict_type": 'write a table: { NAME = "value" }',
    "bool_type": "write true or false, without quotes",
    "int_type": "write a whole number, without quotes",
    "float_type": "write a number, without quotes",
}
# A model-level check names its field by starting its message with `field: `.
_FIELD_PREFIX = re.compile(r"^([a-z_]+): ")


@dataclass(frozen=True, slots=True)
class Problem:
    """One thing wrong, where: `field` is a key path such as `proxy[0].options.rules.0`."""

    field: str
    message: str
    hint: str | None = None


def _models_in(annotation: Any) -> list[type]:
    """The models (pydantic models or dataclasses) an annotation can hold: `X`, `X | None`,
    `list[X]`, `dict[str, X]`, ..."""
    if isinstance(annotation, type) and (issubclass(annotation, BaseModel)
                                         or dataclasses.is_dataclass(annotation)):
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


def _fields(model: type) -> dict[str, Any]:
    """A model's keys and their annotations (a pydantic model's aliases; a dataclass's
    fields that a file may set)."""
    if isinstance(model, type) and issubclass(model, BaseModel):
        return {(f.alias or name): f.annotation for name, f in model.model_fields.items()}
    hints = typing.get_type_hints(model)
    fields = dataclasses.fields(model)  # type: ignore[arg-type]  # _models_in: a dataclass
    return {f.name: hints[f.name] for f in fields if f.init}


def keys_at(model: type, loc: Sequence[str | int]) -> list[str]:
    """The keys accepted at `loc` (a pydantic error location, without its last part);
    empty where the content is free-form (an `env` table, a `dict[str, Any]`)."""
    models = [model]
    for part in loc:
        if isinstance(part, int):
            continue  # an item of a list: the models stay those of the list's items
        fields = {key: hint for m in models for key, hint in _fields(m).items()}
        if part in fields:
            models = _models_in(fields[part])
        # anything else is a union branch's name (`function-after[...]`), not a key
    return sorted({key for m in models for key in _fields(m)})


def _branch(part: str | int) -> bool:
    """A union branch's name in a pydantic error location (`str`, `list[str]`), not a key."""
    return isinstance(part, str) and (part in ("str", "list[str]") or "[" in part)


def key_path(loc: Sequence[str | int], prefix: str = "") -> str:
    """`proxy[0].options.rules[1].action`: list items in brackets, keys dotted."""
    out = prefix
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        elif _branch(part):
            continue  # union branch names from pydantic, not keys
        else:
            out += f".{part}" if out else part
    return out


def problems(error: ValidationError, model: type, *, prefix: str = "",
             unknown: str = "unknown key {key!r}") -> list[Problem]:
    """Every problem `error` names, with a key path below `prefix` and a hint: one for
    each of `one_per_union(error)`, in order."""
    out: list[Problem] = []
    for item in one_per_union(error):
        loc = tuple(item["loc"])
        where = key_path(loc, prefix)
        if item["type"] in _UNKNOWN:
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
        out.append(Problem(where, message, item.get("hint") or _HINTS.get(item["type"])))
    return out


def one_per_union(error: ValidationError) -> list[dict[str, Any]]:
    """`error`'s items, a union's said once: pydantic names every branch a value missed
    (`command = 3`: not a string, not a list). When a branch took the value's type and
    only its contents are wrong (`["python", 1]`), what that branch says is the problem;
    when none did, one item says what the value may be."""
    items: list[dict[str, Any]] = [dict(item) for item in error.errors()]
    unions: dict[tuple[str | int, ...], list[dict[str, Any]]] = {}
    for item in items:
        loc = tuple(item["loc"])
        at = next((i for i, part in enumerate(loc) if _branch(part)), None)
        if at is not None:
            unions.setdefault(loc[:at], []).append(item)
    drop: set[int] = set()
    for where, branches in unions.items():
        missed = [b for b in branches if len(b["loc"]) == len(where) + 1]
        if len(missed) < len({b["loc"][len(where)] for b in branches}):
            drop.update(id(b) for b in missed)  # a branch fitted; its own problems stand
            continue
        hints = [_HINTS.get(b["type"]) for b in missed]
        missed[0]["msg"] = " or ".join(
            [missed[0]["msg"], *(b["msg"].removeprefix("Input should be ") for b in missed[1:])])
        if all(hints):
            missed[0]["hint"] = " or ".join(
                [str(hints[0]), *(str(h).removeprefix("write ") for h in hints[1:])])
        drop.update(id(b) for b in missed[1:])
    return [item for item in items if id(item) not in drop]
