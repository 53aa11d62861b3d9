"""JSON-RPC 2.0 and ACP error codes."""

from enum import IntEnum


class ErrorCode(IntEnum):
    PARSE_ERROR = -32700
    INVALID_REQUEST = -32600
    METHOD_NOT_FOUND = -32601
    INVALID_PARAMS = -32602
    INTERNAL_ERROR = -32603
    REQUEST_CANCELLED = -32800
    # Server-defined range: the conductor's own failures.
    COMPONENT_FAILED = -32001
    FRAME_TOO_LARGE = -32002
    PLUGIN_FAILED = -32003
