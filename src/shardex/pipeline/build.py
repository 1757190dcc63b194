"""The initial build of new indexes (the load phase of index DDL): a Spark batch job.

1. T0 = the keyspace's current high seqnos (at or after every batch the stream has read).
2. Every copy of every slice opens its load at T0 (``LoadBegin``, from the driver).
3. Spark reads the documents as of T0 (the change source's snapshot mode, one task per data
   node) and each read task projects every building index in one pass and sends each
   slice's Upsert key versions straight to its indexer (``LoadChunk``; every replica copy of
   the slice gets the same rows): the source's
   projected mode with ``load`` (``source/projected.py``), so documents never cross into the JVM.
   Only counts come back to the driver.
4. Each indexer sorts its slice's rows (one per docid) and writes them (an SST ingested
   when the slice is big), records T0 as the slice's applied TS and snapshots it
   (``LoadFinish``).
5. The timekeeper publishes T0 as the index's first stability TS, the coordinator moves the
   index to ACTIVE (``MarkIndexActive``) and the index joins the maintenance stream, which
   catches it up from T0 (``maintain.py``). Other indexes are maintained throughout.

A build that fails (or a driver that dies mid-build) leaves slices ``loading``, or
``active`` at the failed attempt's T0 where their load finished before another failed; the
next build of the index starts over with a new T0 (its ``LoadBegin`` replaces a load session
or restarts such a slice; a restarted indexer turns a torn load into ``needs_rebuild``).
Progress: the workers count snapshot documents into the chunks (``docs``); a thread sums them
from the indexers every second and reports ``IndexBuildProgress`` (documents done /
documents in the keyspace at T0).
"""

from __future__ import annotations

import json
import logging
import threading
import time
import uuid
from collections import defaultdict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import pyarrow as pa
import pyarrow.compute as pc

from shardex.api.index_ddl import IndexBuildProgress, IndexUpdated, MarkIndexActive
from shardex.client import Client
from shardex.core.timestamp import Timestamp
from shardex.errors import ErrorCode, ShardexError
from shardex.pipeline.indexers import advance_stability, list_slices, load_begin, load_finish
from shardex.pipeline.registry import IndexRegistry, IndexView
from shardex.pipeline.source.projected import COUNTS_ARROW, COUNTS_SCHEMA, LoadSpec, ProjectSpec

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

__all__ = ["COUNTS_ARROW", "COUNTS_SCHEMA", "BuildResult", "InitialBuild"]

log = logging.getLogger(__name__)

PROGRESS_INTERVAL = 1.0


@dataclass
class BuildResult:
    ts0: Timestamp
    docs: int = 0
    rows: int = 0
    errors: int = 0
    items: dict[str, int] = field(default_factory=dict)  # index id -> entries loaded
    seconds: float = 0.0


class InitialBuild:
    """Builds the given indexes of one keyspace from one snapshot."""

    def __init__(
        self,
        spark: SparkSession,
        client: Client,
        registry: IndexRegistry,
        source_options: dict[str, str],
        *,
        on_progress: Callable[[str, float, int], None] | None = None,
    ) -> None:
        self.spark = spark
        self.client = client
        self.registry = registry
        self.keyspace = registry.keyspace
        self.source_options = dict(source_options, keyspace=registry.keyspace)
        self.on_progress = on_progress

    def run(self, views: Sequence[IndexView]) -> BuildResult:
        started = time.perf_counter()
        ts0 = self.client.high_seqnos(self.keyspace)
        total = max(1, self.client.keyspace_stats(self.keyspace).total_docs)
        ids = [v.id for v in views]
        log.info(
            "initial build of %s on %s at T0=%r (%d documents)", ids, self.keyspace, ts0, total
        )
        for v in views:
            self._progress(v.id, 0.0, 0, ts0)
        opts = dict(
            self.source_options,
            mode="snapshot",
            snapshot_ts=ts0_json(ts0),
            # One task per data node, not per partition: measured with 50k documents, 64
            # partitions, the snapshot read took 34-67 s in 64 tasks and 6 s in 3.
            tasks="owner",
        )
        opts["project"] = ProjectSpec.definitions_option([v.definition for v in views])
        owners = {v.id: v.route().owners for v in views}
        replicas = {v.id: v.route().replicas for v in views}
        opts["load"] = LoadSpec(ts0, owners, replicas).to_option()
        slices = [s for v in views for s in v.slices()]
        # Every copy opens its load at T0 first, by the driver's word: a slice an earlier
        # attempt finished (another copy's node was down) or one left on a lost branch by a
        # rollback its node missed restarts; a straggler chunk of an older attempt cannot.
        restarted = [(b.index_id, b.partition, b.node) for b in load_begin(self.client, ts0, slices)
                     if b.state == "active"]  # fmt: skip
        if restarted:
            log.info("build at T0=%r restarts active slices %s", ts0, restarted)
        stop = threading.Event()
        watcher = threading.Thread(
            target=self._watch, args=(views, ts0, total, stop), name="build-progress", daemon=True
        )
        watcher.start()
        try:
            df = self.spark.read.format("shardex").options(**opts).load()
            counts = df.toArrow()
        finally:
            stop.set()
            watcher.join()
        result = BuildResult(ts0=ts0)
        result.docs = int(pc.sum(counts["docs"]).as_py() or 0)
        result.rows = int(pc.sum(counts["rows"]).as_py() or 0)
        result.errors = int(pc.sum(counts["errors"]).as_py() or 0)
        primary = {(v.id, p, n) for v in views for p, n in v.topology.assignment.items()}
        for done in load_finish(self.client, ts0, slices, _one_incarnation(counts)):
            if (done.index_id, done.partition, done.node) not in primary:
                continue  # a replica copy holds the same entries: count them once
            result.items[done.index_id] = result.items.get(done.index_id, 0) + done.items_count
        # Every slice holds a snapshot at T0: publish it, then ACTIVE, then join the stream.
        reply = advance_stability(
            self.client, self.keyspace, ts0, ids, timekeeper=self.registry.timekeeper
        )
        for v in views:
            if v.id not in reply.published:
                log.warning("build of %s: T0 not published (%s)", v.id, reply.skipped)
                continue
            self._mark_active(v.id, ts0, result.items.get(v.id, 0))
            self.registry.join(v.id, ts0)
        result.seconds = time.perf_counter() - started
        log.info(
            "built %s: %d documents, %d entries, %d evaluation errors in %.1f s",
            ids,
            result.docs,
            sum(result.items.values()),
            result.errors,
            result.seconds,
        )
        return result

    def _watch(
        self, views: Sequence[IndexView], ts0: Timestamp, total: int, stop: threading.Event
    ) -> None:
        while not stop.wait(PROGRESS_INTERVAL):
            for v in views:
                try:
                    # The primaries' slices only: a replica copy loads the same rows again.
                    infos = [
                        s
                        for n in v.topology.nodes()
                        for s in list_slices(self.client, [n], v.id)
                        if v.topology.assignment.get(s.partition) == n
                    ]
                except Exception as exc:  # progress is best effort
                    log.debug("progress of %s: %s", v.id, exc)
                    continue
                docs = sum(s.load_docs for s in infos)
                rows = sum(s.load_rows for s in infos)
                self._progress(v.id, min(0.99, docs / total), rows, ts0)

    def _progress(self, index_id: str, progress: float, items: int, ts0: Timestamp) -> None:
        if self.on_progress is not None:
            self.on_progress(index_id, progress, items)
        msg = IndexBuildProgress(
            index_id=index_id,
            progress=progress,
            items_count=items,
            build_ts=dict(ts0.to_wire()),
            request_id=_rid(),
        )
        try:
            self.client.rpc.run(self.client.rpc.ddl(msg, IndexUpdated))
        except Exception as exc:  # a progress report must not fail the build
            log.debug("progress report for %s failed: %s", index_id, exc)

    def _mark_active(self, index_id: str, ts0: Timestamp, items: int) -> None:
        wire = dict(ts0.to_wire())
        msg = MarkIndexActive(
            index_id=index_id,
            build_ts=wire,
            items_count=items,
            stability_ts=wire,
            request_id=_rid(),
        )
        self.client.rpc.run(self.client.rpc.ddl(msg, IndexUpdated))


def _one_incarnation(counts: pa.Table) -> dict[str, str]:
    """node -> the one indexer incarnation that took all its chunks; an indexer that
    restarted during the build lost its chunks: STALE_DELIVERY (the build starts over)."""
    seen: dict[str, set[str]] = defaultdict(set)
    for raw in counts["incarnations"].to_pylist():
        for node, incs in json.loads(raw).items():
            seen[node].update(incs)
    restarted = {n: sorted(v) for n, v in seen.items() if len(v) > 1}
    if restarted:
        raise ShardexError(
            f"indexer(s) {', '.join(sorted(restarted))} restarted during the build",
            code=ErrorCode.STALE_DELIVERY,
            details={"incarnations": restarted, "hint": "the build is retried from a new T0"},
        )
    return {n: next(iter(v)) for n, v in seen.items()}


def ts0_json(ts: Timestamp) -> str:
    return json.dumps(ts.to_json())


def _rid() -> str:
    return uuid.uuid4().hex
