"""The one place where an exception becomes a JSON-RPC error (codes: docs/errors.md)."""

from __future__ import annotations

from typing import TYPE_CHECKING

import msgspec
from msgspec import UNSET

from conductor.errors import ComponentError, RpcError
from conductor.jsonrpc.codes import ErrorCode
from conductor.jsonrpc.message import error_response

if TYPE_CHECKING:
    from msgspec import Raw

    from conductor.jsonrpc.message import JsonValue, Response


def error_for(error: BaseException, *, component: str,
              method: str | None = None) -> RpcError:
    """The wire error that answers a request whose handling raised `error`.

    `component` is who was handling it (a plugin proxy, `run`'s editor, ...). An RpcError
    is the answer as it stands; a ComponentError names the component that failed, under
    COMPONENT_FAILED; anything else is a bug in the handler: HANDLER_FAILED, naming it.
    """
    if isinstance(error, RpcError):
        return error
    if isinstance(error, ComponentError):
        return RpcError(ErrorCode.COMPONENT_FAILED, str(error), error.wire_data())
    what = f" handling {method}" if method else ""
    return RpcError(ErrorCode.HANDLER_FAILED,
                    f"{component} failed{what}: {type(error).__name__}: {error}",
                    {"component": component, "method": method})


def failure_response(ident: Raw | None, error: BaseException, *, component: str,
                     method: str | None = None) -> Response:
    """`error_for` as the Response to request `ident`."""
    rpc = error_for(error, component=component, method=method)
    return error_response(ident, rpc.code, rpc.message, rpc.data)


def cancelled_response(ident: Raw, *, component: str) -> Response:
    return error_response(ident, ErrorCode.REQUEST_CANCELLED, "Request cancelled",
                          {"component": component})


def raise_for_error(answer: Response) -> Response:
    """The answer itself when it is a result.

    Raises:
        RpcError: the answer is an error.
    """
    if answer.error is UNSET:
        return answer
    try:
        error: JsonValue = answer.error_value()
    except msgspec.DecodeError as e:
        raise RpcError(ErrorCode.INTERNAL_ERROR,
                       f"an error answer that cannot be read: {e}") from None
    if not isinstance(error, dict):
        raise RpcError(ErrorCode.INTERNAL_ERROR, str(error))
    code = error.get("code")
    raise RpcError(code if isinstance(code, int) else ErrorCode.INTERNAL_ERROR,
                   str(error.get("message", "")), error.get("data"))
