"""Index copies a rebalance builds: lost replicas restored, ejected indexers drained.

An index with ``num_replica`` n keeps ``1 + n`` copies of every partition
(``docs/decisions/0085-index-replicas.md``). A copy that missed a published round leaves the
topology (``DropIndexCopies``), so a dead indexer leaves chains short; a rebalance plans one
``add`` per missing copy (built like a move's target from a surviving copy, which keeps its
own). An eject plans one ``move`` per copy (primary or replica) on an ejected node. Both are
index moves (``index_rebalance_state``) and run on the same machinery
(``manager/index_rebalance.py``); this module only plans them, as a pure function of the
state.

Where a new copy goes: an up indexer that holds no copy of the partition and is not being
ejected; among those the nodes the index was pinned to (``WITH {"nodes": ...}``) first, then
a server group the chain does not use yet, then the fewest slices of this index, then the
least load over all live indexes (``slice_weight``: each copy weighs its index's load over its
partition count), then the name (the rules ``place_replicas`` follows at CREATE INDEX,
with groups as the data chains use them, ``replica_placement``). The loads count every copy
already planned, so the copies spread.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from shardex.core.topology import Topology
from shardex.meta.index_rebalance_state import ADD, MOVE, PlannedIndexMove
from shardex.meta.index_state import ACTIVE, INIT, LIVE_STATES, IndexRecord
from shardex.meta.slice_weight import copies_load, slice_weights

__all__ = ["CopyPlan", "Unplaced", "plan_index_copies", "slice_load"]


@dataclass(frozen=True)
class Unplaced:
    """A copy the plan could not place: ``slice`` is ``keyspace.index/partition``."""

    node: str  # the ejected node holding it ("" for a missing copy)
    slice: str
    why: str

    def __str__(self) -> str:
        where = f" on {self.node}" if self.node else ""
        return f"{self.slice}{where}: {self.why}"


@dataclass
class CopyPlan:
    moves: list[PlannedIndexMove] = field(default_factory=list)
    # copies on ejected nodes with nowhere to go (the eject is refused), and missing copies
    # no rebalance can add now (the index keeps serving from the copies it has)
    unplaced: list[Unplaced] = field(default_factory=list)
    short: list[Unplaced] = field(default_factory=list)


def _live(rec: IndexRecord) -> bool:
    return rec.state in LIVE_STATES and rec.state != INIT


def slice_load(
    indexes: Mapping[str, IndexRecord], topologies: Mapping[str, list[Topology]]
) -> Counter[str]:
    """Load per node (``slice_weight`` units) over every live index, replica copies
    included."""
    return copies_load(indexes, topologies, _live)


class _Placer:
    """The candidate nodes and their loads while one plan is made (module docstring)."""

    def __init__(self, targets: list[str], groups: Mapping[str, str], load: Counter[str]):
        self.targets = targets
        self.labels = dict(groups)
        self.total = load
        self.mine: Counter[str] = Counter()  # slices of the index being planned, per node
        self.pinned: set[str] = set()
        self.weight = 1  # one copy of a slice of the index being planned

    def group(self, node: str) -> str:
        return self.labels.get(node) or f"\0{node}"  # unlabelled: a group of its own

    def begin_index(self, rec: IndexRecord, topo: Topology, weight: int) -> None:
        self.mine = Counter(n for p in topo.assignment for n in topo.chain(p))
        self.pinned = set(rec.nodes or ())
        self.weight = weight

    def pick(self, chain: list[str], leaving: str = "") -> str | None:
        """The best node for a new copy of the partition whose copies are ``chain`` (of which
        ``leaving`` is about to go), None if every candidate holds one."""
        used = {self.group(n) for n in chain if n != leaving}
        free = [n for n in self.targets if n not in chain]
        if not free:
            return None
        return min(
            free,
            key=lambda n: (
                bool(self.pinned) and n not in self.pinned,
                self.group(n) in used,
                self.mine[n],
                self.total[n],
                n,
            ),
        )

    def placed(self, source: str, target: str, kind: str) -> None:
        self.mine[target] += 1
        self.total[target] += self.weight
        if kind == MOVE:
            self.mine[source] -= 1
            self.total[source] -= self.weight


def plan_index_copies(
    indexes: Mapping[str, IndexRecord],
    topologies: Mapping[str, list[Topology]],
    up_nodes: Iterable[str],
    groups: Mapping[str, str] | None = None,
    eject: Iterable[str] = (),
    load: Counter[str] | None = None,
    *,
    restore: bool = True,
) -> CopyPlan:
    """The moves off the ``eject`` nodes and (``restore``) the additions that bring every
    chain of an ACTIVE index back to ``1 + num_replica`` copies, over the up indexers
    ``up_nodes`` (module docstring). ``groups``: node -> server group ("" or missing: a
    group of its own). ``load``: load per node (``slice_weight`` units) to start from
    (default ``slice_load``; a caller that planned other moves first passes the load after
    them). A missing copy whose partition has no up copy to build it from, or no free node,
    is ``short``; a copy on an ejected node with no other node to take it (or that cannot be
    copied now) is ``unplaced``."""
    ejected = set(eject)
    up = set(up_nodes)
    start = slice_load(indexes, topologies) if load is None else load
    placer = _Placer(sorted(up - ejected), groups or {}, Counter(start))
    weights = slice_weights(indexes)
    plan = CopyPlan()
    for index_id in sorted(indexes):
        rec = indexes[index_id]
        history = topologies.get(index_id)
        if not history or not _live(rec):
            continue
        topo = history[-1]
        placer.begin_index(rec, topo, weights[index_id])

        def planned(p: int, source: str, target: str, kind: str, rec: IndexRecord = rec,
                    topo: Topology = topo) -> None:  # fmt: skip
            plan.moves.append(
                PlannedIndexMove(
                    rec.id, rec.name, rec.keyspace, p, source, target, topo.seq_num, kind
                )
            )
            placer.placed(source, target, kind)

        for p in sorted(topo.assignment):
            name = f"{rec.keyspace}.{rec.name}/{p}"
            chain = topo.chain(p)
            # Copies on ejected nodes: each moves to a node that holds none of p.
            for node in [n for n in chain if n in ejected]:
                if rec.state != ACTIVE:
                    why = f"the index is {rec.state} (only an ACTIVE index's slices move)"
                elif node not in up:
                    why = "the node is down: its slice cannot be copied off it"
                elif (target := placer.pick(chain, leaving=node)) is None:
                    why = "every other up indexer holds a copy of the partition already"
                else:
                    planned(p, node, target, MOVE)
                    chain = [target if n == node else n for n in chain]
                    continue
                plan.unplaced.append(Unplaced(node, name, why))
            if rec.state != ACTIVE or not restore:
                continue
            # Missing copies: added from a surviving copy (the first up one not leaving).
            sources = [n for n in chain if n in up and n not in ejected]
            for _ in range(1 + rec.num_replica - len(chain)):
                target = placer.pick(chain) if sources else None
                if target is None:
                    why = (
                        "no up copy to build one from"
                        if not sources
                        else ("every up indexer holds a copy of it already")
                    )
                    plan.short.append(Unplaced("", name, why))
                    break
                planned(p, sources[0], target, ADD)
                chain = [*chain, target]
    plan.moves.sort(key=lambda m: (m.keyspace, m.index_name, m.partition, m.kind != MOVE))
    return plan
