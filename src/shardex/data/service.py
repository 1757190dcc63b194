"""The data service on a data node: the local ``DataEngine`` on the wire.

One engine per node in ``<data-dir>/data`` (RocksDB). Requests are routed here by clients from
their cached topology; this node answers only for the partitions it holds and says
NOT_MY_PARTITION (with an ``owner_hint`` from the manager state) for the others, so a client
with a stale topology refreshes and retries (``serving.py``).

The engine is synchronous and a durable write waits for an fsync, so all disk work runs in a
dedicated thread pool (``io_threads``) and the event loop keeps serving heartbeats, reads and
streams meanwhile; with ``inline_io`` on the loop itself, as the simulator needs
(``engine_io.py``). This module holds the service's lifecycle, its routes and placement; the
handlers live beside it, one job each: writes through group commit (``writes.py``), point and
batch reads (``reads.py``), deleting expired documents (``expiry_pager.py``), high seqnos,
history checks and stats gathered from the owners (``gather.py``), replication
(``replication.py``), migration (``migration_source.py``, ``migration_target.py``), change
streams (``streaming.py``) and range reads (``range_reads.py``).

Placement: the manager tells the owners to open a new keyspace's partitions
(``OpenPartitions``) and to drop a dropped one's (``DropKeyspaceData``). Because a node may be
down when that happens, the node also reconciles with the manager state at start, on every
state change it sees, and every ``reconcile_interval`` seconds: it opens the partitions the
latest topology assigns it (if they never lived elsewhere), settles migration leftovers
against the state's rebalance record, and drops keyspaces the state no longer has.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import shardex.data.reconcile as reconcile
from shardex.api.data import (
    CancelStream,
    CheckHistory,
    Delete,
    DropKeyspaceData,
    Get,
    GetAndTouch,
    GetMany,
    GetManyReply,
    HighSeqnos,
    Insert,
    KeyspaceStats,
    MutateMany,
    OpenPartitions,
    OpenStream,
    ReadRanges,
    Replace,
    StreamCredit,
    Touch,
    Upsert,
)
from shardex.data.engine import DataEngine
from shardex.data.engine_io import EngineIO
from shardex.data.expiry import DEFAULT_WALK_LIMIT
from shardex.data.expiry_pager import DEFAULT_PAGER_INTERVAL, ExpiryPager
from shardex.data.gather import OwnerGather
from shardex.data.groupcommit import GroupCommitter
from shardex.data.lease import ServingLease
from shardex.data.migration_source import MigrationSource
from shardex.data.migration_target import MigrationTarget
from shardex.data.placement import PlacementView
from shardex.data.range_reads import RangeReadServer
from shardex.data.reads import ReadPath
from shardex.data.replication import Replication
from shardex.data.serving import ServingGate
from shardex.data.streaming import StreamServer
from shardex.data.writes import WritePath
from shardex.errors import NodeUnavailable
from shardex.meta.member_list import MemberInfo
from shardex.meta.state import StateContext
from shardex.net import Connection, ConnectionPool, RpcServer
from shardex.net.messages import Message
from shardex.net.transport import Transport
from shardex.runtime.reconcile_loop import reconcile_forever

log = logging.getLogger(__name__)

DEFAULT_IO_THREADS = 8
DEFAULT_RECONCILE_INTERVAL = 2.0
SYNC_INTERVAL = 1.0  # "memory" writes become power-loss safe within this long
PURGE_INTERVAL = 30.0  # the engine's retention rule runs this often


class DataService:
    """Routes of the data service plus placement reconciliation (see module docstring)."""

    def __init__(
        self,
        *,
        data_dir: Path,
        node_name: str,
        transport: Transport,
        secret: str,
        coordinator: Callable[[], Any | None] = lambda: None,
        members: Callable[[], list[MemberInfo]] = list,
        io_threads: int = DEFAULT_IO_THREADS,
        reconcile_interval: float = DEFAULT_RECONCILE_INTERVAL,
        inline_io: bool = False,
        open_engine: Callable[[Path], DataEngine] | None = None,
        lease: Callable[[], bool] | None = None,
        expiry_pager_interval: float = DEFAULT_PAGER_INTERVAL,
        expiry_pager_batch: int = DEFAULT_WALK_LIMIT,
    ) -> None:
        self.path = Path(data_dir) / "data"
        # How the engine opens at ``path``: RocksDB in the data directory when None; the
        # simulator's opens a memory store on the node's simulated disk, with its clock.
        self._open_engine = open_engine
        self.name = node_name
        self.reconcile_interval = reconcile_interval
        # Engine calls: in a pool of ``io_threads``, or on the loop with ``inline_io``.
        self.io = EngineIO(node_name, io_threads, inline=inline_io)
        self._engine: DataEngine | None = None
        self._coordinator = coordinator
        self.pool = ConnectionPool(transport, secret, name=f"{node_name}/data")
        self.placement = PlacementView(
            me=node_name, coordinator=coordinator, members=members, pool=self.pool
        )
        self.committer: GroupCommitter | None = None
        self.streams: StreamServer | None = None
        self.range_reads: RangeReadServer | None = None
        self._placement_lock = asyncio.Lock()
        self._reconcile_now = asyncio.Event()
        self._tasks: list[asyncio.Task[None]] = []
        self.reconciled = asyncio.Event()  # set after the first successful reconcile
        # Partition migration (source and target sides); see migration_source/_target.py.
        self.migration_source = MigrationSource(lambda: self.engine, self.io.run)
        self.migration_target = MigrationTarget(
            lambda: self.engine, self.io.run, self.pool, self._placement_lock
        )
        self.replication = Replication(
            me=node_name,
            engine=lambda: self.engine,
            io=self.io,
            pool=self.pool,
            placement=self.placement,
            placement_lock=self._placement_lock,
        )
        # A majority of managers must hear this node for it to serve the copies of keyspaces
        # with replicas (the majority may be failing them over): ``lease.py``.
        self.lease = ServingLease(lease, self._reconcile_now.set)
        self.gate = ServingGate(
            name=node_name, placement=self.placement, lease=self.lease, reconciled=self.reconciled
        )
        self.writes = WritePath(
            engine=lambda: self.engine,
            committer=lambda: self.committer,
            replication=self.replication,
            gate=self.gate,
        )
        self.reads = ReadPath(
            engine=lambda: self.engine, io=self.io, replication=self.replication, gate=self.gate
        )
        self.gather = OwnerGather(
            engine=lambda: self.engine, placement=self.placement, pool=self.pool, gate=self.gate
        )
        # Deletes expired documents: those reads report, and a bounded walk per interval.
        self.expiry = ExpiryPager(
            engine=lambda: self.engine,
            io=self.io,
            replication=self.replication,
            gate=self.gate,
            interval=expiry_pager_interval,
            walk_limit=expiry_pager_batch,
        )

    @property
    def failed_over(self) -> bool:
        """The cluster state says this node was failed over: it serves nothing (its copies
        may hold writes the cluster never acknowledged) until recovered."""
        return self.gate.failed_over

    # --- lifecycle ---------------------------------------------------------------------------

    @property
    def engine(self) -> DataEngine:
        if self._engine is None:
            raise NodeUnavailable(
                f"the data service of {self.name} is not running", details={"node": self.name}
            )
        return self._engine

    def install(self, server: RpcServer) -> None:
        routes: dict[type[Message], Callable[[Any, Connection], Awaitable[Message | None]]] = {
            Get: self.reads.on_get,
            GetAndTouch: self.writes.on_get_and_touch,
            MutateMany: self.writes.on_mutate_many,
            KeyspaceStats: self.gather.on_stats,
            OpenPartitions: self._on_open_partitions,
            DropKeyspaceData: self._on_drop_keyspace,
            OpenStream: self._on_open_stream,
            StreamCredit: self._on_stream_credit,
            CancelStream: self._on_cancel_stream,
            ReadRanges: self._on_read_ranges,
        }
        routes.update(self.migration_source.routes())
        routes.update(self.migration_target.routes())
        routes.update(self.replication.routes())  # type: ignore[arg-type]
        for msg_type, handler in routes.items():
            server.route(msg_type, handler)
        # Every request_plus scan asks each data node it does not read: answered from memory
        # in the receive callback, no task (``Router.route_inline``).
        server.router.route_inline(HighSeqnos, self.gather.on_high_seqnos)
        server.router.route_inline(CheckHistory, self.gather.on_check_history)
        # Another node's SQL fetch: read in the receive callback when it is short and the
        # node serves (``ReadPath.on_get_many``), else in a task.
        server.router.route_inline(GetMany, self.reads.on_get_many)
        for msg_type, inline in self.replication.inline_routes().items():
            server.router.route_inline(msg_type, inline)  # type: ignore[arg-type]
        # Single-document writes: a future settled by callbacks (group commit's, then the
        # durability wait's), answered without a task (``WritePath.mutate_now``).
        server.router.route_inline(Insert, self.writes.on_insert)
        server.router.route_inline(Upsert, self.writes.on_upsert)
        server.router.route_inline(Replace, self.writes.on_replace)
        server.router.route_inline(Delete, self.writes.on_delete)
        server.router.route_inline(Touch, self.writes.on_touch)

    async def start(self) -> None:
        """Open the engine (in a thread: opening RocksDB with many families takes a while)
        and start reconciling; call before the node accepts requests."""
        self.io.start()
        self._engine = await self.io.run(self._open)
        self._engine.set_on_expired(self.expiry.on_expired)
        self.committer = GroupCommitter(self._engine.mutate_many, self.io.run_direct)
        self.streams = StreamServer(self._engine, self.io.run, self.gate.enrich)
        self.range_reads = RangeReadServer(
            self._engine, self.io.run, self.gate.enrich, self._num_partitions
        )
        loop = asyncio.get_running_loop()
        self._tasks.append(loop.create_task(self._reconcile_loop(), name="data-reconcile"))
        self._tasks.append(loop.create_task(self.lease.watch(), name="data-lease"))
        self._tasks.append(loop.create_task(self._maintenance_loop(), name="data-maintenance"))
        self._tasks.append(loop.create_task(self.expiry.run(), name="data-expiry-pager"))
        log.info("data service open at %s: %s", self.path, _summary(self._engine))

    async def stop(self) -> None:
        for t in self._tasks:
            t.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        self._tasks.clear()
        await self.replication.stop()
        await self.migration_target.close()
        await self.migration_source.close()
        if self.streams is not None:
            await self.streams.close()
        if self.committer is not None:
            await self.committer.close()
        await self.pool.close()
        engine, self._engine = self._engine, None
        await self.io.stop()
        if engine is not None:
            await self.io.run_last(engine.close)

    def _open(self) -> DataEngine:
        if self._open_engine is not None:
            return self._open_engine(self.path)  # makes no directory: its store may have none
        self.path.parent.mkdir(parents=True, exist_ok=True)
        return DataEngine(self.path)

    def state_changed(self) -> None:
        """Hook for the coordinator's ``on_change``: reconcile soon."""
        self._reconcile_now.set()

    # --- in-process calls: this node's own scans and SQL ------------------------------------

    def local_high_seqnos(self, keyspace: str, partitions: list[int]) -> dict[int, tuple[int, int]]:
        """This node's share of a request_plus scan's high seqnos (``OwnerGather``)."""
        return self.gather.local_high_seqnos(keyspace, partitions)

    async def get_many_local(self, msg: GetMany) -> GetManyReply:
        """A ``GetMany`` answered in-process (``ReadPath``)."""
        return await self.reads.get_many_local(msg)

    def get_many_now(self, msg: GetMany) -> GetManyReply | None:
        """``get_many_local`` without waiting, or None (``ReadPath.get_many_now``)."""
        return self.reads.get_many_now(msg)

    # --- placement -----------------------------------------------------------------------------

    async def _on_open_partitions(self, msg: OpenPartitions, conn: Connection) -> None:
        async with self._placement_lock:
            await self.io.run(
                reconcile.open_partitions,
                self.engine,
                msg.keyspace,
                msg.uuid,
                msg.created_cas,
                msg.num_partitions,
                msg.partitions,
                msg.replicas,
                msg.max_ttl,
            )

    async def _on_drop_keyspace(self, msg: DropKeyspaceData, conn: Connection) -> None:
        async with self._placement_lock:
            await self.io.run(reconcile.drop_incarnation, self.engine, msg.keyspace, msg.uuid)

    async def reconcile(self) -> None:
        """Bring local placement in line with the manager state (``reconcile.py``), then
        the replication it implies (``replication.py``)."""
        fetched_at = asyncio.get_running_loop().time()
        # Back from a lapse of the lease (a partition): the local replica of the state may
        # predate a failover of this very node, so read what a majority of managers hold.
        lapsed = self.lease.lapsed
        state = await (self.placement.quorum_state() if lapsed else self.placement.refresh())
        await self._settle_failover(state)
        async with self._placement_lock:
            await self.io.run(reconcile.reconcile, self.engine, self.name, state)
        await self.replication.refresh(state)
        self.reconciled.set()  # whoever ran it (the loop, a test): the node knows its role
        self.lease.reconciled(fetched_at)

    async def _settle_failover(self, state: StateContext) -> None:
        """Serve nothing while the state says this node is failed over (remembered on disk);
        once a newer state says it is recovered, settle its stale copies first."""
        engine = self.engine
        mark = engine.replicas.failed_over_mark()
        if self.name in state.failed_over:
            if not self.gate.failed_over:
                log.warning(
                    "this node was failed over (state cas %d): serving nothing until it is "
                    "recovered (shardex recovery %s)",
                    state.cas,
                    self.name,
                )
            self.gate.failed_over = True
            if mark is None:
                await self.io.run(
                    engine.replicas.set_failed_over_mark, state.failed_over[self.name]
                )
            return
        if (
            mark is None
            and self.name in state.recovering
            and await self.io.run(reconcile.holds_stale_actives, engine, self.name, state)
        ):
            # Failed over while it was down and recovered before it heard of it: its
            # active copies are as stale as if it had, and are settled the same way.
            mark = 0
        if mark is not None and state.cas > mark:
            kind = state.recovering.get(self.name, "full")
            log.warning("recovered after a failover (%s): settling stale copies", kind)
            async with self._placement_lock:
                await self.io.run(reconcile.recover_copies, engine, self.name, state, kind)
            await self.io.run(engine.replicas.set_failed_over_mark, None)
        self.gate.failed_over = mark is not None and state.cas <= mark

    async def _maintenance_loop(self) -> None:
        """Periodic engine housekeeping: a WAL sync (clears the dirty marks of "memory"
        writes) every ``SYNC_INTERVAL``, the retention purge every ``PURGE_INTERVAL``."""
        loop = asyncio.get_running_loop()
        next_purge = loop.time() + PURGE_INTERVAL
        while True:
            await asyncio.sleep(SYNC_INTERVAL)
            try:
                if self.engine.has_unsynced:
                    await self.io.run(self.engine.sync, keep_busy_marks=True)
                if loop.time() >= next_purge:
                    next_purge = loop.time() + PURGE_INTERVAL
                    purged = await self.io.run(self.engine.purge)
                    if purged:
                        log.info("retention purged %d change records", sum(purged.values()))
            except Exception:
                log.exception("data maintenance failed")

    async def _reconcile_loop(self) -> None:
        coord = self._coordinator()
        if coord is not None:
            coord.on_change(lambda *_args: self.state_changed())
        await reconcile_forever(
            self.reconcile,
            wake=self._reconcile_now,
            ready=self.reconciled,
            interval=self.reconcile_interval,
            what="data",
        )

    # --- streams --------------------------------------------------------------------------------

    async def _on_open_stream(self, msg: OpenStream, conn: Connection) -> Message:
        if self.streams is None:
            raise NodeUnavailable(f"the data service of {self.name} is not running")
        return await self.streams.on_open(msg, conn)

    async def _on_stream_credit(self, msg: StreamCredit, conn: Connection) -> None:
        if self.streams is not None:
            await self.streams.on_credit(msg, conn)

    async def _on_cancel_stream(self, msg: CancelStream, conn: Connection) -> None:
        if self.streams is not None:
            await self.streams.on_cancel(msg, conn)

    def _num_partitions(self, keyspace: str) -> int | None:
        """The keyspace's partition count in the cached cluster state (None: no keyspace)."""
        state = self.placement.cached
        meta = None if state is None else state.keyspaces.get(keyspace)
        return None if meta is None else meta.num_partitions

    async def _on_read_ranges(self, msg: ReadRanges, conn: Connection) -> Message:
        if self.range_reads is None:
            raise NodeUnavailable(f"the data service of {self.name} is not running")
        return await self.range_reads.on_read(msg, conn)


def _summary(engine: DataEngine) -> str:
    parts = [f"{k.name} ({len(engine.partitions(k.name))} partitions)" for k in engine.keyspaces()]
    return ", ".join(parts) or "no keyspaces"
