"""JSON-RPC 2.0 messages that keep every payload as the exact bytes received.

Only the envelope (`id`, `method`) is decoded. `params`, `result` and `error` stay
`msgspec.Raw`: re-encoding a message writes them back byte for byte, so whitespace, key
order, escapes, number spellings and unknown fields survive every hop.

A frame decodes to a `Request`, a `Notification` or a `Response` (one type each, so code
that handles one kind says so in its signature), an `InvalidMessage` (JSON, but not
JSON-RPC), or a `Batch` of those.
"""

from __future__ import annotations

import json
import re
import struct
from typing import Any, Final, Literal, TypeVar

import msgspec
from msgspec import UNSET, Raw, UnsetType

from conductor.jsonrpc.codes import ErrorCode
from conductor.jsonrpc.head import Head, read_head
from conductor.record import Record

JsonValue = Any  # JSON-compatible Python value; the one loose public type
T = TypeVar("T")

# The default of `_Envelope.jsonrpc`: "2.0", built at run time so that it is no other "2.0"
# object. A decoded envelope whose `jsonrpc` *is* this object had no such member (msgspec
# fills in the default itself); any value but "2.0" fails decoding (the Literal).
_VERSION: Final = "".join(("2", ".0"))


# How much of a payload `repr` shows: enough to recognise a message in a failing test or a
# log line, bounded so a 64 MiB payload costs no more than a small one.
REPR_PAYLOAD_CHARS: Final = 160


def _shown(data: Raw | UnsetType) -> str:
    """The start of a payload as the JSON text it is (no decoding, no full copy)."""
    if data is UNSET:
        return "-"
    size = len(data)
    with memoryview(data) as view:
        head = view[:REPR_PAYLOAD_CHARS].tobytes()
    text = head.decode("utf-8", "replace")
    return text if size <= REPR_PAYLOAD_CHARS else f"{text}…(+{size - len(head)} bytes)"


def _shown_id(ident: Raw) -> str:
    with memoryview(ident) as view:
        return view[:40].tobytes().decode("utf-8", "replace")


class _Call(msgspec.Struct, kw_only=True, gc=False):
    """What requests and notifications share: a method and raw params."""

    def params_value(self) -> JsonValue:
        """Decode params (a copy; the message keeps its bytes).

        Raises:
            msgspec.DecodeError: nested too deeply to decode.
        """
        params: Raw | UnsetType = getattr(self, "params", UNSET)
        return _value(params)

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

    def __repr__(self) -> str:
        return (f"Request(id={_shown_id(self.id)}, method={self.method!r}, "
                f"params={_shown(self.params)})")


class Notification(_Call, kw_only=True, gc=False):
    """A call that is never answered."""

    jsonrpc: str = "2.0"
    method: str
    params: Raw | UnsetType = UNSET

    def with_params(self, value: object) -> Notification:
        return Notification(method=self.method, params=payload(value))

    def __repr__(self) -> str:
        return f"Notification(method={self.method!r}, params={_shown(self.params)})"


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
        return _value(self.result)

    def error_value(self) -> JsonValue:
        return _value(self.error)

    def error_code(self) -> int | None:
        """The error's `code`, when this is an error answer with an integer code."""
        if self.error is UNSET:
            return None
        try:
            code = msgspec.json.decode(self.error, type=_ErrorHead).code
        except (msgspec.MsgspecError, RecursionError):
            return None
        return code if isinstance(code, int) else None

    def result_as(self, model: type[T]) -> T:
        return _view(self.result, model)

    def with_result(self, value: object) -> Response:
        return Response(id=self.id, result=payload(value))

    def answering(self, ident: Raw) -> Response:
        """The same answer (same payload bytes) for another request id."""
        return Response(id=ident, result=self.result, error=self.error)

    def __repr__(self) -> str:
        if self.error is not UNSET:
            return f"Response(id={_shown_id(self.id)}, error={_shown(self.error)})"
        return f"Response(id={_shown_id(self.id)}, result={_shown(self.result)})"


Message = Request | Notification | Response
Call = Request | Notification


class _ErrorHead(msgspec.Struct):
    code: object = None


def _value(data: Raw | UnsetType) -> JsonValue:
    if data is UNSET:
        return None
    try:
        return msgspec.json.decode(data)
    except RecursionError:  # an error its callers already handle, not a crash
        raise msgspec.DecodeError("JSON nested too deeply to decode") from None


def _view(data: Raw | UnsetType, model: type[T]) -> T:
    body = b"null" if data is UNSET else bytes(data)
    validate = getattr(model, "model_validate_json", None)  # pydantic, without importing it here
    if validate is not None:
        view: T = validate(body)
        return view
    try:
        return msgspec.json.decode(body, type=model)
    except RecursionError:
        raise msgspec.DecodeError("JSON nested too deeply to decode") from None


def payload(value: object) -> Raw:
    """A Raw payload from Raw (kept, on one line), a pydantic model (by alias, no nulls)
    or a JSON value."""
    if isinstance(value, Raw):
        data = bytes(value)
        try:
            # Sent as is, so checked here: a Raw that is not JSON would reach the peer as a
            # frame it cannot read (and a request it answered, never answered).
            _raw_decoder.decode(data)
        except msgspec.DecodeError as e:
            if not _json_all_the_same(data):
                raise ValueError(f"a Raw payload is not JSON ({e}): {data[:60]!r}") from None
        except RecursionError:
            pass  # too deep for msgspec to check, not wrong: JSON sets no depth limit
        if b"\n" not in data and b"\r" not in data:
            return value
        # JSON holds line breaks only as whitespace (never inside a string): a Raw written
        # pretty would cut its frame in two on a line-delimited hop; spaces say the same.
        return Raw(data.replace(b"\n", b" ").replace(b"\r", b" "))
    dump = getattr(value, "model_dump_json", None)
    if dump is not None:
        return Raw(dump(by_alias=True, exclude_none=True).encode())
    return Raw(_encoder.encode(value))


def _json_all_the_same(data: bytes) -> bool:
    """Whether JSON msgspec refuses is JSON all the same (a lone surrogate escape, which
    the grammar allows and a JavaScript peer reads). Only on that error path: slow."""
    def refuse(constant: str) -> None:
        raise ValueError(constant)  # NaN, Infinity: Python's extension, not JSON
    try:
        json.loads(data, parse_constant=refuse)
    except RecursionError:
        return True
    except ValueError:
        return False
    return True


class _Envelope(msgspec.Struct, gc=False):
    """Every member a JSON-RPC message can have, each optional: what a frame decodes into."""

    jsonrpc: Literal["2.0"] = _VERSION  # type: ignore[assignment]  # see _VERSION
    id: Raw | UnsetType = UNSET
    method: str | UnsetType = UNSET
    params: Raw | UnsetType = UNSET
    result: Raw | UnsetType = UNSET
    error: Raw | UnsetType = UNSET


class _Probe(msgspec.Struct):
    """Loose view used to salvage the id of a message that failed validation."""

    id: Raw | UnsetType = UNSET
    method: Raw | UnsetType = UNSET
    result: Raw | UnsetType = UNSET
    error: Raw | UnsetType = UNSET


class _VersionProbe(msgspec.Struct):
    jsonrpc: Raw | UnsetType = UNSET


class InvalidMessage(Record, frozen=True):
    """A frame that is JSON but not a JSON-RPC message. `id` is set when one was readable."""

    reason: str
    id: Raw | None
    call_shaped: bool  # a request or call-shaped junk: deserves a -32600 answer


class Batch(Record, frozen=True):
    """A JSON array frame: each item decoded on its own."""

    items: list[Message | InvalidMessage]


_decoder: Final = msgspec.json.Decoder(_Envelope)
_probe: Final = msgspec.json.Decoder(_Probe)
_version_probe: Final = msgspec.json.Decoder(_VersionProbe)
_first_byte: Final = struct.Struct("B").unpack_from  # of a Raw, without copying it
_OBJECT: Final = (0x7B,)  # what _first_byte gives for an object
_STRUCTURED: Final = frozenset(b"{[n")  # params: an object, an array (or null, as some send)
_ID_START: Final = frozenset(b'"-0123456789n')  # a string, a number or null (Raw is valid JSON)
_batch_decoder: Final = msgspec.json.Decoder(list[Raw])
_encoder: Final = msgspec.json.Encoder()
_raw_decoder: Final = msgspec.json.Decoder(Raw)  # checks JSON without building it
NULL: Final = Raw(b"null")
_BOM: Final = b"\xef\xbb\xbf"


class ParseError(ValueError):
    """The frame is not JSON at all."""


class UnreadableFrame(ParseError):
    """A frame the conductor will not decode: not UTF-8, or nested too deeply to decode.

    `head` is what a scan of its top level found (its id, whether it has a method), so the
    sender can still be answered; `code` is the JSON-RPC error code to answer with.
    """

    def __init__(self, code: int, reason: str, head: Head) -> None:
        super().__init__(reason)
        self.code, self.reason, self.head = code, reason, head


def decode(frame: bytes | bytearray) -> Message | InvalidMessage | Batch:
    """Decode one frame.

    Payloads reference `frame` without copying it; it must not change afterwards. A frame
    msgspec refuses only for a lone surrogate escape (`"\\ud83d"` without its other half)
    is decoded with each such escape read as U+FFFD (docs/design.md).
    Raises:
        UnreadableFrame: the frame is not UTF-8, or is nested too deeply to decode.
        ParseError: the frame is not JSON.
    """
    try:
        return _decode(frame)
    except UnreadableFrame:
        raise
    except ParseError:
        mended = _mend_lone_surrogates(frame)
        if mended is None:
            raise
        return _decode(mended)


# A JSON string escape: an escaped backslash (kept, so `\\ud800` is no escape), a
# surrogate pair (kept), or a lone half of one (replaced).
_ESCAPE: Final = re.compile(rb"(\\\\)|(\\u[dD][89abAB][0-9a-fA-F]{2}\\u[dD][c-fC-F][0-9a-fA-F]{2})"
                            rb"|\\u[dD][89a-fA-F][0-9a-fA-F]{2}")


def _mend_lone_surrogates(frame: bytes | bytearray) -> bytes | None:
    """`frame` with every lone surrogate escape written `\\ufffd`; None if it has none.

    JavaScript's `JSON.stringify` and Python's `json.dumps` write such an escape for a
    string cut between the halves of a surrogate pair (or read with `surrogateescape`);
    msgspec refuses the whole frame for it, which would lose a streamed update for one
    character. Only called for a frame msgspec refused, so the common path scans nothing.
    """
    if b"\\u" not in frame:
        return None
    mended = _ESCAPE.sub(lambda m: m.group(0) if m.lastindex else b"\\ufffd", frame)
    return None if mended == frame else mended


def _decode(frame: bytes | bytearray) -> Message | InvalidMessage | Batch:
    if not frame.isascii():  # most frames are ASCII: only the others need checking
        _check_utf8(frame)
    try:
        first = frame[:1]
        if first != b"{":  # almost every frame is an object: one test
            if first == b"\xef" and frame.startswith(_BOM):
                # Windows tools write one first; RFC 8259 lets a reader ignore it.
                frame = frame[3:]
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
    except RecursionError:
        # msgspec's limit is Python's recursion limit (about 1,000 levels, less the stack in
        # use); JSON that deep is no ACP message, and must not take the reader down.
        raise UnreadableFrame(ErrorCode.INVALID_REQUEST, "nested too deeply to decode",
                              read_head(frame)) from None


def _check_utf8(frame: bytes | bytearray) -> None:
    try:
        str(frame, "utf-8")
    except UnicodeDecodeError as e:
        raise UnreadableFrame(
            ErrorCode.PARSE_ERROR,
            f"not valid UTF-8 (byte 0x{frame[e.start]:02x} at offset {e.start})",
            read_head(frame)) from None


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
            if env.params is not UNSET and env.result is UNSET:
                # `params` and no `method` (misspelt, say): a broken request, answered
                # -32600. Taken for a broken answer, it would fail the request of ours
                # that happens to have its id, and its sender would wait for ever.
                return InvalidMessage("a request needs a method", ident, call_shaped=True)
            # Response-shaped junk: never answered (protocol.md §1), or the error could look
            # like the answer to the peer's own request with that id.
            return InvalidMessage("a response needs exactly one of result and error", ident,
                                  call_shaped=False)
        # `jsonrpc` is not checked on answers: refusing one leaves its asker waiting.
        return Response(id=ident, result=env.result, error=env.error)
    # One cheap test on the hot path (params are almost always objects); which rule is
    # broken, if any, is worked out only when one may be.
    params = env.params
    if (env.jsonrpc is _VERSION or env.result is not UNSET or env.error is not UNSET
            or (params is not UNSET and _first_byte(params) != _OBJECT)):
        invalid = _invalid_call(frame, env)
        if invalid is not None:
            return invalid
    if ident is UNSET:
        return Notification(method=method, params=params)
    return Request(id=ident, method=method, params=params)


def _invalid_call(frame: bytes | bytearray, env: _Envelope) -> InvalidMessage | None:
    """The JSON-RPC 2.0 rule a request or notification breaks, if any.

    A notification is never answered, whatever is wrong with it: call_shaped only with an id.
    """
    ident = None if env.id is UNSET else env.id

    def invalid(reason: str) -> InvalidMessage:
        return InvalidMessage(reason, ident, call_shaped=ident is not None)

    if env.result is not UNSET or env.error is not UNSET:
        return invalid("a request cannot carry result or error")
    if env.jsonrpc is _VERSION and _version_probe.decode(frame).jsonrpc is UNSET:
        return invalid('the "jsonrpc" member is missing (it must be "2.0")')
    if env.params is not UNSET and not structured(env.params):
        return invalid("params must be an object or an array")
    return None


def as_object(value: object) -> dict[str, Any]:
    """`value` if it is a JSON object, else an empty one: for code that reads what a decoded
    payload offers and must not fail on one of another shape (a recorder, a capability)."""
    return value if isinstance(value, dict) else {}


def structured(params: Raw) -> bool:
    """JSON-RPC 2.0's rule for params: an object or an array (null taken as none, as some
    send). Reads one byte: a decoded Raw begins at the value itself."""
    return _first_byte(params)[0] in _STRUCTURED


def _valid_id(ident: Raw) -> bool:
    return _first_byte(ident)[0] in _ID_START


def _invalid(frame: bytes | bytearray, reason: str) -> InvalidMessage:
    try:
        probe = _probe.decode(frame)
    except msgspec.MsgspecError:
        return InvalidMessage(f"not a JSON-RPC message: {reason}", None, call_shaped=True)
    ident = None if probe.id is UNSET else probe.id
    if ident is not None and not _valid_id(ident):
        ident = None
    if reason.endswith("`$.jsonrpc`"):
        reason = f'"jsonrpc" must be "2.0" ({reason})'
    # Without a method, and with a result or an error, it is an answer: never answered.
    answer = probe.method is UNSET and (probe.result is not UNSET or probe.error is not UNSET)
    # A notification (a method, no id) is never answered either.
    notification = probe.method is not UNSET and ident is None and probe.id is UNSET
    return InvalidMessage(f"not a JSON-RPC message: {reason}", ident,
                          call_shaped=not answer and not notification)


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
    "UnreadableFrame",
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
