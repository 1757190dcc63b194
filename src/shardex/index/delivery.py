"""The index pipeline's side of an indexer: delivery, stabilise, publish, initial loads.

``IndexDelivery`` holds the handlers ``IndexService`` installs next to its DDL routes
(messages in ``shardex.api.delivery``; protocol in
``docs/decisions/0029-index-pipeline-micro-batch.md``). Every handler makes **one** engine
call through the engine's I/O thread
(``EngineHost.run``), so it is atomic with respect to the DDL calls (allocate, drop) and to
the other handlers.

* ``DeliverKeyVersions`` -> ``IndexerEngine.enqueue``: rows of a slice this node does not
  host (dropped meanwhile, another keyspace) are counted ``unknown``; re-deliveries
  ``dropped``. The reply names this process's ``incarnation``. One naming another
  incarnation (an early delivery continuing what a previous process held) is refused with
  ``STALE_DELIVERY``. ``drop_above`` (here and in ``DeliverAndStabilise``): queued versions
  of those data partitions above those seqnos are forgotten first, in the same engine call.
* ``DeliverAndStabilise``: both of the above in one engine call (the maintenance stream's
  one round trip per node and batch); only the batch's earlier frames, if any, can have
  gone to another incarnation (checked as for a stabilise).
* ``StabiliseSlices`` -> ``IndexerEngine.stabilise_many``: one atomic, synced write for every
  listed index. It is refused with ``STALE_DELIVERY`` when the pipeline delivered the batch to
  another incarnation (this process restarted since: the queue it filled is gone). Slices
  loading or needing a rebuild are acknowledged with their state, not stabilised; indexes
  without a local slice are ``missing``. Only the slices the round names (``slices``: the
  partitions its topology gives this node, and incoming move copies) are stabilised: a
  slice an index move switched away still sits here until its drop, and the round's rows
  for it went to the new owner only.
* ``PublishStability``: the stability TS per index, held in memory (a restart forgets it
  until the next publish). Monotonic: a TS the held one covers is ignored; any other TS
  replaces it (newer, or on a new history branch after a rollback).
* ``LoadBegin`` / ``LoadChunk`` / ``LoadFinish`` -> ``IndexerEngine.load_begin`` /
  ``load_chunk`` / ``load_finish`` (load sessions live in the engine, in memory). A
  ``LoadFinish`` naming another incarnation than this one is refused with
  ``STALE_DELIVERY``: the chunks it counts on died with the process that held them.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from typing import Any

from shardex.api.delivery import (
    DeliverAndStabilise,
    Delivered,
    DeliverKeyVersions,
    LoadBegin,
    LoadBegun,
    LoadChunk,
    LoadChunkAck,
    LoadFinish,
    LoadFinished,
    PublishStability,
    ReadSlice,
    RollbackSlices,
    SliceAck,
    SliceEntries,
    SlicesRolledBack,
    Stabilised,
    StabiliseSlices,
    StabilityPublished,
)
from shardex.api.index import SliceInfo
from shardex.core.spans import Span
from shardex.core.timestamp import Timestamp
from shardex.errors import ErrorCode, ShardexError
from shardex.index.engine import EnqueueResult, IndexerEngine, StabiliseManyResult
from shardex.index.engine_host import EngineHost
from shardex.net import Connection, RpcServer

__all__ = ["IndexDelivery", "describe_slices"]

log = logging.getLogger(__name__)


class IndexDelivery:
    """The pipeline's routes of one indexer node, over its engine (``host``).
    ``note_routed``: ``SliceMoves.note_routed``, told of the stabilise rounds that reached
    an incoming move copy."""

    def __init__(
        self,
        host: EngineHost,
        *,
        note_routed: Callable[[dict[str, list[int]], Timestamp], None],
    ) -> None:
        self.host = host
        self._note_routed = note_routed
        self.published: dict[str, Timestamp] = {}  # index id -> stability TS
        self._tasks: set[asyncio.Future[Any]] = set()  # work after a reply (``_background``)

    def _background(self, work: Awaitable[Any]) -> None:
        """Run ``work`` after the handler replied; a failure is logged (the work is an
        optimisation: a stabilise does it itself when it was not done)."""
        task = asyncio.ensure_future(work)
        self._tasks.add(task)

        def done(t: asyncio.Future[Any]) -> None:
            self._tasks.discard(t)
            if not t.cancelled() and t.exception() is not None:
                log.warning("indexer %s: deciding queued rows: %s", self.node, t.exception())

        task.add_done_callback(done)

    @property
    def node(self) -> str:
        return self.host.name

    def install(self, server: RpcServer) -> None:
        server.route(DeliverKeyVersions, self.on_deliver)
        server.route(StabiliseSlices, self.on_stabilise)
        server.route(DeliverAndStabilise, self.on_deliver_and_stabilise)
        server.route(PublishStability, self.on_publish)
        server.route(LoadBegin, self.on_load_begin)
        server.route(LoadChunk, self.on_load_chunk)
        server.route(LoadFinish, self.on_load_finish)
        server.route(ReadSlice, self.on_read)
        server.route(RollbackSlices, self.on_rollback)

    def forget(self, index_id: str) -> None:
        """The index's slices were dropped here."""
        self.published.pop(index_id, None)
        self.host.notify([index_id])

    def _engine(self) -> IndexerEngine:
        engine: Any = self.host.engine
        if not hasattr(engine, "stabilise_many"):
            raise ShardexError(
                f"the index engine of {self.node} does not take deliveries",
                code=ErrorCode.BAD_REQUEST,
                details={"node": self.node, "engine": type(engine).__name__},
            )
        result: IndexerEngine = engine
        return result

    def _check_incarnation(
        self, theirs: str, what: str, hint: str, details: dict[str, Any]
    ) -> None:
        mine = self.host.incarnation
        if theirs and theirs != mine:
            raise ShardexError(
                f"indexer {self.node} restarted: {what} was for incarnation {theirs}, this is "
                f"incarnation {mine}; the rows delivered to the old one are lost",
                code=ErrorCode.STALE_DELIVERY,
                details={
                    "node": self.node,
                    "incarnation": mine,
                    "expected": theirs,
                    **details,
                    "hint": hint,
                },
            )

    # --- maintenance stream ------------------------------------------------------------------

    async def on_deliver(self, msg: DeliverKeyVersions, conn: Connection) -> Delivered:
        self._check_incarnation(
            msg.incarnation,
            "the early delivery",
            "deliver the whole batch again",
            {"keyspace": msg.keyspace, "batch_id": msg.batch_id},
        )
        engine = self._engine()

        def run() -> EnqueueResult:
            _drop_queued(engine, msg.keyspace, msg.drop_above)
            return engine.enqueue(msg.rows, keyspace=msg.keyspace)

        res = await self.host.run(run)
        if res.accepted:
            # Decided after this reply, on the same I/O thread (so before a later stabilise
            # in the usual order; a stabilise that comes first decides them itself).
            self._background(self.host.run(engine.decide_pending))
        if res.unknown:
            log.info(
                "batch %d of %s: %d row(s) for slices not on %s",
                msg.batch_id,
                msg.keyspace,
                res.unknown,
                self.node,
            )
        return Delivered(
            node=self.node,
            incarnation=self.host.incarnation,
            accepted=res.accepted,
            dropped=res.dropped,
            unknown=res.unknown,
        )

    async def on_stabilise(self, msg: StabiliseSlices, conn: Connection) -> Stabilised:
        self._check_incarnation(
            msg.incarnation,
            "the stabilise's delivery",
            "re-deliver the batch from the indexer's applied TS, then stabilise again",
            {"keyspace": msg.keyspace, "index_ids": msg.index_ids[:20]},
        )
        engine = self._engine()
        ts = Timestamp.from_wire(msg.ts)

        def run() -> StabiliseManyResult:
            self._check_keyspace(engine, msg.keyspace, msg.index_ids)
            return engine.stabilise_many(msg.index_ids, ts, msg.slices)

        res = await self.host.run(run)
        return self._stabilised(msg.index_ids, msg.moving, ts, res, None)

    async def on_deliver_and_stabilise(
        self, msg: DeliverAndStabilise, conn: Connection
    ) -> Stabilised:
        """``on_deliver`` then ``on_stabilise`` in one engine call: the rows are queued by the
        process that stabilises them, so only the frames sent before (``incarnation``) can
        belong to a previous one."""
        self._check_incarnation(
            msg.incarnation,
            "the batch's earlier frames",
            "deliver the whole batch again, then stabilise",
            {"keyspace": msg.keyspace, "batch_id": msg.batch_id},
        )
        engine = self._engine()
        ts = Timestamp.from_wire(msg.ts)

        def run() -> tuple[EnqueueResult, StabiliseManyResult]:
            self._check_keyspace(engine, msg.keyspace, msg.index_ids)
            _drop_queued(engine, msg.keyspace, msg.drop_above)
            # Stabilised at once: decided by the stabilise, not ahead (``Slice.enqueue``).
            queued = engine.enqueue(msg.rows, keyspace=msg.keyspace, ahead=False)
            return queued, engine.stabilise_many(msg.index_ids, ts, msg.slices)

        queued, res = await self.host.run(run)
        if queued.unknown:
            log.info(
                "batch %d of %s: %d row(s) for slices not on %s",
                msg.batch_id,
                msg.keyspace,
                queued.unknown,
                self.node,
            )
        return self._stabilised(msg.index_ids, msg.moving, ts, res, queued)

    @staticmethod
    def _check_keyspace(engine: IndexerEngine, keyspace: str, index_ids: list[str]) -> None:
        for index_id in index_ids:
            for s in engine.slices(index_id):
                if s.definition.keyspace != keyspace:
                    raise ShardexError(
                        f"index {index_id} is in keyspace {s.definition.keyspace}, not {keyspace}",
                        code=ErrorCode.BAD_REQUEST,
                        details={"index": index_id, "keyspace": keyspace},
                    )

    def _stabilised(
        self,
        index_ids: list[str],
        moving: dict[str, list[int]],
        ts: Timestamp,
        res: StabiliseManyResult,
        queued: EnqueueResult | None,
    ) -> Stabilised:
        if moving:  # an index move's target: this batch reached its copy too
            self._note_routed(moving, ts)
        self.host.notify(index_ids)
        acks = [
            SliceAck(
                index_id=r.index_id,
                partition=r.partition,
                applied=dict(r.applied.to_wire()),
                items_count=r.items_count,
                state=r.state,
            )
            for r in res.slices
        ]
        q = queued if queued is not None else EnqueueResult()
        return Stabilised(
            node=self.node,
            incarnation=self.host.incarnation,
            acks=acks,
            missing=res.missing,
            accepted=q.accepted,
            dropped=q.dropped,
            unknown=q.unknown,
        )

    async def on_publish(self, msg: PublishStability, conn: Connection) -> StabilityPublished:
        engine = self.host.engine
        hosted = await self.host.run(lambda: {s.definition.id for s in engine.slices()})
        for index_id, wire in msg.stability.items():
            if index_id not in hosted:
                continue  # dropped here (or never here): nothing to serve scans of
            ts = Timestamp.from_wire(wire)
            held = self.published.get(index_id)
            if held is None or not held.covers(ts):
                self.published[index_id] = ts
                self.host.notify([index_id])
        return StabilityPublished(node=self.node)

    # --- initial builds ----------------------------------------------------------------------

    async def on_load_begin(self, msg: LoadBegin, conn: Connection) -> LoadBegun:
        engine = self._engine()
        ts0 = Timestamp.from_wire(msg.ts0)
        state = await self.host.run(lambda: engine.load_begin(msg.index_id, msg.partition, ts0))
        return LoadBegun(
            node=self.node, index_id=msg.index_id, partition=msg.partition, state=state
        )

    async def on_load_chunk(self, msg: LoadChunk, conn: Connection) -> LoadChunkAck:
        engine = self._engine()
        ts0 = Timestamp.from_wire(msg.ts0)
        rows = await self.host.run(
            lambda: engine.load_chunk(
                msg.index_id,
                msg.partition,
                ts0,
                msg.rows,
                msg.docs,
                columns=(msg.entries, msg.docids, msg.partitions, msg.seqnos),
            )
        )
        return LoadChunkAck(node=self.node, rows=rows, incarnation=self.host.incarnation)

    async def on_load_finish(self, msg: LoadFinish, conn: Connection) -> LoadFinished:
        self._check_incarnation(
            msg.incarnation,
            f"the load of slice {msg.index_id}/{msg.partition}",
            "restart the build: the slice needs a rebuild",
            {"index": msg.index_id, "partition": msg.partition},
        )
        engine = self._engine()
        ts0 = Timestamp.from_wire(msg.ts0)
        count = await self.host.run(lambda: engine.load_finish(msg.index_id, msg.partition, ts0))
        log.info("loaded slice %s/%d at %r: %d entries", msg.index_id, msg.partition, ts0, count)
        self.host.notify([msg.index_id])
        return LoadFinished(
            node=self.node, index_id=msg.index_id, partition=msg.partition, items_count=count
        )

    async def on_read(self, msg: ReadSlice, conn: Connection) -> SliceEntries:
        """A page of raw entries of one slice (tests and the oracle; scans go through
        ``scan_server``)."""
        engine = self._engine()
        ts = None if msg.snapshot_ts is None else Timestamp.from_wire(msg.snapshot_ts)
        limit = max(1, min(msg.limit, 100_000))
        spans = None if msg.after is None else [Span(low=msg.after, low_inclusive=False)]

        def run() -> list[bytes]:
            it = engine.scan(
                msg.index_id, msg.partition, spans, snapshot_ts=ts, limit=limit + 1, raw=True
            )
            return list(it)

        entries = await self.host.run(run)
        more = len(entries) > limit
        return SliceEntries(node=self.node, entries=entries[:limit], more=more)

    async def on_rollback(self, msg: RollbackSlices, conn: Connection) -> SlicesRolledBack:
        engine = self._engine()
        hit = await self.host.run(
            lambda: engine.rollback_to(msg.keyspace, msg.partition, msg.seqno)
        )
        pairs = [(s.definition.id, s.partition) for s in hit]
        self.host.notify(sorted({i for i, _ in pairs}))
        if pairs:
            log.warning(
                "data partition %d of %s rolled back to seqno %d: slices %s need a rebuild",
                msg.partition,
                msg.keyspace,
                msg.seqno,
                pairs,
            )
        return SlicesRolledBack(node=self.node, needs_rebuild=pairs)


def _drop_queued(engine: IndexerEngine, keyspace: str, drop: dict[int, int] | None) -> None:
    """``drop_above``: every local slice of ``keyspace`` forgets its queued versions of the
    named data partitions above the named seqnos (on the engine's I/O thread, before the
    message's own rows are queued)."""
    if not drop:
        return
    for s in engine.slices():
        if s.definition.keyspace == keyspace:
            for partition, seqno in drop.items():
                s.drop_queued_above(partition, seqno)


def describe_slices(
    engine: Any, index_id: str | None, published: Callable[[str], Timestamp | None]
) -> list[SliceInfo]:
    """``SliceInfo`` of every local slice (of one index). Run on the engine's I/O thread
    (it reads the mutation queues). Tolerates engines without the pipeline surface (the
    simulator's ``MemorySliceEngine``): their slices report state only."""
    out = []
    for s in engine.slices(index_id):
        d = s.definition
        applied = s.applied_ts() if hasattr(s, "applied_ts") else Timestamp()
        stable = published(d.id)
        session = None
        if hasattr(engine, "load_session"):
            session = engine.load_session(d.id, s.partition)
        out.append(
            SliceInfo(
                index_id=d.id,
                name=d.name,
                keyspace=d.keyspace,
                partition=s.partition,
                state=str(getattr(s, "state", "")),
                applied=dict(applied.to_wire()),
                stability=dict(stable.to_wire()) if stable is not None else None,
                items_count=getattr(s, "items_count", 0),
                queued=s.queued() if hasattr(s, "queued") else 0,
                load_rows=len(session.rows) if session is not None else 0,
                load_docs=session.docs if session is not None else 0,
            )
        )
    return out
