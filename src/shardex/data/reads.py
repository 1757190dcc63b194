"""The data service's read path: ``Get`` and ``GetMany``.

Point reads run on the event loop: a RocksDB get of a cached block costs less than the hop
to a thread. A long ``GetMany`` goes to the engine's threads (``engine_io.py``) so it never
holds the loop (heartbeats, other requests). A read waits for a partition still being
handed over here (``Replication.wait_readable``); a replica read (``replica=True``) serves
whatever copy is here, possibly stale, with no lease needed.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Coroutine
from typing import Any

from shardex.api.data import Get, GetMany, GetManyReply, GetReply, ItemError
from shardex.api.errors import BadRequest, DocNotFound, KeyspaceNotFound, WireError
from shardex.data.engine import DataEngine
from shardex.data.engine_io import EngineIO
from shardex.data.replication import Replication
from shardex.data.serving import ServingGate
from shardex.errors import ShardexError
from shardex.net import Connection
from shardex.runtime.latency import Latencies

GET_MANY_MAX = 10_000  # docids per GetMany: bounds one reply's size
GET_MANY_ON_LOOP = 32  # up to this many cached point reads cost less than a thread hop


class ReadPath:
    """Handlers of Get and GetMany (module docstring)."""

    def __init__(
        self,
        *,
        engine: Callable[[], DataEngine],
        io: EngineIO,
        replication: Replication,
        gate: ServingGate,
    ) -> None:
        self._engine = engine  # a getter: the engine exists only while the service runs
        self.io = io
        self.replication = replication
        self.gate = gate
        # "get" / "get_many" -> latency of Get / GetMany requests (failures too, counted in
        # ``failed``), read by the node's metrics endpoint; observed on the loop thread only
        self.latencies: Latencies[str] = Latencies()
        self.failed: dict[str, int] = {}

    async def on_get(self, msg: Get, conn: Connection) -> GetReply:
        t0 = time.perf_counter()  # timed to its answer, failures too (``failed``)
        gate = self.gate
        try:
            if msg.replica:  # availability over freshness: no lease needed
                gate.check()
                reply = self._replica_get(msg)
            else:
                await gate.wait(msg.keyspace)
                try:
                    engine = self._engine()
                    if self.replication.has_pending():
                        p = engine.partition_for(msg.keyspace, msg.docid)
                        await self.replication.wait_readable(msg.keyspace, p, msg.docid)
                        # it waited: the node may have been failed over or lost its lease
                        await gate.wait(msg.keyspace)
                        engine = self._engine()
                    raw = engine.get_raw(msg.keyspace, msg.docid)
                except KeyspaceNotFound as exc:
                    raise gate.not_here(exc, msg.keyspace, msg.docid) from None
                except ShardexError as exc:
                    raise gate.enrich(exc) from None
                reply = GetReply(body=raw.body, cas=raw.cas, seqno=raw.seqno, expiry=raw.expiry)
        except BaseException:
            self.latencies.observe("get", time.perf_counter() - t0)
            self.failed["get"] = self.failed.get("get", 0) + 1
            raise
        self.latencies.observe("get", time.perf_counter() - t0)
        return reply

    def _replica_get(self, msg: Get) -> GetReply:
        """A read of whatever copy is here, active or replica: possibly stale."""
        try:
            got = self._engine().replicas.get_raw(msg.keyspace, msg.docid)
        except KeyspaceNotFound as exc:
            raise self.gate.not_here(exc, msg.keyspace, msg.docid) from None
        except ShardexError as exc:
            raise self.gate.enrich(exc) from None
        if got is None:
            raise DocNotFound(
                f"document {msg.docid!r} not found on {self.gate.name}'s copy",
                details={"docid": msg.docid, "node": self.gate.name},
            )
        return GetReply(body=got[0], cas=got[1], seqno=got[2], expiry=got[3])

    def on_get_many(
        self, msg: GetMany, conn: Connection
    ) -> GetManyReply | Coroutine[Any, Any, GetManyReply]:
        """Inline (``Router.route_inline``): the reply at once when ``get_many_now`` gives
        one, else the waiting path's coroutine."""
        t0 = time.perf_counter()
        try:
            reply = self.get_many_now(msg)
        except BaseException:
            self._observe_get_many(t0, True)
            raise
        if reply is None:
            return self._get_many_timed(msg, t0)
        self._observe_get_many(t0, False)
        return reply

    async def _get_many_timed(self, msg: GetMany, t0: float) -> GetManyReply:
        failed = True
        try:
            reply = await self.get_many_local(msg)
            failed = False
            return reply
        finally:
            self._observe_get_many(t0, failed)

    def _observe_get_many(self, t0: float, failed: bool) -> None:
        self.latencies.observe("get_many", time.perf_counter() - t0)
        if failed:
            self.failed["get_many"] = self.failed.get("get_many", 0) + 1

    async def get_many_local(self, msg: GetMany) -> GetManyReply:
        """A ``GetMany`` answered in-process: this node's own SQL fetches call it directly."""
        await self.gate.wait(msg.keyspace)
        if len(msg.docids) > GET_MANY_MAX:
            raise BadRequest(
                f"GetMany asks for {len(msg.docids)} documents, more than {GET_MANY_MAX}",
                details={"value": len(msg.docids), "hint": f"split into <= {GET_MANY_MAX}"},
            )
        engine = self._engine()
        waiting = self._pending_among(engine, msg.keyspace, msg.docids)
        if waiting:  # as ``on_get``: a document's pending durable write is waited for
            for partition, docid in waiting:
                await self.replication.wait_readable(msg.keyspace, partition, docid)
            # it waited: the node may have been failed over or lost its lease meanwhile
            await self.gate.wait(msg.keyspace)
            engine = self._engine()
        if len(msg.docids) <= GET_MANY_ON_LOOP:
            read = self._read_many(engine, msg.keyspace, msg.docids)
        else:  # a long read would hold the loop (heartbeats, other requests)
            read = await self.io.run(self._read_many, engine, msg.keyspace, msg.docids)
        return self._many_reply(msg, *read)

    def get_many_now(self, msg: GetMany) -> GetManyReply | None:
        """``get_many_local`` when it can answer without waiting (a short read on a node
        that serves): a point query's fetch on its own loop turn. None: take the awaited
        path. Raises what ``get_many_local`` would."""
        if len(msg.docids) > GET_MANY_ON_LOOP or not self.gate.serves_now(msg.keyspace):
            return None
        engine = self._engine()
        if self._pending_among(engine, msg.keyspace, msg.docids):
            return None  # a durable write to wait for first
        return self._many_reply(msg, *self._read_many(engine, msg.keyspace, msg.docids))

    def _pending_among(
        self, engine: DataEngine, keyspace: str, docids: list[str]
    ) -> list[tuple[int, str]]:
        """(partition, docid) of those of ``docids`` whose durable write waits on this node
        (none to look for, the common case, when no durable write waits at all)."""
        replication = self.replication
        if not replication.has_pending():
            return []
        out = []
        for docid in docids:
            try:
                partition = engine.partition_for(keyspace, docid)
            except ShardexError:
                continue  # the read reports it, per item
            if replication.pending(keyspace, partition, docid):
                out.append((partition, docid))
        return out

    def _many_reply(
        self,
        msg: GetMany,
        bodies: list[bytes | None],
        cas: list[int],
        errs: list[tuple[int, ShardexError]],
        expiries: list[int],
    ) -> GetManyReply:
        errors = [ItemError(i, WireError(*self.gate.enrich(e).to_wire())) for i, e in errs]
        return GetManyReply(
            bodies=bodies,
            errors=errors,
            cas=cas if msg.with_cas else [],
            expiries=expiries if msg.with_expiry else [],
        )

    def _read_many(
        self, engine: DataEngine, keyspace: str, docids: list[str]
    ) -> tuple[list[bytes | None], list[int], list[tuple[int, ShardexError]], list[int]]:
        """Every docid's stored body (None when absent, deleted or expired), CAS and expiry
        (0 then) in one pass over the engine; per-item errors (NOT_MY_PARTITION, a bad
        docid) beside them."""
        bodies: list[bytes | None] = []
        cas: list[int] = []
        expiries: list[int] = []
        errors: list[tuple[int, ShardexError]] = []
        for i, docid in enumerate(docids):
            try:
                raw = engine.get_raw(keyspace, docid)
                bodies.append(raw.body)
                cas.append(raw.cas)
                expiries.append(raw.expiry)
                continue
            except DocNotFound:
                pass
            except KeyspaceNotFound as exc:
                err = self.gate.not_here(exc, keyspace, docid)
                if err is exc:
                    raise  # the cluster has no such keyspace: the whole request fails
                errors.append((i, err))
            except ShardexError as exc:
                errors.append((i, exc))
            bodies.append(None)
            cas.append(0)
            expiries.append(0)
        return bodies, cas, errors, expiries
