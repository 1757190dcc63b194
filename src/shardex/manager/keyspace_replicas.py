"""Changing a keyspace's replica count: ``SetKeyspaceReplicas`` as a coordinator op.

Couchbase changes a bucket's replica count in its settings and builds or drops the copies at
the next rebalance. Here the op does both in one commit, because widening or narrowing
chains moves no active: the keyspace meta gets the new ``num_replicas`` and its topology the
chains ``restore_replicas`` places for it on the serving data nodes (the same rules as a
rebalance after a failover: kept replicas stay, new ones go where the placement rules say,
extra ones leave). The data nodes act on the new topology by themselves: a node named in a
chain opens an empty replica copy that its active feeds from the change log (or rebuilds from
a snapshot when the change log no longer reaches back to seqno 0), a node no longer named
drops its copy. So the copies are built for the data already there, in the background; the
reply does not wait for them.

Durable writes follow the meta at once: a ``majority`` write waits for a majority of the new
chain length, so while new copies catch up such writes wait (or fail DURABILITY_AMBIGUOUS
after their timeout); raising 0 to 1 with one data node up is refused with
DURABILITY_IMPOSSIBLE by the writes themselves, as for a keyspace created that way.

Refused while a rebalance moves partitions (its moves commit topologies derived from the one
they started from), and when nothing would change it answers the current state (an
idempotent retry).
"""

from __future__ import annotations

import logging
from typing import Any

import msgspec

from shardex.api.errors import KeyspaceNotFound
from shardex.api.keyspaces import KeyspaceReplicasSet, SetKeyspaceReplicas
from shardex.errors import ErrorCode, ShardexError
from shardex.manager.eject import serving_data_nodes
from shardex.meta.rebalance_state import in_flight
from shardex.meta.replica_placement import (
    check_num_replicas,
    placement_warnings,
    restore_replicas,
)

log = logging.getLogger(__name__)


async def set_keyspace_replicas(msg: SetKeyspaceReplicas, ctx: Any) -> KeyspaceReplicasSet:
    """The op (module docstring)."""
    num_replicas = check_num_replicas(msg.num_replicas)
    state = ctx.state
    meta = state.keyspaces.get(msg.name)
    history = state.data_topologies.get(msg.name)
    if meta is None or not history:
        raise KeyspaceNotFound(f"keyspace {msg.name!r} not found", details={"keyspace": msg.name})
    _nodes, serving, groups = serving_data_nodes(ctx)
    warnings = placement_warnings(serving, groups, num_replicas)
    latest = history[-1]
    if (
        meta.num_replicas == num_replicas
        and restore_replicas(latest, serving, num_replicas, groups) is latest
    ):
        return KeyspaceReplicasSet(
            meta=meta, topology=latest, previous=meta.num_replicas, warnings=warnings
        )
    moving = sorted(p for (ks, p) in in_flight(state.rebalance) if ks == msg.name)
    if moving:
        raise ShardexError(
            f"keyspace {msg.name!r} has partitions moving in a rebalance ({len(moving)}): its "
            "replica count cannot change until they settle",
            code=ErrorCode.BAD_REQUEST,
            details={
                "keyspace": msg.name,
                "moving": moving[:20],
                "hint": "wait until the rebalance is over (shardex cluster status), then "
                "set the replicas again",
            },
        )
    if not serving:
        raise ShardexError(
            "no data node is up to place replica copies on",
            code=ErrorCode.NODE_UNAVAILABLE,
            details={"keyspace": msg.name},
        )
    topology = restore_replicas(latest, serving, num_replicas, groups)
    new_meta = msgspec.structs.replace(meta, num_replicas=num_replicas)
    topologies = state.data_topologies
    if topology is not latest:
        topologies = {**topologies, msg.name: [*history, topology]}
    reply = KeyspaceReplicasSet(
        meta=new_meta, topology=topology, previous=meta.num_replicas, warnings=warnings
    )
    await ctx.commit(
        msgspec.structs.replace(
            state,
            keyspaces={**state.keyspaces, msg.name: new_meta},
            data_topologies=topologies,
        ),
        reply=reply,
    )
    log.info(
        "keyspace %s: %d -> %d replicas (topology %d)",
        msg.name,
        meta.num_replicas,
        num_replicas,
        topology.seq_num,
    )
    return reply


def register_keyspace_replica_ops(coordinator: Any) -> None:
    """Install the op on a ``Coordinator``."""
    coordinator.register_op(SetKeyspaceReplicas, set_keyspace_replicas)
