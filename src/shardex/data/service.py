"""The data service on a data node: the local ``DataEngine`` on the wire.

One engine per node in ``<data-dir>/data`` (RocksDB). Requests are routed here by clients from
their cached topology; this node answers only for the partitions it holds and says
NOT_MY_PARTITION (with an ``owner_hint`` from the manager state) for the others, so a client
with a stale topology refreshes and retries.

The engine is synchronous and a durable write waits for an fsync, so all disk work runs in a
dedicated thread pool (``io_threads``) and the event loop keeps serving heartbeats, reads and
streams meanwhile; with ``inline_io`` on the loop itself, as the simulator needs
(``engine_io.py``). Point reads run on the loop: a RocksDB get of a cached block costs less
than the hop to a thread. Single mutations and ``MutateMany`` batches go through group commit
(``groupcommit.py``).

Placement: the manager tells the owners to open a new keyspace's partitions
(``OpenPartitions``) and to drop a dropped one's (``DropKeyspaceData``). Because a node may be
down when that happens, the node also reconciles with the manager state at start, on every
state change it sees, and every ``reconcile_interval`` seconds: it opens the partitions the
latest topology assigns it (if they never lived elsewhere), settles migration leftovers
against the state's rebalance record, and drops keyspaces the state no longer has.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any, TypeVar

import shardex.data.reconcile as reconcile
import shardex.data.streams as streams
from shardex.api.data import (
    CancelStream,
    CheckHistory,
    Delete,
    DropKeyspaceData,
    Get,
    GetMany,
    GetManyReply,
    GetReply,
    HighSeqnos,
    HighSeqnosReply,
    HistoryChecked,
    HistoryPoint,
    Insert,
    ItemError,
    KeyspaceStats,
    KeyspaceStatsReply,
    MutateMany,
    MutateManyReply,
    MutationReply,
    OpenPartitions,
    OpenStream,
    PartitionStat,
    ReadRanges,
    Replace,
    StreamCredit,
    Upsert,
)
from shardex.api.errors import (
    BadRequest,
    DocNotFound,
    KeyspaceNotFound,
    WireError,
    not_my_partition,
)
from shardex.api.records import STATE_ACTIVE, MutationResult
from shardex.api.validation import (
    MAJORITY_LEVELS,
    check_durability_timeout,
    durability_level,
)
from shardex.data.engine import DataEngine
from shardex.data.engine_io import EngineIO
from shardex.data.groupcommit import GroupCommitter
from shardex.data.lease import ServingLease
from shardex.data.migration_source import MigrationSource
from shardex.data.migration_target import MigrationTarget
from shardex.data.placement import PlacementView, latest_topology
from shardex.data.range_reads import RangeReadServer
from shardex.data.replication import Replication
from shardex.data.streaming import StreamServer
from shardex.errors import ErrorCode, NodeUnavailable, ShardexError
from shardex.meta.member_list import MemberInfo
from shardex.meta.partitioning import partition_of
from shardex.meta.state import StateContext
from shardex.net import Connection, ConnectionPool, RpcServer
from shardex.net.messages import Message
from shardex.net.transport import Transport
from shardex.runtime.reconcile_loop import reconcile_forever

log = logging.getLogger(__name__)

T = TypeVar("T")

DEFAULT_IO_THREADS = 8
DEFAULT_RECONCILE_INTERVAL = 2.0
SYNC_INTERVAL = 1.0  # "memory" writes become power-loss safe within this long
PURGE_INTERVAL = 30.0  # the engine's retention rule runs this often
FAN_OUT_TIMEOUT = 5.0
FAN_OUT_ATTEMPTS = 4  # a partition in hand-over is missing for a moment: retry the gather
GET_MANY_MAX = 10_000  # docids per GetMany: bounds one reply's size
FIRST_RECONCILE_WAIT = 2.0  # seconds a restarted node's client requests wait to learn its role
GET_MANY_ON_LOOP = 32  # up to this many cached point reads cost less than a thread hop


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
        # Set when the cluster state says this node was failed over: it serves nothing (its
        # copies may hold writes the cluster never acknowledged) until recovered.
        self.failed_over = False

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
            Get: self._on_get,
            GetMany: self._on_get_many,
            MutateMany: self._on_mutate_many,
            KeyspaceStats: self._on_stats,
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
        server.router.route_inline(HighSeqnos, self._on_high_seqnos)
        server.router.route_inline(CheckHistory, self._on_check_history)
        for msg_type, inline in self.replication.inline_routes().items():
            server.router.route_inline(msg_type, inline)  # type: ignore[arg-type]
        # Single-document writes: a future settled by callbacks (group commit's, then the
        # durability wait's), answered without a task (``_mutate_now``).
        server.router.route_inline(Insert, self._on_insert)
        server.router.route_inline(Upsert, self._on_upsert)
        server.router.route_inline(Replace, self._on_replace)
        server.router.route_inline(Delete, self._on_delete)

    async def start(self) -> None:
        """Open the engine (in a thread: opening RocksDB with many families takes a while)
        and start reconciling; call before the node accepts requests."""
        self.io.start()
        self._engine = await self.io.run(self._open)
        self.committer = GroupCommitter(self._engine.mutate_many, self.io.run_direct)
        self.streams = StreamServer(self._engine, self.io.run, self._enrich)
        self.range_reads = RangeReadServer(
            self._engine, self.io.run, self._enrich, self._num_partitions
        )
        loop = asyncio.get_running_loop()
        self._tasks.append(loop.create_task(self._reconcile_loop(), name="data-reconcile"))
        self._tasks.append(loop.create_task(self.lease.watch(), name="data-lease"))
        self._tasks.append(loop.create_task(self._maintenance_loop(), name="data-maintenance"))
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

    # --- errors ------------------------------------------------------------------------------

    def _enrich(self, exc: ShardexError) -> ShardexError:
        """NOT_MY_PARTITION gets the owner the latest topology names (a hint: the client
        refreshes its topology anyway)."""
        if exc.code is ErrorCode.NOT_MY_PARTITION and "owner_hint" not in exc.details:
            ks, p = exc.details.get("keyspace"), exc.details.get("partition")
            if isinstance(ks, str) and isinstance(p, int):
                exc.details["owner_hint"] = self.placement.owner_hint(ks, p)
        return exc

    def _not_here(self, exc: KeyspaceNotFound, keyspace: str, docid: object) -> ShardexError:
        """The keyspace is unknown here; if the cluster has it, this node simply owns none
        of it (yet), which the client must hear as NOT_MY_PARTITION, not as "no keyspace"."""
        state = self.placement.cached
        meta = None if state is None else state.keyspaces.get(keyspace)
        if meta is None or not isinstance(docid, str) or not docid:
            return exc
        p = partition_of(docid, meta.num_partitions)
        return self._enrich(not_my_partition(keyspace, p, "absent"))

    # --- documents ---------------------------------------------------------------------------

    async def _await_serving(self, keyspace: str) -> None:
        """A restarted node learns whether it was failed over meanwhile from its first
        reconcile: client requests wait for it (bounded, so a node no manager answers
        still serves what it holds), then pass ``_check_serving``."""
        if not self.reconciled.is_set():
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(FIRST_RECONCILE_WAIT):
                    await self.reconciled.wait()
        self._check_serving()
        if self._replicated(keyspace) and not self.lease.check():
            raise ShardexError(
                f"node {self.name} cannot reach a majority of the managers: it does not serve "
                f"{keyspace!r}, whose partitions a failover may be moving to replicas",
                code=ErrorCode.NODE_UNAVAILABLE,
                details={"node": self.name, "keyspace": keyspace, "reason": "no_lease"},
            )

    def _replicated(self, keyspace: str) -> bool:
        state = self.placement.cached
        meta = None if state is None else state.keyspaces.get(keyspace)
        return meta is not None and meta.num_replicas > 0

    def _check_serving(self) -> None:
        if self.failed_over:
            raise ShardexError(
                f"node {self.name} was failed over: it serves nothing until recovered",
                code=ErrorCode.NODE_FAILED_OVER,
                details={
                    "node": self.name,
                    "hint": f"shardex recovery {self.name}, then shardex rebalance",
                },
            )

    async def _mutate(
        self,
        kind: str,
        keyspace: str,
        docid: str,
        doc: object,
        cas: int | None,
        durability: str,
        timeout: float | None = None,
    ) -> MutationReply:
        if self.committer is None:
            raise NodeUnavailable(f"the data service of {self.name} is not running")
        timeout = check_durability_timeout(timeout)
        await self._await_serving(keyspace)
        level = durability_level(durability)
        majority = level in MAJORITY_LEVELS
        try:
            if majority:
                self.replication.check_possible(
                    keyspace, self.engine.partition_for(keyspace, docid)
                )
            result = await self.committer.submit(keyspace, durability, (kind, docid, doc, cas))
            self.replication.wake(keyspace, result.partition)
            if majority:
                await self.replication.wait_durable(keyspace, result, level, docid, timeout)
        except KeyspaceNotFound as exc:
            raise self._not_here(exc, keyspace, docid) from None
        except ShardexError as exc:
            raise self._enrich(exc) from None
        return MutationReply(result=result)

    def _mutate_now(
        self,
        kind: str,
        keyspace: str,
        docid: str,
        doc: object,
        cas: int | None,
        durability: str,
        timeout: float | None,
    ) -> Awaitable[MutationReply]:
        """``_mutate`` without a task: in the receive callback (``Router.route_inline``), a
        future then settled by callbacks. A node not yet reconciled, or without its lease,
        takes ``_mutate`` (a coroutine: the connection runs it in a task), which waits or
        says why."""
        committer = self.committer
        if timeout is not None:  # not every client is ours: checked before anything
            timeout = check_durability_timeout(timeout)
        if committer is None or not self.reconciled.is_set():
            return self._mutate(kind, keyspace, docid, doc, cas, durability, timeout)
        self._check_serving()
        if self._replicated(keyspace) and not self.lease.check():
            return self._mutate(kind, keyspace, docid, doc, cas, durability, timeout)
        level = durability_level(durability)
        try:
            if level in MAJORITY_LEVELS:
                self.replication.check_possible(
                    keyspace, self.engine.partition_for(keyspace, docid)
                )
            written = committer.submit_now(keyspace, durability, (kind, docid, doc, cas))
        except KeyspaceNotFound as exc:
            raise self._not_here(exc, keyspace, docid) from None
        except ShardexError as exc:
            raise self._enrich(exc) from None
        out: asyncio.Future[MutationReply] = asyncio.get_running_loop().create_future()
        written.add_done_callback(
            functools.partial(self._written, out, keyspace, docid, level, timeout)
        )
        return out

    def _written(
        self,
        out: asyncio.Future[MutationReply],
        keyspace: str,
        docid: str,
        level: str,
        timeout: float | None,
        written: asyncio.Future[MutationResult],
    ) -> None:
        """``_mutate_now``'s write is committed (or failed): wake the senders, then wait
        for its durability, as ``_mutate`` does."""
        if written.cancelled() or written.exception() is not None:
            self._settle_write(out, keyspace, docid, None, written)
            return
        result = written.result()
        reply = MutationReply(result=result)
        then = functools.partial(self._settle_write, out, keyspace, docid, reply)
        try:
            self.replication.wake(keyspace, result.partition)
            if self.replication.on_durable(keyspace, result, level, docid, then, timeout):
                return
        except Exception as exc:  # answered as the coroutine's would be, never left hanging
            self._settle_write(out, keyspace, docid, None, exc)
            return
        then(None)

    def _settle_write(
        self,
        out: asyncio.Future[MutationReply],
        keyspace: str,
        docid: str,
        reply: MutationReply | None,
        error: BaseException | asyncio.Future[Any] | None,
    ) -> None:
        """``out`` gets ``reply``, or ``error`` (an exception, or a failed future's) as
        ``_mutate`` raises it."""
        if isinstance(error, asyncio.Future):
            error = asyncio.CancelledError() if error.cancelled() else error.exception()
        if out.done():
            return
        if error is None:
            out.set_result(reply)  # type: ignore[arg-type]  # None only with an error
        elif isinstance(error, asyncio.CancelledError):
            out.cancel()
        elif isinstance(error, KeyspaceNotFound):
            out.set_exception(self._not_here(error, keyspace, docid))
        elif isinstance(error, ShardexError):
            out.set_exception(self._enrich(error))
        else:
            out.set_exception(error)

    def _on_insert(self, msg: Insert, conn: Connection) -> Awaitable[MutationReply]:
        return self._mutate_now(
            "insert",
            msg.keyspace,
            msg.docid,
            msg.doc,
            None,
            msg.durability,
            msg.durability_timeout,
        )

    def _on_upsert(self, msg: Upsert, conn: Connection) -> Awaitable[MutationReply]:
        return self._mutate_now(
            "upsert",
            msg.keyspace,
            msg.docid,
            msg.doc,
            msg.cas,
            msg.durability,
            msg.durability_timeout,
        )

    def _on_replace(self, msg: Replace, conn: Connection) -> Awaitable[MutationReply]:
        return self._mutate_now(
            "replace",
            msg.keyspace,
            msg.docid,
            msg.doc,
            msg.cas,
            msg.durability,
            msg.durability_timeout,
        )

    def _on_delete(self, msg: Delete, conn: Connection) -> Awaitable[MutationReply]:
        return self._mutate_now(
            "delete",
            msg.keyspace,
            msg.docid,
            None,
            msg.cas,
            msg.durability,
            msg.durability_timeout,
        )

    async def _on_get(self, msg: Get, conn: Connection) -> GetReply:
        if msg.replica:  # availability over freshness: no lease needed
            self._check_serving()
            return self._replica_get(msg)
        await self._await_serving(msg.keyspace)
        try:
            if self.replication.has_pending():
                p = self.engine.partition_for(msg.keyspace, msg.docid)
                await self.replication.wait_readable(msg.keyspace, p, msg.docid)
                # it waited: the node may have been failed over or lost its lease meanwhile
                await self._await_serving(msg.keyspace)
            raw = self.engine.get_raw(msg.keyspace, msg.docid)
        except KeyspaceNotFound as exc:
            raise self._not_here(exc, msg.keyspace, msg.docid) from None
        except ShardexError as exc:
            raise self._enrich(exc) from None
        return GetReply(body=raw.body, cas=raw.cas, seqno=raw.seqno)

    def _replica_get(self, msg: Get) -> GetReply:
        """A read of whatever copy is here, active or replica: possibly stale."""
        try:
            got = self.engine.replicas.get_raw(msg.keyspace, msg.docid)
        except KeyspaceNotFound as exc:
            raise self._not_here(exc, msg.keyspace, msg.docid) from None
        except ShardexError as exc:
            raise self._enrich(exc) from None
        if got is None:
            raise DocNotFound(
                f"document {msg.docid!r} not found on {self.name}'s copy",
                details={"docid": msg.docid, "node": self.name},
            )
        return GetReply(body=got[0], cas=got[1], seqno=got[2])

    async def _on_get_many(self, msg: GetMany, conn: Connection) -> GetManyReply:
        return await self.get_many_local(msg)

    async def get_many_local(self, msg: GetMany) -> GetManyReply:
        """A ``GetMany`` answered in-process: this node's own SQL fetches call it directly."""
        await self._await_serving(msg.keyspace)
        if len(msg.docids) > GET_MANY_MAX:
            raise BadRequest(
                f"GetMany asks for {len(msg.docids)} documents, more than {GET_MANY_MAX}",
                details={"value": len(msg.docids), "hint": f"split into <= {GET_MANY_MAX}"},
            )
        engine = self.engine
        if len(msg.docids) <= GET_MANY_ON_LOOP:
            bodies, cas, errs = self._read_many(engine, msg.keyspace, msg.docids)
        else:  # a long read would hold the loop (heartbeats, other requests)
            bodies, cas, errs = await self.io.run(self._read_many, engine, msg.keyspace, msg.docids)
        errors = [ItemError(i, WireError(*self._enrich(e).to_wire())) for i, e in errs]
        return GetManyReply(bodies=bodies, errors=errors, cas=cas if msg.with_cas else [])

    def _read_many(
        self, engine: DataEngine, keyspace: str, docids: list[str]
    ) -> tuple[list[bytes | None], list[int], list[tuple[int, ShardexError]]]:
        """Every docid's stored body (None when absent or deleted) and CAS (0 then) in one
        pass over the engine; per-item errors (NOT_MY_PARTITION, a bad docid) beside them."""
        bodies: list[bytes | None] = []
        cas: list[int] = []
        errors: list[tuple[int, ShardexError]] = []
        for i, docid in enumerate(docids):
            try:
                raw = engine.get_raw(keyspace, docid)
                bodies.append(raw.body)
                cas.append(raw.cas)
                continue
            except DocNotFound:
                pass
            except KeyspaceNotFound as exc:
                err = self._not_here(exc, keyspace, docid)
                if err is exc:
                    raise  # the cluster has no such keyspace: the whole request fails
                errors.append((i, err))
            except ShardexError as exc:
                errors.append((i, exc))
            bodies.append(None)
            cas.append(0)
        return bodies, cas, errors

    async def _on_mutate_many(self, msg: MutateMany, conn: Connection) -> MutateManyReply:
        if self.committer is None:
            raise NodeUnavailable(f"the data service of {self.name} is not running")
        await self._await_serving(msg.keyspace)
        ops = [(o.kind, o.docid, o.doc, o.cas) for o in msg.ops]
        level = durability_level(msg.durability)
        timeout = check_durability_timeout(msg.durability_timeout)
        majority = level in MAJORITY_LEVELS
        try:
            if majority:
                for o in msg.ops:
                    p = self.engine.partition_for(msg.keyspace, o.docid)
                    self.replication.check_possible(msg.keyspace, p)
            # Through group commit like single writes: concurrent batches (the bulk writers of
            # several clients, each batch split over the nodes) share one RocksDB write and
            # one fsync instead of queueing on partition locks for one fsync each.
            out: list[Any] = await self.committer.submit_many(msg.keyspace, msg.durability, ops)
            for p in {r.partition for r in out if isinstance(r, MutationResult)}:
                self.replication.wake(msg.keyspace, p)
            if majority:
                out = await self._wait_many(msg.keyspace, level, msg.ops, out, timeout)
        except KeyspaceNotFound as exc:
            errs = [self._not_here(exc, msg.keyspace, o.docid) for o in msg.ops]
            if not msg.ops or any(e is exc for e in errs):
                raise exc from None
            out = errs
        results: list[MutationResult | None] = []
        errors: list[ItemError] = []
        for i, r in enumerate(out):
            if isinstance(r, ShardexError):
                code, message, details = self._enrich(r).to_wire()
                errors.append(ItemError(i, WireError(code, message, details)))
                results.append(None)
            else:
                results.append(r)
        return MutateManyReply(results=results, errors=errors)

    async def _wait_many(
        self, keyspace: str, level: str, ops: list[Any], out: list[Any], timeout: float | None
    ) -> list[Any]:
        """Each committed op of a batch waits for its durability; a timeout is that op's
        DURABILITY_AMBIGUOUS, the others keep their results."""

        async def one(op: Any, r: Any) -> Any:
            if isinstance(r, ShardexError):
                return r
            try:
                await self.replication.wait_durable(keyspace, r, level, op.docid, timeout)
            except ShardexError as exc:
                return exc
            return r

        return list(await asyncio.gather(*(one(o, r) for o, r in zip(ops, out, strict=True))))

    # --- high seqnos and stats: answered by any node, gathered from the owners ----------------

    def local_high_seqnos(self, keyspace: str, partitions: list[int]) -> dict[int, tuple[int, int]]:
        """(high seqno, uuid) of those of ``partitions`` this node serves, from memory (the
        partitions' metadata): a request_plus scan asks it of every owner, and its own
        node's scan coordinator calls it in-process."""
        try:
            return self.engine.partition_seqnos(keyspace, partitions)
        except KeyspaceNotFound:
            if self.placement.keyspace_exists(keyspace):
                return {}
            raise

    def _local_stats(self, keyspace: str, partitions: list[int]) -> list[PartitionStat]:
        eng = self.engine
        try:
            held = set(eng.partitions(keyspace))
        except KeyspaceNotFound:
            if self.placement.keyspace_exists(keyspace):
                return []
            raise
        out = []
        for p in sorted(held & set(partitions)):
            info = eng.partition_info(keyspace, p)
            if info.state == STATE_ACTIVE:
                out.append(
                    PartitionStat(
                        p, self.name, info.doc_count, info.high_seqno, info.uuid, info.state
                    )
                )
        return out

    def _on_high_seqnos(
        self, msg: HighSeqnos, conn: Connection
    ) -> HighSeqnosReply | Awaitable[HighSeqnosReply]:
        if msg.partitions is not None:  # an owner's share: from memory, answered inline
            return HighSeqnosReply(entries=self.local_high_seqnos(msg.keyspace, msg.partitions))
        return self._gather_high_seqnos(msg)  # every partition: gathered, in a task

    def _on_check_history(self, msg: CheckHistory, conn: Connection) -> HistoryChecked:
        """Each point against its partition's failover log, from memory (``CheckHistory``);
        NOT_MY_PARTITION for a partition this node does not hold active."""
        self._check_serving()
        out = []
        for p, seqno, uuid in msg.points:
            try:
                info = self.engine.partition_info(msg.keyspace, p)
            except ShardexError as exc:
                raise self._enrich(exc) from None
            if info.state != STATE_ACTIVE:
                raise self._enrich(not_my_partition(msg.keyspace, p, info.state))
            # A token of the current branch is in its history whatever its seqno (one above
            # the high seqno is a write not made yet, or a bogus token: the wait says so).
            rollback = None if uuid == info.uuid else streams.rollback_seqno(info, seqno, uuid)
            out.append(HistoryPoint(p, rollback, info.uuid, info.high_seqno))
        return HistoryChecked(points=out)

    async def _gather_high_seqnos(self, msg: HighSeqnos) -> HighSeqnosReply:
        async def remote(address: str, parts: list[int]) -> dict[int, tuple[int, int]]:
            req = HighSeqnos(keyspace=msg.keyspace, partitions=parts)
            reply = await self.pool.request(address, req, FAN_OUT_TIMEOUT, expect=HighSeqnosReply)
            return reply.entries

        entries = await self._gather(msg.keyspace, self.local_high_seqnos, remote)
        return HighSeqnosReply(entries=entries)

    async def _on_stats(self, msg: KeyspaceStats, conn: Connection) -> KeyspaceStatsReply:
        if msg.partitions is not None:
            return KeyspaceStatsReply(partitions=self._local_stats(msg.keyspace, msg.partitions))

        def local(keyspace: str, parts: list[int]) -> dict[int, PartitionStat]:
            return {s.partition: s for s in self._local_stats(keyspace, parts)}

        async def remote(address: str, parts: list[int]) -> dict[int, PartitionStat]:
            req = KeyspaceStats(keyspace=msg.keyspace, partitions=parts)
            reply = await self.pool.request(
                address, req, FAN_OUT_TIMEOUT, expect=KeyspaceStatsReply
            )
            return {s.partition: s for s in reply.partitions}

        stats = await self._gather(msg.keyspace, local, remote)
        return KeyspaceStatsReply(partitions=[stats[p] for p in sorted(stats)])

    async def _gather(
        self,
        keyspace: str,
        local: Callable[[str, list[int]], dict[int, T]],
        remote: Callable[[str, list[int]], Awaitable[dict[int, T]]],
    ) -> dict[int, T]:
        """Ask every owner (in parallel) for its partitions of ``keyspace``; retry the
        partitions nobody answered for (a hand-over in flight) with a refreshed state."""
        state = await self.placement.state()
        if keyspace not in state.keyspaces:
            state = await self.placement.refresh()
        meta = state.keyspaces.get(keyspace)
        topo = latest_topology(state, keyspace)
        if meta is None or topo is None:
            raise KeyspaceNotFound(
                f"keyspace {keyspace!r} not found", details={"keyspace": keyspace}
            )
        out: dict[int, T] = {}
        failures: dict[str, str] = {}
        for attempt in range(FAN_OUT_ATTEMPTS):
            missing = [p for p in range(meta.num_partitions) if p not in out]
            by_owner: dict[str, list[int]] = {}
            for p in missing:
                by_owner.setdefault(topo.assignment.get(p, self.name), []).append(p)
            owners = sorted(by_owner)
            calls = [self._ask(keyspace, o, by_owner[o], local, remote) for o in owners]
            failures = {}
            for owner, res in zip(
                owners, await asyncio.gather(*calls, return_exceptions=True), strict=True
            ):
                if isinstance(res, BaseException):
                    failures[owner] = str(res)
                else:
                    out.update(res)
            if len(out) == meta.num_partitions:
                return out
            await asyncio.sleep(0.05 * 2**attempt)
            state = await self.placement.refresh()
            topo = latest_topology(state, keyspace) or topo
        missing = [p for p in range(meta.num_partitions) if p not in out]
        raise ShardexError(
            f"no owner answered for {len(missing)} partition(s) of {keyspace!r}",
            code=ErrorCode.NODE_UNAVAILABLE if failures else ErrorCode.NOT_MY_PARTITION,
            details={"keyspace": keyspace, "partitions": missing[:50], "failures": failures},
        )

    async def _ask(
        self,
        keyspace: str,
        owner: str,
        parts: list[int],
        local: Callable[[str, list[int]], dict[int, T]],
        remote: Callable[[str, list[int]], Awaitable[dict[int, T]]],
    ) -> dict[int, T]:
        if owner == self.name:
            return local(keyspace, parts)
        return await remote(self.placement.address(owner), parts)

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
            if not self.failed_over:
                log.warning(
                    "this node was failed over (state cas %d): serving nothing until it is "
                    "recovered (shardex recovery %s)",
                    state.cas,
                    self.name,
                )
            self.failed_over = True
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
        self.failed_over = mark is not None and state.cas <= mark

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
