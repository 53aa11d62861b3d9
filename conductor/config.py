"""Chain files: TOML, with errors that name the file, the field and a fix.

The chain's types are plain dataclasses: serving a chain given on the command line
(`acp-conductor agent CMD...`) imports no validation library at all. A chain *file* that
is right is converted by msgspec (strictly, keys checked); any other is validated by
pydantic (`parse_chain`), imported only then: its types (`str | None`, `list[...]`,
literals) are checked field by field and every problem is reported at once;
the rules between fields live in each class's `__post_init__`, which names its field by
starting its message with `field: `. A file whose shape is wrong raises ChainShapeError,
which carries the chain its well-formed entries make, for `conductor.plan.read_chain` to
report what resolving them finds in the same error.
"""

from __future__ import annotations

import dataclasses
import itertools
import os
import re
import shlex
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, ClassVar, Literal, TypeVar

from conductor.acp import Dialect  # noqa: TC001 (pydantic resolves the annotations)
from conductor.errors import ChainShapeError, ConductorError, ConfigError
from conductor.jsonrpc.framing import DEFAULT_MAX_FRAME_BYTES
from conductor.routing.deadlines import Timeouts
from conductor.routing.mcp import McpServer

if TYPE_CHECKING:
    from collections.abc import Mapping

    from pydantic import TypeAdapter, ValidationError

    from conductor.tracing.redact import Redactor

# pydantic reads this from a dataclass: a misspelt key is an error, not ignored.
_STRICT: dict[str, Any] = {"extra": "forbid"}


class _Exact:
    """pydantic metadata: the field takes a value of its own type only, as msgspec's strict
    path does: not `"yes"` or `1` for true, not `true` for 1, nor `"30"` for 30.0 (pydantic's
    lax mode would, and hide the mistake). msgspec ignores it; an int is still a float."""

    def __get_pydantic_core_schema__(self, source: Any, handler: Any) -> Any:
        return {**handler(source), "strict": True}


Bool = Annotated[bool, _Exact()]
Int = Annotated[int, _Exact()]
Float = Annotated[float, _Exact()]


_NAME = r"[A-Za-z0-9_.:-]+"  # a component's name
_VAR_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
# A value that is `$NAME` alone: a shell's spelling, which env values (passed to the
# process as written, no shell between) do not get: the component would see the text
# `$NAME`. Only the whole value: `$` inside one is as likely meant (a password, a command a
# shell runs later: `GIT_SSH_COMMAND = "ssh -i $HOME/k"`).
_BARE_VARIABLE = re.compile(r"\$([A-Za-z_][A-Za-z0-9_]*)")


def bare_variables(text: str) -> list[str]:
    """`[NAME]` when `text` is a bare `$NAME` and nothing else, else `[]`."""
    whole = _BARE_VARIABLE.fullmatch(text.strip())
    return [whole.group(1)] if whole else []


def bare_variable_warning(names: list[str]) -> str:
    """What to say of an env value with `$NAME` in it (`bare_variables`)."""
    spelled = ", ".join(f"${name}" for name in names)
    fixed = ", ".join(f"${{{name}}}" for name in names)
    return (f"holds {spelled}, which reaches the component as written (the conductor "
            f"expands {fixed}, with braces); write {fixed} to pass the variable")
# What the conductor calls the ends of a chain in routing and traces (their lanes): a
# component by one of these names would be drawn as, and taken for, that end.
_OWN_NAMES = {"client": "the editor's side", "conductor": "itself",
              "successor": "what follows it when it runs as a proxy"}


class _Unclosed(Exception):
    """`${NAME` (or `${NAME:-...`) whose `}` never comes."""

    def __init__(self, name: str, before: list[str | tuple[str, str | None]]) -> None:
        super().__init__(name)
        self.name = name
        self.before = before  # what was read before it


def _parts(text: str) -> list[str | tuple[str, str | None]]:
    """`text` as literal strings and `(NAME, default)` references. A default is read up to
    its own `}`, each `${` in it opening a brace of its own, so defaults nest as a shell's do
    (`${A:-${B:-${C}}}`). A `${...}` that is not `${NAME}` or `${NAME:-...}` (`${1}`,
    `${HOME%/}`) is left as text, for the shell a command runs.

    Raises:
        _Unclosed: a `${NAME` with no `}` to close it: a typo, that passed on literally would
            reach the component.
    """
    out: list[str | tuple[str, str | None]] = []
    i = done = 0
    while (i := text.find("${", i)) != -1:
        name = _VAR_NAME.match(text, i + 2)
        if name is None:
            i += 2
            continue
        after = name.end()
        if text.startswith("}", after):
            default, end = None, after + 1
        elif text.startswith(":-", after):
            depth, j = 0, after + 2
            while j < len(text) and (depth or text[j] != "}"):
                if text.startswith("${", j):
                    depth, j = depth + 1, j + 2
                    continue
                depth -= text[j] == "}"
                j += 1
            if j == len(text):
                raise _Unclosed(name.group(), out)
            default, end = text[after + 2:j], j + 1
        elif "}" in text[after:]:
            i = after  # a shell expression (`${HOME%/}`): the shell's
            continue
        else:
            raise _Unclosed(name.group(), out)
        out += [text[done:i], (name.group(), default)]
        i = done = end
    out.append(text[done:])
    return out


def variables(text: str) -> list[tuple[str, str | None]]:
    """The `${VAR}`s a value names, each with its default (None when it has none); those
    before an unclosed one only."""
    try:
        parts = _parts(text)
    except _Unclosed as e:
        parts = e.before
    return [part for part in parts if isinstance(part, tuple)]


_EMPTY_COMMAND = ('command: command is empty (hint: give the program to run and its arguments, '
                  'e.g. command = ["npx", "-y", "my-acp-agent"])')


def unclosed_variable(text: str) -> str | None:
    """NAME of a `${NAME` that is never closed, or None."""
    try:
        _parts(text)
    except _Unclosed as e:
        return e.name
    return None


def expand(text: str, environ: dict[str, str], *, where: str, file: str | None) -> str:
    """`${VAR}` and `${VAR:-default}`; `${PYTHON}` is the interpreter running the conductor.

    Raises:
        ConfigError: a variable is unset and has no default, or `${NAME` is not closed.
    """
    try:
        parts = _parts(text)
    except _Unclosed as e:
        raise ConfigError(f"${{{e.name} is not closed", file=file, field=where,
                          hint=f"write ${{{e.name}}} (or ${{{e.name}:-default}})") from None
    out: list[str] = []
    for part in parts:
        if isinstance(part, str):
            out.append(part)
            continue
        name, default = part
        if name == "PYTHON":
            out.append(sys.executable)
        elif environ.get(name) or (name in environ and default is None):
            out.append(environ[name])
        elif default is not None:  # unset or empty, as a shell's `:-` reads it
            out.append(expand(default, environ, where=where, file=file))
        else:
            raise ConfigError(f"environment variable {name} is not set", file=file,
                              field=where, hint=f"export {name}, or write ${{{name}:-default}}")
    return "".join(out)


@dataclass
class ComponentSpec:
    """One `[[proxy]]` table or the `[agent]` table."""

    __pydantic_config__: ClassVar[dict[str, Any]] = _STRICT

    name: str | None = None
    command: str | list[str] | None = None  # a command line or an argv list
    use: str | None = None       # an installed plugin proxy (entry point), run in-process
    plugin: str | None = None    # "package.module:Class" or "file.py:Class", run in-process
    url: str | None = None       # a remote component: ws:// or wss:// (docs/remote.md)
    headers: dict[str, str] = field(default_factory=dict)  # sent to `url`; values expand ${VAR}
    options: dict[str, Any] | None = None  # validated by the plugin's options model
    env: dict[str, str] = field(default_factory=dict)
    inherit_env: Bool = True
    cwd: str | None = None
    dialect: Dialect | None = None
    shutdown_grace: Float | None = None
    secret_env: list[str] = field(default_factory=list)  # env names whose values traces redact
    # -- reliability (docs/reliability.md) --
    restart: Literal["never", "on-failure"] = "never"  # start it again when it exits unexpectedly
    max_restarts: Int = 5        # restarts in a row; the failure after them gives it up
    optional: Bool = False       # a proxy the chain goes on without when it fails for good

    def __post_init__(self) -> None:
        if self.name is not None and not re.fullmatch(_NAME, self.name):
            raise ValueError("name: use letters, digits and _ . : - only")
        if self.name in _OWN_NAMES:
            raise ValueError(f"name: {self.name!r} is the conductor's own name for "
                             f"{_OWN_NAMES[self.name]} (hint: choose another)")
        if (isinstance(self.command, str) and not self.command.strip()) or (
                isinstance(self.command, list) and not self.command):
            raise ValueError(_EMPTY_COMMAND)
        if isinstance(self.command, str):
            try:  # split now: an unclosed quote is the file's mistake, not a crash at start
                argv = shlex.split(self.command)
            except ValueError as e:
                raise ValueError(f"command: cannot split it as a shell would: {e} (hint: close "
                                 "the quote, or give an argv list)") from None
            if not argv:
                raise ValueError(_EMPTY_COMMAND)
        elif isinstance(self.command, list) and not self.command[0].strip():
            raise ValueError("command: the program (its first item) is empty")
        argv = [self.command] if isinstance(self.command, str) else self.command or []
        if any("\0" in a for a in argv):
            raise ValueError(f"command: it has a NUL character{_NUL_HINT}")
        if self.cwd is not None and "\0" in self.cwd:
            raise ValueError(f"cwd: it has a NUL character{_NUL_HINT}")
        if (problem := _env_problem(self.env)) is not None:
            raise ValueError(f"env: {problem}")
        if self.shutdown_grace is not None and not 0 <= self.shutdown_grace <= 300:
            raise ValueError("shutdown_grace: give a number of seconds from 0 to 300")
        given = [k for k in ("command", "use", "plugin", "url") if getattr(self, k) is not None]
        if not given:
            raise ValueError("command: Field required (hint: add it; an in-process proxy "
                             "takes `use = NAME` or `plugin = \"module:attr\"` instead, a "
                             "remote one `url = \"wss://...\"`)")
        if len(given) > 1:
            raise ValueError(f"{given[1]}: give exactly one of command, use, plugin, url "
                             f"(got {', '.join(given)})")
        if self.command is not None and self.options is not None:
            raise ValueError("options: options are for plugin proxies (use/plugin); pass a "
                             "command its settings on its command line or env")
        extra = _given(self, "env", "cwd", "dialect")
        if self.in_process and extra:
            raise ValueError(f"{extra}: env, cwd and dialect are for command components; an "
                             "in-process plugin shares the conductor's")
        if self.url is not None:
            if self.env or self.cwd or self.secret_env or not self.inherit_env:
                raise ValueError("url: env, cwd, inherit_env and secret_env are for command "
                                 "components; a remote one gets `headers`")
            # With a `${VAR}` it is checked once expanded (`remote_url`), like an MCP url.
            if "${" not in self.url and not re.match(r"(?i)wss?://[^/?#\s]+", self.url):
                raise ValueError(f"url: {self.url!r} is not a ws:// or wss:// address "
                                 "(e.g. wss://build-box:8765/acp)")
        elif self.headers:
            raise ValueError("headers: only a remote component (`url = ...`) sends headers")
        if (self.in_process or self.url is not None) and (
                self.restart != "never" or self.optional):
            raise ValueError("restart: restart and optional are for command components; an "
                             "in-process plugin runs, and fails, with the conductor, and a "
                             "remote one is not ours to start")
        if not 1 <= self.max_restarts <= 1000:
            raise ValueError("max_restarts: give a number from 1 to 1000")

    @property
    def in_process(self) -> bool:
        return self.use is not None or self.plugin is not None

    @property
    def remote(self) -> bool:
        return self.url is not None

    def argv(self) -> list[str]:
        assert self.command is not None, "in-process components have no argv"
        return shlex.split(self.command) if isinstance(self.command, str) else list(self.command)


@dataclass
class McpServerSpec:
    """One `[[mcp_server]]` table: injected into every session the agent sets up."""

    __pydantic_config__: ClassVar[dict[str, Any]] = _STRICT

    name: str
    type: Literal["stdio", "http", "sse", "acp"] = "stdio"
    command: str | None = None
    args: list[str] = field(default_factory=list)
    env: dict[str, str] = field(default_factory=dict)
    url: str | None = None
    headers: dict[str, str] = field(default_factory=dict)
    provider: str | None = None  # acp: the proxy offering it
    required: Bool = False       # refuse the session when the agent cannot take it

    def __post_init__(self) -> None:
        if not self.name.strip():
            raise ValueError("name: give the server a name (the agent tells servers apart "
                             "by it)")
        if self.type == "acp":
            if not self.provider:
                raise ValueError("provider: an acp MCP server needs `provider`, the name of "
                                 "the proxy that offers it")
            extra = _given(self, "command", "args", "env", "url", "headers")
            if extra:
                raise ValueError(f"{extra}: an acp MCP server is offered by its provider: it "
                                 "takes no command, args, env, url or headers")
            return
        if self.provider:
            raise ValueError("provider: only acp MCP servers have a provider")
        if (problem := _env_problem(self.env)) is not None:
            raise ValueError(f"env: {problem}")
        if self.type == "stdio":
            if not self.command and self.url:  # `type` left out: it defaults to stdio
                raise ValueError('type: a server reached at `url` needs type = "http" (or '
                                 '"sse"); without `type` it is a stdio one')
            if not self.command:
                raise ValueError("command: a stdio MCP server needs `command`")
            extra = _given(self, "url", "headers")
            if extra:
                raise ValueError(f"{extra}: `url` and `headers` are for http/sse servers; "
                                 "set type")
        else:
            if not self.url:
                raise ValueError(f"url: an {self.type} MCP server needs `url`")
            extra = _given(self, "command", "args", "env")
            if extra:
                raise ValueError(f"{extra}: `command`, `args` and `env` are for stdio servers")


_NUL_HINT = " (hint: a process cannot be given one; remove the \\u0000)"


def _env_problem(env: dict[str, str]) -> str | None:
    """What no process's environment can hold (the start would fail naming no key)."""
    for name, value in env.items():
        if not name or "=" in name or "\0" in name:
            return (f"{name!r} cannot be an environment variable's name (hint: a name is not "
                    "empty and has no '=')")
        if "\0" in value:
            return f"{name}'s value has a NUL character{_NUL_HINT}"
    return None


def _given(spec: object, *keys: str) -> str | None:
    """The first of `keys` the table sets: the field a rule between fields names."""
    return next((key for key in keys if getattr(spec, key)), None)


@dataclass
class SettingsSpec:
    """The optional `[conductor]` table."""

    __pydantic_config__: ClassVar[dict[str, Any]] = _STRICT

    max_frame_bytes: Int = DEFAULT_MAX_FRAME_BYTES
    shutdown_grace: Float = 3.0
    redact: list[str] = field(default_factory=list)  # regexes whose matches traces redact
    mcp_bridge: Literal["auto", "http", "stdio", "off"] = "auto"  # acp servers, agent without
    # -- reliability (docs/reliability.md); all off by default --
    session_idle_expiry: Float | None = None  # seconds without a turn: a session is released
    request_timeout: Float | None = None  # seconds a request toward the agent may go unanswered
    prompt_timeout: Float | None = None   # the same for session/prompt, a whole turn

    def __post_init__(self) -> None:
        if self.max_frame_bytes < 1024:
            raise ValueError("max_frame_bytes: give at least 1024 bytes")
        if not 0 <= self.shutdown_grace <= 300:
            raise ValueError("shutdown_grace: give a number of seconds from 0 to 300")
        for pattern in self.redact:
            try:
                re.compile(pattern)
            except re.error as e:
                raise ValueError(f"redact: {pattern!r} is not a regular expression: {e}") \
                    from None
        for key in ("session_idle_expiry", "request_timeout", "prompt_timeout"):
            value = getattr(self, key)
            if value is not None and not value > 0:
                raise ValueError(f"{key}: give a number of seconds above 0 (or leave it out: "
                                 "off)")

    def timeouts(self) -> Timeouts:
        return Timeouts(request=self.request_timeout, prompt=self.prompt_timeout,
                        session_idle_expiry=self.session_idle_expiry)

@dataclass
class ChainConfig:
    """A whole chain file."""

    __pydantic_config__: ClassVar[dict[str, Any]] = _STRICT

    conductor: SettingsSpec = field(default_factory=SettingsSpec)
    proxy: list[ComponentSpec] = field(default_factory=list)
    agent: ComponentSpec | None = None
    mcp_server: list[McpServerSpec] = field(default_factory=list)
    source: str | None = field(default=None, init=False)  # the file it came from
    base_dir: str | None = field(default=None, init=False)
    # A partial chain (ChainShapeError.partial): the entries held by stand-ins, never to be
    # resolved ("proxy[1]", "agent", "mcp_server[0]"; "proxy": the whole table).
    malformed: frozenset[str] = field(default=frozenset(), init=False)

    def proxy_names(self) -> list[str]:
        """Each proxy's name: its `name`, else what it runs (`use = "redact"` is `redact`,
        `plugin = "pkg.mod:Guard"` is `guard`; a second `redact` is `redact-2`), else
        `proxy:N` for a command. A default never takes a name given explicitly."""
        taken = {p.name for p in self.proxy if p.name} | {self.agent_name(), *_OWN_NAMES}
        names: list[str] = []
        for i, spec in enumerate(self.proxy):
            if spec.name:
                names.append(spec.name)
                continue
            base = _default_name(spec) or f"proxy:{i}"
            name, n = base, 1
            while name in taken:
                n += 1
                name = f"{base}-{n}"
            taken.add(name)
            names.append(name)
        return names

    def agent_name(self) -> str:
        return (self.agent.name if self.agent and self.agent.name else None) or "agent"


def _default_name(spec: ComponentSpec) -> str | None:
    """An in-process proxy is called after what it runs; a command has no such name."""
    if spec.use is not None:
        ref = spec.use
    elif spec.plugin is not None:
        module, _, attr = spec.plugin.partition(":")
        ref = attr or Path(module).stem
    else:
        return None
    name = re.sub(r"[^A-Za-z0-9_.:-]+", "-", ref).strip("-").lower()
    return name or None


def config_error_from_validation(error: ValidationError, file: str | None) -> ConductorError:
    """One ConfigError naming every problem with its key path, and a fix for each."""
    return ConfigError.combine(_shape_problems(error, file), file)


def _shape_problems(error: ValidationError, file: str | None) -> list[ConductorError]:
    from conductor.validation import Problem, one_per_union, problems

    found = problems(error, ChainConfig)  # one for each of one_per_union(error), in order
    for i, item in enumerate(one_per_union(error)):
        brackets = _brackets(item["type"], tuple(item["loc"]), item["input"])
        if brackets:  # said in TOML's terms, not pydantic's ("an instance of ComponentSpec")
            found[i] = Problem(found[i].field, *brackets)
    return [ConfigError(p.message, file=file, field=p.field, hint=p.hint) for p in found]


def _brackets(kind: str, loc: tuple[str | int, ...], value: object) -> tuple[str, str] | None:
    """What to write, for a section that is not the kind of table it should be: the usual
    mistake is its brackets (`[[agent]]`, `[proxy]`)."""
    if not loc or loc[0] not in _SECTIONS:
        return None
    section = str(loc[0])
    listed = section in ("proxy", "mcp_server")
    if kind == "list_type" and loc == (section,) and listed:
        return ("should be a list of tables",
                f"write [[{section}]], with double brackets, for each one")
    entry = len(loc) == 2 and isinstance(loc[1], int) if listed else len(loc) == 1
    if kind != "dataclass_type" or not entry:
        return None
    if not listed and isinstance(value, list):
        return ("should be one table, not a list of them",
                f"write [{section}], with single brackets")
    return "should be a table", (f"write [[{section}]]" if listed else f"write [{section}]") \
        + " and its keys below it"


def parse_chain(data: dict[str, Any], *, file: str | None = None,
                base_dir: str | None = None) -> ChainConfig:
    """Validate a decoded chain file: msgspec for one that is right, pydantic (imported only
    then) to say what is wrong with one that is not.

    Raises:
        ChainShapeError: keys or types are wrong, or entries do not fit together; it names
            every such problem and carries the chain the well-formed entries make
            (`partial`), for what resolving them finds to be reported with them.
    """
    config = _well_formed(data)
    if config is None:
        config = _validated(data, file=file, base_dir=base_dir)
    config.source, config.base_dir = file, base_dir
    found = _chain_problems(config)
    if found:  # every entry is well-formed: the whole chain is the partial one
        raise _shape_error(found, file, config)
    return config


def _well_formed(data: dict[str, Any]) -> ChainConfig | None:
    """The chain a well-formed file makes, without pydantic: msgspec (already loaded for
    the wire) converts the same dataclasses strictly, running their `__post_init__` rules,
    and the keys are checked here (msgspec ignores unknown ones). It accepts a subset of
    what pydantic accepts (no lax coercions) and builds the same objects
    (tests/test_config.py compares both on generated files); anything else returns None
    and pydantic, which reports every problem at once, decides. Saves ≈ 70-90 ms of start-up
    (pydantic's import and validator build) for every chain file that is right."""
    if not _known_keys(data):
        return None
    import msgspec

    try:
        return msgspec.convert(data, ChainConfig, strict=True)
    except Exception:  # whatever it is, pydantic says it properly
        return None


def _init_keys(kind: type[Any]) -> frozenset[str]:
    return frozenset(f.name for f in dataclasses.fields(kind) if f.init)


def _known_keys(data: object) -> bool:
    """Every table of the file has only keys its dataclass takes (free-form tables such as
    `env`, `headers` and `options` excepted: their values are not fields)."""
    if not isinstance(data, dict) or not data.keys() <= _init_keys(ChainConfig):
        return False
    tables: list[tuple[object, type[Any]]] = []
    if "conductor" in data:
        tables.append((data["conductor"], SettingsSpec))
    if "agent" in data:
        tables.append((data["agent"], ComponentSpec))
    for key, kind in (("proxy", ComponentSpec), ("mcp_server", McpServerSpec)):
        entries = data.get(key, [])
        if not isinstance(entries, list):
            return False
        tables.extend((entry, kind) for entry in entries)
    return all(isinstance(table, dict) and table.keys() <= _init_keys(kind)
               for table, kind in tables)


def _validated(data: dict[str, Any], *, file: str | None, base_dir: str | None) -> ChainConfig:
    """`data` validated by pydantic, imported only here.

    Raises:
        ChainShapeError: every problem of the file's shape, and those between its
            well-formed entries, with the chain they make.
    """
    from pydantic import ValidationError

    try:
        return _validate(ChainConfig, data)
    except ValidationError as e:
        partial = _partial(data, e, file=file, base_dir=base_dir)
        raise _shape_error([*_shape_problems(e, file), *_chain_problems(partial)], file,
                           partial) from None


_T = TypeVar("_T")
_ADAPTERS: dict[type[Any], TypeAdapter[Any]] = {}


def _validate(kind: type[_T], raw: object) -> _T:
    """`raw` validated as `kind` by pydantic, whose validator for `kind` is built once per
    process: a build costs 5-10 ms, paid again for each entry of a misshapen file, and for
    each file a program reads after its first (nested chains, `doctor`, a plugin's tests)."""
    adapter = _ADAPTERS.get(kind)
    if adapter is None:
        from pydantic import TypeAdapter

        adapter = _ADAPTERS[kind] = TypeAdapter(kind)
    validated: _T = adapter.validate_python(raw)
    return validated


def _shape_error(found: list[ConductorError], file: str | None,
                 partial: ChainConfig) -> ChainShapeError:
    error = ChainShapeError.combine(found, file)
    if not isinstance(error, ChainShapeError):  # one problem: itself, made a shape error
        assert isinstance(error, ConfigError)
        error = ChainShapeError(error.message, file=file, field=error.field, hint=error.hint)
    error.partial = partial
    return error


def _chain_problems(config: ChainConfig) -> list[ConductorError]:
    """What is wrong between the entries of a well-shaped chain (or between the well-formed
    entries of a partial one)."""
    file = config.source
    found: list[ConductorError] = []
    if config.agent is not None and config.agent.in_process:
        found.append(ConfigError(
            "the agent must be a command; plugins run as proxies", file=file,
            field="agent.use" if config.agent.use else "agent.plugin",
            hint="move it to a [[proxy]] table and give [agent] a command"))
    if config.agent is not None and config.agent.optional:
        found.append(ConfigError(
            "the agent cannot be optional: there is no chain without it", file=file,
            field="agent.optional",
            hint='remove it; `restart = "on-failure"` brings a failed agent back'))
    for i, server in enumerate(config.mcp_server):
        if "proxy" in config.malformed or f"mcp_server[{i}]" in config.malformed:
            continue  # the proxies' names, or the entry itself, are not known
        if server.type == "acp" and server.provider not in config.proxy_names():
            found.append(ConfigError(
                f"provider {server.provider!r} is not a proxy of this chain", file=file,
                field=f"mcp_server[{i}].provider",
                hint="name a [[proxy]] (by its `name`, or proxy:N) that offers the MCP server "
                     f"{server.name!r}"))
    servers: set[str] = set()
    for i, server in enumerate(config.mcp_server):
        if f"mcp_server[{i}]" in config.malformed:
            continue
        if server.name in servers:  # the agent would get two servers it cannot tell apart
            found.append(ConfigError(f"duplicate MCP server name {server.name!r}", file=file,
                                     field=f"mcp_server[{i}].name",
                                     hint="give every [[mcp_server]] its own name"))
        servers.add(server.name)
    names = [*config.proxy_names(), config.agent_name()]
    seen: dict[str, int] = {}
    for i, name in enumerate(names):
        agent = i == len(config.proxy)
        if name in seen and not (agent and "agent" in config.malformed):
            if agent and not (config.agent and config.agent.name):
                # The agent's default name: the fix is where the proxy's name is written.
                found.append(ConfigError(
                    f"{name!r} is the agent's name (the default, without `name` in [agent])",
                    file=file, field=f"proxy[{seen[name]}].name",
                    hint="give the proxy another name, or name the agent"))
            else:
                where = "agent.name" if agent else f"proxy[{i}].name"
                found.append(ConfigError(f"duplicate component name {name!r}", file=file,
                                         field=where, hint="give every component its own name"))
        seen.setdefault(name, i)
    return found


# The tables of a chain file whose entries a partial chain keeps when they are well-formed.
_SECTIONS = ("conductor", "proxy", "agent", "mcp_server")


def _partial(data: dict[str, Any], error: ValidationError, *, file: str | None,
             base_dir: str | None) -> ChainConfig:
    """The chain the well-formed entries of a misshapen file make, for reporting what they
    would meet at start-up along with the shape problems. A malformed [[proxy]] or
    [[mcp_server]] keeps its place as a stand-in named as the file names it (so key paths
    and default names stay the file's), listed in `malformed` and never resolved."""
    from pydantic import ValidationError

    malformed: set[str] = set()
    for item in error.errors():
        loc = item["loc"]
        if len(loc) > 1 and loc[0] in ("proxy", "mcp_server") and isinstance(loc[1], int):
            malformed.add(f"{loc[0]}[{loc[1]}]")
        elif loc and loc[0] in _SECTIONS:
            malformed.add(str(loc[0]))  # the table itself: not a table, not a list

    def entry(kind: type[Any], raw: object, where: str) -> Any:
        if where not in malformed:
            try:
                return _validate(kind, raw)
            except ValidationError:
                malformed.add(where)  # pydantic said nothing of it above; be safe anyway
        return None

    settings = entry(SettingsSpec, data["conductor"], "conductor") \
        if "conductor" in data else None
    proxies: list[ComponentSpec] = []
    if isinstance(data.get("proxy"), list) and "proxy" not in malformed:
        for i, raw in enumerate(data["proxy"]):
            proxies.append(entry(ComponentSpec, raw, f"proxy[{i}]") or _stand_in(raw))
    agent = entry(ComponentSpec, data["agent"], "agent") if data.get("agent") is not None else None
    servers: list[McpServerSpec] = []
    if isinstance(data.get("mcp_server"), list) and "mcp_server" not in malformed:
        for i, raw in enumerate(data["mcp_server"]):
            server = entry(McpServerSpec, raw, f"mcp_server[{i}]")
            name = raw.get("name") if isinstance(raw, dict) else None
            servers.append(server or McpServerSpec(
                name=name if isinstance(name, str) and name.strip() else "?",
                command="(malformed)"))
    config = ChainConfig(conductor=settings or SettingsSpec(), proxy=proxies, agent=agent,
                         mcp_server=servers)
    config.source, config.base_dir = file, base_dir
    config.malformed = frozenset(malformed)
    return config


def _stand_in(raw: object) -> ComponentSpec:
    """A malformed [[proxy]]'s place holder: named as the file names it (its `name`, else
    what it `use`s), so that its siblings keep their default names."""
    entry: dict[str, Any] = raw if isinstance(raw, dict) else {}
    name = entry.get("name")
    named = name if isinstance(name, str) and re.fullmatch(_NAME, name) \
        and name not in _OWN_NAMES else None
    if isinstance(entry.get("use"), str):
        return ComponentSpec(name=named, use=entry["use"])
    if isinstance(entry.get("plugin"), str):
        return ComponentSpec(name=named, plugin=entry["plugin"])
    return ComponentSpec(name=named, command="(malformed)")


def _builtin_chains_dir() -> Path:
    """The built-in chains: the repo's top-level chains/ folder, which a wheel carries as
    package data (conductor/chains, pyproject's force-include), so every install has them."""
    packaged = Path(__file__).parent / "chains"
    return packaged if packaged.is_dir() else Path(__file__).parent.parent / "chains"


BUILTIN_CHAINS = _builtin_chains_dir()


def builtin_chains() -> dict[str, Path]:
    """The built-in chains by name (the file's stem)."""
    return {p.stem: p for p in sorted(BUILTIN_CHAINS.glob("*.toml"))}


def chain_path(ref: str | os.PathLike[str]) -> Path:
    """The file `--chain REF` means: REF itself when it is a file, or looks like a path (has
    a `/` or ends in `.toml`); otherwise the built-in chain named REF (`--chain demo`).

    Raises:
        ConfigError: REF is neither a file nor a built-in chain's name.
    """
    path = Path(ref)
    text = str(ref)
    if path.is_file() or "/" in text or text.endswith(".toml"):
        return path
    builtin = builtin_chains().get(text)
    if builtin is None:
        names = ", ".join(builtin_chains()) or "none"
        from conductor.spelling import did_you_mean

        # `--chain chain` for the chain.toml `init` wrote is the likeliest slip.
        guess = (f"did you mean {text + '.toml'!r}?" if Path(text + ".toml").is_file()
                 else did_you_mean(text, builtin_chains()))
        raise ConfigError(f"no file {text!r} here, and no built-in chain by that name "
                          f"(built in: {names})", field="--chain",
                          hint=(f"{guess} " if guess else "") +
                          "give the path of a chain file, or a built-in chain's name; "
                          "`acp-conductor chains` lists them")
    return builtin


def load_chain(path: str | os.PathLike[str]) -> ChainConfig:
    """Read and validate a chain file, given by path or as a built-in chain's name.

    Raises:
        ConfigError: the file cannot be read, is not TOML, or is not a valid chain.
    """
    path = chain_path(path)
    file = str(path)
    try:
        text = path.read_text(encoding="utf-8-sig")  # a BOM (Windows editors) is no error
    except FileNotFoundError:
        # `--chain demo.toml` for the built-in `demo`: a name, not a file in this folder
        stem = path.stem if path.suffix == ".toml" and "/" not in str(path) else None
        hint = f"`{stem}` is a built-in chain: give its name alone, `--chain {stem}`" \
            if stem is not None and stem in builtin_chains() else \
            "give the path of a chain TOML file, or a built-in chain's name " \
            "(`acp-conductor chains` lists them)"
        raise ConfigError("file not found", file=file, hint=hint) from None
    except IsADirectoryError as e:
        raise ConfigError(f"cannot read: {e.strerror}", file=file,
                          hint="give the path of a chain TOML file, not its folder") from None
    except OSError as e:
        raise ConfigError(f"cannot read: {e.strerror}", file=file) from None
    except UnicodeDecodeError as e:  # TOML is UTF-8; say where, not a traceback
        line = e.object[:e.start].count(b"\n") + 1
        raise ConfigError(f"not UTF-8: byte 0x{e.object[e.start]:02x} on line {line}",
                          file=file, hint="TOML files are UTF-8; save it as UTF-8") from None
    import tomllib  # here: agent mode (`agent CMD...`) reads no file, and starts sooner

    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        raise ConfigError(f"not valid TOML: {e}", file=file) from None
    return parse_chain(data, file=file, base_dir=str(path.resolve().parent))


def chain_from_commands(commands: list[str], *, with_agent: bool) -> ChainConfig:
    """The chain that `acp-conductor agent CMD...` / `proxy CMD...` describe (built as is:
    there is no file to validate, and nothing to import for it).

    Raises:
        ConfigError: a command is empty.
    """
    specs: list[ComponentSpec] = []
    for i, command in enumerate(commands):
        try:
            specs.append(ComponentSpec(command=command))
        except ValueError as e:
            raise ConfigError(str(e).partition(": ")[2] or str(e), file=COMMAND_LINE,
                              field=f"COMMANDS[{i}]") from None
    if with_agent:
        config = ChainConfig(proxy=specs[:-1], agent=specs[-1])
    else:
        config = ChainConfig(proxy=specs)
    config.source, config.base_dir = COMMAND_LINE, os.getcwd()
    return config


# The `[[mcp_server]]` names (a JSON list) that the chain file asks a proxy run as a command
# to declare: how a stand-alone plugin (`serve-proxy`) learns its `mcp_requested`. Set, or
# removed, for every command, so that a nested conductor's own value goes no further.
MCP_REQUESTED_ENV = "ACP_CONDUCTOR_MCP_REQUESTED"
# The name the chain gives a proxy run as a command (what its logs and errors should say,
# docs/writing-a-proxy.md): `serve-proxy` takes it when no `--name` is given. Set for every
# proxy command and removed for the agent's, for the same reason.
PROXY_NAME_ENV = "ACP_CONDUCTOR_PROXY_NAME"


def component_environment(spec: ComponentSpec, *, file: str | None, where: str) -> dict[str, str]:
    """The environment a component starts with.

    Raises:
        ConfigError: an `${VAR}` names an unset variable (every such one).
    """
    base = dict(os.environ) if spec.inherit_env else {"PATH": os.environ.get("PATH", "")}
    found: list[ConductorError] = []
    for key, value in spec.env.items():
        if "$" in value and (bare := bare_variables(value)):
            import logging

            logging.getLogger("acp_conductor").warning(
                "%s: %s.env.%s %s", file or "chain", where, key, bare_variable_warning(bare))
        try:
            base[key] = expand(value, dict(os.environ), where=f"{where}.env.{key}", file=file)
        except ConfigError as e:
            found.append(e)
    if found:
        raise ConfigError.combine(found, file)
    return base


def component_cwd(spec: ComponentSpec, config: ChainConfig, *, where: str,
                  environ: Mapping[str, str] | None = None) -> str | None:
    """The directory a component runs in: `cwd` (relative to the chain file's folder), else
    that folder itself, so relative arguments (`python agent.py`) mean the same wherever the
    editor started the conductor. None (inherit) only for a chain that has no folder.

    Raises:
        ConfigError: a variable is unset, or `cwd` is not a directory.
    """
    if spec.cwd is None:
        return config.base_dir
    cwd = expand(os.path.expanduser(spec.cwd),  # `~/project`, as a shell would read it
                 dict(os.environ if environ is None else environ),
                 where=f"{where}.cwd", file=config.source)
    given = cwd
    if config.base_dir and not os.path.isabs(cwd):
        cwd = os.path.join(config.base_dir, cwd)
    # Checked here, not at spawn: there it is a start failure naming neither file nor key.
    if not os.path.isdir(cwd):
        where_from = relative_to_chain(config.base_dir, config.source) \
            if not os.path.isabs(given) else ""
        problem = "not found" if not os.path.exists(cwd) else "is not a directory"
        raise ConfigError(f"{given} {problem}" + (f" ({where_from})" if where_from else ""),
                          file=config.source, field=f"{where}.cwd",
                          hint=relative_hint(config.source, "a folder"))
    return cwd


COMMAND_LINE = "<command line>"  # the `source` of a chain given as commands (`agent A B`)


def relative_to_chain(base_dir: str | None, source: str | None = None) -> str:
    """How an error names the folder relative paths were taken from."""
    if not base_dir:
        return "relative"
    if source == COMMAND_LINE:
        return f"relative to {base_dir}, the current folder"
    return f"relative to {base_dir}, the chain file's folder"


def relative_hint(source: str | None, what: str = "a path") -> str:
    base = "the current folder" if source == COMMAND_LINE else "the chain file"
    return f"give {what} relative to {base}, or an absolute one"


def component_argv(spec: ComponentSpec, *, file: str | None, where: str,
                   base_dir: str | None = None,
                   environ: Mapping[str, str] | None = None) -> list[str]:
    """The command with variables expanded. A program named by a relative path (`./agent.py`,
    `bin/agent`: it has a `/`, as a shell would see it) is taken relative to `base_dir`, the
    chain file's folder; a bare name (`npx`) is looked up in PATH when it starts.

    Raises:
        ConfigError: a variable is unset, or the relative program does not exist.
    """
    env = dict(os.environ if environ is None else environ)
    argv: list[str] = []
    found: list[ConductorError] = []
    for i, arg in enumerate(spec.argv()):
        if i == 0:  # `~/bin/agent` as a shell reads it: the `~` written, not one a variable holds
            arg = os.path.expanduser(arg)
        try:
            argv.append(expand(arg, env, where=f"{where}.command", file=file))
        except ConfigError as e:  # and the other arguments' variables too
            found.append(e)
    if found:
        raise ConfigError.combine(found, file)
    program = argv[0]
    if not program.strip():  # else "cannot execute : Permission denied", naming no key
        named = ", ".join(f"${{{name}}}" for name, _ in variables(spec.argv()[0]))
        raise ConfigError("the program is empty once its variables are expanded",
                          file=file, field=f"{where}.command",
                          hint=f"set {named or 'them'} to the program, or give a default")
    if base_dir and "/" in program and not os.path.isabs(program):
        argv[0] = os.path.normpath(os.path.join(base_dir, program))
        if not os.path.exists(argv[0]):
            raise ConfigError(f"{program} not found ({relative_to_chain(base_dir, file)})",
                              file=file, field=f"{where}.command",
                              hint=relative_hint(file))
    return argv


def remote_url(spec: ComponentSpec, *, file: str | None, where: str) -> str:
    """A remote component's url, `${VAR}` expanded and checked as httpx will read it.

    Raises:
        ConfigError: an unset variable, or a url that is not a ws:// or wss:// address
            with a host (and a port from 1 to 65535, if it gives one).
    """
    import urllib.parse

    assert spec.url is not None
    url = expand(spec.url, dict(os.environ), where=f"{where}.url", file=file)
    try:
        parts = urllib.parse.urlsplit(url)
        port = parts.port  # a ValueError when it is not a number from 0 to 65535
        good = parts.scheme.lower() in ("ws", "wss") and bool(parts.hostname) \
            and not re.search(r"\s", url) and port != 0
    except ValueError:
        good = False
    if not good:
        raise ConfigError(f"{url!r} is not a ws:// or wss:// address", file=file,
                          field=f"{where}.url", hint="e.g. wss://build-box:8765/acp")
    return url


_HEADER_NAME = re.compile(r"[!#$%&'*+.^_`|~0-9A-Za-z-]+")  # an HTTP token (RFC 9110)
_HEADER_VALUE = re.compile(r"[\x20-\x7e\t]*")


def component_headers(spec: ComponentSpec, *, file: str | None, where: str) -> dict[str, str]:
    """The headers a remote component is connected with, `${VAR}` expanded.

    Raises:
        ConfigError: an `${VAR}` names an unset variable.
    """
    env = dict(os.environ)
    headers: dict[str, str] = {}
    found: list[ConductorError] = []
    for key, value in spec.headers.items():
        field = f"{where}.headers.{key}"
        try:
            headers[key] = expand(value, env, where=field, file=file)
        except ConfigError as e:
            found.append(e)
            continue
        # Checked here, once expanded: at connect time these are a traceback or a failure
        # that names no key.
        if not _HEADER_NAME.fullmatch(key):
            found.append(ConfigError(f"{key!r} is not a header name", file=file, field=field,
                                     hint="letters, digits and - (e.g. Authorization)"))
        elif not _HEADER_VALUE.fullmatch(headers[key]):
            found.append(ConfigError("its value is not printable ASCII", file=file,
                                     field=field, hint="no newlines, control characters or "
                                                       "letters beyond ASCII"))
        elif headers[key] != headers[key].strip(" \t"):  # HTTP refuses it ("Illegal header")
            found.append(ConfigError("its value begins or ends with a space", file=file,
                                     field=field, hint="an empty ${VAR} leaves one "
                                                       "(`Bearer ${TOKEN}`): set it, or "
                                                       "remove the space"))
    if found:
        raise ConfigError.combine(found, file)
    return headers


def mcp_servers(config: ChainConfig) -> list[McpServer]:
    """Resolve `[[mcp_server]]`: variables expanded, stdio commands made absolute.

    Raises:
        ConfigError: a variable is unset or a command cannot be found (every such problem).
    """
    out: list[McpServer] = []
    found: list[ConductorError] = []
    for i, spec in enumerate(config.mcp_server):
        if f"mcp_server[{i}]" in config.malformed:
            continue
        try:
            out.append(_mcp_server(spec, config, f"mcp_server[{i}]"))
        except ConfigError as e:
            found.append(e)
    if found:
        raise ConfigError.combine(found, config.source)
    return out


def _mcp_server(spec: McpServerSpec, config: ChainConfig, where: str) -> McpServer:
    import shutil

    env = dict(os.environ)
    found: list[ConfigError] = []

    def x(text: str, key: str) -> str:
        try:
            return expand(text, env, where=f"{where}.{key}", file=config.source)
        except ConfigError as e:  # the others are still checked: every problem at once
            found.append(e)
            return text

    if spec.type == "acp":
        assert spec.provider is not None
        return McpServer(spec.name, "acp", provider=spec.provider, required=spec.required)
    if spec.type == "stdio":
        assert spec.command is not None
        command = x(os.path.expanduser(spec.command), "command")  # `~/...` as a shell would
        args = tuple(x(a, "args") for a in spec.args)
        server_env = tuple((k, x(v, f"env.{k}")) for k, v in spec.env.items())
        if found and found[0].field == f"{where}.command":
            raise ConfigError.combine(found, config.source)  # no command to look for
        if "/" in command and not os.path.isabs(command) and config.base_dir:
            relative = command  # a path, as a shell would see it: from the chain's folder
            command = os.path.normpath(os.path.join(config.base_dir, command))
            resolved = command if os.access(command, os.X_OK) else None
            missing = f"{relative} ({relative_to_chain(config.base_dir, config.source)})"
        else:  # which() checks an absolute path as it is, and looks a bare name up in PATH
            resolved = shutil.which(command)
            missing = command
        if resolved is None:
            # The program alone: `command = "mcp-files --root src"` is one file's name.
            hint = "give the program alone in `command`, and its arguments in `args`" \
                if " " in command.strip() and not spec.args else \
                "ACP wants an absolute path; give one, or fix PATH"
            found.insert(0, ConfigError(f"command not found: {missing}", file=config.source,
                                        field=f"{where}.command", hint=hint))
        if found:
            raise ConfigError.combine(found, config.source)
        assert resolved is not None
        return McpServer(spec.name, "stdio", command=resolved, args=args, env=server_env,
                         required=spec.required)
    assert spec.url is not None
    url = x(spec.url, "url")  # checked once expanded: `url = "${SEARCH_URL}"` is fine
    if not found and not re.match(r"(?i)https?://[^/?#\s]+", url):
        found.append(ConfigError(f"{url!r} is not an http:// or https:// address",
                                 file=config.source, field=f"{where}.url",
                                 hint=f"an {spec.type} MCP server's url looks like "
                                      "http://127.0.0.1:8000/mcp"))
    server = McpServer(spec.name, spec.type, url=url,
                       headers=tuple((k, x(v, f"headers.{k}")) for k, v in spec.headers.items()),
                       required=spec.required)
    if found:
        raise ConfigError.combine(found, config.source)
    return server


# A variable named like a credential (GH_TOKEN, OPENAI_API_KEY, DB_PASSWORD, ...), by the
# words of its name (split at `_` and at camelCase, digits at a word's end dropped):
# MAX_TOKENS or TOKENIZERS_PARALLELISM are not (their values, 4096 and false, were blanked
# wherever they appeared in a trace); nor `pwd`: ${PWD} is a folder.
_SECRET_ENDINGS = ("token", "secret", "secrets", "password", "passwd", "passphrase",
                   "apikey", "privatekey", "accesskey", "secretkey", "credential",
                   "credentials")
_SECRET_PAIRS = {("api", "key"), ("access", "key"), ("private", "key"), ("secret", "key"),
                 ("client", "secret"), ("auth", "key"), ("access", "tokens")}
_NAME_WORD = re.compile(r"[A-Z]?[a-z]+|[A-Z]+(?![a-z])|[0-9]+")


def named_like_a_secret(name: str) -> bool:
    words = [w.lower() for w in _NAME_WORD.findall(name) if not w.isdigit()]
    return any(w.endswith(_SECRET_ENDINGS) or w in ("auth", "oauth")
               or (w.startswith("auth") and not w.startswith("author")) for w in words) \
        or any(pair in _SECRET_PAIRS for pair in itertools.pairwise(words))


def _secret_variables(config: ChainConfig) -> set[str]:
    """The `${VAR}`s the chain file names (defaults included) that are named like a
    credential: their values reach the trace in argv, args and urls, not only in env."""
    texts: list[str] = []
    for spec in [*config.proxy, *([config.agent] if config.agent else [])]:
        command = spec.command if isinstance(spec.command, list) else [spec.command or ""]
        texts += [*command, *spec.env.values(), *spec.headers.values(), spec.url or ""]
    for server in config.mcp_server:
        texts += [server.command or "", *server.args, *server.env.values(), server.url or "",
                  *server.headers.values()]
    names: set[str] = set()
    while texts:
        for name, default in variables(texts.pop()):
            if named_like_a_secret(name):
                names.add(name)
            if default is not None:
                texts.append(default)
    return names


def trace_redactor(config: ChainConfig | None, *, unredacted: bool = False) -> Redactor | None:
    """What a trace of `config`'s chain hides (None: nothing, `--trace-unredacted`): the
    values of each component's `secret_env` names and of the `${VAR}`s the chain file
    names that are named like a credential, and `[conductor] redact` patterns."""
    from conductor.tracing.redact import Redactor

    if unredacted:
        return None
    if config is None:
        return Redactor()
    secrets: list[str] = []
    for i, spec in enumerate([*config.proxy, *([config.agent] if config.agent else [])]):
        if not spec.secret_env:
            continue
        try:
            env = component_environment(spec, file=config.source, where=f"component[{i}]")
        except ConfigError:
            env = dict(os.environ)  # the run itself will report the unset variable
        secrets.extend(env[n] for n in spec.secret_env if env.get(n))
    secrets.extend(os.environ[n] for n in _secret_variables(config) if os.environ.get(n))
    return Redactor(secrets, config.conductor.redact)
