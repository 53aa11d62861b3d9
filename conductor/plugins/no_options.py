"""`NoOptions`: the options model of a proxy that takes none.

In a module of its own so that pydantic is imported only when a chain uses options
(`conductor.plugins.api` hands it out on first use).
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict


class NoOptions(BaseModel):
    """The options model of a proxy that takes none."""

    model_config = ConfigDict(extra="forbid")
