"""What a component is to the chain. Its own module: planning a chain needs it before the
router is imported (`conductor/plan.py`)."""

from __future__ import annotations

import enum


class Role(enum.StrEnum):
    CLIENT = "client"
    PROXY = "proxy"
    AGENT = "agent"
    SUCCESSOR = "successor"  # proxy mode: our successor, reached through the client wire
