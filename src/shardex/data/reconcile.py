"""Local placement rules of a data node: open, drop and reconcile keyspaces against the
manager state. Synchronous functions over a ``DataEngine`` (the service runs them in its I/O
executor under its placement lock); the reasoning is in
``docs/decisions/0013-placement-reconciled.md``.

Guards keep a stale state from doing harm. Each local keyspace records the manager's
``uuid`` and ``created_cas``: a different uuid under the same name is another incarnation
(dropped and re-created while this node was away), which replaces ours only if it is newer;
and a keyspace missing from a state is dropped only if that state's ``cas`` is above the
keyspace's ``created_cas`` (a keyspace created at cas N is in every later state unless it was
dropped, while a lagging replica or an empty state proves nothing).

Migrations add three rules (``docs/decisions/0030-partition-migration-protocol.md``): a partition is
opened *empty* only if every topology in its history placed it here (anything that ever lived
elsewhere arrives by migration); a state whose latest topology is below the keyspace's
*floor* (raised when a moved-away copy is dropped) opens nothing; and incoming copies and
released copies are settled against the state's rebalance record: kept while their migration
is in flight, activated or dropped once it is over.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

from shardex.api.errors import KeyspaceNotFound
from shardex.api.records import STATE_ACTIVE, STATE_PENDING, STATE_RELEASED, STATE_REPLICA
from shardex.core.topology import Topology
from shardex.data.engine import DataEngine
from shardex.errors import ErrorCode, ShardexError
from shardex.meta.rebalance_state import TERMINAL, MoveRecord, in_flight
from shardex.meta.state import StateContext

log = logging.getLogger(__name__)


def open_partitions(
    engine: DataEngine,
    keyspace: str,
    uuid: str,
    created_cas: int,
    num_partitions: int,
    partitions: list[int],
    replicas: Sequence[int] = (),
    max_ttl: int | None = None,
) -> list[int]:
    """Make ``keyspace`` (this incarnation, with ``max_ttl``: None when the caller does not
    know it, which keeps the recorded one) exist here with at least ``partitions`` (active,
    empty) and ``replicas`` (empty replica copies); returns the active partitions created
    now. Idempotent."""
    try:
        old = engine.keyspace(keyspace)
    except KeyspaceNotFound:
        old = None
    if old is not None and (old.uuid != uuid or old.num_partitions != num_partitions):
        if old.uuid and old.created_cas > created_cas:
            raise ShardexError(
                f"keyspace {keyspace!r} here is a newer incarnation (created at cas "
                f"{old.created_cas}) than the one to open (cas {created_cas})",
                code=ErrorCode.STALE_TOPOLOGY,
                details={"keyspace": keyspace, "local_cas": old.created_cas},
            )
        log.warning(
            "dropping local keyspace %s (uuid %r): the cluster's keyspace of that name is %r",
            keyspace,
            old.uuid,
            uuid,
        )
        engine.drop_keyspace(keyspace)
    engine.create_keyspace(
        keyspace,
        num_partitions,
        exist_ok=True,
        uuid=uuid,
        created_cas=created_cas,
        max_ttl=max_ttl,
    )
    held = set(engine.partitions(keyspace))
    created = [p for p in partitions if p not in held]
    for p in created:
        engine.create_partition(keyspace, p, exist_ok=True)
    if created:
        log.info("opened %d partition(s) of %s: %s", len(created), keyspace, _ranges(created))
    copies = [p for p in replicas if p not in held]
    for p in copies:
        engine.replicas.create_empty(keyspace, p)
    if copies:
        log.info("opened %d replica copies of %s: %s", len(copies), keyspace, _ranges(copies))
    return created


def drop_incarnation(engine: DataEngine, keyspace: str, uuid: str) -> bool:
    """Drop ``keyspace`` if it is incarnation ``uuid`` (any, for an empty uuid)."""
    try:
        local = engine.keyspace(keyspace)
    except KeyspaceNotFound:
        return False
    if uuid and local.uuid and local.uuid != uuid:
        return False  # another incarnation of the name: not the one being dropped
    engine.drop_keyspace(keyspace)
    log.info("dropped keyspace %s (uuid %s)", keyspace, local.uuid)
    return True


def reconcile(engine: DataEngine, node: str, state: StateContext) -> None:
    """Bring ``node``'s partitions in line with ``state`` (module docstring, and
    ``docs/decisions/0030-partition-migration-protocol.md``): ensure each keyspace's
    incarnation, open
    the partitions the latest topology gives this node *that never lived anywhere else*,
    settle incoming copies whose migration is over, drop released copies whose hand-over is
    published, drop keyspaces the state proves dropped."""
    moving = in_flight(state.rebalance)
    for name, meta in state.keyspaces.items():
        history = state.data_topologies.get(name) or []
        topo = history[-1] if history else None
        try:
            local = engine.keyspace(name)
        except KeyspaceNotFound:
            local = None
        same = local is not None and local.uuid == meta.uuid
        if local is not None and not same and local.created_cas > meta.created_cas:
            continue  # the state we read predates our keyspace: a stale replica
        if topo is None or (same and topo.seq_num < engine.topology_floor(name)):
            continue  # a state older than a topology we already acted on
        if not same or local.max_ttl != meta.max_ttl:  # type: ignore[union-attr]
            # make this incarnation exist here (replacing an older one), with its max_ttl
            open_partitions(
                engine, name, meta.uuid, meta.created_cas, meta.num_partitions, [], (), meta.max_ttl
            )
        held = set(engine.partitions(name))
        incoming = {p for ks, p in engine.incoming() if ks == name}
        fresh = [
            p
            for p in topo.partitions_of(node)
            if p not in held and p not in incoming and never_moved(history, p, node)
        ]
        if fresh and node not in state.failed_over:
            open_partitions(
                engine,
                name,
                meta.uuid,
                meta.created_cas,
                meta.num_partitions,
                fresh,
                (),
                meta.max_ttl,
            )
        _settle_incoming(engine, node, state, name, topo, moving)
        _drop_released(engine, node, name, topo, moving)
        if node not in state.failed_over:
            _settle_replicas(engine, node, name, topo, moving, state.recovering.get(node))
    if state.cas == 0:
        return  # an empty state (a manager that knows nothing yet) proves nothing
    for local in engine.keyspaces():
        if local.name not in state.keyspaces and state.cas > local.created_cas:
            log.info("keyspace %s is gone from the cluster state: dropping it", local.name)
            engine.drop_keyspace(local.name)


def _settle_replicas(
    engine: DataEngine,
    node: str,
    keyspace: str,
    topo: Topology,
    moving: dict[tuple[str, int], MoveRecord],
    state_kind: str | None,
) -> None:
    """Replica copies against the latest topology: an empty copy for every partition whose
    chain names this node and that it lacks (the active feeds it from seqno 0); a replica
    copy of a partition now active here is promoted (the failover's new branch, when the
    master's own message did not arrive); a replica copy whose chain no longer names this
    node is dropped."""
    held = {info.partition: info.state for info in engine.local_partitions(keyspace)}
    # a delta recovery keeps its copies until a rebalance puts this node back in the chains
    for p in topo.replicas_of(node):
        if p not in held and (keyspace, p) not in moving:
            engine.replicas.create_empty(keyspace, p)
            log.info("opened an empty replica copy of %s/%d", keyspace, p)
    for p, state in held.items():
        if state != STATE_REPLICA:
            continue
        if topo.assignment.get(p) == node:
            entry = engine.replicas.promote(keyspace, p)
            log.info("promoted %s/%d to active (new branch %x)", keyspace, p, entry.uuid)
        elif node not in topo.replicas.get(p, ()) and state_kind != "delta":
            engine.drop_partition(keyspace, p)
            log.info(
                "dropped the replica copy of %s/%d: its chain no longer names %s", keyspace, p, node
            )


def recover_copies(engine: DataEngine, node: str, state: StateContext, kind: str) -> None:
    """This node was failed over and is recovered: its active copies of partitions now
    active elsewhere may hold writes the cluster never acknowledged, and must never serve
    again. ``delta``: they become replica copies (fed again by the new active once a
    rebalance puts this node in their chain; a copy past the branch point is rolled back to
    it in place, ``replica_rollback.py``).
    ``full``: they are dropped."""
    moving = in_flight(state.rebalance)
    for name in list(state.keyspaces):
        topo = latest_topology_of(state, name)
        try:
            infos = engine.local_partitions(name)
        except KeyspaceNotFound:
            continue
        for info in infos:
            p = info.partition
            if topo is None or topo.assignment.get(p) == node:
                continue
            # A copy a migration is bringing here is the move's; a stale active copy is
            # not, even when a rebalance already moves that partition here (it would
            # refuse to copy over an active one).
            if (name, p) in moving and info.state != STATE_ACTIVE:
                continue
            if kind == "delta" and info.state in (STATE_ACTIVE, STATE_REPLICA):
                if info.state == STATE_ACTIVE:
                    engine.replicas.demote(name, p)
                    log.info("recovery (delta): %s/%d kept as a replica copy", name, p)
            else:
                engine.drop_partition(name, p)
                log.info("recovery (%s): dropped the stale copy of %s/%d", kind, name, p)


def holds_stale_actives(engine: DataEngine, node: str, state: StateContext) -> bool:
    """Whether this node holds an active copy the latest topology gives to another node:
    what a node failed over while it was down, and recovered before it heard of the
    failover, comes back with (it never wrote the failed-over mark)."""
    for name in list(state.keyspaces):
        topo = latest_topology_of(state, name)
        if topo is None:
            continue
        try:
            infos = engine.local_partitions(name)
        except KeyspaceNotFound:
            continue
        for info in infos:
            owner = topo.assignment.get(info.partition)
            if info.state == STATE_ACTIVE and owner is not None and owner != node:
                return True
    return False


def latest_topology_of(state: StateContext, keyspace: str) -> Topology | None:
    history = state.data_topologies.get(keyspace)
    return history[-1] if history else None


def never_moved(history: list[Topology], partition: int, node: str) -> bool:
    """Every published topology placed ``partition`` on ``node``: the only partitions a node
    may open empty. A partition that ever lived elsewhere arrives by migration (or, if its copy
    here is lost, stays unavailable rather than silently coming back empty)."""
    return bool(history) and all(t.assignment.get(partition) == node for t in history)


def _settle_incoming(
    engine: DataEngine,
    node: str,
    state: StateContext,
    keyspace: str,
    topo: Topology,
    moving: dict[tuple[str, int], MoveRecord],
) -> None:
    """An incoming copy whose migration is no longer in flight: activate it if the hand-over
    was published (this node was away when the master's activation came), else drop it."""
    record = state.rebalance
    for (ks, p), marker in engine.incoming().items():
        if ks != keyspace or (state.epoch, state.cas) < (marker.epoch, marker.record_cas):
            continue  # a state that need not descend from the commit recording the move
        mv = moving.get((ks, p))
        if mv is not None and mv.migration_id == marker.migration_id:
            continue  # in flight: the master finishes or aborts it
        try:
            known = None if record is None else record.move(marker.migration_id)
        except KeyError:
            known = None
        published = topo.assignment.get(p) == node and topo.seq_num > marker.base_seq
        if published and engine.partition_state(ks, p) == STATE_PENDING:
            log.info("activating %s/%d: its hand-over was published meanwhile", ks, p)
            engine.activate_partition(ks, p)
        elif published:
            engine.clear_incoming(ks, p)
        elif known is None or known.status in TERMINAL:
            drop_incoming(engine, (ks, p), marker.migration_id)


def _drop_released(
    engine: DataEngine,
    node: str,
    keyspace: str,
    topo: Topology,
    moving: dict[tuple[str, int], MoveRecord],
) -> None:
    """A released copy whose partition the latest topology places elsewhere: the master's
    ``DropOutgoing`` did not arrive. Raise the floor first (a stale state must never re-open
    it empty), then drop."""
    for info in engine.local_partitions(keyspace):
        p = info.partition
        if info.state != STATE_RELEASED or (keyspace, p) in moving:
            continue
        if topo.assignment.get(p) not in (None, node):
            engine.raise_topology_floor(keyspace, topo.seq_num)
            engine.drop_partition(keyspace, p)
            log.info("dropped released %s/%d: it moved to %s", keyspace, p, topo.assignment[p])


def drop_incoming(engine: DataEngine, key: tuple[str, int], migration_id: str | None) -> str:
    """Drop the partial (pending) copy and the marker of migration ``migration_id`` (any, for
    None); an active partition is never touched. Returns the partition's state afterwards."""
    marker = engine.incoming().get(key)
    if marker is not None and migration_id is not None and marker.migration_id != migration_id:
        return engine.partition_state(*key)  # another migration's copy: not ours to drop
    state = engine.partition_state(*key)
    if state == STATE_PENDING:
        engine.drop_partition(*key)
        state = "absent"
    if marker is not None:
        engine.clear_incoming(*key)
        log.info("dropped incoming copy of %s/%d (migration %s)", *key, marker.migration_id)
    return state


def _ranges(ps: list[int]) -> str:
    return ",".join(str(p) for p in ps) if len(ps) <= 8 else f"{ps[0]}..{ps[-1]} ({len(ps)})"
