"""The plugin API: a `Proxy` subclass with async handlers, and the `ProxyContext` they get.

A proxy sees two sides. Its *predecessor* is the editor side (the client, or the proxy before
it); its *successor* is the agent side. Every message it does not handle is forwarded to the
other side untouched, byte for byte, without being decoded. Handlers receive the
`Request` or `Notification` itself (payloads stay `msgspec.Raw`); `message.params_as(Model)`
is the opt-in typed view, and `message.with_params(...)` makes the changed copy to forward.

What the API needs from whoever runs a proxy is declared here as `ProxyHost` (implemented
by `conductor.plugins.host`); the host uses only the public surface of these classes.

A proxy can also give the agent tools: MCP servers written with the official `mcp` SDK,
returned by `Proxy.mcp_servers` (every session) or `Proxy.session_mcp_servers` (one
session). The host declares them in each session setup it sends downstream and serves them
over MCP-over-ACP (`conductor.plugins.tools`); a tool handler finds the ACP side of its
call with `tool_context()` (docs/mcp.md).
"""

from __future__ import annotations

import contextvars
import enum
import functools
import inspect
import itertools
import logging
import math
import typing
import warnings
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar, Final, Generic, Protocol, TypeVar

from msgspec import UNSET, Raw, UnsetType, field

from conductor import acp
from conductor.jsonrpc.message import (
    JsonValue,
    Notification,
    Request,
    Response,
    payload,
)
from conductor.record import Record
from conductor.routing.sessions import CloseReason
from conductor.rpc.failure import raise_for_error
from conductor.spelling import did_you_mean

if TYPE_CHECKING:
    from pydantic import BaseModel

    from conductor.jsonrpc.message import Call
    from conductor.plugins.no_options import NoOptions


class Side(enum.StrEnum):
    """Where a message came from, or where one is sent."""

    PREDECESSOR = "predecessor"  # the editor side
    SUCCESSOR = "successor"      # the agent side

    @property
    def other(self) -> Side:
        return Side.SUCCESSOR if self is Side.PREDECESSOR else Side.PREDECESSOR

    @classmethod
    def _missing_(cls, value: object) -> Side:
        # Every `source=` / `to=` goes through here: name the choices, not the enum.
        raise ValueError(f"{value!r} is not a side: use 'predecessor' (the editor side) or "
                         "'successor' (the agent side)")


def __getattr__(name: str) -> Any:
    # `NoOptions` is a pydantic model, made on first use: a chain of plugins that take no
    # options then never imports pydantic (≈ 100 ms of CPU, docs/performance.md).
    if name == "NoOptions":
        from conductor.plugins.no_options import NoOptions

        return NoOptions
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


class _NoOptionsModel:
    """`Proxy.options_model` until a subclass sets its own: `NoOptions`, imported on use."""

    def __get__(self, instance: object, owner: type) -> type[NoOptions]:
        from conductor.plugins.no_options import NoOptions

        return NoOptions


if TYPE_CHECKING:  # the default makes `class P(Proxy)` mean Proxy[NoOptions] to a checker
    from typing_extensions import TypeVar as DefaultTypeVar

    OptionsT = DefaultTypeVar("OptionsT", bound="BaseModel", default="NoOptions")
else:  # typing's TypeVar takes a default from 3.13; at run time it changes nothing
    OptionsT = TypeVar("OptionsT", bound="BaseModel")

# What a request handler returns: a Response (e.g. what `ctx.forward` gave back, possibly
# changed), a Raw result, a pydantic model, or any JSON value. Raise RpcError to answer
# with an error. Notification handlers return None.
Reply = Any
Handler = Callable[["ProxyContext", Any], Awaitable[Reply]]
# A watcher sees a notification inline and returns nothing (see `watch`).
Watcher = Callable[["WatchContext", Notification], None]

_HANDLES = "__acp_handles__"
_WATCHES = "__acp_watches__"


def on(method: str, *, source: Side | str = Side.PREDECESSOR) -> Callable[[Any], Any]:
    """Mark a Proxy method as the handler for `method` arriving from `source`.

    `method` may be "*" for everything from that side that has no handler of its own.
    The decorated method is `async def handler(self, ctx, message) -> Reply`.
    """
    _check_method(method, "@on", "handles")
    side = Side(source)

    def mark(func: Any) -> Any:
        if not inspect.iscoroutinefunction(func):
            raise TypeError(f"handler {func.__qualname__} for {method} must be `async def`")
        _check_parameters(func, "handler", method, "async def")
        return _register(func, "on", _HANDLES, method, side, _never_arrives(method, side))
    return mark


def watch(method: str, *, source: Side | str = Side.PREDECESSOR) -> Callable[[Any], Any]:
    """Mark a Proxy method as a watcher of the notification `method` from `source`.

    A watcher sees each such notification in order, before it travels on, and cannot
    change, hold or drop it (that is what `@on` is for). In exchange the notification keeps
    the conductor's fast path past an in-process proxy: no task, no envelope, no forward
    (docs/performance.md). So a watcher is a plain `def watcher(self, ctx, message) -> None`
    that runs inline: it must not block or wait. If it raises, the failure is logged and
    the notification goes on. A method may have both a watcher and an `@on` handler: the
    watcher sees the notification first. `method` may be "*".
    """
    _check_method(method, "@watch", "watches")
    side = Side(source)

    def mark(func: Any) -> Any:
        if inspect.iscoroutinefunction(func):
            raise TypeError(f"watcher {func.__qualname__} for {method} must be a plain `def`: "
                            "it runs inline and cannot wait (use @on for an async handler)")
        _check_parameters(func, "watcher", method, "def")
        problem = _never_arrives(method, side)
        if problem is None and method in acp.AGENT_METHODS | acp.CLIENT_METHODS \
                and method not in acp.NOTIFICATION_METHODS:
            problem = f"{method} is a request, and watchers see notifications only (use @on)"
        return _register(func, "watch", _WATCHES, method, side, problem)
    return mark


def _check_method(method: object, decorator: str, does: str) -> None:
    """A bare `@on` (or a list of methods) would register nothing, silently."""
    if not isinstance(method, str):
        raise TypeError(f"{decorator} needs the method it {does}: "
                        f"{decorator}(\"session/prompt\"), not {method!r}")


def _check_parameters(func: Any, kind: str, method: str, define: str) -> None:
    """A handler is called `(self, ctx, message)`: one that cannot take that (a forgotten
    `ctx` or `message`, an extra parameter) would fail at every message, answered to the
    editor as the plugin's failure; this says so where it is written, at import."""
    try:
        signature = inspect.signature(func)
        signature.bind(None, None, None)
    except TypeError:
        pass
    except ValueError:  # no signature to read (a builtin, a C callable): trust it
        return
    else:
        return
    written = _written(signature)
    raise TypeError(f"{kind} {func.__qualname__} for {method} takes (self, ctx, message), "
                    f"not ({written}): write `{define} {func.__name__}(self, ctx, message)`")


def _register(func: Any, decorator: str, attr: str, method: str, side: Side,
              problem: str | None) -> Any:
    """Mark `func` for `method` from `side`. A typo or the wrong side is otherwise silent
    (it is just never called): `problem` is a warning at the decorator's line."""
    if problem is not None:
        source_arg = "" if side is Side.PREDECESSOR else f", source={side.value!r}"
        name = func.__qualname__.rpartition(".<locals>.")[2]
        warnings.warn(f"@{decorator}({method!r}{source_arg}) on {name}: {problem}; as written "
                      "it would never be called", UserWarning, stacklevel=3)
    setattr(func, attr, [*getattr(func, attr, []), (side, method)])
    return func


def _never_arrives(method: str, side: Side, spelling: str = "@on({method}{source})",
                   default: Side = Side.PREDECESSOR) -> str | None:
    """Why `method` never reaches a handler on `side`, or None if it may. `spelling` and
    `default`: how the registering call is written, and its default side (for the hint)."""
    if method == "*" or method.startswith(("_", "$/")):  # extensions: the proxy's own
        return None
    if method not in acp.AGENT_METHODS | acp.CLIENT_METHODS:
        guess = did_you_mean(method, acp.AGENT_METHODS | acp.CLIENT_METHODS)
        return (f"not an ACP method ({guess + ' ' if guess else ''}extension methods "
                "start with '_')")
    if method in (acp.AGENT_METHODS if side is Side.PREDECESSOR else acp.CLIENT_METHODS):
        return None
    right = side.other
    # The source argument only where it is not the call's default (@on: the predecessor).
    source_arg = "" if right is default else f", source={right.value!r}"
    where = ("the successor (the agent side)" if right is Side.SUCCESSOR
             else "the predecessor (the editor side)")
    return f"{method} comes from {where}: write " \
        f"{spelling.format(method=repr(method), source=source_arg)}"


def _twice(klass: type, key: tuple[Side, str], first: str, second: str) -> None:
    side, method = key
    source_arg = "" if side is Side.PREDECESSOR else f", source={side.value!r}"
    warnings.warn(f"{klass.__qualname__.rpartition('.<locals>.')[2]}: @on({method!r}"
                  f"{source_arg}) marks both {first} and {second}; only {second} is called",
                  UserWarning, stacklevel=3)


def _written(signature: inspect.Signature) -> str:
    """The parameters as written, without annotations or defaults: `self, ctx`."""
    stars: dict[object, str] = {inspect.Parameter.VAR_POSITIONAL: "*",
                                inspect.Parameter.VAR_KEYWORD: "**"}
    return ", ".join(stars.get(p.kind, "") + p.name for p in signature.parameters.values())


def _check_session_handler(method: str, handler: object) -> None:
    """`session.on`'s handler is awaited as `handler(ctx, message)`: one that cannot be is
    said at the call, as `@on` says it at the decorator."""
    if not (inspect.isfunction(handler) or inspect.ismethod(handler)) \
            or handler.__name__ == "<lambda>":
        return  # a callable object, a partial, a lambda returning a coroutine: trusted
    name = handler.__name__
    if not inspect.iscoroutinefunction(inspect.unwrap(handler)):  # (a decorator: its own)
        raise TypeError(f"session.on({method!r}, {name}): the handler must be `async def`, "
                        "called with (ctx, message)")
    signature = inspect.signature(handler)
    try:
        signature.bind(None, None)
    except TypeError:
        written = _written(signature)
        raise TypeError(f"session.on({method!r}, {name}): the handler is called with "
                        f"(ctx, message), not ({written})") from None


def _options_of(cls: type) -> type[BaseModel] | None:
    """The options model `cls` names as `Proxy[Model]` (or a generic subclass's `[Model]`),
    if any: declaring it there and forgetting `options_model = Model` took no options (the
    chain's refused as unknown, `self.options.x` failing at the first message)."""
    for base in vars(cls).get("__orig_bases__", ()):
        origin = typing.get_origin(base)
        args = typing.get_args(base)
        if not (inspect.isclass(origin) and issubclass(origin, Proxy) and args):
            continue
        model = args[0]
        # A pydantic model (known without importing pydantic), not `Proxy[Any]`, not the
        # NoOptions a proxy that takes none has anyway.
        if inspect.isclass(model) and hasattr(model, "model_validate") and not (
                model.__name__ == "NoOptions"
                and model.__module__ == "conductor.plugins.no_options"):
            return typing.cast("type[BaseModel]", model)
    return None


# The hooks the conductor awaits, and what it passes them (after self).
_HOOKS: Final = {"chain_started": (), "chain_stopped": (), "session_opened": ("session",),
                 "session_closed": ("session",), "session_mcp_servers": ("setup",)}


def _check_hook(cls: type, hook: str, parameters: tuple[str, ...]) -> None:
    """A hook written as a plain `def`, or with other parameters, failed at its moment (the
    first session, the chain's start): "NoneType can't be used in 'await' expression".
    Said when the class is defined instead, with the line to write."""
    func = vars(cls).get(hook)
    if not inspect.isfunction(func):
        return
    try:
        inspect.signature(func).bind(None, *parameters)
        fits = inspect.iscoroutinefunction(inspect.unwrap(func))  # (a decorator: its own)
    except TypeError:
        fits = False
    except ValueError:
        return
    if not fits:
        raise TypeError(f"{cls.__qualname__.rpartition('.<locals>.')[2]}.{hook} must be "
                        f"`async def {hook}({', '.join(('self', *parameters))})`: the "
                        "conductor awaits it")


_initialising: dict[int, int] = {}  # id of a proxy being made -> its `__init__`s running


def _checked_init(init: Callable[..., None]) -> Callable[..., None]:
    """A subclass's `__init__` that forgot `super().__init__(options)` left the proxy
    without its options, name and log: an AttributeError at its first message (or options
    never read). Said when it is made instead (at load, for a chain), with the fix."""

    @functools.wraps(init)
    def __init__(self: Proxy[Any], *args: Any, **kwargs: Any) -> None:
        # Checked once the outermost `__init__` returns: a subclass may call a base's
        # `__init__` before `Proxy.__init__`, which is then not the base's to call.
        depth = _initialising.get(id(self), 0)
        _initialising[id(self)] = depth + 1
        try:
            init(self, *args, **kwargs)
        finally:
            if depth:
                _initialising[id(self)] = depth
            else:
                del _initialising[id(self)]
        if not depth and "_Proxy__options" not in vars(self):
            code = getattr(init, "__code__", None)
            where = "" if code is None else f" ({code.co_filename}, line {code.co_firstlineno})"
            raise TypeError(f"{init.__qualname__.rpartition('.<locals>.')[2]}{where} did not "
                            "call super().__init__(options): add it as the first line of "
                            "__init__")
    setattr(__init__, "__acp_checked__", True)  # noqa: B010  # a mark on a function
    return __init__


class Proxy(Generic[OptionsT]):
    """Base class of every plugin proxy. Anything without a handler is forwarded untouched.

    Subclass it, set `options_model` to a pydantic model (extra="forbid" recommended), and
    decorate async methods with `@on(method)` / `@on(method, source="successor")`.
    The first line of the class docstring is its description in `acp-conductor proxies`.
    """

    if TYPE_CHECKING:
        options_model: ClassVar[type[BaseModel]]
    else:
        options_model = _NoOptionsModel()
    _handler_table: ClassVar[dict[tuple[Side, str], str]] = {}
    _watcher_table: ClassVar[dict[tuple[Side, str], str]] = {}

    def __init__(self, options: OptionsT | None = None) -> None:
        if options is None and self.takes_options():
            options = self.options_model()  # type: ignore[assignment]  # options_model is OptionsT
        # None only for a proxy that takes no options: its NoOptions is made when first read.
        # (Name-mangled: `_options` is a name a subclass may well use for its own state.)
        self.__options: OptionsT | None = options
        self.name: str = type(self).__name__.lower()  # the registry sets the chain's name
        self.log = logging.getLogger(f"acp_conductor.proxy.{self.name}")

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        model = None if cls.takes_options() else _options_of(cls)
        if model is not None:  # `class P(Proxy[Opts])` means `options_model = Opts`
            cls.options_model = model
        for hook, parameters in _HOOKS.items():
            _check_hook(cls, hook, parameters)
        table: dict[tuple[Side, str], str] = {}
        watchers: dict[tuple[Side, str], str] = {}
        for klass in reversed(cls.__mro__):
            marked: dict[tuple[Side, str], str] = {}
            for attr, value in vars(klass).items():
                for key in getattr(value, _HANDLES, ()):
                    if key in marked:  # (a subclass's handler replacing a base's is fine)
                        _twice(klass, key, marked[key], attr)
                    table[key] = marked[key] = attr
                for key in getattr(value, _WATCHES, ()):
                    watchers[key] = attr
        cls._handler_table = table
        cls._watcher_table = watchers
        init = vars(cls).get("__init__")
        if init is not None and not hasattr(init, "__acp_checked__"):
            type.__setattr__(cls, "__init__", _checked_init(init))

    @property
    def options(self) -> OptionsT:
        """This proxy's options (validated from the chain file's `options` table)."""
        if self.__options is None:
            # An option-less proxy's NoOptions: made here, not at start-up (see NoOptions).
            self.__options = self.options_model()  # type: ignore[assignment]
        assert self.__options is not None
        return self.__options

    @options.setter
    def options(self, value: OptionsT) -> None:
        self.__options = value

    @classmethod
    def takes_options(cls) -> bool:
        """Whether this class (or a base below Proxy) sets its own `options_model`."""
        return any("options_model" in vars(klass) for klass in cls.__mro__ if klass is not Proxy)

    def rename(self, name: str) -> None:
        """Called by the conductor: errors and logs name the proxy as the chain does."""
        self.name = name
        self.log = logging.getLogger(f"acp_conductor.proxy.{name}")

    @classmethod
    def description(cls) -> str:
        doc = inspect.getdoc(cls) or ""
        return doc.strip().splitlines()[0] if doc.strip() else ""

    def handlers(self) -> dict[tuple[Side, str], Handler]:
        """(source, method) -> bound handler."""
        return {key: getattr(self, attr) for key, attr in self._handler_table.items()}

    def watchers(self) -> dict[tuple[Side, str], Watcher]:
        """(source, notification method) -> bound watcher."""
        return {key: getattr(self, attr) for key, attr in self._watcher_table.items()}

    async def chain_started(self) -> None:
        """Hook: the chain this proxy is in starts, before any message reaches the proxy
        (in-process: when the editor's first `initialize` starts the chain; stand-alone:
        when `serve-proxy` starts). Open what lives as long as the chain here. Raising
        fails the start: the editor's `initialize` is answered with an error naming the
        proxy."""

    async def chain_stopped(self) -> None:
        """Hook: the chain stopped. Runs once, after `session_closed` for every session
        still open (`closed_reason` "stopped"); nothing can be sent any more. Flush and
        close files here: the conductor then exits without tearing the interpreter down,
        so objects are not finalised (`atexit` handlers still run)."""

    async def session_opened(self, session: SessionScope) -> None:
        """Hook: a session's route was installed (before any message of it is dispatched)."""

    async def session_closed(self, session: SessionScope) -> None:
        """Hook: a session ended and its state is released; `session.closed_reason` says
        why (`CloseReason`: closed, deleted, refused, expired, lost, or stopped: the chain
        stopped with it open)."""

    # -- tools (MCP servers), docs/mcp.md ------------------------------------------------

    #: Set by the conductor for a proxy it runs in-process: a snapshot of the chain
    #: (components, open sessions, MCP routes; `Chain.status`). None when stand-alone.
    chain_status: Callable[[], JsonValue] | None = None

    #: Names of `declare=False` servers the chain file asks for (`[[mcp_server]]` with
    #: `type = "acp"` and `provider` = this proxy); set by the conductor before start.
    mcp_requested: frozenset[str] = frozenset()

    def mcp_servers(self) -> Sequence[McpOffer | Any]:
        """Hook: MCP servers offered to every session this proxy forwards (called once).

        Each is an `mcp` SDK server (`mcp.server.mcpserver.MCPServer` or the low-level
        `mcp.server.lowlevel.Server`), or an `McpOffer` wrapping one to name it or make it
        opt-in. Offered only where the agent side takes `acp` MCP servers (directly or
        through the conductor's bridge).
        """
        return ()

    async def session_mcp_servers(self, setup: SessionSetup) -> Sequence[McpOffer | Any]:
        """Hook: MCP servers for one session being set up (called for each setup)."""
        return ()

    def offered_mcp_servers(self) -> list[McpOffer]:
        """`mcp_servers()`, called once and kept (what the conductor and the host use)."""
        offers: list[McpOffer] | None = self.__dict__.get("_mcp_offers")
        if offers is None:
            offers = [o if isinstance(o, McpOffer) else McpOffer(o)
                      for o in self.mcp_servers()]
            self.__dict__["_mcp_offers"] = offers
        return offers

    def declared_mcp_servers(self) -> list[McpOffer]:
        """The offers declared to every session: each one not opt-in, and each opt-in one
        the chain file asks for (`mcp_requested`)."""
        return [o for o in self.offered_mcp_servers()
                if o.declare or o.declared_name in self.mcp_requested]


# A dataclass, not a Record: `instance` caches what `build` made on the frozen offer.
@dataclass(frozen=True)
class McpOffer:
    """An MCP server a proxy offers, with how it is declared.

    Give the server, or `build` (a function that makes it) and `name`: then it is made only
    when first needed, so an opt-in server that no chain asks for costs nothing, not even
    the `mcp` SDK's import (≈ 0.65 s of CPU)."""

    server: Any = None          # mcp.server.mcpserver.MCPServer | mcp.server.lowlevel.Server
    name: str | None = None     # the declaration's name (default: the server's own name)
    declare: bool = True        # False: only when the chain file asks for it by name
    build: Callable[[], Any] | None = None

    def __post_init__(self) -> None:
        if self.server is None and (self.build is None or not self.name):
            raise TypeError("McpOffer needs a server, or build= and name=")

    @property
    def declared_name(self) -> str:
        return self.name or str(getattr(self.server, "name", "") or "mcp")

    def instance(self) -> Any:
        """The server; an offer with `build` makes it now, once."""
        if self.server is None:
            assert self.build is not None
            object.__setattr__(self, "server", self.build())  # frozen: a cache, set once
        return self.server


class SessionSetup(Record, frozen=True):
    """A session setup request on its way downstream, as `session_mcp_servers` sees it."""

    method: str              # session/new, session/load, session/resume, session/fork
    params: JsonValue        # its decoded params (cwd, mcpServers, ...)
    session_id: str | None   # known for load / resume (fork: the session it forks)

    @property
    def cwd(self) -> str | None:
        cwd = self.params.get("cwd") if isinstance(self.params, dict) else None
        return cwd if isinstance(cwd, str) else None


class PendingRequest(Protocol):
    """A request a proxy sent and has not had the answer to yet."""

    @property
    def done(self) -> bool: ...

    async def wait(self) -> Response:
        """The answer (a result or an error). Cancelling the wait cancels the request."""
        ...

    async def cancel(self) -> None:
        """Ask the far end to stop (`$/cancel_request`); it still answers, usually -32800."""
        ...


class ProxyHost(Protocol):
    """What the API needs from whoever runs a proxy (conductor.plugins.host)."""

    # The ACP version (1 or 2) of the initialize its predecessor sent: the editor's side.
    protocol_version: int

    @property
    def proxy(self) -> Proxy[Any]: ...

    @property
    def sessions(self) -> Mapping[str, SessionScope]: ...

    def session_of(self, params: Raw | UnsetType, *, create: bool) -> SessionScope | None:
        """The scope of the session `params.sessionId` names."""
        ...

    def owns(self, message: Call) -> bool:
        """Does `message` belong to a session this proxy opened itself?"""
        ...

    def handlers_changed(self) -> None:
        """A session scope gained handlers of its own."""
        ...

    async def notify(self, method: str, params: Raw | UnsetType, to: Side) -> None: ...

    async def start_request(self, method: str, params: Raw | UnsetType, to: Side, *,
                            on_behalf_of: ProxyContext | None = None,
                            forwarding: bool = False) -> PendingRequest:
        """Send a request. `on_behalf_of`: the handler sending it (a cancel of the request
        it handles cancels this one); `forwarding`: it passes on the handled request (a
        session it opens is the predecessor's, not this proxy's own)."""
        ...


# `dict` and `weakref`: as when it was a plain dataclass, a plugin may set attributes of its
# own on a scope and hold it weakly (public API; `state` is only the documented way).
class SessionScope(Record, eq=False, dict=True, weakref=True):
    """One session as a proxy sees it: its state, its own handlers, and who opened it."""

    session_id: str
    how: str                          # session/new, session/load, session/resume, session/fork
    owned: bool                       # opened by this proxy downstream: never seen upstream
    setup: JsonValue = None           # the decoded params of the setup request
    state: dict[str, Any] = field(default_factory=dict)
    handlers: dict[tuple[Side, str], Handler] = field(default_factory=dict)
    host: ProxyHost | None = None
    closed_reason: CloseReason | None = None  # set when the session ends (session_closed)
    # v2: the `prompt` calls waiting for the agent to say the session is idle (the host
    # sets them); any of them until then
    turns_waiting: set[Any] = field(default_factory=set)

    @property
    def cwd(self) -> str | None:
        cwd = self.setup.get("cwd") if isinstance(self.setup, dict) else None
        return cwd if isinstance(cwd, str) else None

    def on(self, method: str, handler: Handler, *,
           source: Side | str = Side.SUCCESSOR) -> None:
        """Handle `method` for this session only (checked before the class's handlers).

        A `method` that is not an ACP method, or never comes from `source`, is a
        UserWarning here, as it is at `@on`: the handler would never be called."""
        side = Side(source)
        _check_session_handler(method, handler)
        problem = _never_arrives(method, side, "session.on({method}, handler{source})",
                                 Side.SUCCESSOR)
        if problem is not None:
            source_arg = "" if side is Side.SUCCESSOR else f", source={side.value!r}"
            warnings.warn(f"session.on({method!r}, ...{source_arg}): {problem}; as written "
                          "it would never be called", UserWarning, stacklevel=2)
        self.handlers[(side, method)] = handler
        if self.host is not None:
            self.host.handlers_changed()

    def handler_for(self, source: Side, method: str) -> Handler | None:
        if not self.handlers:
            return None
        return self.handlers.get((source, method)) or self.handlers.get((source, "*"))

    def succeed(self, previous: SessionScope) -> None:
        """A reload of the same session: keep what the previous scope held."""
        self.state, self.handlers = previous.state, previous.handlers

    async def prompt(self, prompt: list[JsonValue] | str, **extra: JsonValue) -> Response:
        """Prompt a session this proxy owns; returns the response at the turn's end (v2:
        the acceptance, returned once the agent said the session is idle)."""
        blocks = [{"type": "text", "text": prompt}] if isinstance(prompt, str) else prompt
        if self.host is None or self.host.protocol_version < 2:
            return await self._call(acp.SESSION_PROMPT,
                                    {"sessionId": self.session_id, "prompt": blocks, **extra})
        import anyio  # here: the plugin API is imported before any event loop runs

        # Set by the host when the agent says the session is idle (v2: the turn's end),
        # which may come before this task sees the answer.
        # Each prompt waiting has its own (a second prompt of the session must not take the
        # first one's place: that one would wait for ever).
        idle = anyio.Event()
        self.turns_waiting.add(idle)
        try:
            answer = await self._call(acp.SESSION_PROMPT,
                                      {"sessionId": self.session_id, "prompt": blocks, **extra})
            await idle.wait()
        finally:
            self.turns_waiting.discard(idle)
        return answer

    async def close(self) -> Response:
        """session/close for a session this proxy owns; the route is removed on success."""
        return await self._call(acp.SESSION_CLOSE, {"sessionId": self.session_id})

    async def _call(self, method: str, params: JsonValue) -> Response:
        if self.host is None:
            raise RuntimeError(f"session {self.session_id} is not attached to a running proxy")
        pending = await self.host.start_request(method, payload(params), Side.SUCCESSOR)
        return raise_for_error(await pending.wait())


class _MessageContext:
    """What a handler and a watcher both get: the message, its side, its session."""

    __slots__ = ("_host", "_session", "message", "source")

    def __init__(self, host: ProxyHost, source: Side, message: Call) -> None:
        self._host = host
        self.source = source
        self.message = message                 # the message being handled or watched
        self._session: SessionScope | bool | None = False  # False: not looked up yet

    @property
    def proxy(self) -> Proxy[Any]:
        return self._host.proxy

    @property
    def session(self) -> SessionScope | None:
        """The session the message names (params.sessionId), with its state."""
        if self._session is False:
            self._session = self._host.session_of(self.message.params, create=True)
        return self._session if isinstance(self._session, SessionScope) else None

    def session_for(self, session_id: str) -> SessionScope | None:
        return self._host.sessions.get(session_id)

    @property
    def protocol_version(self) -> int:
        """The ACP version the editor's side speaks (1 or 2), as its initialize said."""
        return self._host.protocol_version


class ProxyContext(_MessageContext):
    """What a handler can do: forward, answer (by returning), send its own, cancel."""

    __slots__ = ("_outstanding", "forwarded", "released", "sent_on")

    def __init__(self, host: ProxyHost, source: Side, message: Call) -> None:
        super().__init__(host, source, message)
        self._outstanding: list[PendingRequest] = []
        # Set by the host while this handler holds dispatch (see `release`).
        self.released: Callable[[], None] | None = None
        # Set by the host for a notification's handler until it forwards the notification:
        # what its side sends after it waits until then (docs/writing-a-proxy.md, Ordering).
        self.sent_on: Callable[[], None] | None = None
        self.forwarded = False  # a request was forwarded: its handler owes the answer back

    @property
    def outstanding(self) -> list[PendingRequest]:
        """The requests this handler sent (forwards included) that are not answered yet."""
        self._outstanding = [p for p in self._outstanding if not p.done]
        return self._outstanding

    async def forward(self, message: Call | None = None) -> Response | None:
        """Send the message (default: the one being handled) on to the other side.

        For a request, returns the response as received (errors included, not raised);
        the handler may return it as is, or changed. For a notification, returns None.
        """
        if message is None:
            message = self.message
        elif not isinstance(message, Request | Notification):
            raise TypeError("ctx.forward() takes the message to forward (a Request or "
                            f"Notification), not {message!r:.60}")
        elif message.params is not UNSET and not _structured(message.params):
            # A changed copy (what arrived was checked): `with_params` of a scalar.
            raise TypeError("params must be an object or an array (JSON-RPC), not "
                            f"{bytes(message.params)!r:.60}")
        to = self.source.other
        if self.source is Side.SUCCESSOR and self._host.owns(self.message):
            raise RuntimeError("messages of a proxy's own session never go to its predecessor")
        if not isinstance(self.message, Request):
            await self._host.notify(message.method, message.params, to)
            if self.sent_on is not None:
                self.sent_on()
            return None
        self.forwarded = True
        pending = await self._host.start_request(message.method, message.params, to,
                                                 on_behalf_of=self, forwarding=True)
        return await pending.wait()

    async def request(self, method: str, params: object = None, *,
                      to: Side | str = Side.SUCCESSOR) -> Response:
        """Send this proxy's own request and wait for the answer.

        Raises:
            RpcError: the answer is an error.
        """
        pending = await self.start_request(method, params, to=to)
        return raise_for_error(await pending.wait())

    async def start_request(self, method: str, params: object = None, *,
                            to: Side | str = Side.SUCCESSOR) -> PendingRequest:
        """Send a request without waiting: `await r.wait()` later, or `await r.cancel()`."""
        return await self._host.start_request(method, _params(params), Side(to),
                                              on_behalf_of=self)

    def adopt(self, pending: PendingRequest) -> None:
        """Count `pending` as this handler's (called by the host for each request sent)."""
        self._outstanding.append(pending)

    async def notify(self, method: str, params: object = None, *,
                     to: Side | str = Side.SUCCESSOR) -> None:
        await self._host.notify(method, _params(params), Side(to))

    async def open_session(self, params: object, *, method: str = "session/new") -> SessionScope:
        """Open a session of this proxy's own downstream (a sub-agent or a judge).

        Its updates and requests reach this proxy only (see `SessionScope.on`), never
        the editor.
        Raises:
            RpcError: the successor refused.
        """
        answer = await self.request(method, params)
        result = answer.result_value() if method in ("session/new", "session/fork") else params
        sid = result.get("sessionId") if isinstance(result, dict) else None
        scope = self._host.sessions.get(sid) if isinstance(sid, str) else None
        if scope is None:
            raise RuntimeError(f"{method} answered without a usable sessionId")
        return scope

    def release(self) -> None:
        """Let the proxy dispatch further messages while this handler keeps running."""
        if self.released is not None:
            release, self.released = self.released, None
            release()


class WatchContext(_MessageContext):
    """What a watcher (`@watch`) gets: the notification's session and side, nothing that
    sends or waits."""

    __slots__ = ()
    message: Notification


class ToolContext:
    """The ACP side of one MCP-over-ACP connection to a proxy's MCP server: who called,
    for which session, and a way to talk to the editor meanwhile (see `tool_context`)."""

    __slots__ = ("_host", "_session_id", "connection_id", "server_id", "server_name")

    def __init__(self, host: ProxyHost, *, server_name: str, server_id: str,
                 connection_id: str, session_id: Callable[[], str | None]) -> None:
        self._host = host
        self._session_id = session_id
        self.server_name = server_name
        self.server_id = server_id
        self.connection_id = connection_id

    @property
    def proxy(self) -> Proxy[Any]:
        return self._host.proxy

    @property
    def session_id(self) -> str | None:
        """The ACP session the connection belongs to (None while its setup is unanswered)."""
        return self._session_id()

    @property
    def session(self) -> SessionScope | None:
        sid = self.session_id
        return self._host.sessions.get(sid) if sid is not None else None

    @property
    def protocol_version(self) -> int:
        """The ACP version the editor's side speaks (1 or 2), as its initialize said."""
        return self._host.protocol_version

    async def request(self, method: str, params: object = None, *,
                      to: Side | str = Side.PREDECESSOR) -> Response:
        """Send a request (default: toward the editor) and wait for the answer.

        Raises:
            RpcError: the answer is an error.
        """
        pending = await self._host.start_request(method, _params(params), Side(to))
        return raise_for_error(await pending.wait())

    async def notify(self, method: str, params: object = None, *,
                     to: Side | str = Side.PREDECESSOR) -> None:
        await self._host.notify(method, _params(params), Side(to))

    async def update(self, update: JsonValue) -> None:
        """A `session/update` for this connection's session, to the editor."""
        sid = self.session_id
        if sid is None:
            raise RuntimeError("this MCP connection has no ACP session yet")
        await self.notify(acp.SESSION_UPDATE, {"sessionId": sid, "update": update})

    async def ask_permission(self, title: str, *, kind: str = "other",
                             tool_call_id: str | None = None) -> bool:
        """Ask the editor (`session/request_permission`, allow once / reject once), in the
        shape of the version it speaks (v1 `toolCall`; v2 `title` and a tool call
        `subject`); True when allowed. A cancelled or refused question is False."""
        sid = self.session_id
        if sid is None:
            raise RuntimeError("this MCP connection has no ACP session yet")
        tool: JsonValue = {"toolCallId": tool_call_id
                           or f"{self.server_name}-permission-{next(_QUESTIONS)}",
                           "title": title, "kind": kind}
        about: dict[str, JsonValue] = {"toolCall": tool} if self.protocol_version < 2 else \
            {"title": title, "subject": {"type": "tool_call", "toolCall": tool}}
        answer = await self.request(acp.SESSION_REQUEST_PERMISSION, {
            "sessionId": sid, **about,
            "options": [{"optionId": "allow", "name": "Allow", "kind": "allow_once"},
                        {"optionId": "reject", "name": "Reject", "kind": "reject_once"}]})
        outcome = (answer.result_value() or {}).get("outcome") or {}
        return bool(outcome.get("outcome") == "selected" and outcome.get("optionId") == "allow")


_tool_context: contextvars.ContextVar[ToolContext] = contextvars.ContextVar("acp_tool_context")
# Ids of the questions tools ask: an editor keys a permission prompt by its tool call's id.
_QUESTIONS = itertools.count(1)


def tool_context() -> ToolContext:
    """In a tool (resource, prompt) handler of a proxy's MCP server: the ACP side of the call.

    Raises:
        LookupError: not called from a handler the conductor serves over MCP-over-ACP.
    """
    try:
        return _tool_context.get()
    except LookupError:
        raise LookupError("tool_context() is only available inside a handler of an MCP "
                          "server a proxy offers (Proxy.mcp_servers)") from None


def _structured(raw: Raw) -> bool:
    """Whether a payload is an object or an array (without copying a large one)."""
    head = memoryview(raw)[:1].tobytes()
    if head in (b"{", b"["):
        return True
    return bytes(raw).lstrip()[:1] in (b"{", b"[")


def not_json(value: object) -> str | None:
    """What in a plugin's value JSON has no word for (NaN, Infinity, bytes, a set), and
    where; None if nothing. Encoded anyway, they would be null, base64 and an array in no
    order: never what the plugin meant, and nobody told. (A Raw, a message or a model
    is checked where it is encoded.)"""
    todo: list[tuple[object, str]] = [(value, "")]
    while todo:
        one, at = todo.pop()
        if isinstance(one, dict):
            todo.extend((v, f"{at}.{k}") for k, v in one.items())
        elif isinstance(one, list | tuple):
            todo.extend((v, f"{at}[{i}]") for i, v in enumerate(one))
        elif isinstance(one, float) and not math.isfinite(one):
            return f"{one!r} at {at or 'the top'} (JSON has no NaN or Infinity)"
        elif isinstance(one, bytes | bytearray | memoryview):
            return f"bytes at {at or 'the top'} (decode them to a str)"
        elif isinstance(one, set | frozenset):
            return f"a set at {at or 'the top'} (make it a sorted list)"
    return None


def _params(params: object) -> Raw | UnsetType:
    """A plugin's own params. JSON-RPC allows an object or an array only: anything else
    would reach the editor as a message it may refuse, or be dropped by the conductor
    while the handler carried on as if it had been sent."""
    if params is None:
        return UNSET
    problem = not_json(params)
    if problem is not None:
        raise TypeError(f"params are not JSON: {problem}")
    raw = payload(params)
    if not _structured(raw):
        shown = params if not isinstance(params, Raw) else bytes(params)
        raise TypeError(f"params must be an object or an array (JSON-RPC), not {shown!r:.60}")
    return raw


__all__ = ["CloseReason", "Handler", "McpOffer", "NoOptions", "Notification", "PendingRequest",
           "Proxy", "ProxyContext", "ProxyHost", "Reply", "Request", "SessionScope", "SessionSetup",
           "Side", "ToolContext", "on", "tool_context"]
