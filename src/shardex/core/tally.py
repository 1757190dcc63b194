"""Counting a repeated event for a log line that must not flood the log.

``Tally.hit(key)`` counts one occurrence of an event (per key, e.g. per node) and says when
to log it: at the first occurrence, then at most once every ``interval`` seconds, returning
how many occurred since the last line (0: stay quiet). A node far behind under load drops
work many times a second; one line every few seconds with the count says the same.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Hashable

__all__ = ["Tally"]


class Tally:
    """Occurrences per key since each key's last report (not thread-safe: one owner)."""

    def __init__(self, interval: float = 10.0, clock: Callable[[], float] = time.monotonic):
        self.interval = interval
        self._clock = clock
        self._counts: dict[Hashable, int] = {}
        self._reported: dict[Hashable, float] = {}

    def hit(self, key: Hashable) -> int:
        """Count one occurrence; the number to report now (this one included), or 0."""
        n = self._counts.get(key, 0) + 1
        now = self._clock()
        last = self._reported.get(key)
        if last is not None and now - last < self.interval:
            self._counts[key] = n
            return 0
        self._counts[key] = 0
        self._reported[key] = now
        return n
