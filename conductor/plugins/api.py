"""The plugin API: a `Proxy` subclass with async handlers, and the `ProxyContext` they get.

A proxy sees two sides. Its *predecessor* is the editor side (the client, or the proxy before
it); its *successor* is the agent side. Every message it does not handle is forwarded to the
other side untouched, byte for byte, without being decoded. Handlers receive the
`Message` itself (payloads stay `msgspec.Raw`); `message.params_as(Model)` is the opt-in typed
view, and `message.with_params(...)` makes the changed copy to forward.
"""

from __future__ import annotations

import enum
import inspect
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar, Generic, TypeVar

import msgspec
from msgspec import UNSET, UnsetType
from pydantic import BaseModel, ConfigDict

from conductor.errors import RpcError
from conductor.jsonrpc.codes import ErrorCode
from conductor.jsonrpc.message import JsonValue, Message, Raw, payload

if TYPE_CHECKING:
    from conductor.plugins.host import OutgoingRequest, ProxyHost


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

# What a request handler returns: a response Message (e.g. what `ctx.forward` gave back,
# possibly changed), a Raw result, a pydantic model, or any JSON value. Raise RpcError to
# answer with an error. Notification handlers return None.
Reply = Message | Raw | BaseModel | JsonValue
Handler = Callable[["ProxyContext", Message], Awaitable[Reply]]

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
    _handler_table: ClassVar[dict[tuple[Side, str], str]]

    def __init__(self, options: OptionsT | None = None) -> None:
        self.options: OptionsT = options if options is not None else self.options_model()  # type: ignore[assignment]
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
        """Hook: a session was closed; its route is gone."""


Proxy._handler_table = {}


@dataclass(eq=False)
class SessionScope:
    """One session as a proxy sees it: its state, its own handlers, and who opened it."""

    session_id: str
    how: str                          # session/new, session/load, session/resume, session/fork
    owned: bool                       # opened by this proxy downstream: never seen upstream
    setup: JsonValue = None           # the decoded params of the setup request
    state: dict[str, Any] = field(default_factory=dict)
    _handlers: dict[tuple[Side, str], Handler] = field(default_factory=dict)
    _host: ProxyHost | None = field(default=None, repr=False)

    @property
    def cwd(self) -> str | None:
        cwd = self.setup.get("cwd") if isinstance(self.setup, dict) else None
        return cwd if isinstance(cwd, str) else None

    def on(self, method: str, handler: Handler, *,
           source: Side | str = Side.SUCCESSOR) -> None:
        """Handle `method` for this session only (checked before the class's handlers)."""
        self._handlers[(Side(source), method)] = handler
        if self._host is not None:
            self._host.mark_routed()

    def handler_for(self, source: Side, method: str) -> Handler | None:
        if not self._handlers:
            return None
        return self._handlers.get((source, method)) or self._handlers.get((source, "*"))

    async def prompt(self, prompt: list[JsonValue] | str, **extra: JsonValue) -> Message:
        """Prompt a session this proxy owns; returns the response (the turn's end)."""
        assert self._host is not None
        blocks = [{"type": "text", "text": prompt}] if isinstance(prompt, str) else prompt
        return await self._host.call(
            "session/prompt", {"sessionId": self.session_id, "prompt": blocks, **extra},
            Side.SUCCESSOR)

    async def close(self) -> Message:
        """session/close for a session this proxy owns; the route is removed on success."""
        assert self._host is not None
        return await self._host.call(
            "session/close", {"sessionId": self.session_id}, Side.SUCCESSOR)


class ProxyContext:
    """What a handler can do: forward, answer (by returning), send its own, cancel."""

    __slots__ = ("_host", "_outstanding", "_session", "message", "released", "source")
    released: Callable[[], None] | None

    def __init__(self, host: ProxyHost, source: Side, message: Message) -> None:
        self._host = host
        self.source = source
        self.message = message                 # the message being handled
        self._session: SessionScope | bool | None = False
        self._outstanding: list[OutgoingRequest] = []
        self.released: Callable[[], None] | None = None

    @property
    def proxy(self) -> Proxy[Any]:
        return self._host.proxy

    @property
    def session(self) -> SessionScope | None:
        """The session the message names (params.sessionId), with its state."""
        if self._session is False:
            self._session = self._host.session_of(self.message)
        return self._session  # type: ignore[return-value]

    def session_for(self, session_id: str) -> SessionScope | None:
        return self._host.sessions.get(session_id)

    async def forward(self, message: Message | None = None) -> Message | None:
        """Send the message (default: the one being handled) on to the other side.

        For a request, returns the response as received (errors included, not raised);
        the handler may return it as is, or changed. For a notification, returns None.
        """
        message = message if message is not None else self.message
        to = self.source.other
        assert isinstance(message.method, str)
        if self.source is Side.SUCCESSOR and self._host.owns(self.message):
            raise RuntimeError("messages of a proxy's own session never go to its predecessor")
        if not self.message.is_request:
            await self._host.send_notification(message.method, message.params, to)
            return None
        pending = await self._host.start_request(message.method, message.params, to,
                                                 forwarded_for=self)
        return await pending.wait()

    async def request(self, method: str, params: object = None, *,
                      to: Side | str = Side.SUCCESSOR) -> Message:
        """Send this proxy's own request and wait for the answer.

        Raises:
            RpcError: the answer is an error.
        """
        pending = await self.start_request(method, params, to=to)
        return answer_or_raise(await pending.wait())

    async def start_request(self, method: str, params: object = None, *,
                            to: Side | str = Side.SUCCESSOR) -> OutgoingRequest:
        """Send a request without waiting: `await r.wait()` later, or `await r.cancel()`."""
        pending = await self._host.start_request(method, _params(params), Side(to))
        self._outstanding.append(pending)
        return pending

    async def notify(self, method: str, params: object = None, *,
                     to: Side | str = Side.SUCCESSOR) -> None:
        await self._host.send_notification(method, _params(params), Side(to))

    async def open_session(self, params: object, *, method: str = "session/new") -> SessionScope:
        """Open a session of this proxy's own downstream (a sub-agent or a judge).

        Its updates and requests reach this proxy only (see `SessionScope.on`), never
        the editor.
        Raises:
            RpcError: the successor refused.
        """
        answer = await self.request(method, params)
        sid = answer.result_value().get("sessionId") if method in (
            "session/new", "session/fork") else _params_sid(params)
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


def _params_sid(params: object) -> object:
    return params.get("sessionId") if isinstance(params, dict) else None


def answer_or_raise(answer: Message) -> Message:
    """The answer itself when it is a result.

    Raises:
        RpcError: the answer is an error.
    """
    if answer.error is UNSET:
        return answer
    try:
        error = answer.error_value()
    except msgspec.DecodeError as e:
        raise RpcError(ErrorCode.INTERNAL_ERROR, f"an error answer that cannot be read: {e}"
                       ) from None
    if not isinstance(error, dict):
        raise RpcError(ErrorCode.INTERNAL_ERROR, str(error))
    raise RpcError(int(error.get("code", ErrorCode.INTERNAL_ERROR)), str(error.get("message", "")),
                   error.get("data"))
