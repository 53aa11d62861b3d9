"""Which sessions exist, who opened them, and what state they are in."""

from __future__ import annotations

import enum
import logging
import time
from dataclasses import dataclass, field

log = logging.getLogger("acp_conductor.sessions")


class SessionState(enum.StrEnum):
    OPENING = "opening"
    IDLE = "idle"
    PROMPTING = "prompting"
    CLOSED = "closed"


@dataclass(slots=True)
class SessionRecord:
    session_id: str
    opened_by: str          # "client", or the name of the proxy that opened it downstream
    served_by: str          # the component that answered the setup request
    how: str                # session/new, session/load, session/resume, session/fork
    state: SessionState = SessionState.OPENING
    opened_at: float = field(default_factory=time.time)
    prompts: int = 0


class SessionTable:
    """Kept by the router; read by logs, traces, plugins and MCP routing."""

    def __init__(self) -> None:
        self._records: dict[str, SessionRecord] = {}
        self._rank: dict[str, int] = {}  # how close to the client the opener is (lower: closer)

    def __contains__(self, session_id: str) -> bool:
        return session_id in self._records

    def get(self, session_id: str) -> SessionRecord | None:
        return self._records.get(session_id)

    def records(self) -> list[SessionRecord]:
        return list(self._records.values())

    def opened(self, session_id: str, *, by: str, rank: int, served_by: str, how: str) -> None:
        """A setup answer or request named this session on a hop at `rank` (0 = client)."""
        record = self._records.get(session_id)
        if record is None or record.state is SessionState.CLOSED:
            self._records[session_id] = SessionRecord(session_id, by, served_by, how,
                                                      SessionState.IDLE)
            self._rank[session_id] = rank
            self._log_opened(self._records[session_id], rank)
        elif rank < self._rank[session_id]:  # the answer travelled further up: that hop opened it
            record.opened_by = by
            self._log_opened(record, rank)
            self._rank[session_id] = rank
            if record.state is SessionState.OPENING:
                record.state = SessionState.IDLE

    @staticmethod
    def _log_opened(record: SessionRecord, rank: int) -> None:
        # Answers travel up hop by hop: only the client's hop (rank 0) is surely the opener.
        log.log(logging.INFO if rank == 0 else logging.DEBUG, "session %s: %s by %s, served by %s",
                record.session_id, record.how, record.opened_by, record.served_by)

    def prompting(self, session_id: str) -> None:
        record = self._records.get(session_id)
        if record is not None and record.state is not SessionState.CLOSED:
            record.state = SessionState.PROMPTING
            record.prompts += 1

    def idle(self, session_id: str) -> None:
        record = self._records.get(session_id)
        if record is not None and record.state is SessionState.PROMPTING:
            record.state = SessionState.IDLE

    def closed(self, session_id: str) -> None:
        record = self._records.get(session_id)
        if record is not None:
            record.state = SessionState.CLOSED
            log.info("session %s: closed (%d prompts)", session_id, record.prompts)
