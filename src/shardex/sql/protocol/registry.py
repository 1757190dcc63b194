"""Per-member query state: running executions, queries this member initiated, batches that
arrived before their ``execute``, and tombstones of finished or cancelled queries.

Why each exists (the protocol's specification, section 4):
* pending: a batch can overtake its query's ``execute`` (they travel on different
  connections). It is kept, bounded, and fed to the execution when the execute arrives.
  Flow control bounds it per stream (a sender sends at most one window before a grant, and
  grants only come from a running execution); ``max_pending_bytes`` bounds the member.
* tombstones: a batch or an ``execute`` that arrives after the query was cancelled or
  finished here is dropped, not kept as pending. A tombstone lives ``tombstone_ttl``
  seconds; a message later than that is held as pending and freed by the next check.
* initiated: the queries this member coordinates; what ``check`` answers from.
"""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass

from shardex.api.query_ids import QueryId
from shardex.api.sql_protocol import QueryBatch
from shardex.sql.protocol.execution import QueryExecution
from shardex.sql.protocol.results import ResultChannel

__all__ = ["InitiatedQuery", "QueryRegistry"]


@dataclass
class InitiatedQuery:
    """The initiator's bookkeeping for one query it coordinates."""

    query_id: QueryId
    participants: tuple[str, ...]
    timeout: float
    result: ResultChannel
    timer: asyncio.TimerHandle | None = None
    # Set by the first cancel: the broadcast goes out once, whoever else asks afterwards.
    cancelled: bool = False

    def end(self) -> None:
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None


class QueryRegistry:
    def __init__(
        self,
        *,
        member_id: str,
        clock: Callable[[], float],
        tombstone_ttl: float,
        max_pending_bytes: int,
        max_pending_queries: int,
    ) -> None:
        self.member_id = member_id
        self._clock = clock
        self.tombstone_ttl = tombstone_ttl
        self.max_pending_bytes = max_pending_bytes
        self.max_pending_queries = max_pending_queries
        self.executions: dict[QueryId, QueryExecution] = {}
        self.initiated: dict[QueryId, InitiatedQuery] = {}
        self.pending: dict[QueryId, list[QueryBatch]] = {}
        self.pending_bytes = 0
        self.tombstones: dict[QueryId, float] = {}  # query -> expiry (loop clock)
        # Protocol events worth asserting on: batches_held, batches_discarded, ...
        self.stats: Counter[str] = Counter()

    def is_tombstoned(self, q: QueryId) -> bool:
        return q in self.tombstones

    def tombstone(self, q: QueryId) -> None:
        """Forget ``q``'s pending batches; drop its late messages for ``tombstone_ttl``."""
        self.drop_pending(q)
        self.tombstones[q] = self._clock() + self.tombstone_ttl

    def hold(self, msg: QueryBatch) -> bool:
        """Keep a batch that came before its execute; False when over a bound."""
        q = msg.query_id
        size = len(msg.data)
        if q not in self.pending and len(self.pending) >= self.max_pending_queries:
            return False
        if self.pending_bytes + size > self.max_pending_bytes:
            return False
        self.pending.setdefault(q, []).append(msg)
        self.pending_bytes += size
        self.stats["batches_held"] += 1
        return True

    def take_pending(self, q: QueryId) -> list[QueryBatch]:
        held = self.pending.pop(q, [])
        self.pending_bytes -= sum(len(m.data) for m in held)
        return held

    def drop_pending(self, q: QueryId) -> int:
        held = self.take_pending(q)
        self.stats["batches_discarded"] += len(held)
        return len(held)

    def collect(self) -> int:
        """Remove expired tombstones; returns how many."""
        now = self._clock()
        expired = [q for q, t in self.tombstones.items() if t <= now]
        for q in expired:
            del self.tombstones[q]
        return len(expired)

    def held_for_others(self) -> dict[str, list[QueryId]]:
        """Queries other members initiated that this member holds state for, by initiator
        (what ``check`` asks about), in a replayable order."""
        out: dict[str, list[QueryId]] = {}
        for q in [*self.executions, *self.pending]:
            if q.initiator != self.member_id and q not in out.get(q.initiator, []):
                out.setdefault(q.initiator, []).append(q)
        return out

    def describe(self) -> dict[str, int]:
        """Counts of live state (what the "all state freed" checker reads)."""
        return {
            "executions": len(self.executions),
            "initiated": len(self.initiated),
            "pending_queries": len(self.pending),
            "pending_bytes": self.pending_bytes,
            "tombstones": len(self.tombstones),
        }
