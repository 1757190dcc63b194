"""``shardex pipeline``: the Spark driver of the index pipeline.

A supervisor loop (every ``poll`` seconds) reads the coordinator state and, per keyspace that
has BUILDING or ACTIVE indexes, keeps one maintenance query running (``maintain.py``) and
runs initial builds for indexes that need one (new, or hit by a rollback: ``build.py``) in a
builder thread, so a build never stops the maintenance of the other indexes. A query that
dies is restarted from its Spark checkpoint (``<checkpoints>/<keyspace>-<uuid>/gen-N``) after
a back-off; a ROLLBACK starts a new generation (``rollback.py``); a failed build is retried.
A query that runs but stops applying changes while some are pending (``watchdog.py``) is
logged and restarted in a new generation from its indexes' applied TS. A keyspace whose
indexes are all gone has its query stopped.
"""

from __future__ import annotations

import functools
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from shardex.client import Client
from shardex.core.timestamp import SeqnoEntry, Timestamp
from shardex.errors import ShardexError
from shardex.meta.index_state import ACTIVE, BUILDING
from shardex.pipeline.batch_steps import BatchStats
from shardex.pipeline.build import BuildResult, InitialBuild
from shardex.pipeline.indexers import index_state
from shardex.pipeline.maintain import DEFAULT_DRIVER_READ_MAX, MaintenanceJob
from shardex.pipeline.metrics import PipelineMetrics
from shardex.pipeline.registry import IndexRegistry
from shardex.pipeline.rollback import current_generation, handle_rollback, new_generation
from shardex.pipeline.source.types import parse_rollback
from shardex.pipeline.watchdog import (
    DEFAULT_STALL_AFTER,
    Stall,
    StallWatchdog,
    source_latest,
    stream_text,
)

if TYPE_CHECKING:
    from pyspark.sql import SparkSession
    from pyspark.sql.streaming import StreamingQuery

__all__ = ["KeyspacePipeline", "PipelineDriver"]

log = logging.getLogger(__name__)

DEFAULT_POLL = 1.0
RESTART_BACKOFF = (1.0, 30.0)  # first and largest pause before restarting a failed query
# How long a stalled query gets to stop before the watchdog gives up until its next check (a
# batch blocked in foreachBatch holds Spark's stop; the supervisor must not hang on it).
STALL_STOP_TIMEOUT = 30.0


@dataclass
class KeyspacePipeline:
    """The running parts for one keyspace."""

    keyspace: str
    uuid: str
    registry: IndexRegistry
    job: MaintenanceJob
    watchdog: StallWatchdog
    query: StreamingQuery | None = None
    builder: threading.Thread | None = None
    failures: int = 0
    restart_at: float = 0.0
    builds: list[BuildResult] = field(default_factory=list)
    build_failures: int = 0
    rollbacks: int = 0
    stalls: int = 0  # queries the watchdog restarted
    stopping: threading.Thread | None = None  # a stalled query being stopped


class PipelineDriver:
    """Supervises maintenance queries and builds for every keyspace with indexes."""

    def __init__(
        self,
        spark: SparkSession,
        client: Client,
        source_options: dict[str, str],
        checkpoint_root: Path,
        *,
        poll: float = DEFAULT_POLL,
        trigger_interval: str = "0 seconds",
        on_batch: Callable[[BatchStats], None] | None = None,
        driver_read_max: int = DEFAULT_DRIVER_READ_MAX,
        overlap_stabilise: bool = True,
        stall_after: float = DEFAULT_STALL_AFTER,
        metrics: PipelineMetrics | None = None,
    ) -> None:
        self.spark = spark
        self.metrics = metrics  # batches and builds counted for /metrics (``metrics.py``)
        # Seconds without progress, changes pending, before a query is restarted (0: never).
        self.stall_after = stall_after
        self.driver_read_max = driver_read_max
        # False: each batch's round runs inside foreachBatch (``MaintenanceJob``)
        self.overlap_stabilise = overlap_stabilise
        self.client = client
        self.source_options = dict(source_options)
        self.checkpoint_root = checkpoint_root
        self.poll = poll
        self.trigger_interval = trigger_interval
        self.on_batch = on_batch
        self.keyspaces: dict[str, KeyspacePipeline] = {}
        self._stop = threading.Event()

    # -- the loop ------------------------------------------------------------------------------
    def run(self) -> None:
        """Supervise until ``stop()``; then stop every query."""
        try:
            while not self._stop.is_set():
                try:
                    self.step()
                except Exception as exc:  # a cluster hiccup must not end the driver
                    log.warning("pipeline supervisor: %s", exc)
                self._stop.wait(self.poll)
        finally:
            self.shutdown()

    def stop(self) -> None:
        self._stop.set()

    def step(self) -> None:
        """One supervision round (public for tests)."""
        state = index_state(self.client)
        wanted: dict[str, str] = {}
        for rec in state.indexes.values():
            meta = state.keyspaces.get(rec.keyspace)
            if rec.state in (BUILDING, ACTIVE) and meta is not None:
                wanted[rec.keyspace] = meta.uuid
        for name in list(self.keyspaces):
            kp = self.keyspaces[name]
            if wanted.get(name) != kp.uuid:
                log.info("keyspace %s has no index to maintain: stopping its query", name)
                self._stop_keyspace(kp)
                del self.keyspaces[name]
        for name, uuid in sorted(wanted.items()):
            kp = self.keyspaces.get(name)
            if kp is None:
                kp = self.keyspaces[name] = self._new_keyspace(name, uuid)
            self._supervise(kp)

    def _new_keyspace(self, name: str, uuid: str) -> KeyspacePipeline:
        registry = IndexRegistry(self.client, name)
        registry.refresh(force=True)
        checkpoint = current_generation(self.checkpoint_root / f"{name}-{uuid}")
        job = self._job(registry, checkpoint)
        log.info("maintaining keyspace %s (checkpoint %s)", name, checkpoint)
        watchdog = StallWatchdog(
            registry, lambda: self.client.high_seqnos(name), stall_after=self.stall_after
        )
        return KeyspacePipeline(
            keyspace=name, uuid=uuid, registry=registry, job=job, watchdog=watchdog
        )

    def _job(self, registry: IndexRegistry, checkpoint: Path) -> MaintenanceJob:
        return MaintenanceJob(
            self.spark,
            self.client,
            registry,
            self.source_options,
            checkpoint,
            starting=self._starting(registry, registry.keyspace),
            trigger_interval=self.trigger_interval,
            on_batch=functools.partial(self._batch_done, registry.keyspace),
            driver_read_max=self.driver_read_max,
            overlap_stabilise=self.overlap_stabilise,
        )

    def _batch_done(self, keyspace: str, stats: BatchStats) -> None:
        if self.metrics is not None:
            self.metrics.observe_batch(keyspace, stats)
        if self.on_batch is not None:
            self.on_batch(stats)

    def _starting(self, registry: IndexRegistry, keyspace: str) -> Timestamp:
        """Where a new checkpoint starts: the lowest applied TS of the joined indexes, else
        now (an index that joins later is caught up from its own T0)."""
        joined = registry.maintained()
        if not joined:
            return self.client.high_seqnos(keyspace)
        low: dict[int, SeqnoEntry] = {}
        for v in joined:
            for p, e in registry.applied(v.id).items():
                if p not in low or e.seqno < low[p].seqno:
                    low[p] = e
        return Timestamp(low)

    def _supervise(self, kp: KeyspacePipeline) -> None:
        kp.registry.refresh()
        q = kp.query
        if q is not None and not q.isActive:
            exc = q.exception()
            info = parse_rollback(str(exc)) if exc is not None else None
            if info is not None:
                # The offsets are on a lost history: rebuild what it reached, restart the
                # stream in a new checkpoint generation at once.
                kp.job.close()
                handle_rollback(self.client, kp.registry, info)
                kp.job = self._job(kp.registry, new_generation(kp.job.checkpoint.parent))
                kp.query = kp.job.start()
                kp.watchdog.reset()
                # Counted once the new generation runs: observers (tests, status) that see
                # the count see the new job too.
                kp.rollbacks += 1
                return
            kp.failures += 1
            pause = min(RESTART_BACKOFF[1], RESTART_BACKOFF[0] * 2 ** (kp.failures - 1))
            kp.restart_at = time.monotonic() + pause
            log.warning(
                "maintenance of %s stopped (%s); restarting from its checkpoint in %.0f s",
                kp.keyspace,
                exc,
                pause,
            )
            kp.query = None
        if kp.query is None and time.monotonic() >= kp.restart_at:
            kp.query = kp.job.start()
            kp.watchdog.reset()
        elif kp.failures and kp.query is not None and kp.query.lastProgress is not None:
            kp.failures = 0  # it runs again: the next failure starts the back-off afresh
        if kp.query is not None and kp.query.isActive:
            try:
                stall = kp.watchdog.check(kp.job.position())
            except ShardexError as exc:  # no high seqnos now (a node down): next period
                log.info("stall check of %s: %s", kp.keyspace, exc)
                stall = None
            if stall is not None:
                self._restart_stalled(kp, stall)
        if kp.builder is None or not kp.builder.is_alive():
            todo = kp.registry.needs_build()
            if todo:
                kp.builder = threading.Thread(
                    target=self._build, args=(kp, todo), name=f"build-{kp.keyspace}", daemon=True
                )
                kp.builder.start()
        # Index moves wait for a routed stabilise round, which an idle keyspace never runs.
        try:
            kp.job.idle_round()
        except Exception as exc:  # tried again next poll; other keyspaces go on
            log.warning("idle stabilise round of %s: %s", kp.keyspace, exc)

    def _restart_stalled(self, kp: KeyspacePipeline, stall: Stall) -> None:
        """The watchdog found the query running without applying pending changes: stop it
        (bounded: a batch blocked in foreachBatch holds Spark's stop) and start a new
        checkpoint generation at the maintained indexes' lowest applied TS."""
        log.warning(
            "maintenance of keyspace %s applied nothing for %.0f s with %d changes pending "
            "(%s; %s; %s); restarting its query in a new checkpoint generation from the "
            "indexes' applied TS",
            stall.keyspace,
            stall.seconds,
            stall.total,
            stall.describe(),
            stream_text(stall, "the stream's last committed end", kp.job.committed_position()),
            stream_text(stall, "its source's last latest offset", source_latest(kp.query)),
        )
        if kp.stopping is None or not kp.stopping.is_alive():
            kp.stopping = threading.Thread(
                target=self._stop_keyspace, args=(kp,), name=f"stop-{kp.keyspace}", daemon=True
            )
            kp.stopping.start()
        kp.stopping.join(STALL_STOP_TIMEOUT)
        if kp.stopping.is_alive():
            log.warning(
                "the stalled query of %s did not stop within %.0f s; trying again in %.0f s",
                kp.keyspace,
                STALL_STOP_TIMEOUT,
                self.stall_after,
            )
            return
        kp.stopping = None
        kp.job = self._job(kp.registry, new_generation(kp.job.checkpoint.parent))
        kp.query = kp.job.start()
        kp.watchdog.reset()
        kp.stalls += 1

    def _build(self, kp: KeyspacePipeline, views: list[Any]) -> None:
        builder = InitialBuild(self.spark, self.client, kp.registry, self.source_options)
        try:
            result = builder.run(views)
            kp.builds.append(result)
            kp.build_failures = 0
            if self.metrics is not None:
                self.metrics.observe_build(kp.keyspace, result)
        except Exception as exc:
            kp.build_failures += 1
            if self.metrics is not None:
                self.metrics.build_failed(kp.keyspace)
            log.warning(
                "initial build of %s failed (attempt %d): %s",
                [v.id for v in views],
                kp.build_failures,
                exc,
            )
            time.sleep(min(30.0, 2.0**kp.build_failures))

    def _stop_keyspace(self, kp: KeyspacePipeline) -> None:
        kp.job.stop_rounds()  # no round between batches once the query is seen stopped
        if kp.query is not None:
            try:
                kp.query.stop()
            except Exception as exc:
                log.debug("stopping the query of %s: %s", kp.keyspace, exc)
        kp.job.close()  # the last batch's stabilise round (it runs beside Spark's commit)

    def shutdown(self) -> None:
        for kp in self.keyspaces.values():
            self._stop_keyspace(kp)
        for kp in self.keyspaces.values():
            if kp.builder is not None:
                kp.builder.join(timeout=5)
