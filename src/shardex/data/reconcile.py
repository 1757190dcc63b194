"""Local placement rules of a data node: open, drop and reconcile keyspaces against the
manager state. Synchronous functions over a ``DataEngine`` (the service runs them in its I/O
executor under its placement lock); the reasoning is in ``docs/decisions.md``, "Data service
on the wire".

Two guards keep a stale state from doing harm. Each local keyspace records the manager's
``uuid`` and ``created_cas``: a different uuid under the same name is another incarnation
(dropped and re-created while this node was away), which replaces ours only if it is newer;
and a keyspace missing from a state is dropped only if that state's ``cas`` is above the
keyspace's ``created_cas`` (a keyspace created at cas N is in every later state unless it was
dropped, while a lagging replica or an empty state proves nothing).
"""

from __future__ import annotations

import logging

from shardex.data.engine import DataEngine
from shardex.data.errors import KeyspaceNotFound
from shardex.data.placement import latest_topology
from shardex.errors import ErrorCode, ShardexError
from shardex.manager.state import StateContext

log = logging.getLogger(__name__)


def open_partitions(
    engine: DataEngine,
    keyspace: str,
    uuid: str,
    created_cas: int,
    num_partitions: int,
    partitions: list[int],
) -> list[int]:
    """Make ``keyspace`` (this incarnation) exist here with at least ``partitions``; returns
    the partitions created now. Idempotent."""
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
        keyspace, num_partitions, exist_ok=True, uuid=uuid, created_cas=created_cas
    )
    held = set(engine.partitions(keyspace))
    created = [p for p in partitions if p not in held]
    for p in created:
        engine.create_partition(keyspace, p, exist_ok=True)
    if created:
        log.info("opened %d partition(s) of %s: %s", len(created), keyspace, _ranges(created))
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
    """Open what the latest topologies give ``node``, keep everything else it holds, drop
    keyspaces the state proves dropped."""
    for name, meta in state.keyspaces.items():
        topo = latest_topology(state, name)
        mine = topo.partitions_of(node) if topo is not None else []
        try:
            local = engine.keyspace(name)
        except KeyspaceNotFound:
            local = None
        if local is not None and local.uuid == meta.uuid:
            if set(mine) <= set(engine.partitions(name)):
                continue
        elif local is not None and local.created_cas > meta.created_cas:
            continue  # the state we read predates our keyspace: a stale replica
        open_partitions(engine, name, meta.uuid, meta.created_cas, meta.num_partitions, mine)
    if state.cas == 0:
        return  # an empty state (a manager that knows nothing yet) proves nothing
    for local in engine.keyspaces():
        if local.name not in state.keyspaces and state.cas > local.created_cas:
            log.info("keyspace %s is gone from the cluster state: dropping it", local.name)
            engine.drop_keyspace(local.name)


def _ranges(ps: list[int]) -> str:
    return ",".join(str(p) for p in ps) if len(ps) <= 8 else f"{ps[0]}..{ps[-1]} ({len(ps)})"
