"""Bringing the chain back after a component failed (docs/reliability.md).

- A restarted component is re-attached to its place: first initialized again with the
  params it got the first time (a proxy's own initialize toward its successor is answered
  from what its successor said then, so the agent is not initialized twice); then, for the
  agent, each session the table holds open is reopened with `session/resume` or, failing
  that, `session/load` (its replayed updates are dropped: the editor has them), as the
  restarted agent's capabilities allow. A session that cannot be reopened is *lost*: its
  state is released and the editor's next request naming it is answered `SESSION_LOST`.
  A session whose reopen was in flight when the restarted agent failed is a suspect:
  reopened alone, after the others, next time, and lost if the agent fails on it again.
- An optional proxy that failed for good is taken out of the chain, which closes up
  around it.

Only the swap at the end makes the restarted component reachable: until then the old,
failed hop answers what is sent to it (`ComponentRestartingError`).
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Final

import anyio
import msgspec
from msgspec import UNSET, Raw, UnsetType

from conductor import acp
from conductor.errors import ComponentRestartingError, ComponentStartError
from conductor.jsonrpc.codes import ErrorCode
from conductor.jsonrpc.message import Notification, Request, Response, error_response, payload
from conductor.routing.handshake import chain_hooks
from conductor.routing.roles import Role
from conductor.routing.sessions import CloseReason

if TYPE_CHECKING:
    from conductor.errors import ComponentError
    from conductor.jsonrpc.message import Call
    from conductor.routing.chain import Chain
    from conductor.routing.topology import Hop, Node

log = logging.getLogger("acp_conductor.routing")

REATTACH_TIMEOUT: Final = 30.0  # each request of a re-attach, when request_timeout is off
REOPEN_AT_ONCE: Final = 8  # sessions reopened at the same time after an agent restart
MAX_LOST: Final = 4096          # lost session ids remembered, to answer SESSION_LOST
SUSPECT_LIMIT: Final = 2  # agent failures during one session's reopen before it is lost


class Recovery:
    """What the router remembers in order to bring a component back, and doing it."""

    def __init__(self, chain: Chain) -> None:
        self._chain = chain
        # node name -> the initialize params it first received (before its dialect's form)
        self.first_initialize: dict[str, Raw | UnsetType] = {}
        # proxy name -> its successor's answer to that proxy's initialize
        self.initialize_answers: dict[str, Response] = {}
        self.reinitializing: set[str] = set()  # proxies whose initialize is answered from memory
        self.muted: set[str] = set()           # sessions being reloaded: replays are dropped
        self.lost: dict[str, str] = {}         # session id -> why it could not be reopened
        # session id -> how often the agent failed while that session was being reopened:
        # reopened alone, after the others, next time; lost after SUSPECT_LIMIT failures
        self.suspects: dict[str, int] = {}

    # -- what the router calls on its way ------------------------------------------------------

    def initialize_seen(self, target: Node, params: Raw | UnsetType) -> None:
        self.first_initialize.setdefault(target.name, params)

    def remember_answer(self, proxy: str, answer: Response) -> None:
        if not answer.is_error:
            self.initialize_answers.setdefault(proxy, answer)

    def replay_for(self, proxy: str) -> Response | None:
        """The answer a re-initializing proxy gets for its initialize toward its successor."""
        return self.initialize_answers.get(proxy) if proxy in self.reinitializing else None

    def is_muted(self, msg: Notification) -> bool:
        return acp.get_str(msg.params, "sessionId") in self.muted

    def lost_answer(self, msg: Call) -> Response | bool:
        """For a client message naming a lost session: the error for a request, True for a
        notification (dropped); False when it names no lost session."""
        sid = acp.get_str(msg.params, "sessionId")
        if sid is None or sid not in self.lost:
            return False
        if msg.method in acp.SESSION_SETUP:  # the editor sets it up again: let it through
            del self.lost[sid]
            return False
        if not isinstance(msg, Request):
            log.info("%s for lost session %s dropped", msg.method, sid)
            return True
        agent = self._chain.topology.last.name
        return error_response(
            msg.id, ErrorCode.SESSION_LOST,
            f"session {sid} was lost: {agent} restarted and could not reopen it "
            f"({self.lost[sid]}); start a new session",
            {"component": agent, "sessionId": sid})

    # -- restart -------------------------------------------------------------------------------

    async def reattach(self, name: str, hop: Hop) -> None:
        """`name` was restarted and is reached on `hop`: initialize it again, reopen its
        sessions (the agent), then route to it.

        Raises:
            ComponentError: it did not come back (an error answer, its exit, no answer).
        """
        chain = self._chain
        node = chain.topology.named(name)
        if node is None:
            raise ComponentStartError(name, "is no longer part of the chain")
        chain.topology.adopt(node, hop)
        if not hop.dialect_forced:  # how it spells the envelope was learnt once already
            hop.dialect = node.hop.dialect
        try:
            if name in self.first_initialize:  # it had been initialized: again, the same way
                init = chain.handshake.downward(self.first_initialize[name], node,
                                                is_request=True,
                                                resend=_no_resend)
                if node.role is Role.PROXY:
                    self.reinitializing.add(name)
                try:
                    answer = await self._ask(hop, init.method, init.params)
                finally:
                    self.reinitializing.discard(name)
                if node.role is Role.AGENT and (check := chain_hooks(init.hooks)) is not None:
                    # What the first answer was held to (a v2 client's agent must say
                    # version 2) holds for this one too, and which MCP servers it takes
                    # is learnt again: a different build may take others.
                    answer = await check(answer) or answer
                if answer.is_error:
                    raise ComponentStartError(name, "answered initialize with an error after "
                                              f"its restart: {_message(answer)}")
                if node.role is Role.AGENT:
                    await self._reopen_sessions(hop, answer)
        except BaseException:
            chain.topology.disown(hop)
            raise
        chain.topology.swap(node, hop)
        chain.replan()
        log.warning("%s is back after its restart", name)
        chain.trace_lifecycle(name, "reattached", sessions=len(chain.sessions))

    @property
    def _timeout(self) -> float:
        return self._chain.timeouts.request or REATTACH_TIMEOUT

    async def _ask(self, hop: Hop, method: str, params: Raw | UnsetType, *,
                   bounded: bool = True) -> Response:
        """Send a request of the re-attach and wait for its answer, within the request
        timeout (`bounded`), or for as long as the caller bounds it."""
        if hop.failure is not None:  # it died already: nothing would ever answer (or fail) it
            raise hop.failure
        outgoing, request = hop.open_request(method, params)
        try:
            await hop.send(request)
        except (anyio.BrokenResourceError, anyio.ClosedResourceError):
            pass  # it is gone already: its reader fails the hop, and so this request
        if not bounded:
            return await hop.wait(outgoing, cancel_on_abort=False)
        try:
            with anyio.fail_after(self._timeout):
                return await hop.wait(outgoing, cancel_on_abort=False)
        except TimeoutError:
            raise _no_answer(hop, method, self._timeout) from None

    async def _reopen_sessions(self, hop: Hop, answer: Response) -> None:
        chain = self._chain
        method = reopen_method(answer, chain.handshake.version or 1)
        lost: dict[str, str] = {}
        todo: list[tuple[str, Raw]] = []
        for record in chain.sessions.records():
            sid = record.session_id
            if method is None:
                lost[sid] = "it supports neither session/resume nor session/load"
                continue
            if record.setup is UNSET:
                lost[sid] = "how it was set up is not known"
                continue
            try:
                todo.append((sid, acp.set_key(record.setup, "sessionId", payload(sid))))
            except ValueError:  # a setup the agent took, but we cannot edit (too deep)
                lost[sid] = "its setup request cannot be repeated"
        # A session the agent failed on while reopening it may be what makes it fail (a
        # poisoned history): it is reopened alone, after the others, so that it cannot
        # take them down with it again, and is lost when the agent fails on it once more.
        open_ids = {sid for sid, _ in todo}
        for sid in [sid for sid in self.suspects if sid not in open_ids]:
            del self.suspects[sid]
        suspects = [(sid, params) for sid, params in todo if sid in self.suspects]
        todo = [(sid, params) for sid, params in todo if sid not in self.suspects]
        in_flight: set[str] = set()  # asked and not answered: what the agent failed on
        wedged: list[bool] = []
        # Several at once: the chain waits for them all, and one slow session must not
        # make the others wait their turn. The timeout bounds the wait for progress, not
        # each reopen (an agent may answer them one after the other): when none is
        # answered for that long, the agent is wedged and the restart fails, as it does
        # for an unanswered initialize; the task group then stops the others.
        limiter = anyio.CapacityLimiter(REOPEN_AT_ONCE)
        failed: list[Exception] = []  # the first one is raised as it is, not in a group
        progress = [anyio.current_time()]  # when the last reopen was answered (or began)

        async def watch() -> None:
            while True:
                await anyio.sleep(max(0.0, progress[0] + self._timeout - anyio.current_time()))
                if anyio.current_time() >= progress[0] + self._timeout:
                    wedged.append(True)  # slow, not failing on a session: no suspects
                    failed.append(_no_answer(hop, method or "", self._timeout))
                    tg.cancel_scope.cancel()
                    return

        async def reopen(sid: str, params: Raw) -> None:
            assert method is not None
            async with limiter:
                if method == acp.SESSION_LOAD:
                    self.muted.add(sid)
                in_flight.add(sid)
                try:
                    reopened = await self._ask(hop, method, params, bounded=False)
                except Exception as e:  # it is gone: the restart failed
                    failed.append(e)
                    tg.cancel_scope.cancel()
                    return
                finally:
                    self.muted.discard(sid)
                in_flight.discard(sid)
            self.suspects.pop(sid, None)
            progress[0] = anyio.current_time()
            if reopened.is_error:
                lost[sid] = f"{method} failed: {_message(reopened)}"
                return
            log.info("session %s reopened on the restarted %s (%s)", sid, hop.name, method)
            chain.trace_lifecycle(hop.name, "session-reopened", session=sid, how=method)

        async with anyio.create_task_group() as tg:
            if todo or suspects:
                tg.start_soon(watch)
            async with anyio.create_task_group() as reopening:
                for sid, params in todo:
                    reopening.start_soon(reopen, sid, params)
            for sid, params in suspects:
                if failed:
                    break
                await reopen(sid, params)
            tg.cancel_scope.cancel()  # all answered: the watch is over
        if failed:
            if not wedged:
                await self._suspect(in_flight, hop)
            raise failed[0]
        await self._lose(lost, hop)

    async def _lose(self, lost: dict[str, str], hop: Hop) -> None:
        """These sessions (id -> why) cannot be reopened on the restarted `hop`: released,
        and remembered to answer SESSION_LOST."""
        if not lost:
            return
        for sid, why in lost.items():
            log.warning("session %s lost: %s restarted and %s", sid, hop.name, why)
            self.lost[sid] = why
            while len(self.lost) > MAX_LOST:
                del self.lost[next(iter(self.lost))]
        await self._chain.end_sessions(list(lost), CloseReason.LOST)

    async def _suspect(self, session_ids: set[str], hop: Hop) -> None:
        """The agent failed while these sessions were being reopened."""
        lost = {}
        for sid in session_ids:
            self.suspects[sid] = self.suspects.get(sid, 0) + 1
            if self.suspects[sid] >= SUSPECT_LIMIT:
                del self.suspects[sid]
                lost[sid] = f"it failed {SUSPECT_LIMIT} times while reopening this session"
        await self._lose(lost, hop)

    def restarting(self, name: str, error: ComponentError) -> None:
        """`name` failed and is started again after a wait: what is sent to it meanwhile
        is answered with why, `error`. The node still points at the hop of its last run that
        came back; a restart that did not come back (or could not be spawned) never
        replaced it, and would leave an older failure's reason there."""
        node = self._chain.topology.named(name)
        if node is not None and node.hop.failure is not None:
            node.hop.failure = ComponentRestartingError(name, error.reason)

    def given_up(self, name: str, error: ComponentError) -> None:
        """`name` is not restarted again: what is sent to it from now on is answered with
        `error`, its last failure, no longer "being restarted, send this again shortly"."""
        node = self._chain.topology.named(name)
        if node is not None and isinstance(node.hop.failure, ComponentRestartingError):
            node.hop.failure = error

    # -- optional proxies ----------------------------------------------------------------------

    def bypass(self, name: str) -> bool:
        """Take the proxy `name` out of the chain; False when it is not in it."""
        chain = self._chain
        node = chain.topology.named(name)
        if node is None or node.role is not Role.PROXY:
            return False
        chain.topology.remove(node)
        chain.replan()
        return True


def reopen_method(answer: Response, version: int) -> str | None:
    """How a (restarted) agent's initialize answer says sessions can be reopened:
    session/resume (v1 `sessionCapabilities.resume`; v2 any `capabilities.session`), else
    session/load (v1 `loadSession: true`), else None. Read in the version the answer
    itself names (`version`, the editor's, if it names none): behind a proxy that adapts
    versions, the agent may speak another than the editor."""
    try:
        result = msgspec.json.decode(answer.result) if answer.result is not UNSET else None
    except (msgspec.DecodeError, RecursionError):
        return None
    if not isinstance(result, dict):
        return None
    spoken = result.get("protocolVersion")
    if isinstance(spoken, int) and not isinstance(spoken, bool) and spoken >= 1:
        version = spoken
    if version >= 2:
        caps = result.get("capabilities")
        return acp.SESSION_RESUME if isinstance(caps, dict) and \
            isinstance(caps.get("session"), dict) else None
    caps = result.get("agentCapabilities")
    if not isinstance(caps, dict):
        return None
    session = caps.get("sessionCapabilities")
    if isinstance(session, dict) and session.get("resume") is not None:
        return acp.SESSION_RESUME
    return acp.SESSION_LOAD if caps.get("loadSession") is True else None


def _message(answer: Response) -> str:
    try:
        error = answer.error_value()
    except msgspec.DecodeError:
        return "an error that cannot be read"
    message = error.get("message") if isinstance(error, dict) else None
    return str(message) if message else str(error)


def _no_answer(hop: Hop, method: str, timeout: float) -> ComponentStartError:
    return ComponentStartError(hop.name, f"did not answer {method} within {timeout:g}s "
                               "after its restart")


async def _no_resend(method: str, params: Raw) -> None:
    raise AssertionError("a re-initialize has no legacy fallback: the dialect is known")
