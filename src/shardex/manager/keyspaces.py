"""Keyspace DDL as coordinator ops: CREATE, DROP and LIST keyspaces.

The coordinator runs ops one at a time on the master, so checks and commit see one state.
Create: validate, place the partitions round-robin over the data nodes that are up and their
replica copies on other nodes, in other server groups where there are (``chain_assignment``),
commit the keyspace meta with topology ``seq_num`` 1 as the first entry of its history, then
ask every node of a chain to open its partitions, actives and replicas, all empty
(``OpenPartitions``; idempotent, retried). Drop: commit the removal, then ask every data node
to drop its data.

Failure after the commit: the state is the truth and is not rolled back. A data node that
could not be told (down, slow) converges by itself: every data node reconciles with the state
when it starts, on every state change it sees and periodically (``DataService``), opening the
partitions the latest topology gives it and dropping keyspaces the state no longer has. So a
create that could not reach an owner fails with NODE_UNAVAILABLE that says exactly this: the
keyspace exists, the named partitions are unavailable until their node is back. A drop that
could not reach a node succeeds (the keyspace is gone from the state) and names the nodes that
will drop their copy when they reconcile.
"""

from __future__ import annotations

import asyncio
from typing import Any

import msgspec

from shardex.api.data import DropKeyspaceData, OpenPartitions
from shardex.api.errors import KeyspaceExists, KeyspaceNotFound
from shardex.api.expiry import check_max_ttl
from shardex.api.keyspaces import (
    CreateKeyspace,
    DropKeyspace,
    KeyspaceCreated,
    KeyspaceDropped,
    KeyspaceList,
    ListKeyspaces,
    check_keyspace_name,
)
from shardex.core.topology import Topology
from shardex.errors import ErrorCode, ShardexError
from shardex.meta.member_list import UP, MemberInfo
from shardex.meta.partitioning import check_num_partitions
from shardex.meta.replica_placement import (
    chain_assignment,
    check_num_replicas,
    default_num_replicas,
)
from shardex.meta.state import KeyspaceMeta
from shardex.net.messages import Message

NODE_ATTEMPTS = 3
NODE_TIMEOUT = 2.0  # x NODE_ATTEMPTS + backoff stays under a client's 10 s request timeout


def data_members(ctx: Any) -> tuple[list[MemberInfo], list[MemberInfo]]:
    """(all data-service members, those up) as the master observes them."""
    membership = ctx.membership
    now = asyncio.get_running_loop().time()
    members = [m for m in membership.members if "data" in m.services]
    up = [m for m in members if membership.state_of(m.member_id, now)[0] == UP]
    return members, up


async def _tell(ctx: Any, member: MemberInfo, msg: Message) -> str | None:
    """Send ``msg`` to ``member`` with retries; None on success, else the last error."""
    last = ""
    for attempt in range(NODE_ATTEMPTS):
        try:
            await ctx.pool.request(member.address, msg, NODE_TIMEOUT)
            return None
        except ShardexError as exc:
            last = str(exc)
            if exc.code not in (
                ErrorCode.NODE_UNAVAILABLE,
                ErrorCode.TIMEOUT,
                ErrorCode.CONNECTION_CLOSED,
                ErrorCode.UNKNOWN_MESSAGE,  # a node between bind and route installation
            ):
                return last  # a refusal: retrying says the same
        await asyncio.sleep(0.2 * 2**attempt)
    return last


async def create_keyspace(msg: CreateKeyspace, ctx: Any) -> KeyspaceCreated:
    name = check_keyspace_name(msg.name)
    num_partitions = check_num_partitions(msg.num_partitions)
    if msg.num_replicas is not None:
        check_num_replicas(msg.num_replicas)
    max_ttl = check_max_ttl(msg.max_ttl)
    state = ctx.state
    if name in state.keyspaces:
        old = state.keyspaces[name]
        raise KeyspaceExists(
            f"keyspace {name!r} already exists ({old.num_partitions} partitions)",
            details={"keyspace": name, "num_partitions": old.num_partitions, "uuid": old.uuid},
        )
    members, up = data_members(ctx)
    # A failed-over node serves nothing until it is recovered: no copies go there.
    up = [m for m in up if m.name not in state.failed_over]
    if not up:
        raise ShardexError(
            "no data node is up to place the keyspace on",
            code=ErrorCode.NODE_UNAVAILABLE,
            details={"keyspace": name, "data_nodes": [m.name for m in members]},
        )
    num_replicas = msg.num_replicas
    if num_replicas is None:
        num_replicas = default_num_replicas(len(up))
    placement = chain_assignment(
        num_partitions, [m.name for m in up], num_replicas, {m.name: m.group for m in up}
    )
    topology = Topology(seq_num=1, assignment=placement.assignment, replicas=placement.replicas)
    meta = KeyspaceMeta(
        name=name,
        num_partitions=num_partitions,
        uuid=ctx.new_id(),  # seeded under the simulator, so runs replay
        created_cas=state.cas + 1,
        num_replicas=num_replicas,
        max_ttl=max_ttl,
    )
    new_state = msgspec.structs.replace(
        state,
        keyspaces={**state.keyspaces, name: meta},
        data_topologies={**state.data_topologies, name: [topology]},
    )
    reply = KeyspaceCreated(meta=meta, topology=topology, warnings=placement.warnings)
    # The reply is recorded with the effect: a retry of this request id (after a lost
    # connection) answers "created", which is what the state says, whatever the nodes did.
    committed = await ctx.commit(new_state, reply=reply)

    def copies_on(node: str) -> list[int]:
        return topology.partitions_of(node) + topology.replicas_of(node)

    async def open_on(m: MemberInfo) -> str | None:
        req = OpenPartitions(
            keyspace=name,
            uuid=meta.uuid,
            created_cas=meta.created_cas,
            num_partitions=num_partitions,
            partitions=topology.partitions_of(m.name),
            replicas=topology.replicas_of(m.name),
            max_ttl=max_ttl,
        )
        return await _tell(ctx, m, req)

    results = await asyncio.gather(*(open_on(m) for m in up))
    failed = {
        m.name: err
        for m, err in zip(up, results, strict=True)
        if err is not None and copies_on(m.name)
    }
    if failed:
        lost = sorted(p for n in failed for p in topology.partitions_of(n))
        replicas = sorted({p for n in failed for p in topology.replicas_of(n)})
        raise ShardexError(
            f"keyspace {name!r} was created (state cas {committed.cas}, topology 1) but "
            f"{', '.join(sorted(failed))} did not open its partitions; those {len(lost)} "
            f"partition(s) are unavailable (and {len(replicas)} replica copies missing) until "
            "the node is reachable again, when it opens them by itself (data nodes reconcile "
            "with the cluster state)",
            code=ErrorCode.NODE_UNAVAILABLE,
            details={
                "keyspace": name,
                "state": "created",
                "cas": committed.cas,
                "failed": failed,
                "partitions": lost,
                "replicas": replicas,
            },
        )
    return reply


async def drop_keyspace(msg: DropKeyspace, ctx: Any) -> KeyspaceDropped:
    state = ctx.state
    meta = state.keyspaces.get(msg.name)
    if meta is None:
        raise KeyspaceNotFound(f"keyspace {msg.name!r} not found", details={"keyspace": msg.name})
    keyspaces = {k: v for k, v in state.keyspaces.items() if k != msg.name}
    topologies = {k: v for k, v in state.data_topologies.items() if k != msg.name}
    # The keyspace's indexes go with it, in the same commit: a keyspace re-created under
    # this name must not be indexed by the old definitions. Indexers drop the orphaned
    # slices when they reconcile with the committed state.
    gone = {i for i, rec in state.indexes.items() if rec.definition.keyspace == msg.name}
    indexes = {i: r for i, r in state.indexes.items() if i not in gone}
    index_topologies = {i: t for i, t in state.index_topologies.items() if i not in gone}
    await ctx.commit(
        msgspec.structs.replace(
            state,
            keyspaces=keyspaces,
            data_topologies=topologies,
            indexes=indexes,
            index_topologies=index_topologies,
        ),
        reply=KeyspaceDropped(name=msg.name, uuid=meta.uuid),
    )
    members, up = data_members(ctx)
    up_ids = {m.member_id for m in up}
    req = DropKeyspaceData(keyspace=msg.name, uuid=meta.uuid)
    results = await asyncio.gather(*(_tell(ctx, m, req) for m in up))
    pending = [m.name for m, err in zip(up, results, strict=True) if err is not None]
    pending += [m.name for m in members if m.member_id not in up_ids]
    return KeyspaceDropped(name=msg.name, uuid=meta.uuid, pending_nodes=sorted(pending))


async def list_keyspaces(msg: ListKeyspaces, ctx: Any) -> KeyspaceList:
    state = ctx.state
    return KeyspaceList(
        keyspaces=[state.keyspaces[k] for k in sorted(state.keyspaces)],
        topologies={k: h[-1] for k, h in state.data_topologies.items() if h},
    )


def register_keyspace_ops(coordinator: Any) -> None:
    """Install the keyspace ops on a ``Coordinator``."""
    coordinator.register_op(CreateKeyspace, create_keyspace)
    coordinator.register_op(DropKeyspace, drop_keyspace)
    coordinator.register_op(ListKeyspaces, list_keyspaces)
