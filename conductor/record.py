"""`Record`: what the conductor's own plain data classes are made from (`msgspec.Struct`).

A Struct class is made in C, in about 40 µs, where `@dataclass` runs `exec` on the source
of every method it writes: 0.3-0.6 ms a class, slotted and frozen ones the most. The
serving path defines a few dozen such classes, so as dataclasses they were ≈ 20 ms of every
start-up (docs/performance.md). Instances are slotted (`dict=True` where a plugin may add
its own attributes: `SessionScope`), compare by value, every field included, unless
`eq=False`, and are hashable when `frozen=True`, as the dataclasses were; defaults that
must be fresh use `msgspec.field(default_factory=...)`.

A Record is never encoded or decoded, so msgspec never reads its annotations, and they may
name what is imported under TYPE_CHECKING. Ruff's runtime-annotation rule is configured
for `msgspec.Struct` itself, meaning the wire types, which are decoded; it does not follow
this name, which is the point of giving it one.
"""

from __future__ import annotations

import msgspec

Record = msgspec.Struct
