"""The stall watchdog of a keyspace's maintenance stream.

A maintenance query can stop applying changes without failing: a batch that never returns,
a stream whose batches leave an index out (its applied TS on a branch the stream's offsets
are not on), a query Spark keeps "active" while nothing moves. The supervisor restarts only
queries that ended, so such a stall lasts until someone notices the index is behind. The
watchdog notices: it keeps, per keyspace, the applied TS of every index the stream maintains
(``IndexRegistry.applied``, advanced by every published round) and the time it last moved.
When none moved for ``stall_after`` seconds it asks for the keyspace's high seqnos once; if
some index is behind them (changes are pending), that is a stall: the supervisor logs it,
naming the keyspace, the indexes, the partitions and the lag, and restarts the query in a
new checkpoint generation starting at the indexes' lowest applied TS (``driver.py``). If
nothing is pending (an idle keyspace), the clock starts again: an idle keyspace costs one
``HighSeqnos`` per ``stall_after`` seconds, not one per supervisor poll.

A second, cheaper rule needs no ask at all: an index behind the stream's *own* position (the
end of its last committed batch) while no batch or round runs will never be caught up by
the stream, because Spark starts a batch only for new offsets. That is what an index rebuilt
under writes meets when the writes stop before it joins (the stream read past its T0 while it
was not maintained): it stays at T0 until the next write. ``check(position=...)`` reports it
after ``catch_up_after`` seconds without progress.

Why a restart is safe (``docs/decisions/0109-maintenance-stall-watchdog.md``): the new
generation starts at or below every maintained index's applied TS, and slices drop key
versions at or below what they applied, so re-reading is never applying twice; nothing
beyond the applied TS was published, so nothing is skipped.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from shardex.core.timestamp import SeqnoEntry, Timestamp
from shardex.pipeline.registry import IndexRegistry, IndexView

__all__ = [
    "DEFAULT_CATCH_UP_AFTER",
    "DEFAULT_STALL_AFTER",
    "Stall",
    "StallWatchdog",
    "entry_text",
    "source_latest",
    "stream_text",
]

log = logging.getLogger(__name__)

# Seconds without any maintained index advancing, with changes pending, before the stream is
# called stalled. A healthy stream publishes every few hundred ms under writes; a drain of a
# large backlog publishes at least once per batch (capped at 20,000 changes). Rebuilds do
# not count: an index being built is not maintained until it joins.
DEFAULT_STALL_AFTER = 60.0
# Seconds an index may stay behind the idle stream's own position, without progress, before
# the query is restarted (a healthy stream's next batch or round catches it up at once).
DEFAULT_CATCH_UP_AFTER = 5.0


@dataclass(frozen=True)
class Stall:
    """What the watchdog found: per index name, partition -> changes not applied."""

    keyspace: str
    seconds: float  # since the last progress
    behind: dict[str, dict[int, int]]
    # What they are behind: "the high seqnos", or "the stream's position" (idle stream).
    of: str = "the high seqnos"
    # Per index name, lagging partition -> (its applied entry, the target's entry): a lag of
    # one can be one change or the same seqno on a new branch (a failover's promotion).
    points: dict[str, dict[int, tuple[SeqnoEntry | None, SeqnoEntry]]] = field(default_factory=dict)

    @property
    def total(self) -> int:
        return sum(sum(parts.values()) for parts in self.behind.values())

    def describe(self) -> str:
        parts = []
        for name, lag in sorted(self.behind.items()):
            shown = ", ".join(f"{p}: {n}" for p, n in sorted(lag.items())[:16])
            more = f" and {len(lag) - 16} more" if len(lag) > 16 else ""
            text = f"index {name} behind {self.of} in partitions {{{shown}}}{more}"
            points = self.points.get(name)
            if points:
                shown = ", ".join(
                    f"{p}: {_point(a, t)}" for p, (a, t) in sorted(points.items())[:16]
                )
                text += f" [applied -> target: {shown}]"
            parts.append(text)
        return "; ".join(parts)


def stream_text(stall: Stall, label: str, ts: Timestamp | None) -> str:
    """``label`` and ``ts``'s entries in the stall's lagging partitions (what the stream last
    committed, what its source last answered): whether the source never saw the change or the
    stream saw it and did not apply it."""
    parts = sorted({p for lag in stall.behind.values() for p in lag})
    if ts is None:
        return f"{label}: unknown"
    shown = ", ".join(f"{p}: {entry_text(ts.get(p))}" for p in parts[:16])
    return f"{label} {{{shown}}}"


def source_latest(query: Any) -> Timestamp | None:
    """The latest offset a streaming query's (first) source last reported to Spark, from its
    last progress (Spark reports one for idle triggers too); None when unknown. A source
    that never saw a change shows it here."""
    try:
        progress = None if query is None else query.lastProgress
        sources = [] if progress is None else progress.get("sources") or []
        latest = sources[0].get("latestOffset") if sources else None
        if isinstance(latest, str):
            latest = json.loads(latest)
        return Timestamp.from_json(latest) if isinstance(latest, dict) else None
    except Exception as exc:  # a diagnostic only: never fails the supervisor
        log.debug("the source's latest offset: %s", exc)
        return None


def entry_text(e: SeqnoEntry | None) -> str:
    """``seqno@uuid`` in hex (``Timestamp``'s repr), "-" for a partition never seen."""
    return "-" if e is None else f"{e.seqno}@{e.uuid:x}"


def _point(applied: SeqnoEntry | None, target: SeqnoEntry) -> str:
    branch = applied is not None and applied.uuid != target.uuid and applied.seqno > 0
    return f"{entry_text(applied)} -> {entry_text(target)}" + (" (new branch)" if branch else "")


class StallWatchdog:
    """Progress of one keyspace's maintained indexes; ``check`` says when it stalled."""

    def __init__(
        self,
        registry: IndexRegistry,
        high_seqnos: Callable[[], Timestamp],
        stall_after: float = DEFAULT_STALL_AFTER,
        clock: Callable[[], float] = time.monotonic,
        catch_up_after: float = DEFAULT_CATCH_UP_AFTER,
    ) -> None:
        self.registry = registry
        self._high = high_seqnos
        self.stall_after = stall_after
        self.catch_up_after = catch_up_after
        self._idle_behind: float | None = None  # since when an index is behind the position
        self._clock = clock
        self._seen: dict[str, Timestamp] | None = None  # the applied TSs last seen
        self._since = clock()  # when they last changed (or the clock was last reset)
        self.stalls = 0  # stalls reported (tests, status)

    def reset(self) -> None:
        """Start the clock again (a new query: give it ``stall_after`` to show progress)."""
        self._seen = self._progress(self.registry.maintained())
        self._since = self._clock()
        self._idle_behind = None

    def check(self, position: Timestamp | None = None) -> Stall | None:
        """A ``Stall`` when no maintained index advanced for ``stall_after`` seconds while
        the keyspace's high seqnos are ahead of one of them, or for ``catch_up_after``
        seconds while one is behind ``position`` (the idle stream's own position: None
        while a batch or round runs); else None."""
        if self.stall_after <= 0:
            return None  # turned off
        views = self.registry.maintained()
        now = self._clock()
        seen = self._progress(views)
        if seen != self._seen:
            self._seen, self._since, self._idle_behind = seen, now, None
            return None
        behind = {} if position is None else self._behind(views, position, same_branch=True)
        if not behind:
            self._idle_behind = None
        elif self._idle_behind is None:
            self._idle_behind = now
        elif now - self._idle_behind >= self.catch_up_after:
            quiet = now - self._since
            self._idle_behind, self._since = None, now
            self.stalls += 1
            points = self._points(views, behind, position)
            return Stall(self.registry.keyspace, quiet, behind, "the stream's position", points)
        quiet = now - self._since
        if not views or quiet < self.stall_after:
            return None
        # Whatever the answer (idle, stalled, or no answer: a node down), the next look is
        # ``stall_after`` from now: one ask and at most one report per period.
        self._since = now
        high = self._high()
        behind = self._behind(views, high)
        if not behind:
            return None
        self.stalls += 1
        return Stall(
            self.registry.keyspace, quiet, behind, points=self._points(views, behind, high)
        )

    def _points(
        self, views: Sequence[IndexView], behind: dict[str, dict[int, int]], target: Timestamp
    ) -> dict[str, dict[int, tuple[SeqnoEntry | None, SeqnoEntry]]]:
        """Per lagging index, partition -> (applied entry, ``target``'s entry)."""
        out: dict[str, dict[int, tuple[SeqnoEntry | None, SeqnoEntry]]] = {}
        for v in views:
            lag = behind.get(v.definition.name)
            if lag:
                applied = self.registry.applied(v.id)
                out[v.definition.name] = {p: (applied.get(p), target[p]) for p in lag}
        return out

    def _progress(self, views: Sequence[IndexView]) -> dict[str, Timestamp]:
        return {v.id: self.registry.applied(v.id) for v in views}

    def _behind(
        self, views: Sequence[IndexView], high: Timestamp, *, same_branch: bool = False
    ) -> dict[str, dict[int, int]]:
        """Per index, partition -> changes ``high`` is ahead of its applied TS. With
        ``same_branch`` only partitions on the applied TS's branch count (the stream's own
        position on another branch is the rollback handling's business)."""
        out: dict[str, dict[int, int]] = {}
        for v in views:
            applied = self.registry.applied(v.id)
            lag: dict[int, int] = {}
            for p, e in high.items():
                a = applied.get(p)
                if same_branch and a is not None and a.seqno > 0 and e.uuid != a.uuid:
                    continue
                if a is None:
                    if e.seqno > 0:
                        lag[p] = e.seqno
                elif e.seqno > a.seqno or (e.uuid != a.uuid and e.seqno > 0 and a.seqno > 0):
                    # Another branch counts as pending too: the stream must follow it.
                    lag[p] = max(e.seqno - a.seqno, 0) or 1
            if lag:
                out[v.definition.name] = lag
        return out
