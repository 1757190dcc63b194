"""Orphan slice copies: the index-partition part of an indexer's reconciliation.

An index-partition move leaves a slice on a node that no longer needs it in two cases the
move's own messages cannot clean up:

* its target was down (or restarted) when the move aborted: ``AbortIncomingSlice`` never
  reached it, and its catching-up copy (``loading`` / ``needs_rebuild``) stays;
* its source restarted during the drop grace after the switch: the in-memory timer that
  would have dropped the old slice died with the process.

(A switched-away source slice is usually retired before it is due here: the reconciliation
that confirms it as an orphan first hands it to ``SliceMoves.switched_in_state``, which
recognises it from the index topology history and drops it after the move's own grace.)

The rule (``plan_orphans``): a held slice of a settled live index (READY, BUILDING, ACTIVE or
ERROR) is an orphan when the index's latest topology does not give the partition (its primary
or a replica copy) to this node *and* no in-flight move (``moving``) targets it here.
Whole-index drops (DELETED, removed) stay with ``plan_reconcile``; INIT indexes are the DDL
master's business.

Dropping is guarded three ways (``OrphanTracker``), because a slice can look orphaned for a
moment while it is perfectly legitimate:

1. only against the master's committed state, never a replica that may lag or hold an old
   master's uncommitted change;
2. never while this node's move bookkeeping says the slice is in use: an incoming copy being
   prepared (the master committed ``moving`` after the state we read) or a retired source
   slice whose own grace timer is still running;
3. only once the slice has been an orphan in every round for ``grace`` seconds (longer than
   the source's drop grace), so a switch whose ``IndexPartitionSwitched`` is still in flight
   leaves the source's in-flight scans their time.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Collection, Iterable

from shardex.meta.index_rebalance_state import moving_targets
from shardex.meta.index_state import INIT, LIVE_STATES, latest_index_topology
from shardex.meta.state import StateContext

__all__ = ["ORPHAN_GRACE", "OrphanTracker", "SliceKey", "plan_orphans"]

# Three times the source's drop grace (``index_rebalance.DROP_GRACE``, 10 s): a switched
# source always drops its slice itself first unless it restarted.
ORPHAN_GRACE = 30.0

SliceKey = tuple[str, int]  # (index id, index partition)


def plan_orphans(node: str, state: StateContext, held: dict[str, set[int]]) -> list[SliceKey]:
    """The held slices ``state`` makes orphans on ``node`` (module docstring), sorted.
    ``held``: index id -> partitions with a local slice."""
    moves = state.rebalance.index_moves if state.rebalance is not None else []
    incoming = moving_targets(moves)  # (index id, partition) -> target of a move in flight
    out: list[SliceKey] = []
    for index_id in sorted(held):
        rec = state.indexes.get(index_id)
        if rec is None or rec.state not in LIVE_STATES or rec.state == INIT:
            continue
        topo = latest_index_topology(state.index_topologies, index_id)
        if topo is None:
            continue
        for p in sorted(held[index_id]):
            held_here = node in topo.chain(p) if p in topo.assignment else False
            if not held_here and incoming.get((index_id, p)) != node:
                out.append((index_id, p))
    return out


class OrphanTracker:
    """Remembers since when each slice has been an orphan; says which are due for a drop."""

    def __init__(
        self, grace: float = ORPHAN_GRACE, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.grace = grace
        self.clock = clock
        self.since: dict[SliceKey, float] = {}

    def due(self, orphans: Iterable[SliceKey], in_use: Collection[SliceKey]) -> list[SliceKey]:
        """Record this round's confirmed ``orphans`` (a slice missing from them is not an
        orphan any more: its clock restarts next time) and return those orphaned for at
        least ``grace`` seconds and not ``in_use`` by a move on this node."""
        now = self.clock()
        current = {k for k in orphans if k not in in_use}
        self.since = {k: self.since.get(k, now) for k in current}
        return sorted(k for k, t in self.since.items() if now - t >= self.grace)

    def dropped(self, key: SliceKey) -> None:
        self.since.pop(key, None)
