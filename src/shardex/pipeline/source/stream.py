"""The streaming readers of the change source (driver side).

``ShardexStreamReader`` (``reader=partitioned``): offsets on the driver, records read by
Spark tasks in Python workers. ``ShardexDriverStreamReader`` (``reader=driver`` or
``follow``): a ``SimpleDataSourceStreamReader`` that reads in the driver's Python process and
hands Spark the rows with the end offset, so a micro-batch runs no read task. Both share
``_OffsetSource``: the client, the cached high seqnos, the initial offset, rollback checks
and the availableNow target. Measurements and the choice between them:
``docs/decisions/0034-stream-reader-partitioned.md``.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator
from typing import Any

import pyarrow as pa
from pyspark.sql.datasource import (
    DataSourceStreamReader,
    InputPartition,
    SimpleDataSourceStreamReader,
)
from pyspark.sql.streaming.datasource import (
    ReadAllAvailable,
    ReadLimit,
    ReadMaxRows,
    SupportsTriggerAvailableNow,
)

from shardex.client import Client
from shardex.core.timestamp import SeqnoEntry, Timestamp
from shardex.errors import ErrorCode, ShardexError
from shardex.pipeline.source.follow import FollowSet
from shardex.pipeline.source.idle import IdlePoll
from shardex.pipeline.source.options import (
    OWNERS_MAX_AGE,
    ChangeRangesPartition,
    SourceOptions,
    task_partitions,
)
from shardex.pipeline.source.plan import limit_offsets, plan_ranges
from shardex.pipeline.source.read import chunks_to_batches, partition_owners, read_ranges
from shardex.pipeline.source.seqnos import OwnerSeqnos
from shardex.pipeline.source.stats import SourceCallStats
from shardex.pipeline.source.types import rollback_error


class _OffsetSource:
    """What both stream readers share: a driver-side client, cached high seqnos, the
    initial offset, rollback checks, the availableNow target and call statistics."""

    def __init__(self, opts: SourceOptions) -> None:
        self.opts = opts
        self._client: Client | None = None
        self._owner_seqnos: OwnerSeqnos | None = None
        self._latest: tuple[float, Timestamp] | None = None
        # How long an answer is reused: the base interval, longer while nothing changes.
        self.poll = IdlePoll(opts.latest_offset_interval, opts.idle_offset_interval)
        self.last_rpc: float | None = None  # seconds of the last high_seqnos RPC (stats)
        self._owners_at = 0.0  # when the driver's topology was last refreshed
        self._owners: dict[int, str] | None = None  # partition -> owner read then
        self._target: Timestamp | None = None  # availableNow: stop here
        self.stats = SourceCallStats()

    def __getstate__(self) -> dict[str, Any]:
        # Readers are pickled into Spark's read function: never ship a live client.
        state = dict(self.__dict__)
        state["_client"] = None
        state["_owner_seqnos"] = None
        state["_owners"] = None
        state["_latest"] = None
        return state

    @property
    def keyspace(self) -> str:
        return self.opts.endpoint.keyspace

    def client(self) -> Client:
        if self._client is None:
            self._client = self.opts.connect()
        return self._client

    def high_seqnos(self, *, fresh: bool = False, partial: bool = False) -> Timestamp:
        """The partitions' high seqnos (reused for ``latest_offset_interval``, up to
        ``idle_offset_interval`` while they do not change: ``idle.py``). ``partial``: with
        an owner unreachable, the partitions the others answered (``seqnos.py``)."""
        now = time.monotonic()
        cached = self._latest
        if not fresh and cached is not None and now - cached[0] < self.poll.interval:
            return cached[1]
        t0 = time.perf_counter()
        if self.opts.high_seqnos == "owners":
            if self._owner_seqnos is None:
                self._owner_seqnos = OwnerSeqnos(self.client(), self.keyspace)
            ts = self._owner_seqnos(partial=partial)
        else:
            ts = self.client().high_seqnos(self.keyspace)
        self.last_rpc = took = time.perf_counter() - t0
        self.stats["rpc_calls"] += 1
        self.stats["rpc_seconds"] += took
        self._latest = (now, ts)
        self.poll.observe(ts, now)
        return ts

    def owners(self) -> dict[int, str]:
        """partition -> owner for grouping tasks. The driver never hits NOT_MY_PARTITION
        (only workers read), so its topology is refreshed on a timer instead, and the map
        is kept in between: reading it from the client costs a hop to the client's loop
        thread, which under CPU load was most of ``partitions`` (it is only a hint: the
        tasks follow a partition wherever it is)."""
        now = time.monotonic()
        if self._owners is None or now - self._owners_at > OWNERS_MAX_AGE:
            client = self.client()
            with contextlib.suppress(ShardexError):
                client.rpc.run(client.rpc.router.refresh())
            self._owners_at = now
            self._owners = partition_owners(client, self.keyspace)
        return self._owners

    def initial(self) -> Timestamp:
        start = self.opts.starting_offsets
        if isinstance(start, Timestamp):
            return start
        current = self.high_seqnos(fresh=True)
        if start == "latest":
            return current
        return Timestamp({p: (0, 0) for p in current})

    def next_end(self, start: Timestamp, max_rows: int | None) -> Timestamp:
        """The end offset for a batch from ``start``: the current high seqnos (capped by the
        availableNow target and ``max_rows``), never behind ``start``. A partition whose uuid
        changed is checked against its history and raises ROLLBACK if ``start`` left it."""
        self.stats["latest_calls"] += 1
        # availableNow: everything up to the high seqnos seen when the trigger started.
        current = self._target if self._target is not None else self.high_seqnos(partial=True)
        # A partition no owner answered for (its node down) stays where the stream is: this
        # batch leaves it out, a later one reads it once it is served again.
        out: dict[int, SeqnoEntry] = {p: s for p, s in start.items() if p not in current}
        for p, now in current.items():
            s = start.get(p, SeqnoEntry(0, 0))
            if s.seqno > 0 and now.uuid != s.uuid:
                self._check_branch(p, s)  # raises ROLLBACK if s is not in p's history
            if now.seqno < s.seqno:
                if now.uuid == s.uuid:
                    raise rollback_error(
                        self.keyspace,
                        p,
                        now.seqno,
                        f"partition {p} of {self.keyspace!r} is at seqno {now.seqno}, below "
                        f"the stream's offset {s.seqno}: acknowledged history is gone",
                    )
                out[p] = s
            else:
                out[p] = now
        end = Timestamp(out)
        if max_rows is not None:
            end = limit_offsets(start, end, max_rows)
        self._maybe_write_stats()
        return end

    def _check_branch(self, partition: int, s: SeqnoEntry) -> None:
        """Open (and at once close) a stream at ``s``: the data node's failover-log check says
        whether ``s`` is still in the partition's history, with the rollback seqno if not."""
        ks = self.client().keyspace(self.keyspace)
        try:
            with ks.stream(partition, s.seqno, s.uuid, s.seqno):
                pass
        except ShardexError as exc:
            if exc.code is ErrorCode.ROLLBACK:
                rb = int(exc.details.get("rollback_seqno", 0))
                raise rollback_error(
                    self.keyspace,
                    partition,
                    rb,
                    f"partition {partition} of {self.keyspace!r} cannot continue from seqno "
                    f"{s.seqno} on uuid {s.uuid}: roll back to {rb}",
                    uuid=exc.details.get("uuid"),
                ) from None
            raise

    def prepare_available_now(self) -> None:
        self._target = self.high_seqnos(fresh=True)

    def _maybe_write_stats(self, force: bool = False) -> None:
        self.stats.write(self.opts.stats_path, force)

    def close(self) -> None:
        self._maybe_write_stats(force=True)
        client, self._client = self._client, None
        if client is not None:
            client.close()


class ShardexStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    """Partitioned micro-batches: offsets on the driver, records read by Spark tasks."""

    def __init__(self, opts: SourceOptions) -> None:
        self.offsets = _OffsetSource(opts)

    def initialOffset(self) -> dict[str, Any]:
        return self.offsets.initial().to_json()

    def latestOffset(self, start: dict[str, Any], limit: ReadLimit) -> dict[str, Any]:
        with self.offsets.stats.call("latestOffset", gap_after="partitions"):
            max_rows = limit.max_rows if isinstance(limit, ReadMaxRows) else None
            begin = Timestamp.from_json(start)
            offsets = self.offsets
            offsets.last_rpc = None
            end = offsets.next_end(begin, max_rows)
            stats = offsets.stats
            stats.idle = end == begin
            if offsets.last_rpc is not None:
                stats.sample("high_seqnos_rpc" + (" idle" if stats.idle else ""), offsets.last_rpc)
            return end.to_json()

    def getDefaultReadLimit(self) -> ReadLimit:
        n = self.offsets.opts.max_records_per_batch
        return ReadAllAvailable() if n is None else ReadMaxRows(n)

    def reportLatestOffset(self) -> dict[str, Any] | None:
        with self.offsets.stats.call("reportLatestOffset", gap_after="latestOffset"):
            latest = self.offsets._latest
            return None if latest is None else latest[1].to_json()

    def prepareForTriggerAvailableNow(self) -> None:
        self.offsets.prepare_available_now()

    def partitions(self, start: dict[str, Any], end: dict[str, Any]) -> list[InputPartition]:
        with self.offsets.stats.call("partitions", gap_after="commit"):
            opts = self.offsets.opts
            begin, finish = Timestamp.from_json(start), Timestamp.from_json(end)
            ranges = plan_ranges(opts.endpoint.keyspace, begin, finish)
            if not ranges:
                return []
            return list(task_partitions(opts, ranges, self.offsets.owners()))

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        assert isinstance(partition, ChangeRangesPartition)
        return partition.read()

    def commit(self, end: dict[str, Any]) -> None:
        # No consumer-checkpoint RPC exists on the wire yet (only DataEngine
        # .set_consumer_checkpoint, node-local): nothing to register. See
        # docs/decisions/0032-spark-source-rules.md.
        with self.offsets.stats.call("commit", gap_after="reportLatestOffset"):
            return None

    def stop(self) -> None:
        self.offsets.close()


class ShardexDriverStreamReader(SimpleDataSourceStreamReader, SupportsTriggerAvailableNow):
    """Driver-side micro-batches (``SimpleDataSourceStreamReader``): ``read`` runs in the
    driver's Python process and hands Spark the rows with the offsets, so a batch needs no
    read task and no Python worker.

    ``follow=False`` (``reader=driver``): each ``read`` asks for the high seqnos and reads
    the new ranges. ``follow=True`` (``reader=follow``): live streams push every change into
    memory (``FollowSet``), so ``read`` neither waits for nor sends anything. Recovery
    (``readBetweenOffsets``) and availableNow use range reads: both need exact, known ends."""

    def __init__(self, opts: SourceOptions, *, follow: bool = False) -> None:
        self.offsets = _OffsetSource(opts)
        self.follow = follow
        self._follows: FollowSet | None = None
        self._handed: dict[str, Any] | None = None  # the last end offset given to Spark

    def __getstate__(self) -> dict[str, Any]:
        # Pickled into Spark's read function (recovery reads): no live streams travel.
        state = dict(self.__dict__)
        state["_follows"] = None
        state["_handed"] = None
        return state

    def initialOffset(self) -> dict[str, Any]:
        return self.offsets.initial().to_json()

    def prepareForTriggerAvailableNow(self) -> None:
        self.offsets.prepare_available_now()

    def read(self, start: dict[str, Any]) -> tuple[Iterator[pa.RecordBatch], dict[str, Any]]:
        opts = self.offsets.opts
        if self.follow and self.offsets._target is None:
            self.offsets.stats["latest_calls"] += 1
            follows = self._follow_set()
            if start == self._handed and follows.idle():
                return iter(()), start  # the idle poll: a dict comparison, nothing else
            begin = Timestamp.from_json(start)
            follows.sync_to(begin)
            follows.settle()
            chunks, end = follows.take(opts.max_records_per_batch)
            self._handed = end.to_json()
            self.offsets._maybe_write_stats()
            if end == begin:
                return iter(()), start
            return iter(chunks_to_batches(chunks)), end.to_json()
        begin = Timestamp.from_json(start)
        end = self.offsets.next_end(begin, opts.max_records_per_batch)
        if end == begin:
            return iter(()), start
        return iter(self._read(begin, end)), end.to_json()

    def readBetweenOffsets(
        self, start: dict[str, Any], end: dict[str, Any]
    ) -> Iterator[pa.RecordBatch]:
        # Recovery re-reads a logged batch: deterministic, the ranges are exact.
        return iter(self._read(Timestamp.from_json(start), Timestamp.from_json(end)))

    def _follow_set(self) -> FollowSet:
        if self._follows is None:
            opts = self.offsets.opts
            self._follows = FollowSet(
                self.offsets.client(),
                opts.endpoint.keyspace,
                max_items=opts.max_items,
                resume_timeout=opts.resume_timeout,
            )
        return self._follows

    def _read(self, start: Timestamp, end: Timestamp) -> list[pa.RecordBatch]:
        # A list, not a generator: Spark copies the iterator it caches (copy.copy).
        opts = self.offsets.opts
        ranges = plan_ranges(opts.endpoint.keyspace, start, end)
        return list(
            read_ranges(
                self.offsets.client(),
                opts.endpoint.keyspace,
                ranges,
                concurrency=max(opts.concurrency, len(ranges)),
                max_items=opts.max_items,
                resume_timeout=opts.resume_timeout,
            )
        )

    def commit(self, end: dict[str, Any]) -> None:
        return None

    def stop(self) -> None:
        if self._follows is not None:
            self._follows.close()
        self.offsets.close()
