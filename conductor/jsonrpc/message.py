"""JSON-RPC 2.0 messages that keep every payload as the exact bytes received.

Only the envelope (`id`, `method`) is decoded. `params`, `result` and `error` stay
`msgspec.Raw`: re-encoding a message writes them back byte for byte, so whitespace, key
order, escapes, number spellings and unknown fields survive every hop.

A frame decodes to a `Request`, a `Notification` or a `Response` (one type each, so code
that handles one kind says so in its signature), an `InvalidMessage` (JSON, but not
JSON-RPC), or a `Batch` of those.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Final, TypeVar

import msgspec
from msgspec import UNSET, Raw, UnsetType

from conductor.jsonrpc.codes import ErrorCode

JsonValue = Any  # JSON-compatible Python value; the one loose public type
T = TypeVar("T")


class _Call(msgspec.Struct, kw_only=True, gc=False):
    """What requests and notifications share: a method and raw params."""

    def params_value(self) -> JsonValue:
        """Decode params (a copy; the message keeps its bytes)."""
        params: Raw | UnsetType = getattr(self, "params", UNSET)
        return None if params is UNSET else msgspec.json.decode(params)

    # Typed views are opt-in and never change the message: it keeps its bytes.
    def params_as(self, model: type[T]) -> T:
        """Params validated as `model` (a pydantic model, msgspec Struct or dataclass)."""
        params: Raw | UnsetType = getattr(self, "params", UNSET)
        return _view(params, model)


class Request(_Call, kw_only=True, gc=False):
    """A call that wants an answer. Field order is the wire's: the payload comes last."""

    jsonrpc: str = "2.0"
    id: Raw
    method: str
    params: Raw | UnsetType = UNSET

    def with_params(self, value: object) -> Request:
        """A copy with new params: Raw as is, a pydantic model by alias, else JSON-encoded."""
        return Request(id=self.id, method=self.method, params=payload(value))


class Notification(_Call, kw_only=True, gc=False):
    """A call that is never answered."""

    jsonrpc: str = "2.0"
    method: str
    params: Raw | UnsetType = UNSET

    def with_params(self, value: object) -> Notification:
        return Notification(method=self.method, params=payload(value))


class Response(msgspec.Struct, kw_only=True, gc=False):
    """The answer to a request: exactly one of `result` and `error` is set."""

    jsonrpc: str = "2.0"
    id: Raw
    result: Raw | UnsetType = UNSET
    error: Raw | UnsetType = UNSET

    @property
    def is_error(self) -> bool:
        return self.error is not UNSET

    def result_value(self) -> JsonValue:
        return None if self.result is UNSET else msgspec.json.decode(self.result)

    def error_value(self) -> JsonValue:
        return None if self.error is UNSET else msgspec.json.decode(self.error)

    def error_code(self) -> int | None:
        """The error's `code`, when this is an error answer with an integer code."""
        if self.error is UNSET:
            return None
        try:
            code = msgspec.json.decode(self.error, type=_ErrorHead).code
        except msgspec.MsgspecError:
            return None
        return code if isinstance(code, int) else None

    def result_as(self, model: type[T]) -> T:
        return _view(self.result, model)

    def with_result(self, value: object) -> Response:
        return Response(id=self.id, result=payload(value))

    def answering(self, ident: Raw) -> Response:
        """The same answer (same payload bytes) for another request id."""
        return Response(id=ident, result=self.result, error=self.error)


Message = Request | Notification | Response
Call = Request | Notification


class _ErrorHead(msgspec.Struct):
    code: object = None


def _view(data: Raw | UnsetType, model: type[T]) -> T:
    body = b"null" if data is UNSET else bytes(data)
    validate = getattr(model, "model_validate_json", None)  # pydantic, without importing it here
    if validate is not None:
        view: T = validate(body)
        return view
    return msgspec.json.decode(body, type=model)


def payload(value: object) -> Raw:
    """A Raw payload from Raw (kept), a pydantic model (by alias, no nulls) or a JSON value."""
    if isinstance(value, Raw):
        return value
    dump = getattr(value, "model_dump_json", None)
    if dump is not None:
        return Raw(dump(by_alias=True, exclude_none=True).encode())
    return Raw(_encoder.encode(value))


class _Envelope(msgspec.Struct, gc=False):
    """Every member a JSON-RPC message can have, each optional: what a frame decodes into."""

    jsonrpc: Raw | UnsetType = UNSET
    id: Raw | UnsetType = UNSET
    method: str | UnsetType = UNSET
    params: Raw | UnsetType = UNSET
    result: Raw | UnsetType = UNSET
    error: Raw | UnsetType = UNSET


class _Probe(msgspec.Struct):
    """Loose view used to salvage the id of a message that failed validation."""

    id: Raw | UnsetType = UNSET
    method: Raw | UnsetType = UNSET


@dataclass(frozen=True, slots=True)
class InvalidMessage:
    """A frame that is JSON but not a JSON-RPC message. `id` is set when one was readable."""

    reason: str
    id: Raw | None
    call_shaped: bool  # had a method or no result/error: deserves a -32600 answer


@dataclass(frozen=True, slots=True)
class Batch:
    """A JSON array frame: each item decoded on its own."""

    items: list[Message | InvalidMessage]


_decoder: Final = msgspec.json.Decoder(_Envelope)
_probe: Final = msgspec.json.Decoder(_Probe)
_batch_decoder: Final = msgspec.json.Decoder(list[Raw])
_encoder: Final = msgspec.json.Encoder()
NULL: Final = Raw(b"null")
_VERSION: Final = b'"2.0"'


class ParseError(ValueError):
    """The frame is not JSON at all."""


def decode(frame: bytes | bytearray) -> Message | InvalidMessage | Batch:
    """Decode one frame. Raises ParseError when the frame is not JSON.

    Payloads reference `frame` without copying it; it must not change afterwards.
    """
    first = frame[:1]
    if first.isspace():  # rare: lstrip() copies the whole frame
        first = frame.lstrip()[:1]
    if first == b"[":
        try:
            raws = _batch_decoder.decode(frame)
        except msgspec.DecodeError as e:
            raise ParseError(str(e)) from None
        return Batch([_decode_item(bytes(r)) for r in raws])
    return _decode_item(frame)


def _decode_item(frame: bytes | bytearray) -> Message | InvalidMessage:
    try:
        env = _decoder.decode(frame)
    except msgspec.ValidationError as e:
        return _invalid(frame, str(e))
    except msgspec.DecodeError as e:
        raise ParseError(str(e)) from None
    ident = env.id
    if ident is not UNSET and not _valid_id(ident):
        return InvalidMessage("id must be a string, a number or null", None, call_shaped=True)
    method = env.method
    if method is UNSET:
        if ident is UNSET:
            return InvalidMessage("neither a method nor an id", None, call_shaped=True)
        if (env.result is UNSET) == (env.error is UNSET):
            # Response-shaped junk: never answered (protocol.md §1), or the error could look
            # like the answer to the peer's own request with that id.
            return InvalidMessage("a response needs exactly one of result and error", ident,
                                  call_shaped=False)
        return Response(id=ident, result=env.result, error=env.error)
    if env.result is not UNSET or env.error is not UNSET:
        return InvalidMessage("a request cannot carry result or error",
                              None if ident is UNSET else ident, True)
    if ident is UNSET:
        return Notification(method=method, params=env.params)
    return Request(id=ident, method=method, params=env.params)


def _valid_id(ident: Raw) -> bool:
    text = bytes(ident)
    first = text[:1]
    return first == b'"' or first == b"-" or first.isdigit() or text == b"null"


def _invalid(frame: bytes | bytearray, reason: str) -> InvalidMessage:
    try:
        probe = _probe.decode(frame)
    except msgspec.MsgspecError:
        return InvalidMessage(f"not a JSON-RPC message: {reason}", None, call_shaped=True)
    ident = None if probe.id is UNSET else probe.id
    return InvalidMessage(f"not a JSON-RPC message: {reason}", ident, call_shaped=True)


def encode(message: Message) -> bytes:
    """One frame, newline included."""
    buf = bytearray()
    encode_into(message, buf)
    return bytes(buf)


def encode_into(message: Message, buffer: bytearray) -> None:
    """Append one frame, newline included, to `buffer` (no intermediate copy)."""
    _encoder.encode_into(message, buffer, -1)
    buffer += b"\n"


def encode_batch(messages: list[Message]) -> bytes:
    return _encoder.encode(messages) + b"\n"


def raw(value: JsonValue) -> Raw:
    """Encode a Python value as a Raw payload (for values the conductor itself makes)."""
    return Raw(_encoder.encode(value))


def error_response(
    ident: Raw | None, code: int, message: str, data: JsonValue = None
) -> Response:
    err: dict[str, JsonValue] = {"code": int(code), "message": message}
    if data is not None:
        err["data"] = data
    return Response(id=NULL if ident is None else ident, error=raw(err))


def id_key(ident: Raw) -> int | str | None:
    """A hashable key for an id the conductor allocated (ints) or matched (any scalar).

    Raises:
        ValueError: the id is not a string, an integer or null (e.g. 1.5).
    """
    text = bytes(ident)
    # Fast path for the ids the conductor allocates itself (every response on every hop):
    # plain non-negative integers need no JSON decoder. Raw is valid JSON, so no leading 0s.
    if text.isdigit():
        return int(text)
    value = msgspec.json.decode(text)
    if isinstance(value, bool) or not isinstance(value, int | str | None):
        raise ValueError(f"unusable id {text!r}")
    return value


def int_id(value: int) -> Raw:
    return Raw(str(value).encode())


__all__ = [
    "NULL",
    "UNSET",
    "Batch",
    "Call",
    "ErrorCode",
    "InvalidMessage",
    "JsonValue",
    "Message",
    "Notification",
    "ParseError",
    "Raw",
    "Request",
    "Response",
    "UnsetType",
    "decode",
    "encode",
    "encode_batch",
    "encode_into",
    "error_response",
    "id_key",
    "int_id",
    "payload",
    "raw",
]
