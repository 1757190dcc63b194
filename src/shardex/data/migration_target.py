"""Target side of a partition migration on a data node.

``MigrateIn`` (from the master) runs the long part: write the incoming marker, pull the
source's snapshot in chunks into one SST (the next chunk is requested while the previous one
is written: one round trip of pipelining, flow control by the target's own pace), install it
``pending``, then catch up from the source's change records until the lag is small. The
master then freezes the source and sends ``CatchUp`` to the frozen high seqno, and after the
release ``ActivateIncoming``. ``AbortIncoming`` cancels a copy in progress and drops the
partial copy. Everything that changes local placement runs under the data service's placement
lock, so it never interleaves with a reconcile.

A copy keeps seqnos, CAS values, the partition uuid, the failover log and the purge seqno of
the source: the target continues the same history (a stream consumer resumes there from its
(seqno, uuid) without ROLLBACK).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any

import shardex.data.reconcile as reconcile
from shardex.api.migration import (
    AbortIncoming,
    ActivateIncoming,
    CatchUp,
    CatchUpReply,
    CopyChunk,
    CopyChunkReply,
    CopyClose,
    CopyOpen,
    CopyOpened,
    IncomingMarker,
    LocalPartitions,
    LocalPartitionsReply,
    MigrateIn,
    MigrateInReply,
    Outcome,
    ReadChanges,
    ReadChangesReply,
)
from shardex.api.records import STATE_ACTIVE, STATE_PENDING, Change, PartitionInfo
from shardex.data.engine import DataEngine
from shardex.data.handover import IncomingCopy
from shardex.errors import ErrorCode, ShardexError
from shardex.net import Connection, ConnectionPool

log = logging.getLogger(__name__)

RunInExecutor = Callable[..., Awaitable[Any]]
PULL_TIMEOUT = 60.0  # one chunk or change read; a dead source closes the connection sooner
MAX_CATCHUP_ROUNDS = 20


@dataclasses.dataclass
class _Incoming:
    migration_id: str
    task: asyncio.Task[MigrateInReply]


class MigrationTarget:
    """The target's handlers (module docstring)."""

    def __init__(
        self,
        engine: Callable[[], DataEngine],
        run: RunInExecutor,
        pool: ConnectionPool,
        placement_lock: asyncio.Lock,
    ) -> None:
        self._engine = engine
        self._run = run
        self._pool = pool
        self._lock = placement_lock
        self._incoming: dict[tuple[str, int], _Incoming] = {}

    def routes(self) -> dict[type, Callable[[Any, Connection], Awaitable[Any]]]:
        return {
            MigrateIn: self.on_migrate_in,
            CatchUp: self.on_catch_up,
            ActivateIncoming: self.on_activate,
            AbortIncoming: self.on_abort,
            LocalPartitions: self.on_local_partitions,
        }

    async def close(self) -> None:
        tasks = [i.task for i in self._incoming.values()]
        self._incoming.clear()
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    async def _fence(self, epoch: int) -> DataEngine:
        engine = self._engine()
        await self._run(engine.check_fence, epoch)
        return engine

    # --- MigrateIn -------------------------------------------------------------------------------

    async def on_migrate_in(self, msg: MigrateIn, conn: Connection) -> MigrateInReply:
        await self._fence(msg.epoch)
        key = (msg.keyspace, msg.partition)
        old = self._incoming.pop(key, None)
        if old is not None:  # a superseded attempt (its master gave up on it)
            old.task.cancel()
            await asyncio.gather(old.task, return_exceptions=True)
        task = asyncio.get_running_loop().create_task(
            self._migrate_in(msg), name=f"migrate-in {msg.keyspace}/{msg.partition}"
        )
        entry = _Incoming(msg.migration_id, task)
        self._incoming[key] = entry

        def forget(_t: object) -> None:
            if self._incoming.get(key) is entry:
                del self._incoming[key]

        # Shielded: a master that hangs up does not cancel the copy half-way; the master that
        # settles the migration sends AbortIncoming (or reconcile drops the copy).
        task.add_done_callback(forget)
        return await asyncio.shield(task)

    async def _migrate_in(self, msg: MigrateIn) -> MigrateInReply:
        engine = self._engine()
        marker = IncomingMarker(
            migration_id=msg.migration_id,
            keyspace=msg.keyspace,
            partition=msg.partition,
            source=msg.source,
            base_seq=msg.base_seq,
            record_cas=msg.record_cas,
            epoch=msg.epoch,
        )
        async with self._lock:
            await self._run(_prepare, engine, msg, marker)
        conn = await self._pool.get(msg.source_address, PULL_TIMEOUT)
        started = time.monotonic()
        opened = await conn.request(
            CopyOpen(migration_id=msg.migration_id, keyspace=msg.keyspace, partition=msg.partition),
            PULL_TIMEOUT,
            expect=CopyOpened,
        )
        try:
            copy = await self._run(engine.begin_ingest, msg.keyspace, msg.partition, opened.info)
            try:
                await pull_chunks(
                    conn, opened.session, copy, self._run, msg.rate_limit, msg.chunk_bytes
                )
                async with self._lock:
                    info = await self._run(copy.finish)
            except BaseException:
                await self._run(copy.abort)
                raise
        finally:
            with contextlib.suppress(ShardexError):
                await conn.request(CopyClose(session=opened.session), PULL_TIMEOUT)
        copy_seconds = time.monotonic() - started
        log.info(
            "migration %s: copied %s/%d in: %d items, %.1f MB in %.2fs (seqno %d)",
            msg.migration_id,
            msg.keyspace,
            msg.partition,
            copy.items,
            copy.bytes / 1e6,
            copy_seconds,
            info.high_seqno,
        )
        high, rounds = info.high_seqno, 0
        while rounds < MAX_CATCHUP_ROUNDS:
            rounds += 1
            high, source_high, _n = await self._read_apply(conn, engine, info, high, None)
            if source_high - high <= msg.lag_target:
                break
        return MigrateInReply(
            high_seqno=high,
            uuid=info.uuid,
            bytes=copy.bytes,
            items=copy.items,
            docs=opened.info.doc_count,
            copy_seconds=copy_seconds,
            catchup_rounds=rounds,
        )

    async def _read_apply(
        self,
        conn: Connection,
        engine: DataEngine,
        info: PartitionInfo,
        after: int,
        until: int | None,
    ) -> tuple[int, int, int]:
        """One change read from the source applied here; (new high, source high, applied)."""
        req = ReadChanges(
            keyspace=info.keyspace,
            partition=info.partition,
            after=after,
            uuid=info.uuid,
            until=until,
        )
        reply = await conn.request(req, PULL_TIMEOUT, expect=ReadChangesReply)
        changes = [Change(info.partition, *c) for c in reply.changes]
        high = await self._run(
            engine.apply_changes,
            info.keyspace,
            info.partition,
            changes,
            failover_log=reply.failover_log or None,
        )
        return high, reply.high_seqno, len(changes)

    # --- the rest of the hand-over -------------------------------------------------------------

    async def on_catch_up(self, msg: CatchUp, conn: Connection) -> CatchUpReply:
        engine = await self._fence(msg.epoch)
        info = engine.partition_info(msg.keyspace, msg.partition)
        marker = engine.incoming().get((msg.keyspace, msg.partition))
        if marker is None or marker.migration_id != msg.migration_id:
            raise ShardexError(
                f"no incoming copy of migration {msg.migration_id} here",
                code=ErrorCode.STALE_TOPOLOGY,
                details={"keyspace": msg.keyspace, "partition": msg.partition},
            )
        source = await self._pool.get(msg.source_address, PULL_TIMEOUT)
        high, applied = info.high_seqno, 0
        while high < msg.until:
            high, _src, n = await self._read_apply(source, engine, info, high, msg.until)
            applied += n
            if n == 0 and high < msg.until:
                raise ShardexError(
                    f"source has no changes between {high} and {msg.until}",
                    code=ErrorCode.INTERNAL,
                    details={"high": high, "until": msg.until},
                )
        return CatchUpReply(high_seqno=high, applied=applied)

    async def on_activate(self, msg: ActivateIncoming, conn: Connection) -> Outcome:
        engine = await self._fence(msg.epoch)
        async with self._lock:
            info = engine.partition_info(msg.keyspace, msg.partition)
            if info.high_seqno != msg.high_seqno:
                raise ShardexError(
                    f"incoming copy is at seqno {info.high_seqno}, not {msg.high_seqno}",
                    code=ErrorCode.STALE_TOPOLOGY,
                    details={"high_seqno": info.high_seqno, "expected": msg.high_seqno},
                )
            if info.state == STATE_PENDING:
                info = await self._run(engine.activate_partition, msg.keyspace, msg.partition)
        return Outcome(state=info.state, high_seqno=info.high_seqno)

    async def on_abort(self, msg: AbortIncoming, conn: Connection) -> Outcome:
        engine = await self._fence(msg.epoch)
        key = (msg.keyspace, msg.partition)
        running = self._incoming.get(key)
        if running is not None and running.migration_id == msg.migration_id:
            del self._incoming[key]
            running.task.cancel()
            await asyncio.gather(running.task, return_exceptions=True)
        async with self._lock:
            state = await self._run(reconcile.drop_incoming, engine, key, msg.migration_id)
        return Outcome(state=state)

    async def on_local_partitions(
        self, msg: LocalPartitions, conn: Connection
    ) -> LocalPartitionsReply:
        engine = self._engine()
        return LocalPartitionsReply(
            partitions=engine.local_partitions(msg.keyspace),
            incoming=[m for k, m in sorted(engine.incoming().items()) if k[0] == msg.keyspace],
            topology_floor=engine.topology_floor(msg.keyspace),
        )


def _prepare(engine: DataEngine, msg: MigrateIn, marker: IncomingMarker) -> None:
    """Make the keyspace exist here, clear a leftover of an earlier attempt, write the marker
    (before any byte of the copy, so a crash from here on leaves something reconcile sees)."""
    reconcile.open_partitions(
        engine, msg.keyspace, msg.keyspace_uuid, msg.created_cas, msg.num_partitions, []
    )
    state = engine.partition_state(msg.keyspace, msg.partition)
    if state == STATE_ACTIVE and engine.replicas.failed_over_mark() is not None:
        # This node was failed over and has not settled its recovery yet: its active copies
        # are stale by definition (the master moves a partition here only once the state
        # names another active), and the copy replaces it.
        log.info(
            "migration of %s/%d: dropping this failed-over node's stale active copy",
            msg.keyspace,
            msg.partition,
        )
        state = "stale"
    if state == STATE_ACTIVE:
        raise ShardexError(
            f"partition {msg.partition} of {msg.keyspace!r} is already active here",
            code=ErrorCode.BAD_REQUEST,
            details={"keyspace": msg.keyspace, "partition": msg.partition},
        )
    if state != "absent":
        engine.drop_partition(msg.keyspace, msg.partition)
    engine.set_incoming(marker)


async def pull_chunks(
    conn: Connection, session: int, copy: IncomingCopy, run: RunInExecutor, rate: int, chunk: int
) -> None:
    """Chunks of copy session ``session`` into ``copy`` until done; chunk k+1 is on the wire
    while chunk k is written. ``rate``: at most that many bytes/s on average (0: no limit)."""
    loop = asyncio.get_running_loop()
    started = loop.time()

    def ask() -> asyncio.Task[CopyChunkReply]:
        req = CopyChunk(session=session, max_bytes=chunk)
        return loop.create_task(conn.request(req, PULL_TIMEOUT, expect=CopyChunkReply))

    nxt = ask()
    try:
        while True:
            reply = await nxt
            if not reply.done:
                nxt = ask()
            await run(copy.add, reply.items)
            if rate > 0:  # throttle: never ahead of rate bytes/s on average
                ahead = copy.bytes / rate - (loop.time() - started)
                if ahead > 0:
                    await asyncio.sleep(ahead)
            if reply.done:
                return
    finally:
        if not nxt.done():
            nxt.cancel()
            await asyncio.gather(nxt, return_exceptions=True)
