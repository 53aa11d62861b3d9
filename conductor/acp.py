"""The little ACP the core must know: method names, proxy dialects, versions, envelopes.

Payloads are never re-typed here. The two edits the conductor makes to a payload
(set one top-level key, append to one list) go through `dict[str, Raw]` so every value the
conductor does not touch keeps its bytes.
"""

from __future__ import annotations

import enum
from typing import Final

import msgspec
from msgspec import UNSET, Raw, UnsetType

from conductor.errors import ProtocolVersionError
from conductor.jsonrpc.codes import ErrorCode
from conductor.jsonrpc.message import Response, structured

INITIALIZE: Final = "initialize"
SESSION_NEW: Final = "session/new"
SESSION_LOAD: Final = "session/load"
SESSION_RESUME: Final = "session/resume"
SESSION_FORK: Final = "session/fork"
SESSION_PROMPT: Final = "session/prompt"
SESSION_CANCEL: Final = "session/cancel"
SESSION_CLOSE: Final = "session/close"
SESSION_DELETE: Final = "session/delete"
SESSION_UPDATE: Final = "session/update"
SESSION_REQUEST_PERMISSION: Final = "session/request_permission"
ELICITATION_CREATE: Final = "elicitation/create"
FS_READ_TEXT_FILE: Final = "fs/read_text_file"
FS_WRITE_TEXT_FILE: Final = "fs/write_text_file"
CANCEL_REQUEST: Final = "$/cancel_request"
MCP_CONNECT: Final = "mcp/connect"
MCP_MESSAGE: Final = "mcp/message"
MCP_DISCONNECT: Final = "mcp/disconnect"
MCP_METHODS: Final = frozenset({MCP_CONNECT, MCP_MESSAGE, MCP_DISCONNECT})
# Where the conductor puts the ACP session of an MCP-over-ACP connection on `mcp/connect`
# (the schema's ConnectMcpRequest has no field for it; docs/mcp.md).
MCP_SESSION_META_KEY: Final = "acpSessionId"

# Every ACP method by the side that sends it (v1 and v2, stable and unstable), to tell a
# plugin author that `@on(...)` names a method that never comes from that side.
AGENT_METHODS: Final = frozenset({  # the editor sends them: they come from a predecessor
    INITIALIZE, "authenticate", "logout", "auth/login", "auth/logout", SESSION_NEW,
    SESSION_LOAD, SESSION_RESUME, SESSION_FORK, SESSION_PROMPT, SESSION_CANCEL, SESSION_CLOSE,
    SESSION_DELETE, "session/list", "session/set_mode", "session/set_model",
    "session/set_config_option", "providers/list", "providers/set", "providers/disable",
    MCP_MESSAGE, "nes/start", "nes/suggest", "nes/accept", "nes/reject", "nes/close",
    "document/didOpen", "document/didChange", "document/didClose", "document/didSave",
    "document/didFocus"})
CLIENT_METHODS: Final = frozenset({  # the agent sends them: they come from a successor
    SESSION_UPDATE, SESSION_REQUEST_PERMISSION, FS_READ_TEXT_FILE, FS_WRITE_TEXT_FILE,
    "terminal/create", "terminal/output", "terminal/release", "terminal/wait_for_exit",
    "terminal/kill", MCP_CONNECT, MCP_MESSAGE, MCP_DISCONNECT, "elicitation/create",
    "elicitation/complete"})

# The ACP methods that are (or, mcp/message, may be) notifications: what `@watch` sees.
NOTIFICATION_METHODS: Final = frozenset({
    SESSION_CANCEL, SESSION_UPDATE, "elicitation/complete", "nes/accept", "nes/reject",
    "document/didOpen", "document/didChange", "document/didClose", "document/didSave",
    "document/didFocus", MCP_MESSAGE})

SESSION_SETUP: Final = frozenset({SESSION_NEW, SESSION_LOAD, SESSION_RESUME, SESSION_FORK})


class Dialect(enum.StrEnum):
    """How a proxy spells the proxy protocol."""

    PROXY = "proxy"    # _proxy/initialize, _proxy/successor (the de-facto standard)
    SPEC = "spec"      # proxy/initialize, proxy/successor, envelope `meta`
    LEGACY = "legacy"  # initialize + _meta.proxy, _proxy/successor/request|notification

    def initialize_method(self) -> str:
        return {Dialect.PROXY: "_proxy/initialize", Dialect.SPEC: "proxy/initialize",
                Dialect.LEGACY: INITIALIZE}[self]

    def successor_method(self, *, is_request: bool) -> str:
        if self is Dialect.LEGACY:
            return "_proxy/successor/request" if is_request else "_proxy/successor/notification"
        return "_proxy/successor" if self is Dialect.PROXY else "proxy/successor"

    @property
    def meta_key(self) -> str:
        return "meta" if self is Dialect.SPEC else "_meta"


PROXY_INITIALIZE_METHODS: Final = {"_proxy/initialize": Dialect.PROXY,
                                   "proxy/initialize": Dialect.SPEC}
SUCCESSOR_METHODS: Final = {
    "_proxy/successor": Dialect.PROXY,
    "proxy/successor": Dialect.SPEC,
    "_proxy/successor/request": Dialect.LEGACY,
    "_proxy/successor/notification": Dialect.LEGACY,
}


class Envelope(msgspec.Struct):
    """The params of a successor envelope. Inner params stay raw."""

    method: str
    params: Raw | UnsetType = UNSET
    meta: Raw | UnsetType = msgspec.field(default=UNSET, name="_meta")
    spec_meta: Raw | UnsetType = msgspec.field(default=UNSET, name="meta")

    @property
    def any_meta(self) -> Raw | UnsetType:
        return self.meta if self.meta is not UNSET else self.spec_meta


_envelope_decoder: Final = msgspec.json.Decoder(Envelope)
_encoder: Final = msgspec.json.Encoder()


def decode_envelope(params: Raw | UnsetType) -> Envelope:
    """Raises ValueError with a reason a proxy author can act on."""
    if params is UNSET:
        raise ValueError("the successor envelope has no params")
    try:
        envelope = _envelope_decoder.decode(params)
    except msgspec.MsgspecError as e:
        raise ValueError(f"malformed successor envelope: {e}") from None
    except RecursionError:
        raise ValueError("the successor envelope is nested too deeply to decode") from None
    # The inner message goes on the next hop as a frame of its own: JSON-RPC 2.0's rule
    # for params (an object or an array; null taken as none, as on a plain hop) holds.
    if envelope.params is not UNSET and not structured(envelope.params):
        raise ValueError("malformed successor envelope: params must be an object or an array")
    return envelope


def encode_envelope(method: str, params: Raw | UnsetType, meta: Raw | UnsetType,
                    dialect: Dialect) -> Raw:
    body: dict[str, Raw | str] = {"method": method}
    if params is not UNSET:
        body["params"] = params
    if meta is not UNSET:
        body[dialect.meta_key] = meta
    return Raw(_encoder.encode(body))


# -- protocol versions -------------------------------------------------------------------

class _VersionProbe(msgspec.Struct):
    protocolVersion: Raw | UnsetType = UNSET


class _MetaProbe(msgspec.Struct):
    meta: Raw | UnsetType = msgspec.field(default=UNSET, name="_meta")


def protocol_version(params: Raw | UnsetType) -> int:
    """Read the raw `protocolVersion`: 1 selects v1, >= 2 selects v2.

    Raises:
        ProtocolVersionError: missing, not an integer, out of range, or 0 (protocol.md §3).
    """
    value = result_protocol_version(params)
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= 0xFFFF:
        raise ProtocolVersionError(ErrorCode.INVALID_PARAMS, "Invalid params",
                           "protocolVersion must be a valid ACP protocol version "
                           "(an integer 1-65535)")
    if value == 0:
        raise ProtocolVersionError(ErrorCode.INVALID_REQUEST, "Unsupported protocol version 0",
                           "this conductor speaks ACP protocol versions 1 and 2")
    return 1 if value == 1 else 2


def starts_chain(method: str, params: Raw | UnsetType, *, is_request: bool,
                 proxy_mode: bool) -> bool:
    """Is this first message from the client the initialize that starts the chain
    (protocol.md §3)? The request `initialize` with a valid `protocolVersion`; in proxy mode
    `_proxy/initialize` (either spelling) or `initialize` too. The router decides with this
    (`Handshake.accept_first`), and so does `early_start.py` before the router exists."""
    if not is_request:
        return False
    if method != INITIALIZE and not (proxy_mode and method in PROXY_INITIALIZE_METHODS):
        return False
    try:
        protocol_version(params)
    except ProtocolVersionError:
        return False
    return True


def result_protocol_version(payload: Raw | UnsetType) -> object:
    """The raw `protocolVersion` a payload (initialize params or result) names, or None."""
    if payload is UNSET:
        return None
    try:
        probe = msgspec.json.decode(payload, type=_VersionProbe)
        if probe.protocolVersion is UNSET:
            return None
        return msgspec.json.decode(probe.protocolVersion)
    except (msgspec.MsgspecError, RecursionError):
        return None


# -- v2 turns ------------------------------------------------------------------------------

class _StateUpdate(msgspec.Struct):
    sessionUpdate: str | UnsetType = UNSET
    state: str | UnsetType = UNSET


class _UpdateProbe(msgspec.Struct):
    sessionId: str | UnsetType = UNSET
    update: _StateUpdate | UnsetType = UNSET


def idle_session(params: Raw | UnsetType) -> str | None:
    """The session a v2 `session/update` says is idle (`state_update`, state `idle`: the
    end of its turn), or None for any other update."""
    if params is UNSET:
        return None
    # Most updates are streamed chunks: a scan is cheaper than a decode. (A `\u` escape
    # may spell the name: then decode.)
    data = bytes(params)
    if b"state_update" not in data and b"\\u" not in data:
        return None
    try:
        probe = msgspec.json.decode(data, type=_UpdateProbe)
    except (msgspec.MsgspecError, RecursionError):
        return None
    update = probe.update
    if update is UNSET or update.sessionUpdate != "state_update" or update.state != "idle" \
            or probe.sessionId is UNSET:
        return None
    return probe.sessionId


def elicitation_request(params: Raw | UnsetType) -> object:
    """The request a v2 request-scoped elicitation is about: its `requestId`, decoded
    (an id on the hop it came from), or None."""
    ident = get_raw(params, "requestId")
    try:
        return msgspec.json.decode(ident) if ident is not None else None
    except (msgspec.DecodeError, RecursionError):
        return None


def idle_update(session_id: str, meta: object = None) -> Raw:
    """The params of a v2 `session/update` saying `session_id` is idle (`meta`: its `_meta`)."""
    update: dict[str, object] = {"sessionUpdate": "state_update", "state": "idle"}
    if meta is not None:
        update["_meta"] = meta
    return Raw(_encoder.encode({"sessionId": session_id, "update": update}))


def is_legacy_proxy_initialize(params: Raw | UnsetType) -> bool:
    """The older dialect initializes proxies with plain initialize and `_meta.proxy: true`."""
    if params is UNSET:
        return False
    try:
        meta = msgspec.json.decode(params, type=_MetaProbe).meta
        if meta is UNSET:
            return False
        value = msgspec.json.decode(meta)
    except (msgspec.MsgspecError, RecursionError):
        return False
    return isinstance(value, dict) and value.get("proxy") is True


# -- raw edits ------------------------------------------------------------------------------

def _object(payload: Raw | UnsetType) -> dict[str, Raw]:
    if payload is UNSET:
        return {}
    try:
        return msgspec.json.decode(payload, type=dict[str, Raw])
    except msgspec.MsgspecError as e:
        raise ValueError(f"expected a JSON object: {e}") from None
    except RecursionError:  # msgspec skips nested values recursively too
        raise ValueError("nested too deeply to decode") from None


def set_key(payload: Raw | UnsetType, key: str, value: Raw) -> Raw:
    """A copy of a JSON object with one top-level key set; other values keep their bytes."""
    obj = _object(payload)
    obj[key] = value
    return Raw(_encoder.encode(obj))


def set_path(payload: Raw | UnsetType, path: tuple[str, ...], value: Raw) -> Raw:
    """A copy of a JSON object with a nested key set, creating (or replacing non-object)
    parents on the way; every value not on the path keeps its bytes.

    Raises:
        ValueError: `payload` is not a JSON object.
    """
    obj = _object(payload)
    head, *rest = path
    if rest:
        try:
            child: Raw | UnsetType = obj[head] if head in obj else UNSET
            obj[head] = set_path(child, tuple(rest), value)
        except ValueError:  # a parent that is not an object: replaced
            obj[head] = set_path(UNSET, tuple(rest), value)
    else:
        obj[head] = value
    return Raw(_encoder.encode(obj))


def with_legacy_proxy_meta(params: Raw | UnsetType) -> Raw:
    """initialize params for an older-dialect proxy: `_meta.proxy = true` added."""
    obj = _object(params)
    meta = _object(obj["_meta"]) if "_meta" in obj else {}
    meta["proxy"] = Raw(b"true")
    obj["_meta"] = Raw(_encoder.encode(meta))
    return Raw(_encoder.encode(obj))


def accepting_legacy_proxy_role(answer: Response) -> Response:
    """A legacy proxy's answer to its initialize: the result says `_meta.proxy: true`, as
    that dialect's conductor (@thinkwell/conductor) requires before it serves the editor.
    Errors, and a result that is not an object (the predecessor judges it), are unchanged."""
    if answer.result is UNSET:
        return answer
    try:
        return Response(id=answer.id, result=with_legacy_proxy_meta(answer.result))
    except ValueError:
        return answer


def without_legacy_proxy_meta(params: Raw | UnsetType) -> Raw | UnsetType:
    """initialize params for what is not a proxy: the legacy `_meta.proxy` marker removed
    (and `_meta` with it when nothing else is in it). Unmarked params are returned as is."""
    if not is_legacy_proxy_initialize(params):
        return params
    obj = _object(params)
    meta = _object(obj["_meta"])
    del meta["proxy"]
    if meta:
        obj["_meta"] = Raw(_encoder.encode(meta))
    else:
        del obj["_meta"]
    return Raw(_encoder.encode(obj))


def append_to_list(payload: Raw | UnsetType, key: str, items: list[Raw]) -> Raw:
    """Append to a list under `key` (created when missing); nothing else changes."""
    obj = _object(payload)
    try:
        current = msgspec.json.decode(obj[key], type=list[Raw]) if key in obj else []
    except RecursionError:
        raise ValueError(f"{key} is nested too deeply to decode") from None
    obj[key] = Raw(_encoder.encode([*current, *items]))
    return Raw(_encoder.encode(obj))


def get_str(payload: Raw | UnsetType, key: str) -> str | None:
    """A top-level string field, or None."""
    try:
        value = _object(payload).get(key)
        decoded = None if value is None else msgspec.json.decode(value)
    except (ValueError, msgspec.MsgspecError, RecursionError):
        return None
    return decoded if isinstance(decoded, str) else None


def get_raw(payload: Raw | UnsetType, key: str) -> Raw | None:
    try:
        return _object(payload).get(key)
    except ValueError:
        return None
