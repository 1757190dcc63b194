"""Index copies that missed a stability round leave the index topology (``DropIndexCopies``).

With replicas (``num_replica``) the timekeeper publishes an index at a round's TS once, per
index partition, at least one copy acknowledged it (``timekeeper.check_acks``). A copy that
did not (its indexer was down, timed out, or its slice was not in a stable state) lacks the
round's rows: its queue lost them, so a later round would stabilise it to a TS whose entries
it does not hold. Before the TS is published the timekeeper therefore asks the master to take
such copies out of the topology: a replica leaves its partition's chain; a primary is
replaced by the partition's first remaining replica (the same promotion data failover does).
The new topology (``seq_num + 1``) goes to the history like any move, so the pipeline routes
and stabilises by it, scans never pick the dropped copy, and the indexer drops the slice as
an orphan (``index/orphans.py``) once it is back. Restoring the copy count is the rebalance's
job (``index_rebalance.py``, ``docs/decisions/0085-index-replicas.md``).

The same holds for the target of an index move or copy addition still catching up (routed,
named in rounds, not in the topology): if it did not answer a round about to be published,
its queue lacks the round's rows, and once switched in it would serve a snapshot without
them. The op fails such moves (``targets``) in the same commit, before the TS is published:
the move's driver then aborts it (the target drops its copy) instead of switching.

The op never drops a partition's last copy (refused with BAD_REQUEST naming it: the
timekeeper asks only for indexes it publishes, each partition with an acknowledged copy) and
is idempotent: copies already gone are ignored, and nothing is committed when nothing
changes.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from typing import Any

import msgspec

from shardex.api.errors import BadRequest
from shardex.api.index_ddl import DropIndexCopies, IndexCopiesDropped
from shardex.core.topology import Topology
from shardex.errors import ErrorCode, ShardexError
from shardex.meta.index_rebalance_state import FAILED, MOVING, replace_index_move
from shardex.meta.index_state import DELETED, latest_index_topology
from shardex.meta.rebalance_state import RebalanceRecord

__all__ = ["drop_index_copies", "fail_late_targets", "without_copies"]

log = logging.getLogger(__name__)


def without_copies(
    topo: Topology, copies: Iterable[tuple[int, str]]
) -> tuple[Topology, list[tuple[int, str]]]:
    """(the next topology without ``copies``, the copies actually dropped); ``topo`` itself
    when none of them is in it."""
    assignment = dict(topo.assignment)
    replicas = {p: list(ns) for p, ns in topo.replicas.items()}
    dropped: list[tuple[int, str]] = []
    for p, node in sorted(set(copies)):
        if p not in assignment:
            continue
        chain = [assignment[p], *replicas.get(p, [])]
        if node not in chain:
            continue
        rest = [n for n in chain if n != node]
        if not rest:
            raise BadRequest(
                f"cannot drop {node}'s copy of index partition {p}: it is the last one",
                details={"partition": p, "node": node, "hint": "only copies that have another"},
            )
        assignment[p], replicas[p] = rest[0], rest[1:]
        dropped.append((p, node))
    if not dropped:
        return topo, []
    replicas = {p: ns for p, ns in replicas.items() if ns}
    nxt = Topology(seq_num=topo.seq_num + 1, assignment=assignment, replicas=replicas)
    return nxt, dropped


def fail_late_targets(
    record: RebalanceRecord | None, index_id: str, targets: Iterable[tuple[int, str]], why: str
) -> tuple[RebalanceRecord | None, list[str]]:
    """(``record`` with the moves in flight of ``index_id`` onto any of ``targets``
    (partition, node) failed, their migration ids); ``record`` itself when none is."""
    if record is None:
        return None, []
    late = set(targets)
    ids = [
        m.migration_id
        for m in record.index_moves
        if m.index_id == index_id and m.status == MOVING and (m.partition, m.target) in late
    ]
    moves = record.index_moves
    for mid in ids:
        moves = replace_index_move(moves, mid, status=FAILED, routing=False, error=why)
    return (msgspec.structs.replace(record, index_moves=moves) if ids else record), ids


async def drop_index_copies(msg: DropIndexCopies, ctx: Any) -> IndexCopiesDropped:
    """The coordinator op (module docstring)."""
    state = ctx.state
    rec = state.indexes.get(msg.index_id)
    topo = latest_index_topology(state.index_topologies, msg.index_id)
    if rec is None or rec.state == DELETED or topo is None:
        raise ShardexError(
            f"index {msg.index_id} not found",
            code=ErrorCode.INDEX_NOT_FOUND,
            details={"index_id": msg.index_id},
        )
    nxt, dropped = without_copies(topo, [(int(p), str(n)) for p, n in msg.copies])
    why = f"its target missed the stability round at {msg.ts}: it lacks that round's rows"
    targets = [(int(p), str(n)) for p, n in msg.targets]
    rebalance, failed = fail_late_targets(state.rebalance, msg.index_id, targets, why)
    reply = IndexCopiesDropped(
        index_id=msg.index_id, topology=nxt, dropped=dropped, failed_moves=failed
    )
    if not dropped and not failed:
        return reply
    new_state = msgspec.structs.replace(state, rebalance=rebalance)
    if dropped:
        history = [*state.index_topologies[msg.index_id], nxt]
        new_state = msgspec.structs.replace(
            new_state, index_topologies={**state.index_topologies, msg.index_id: history}
        )
    log.warning(
        "index %s (%s): copies %s and move targets %s missed the round at %s; dropped from "
        "the topology (%d), moves %s failed",
        rec.name,
        msg.index_id,
        dropped,
        targets,
        msg.ts,
        nxt.seq_num,
        failed,
    )
    await ctx.commit(new_state, reply=reply)
    return reply
