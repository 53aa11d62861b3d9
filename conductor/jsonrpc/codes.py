"""Every error code that can appear on the wire, by who defines it (table: docs/errors.md).

JSON-RPC 2.0 reserves -32768..-32000; ACP uses -32000..-32099 for its own errors and LSP's
-32800 for cancellation. The conductor's own failures use -33001..-33099, outside both, so
a client can tell "the conductor or a component of the chain failed" from anything an agent
or the protocol says.
"""

from enum import IntEnum


class ErrorCode(IntEnum):
    # JSON-RPC 2.0
    PARSE_ERROR = -32700
    INVALID_REQUEST = -32600
    METHOD_NOT_FOUND = -32601
    INVALID_PARAMS = -32602
    INTERNAL_ERROR = -32603
    # ACP
    AUTH_REQUIRED = -32000
    RESOURCE_NOT_FOUND = -32002
    REQUEST_CANCELLED = -32800
    # acp-conductor
    COMPONENT_FAILED = -33001   # a component failed to start, exited, or was stopped first
    HANDLER_FAILED = -33002     # an in-process handler (a plugin proxy, run's editor) raised
    FRAME_TOO_LARGE = -33003    # a message over the frame limit: refused, or its answer lost
    POLICY_DENIED = -33004      # a policy refused: the permissions proxy, run's sandbox
    REQUEST_TIMEOUT = -33005    # unanswered for `request_timeout` seconds
    SESSION_LOST = -33006       # the agent restarted and could not reopen the session
    LIMIT_REACHED = -33007      # a bounded table is full (MCP-over-ACP connections)


CONDUCTOR_CODES = range(-33099, -33000)
