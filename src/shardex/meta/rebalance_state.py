"""Rebalance records in the replicated state, and the pure rules over them.

The coordinator master records every rebalance (and every admin ``MovePartition``) in
``StateContext.rebalance`` *before* it touches a data node, and changes a move's status in the
same commit as its effect (``moving`` before the target hears of it; ``done`` together with
the new topology). So the state always says which migrations may have left something on a
node, and a newly promoted master (``recover``) or a data node reconciling after a restart
can decide from the state alone what to finish and what to clean up.

Move statuses::

    planned --> moving --> done            (topology published in the same commit)
       |          |------> failed          (source answered "active": fenced, target dropped)
       |          '------> unresolved      (source unreachable: outcome unknown, retried)
       '--> cancelled                      (never started: the rebalance was interrupted)
    unresolved --> done | failed           (once the source answers)

Everything here is a pure function of its arguments (unit-tested without processes).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

import msgspec

from shardex.core.topology import Topology
from shardex.errors import ErrorCode, ShardexError
from shardex.meta.index_rebalance_record import IndexMoveRecord
from shardex.meta.rebalance_plan import plan_actives

PLANNED = "planned"
MOVING = "moving"
DONE = "done"
FAILED = "failed"
UNRESOLVED = "unresolved"
CANCELLED = "cancelled"
IN_FLIGHT = frozenset({MOVING, UNRESOLVED})  # may have left a copy or a freeze on a node
TERMINAL = frozenset({DONE, FAILED, CANCELLED})

RUNNING = "running"  # rebalance states: running, done, failed (some move did not finish)


class MoveRecord(msgspec.Struct, frozen=True, kw_only=True):
    """One partition migration. The statistics are filled in when it ends."""

    migration_id: str
    keyspace: str
    keyspace_uuid: str
    partition: int
    source: str
    target: str
    base_seq: int  # the topology seq_num the move was planned on
    status: str = PLANNED
    topology_seq: int = 0  # the topology that published it (done)
    error: str = ""
    bytes: int = 0
    items: int = 0
    docs: int = 0
    copy_seconds: float = 0.0
    pause_ms: float = 0.0  # writes to the partition refused: freeze to publish
    seconds: float = 0.0


class RebalanceRecord(msgspec.Struct, frozen=True, kw_only=True):
    id: str
    kind: str  # "rebalance" or "move"
    started_at: float  # wall clock
    state: str = RUNNING
    finished_at: float = 0.0
    message: str = ""
    max_parallel: int = 2
    rate_limit: int = 0
    moves: list[MoveRecord] = msgspec.field(default_factory=list)
    # index partitions moving between indexers (``index_rebalance_state``)
    index_moves: list[IndexMoveRecord] = msgspec.field(default_factory=list)
    # nodes this rebalance removes from the cluster (``shardex rebalance --eject``): their
    # copies move to the other data nodes first (``manager/eject.py``)
    eject: list[str] = msgspec.field(default_factory=list)

    def move(self, migration_id: str) -> MoveRecord:
        for m in self.moves:
            if m.migration_id == migration_id:
                return m
        raise KeyError(migration_id)

    def count(self, status: str) -> int:
        return sum(1 for m in self.moves if m.status == status)


def plan_moves(
    keyspaces: Mapping[str, tuple[str, Topology]],
    data_nodes: Iterable[str],
    up_nodes: Iterable[str],
    groups: Mapping[str, str] | None = None,
) -> list[tuple[str, str, int, str, str, int]]:
    """(keyspace, keyspace uuid, partition, source, target, base seq) for every move that
    balances each keyspace's actives over the up data nodes (``plan_actives``: the fewest
    moves, each onto a node outside its partition's chain where the counts allow; ``groups``:
    node -> server group).

    ``keyspaces`` maps name -> (uuid, latest topology). Refuses when a node that holds
    partitions is down: its partitions cannot be copied, and balancing the others around it
    would only have to be redone."""
    up = sorted(set(up_nodes))
    known = set(data_nodes)
    if not up:
        raise ShardexError("no data node is up", code=ErrorCode.NODE_UNAVAILABLE)
    out: list[tuple[str, str, int, str, str, int]] = []
    for name in sorted(keyspaces):
        uuid, topo = keyspaces[name]
        down = sorted({n for n in topo.assignment.values() if n not in up and n in known})
        if down:
            raise ShardexError(
                f"cannot rebalance {name!r}: {', '.join(down)} hold(s) partitions and is down",
                code=ErrorCode.NODE_UNAVAILABLE,
                details={"keyspace": name, "down": down, "hint": "start the node, then retry"},
            )
        for p, target in sorted(plan_actives(topo, up, groups or {}).items()):
            out.append((name, uuid, p, topo.assignment[p], target, topo.seq_num))
    return out


def plan_eject_moves(
    keyspaces: Mapping[str, tuple[str, Topology]],
    eject: Iterable[str],
    remaining: Iterable[str],
) -> list[tuple[str, str, int, str, str, int]]:
    """The moves (as ``plan_moves``) that take every active copy off the ``eject`` nodes onto
    the ``remaining`` data nodes, one migration per partition, nothing else moved.

    ``keyspaces`` maps name -> (uuid, latest topology). Each target is the remaining node
    with the fewest actives of the keyspace so far (so the moved partitions spread and the
    keyspace stays balanced), preferring, among equally loaded ones, a node outside the
    partition's chain (a replica's node must rebuild its copy as the active: the chain is
    widened with a replacement first, ``chains_after_moves``), then name order."""
    gone = set(eject)
    targets = sorted(set(remaining) - gone)
    if not targets:
        raise ShardexError(
            "no data node would remain to take the ejected nodes' partitions",
            code=ErrorCode.BAD_REQUEST,
            details={"eject": sorted(gone), "hint": "add a data node first"},
        )
    out: list[tuple[str, str, int, str, str, int]] = []
    for name in sorted(keyspaces):
        uuid, topo = keyspaces[name]
        load = {n: 0 for n in targets}
        for node in topo.assignment.values():
            if node in load:
                load[node] += 1
        for p in sorted(topo.assignment):
            source = topo.assignment[p]
            if source not in gone:
                continue
            chain = set(topo.chain(p))
            target = min(targets, key=lambda n: (load[n], n in chain, n))
            load[target] += 1
            out.append((name, uuid, p, source, target, topo.seq_num))
    return out


def new_record(
    rebalance_id: str,
    kind: str,
    planned: list[tuple[str, str, int, str, str, int]],
    migration_ids: Iterable[str],
    now: float,
    *,
    max_parallel: int = 2,
    rate_limit: int = 0,
) -> RebalanceRecord:
    moves = [
        MoveRecord(
            migration_id=mid,
            keyspace=ks,
            keyspace_uuid=uuid,
            partition=p,
            source=src,
            target=dst,
            base_seq=seq,
        )
        for (ks, uuid, p, src, dst, seq), mid in zip(planned, migration_ids, strict=True)
    ]
    record = RebalanceRecord(
        id=rebalance_id,
        kind=kind,
        started_at=now,
        max_parallel=max_parallel,
        rate_limit=rate_limit,
        moves=moves,
    )
    return record if moves else finish(record, now)  # index moves: ``index_rebalance``


def with_move(record: RebalanceRecord, migration_id: str, **changes: object) -> RebalanceRecord:
    """``record`` with one move's fields replaced."""
    moves = [
        msgspec.structs.replace(m, **changes) if m.migration_id == migration_id else m
        for m in record.moves
    ]
    return msgspec.structs.replace(record, moves=moves)


def finish(record: RebalanceRecord, now: float, message: str = "") -> RebalanceRecord:
    """The rebalance is over: ``done`` if every move (data and index) is, else ``failed``."""
    every = [*record.moves, *record.index_moves]
    ok = all(m.status == DONE for m in every)
    if not message and not ok:
        bad = [m for m in every if m.status != DONE]
        message = f"{len(bad)} of {len(every)} move(s) did not complete"
    return msgspec.structs.replace(
        record, state=DONE if ok else FAILED, finished_at=now, message=message
    )


def in_flight(record: RebalanceRecord | None) -> dict[tuple[str, int], MoveRecord]:
    """(keyspace, partition) -> the move that may have left state on a node."""
    if record is None:
        return {}
    return {(m.keyspace, m.partition): m for m in record.moves if m.status in IN_FLIGHT}


def publish(history: list[Topology], move: MoveRecord) -> tuple[list[Topology], Topology]:
    """The topology history with the move appended as topology ``seq_num + 1``.

    Idempotent: if the latest topology already names the target (a roll-forward repeated
    after a failover) the history is returned unchanged. Refuses if the partition is not at
    the move's source any more (someone else moved it)."""
    if not history:
        raise ShardexError(
            f"keyspace {move.keyspace!r} has no topology", code=ErrorCode.KEYSPACE_NOT_FOUND
        )
    latest = history[-1]
    owner = latest.assignment.get(move.partition)
    if owner == move.target and latest.seq_num > move.base_seq:
        return history, latest
    if owner != move.source:
        raise ShardexError(
            f"partition {move.partition} of {move.keyspace!r} is on {owner}, not on the "
            f"move's source {move.source}",
            code=ErrorCode.STALE_TOPOLOGY,
            details={"partition": move.partition, "owner": owner, "source": move.source},
        )
    topo = latest.with_moves({move.partition: move.target})
    return [*history, topo], topo


def resolution(source_state: str | None, published: bool, release_sent: bool = True) -> str:
    """What to do with a move whose hand-over did not complete, given what its source
    answered to ``ResolveOutgoing`` (None: unreachable), whether the latest topology already
    names the target, and whether a release may have been sent (only the driver of the move
    sends it; a new master cannot know, so it assumes it was):

    * ``roll_forward``: the source released the partition (the point of no return), so the
      target holds every write: activate it, publish, drop the source's copy;
    * ``done``: already published (a previous master got that far);
    * ``abort``: the source still serves it and has fenced the migration: drop the target's
      copy, the move failed;
    * ``retry``: nobody can know yet (the source is unreachable after a release may have
      been sent): keep the target's copy. Without a release the source cannot have handed
      over: ``abort`` (its freeze, if any, ends with its lease).
    """
    if published:
        return "done"
    if source_state is None:
        return "retry" if release_sent else "abort"
    if source_state == "released":
        return "roll_forward"
    if source_state == "active":
        return "abort"
    return "abort"  # absent/pending at the source and not published: nothing to finish
