"""How often an idle stream asks for the high seqnos: back off while nothing changes.

Spark asks a streaming source for its latest offset as fast as its trigger allows (about 50
times a second here with ``processingTime="0 seconds"``), and each ask the source does not
answer from its cache costs a ``HighSeqnos`` on every owner. Under writes that is the price of
freshness; on an idle keyspace it is pure cost on every node. ``IdlePoll`` keeps the base
interval while the answers move (and for ``idle_after`` seconds after the last change, so a
burst's next write is seen as quickly as under load), then doubles the interval with each
unchanged answer up to ``max_interval``, and drops back to the base at the first answer that
differs. What an idle keyspace pays for that: its first write waits at most ``max_interval``
before the stream notices it (``docs/decisions/0107-idle-high-seqnos-backoff.md``).
"""

from __future__ import annotations

from shardex.core.timestamp import Timestamp

__all__ = ["DEFAULT_IDLE_AFTER", "IdlePoll"]

DEFAULT_IDLE_AFTER = 0.5  # seconds without a change before the interval starts to grow


class IdlePoll:
    """The interval to reuse a high-seqnos answer for, from how recently the answers moved."""

    def __init__(
        self, base: float, max_interval: float, idle_after: float = DEFAULT_IDLE_AFTER
    ) -> None:
        self.base = base
        # A maximum at or below the base turns the back-off off (the base alone).
        self.max_interval = max(base, max_interval)
        self.idle_after = idle_after
        self._interval = base
        self._last: Timestamp | None = None
        self._changed_at: float | None = None

    @property
    def interval(self) -> float:
        return self._interval

    def observe(self, ts: Timestamp, now: float) -> None:
        """Take a fresh answer (``now``: ``time.monotonic()`` when it was asked for)."""
        if self._last is None or ts != self._last or self._changed_at is None:
            self._last = ts
            self._changed_at = now
            self._interval = self.base
        elif now - self._changed_at >= self.idle_after:
            self._interval = min(self.max_interval, max(self._interval, 0.001) * 2)
