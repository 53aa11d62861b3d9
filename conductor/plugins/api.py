"""The plugin API: a `Proxy` subclass with async handlers, and the `ProxyContext` they get.

A proxy sees two sides. Its *predecessor* is the editor side (the client, or the proxy before
it); its *successor* is the agent side. Every message it does not handle is forwarded to the
other side untouched, byte for byte, without being decoded. Handlers receive the
`Request` or `Notification` itself (payloads stay `msgspec.Raw`); `message.params_as(Model)`
is the opt-in typed view, and `message.with_params(...)` makes the changed copy to forward.

What the API needs from whoever runs a proxy is declared here as `ProxyHost` (implemented
by `conductor.plugins.host`); the host uses only the public surface of these classes.
"""

from __future__ import annotations

import enum
import inspect
import logging
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar, Generic, Protocol, TypeVar

from msgspec import UNSET, Raw, UnsetType
from pydantic import BaseModel, ConfigDict

from conductor import acp
from conductor.jsonrpc.message import (
    JsonValue,
    Notification,
    Request,
    Response,
    payload,
)
from conductor.routing.sessions import SessionEnd
from conductor.rpc.failure import raise_for_error

if TYPE_CHECKING:
    from conductor.jsonrpc.message import Call


class Side(enum.StrEnum):
    """Where a message came from, or where one is sent."""

    PREDECESSOR = "predecessor"  # the editor side
    SUCCESSOR = "successor"      # the agent side

    @property
    def other(self) -> Side:
        return Side.SUCCESSOR if self is Side.PREDECESSOR else Side.PREDECESSOR


class NoOptions(BaseModel):
    """The options model of a proxy that takes none."""

    model_config = ConfigDict(extra="forbid")


OptionsT = TypeVar("OptionsT", bound=BaseModel)

# What a request handler returns: a Response (e.g. what `ctx.forward` gave back, possibly
# changed), a Raw result, a pydantic model, or any JSON value. Raise RpcError to answer
# with an error. Notification handlers return None.
Reply = Any
Handler = Callable[["ProxyContext", Any], Awaitable[Reply]]

_HANDLES = "__acp_handles__"


def on(method: str, *, source: Side | str = Side.PREDECESSOR) -> Callable[[Any], Any]:
    """Mark a Proxy method as the handler for `method` arriving from `source`.

    `method` may be "*" for everything from that side that has no handler of its own.
    The decorated method is `async def handler(self, ctx, message) -> Reply`.
    """
    side = Side(source)

    def mark(func: Any) -> Any:
        if not inspect.iscoroutinefunction(func):
            raise TypeError(f"handler {func.__qualname__} for {method} must be `async def`")
        setattr(func, _HANDLES, [*getattr(func, _HANDLES, []), (side, method)])
        return func
    return mark


class Proxy(Generic[OptionsT]):
    """Base class of every plugin proxy. Anything without a handler is forwarded untouched.

    Subclass it, set `options_model` to a pydantic model (extra="forbid" recommended), and
    decorate async methods with `@on(method)` / `@on(method, source="successor")`.
    The first line of the class docstring is its description in `acp-conductor proxies`.
    """

    options_model: ClassVar[type[BaseModel]] = NoOptions
    _handler_table: ClassVar[dict[tuple[Side, str], str]] = {}

    def __init__(self, options: OptionsT | None = None) -> None:
        given: BaseModel = options if options is not None else self.options_model()
        self.options: OptionsT = given  # type: ignore[assignment]  # options_model is OptionsT
        self.name: str = type(self).__name__.lower()  # the registry sets the chain's name
        self.log = logging.getLogger(f"acp_conductor.proxy.{self.name}")

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        table: dict[tuple[Side, str], str] = {}
        for klass in reversed(cls.__mro__):
            for attr, value in vars(klass).items():
                for key in getattr(value, _HANDLES, ()):
                    table[key] = attr
        cls._handler_table = table

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

    async def session_opened(self, session: SessionScope) -> None:
        """Hook: a session's route was installed (before any message of it is dispatched)."""

    async def session_closed(self, session: SessionScope) -> None:
        """Hook: a session ended and its state is released; `session.ended` says why
        (`SessionEnd`: closed, refused, expired, disconnected, lost)."""


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


@dataclass(eq=False)
class SessionScope:
    """One session as a proxy sees it: its state, its own handlers, and who opened it."""

    session_id: str
    how: str                          # session/new, session/load, session/resume, session/fork
    owned: bool                       # opened by this proxy downstream: never seen upstream
    setup: JsonValue = None           # the decoded params of the setup request
    state: dict[str, Any] = field(default_factory=dict)
    handlers: dict[tuple[Side, str], Handler] = field(default_factory=dict)
    host: ProxyHost | None = field(default=None, repr=False)
    ended: SessionEnd | None = None   # why it ended, once it has (see Proxy.session_closed)

    @property
    def cwd(self) -> str | None:
        cwd = self.setup.get("cwd") if isinstance(self.setup, dict) else None
        return cwd if isinstance(cwd, str) else None

    def on(self, method: str, handler: Handler, *,
           source: Side | str = Side.SUCCESSOR) -> None:
        """Handle `method` for this session only (checked before the class's handlers)."""
        self.handlers[(Side(source), method)] = handler
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
        """Prompt a session this proxy owns; returns the response (the turn's end)."""
        blocks = [{"type": "text", "text": prompt}] if isinstance(prompt, str) else prompt
        return await self._call(acp.SESSION_PROMPT,
                                {"sessionId": self.session_id, "prompt": blocks, **extra})

    async def close(self) -> Response:
        """session/close for a session this proxy owns; the route is removed on success."""
        return await self._call(acp.SESSION_CLOSE, {"sessionId": self.session_id})

    async def _call(self, method: str, params: JsonValue) -> Response:
        if self.host is None:
            raise RuntimeError(f"session {self.session_id} is not attached to a running proxy")
        pending = await self.host.start_request(method, payload(params), Side.SUCCESSOR)
        return raise_for_error(await pending.wait())


class ProxyContext:
    """What a handler can do: forward, answer (by returning), send its own, cancel."""

    __slots__ = ("_host", "_outstanding", "_session", "message", "released", "source")

    def __init__(self, host: ProxyHost, source: Side, message: Call) -> None:
        self._host = host
        self.source = source
        self.message = message                 # the message being handled
        self._session: SessionScope | bool | None = False  # False: not looked up yet
        self._outstanding: list[PendingRequest] = []
        # Set by the host while this handler holds dispatch (see `release`).
        self.released: Callable[[], None] | None = None

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
    def outstanding(self) -> list[PendingRequest]:
        """The requests this handler sent (forwards included) that are not answered yet."""
        self._outstanding = [p for p in self._outstanding if not p.done]
        return self._outstanding

    async def forward(self, message: Call | None = None) -> Response | None:
        """Send the message (default: the one being handled) on to the other side.

        For a request, returns the response as received (errors included, not raised);
        the handler may return it as is, or changed. For a notification, returns None.
        """
        message = message if message is not None else self.message
        to = self.source.other
        if self.source is Side.SUCCESSOR and self._host.owns(self.message):
            raise RuntimeError("messages of a proxy's own session never go to its predecessor")
        if not isinstance(self.message, Request):
            await self._host.notify(message.method, message.params, to)
            return None
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


def _params(params: object) -> Raw | UnsetType:
    return UNSET if params is None else payload(params)


__all__ = ["Handler", "NoOptions", "Notification", "PendingRequest", "Proxy", "ProxyContext",
           "ProxyHost", "Reply", "Request", "SessionEnd", "SessionScope", "Side", "on"]
