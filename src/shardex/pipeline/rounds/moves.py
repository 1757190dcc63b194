"""Stabilise rounds for index moves on an idle keyspace.

An index move's target waits for the first stabilise round whose batch was routed to it too
(E1, ``index/slice_copy.py``). Spark runs a micro-batch, and so a round, only when there are
changes: on an idle keyspace the target would wait in vain. ``MoveRounds`` remembers which
moves (index, partition, target) a successful round has named in ``moving``; the maintenance
job (``MaintenanceJob.idle_round``, called by the supervisor every poll) runs an *empty*
round for the others at the stream's position.

Why the copy stays exactly-once (``docs/decisions/0040-index-moves.md``): E1 must be a TS such
that every key version above it reaches the target. The empty round runs under the job's
batch lock, so no batch is in flight: everything up to the stream's position P (the end of
the last batch that was stabilised, or the checkpoint's last committed batch) is applied on
the source, and every key version above P is in a batch that starts at P *after* this round.
That batch routes with a registry view at least as new as the one this round saw (the
registry never goes back to an older coordinator state), in which the move is still
``routing`` (dual-routed), or ``done`` (the target owns the partition), or ``failed`` (the
copy is dropped anyway). So E1 = P is exact, the source's copy TS T1 >= P covers it, and
the enqueue floor T1 drops what the target receives twice. A round triggered by the
timekeeper alone would not be safe: it only knows the last *published* TS, while a batch
that started before ``routing`` may be delivering versions above it to the source only.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping

from shardex.core.timestamp import Timestamp
from shardex.pipeline.registry import IndexView

__all__ = ["MoveKey", "MoveRounds"]

MoveKey = tuple[str, int, str]  # (index id, index partition, target node)


def _keys(moving: Mapping[str, Mapping[int, str]]) -> set[MoveKey]:
    return {(i, p, t) for i, parts in moving.items() for p, t in parts.items()}


class MoveRounds:
    """Which routed index moves have had a stabilise round (not thread-safe: the job's batch
    lock guards it)."""

    def __init__(self) -> None:
        self._confirmed: set[MoveKey] = set()

    def confirmed(self, moving: Mapping[str, Mapping[int, str]]) -> None:
        """A round naming ``moving`` succeeded: every target in it noted its E1."""
        self._confirmed |= _keys(moving)

    def pending(
        self,
        views: Iterable[IndexView],
        position: Timestamp,
        applied: Callable[[str], Timestamp],
    ) -> dict[str, dict[int, str]]:
        """index id -> its ``moving`` map, for the maintained indexes with a routed move no
        round has named yet. An index whose applied TS is ahead of ``position`` waits for a
        batch (a round at ``position`` would move it backwards). Moves no longer routed
        are forgotten, so a later move of the same partition to the same node gets its own
        round."""
        views = list(views)
        live: set[MoveKey] = set()
        out: dict[str, dict[int, str]] = {}
        for v in views:
            keys = _keys({v.id: v.moving})
            live |= keys
            if keys - self._confirmed and position.covers(applied(v.id)):
                out[v.id] = dict(v.moving)
        self._confirmed &= live
        return out
