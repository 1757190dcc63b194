"""Index-partition moves in the replicated state: planning and the pure rules over them.

The coordinator master records every index move in ``RebalanceRecord.index_moves`` before it
tells any indexer, and changes a move's status in the same commit as its effect (``moving``
before the target hears of it, ``routing`` once the target's slice exists, ``done`` together
with the new index topology). So the state alone says which moves may have left a slice on
a node, which partitions the pipeline must send to two indexers, and what a newly promoted
master must clean up. Everything here is a pure function of its arguments.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping
from typing import NamedTuple

import msgspec

from shardex.core.topology import Topology
from shardex.errors import ErrorCode, ShardexError
from shardex.meta.index_rebalance_record import ADD, MOVE, IndexMoveRecord
from shardex.meta.index_state import ACTIVE, INIT, LIVE_STATES, IndexRecord
from shardex.meta.slice_weight import slice_weights

__all__ = [
    "ADD",
    "CANCELLED",
    "DONE",
    "FAILED",
    "MOVE",
    "MOVING",
    "PLANNED",
    "IndexMoveRecord",
    "PlannedIndexMove",
    "interrupt_index_moves",
    "moving_targets",
    "new_index_moves",
    "plan_index_moves",
    "publish_index_move",
    "routed_targets",
]

# The data moves' status strings (``rebalance_state``), repeated here so this module does
# not import it (it imports the record from ``index_rebalance_record``).
PLANNED = "planned"
MOVING = "moving"
DONE = "done"
FAILED = "failed"
CANCELLED = "cancelled"


class PlannedIndexMove(NamedTuple):
    """One index move or copy addition a rebalance plans (``new_index_moves`` records it)."""

    index_id: str
    index_name: str
    keyspace: str
    partition: int  # index partition
    source: str
    target: str
    base_seq: int  # the index topology seq_num it is planned on
    kind: str = MOVE


def plan_index_moves(
    indexes: Mapping[str, IndexRecord],
    topologies: Mapping[str, list[Topology]],
    indexer_nodes: Iterable[str],
    up_nodes: Iterable[str],
) -> list[PlannedIndexMove]:
    """Index-partition moves that balance the up indexers by load (``slice_weight``: each
    copy of a slice weighs its index's load over its partition count), few of them, and
    spreading each index's partitions.

    Only slices of ACTIVE indexes whose placement was not pinned (``WITH {"nodes": ...}``)
    and that have no replica copies move; the others (replica copies too) still count as
    load. Each move takes a slice from the most loaded node to the least loaded one, only
    one lighter than the gap between them (so every move lowers the spread and none is
    wasted), and of those the one closest to half the gap (the fewest moves), then the one
    whose index gains the most spread. With slices of one weight this leaves every node
    within one slice of the others. Refuses when a node that holds primary slices is down:
    its slices cannot be copied (a replicated index's copies there are about to leave the
    topology, after which a rebalance rebuilds them elsewhere). A down node's replica copies
    do not refuse: they are not moved, and are rebuilt once dropped."""
    up = sorted(set(up_nodes))
    known = set(indexer_nodes)
    weights = slice_weights(indexes)
    load: Counter[str] = Counter({n: 0 for n in up})
    per_index: Counter[tuple[str, str]] = Counter()  # (index id, node) -> slices
    movable: dict[str, list[tuple[str, int]]] = {n: [] for n in up}
    base: dict[str, int] = {}
    names: dict[str, tuple[str, str]] = {}
    for index_id in sorted(indexes):
        rec = indexes[index_id]
        history = topologies.get(index_id)
        if rec.state not in LIVE_STATES or rec.state == INIT or not history:
            continue
        topo = history[-1]
        down = sorted({n for n in topo.assignment.values() if n not in up and n in known})
        if down:
            # A replicated index's copies on a down node leave its topology at the next
            # published round (``DropIndexCopies``); the rebalance then rebuilds them.
            hint = (
                "its copies there leave the index topology at the next published stability "
                "round (the pipeline must be running): run the rebalance again then, or "
                "start the node"
                if topo.replicas or rec.num_replica
                else "start the node, then retry"
            )
            raise ShardexError(
                f"cannot rebalance index {rec.name!r} of {rec.keyspace!r}: "
                f"{', '.join(down)} hold(s) its slices and is down",
                code=ErrorCode.NODE_UNAVAILABLE,
                details={"index": rec.name, "down": down, "hint": hint},
            )
        base[index_id] = topo.seq_num
        names[index_id] = (rec.name, rec.keyspace)
        w = weights[index_id]
        for p, node in sorted(topo.assignment.items()):
            if node not in load:
                continue  # a node no longer a member: nothing to copy from
            load[node] += w
            per_index[(index_id, node)] += 1
            # Slices of an index with replicas stay put: a move onto a node holding another
            # copy of the partition would leave one node with two copies.
            if rec.state == ACTIVE and rec.nodes is None and not topo.replicas:
                movable[node].append((index_id, p))
        for nodes in topo.replicas.values():
            for node in nodes:
                if node in load:
                    load[node] += w
    out: list[PlannedIndexMove] = []
    exhausted: set[str] = set()
    while len(up) > 1:
        receiver = min(up, key=lambda n: (load[n], n))
        donors = [n for n in up if n not in exhausted and load[n] > load[receiver]]
        if not donors:
            break
        donor = max(donors, key=lambda n: (load[n], n))
        gap = load[donor] - load[receiver]
        fits = [s for s in movable[donor] if weights[s[0]] < gap]
        if not fits:
            exhausted.add(donor)
            continue
        # Closest to half the gap; then the slice whose index gains the most spread (few
        # slices of it on the receiver, many on the donor); then the highest partition.
        pick = min(
            fits,
            key=lambda s: (
                abs(gap - 2 * weights[s[0]]),
                per_index[(s[0], receiver)] - per_index[(s[0], donor)],
                s[0],
                -s[1],
            ),
        )
        movable[donor].remove(pick)
        index_id, p = pick
        load[donor] -= weights[index_id]
        load[receiver] += weights[index_id]
        per_index[(index_id, donor)] -= 1
        per_index[(index_id, receiver)] += 1
        name, keyspace = names[index_id]
        out.append(PlannedIndexMove(index_id, name, keyspace, p, donor, receiver, base[index_id]))
    return sorted(out, key=lambda m: (m.keyspace, m.index_name, m.partition))


def new_index_moves(
    planned: Iterable[tuple[str, str, str, int, str, str, int] | PlannedIndexMove],
    migration_ids: Iterable[str],
) -> list[IndexMoveRecord]:
    return [
        IndexMoveRecord(migration_id=mid, **PlannedIndexMove(*p)._asdict())
        for p, mid in zip(planned, migration_ids, strict=True)
    ]


def replace_index_move(
    moves: list[IndexMoveRecord], migration_id: str, **changes: object
) -> list[IndexMoveRecord]:
    """``moves`` with one move's fields replaced."""
    return [
        msgspec.structs.replace(m, **changes) if m.migration_id == migration_id else m
        for m in moves
    ]


def routed_targets(moves: Iterable[IndexMoveRecord]) -> dict[str, dict[int, str]]:
    """index id -> index partition -> target, for the moves the pipeline must send to both
    source and target (``moving`` with the target's slice allocated)."""
    out: dict[str, dict[int, str]] = {}
    for m in moves:
        if m.status == MOVING and m.routing:
            out.setdefault(m.index_id, {})[m.partition] = m.target
    return out


def moving_targets(moves: Iterable[IndexMoveRecord]) -> dict[tuple[str, int], str]:
    """(index id, partition) -> target of every move in flight (its target may hold a
    catching-up slice that reconciliation must leave alone)."""
    return {(m.index_id, m.partition): m.target for m in moves if m.status == MOVING}


def interrupt_index_moves(moves: list[IndexMoveRecord], why: str) -> list[IndexMoveRecord]:
    """A master failover: moves not started are cancelled, moves in flight failed. An index
    move has no point of no return outside the coordinator: the topology switch and ``done``
    are one commit, so a move still ``moving`` never switched and is simply aborted (its
    source kept serving throughout)."""
    out = []
    for m in moves:
        if m.status == PLANNED:
            m = msgspec.structs.replace(m, status=CANCELLED)
        elif m.status == MOVING:
            m = msgspec.structs.replace(m, status=FAILED, routing=False, error=why)
        out.append(m)
    return out


def publish_index_move(
    history: list[Topology], move: IndexMoveRecord
) -> tuple[list[Topology], Topology]:
    """The index topology history with the move appended as ``seq_num + 1``: a ``move``
    puts its target where its source was in the partition's chain (the primary's place or
    a replica's), an ``add`` appends its target to the chain's replicas. Refuses
    (STALE_TOPOLOGY) when the source holds no copy of the partition any more or the target
    holds one already."""
    if not history:
        raise ShardexError(
            f"index {move.index_name!r} has no topology",
            code=ErrorCode.INDEX_NOT_FOUND,
            details={"index": move.index_id},
        )
    latest = history[-1]
    p = move.partition
    chain = latest.chain(p) if p in latest.assignment else []
    problem = ""
    if move.source not in chain:
        problem = f"the move's source {move.source} holds no copy of it any more"
    elif move.target in chain:
        problem = f"the move's target {move.target} holds a copy of it already"
    if problem:
        raise ShardexError(
            f"partition {p} of index {move.index_name!r} is on {', '.join(chain) or 'no node'}: "
            f"{problem}",
            code=ErrorCode.STALE_TOPOLOGY,
            details={"partition": p, "chain": chain, "source": move.source, "target": move.target},
        )
    if move.kind == ADD:
        chain = [*chain, move.target]
    else:
        chain = [move.target if n == move.source else n for n in chain]
    replicas = {q: list(ns) for q, ns in latest.replicas.items() if q != p}
    if chain[1:]:
        replicas[p] = chain[1:]
    topo = Topology(
        seq_num=latest.seq_num + 1,
        assignment={**latest.assignment, p: chain[0]},
        replicas=replicas,
    )
    return [*history, topo], topo
