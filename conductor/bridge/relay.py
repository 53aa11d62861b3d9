"""One agent-side MCP session relayed as one MCP-over-ACP connection to the provider.

The agent's MCP client speaks plain MCP (JSON-RPC) to the bridge, over HTTP or through the
stdio shim; the provider sees `mcp/message` on the connection the bridge opened for this
session. Requests keep their ids on each side: an agent request becomes an ACP request of
the bridge's endpoint (its cancel, `notifications/cancelled`, becomes `$/cancel_request`,
and the request is then not answered, but over http, whose wire needs an answer);
a provider request (elicitation, sampling) goes to the agent under an id of the relay's
own, and the agent's answer goes back as the ACP answer; cancelled, it is answered -32800
by the relay (an MCP agent does not answer a request it is told is cancelled).
"""

from __future__ import annotations

import itertools
import logging
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

import anyio

from conductor import acp
from conductor.jsonrpc.message import Request, Response, error_response, payload
from conductor.rpc.endpoint import Inbound
from conductor.rpc.failure import cancelled_response

if TYPE_CHECKING:
    from anyio.abc import TaskGroup

    from conductor.jsonrpc.message import Call
    from conductor.rpc.endpoint import Endpoint, Outgoing

log = logging.getLogger("acp_conductor.bridge")

ToAgent = Callable[[dict[str, Any]], Awaitable[None]]
MAX_PENDING = 1024  # agent requests in flight on one session


class Relay:
    """Both directions of one bridged MCP session."""

    def __init__(self, endpoint: Endpoint, tg: TaskGroup, connection_id: str, name: str,
                 to_agent: ToAgent, close_agent: Callable[[], Awaitable[None]], *,
                 answers_cancelled: bool = True) -> None:
        self.endpoint = endpoint
        # MCP: a request the agent cancelled is not answered; but the 2025 http wire ends
        # a request's stream only with an answer (the SDK's own transport sends -32800).
        self.answers_cancelled = answers_cancelled
        self.tg = tg
        self.connection_id = connection_id
        self.name = name
        self.to_agent = to_agent
        self.close_agent = close_agent
        self.closed = False
        self._outgoing: dict[Any, Outgoing] = {}      # agent request id -> our ACP request
        # our id toward the agent -> the provider's request, and how it is tracked
        self._asked: dict[str, tuple[Request, Inbound]] = {}
        self._ids = itertools.count(1)
        self.progress: dict[Any, Any] = {}            # progressToken -> agent request id

    def progress_of(self, token: Any) -> Any:
        """The agent request a progress token belongs to (None: none of them; a provider
        may write any JSON there)."""
        return self.progress.get(_key(token))

    # -- from the agent ------------------------------------------------------------------

    async def from_agent(self, message: dict[str, Any]) -> None:
        """A JSON-RPC message the agent's MCP client sent."""
        method = message.get("method")
        if method is None:  # an answer to a request the provider made
            await self._answer_provider(message)
            return
        params = message.get("params")
        if "id" not in message:
            if method == "notifications/cancelled":
                # Its requestId is the agent's MCP id: only the relay can map it. Passed on,
                # it would name a request of the bridge's connection (shared by every
                # bridged session) to the router.
                requested = params.get("requestId") if isinstance(params, dict) else None
                outgoing = self._outgoing.get(_key(requested))
                if outgoing is not None:
                    await self.endpoint.cancel(outgoing)
                return  # else: answered meanwhile, nothing to cancel
            await self.endpoint.notify(acp.MCP_MESSAGE, self._envelope(method, params))
            return
        ident = message["id"]
        if len(self._outgoing) >= MAX_PENDING:
            await self.to_agent({"jsonrpc": "2.0", "id": ident, "error": {
                "code": -32603, "message": f"the conductor's MCP bridge: too many requests "
                f"in flight to the MCP server {self.name} ({MAX_PENDING})"}})
            return
        # What the stdio shim passes on is unchecked JSON: `_meta` may be anything.
        meta = params.get("_meta") if isinstance(params, dict) else None
        token = meta.get("progressToken") if isinstance(meta, dict) else None
        if token is not None:
            self.progress[_key(token)] = ident
        outgoing, request = self.endpoint.open_request(
            acp.MCP_MESSAGE, payload(self._envelope(method, params)))
        self._outgoing[_key(ident)] = outgoing
        # Sent here, not in the task that waits: what the agent sends next (its cancel of
        # this request, say) must not reach the provider first.
        try:
            await self.endpoint.send(request)
        except Exception as e:  # the chain is going away: the agent still gets an answer
            self.endpoint.pending.pop(outgoing.ident, None)
            failed: Response | None = error_response(request.id, -32603, self._lost(e))
        except BaseException:  # cancelled (the session is ending): nothing will wait for it
            self.endpoint.pending.pop(outgoing.ident, None)
            self._outgoing.pop(_key(ident), None)
            if token is not None:
                self.progress.pop(_key(token), None)
            raise
        else:
            failed = None
        self.tg.start_soon(self._ask_provider, ident, token, outgoing, failed)

    async def _ask_provider(self, ident: Any, token: Any, outgoing: Outgoing,
                            failed: Response | None) -> None:
        try:
            try:
                answer = failed or await self.endpoint.wait(outgoing, cancel_on_abort=False)
            except Exception as e:  # the chain is going away: the agent still gets an answer
                answer = error_response(outgoing.id, -32603, self._lost(e))
            reply: dict[str, Any] = {"jsonrpc": "2.0", "id": ident}
            if answer.is_error:
                reply["error"] = self._mcp_error(answer.error_value())
            else:
                result = answer.result_value()
                if isinstance(result, dict):
                    reply["result"] = result
                else:  # MCP results are objects: the agent's client would choke on it
                    reply["error"] = self._malformed("a result that is not an object")
            if not self.closed and (self.answers_cancelled or not outgoing.cancel_sent):
                await self.to_agent(reply)
        finally:
            self._outgoing.pop(_key(ident), None)
            if token is not None:
                self.progress.pop(_key(token), None)

    async def _answer_provider(self, message: dict[str, Any]) -> None:
        asked = self._asked.pop(str(message.get("id")), None)
        if asked is None:
            log.debug("%s: answer for unknown id %r from the agent", self.name,
                      message.get("id"))
            return
        request, inbound = asked
        if "error" in message:
            answer = Response(id=request.id, error=payload(message["error"]))
        else:
            answer = Response(id=request.id, result=payload(message.get("result")))
        self.endpoint.untrack_inbound(request.id, inbound)  # before: the id may come again
        await self.endpoint.send(answer)

    def _lost(self, error: Exception) -> str:
        return (f"the conductor's MCP bridge lost the request to the MCP server {self.name}: "
                f"{type(error).__name__}{f': {error}' if str(error) else ''} (the chain is "
                "stopping, or the server's connection is gone)")

    def _mcp_error(self, error: Any) -> dict[str, Any]:
        if isinstance(error, dict) and isinstance(error.get("code"), int) \
                and not isinstance(error.get("code"), bool) \
                and isinstance(error.get("message"), str):
            return error
        return self._malformed("an error that is not a JSON-RPC error object")

    def _malformed(self, what: str) -> dict[str, Any]:
        log.warning("%s: the MCP server answered with %s", self.name, what)
        return {"code": -32603, "message": f"the MCP server {self.name} (through the "
                f"conductor's bridge) answered with {what}"}

    def _envelope(self, method: str, params: Any) -> Any:
        body: dict[str, Any] = {"connectionId": self.connection_id, "method": method}
        if params is not None:
            body["params"] = params
        return body

    # -- from the provider ---------------------------------------------------------------

    async def from_provider(self, msg: Call) -> None:
        """An `mcp/message` the provider sent on this connection."""
        params = msg.params_value() or {}
        inner: dict[str, Any] = {"jsonrpc": "2.0", "method": params.get("method")}
        if "params" in params:
            inner["params"] = params["params"]
        if not isinstance(inner["method"], str) \
                or not isinstance(inner.get("params", {}), dict | None):
            # Not an MCP message: the agent's client cannot take it (http refuses to send it).
            what = (f"Invalid params: an mcp/message for {self.name} needs a string method "
                    "and object params (the conductor's MCP bridge passes the agent only MCP "
                    "messages)")
            if isinstance(msg, Request):
                await self.endpoint.send(error_response(msg.id, -32602, what, {
                    "connectionId": self.connection_id}))
            else:
                log.warning("%s (dropped)", what)
            return
        if isinstance(msg, Request) and self.closed:  # nobody is left to answer it
            await self.endpoint.send(error_response(
                msg.id, -32603, f"the agent's MCP session for {self.name} closed"))
            return
        if isinstance(msg, Request):
            ident = f"acp-{next(self._ids)}"
            inner["id"] = ident

            async def cancel() -> None:
                # MCP: the agent does not answer a request it is told is cancelled; ACP:
                # a cancelled request is still answered. So the relay answers it here.
                if self._asked.pop(ident, None) is None:
                    return  # answered meanwhile
                self.endpoint.untrack_inbound(msg.id, inbound)
                try:
                    await self.to_agent({"jsonrpc": "2.0", "method": "notifications/cancelled",
                                         "params": {"requestId": ident}})
                finally:
                    await self.endpoint.send(cancelled_response(msg.id,
                                                                component=self.endpoint.name))
            inbound = Inbound(on_cancel=cancel)
            self._asked[ident] = (msg, inbound)
            self.endpoint.track_inbound(msg.id, inbound)
        if not self.closed:
            await self.to_agent(inner)

    async def close(self, *, tell_provider: bool) -> None:
        """The session ends: what is owed is answered, and the other side is told."""
        if self.closed:
            return
        self.closed = True
        # Taken at once: a provider request arriving during the sends below is answered by
        # `from_provider`, and must not change the dict being walked.
        asked, self._asked = list(self._asked.values()), {}
        for request, inbound in asked:  # the provider asked; nobody will answer now
            self.endpoint.untrack_inbound(request.id, inbound)
            with anyio.CancelScope(shield=True):
                await self.endpoint.send(error_response(
                    request.id, -32603, f"the agent's MCP session for {self.name} closed"))
        with anyio.CancelScope(shield=True), anyio.move_on_after(2):
            if tell_provider:
                try:
                    await self.endpoint.request(acp.MCP_DISCONNECT,
                                                {"connectionId": self.connection_id},
                                                cancel_on_abort=False)
                except Exception as e:  # the chain is going: nothing to tell
                    log.debug("mcp/disconnect for %s: %s", self.connection_id, e)
            else:
                await self.close_agent()


def _key(ident: Any) -> Any:
    return ident if isinstance(ident, str | int) and not isinstance(ident, bool) else repr(ident)
