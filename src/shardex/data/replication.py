"""Replication on a data node, both ends: the senders feeding this node's replicas, the
durable writes waiting on them, and the handlers of the replica copies held here.

``refresh`` runs after every reconcile with the state it used: from each keyspace's latest
topology it derives, for the partitions active here, the chains (``DurabilityWaits``) and one
``ReplicaSender`` per replica node; senders no longer needed stop. The replica side answers
``ReplicaApply`` (refusing a source the newest topology it knows does not name as the
partition's active), ``CopySeqnos`` and ``PromoteReplica``
(``docs/decisions/0082-replicas-and-durability.md``).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

import shardex.data.replica as replica
from shardex.api.errors import KeyspaceNotFound
from shardex.api.records import STATE_ACTIVE, MutationResult
from shardex.api.replication import (
    CopySeqno,
    CopySeqnos,
    CopySeqnosReply,
    Promoted,
    PromoteReplica,
    ReplicaAck,
    ReplicaApplied,
    ReplicaApply,
)
from shardex.api.validation import MAJORITY_LEVELS
from shardex.data.durability import DurabilityWaits
from shardex.data.engine import DataEngine
from shardex.data.engine_io import EngineIO
from shardex.data.placement import PlacementView, latest_topology
from shardex.data.replica_build import ReplicaBuilds
from shardex.data.replica_sender import ReplicaSender
from shardex.errors import ErrorCode, ShardexError
from shardex.meta.state import StateContext
from shardex.net import Connection, ConnectionPool

log = logging.getLogger(__name__)

ACK_STALE = "stale_source"  # the sender is not the partition's active in a newer topology
INLINE_APPLY = 32  # changes a replica applies on its event loop rather than in the I/O pool


class Replication:
    """This node's replication (module docstring)."""

    def __init__(
        self,
        *,
        me: str,
        engine: Callable[[], DataEngine],
        io: EngineIO,
        pool: ConnectionPool,
        placement: PlacementView,
        placement_lock: asyncio.Lock,
    ) -> None:
        self.me = me
        self._engine = engine
        self._io = io
        self._pool = pool
        self._placement = placement
        self._lock = placement_lock
        self.waits = DurabilityWaits()
        self.builds = ReplicaBuilds(
            engine=engine,
            run=io.run,
            pool=pool,
            address=placement.address,
            placement_lock=placement_lock,
        )
        self.senders: dict[tuple[str, str], ReplicaSender] = {}
        # keyspaces with an active copy here that has replicas: writes to them wake senders
        self._fed: dict[str, list[ReplicaSender]] = {}
        self._active_keys: set[tuple[str, int]] = set()

    def routes(self) -> dict[type, Callable[..., object]]:
        return {
            ReplicaApply: self.on_apply,
            CopySeqnos: self.on_copy_seqnos,
            PromoteReplica: self.on_promote,
        }

    async def stop(self) -> None:
        await self.builds.stop()
        senders = list(self.senders.values())
        self.senders.clear()
        self._fed.clear()
        await asyncio.gather(*(s.stop() for s in senders), return_exceptions=True)

    # --- the active's side ----------------------------------------------------------------------

    async def refresh(self, state: StateContext) -> None:
        """Chains and senders from ``state`` (module docstring)."""
        engine = self._engine()
        wanted: dict[tuple[str, str], tuple[frozenset[int], int, str]] = {}
        keys: set[tuple[str, int]] = set()
        for name, meta in state.keyspaces.items():
            topo = latest_topology(state, name)
            if topo is None:
                continue
            for p in topo.partitions_of(self.me):
                if engine.replicas.active_part(name, p) is None:
                    continue
                reps = topo.replicas.get(p, [])
                keys.add((name, p))
                self.waits.set_chain((name, p), 1 + meta.num_replicas, reps)
                for node in reps:
                    parts, _s, _u = wanted.get((name, node), (frozenset(), 0, ""))
                    wanted[(name, node)] = (parts | {p}, topo.seq_num, meta.uuid)
        gone = _moved_away()
        for key in self._active_keys - keys:
            self.waits.forget(key, gone)
        self._active_keys = keys
        for key in [k for k in self.senders if k not in wanted]:
            await self.senders.pop(key).stop()
        for key, (parts, seq, ks_uuid) in wanted.items():
            sender = self.senders.get(key)
            if sender is None:
                sender = ReplicaSender(
                    keyspace=key[0],
                    node=key[1],
                    me=self.me,
                    engine=self._engine,
                    run=self._io.run,
                    pool=self._pool,
                    address=self._placement.address,
                    waits=self.waits,
                )
                self.senders[key] = sender
                sender.start()
            sender.update(parts, seq, ks_uuid)
        fed: dict[str, list[ReplicaSender]] = {}
        for (ks, _node), sender in self.senders.items():
            fed.setdefault(ks, []).append(sender)
        self._fed = fed

    def wake(self, keyspace: str) -> None:
        """A write to ``keyspace`` committed here: its senders have something to send."""
        senders = self._fed.get(keyspace)
        if senders:
            for s in senders:
                s.wake()

    def check_possible(self, keyspace: str, partition: int) -> None:
        """DURABILITY_IMPOSSIBLE when too few copies of the partition are reachable."""
        key = (keyspace, partition)
        reachable = 1 + sum(
            1
            for node in self.waits.replicas(key)
            if (s := self.senders.get((keyspace, node))) is not None and s.reachable(partition)
        )
        self.waits.check_possible(key, reachable)

    async def wait_durable(
        self, keyspace: str, result: MutationResult, level: str, docid: str
    ) -> None:
        if level not in MAJORITY_LEVELS:
            return
        await self.waits.wait(
            (keyspace, result.partition),
            result.seqno,
            result.uuid,
            persist=level == "persist_majority",
            docid=docid,
        )

    def has_pending(self) -> bool:
        return self.waits.has_pending()

    async def wait_readable(self, keyspace: str, partition: int, docid: str) -> None:
        await self.waits.wait_readable((keyspace, partition), docid)

    # --- the replica's side ---------------------------------------------------------------------

    async def on_apply(self, msg: ReplicaApply, conn: Connection) -> ReplicaApplied:
        engine = self._engine()
        try:
            local = engine.keyspace(msg.keyspace)
        except KeyspaceNotFound:
            local = None
        if local is None or (msg.keyspace_uuid and local.uuid and local.uuid != msg.keyspace_uuid):
            absent = [ReplicaAck(r.partition, 0, 0, 0, replica.ACK_ABSENT) for r in msg.runs]
            return ReplicaApplied(acks=absent)
        state = self._placement.cached
        topo = None if state is None else latest_topology(state, msg.keyspace)
        runs, stale = [], []
        for run in msg.runs:
            if (
                topo is not None
                and topo.seq_num > msg.seq_num
                and topo.assignment.get(run.partition) != msg.source
            ):
                stale.append(ReplicaAck(run.partition, 0, 0, 0, ACK_STALE))
            else:
                runs.append(run)
        builds = [r for r in runs if r.rebuild]
        if builds:
            runs = [r for r in runs if not r.rebuild]
            for r in builds:
                self.builds.start(msg.keyspace, r.partition, msg.source)
        if not msg.sync and sum(len(r.changes) for r in runs) <= INLINE_APPLY:
            # A small unsynced batch costs less than the hop to the I/O pool (the same
            # judgement as point reads on the loop).
            acks = engine.replicas.apply_runs(msg.keyspace, runs, sync=False)
        else:
            acks = await self._io.run(engine.replicas.apply_runs, msg.keyspace, runs, sync=msg.sync)
        acks += [ReplicaAck(r.partition, 0, 0, 0, replica.ACK_BUILDING) for r in builds]
        diverged = [a.partition for a in acks if a.state == replica.ACK_DIVERGED]
        if diverged:
            async with self._lock:
                await self._io.run(_restart_copies, engine, msg.keyspace, diverged, msg.source)
        return ReplicaApplied(acks=acks + stale)

    async def on_copy_seqnos(self, msg: CopySeqnos, conn: Connection) -> CopySeqnosReply:
        engine = self._engine()
        try:
            infos = engine.local_partitions(msg.keyspace)
        except KeyspaceNotFound:
            infos = []
        wanted = None if msg.partitions is None else set(msg.partitions)
        copies = [
            CopySeqno(i.partition, i.high_seqno, i.uuid, i.state)
            for i in infos
            if wanted is None or i.partition in wanted
        ]
        return CopySeqnosReply(node=self.me, copies=copies)

    async def on_promote(self, msg: PromoteReplica, conn: Connection) -> Promoted:
        engine = self._engine()
        await self._io.run(engine.check_fence, msg.epoch)
        async with self._lock:
            entry = await self._io.run(engine.replicas.promote, msg.keyspace, msg.partition)
        info = engine.partition_info(msg.keyspace, msg.partition)
        log.info(
            "promoted %s/%d to active at seqno %d (new branch %x)",
            msg.keyspace,
            msg.partition,
            info.high_seqno,
            entry.uuid,
        )
        return Promoted(high_seqno=info.high_seqno, uuid=entry.uuid)


def _restart_copies(engine: DataEngine, keyspace: str, partitions: list[int], source: str) -> None:
    """Replica copies whose history is not a prefix of their active's: start them again empty
    (the active then feeds them from seqno 0, or they are rebuilt by a copy)."""
    for p in partitions:
        info = engine.partition_info(keyspace, p)
        if info.state == STATE_ACTIVE:
            continue
        log.warning(
            "replica copy of %s/%d (seqno %d, branch %x) diverged from %s's history: restarting it",
            keyspace,
            p,
            info.high_seqno,
            info.uuid,
            source,
        )
        engine.drop_partition(keyspace, p)
        engine.replicas.create_empty(keyspace, p)


def _moved_away() -> ShardexError:
    return ShardexError(
        "this node no longer holds the partition's active copy while a durable write waited: "
        "it may or may not survive",
        code=ErrorCode.DURABILITY_AMBIGUOUS,
        details={"hint": "read the document back to see whether it took effect"},
    )
