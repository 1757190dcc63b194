"""The simulation's history: every network event, stamped with virtual time.

Two runs with the same seed must produce the same trace; the running digest makes that cheap
to compare (one string) even when the full event list is capped to save memory.
"""

from __future__ import annotations

import hashlib
from collections import deque
from collections.abc import Iterator
from typing import NamedTuple


class TraceEvent(NamedTuple):
    time: float
    kind: str  # connect, accept, refuse, send, deliver, drop, reset, close, partition, ...
    detail: str

    def format(self) -> str:
        return f"{self.time:14.6f} {self.kind:<10} {self.detail}"


class Trace:
    """Append-only event log with a running SHA-256 over every event ever recorded.

    ``limit`` keeps only the newest events in memory (the digest still covers all of them);
    ``None`` keeps everything.
    """

    def __init__(self, limit: int | None = None) -> None:
        self._events: deque[TraceEvent] = deque(maxlen=limit)
        self._hash = hashlib.sha256()
        self._count = 0

    def record(self, time: float, kind: str, detail: str) -> None:
        event = TraceEvent(time, kind, detail)
        self._events.append(event)
        self._count += 1
        # repr() of a float is exact and platform independent, so the digest is too.
        self._hash.update(f"{time!r}|{kind}|{detail}\n".encode())

    @property
    def digest(self) -> str:
        return self._hash.hexdigest()

    def __len__(self) -> int:
        """Number of events ever recorded (not only the ones kept)."""
        return self._count

    def __iter__(self) -> Iterator[TraceEvent]:
        return iter(self._events)

    @property
    def events(self) -> list[TraceEvent]:
        return list(self._events)

    def count(self, kind: str) -> int:
        """How many kept events are of ``kind`` (handy for asserting faults really happened)."""
        return sum(1 for e in self._events if e.kind == kind)

    def tail(self, n: int = 40) -> str:
        events = list(self._events)[-n:]
        return "\n".join(e.format() for e in events)
