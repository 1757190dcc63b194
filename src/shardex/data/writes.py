"""The data service's write path: single mutations and ``MutateMany`` batches.

Every write goes through group commit (``groupcommit.py``), which shares one RocksDB write
and one fsync among concurrent writers, then wakes the partition's replica senders and, for a
majority level, waits for the replicas (``replication.py``): a timeout there is
DURABILITY_AMBIGUOUS, since the write is applied here and may or may not reach a majority.
A single write is answered in the receive callback when it can (``mutate_now``), with no
task: a future settled by group commit's and the durability wait's callbacks.

Each single write is timed from its arrival to its answer (``latencies``, keyed by kind and
durability level; failures counted in ``failed``), read by the node's metrics endpoint.
"""

from __future__ import annotations

import asyncio
import functools
import time
from collections.abc import Awaitable, Callable
from typing import Any

from shardex.api.data import (
    Delete,
    GetAndTouch,
    GetReply,
    Insert,
    ItemError,
    MutateMany,
    MutateManyReply,
    MutationReply,
    Replace,
    Touch,
    Upsert,
)
from shardex.api.errors import KeyspaceNotFound, WireError
from shardex.api.records import MutationResult
from shardex.api.validation import (
    DURABILITY_LEVELS,
    MAJORITY_LEVELS,
    check_durability_timeout,
    durability_level,
)
from shardex.data.engine import DataEngine
from shardex.data.groupcommit import GroupCommitter, OpTuple
from shardex.data.replication import Replication
from shardex.data.serving import ServingGate
from shardex.errors import NodeUnavailable, ShardexError
from shardex.net import Connection
from shardex.runtime.latency import Latencies


class WritePath:
    """Handlers of Insert, Upsert, Replace, Delete and MutateMany (module docstring)."""

    def __init__(
        self,
        *,
        engine: Callable[[], DataEngine],
        committer: Callable[[], GroupCommitter | None],
        replication: Replication,
        gate: ServingGate,
    ) -> None:
        # Getters: the engine and its committer exist only while the service runs.
        self._engine = engine
        self._committer = committer
        self.replication = replication
        self.gate = gate
        # (kind, durability level) -> latency of single writes, on the loop thread only
        self.latencies: Latencies[tuple[str, str]] = Latencies()
        self.failed: dict[str, int] = {}  # kind -> single writes answered with an error

    def _observe(self, kind: str, level: str, t0: float, failed: bool) -> None:
        self.latencies.observe((kind, level), time.perf_counter() - t0)
        if failed:
            self.failed[kind] = self.failed.get(kind, 0) + 1

    def _running_committer(self) -> GroupCommitter:
        committer = self._committer()
        if committer is None:
            raise NodeUnavailable(f"the data service of {self.gate.name} is not running")
        return committer

    async def mutate(
        self,
        kind: str,
        keyspace: str,
        docid: str,
        doc: object,
        cas: int | None,
        durability: str,
        timeout: float | None = None,
        t0: float | None = None,
        expiry: int = 0,
    ) -> MutationReply:
        """``t0``: the write's arrival (``perf_counter``), to time it; None: not timed.
        ``expiry``: the write's, in wire form (``api/expiry.py``)."""
        op = (kind, docid, doc, cas, expiry)
        if t0 is None:
            return await self._mutate(keyspace, op, durability, timeout)
        failed = True
        try:
            reply = await self._mutate(keyspace, op, durability, timeout)
            failed = False
            return reply
        finally:
            self._observe(kind, _level_label(durability), t0, failed)

    async def _mutate(
        self, keyspace: str, op: OpTuple, durability: str, timeout: float | None
    ) -> MutationReply:
        docid = op[1]
        committer = self._running_committer()
        timeout = check_durability_timeout(timeout)
        await self.gate.wait(keyspace)
        level = durability_level(durability)
        majority = level in MAJORITY_LEVELS
        try:
            if majority:
                self.replication.check_possible(
                    keyspace, self._engine().partition_for(keyspace, docid)
                )
            result = await committer.submit(keyspace, durability, op)
            self.replication.wake(keyspace, result.partition)
            if majority:
                await self.replication.wait_durable(keyspace, result, level, docid, timeout)
        except KeyspaceNotFound as exc:
            raise self.gate.not_here(exc, keyspace, docid) from None
        except ShardexError as exc:
            raise self.gate.enrich(exc) from None
        return MutationReply(result=result)

    def mutate_now(
        self,
        kind: str,
        keyspace: str,
        docid: str,
        doc: object,
        cas: int | None,
        durability: str,
        timeout: float | None,
        t0: float,
        expiry: int = 0,
    ) -> Awaitable[MutationReply]:
        """``mutate`` without a task: in the receive callback (``Router.route_inline``), a
        future then settled by callbacks. A node not yet reconciled, or without its lease,
        takes ``mutate`` (a coroutine: the connection runs it in a task), which waits or
        says why."""
        committer = self._committer()
        gate = self.gate
        if timeout is not None:  # not every client is ours: checked before anything
            timeout = check_durability_timeout(timeout)
        if committer is None or not gate.reconciled.is_set():
            return self.mutate(kind, keyspace, docid, doc, cas, durability, timeout, t0, expiry)
        try:
            gate.check()
        except ShardexError:
            self._observe(kind, _level_label(durability), t0, True)
            raise
        if gate.replicated(keyspace) and not gate.lease.check():
            return self.mutate(kind, keyspace, docid, doc, cas, durability, timeout, t0, expiry)
        level = durability_level(durability)
        try:
            if level in MAJORITY_LEVELS:
                self.replication.check_possible(
                    keyspace, self._engine().partition_for(keyspace, docid)
                )
        except KeyspaceNotFound as exc:
            self._observe(kind, level, t0, True)
            raise gate.not_here(exc, keyspace, docid) from None
        except ShardexError as exc:
            self._observe(kind, level, t0, True)
            raise gate.enrich(exc) from None
        out: asyncio.Future[MutationReply] = asyncio.get_running_loop().create_future()
        committer.submit_then(
            keyspace,
            durability,
            (kind, docid, doc, cas, expiry),
            functools.partial(self._written, out, (kind, level, t0), keyspace, docid, timeout),
        )
        return out

    def _written(
        self,
        out: asyncio.Future[MutationReply],
        timed: tuple[str, str, float],
        keyspace: str,
        docid: str,
        timeout: float | None,
        written: MutationResult | BaseException,
    ) -> None:
        """``mutate_now``'s write is committed (or failed): wake the senders, then wait
        for its durability, as ``mutate`` does. Called by group commit as it settles the
        write's group; the durability wait calls back ``_settle`` the same way."""
        if isinstance(written, BaseException):
            self._settle(out, timed, keyspace, docid, None, written)
            return
        result = written
        reply = MutationReply(result=result)
        then = functools.partial(self._settle, out, timed, keyspace, docid, reply)
        try:
            self.replication.wake(keyspace, result.partition)
            if self.replication.on_durable(keyspace, result, timed[1], docid, then, timeout):
                return
        except Exception as exc:  # answered as the coroutine's would be, never left hanging
            self._settle(out, timed, keyspace, docid, None, exc)
            return
        then(None)

    def _settle(
        self,
        out: asyncio.Future[MutationReply],
        timed: tuple[str, str, float],
        keyspace: str,
        docid: str,
        reply: MutationReply | None,
        error: BaseException | None,
    ) -> None:
        """``out`` gets ``reply``, or ``error`` as ``mutate`` raises it; the write is timed
        (``timed``: its kind, durability level and arrival)."""
        if out.done():
            return
        self._observe(*timed, error is not None)
        if error is None:
            out.set_result(reply)  # type: ignore[arg-type]  # None only with an error
        elif isinstance(error, asyncio.CancelledError):
            out.cancel()
        elif isinstance(error, KeyspaceNotFound):
            out.set_exception(self.gate.not_here(error, keyspace, docid))
        elif isinstance(error, ShardexError):
            out.set_exception(self.gate.enrich(error))
        else:
            out.set_exception(error)

    # --- routes ------------------------------------------------------------------------------

    def on_insert(self, msg: Insert, conn: Connection) -> Awaitable[MutationReply]:
        return self._single("insert", msg, msg.doc, None, msg.expiry)

    def on_upsert(self, msg: Upsert, conn: Connection) -> Awaitable[MutationReply]:
        return self._single("upsert", msg, msg.doc, msg.cas, msg.expiry)

    def on_replace(self, msg: Replace, conn: Connection) -> Awaitable[MutationReply]:
        return self._single("replace", msg, msg.doc, msg.cas, msg.expiry)

    def on_delete(self, msg: Delete, conn: Connection) -> Awaitable[MutationReply]:
        return self._single("delete", msg, None, msg.cas, 0)

    def on_touch(self, msg: Touch, conn: Connection) -> Awaitable[MutationReply]:
        return self._single("touch", msg, None, msg.cas, msg.expiry)

    async def on_get_and_touch(self, msg: GetAndTouch, conn: Connection) -> GetReply:
        """A touch, then the document read after it (a write between the two shows)."""
        t0 = time.perf_counter()
        await self.mutate(
            "touch",
            msg.keyspace,
            msg.docid,
            None,
            None,
            msg.durability,
            msg.durability_timeout,
            t0,
            msg.expiry,
        )
        try:
            raw = self._engine().get_raw(msg.keyspace, msg.docid)
        except ShardexError as exc:
            raise self.gate.enrich(exc) from None
        return GetReply(body=raw.body, cas=raw.cas, seqno=raw.seqno, expiry=raw.expiry)

    def _single(
        self,
        kind: str,
        msg: Insert | Upsert | Replace | Delete | Touch,
        doc: bytes | None,
        cas: int | None,
        expiry: int,
    ) -> Awaitable[MutationReply]:
        t0 = time.perf_counter()
        return self.mutate_now(
            kind,
            msg.keyspace,
            msg.docid,
            doc,
            cas,
            msg.durability,
            msg.durability_timeout,
            t0,
            expiry,
        )

    async def on_mutate_many(self, msg: MutateMany, conn: Connection) -> MutateManyReply:
        """A batch, timed as one ``mutate_many`` to its answer (its items' own errors are
        in the reply; ``failed`` counts a batch that failed whole)."""
        t0 = time.perf_counter()
        failed = True
        try:
            reply = await self._mutate_many(msg)
            failed = False
            return reply
        finally:
            self._observe("mutate_many", _level_label(msg.durability), t0, failed)

    async def _mutate_many(self, msg: MutateMany) -> MutateManyReply:
        committer = self._running_committer()
        gate = self.gate
        await gate.wait(msg.keyspace)
        ops = [(o.kind, o.docid, o.doc, o.cas, o.expiry) for o in msg.ops]
        level = durability_level(msg.durability)
        timeout = check_durability_timeout(msg.durability_timeout)
        majority = level in MAJORITY_LEVELS
        try:
            if majority:
                engine = self._engine()
                for o in msg.ops:
                    p = engine.partition_for(msg.keyspace, o.docid)
                    self.replication.check_possible(msg.keyspace, p)
            # Through group commit like single writes: concurrent batches (the bulk writers of
            # several clients, each batch split over the nodes) share one RocksDB write and
            # one fsync instead of queueing on partition locks for one fsync each.
            out: list[Any] = await committer.submit_many(msg.keyspace, msg.durability, ops)
            for p in {r.partition for r in out if isinstance(r, MutationResult)}:
                self.replication.wake(msg.keyspace, p)
            if majority:
                out = await self._wait_many(msg.keyspace, level, msg.ops, out, timeout)
        except KeyspaceNotFound as exc:
            errs = [gate.not_here(exc, msg.keyspace, o.docid) for o in msg.ops]
            if not msg.ops or any(e is exc for e in errs):
                raise exc from None
            out = errs
        results: list[MutationResult | None] = []
        errors: list[ItemError] = []
        for i, r in enumerate(out):
            if isinstance(r, ShardexError):
                code, message, details = gate.enrich(r).to_wire()
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


def _level_label(durability: str) -> str:
    """The durability level a write is timed under: its canonical name, "invalid" for a
    value that is none (a metric's labels stay a small fixed set)."""
    if durability in DURABILITY_LEVELS:
        return durability
    try:
        return durability_level(durability)
    except ShardexError:
        return "invalid"
