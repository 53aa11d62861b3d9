"""`Regex`: a pydantic string that must compile, so a bad pattern fails at load, by field."""

from __future__ import annotations

import re
from typing import Annotated

from pydantic import AfterValidator


def _compiles(pattern: str) -> str:
    try:
        re.compile(pattern)
    except re.error as e:
        raise ValueError(f"{pattern!r} is not a regular expression: {e}") from None
    return pattern


Regex = Annotated[str, AfterValidator(_compiles)]
