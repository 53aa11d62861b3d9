"""Sessions: the one set of lifecycle rules, and the conductor's table of open sessions.

The rules (`lifecycle`) say, for a request on its way to an agent, what it does to a
session and when: `session/load` and `session/resume` open it *before* the request goes
out (replayed updates precede the answer, protocol.md §7); `session/new` and
`session/fork` open it when a successful answer names it; `session/close` and
`session/delete` end it on a successful answer; `session/prompt` starts a turn that its
answer ends (v1), or, when a v2 agent accepts it, that runs on until the agent's
`session/update` says the session is idle (`state_update`; the router's table only). The
router and the plugin host both apply these rules, each to its own state, so they cannot
drift apart.

The `SessionTable` is the router's record of which sessions are open, who opened them and
whether a turn is running. It is read by traces (session events), by MCP-over-ACP
routing (connections end with their session) and by shutdown (which turns to cancel). A
session's record is released as soon as it ends, however it ends (`CloseReason`): closed,
refused on load, idle past `[conductor] session_idle_expiry`, or the connection ended. So
the table holds only open sessions, and memory does not grow with every session.
"""

from __future__ import annotations

import enum
import logging
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

import msgspec
from msgspec import UNSET, Raw, UnsetType

from conductor import acp
from conductor.record import Record

if TYPE_CHECKING:
    from conductor.jsonrpc.message import Response

log = logging.getLogger("acp_conductor.sessions")


class Step(enum.Enum):
    OPEN_NOW = "open-now"              # load / resume: the id is in the request
    OPEN_ON_ANSWER = "open-on-answer"  # new / fork: the id is in the answer
    CLOSE_ON_ANSWER = "close"          # close / delete, when they succeed
    PROMPT = "prompt"                  # a turn, until its answer


class Lifecycle(Record, frozen=True):
    """What one request does to a session."""

    step: Step
    method: str
    session_id: str | None  # known from the request (all steps but OPEN_ON_ANSWER)

    def opened_by(self, answer: Response) -> str | None:
        """The session an answer to this request opened (None: it opened none)."""
        if answer.is_error:
            return None
        if self.step is Step.OPEN_ON_ANSWER:
            return acp.get_str(answer.result, "sessionId")
        return self.session_id if self.step is Step.OPEN_NOW else None

    def closed_by(self, answer: Response) -> str | None:
        """The session an answer to this request closed (None: it closed none)."""
        if self.step is Step.CLOSE_ON_ANSWER and not answer.is_error:
            return self.session_id
        return None


_STEPS = {acp.SESSION_LOAD: Step.OPEN_NOW, acp.SESSION_RESUME: Step.OPEN_NOW,
          acp.SESSION_NEW: Step.OPEN_ON_ANSWER, acp.SESSION_FORK: Step.OPEN_ON_ANSWER,
          acp.SESSION_CLOSE: Step.CLOSE_ON_ANSWER, acp.SESSION_DELETE: Step.CLOSE_ON_ANSWER,
          acp.SESSION_PROMPT: Step.PROMPT}


def lifecycle(method: str, params: Raw | UnsetType = UNSET) -> Lifecycle | None:
    """The rule for `method`, or None when it does not change any session's lifecycle."""
    step = _STEPS.get(method)
    if step is None:
        return None
    sid = None if step is Step.OPEN_ON_ANSWER else acp.get_str(params, "sessionId")
    if sid is None and step is not Step.OPEN_ON_ANSWER:
        return None  # names no session: nothing to track
    return Lifecycle(step, method, sid)


class CloseReason(enum.StrEnum):
    """Why a session ended and its state was released (`SessionScope.closed_reason` for
    plugins, in `session_closed`; `reason` of a trace's session-closed event)."""

    CLOSED = "closed"    # session/close was answered with success
    DELETED = "deleted"  # session/delete was answered with success
    REFUSED = "refused"  # the session/load or session/resume that opened it failed
    EXPIRED = "expired"  # idle longer than session_idle_expiry; the agent is not told
    LOST = "lost"        # the agent restarted and could not reopen it
    STOPPED = "stopped"  # the chain stopped (editor gone, conductor shut down) with it open


class SessionState(enum.StrEnum):
    IDLE = "idle"
    PROMPTING = "prompting"


class SessionRecord(Record):
    session_id: str
    opened_by: str          # "client", or the name of the proxy that opened it downstream
    served_by: str          # the component that answered the setup request
    how: str                # session/new, session/load, session/resume, session/fork
    state: SessionState = SessionState.IDLE
    opened_at: float = msgspec.field(default_factory=time.time)
    prompts: int = 0
    idle_since: float = 0.0          # the table's clock: when its last turn ended (or it opened)
    ended: CloseReason | None = None  # set once it is released
    # The setup request's params as the agent received them (cwd, mcpServers, ...): what
    # reopens the session on a restarted agent.
    setup: Raw | UnsetType = UNSET
    turns: int = 0  # prompts on their way to the agent: idle again only when none is


class PendingLoads:
    """Loads and resumes on their way for sessions no answer has confirmed open: one of
    them refused opened nothing only if every other one is refused too (an editor's retry
    may follow a refused load). The rule the router's table and the plugin host share."""

    def __init__(self) -> None:
        self._count: dict[str, int] = {}

    def sent(self, session_id: str, *, known: bool) -> bool:
        """A load or resume of `session_id` goes out (`known`: it was open already). True
        when its answer must go to `answered`: nothing has confirmed the session yet."""
        if not known:
            self._count[session_id] = 0
        if session_id not in self._count:
            return False
        self._count[session_id] += 1
        return True

    def confirmed(self, session_id: str) -> bool:
        return session_id not in self._count

    def answered(self, session_id: str, ok: bool) -> bool:
        """One of them was answered (`ok`: with success). True when that was the last and
        every one was refused: the session never opened."""
        left = self._count.get(session_id)
        if left is None:
            return False
        if ok or left <= 1:
            del self._count[session_id]
            return not ok
        self._count[session_id] = left - 1
        return False

    def forget(self, session_id: str) -> None:
        self._count.pop(session_id, None)


Observer = Callable[[str, SessionRecord], None]  # ("opened" | "closed", record)


class SessionTable:
    """The open sessions. Written by the router; read by traces, MCP routing, shutdown."""

    def __init__(self, observer: Observer | None = None, *,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self._records: dict[str, SessionRecord] = {}
        self.loads = PendingLoads()
        self._rank: dict[str, int] = {}  # how close to the client the opener is (lower: closer)
        # v2 sessions -> how many of their prompts the agent accepted and has not yet ended
        # with a `state_update` to idle (v2 answers a prompt when it accepts it).
        # (Read on the router's hot path: empty, no v2 turn waits.)
        self.accepted_turns: dict[str, int] = {}
        self._observers: list[Observer] = [observer] if observer is not None else []
        self.clock = clock

    def observe(self, observer: Observer) -> None:
        self._observers.append(observer)

    def __contains__(self, session_id: str) -> bool:
        return session_id in self._records

    def __len__(self) -> int:
        return len(self._records)

    def get(self, session_id: str) -> SessionRecord | None:
        return self._records.get(session_id)

    def records(self) -> list[SessionRecord]:
        return list(self._records.values())

    def opened(self, session_id: str, *, by: str, rank: int, served_by: str, how: str,
               setup: Raw | UnsetType = UNSET) -> None:
        """A setup answer or request named this session on a hop at `rank` (0 = client).
        `setup`: the params the agent got (given where the request reached the agent)."""
        record = self._records.get(session_id)
        if record is None:
            record = SessionRecord(session_id, by, served_by, how, idle_since=self.clock(),
                                   setup=setup)
            self._records[session_id] = record
            self._rank[session_id] = rank
            self._tell("opened", record)
        else:
            record.idle_since = self.clock()  # set up again (a reload): a fresh start
            if setup is not UNSET:
                record.setup = setup
            if rank < self._rank[session_id]:  # the answer travelled further up: that hop opened it
                record.opened_by = by
                self._rank[session_id] = rank
                self._tell("opened", record)

    def loading(self, session_id: str, *, by: str, rank: int, served_by: str, how: str,
                setup: Raw | UnsetType = UNSET) -> SessionRecord:
        """A load or resume names this session on its way: recorded now, before its answer
        (replayed updates precede it). Unless the session was already confirmed open, each
        such request's answer goes to `load_answered`."""
        known = session_id in self._records
        self.opened(session_id, by=by, rank=rank, served_by=served_by, how=how, setup=setup)
        self.loads.sent(session_id, known=known)
        return self._records[session_id]

    def load_answered(self, record: SessionRecord, ok: bool) -> bool:
        """A load or resume of an unconfirmed session was answered (`ok`: with success).
        True when that released the record: every load of it was refused."""
        if self._records.get(record.session_id) is not record \
                or not self.loads.answered(record.session_id, ok):
            return False
        self.closed(record.session_id, CloseReason.REFUSED)
        return True

    def prompting(self, session_id: str) -> SessionRecord | None:
        """A turn starts; returns the record it counts on (None: no such session open)."""
        record = self._records.get(session_id)
        if record is not None:
            record.state = SessionState.PROMPTING
            record.prompts += 1
            record.turns += 1
        return record

    def idle(self, session_id: str, record: SessionRecord | None) -> None:
        """A prompt was answered (`record`: what `prompting` returned for it): the session
        is idle once no other turn of it runs (a second prompt refused at once must not
        mark it idle under the running one). A turn of a session since closed (and maybe
        opened again) ends nothing."""
        if record is not None and self._records.get(session_id) is record:
            record.turns = max(0, record.turns - 1)
            if record.turns == 0:
                record.state = SessionState.IDLE
                record.idle_since = self.clock()

    def accepted(self, session_id: str, record: SessionRecord | None) -> None:
        """A v2 agent accepted a prompt (`record`: what `prompting` returned for it): its
        answer does not end the turn, which runs until the agent says the session is idle
        (`said_idle`)."""
        if record is not None and self._records.get(session_id) is record:
            self.accepted_turns[session_id] = self.accepted_turns.get(session_id, 0) + 1

    def said_idle(self, session_id: str) -> int | None:
        """The agent said `session_id` is idle (v2 `state_update`): every turn of it that
        it accepted ends (a prompt not yet answered is not one of them). Returns how many
        did; 0 when they had ended already (`timed_out`: this idle is the agent's late
        word); None when none was waiting."""
        count = self.accepted_turns.pop(session_id, None)
        record = self._records.get(session_id)
        for _ in range(count or 0):
            self.idle(session_id, record)
        return count

    def rank(self, session_id: str) -> int:
        """How close to the client the session's opener is (0: the client itself)."""
        return self._rank.get(session_id, 0)

    def timed_out(self, session_id: str) -> None:
        """The conductor ended the session's accepted v2 turns itself (its prompt timeout):
        they end now, and the agent's own idle state, when it comes, ends nothing."""
        if self.accepted_turns.get(session_id):
            self.said_idle(session_id)
            self.accepted_turns[session_id] = 0

    def closed(self, session_id: str, reason: CloseReason = CloseReason.CLOSED
               ) -> SessionRecord | None:
        """The session ended: its record is released (and returned; None if unknown)."""
        self.accepted_turns.pop(session_id, None)
        record = self._records.pop(session_id, None)
        self._rank.pop(session_id, None)
        self.loads.forget(session_id)
        if record is not None:
            record.ended = reason
            self._tell("closed", record)
        return record

    def idle_longer_than(self, seconds: float) -> list[str]:
        """Sessions with no turn running and none started for `seconds`."""
        cutoff = self.clock() - seconds
        return [r.session_id for r in self._records.values()
                if r.state is SessionState.IDLE and r.idle_since <= cutoff]

    def clear(self, reason: CloseReason = CloseReason.STOPPED) -> None:
        """The connection ended: every session is gone."""
        for session_id in list(self._records):
            self.closed(session_id, reason)

    def _tell(self, event: str, record: SessionRecord) -> None:
        # Answers travel up hop by hop: only the client's hop (rank 0) is surely the opener.
        rank = self._rank.get(record.session_id, 0)
        what = f"{event} ({record.ended})" if record.ended is not None else event
        log.log(logging.INFO if rank == 0 or event == "closed" else logging.DEBUG,
                "session %s: %s (%s by %s, served by %s, %d prompts)", record.session_id,
                what, record.how, record.opened_by, record.served_by, record.prompts)
        for observer in self._observers:
            observer(event, record)
