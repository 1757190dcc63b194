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
import contextlib
import logging
from collections.abc import Awaitable, Callable

import msgspec

import shardex.data.replica as replica
from shardex.api.errors import KeyspaceNotFound
from shardex.api.records import FailoverEntry, MutationResult
from shardex.api.replication import (
    CopySeqno,
    CopySeqnos,
    CopySeqnosReply,
    DocRecords,
    FetchDocRecords,
    Promoted,
    PromoteReplica,
    ReplicaAck,
    ReplicaApplied,
    ReplicaApply,
    ReplicaRun,
)
from shardex.api.validation import MAJORITY_LEVELS
from shardex.data.durability import DurabilityWaits
from shardex.data.engine import DataEngine
from shardex.data.engine_io import EngineIO, WouldBlock
from shardex.data.placement import PlacementView, latest_topology
from shardex.data.replica_build import ReplicaBuilds
from shardex.data.replica_sender import ReplicaSender
from shardex.errors import ErrorCode, ShardexError
from shardex.meta.state import StateContext
from shardex.net import Connection, ConnectionPool

log = logging.getLogger(__name__)

ACK_STALE = "stale_source"  # the sender is not the partition's active in a newer topology
INLINE_APPLY = 32  # changes a replica applies on its event loop rather than in the I/O pool
FETCH_TIMEOUT = 30.0  # seconds for an active to read a rolled-back tail's documents


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
            CopySeqnos: self.on_copy_seqnos,
            PromoteReplica: self.on_promote,
            FetchDocRecords: self.on_fetch_records,
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

    def wake(self, keyspace: str, partition: int) -> None:
        """A write to ``partition`` of ``keyspace`` committed here: the senders of its
        replicas have something to send."""
        senders = self._fed.get(keyspace)
        if senders:
            for s in senders:
                s.wake(partition)

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
        self,
        keyspace: str,
        result: MutationResult,
        level: str,
        docid: str,
        timeout: float | None = None,
    ) -> None:
        """Until a majority holds the write at ``level``; ``timeout``: the writer's
        durability timeout (None: the node's default)."""
        if level not in MAJORITY_LEVELS:
            return
        await self.waits.wait(
            (keyspace, result.partition),
            result.seqno,
            result.uuid,
            persist=level == "persist_majority",
            docid=docid,
            timeout=timeout,
        )

    def on_durable(
        self,
        keyspace: str,
        result: MutationResult,
        level: str,
        docid: str,
        then: Callable[[BaseException | None], None],
        timeout: float | None = None,
    ) -> bool:
        """``wait_durable`` for a caller settling by callbacks: False when there is nothing
        to wait for, else True and ``then`` is called once the wait is over, with None or
        its error (DURABILITY_AMBIGUOUS, or why the copy was forgotten)."""
        if level not in MAJORITY_LEVELS:
            return False
        w = self.waits.start_wait(
            (keyspace, result.partition),
            result.seqno,
            result.uuid,
            persist=level == "persist_majority",
            docid=docid,
            timeout=timeout,
            then=then,
        )
        return w is not None

    def has_pending(self) -> bool:
        return self.waits.has_pending()

    def pending(self, keyspace: str, partition: int, docid: str) -> bool:
        """A durable write of ``docid`` waits on this node (its readers wait for it)."""
        return self.waits.pending((keyspace, partition), docid)

    async def wait_readable(self, keyspace: str, partition: int, docid: str) -> None:
        await self.waits.wait_readable((keyspace, partition), docid)

    def inline_routes(self) -> dict[type, Callable[..., object]]:
        """Handlers called in the connection's receive callback (``Router.route_inline``)."""
        return {ReplicaApply: self.on_apply}

    # --- the replica's side ---------------------------------------------------------------------

    def on_apply(
        self, msg: ReplicaApply, conn: Connection
    ) -> ReplicaApplied | Awaitable[ReplicaApplied]:
        """Routed inline: the usual small unsynced apply is written on the loop (below) and
        answered without a task, one per round under load; anything that must wait (the
        I/O pool, a rollback) returns a coroutine the connection finishes in a task."""
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
        acks = None
        if not msg.sync and sum(len(r.changes) for r in runs) <= INLINE_APPLY:
            # A small unsynced batch costs less than the hop to the I/O pool (the same
            # judgement as point reads on the loop), unless it would wait there.
            with contextlib.suppress(WouldBlock):
                acks = engine.replicas.apply_runs(msg.keyspace, runs, sync=False, inline=True)
        if acks is not None and not any(a.state == replica.ACK_DIVERGED for a in acks):
            acks += [ReplicaAck(r.partition, 0, 0, 0, replica.ACK_BUILDING) for r in builds]
            return ReplicaApplied(acks=acks + stale)
        return self._apply_rest(engine, msg, runs, builds, stale, acks)

    async def _apply_rest(
        self,
        engine: DataEngine,
        msg: ReplicaApply,
        runs: list[ReplicaRun],
        builds: list[ReplicaRun],
        stale: list[ReplicaAck],
        acks: list[ReplicaAck] | None,
    ) -> ReplicaApplied:
        """``on_apply`` where it must wait: the apply in the I/O pool (unless ``acks``: done
        on the loop already), then the rollback of each copy that diverged."""
        if acks is None:
            acks = await self._io.run(engine.replicas.apply_runs, msg.keyspace, runs, sync=msg.sync)
        acks += [ReplicaAck(r.partition, 0, 0, 0, replica.ACK_BUILDING) for r in builds]
        diverged = {r.partition: r for r in runs}
        for i, ack in enumerate(acks):
            if ack.state == replica.ACK_DIVERGED:
                acks[i] = await self._roll_back(engine, msg, diverged[ack.partition])
        return ReplicaApplied(acks=acks + stale)

    async def _roll_back(
        self, engine: DataEngine, msg: ReplicaApply, run: ReplicaRun
    ) -> ReplicaAck:
        """A copy whose history left its active's: rolled back to the branch point in place,
        else started again empty (``replica_rollback.py``); the ack says where it now is."""
        ks, p = msg.keyspace, run.partition
        info = engine.partition_info(ks, p)
        flog = [msgspec.convert(e, FailoverEntry) for e in run.failover_log or ()]
        plan = await self._io.run(engine.replicas.rollback_plan, ks, p, flog)
        records: list[bytes | None] = []
        if plan is not None:
            try:  # not under the placement lock: a slow active must not stall reconcile
                records = await self._fetch_records(msg.source, ks, p, plan.docids)
            except ShardexError as exc:
                # The active cannot say now: the copy stays as it is, the next run retries.
                log.info("rollback of %s/%d: records from %s: %s", ks, p, msg.source, exc)
                ack = engine.replicas.acks(ks, [p])[0]
                return msgspec.structs.replace(ack, state=replica.ACK_DIVERGED)
        async with self._lock:
            done = plan is not None and await self._io.run(
                engine.replicas.rollback, ks, p, plan, records
            )
            if plan is not None and done:
                log.warning(
                    "replica copy of %s/%d (seqno %d, branch %x) diverged from %s's history: "
                    "rolled back to seqno %d (%d documents)",
                    ks,
                    p,
                    info.high_seqno,
                    info.uuid,
                    msg.source,
                    plan.seqno,
                    len(plan.docids),
                )
            else:
                log.warning(
                    "replica copy of %s/%d (seqno %d, branch %x) diverged from %s's history: "
                    "restarting it empty",
                    ks,
                    p,
                    info.high_seqno,
                    info.uuid,
                    msg.source,
                )
                await self._io.run(engine.replicas.restart_empty, ks, p)
            return engine.replicas.acks(ks, [p])[0]

    async def _fetch_records(
        self, source: str, keyspace: str, partition: int, docids: list[str]
    ) -> list[bytes | None]:
        if not docids:
            return []
        msg = FetchDocRecords(keyspace=keyspace, partition=partition, docids=docids)
        reply = await self._pool.request(
            self._placement.address(source), msg, FETCH_TIMEOUT, expect=DocRecords
        )
        return reply.records

    async def on_fetch_records(self, msg: FetchDocRecords, conn: Connection) -> DocRecords:
        engine = self._engine()
        records = await self._io.run(
            engine.replicas.doc_records, msg.keyspace, msg.partition, msg.docids
        )
        return DocRecords(records=records)

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


def _moved_away() -> ShardexError:
    return ShardexError(
        "this node no longer holds the partition's active copy while a durable write waited: "
        "it may or may not survive",
        code=ErrorCode.DURABILITY_AMBIGUOUS,
        details={"hint": "read the document back to see whether it took effect"},
    )
