"""A chain file that is right is read without pydantic (msgspec converts the same
dataclasses); pydantic decides every other file. The fast path must never accept what
pydantic refuses, nor build anything else than pydantic would."""

from __future__ import annotations

import dataclasses
import tomllib
from math import inf, nan
from typing import Any

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st
from pydantic import TypeAdapter, ValidationError

from conductor.acp import Dialect
from conductor.config import (
    BUILTIN_CHAINS,
    ChainConfig,
    ComponentSpec,
    McpServerSpec,
    SettingsSpec,
    _well_formed,
    parse_chain,
)
from conductor.errors import ConfigError

# Values a field may be given: right and wrong types, and the words the literals take.
WORDS = st.sampled_from(["", " ", "x", "python agent.py", "proxy", "spec", "legacy", "never",
                         "on-failure", "stdio", "http", "sse", "acp", "auto", "off",
                         "wss://box:8765/acp", "ws://h", "http://h", "p0", "bad name!",
                         "${HOME}", "[", "redact", "é", "a\n", "${A:-${B:-c}}", "WSS://H",
                         "A=B", "x\x00", "client", "successor"])
# TOML also has inf and nan, dates and times, and tables within tables.
SCALARS = st.one_of(WORDS, st.booleans(), st.integers(-2, 2_000_000),
                    st.floats(-1, 400, allow_nan=False), st.sampled_from([inf, -inf, nan]),
                    st.datetimes(), st.dates(), st.times(), st.none())
VALUES = st.one_of(SCALARS, st.lists(WORDS, max_size=3),
                   st.dictionaries(WORDS, WORDS, max_size=2),
                   st.dictionaries(WORDS, SCALARS, max_size=2),
                   st.dictionaries(WORDS, st.dictionaries(WORDS, SCALARS, max_size=2),
                                   max_size=2))

CHAIN = TypeAdapter(ChainConfig)  # pydantic's validator, built once (5-10 ms a build)

WORD_LISTS = st.lists(WORDS, max_size=2)
# TOML's integers reach 2**63 - 1: past 2**53 a float cannot hold them exactly.
NUMBERS = st.one_of(st.integers(-2, 2_000_000), st.floats(-1, 400, allow_nan=False),
                    st.integers(-(2**63), 2**63 - 1), st.sampled_from([inf, -0.0]))
# The type each key takes, so that most tables are nearly right and the rules between
# fields (not only the types) are what decides.
FITTING: dict[str, st.SearchStrategy[Any]] = {
    "command": st.one_of(WORDS, WORD_LISTS), "headers": st.dictionaries(WORDS, WORDS),
    "env": st.dictionaries(WORDS, WORDS), "options": st.dictionaries(WORDS, SCALARS),
    "inherit_env": st.booleans(), "optional": st.booleans(), "required": st.booleans(),
    "shutdown_grace": NUMBERS, "max_restarts": st.integers(-1, 2000),
    "max_frame_bytes": st.integers(0, 2_000_000), "secret_env": WORD_LISTS,
    "args": WORD_LISTS, "redact": WORD_LISTS, "session_idle_expiry": NUMBERS,
    "request_timeout": NUMBERS, "prompt_timeout": NUMBERS,
}


@st.composite
def table(draw: st.DrawFn, kind: type[Any], *required: str) -> dict[str, Any]:
    """A table for `kind`: some of its keys (now and then an unknown one), values mostly of
    the key's type, sometimes of any type."""
    keys = [f.name for f in dataclasses.fields(kind) if f.init]
    chosen = draw(st.sets(st.sampled_from(keys), max_size=4))
    if draw(st.integers(0, 9)) == 0:
        chosen.add("bogus")
    fitting = {key: FITTING.get(key, WORDS) for key in [*required, *chosen]}
    return {key: draw(VALUES if draw(st.integers(0, 5)) == 0 else fits)
            for key, fits in fitting.items()}


@st.composite
def chains(draw: st.DrawFn) -> dict[str, Any]:
    def now_and_then_wrong(fitting: st.SearchStrategy[Any]) -> Any:
        return draw(VALUES if draw(st.integers(0, 7)) == 0 else fitting)

    component = st.one_of(table(ComponentSpec, "command"), table(ComponentSpec, "use"),
                          table(ComponentSpec, "url"))
    data: dict[str, Any] = {}
    if draw(st.booleans()):
        data["conductor"] = now_and_then_wrong(table(SettingsSpec))
    if draw(st.booleans()):
        data["proxy"] = now_and_then_wrong(st.lists(component, max_size=3))
    if draw(st.booleans()):
        data["agent"] = now_and_then_wrong(component)
    if draw(st.booleans()):
        servers = st.one_of(table(McpServerSpec, "name", "command"),
                            table(McpServerSpec, "name", "type"))
        data["mcp_server"] = now_and_then_wrong(st.lists(servers, max_size=2))
    if draw(st.integers(0, 9)) == 0:
        data["bogus"] = draw(VALUES)
    return data


@settings(max_examples=500)  # about one in fifteen is right: ~30 compared per run
@given(chains())
def test_what_the_fast_path_accepts_pydantic_accepts_and_builds_the_same(
        data: dict[str, Any]) -> None:
    fast = _well_formed(data)
    if fast is None:
        return
    try:
        slow = CHAIN.validate_python(data)
    except ValidationError as e:  # pragma: no cover - the failure this test exists for
        raise AssertionError(f"the fast path accepted what pydantic refuses: {e}") from None
    assert_same(fast, slow)


def assert_same(fast: ChainConfig, slow: ChainConfig) -> None:
    """Equal, and of the same types all the way down: `==` takes 3 for 3.0 and "proxy" for
    Dialect.PROXY, and refuses nan for nan; the reprs of these types tell exactly that."""
    assert repr(fast) == repr(slow)


def test_every_built_in_chain_is_read_without_pydantic() -> None:
    for path in sorted(BUILTIN_CHAINS.glob("*.toml")):
        data = tomllib.loads(path.read_text())
        fast = _well_formed(data)
        assert fast is not None, path.name
        assert_same(fast, CHAIN.validate_python(data))


def test_the_comparison_tells_a_float_from_an_int_and_a_dialect_from_its_word() -> None:
    right = ChainConfig(agent=ComponentSpec(command="x", dialect=Dialect.PROXY,
                                            shutdown_grace=3.0))
    for wrong in (ComponentSpec(command="x", dialect=Dialect.PROXY, shutdown_grace=3),
                  ComponentSpec(command="x", dialect="proxy",  # type: ignore[arg-type]
                                shutdown_grace=3.0)):
        with pytest.raises(AssertionError):
            assert_same(right, ChainConfig(agent=wrong))


def test_a_key_msgspec_would_ignore_is_left_to_pydantic_which_names_it() -> None:
    data = {"agent": {"command": "agent", "comand": "typo"}}
    assert _well_formed(data) is None
    with pytest.raises(ConfigError, match="comand"):
        parse_chain(data)


@settings(max_examples=500)
@given(chains())
@example({"proxy": [{"name": "client", "command": 5}]})
def test_any_chain_file_is_read_or_refused_with_a_config_error_never_a_crash(
        data: dict[str, Any]) -> None:
    # A malformed [[proxy]] named "client" is held by a stand-in: building that stand-in
    # raised pydantic's ValidationError, a traceback, out of the config error.
    try:
        parse_chain(data, file="c.toml")
    except ConfigError:
        pass
