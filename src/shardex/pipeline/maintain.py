"""The maintenance stream of one keyspace: a Structured Streaming query over the change source
whose ``foreachBatch`` projects, routes, delivers and stabilises (the mutation flow).

One micro-batch (batch id B, offsets (start, end] from Spark's offset log):

1. the maintained indexes (``IndexRegistry``; an index joins after its initial build);
2. project the batch's changes for them: a small batch (``driver_read_max`` changes) is read
   and projected on the driver, a larger one by a projected batch read of the same range
   (the source's ``project`` option: Spark's read tasks read and project in their Python
   workers, only key versions reach the JVM), collected on the driver (``toArrow``);
   batches are capped at ``max_records_per_batch`` changes (``DEFAULT_MAX_RECORDS``), so a
   backlog drains as a run of moderate batches rather than one giant one;
3. catch up any index whose applied TS is behind ``start`` (an index that joined after the
   stream passed its build's T0): its missing range is read on the driver and projected too;
4. ``foreachBatch`` returns; on a thread beside Spark's commit (``rounds/tail.py``, the
   batch's "round"): route by index topology and send each indexer its rows and the
   stabilise at ``end`` in one ``DeliverAndStabilise`` (in parallel);
5. the timekeeper checks the indexers' replies and publishes ``end`` as the indexes'
   stability TS once every slice acknowledged. The next batch first waits for this round,
   and a small batch's successor is read and projected meanwhile (``rounds/read_ahead.py``);
6. with ``stabilise_ahead`` (the default; ``stabilise_ahead=False`` goes back to 5 alone,
   as the read-ahead tests do): the read-ahead keeps reading in
   pieces after the round, and what it read gets stability rounds of its own (the same
   ``_attempt``: the rows, the stabilise at their end, the publish), one at a time, beside
   the next piece's read, so the stability TS moves between Spark's batches
   (``rounds/between.py``). A batch leaves its range to them while they are healthy and
   route by its views (``_left_to_rounds``); otherwise it halts them, leaves out what they
   applied and stabilises at F = max(its end, every TS a round attempted), reading what
   lies between its end and F (and is not applied). No two rounds (a batch's, an idle one,
   one between batches) ever overlap (``_round_lock``).

Exactly-once from at-least-once (``docs/decisions/0029-index-pipeline-micro-batch.md``):
Spark runs a
batch again with the same offsets after a failure; slices drop key versions at or below
their applied seqno, a stabilise at a TS already reached is a no-op, and an indexer that
restarted after taking a batch's earlier frames refuses its last one (STALE_DELIVERY), so
the batch is delivered again. Failures of steps 4-5 are retried with back-off for
``retry_for`` seconds; then the next batch fails (and the driver restarts the query from its
checkpoint). Spark may have committed a batch whose round failed: the registry's applied TS
did not advance, so the next batch catches the range up (step 3). A round between batches is
not retried: its failure stops those rounds until the next batch, which stabilises past
whatever it reached (the registry's ahead TS: ``IndexRegistry.attempted``).

This module sets up the query and runs each batch; steps 2-5 themselves, and the state the
rounds leave, are the job's ``BatchSteps`` (``batch_steps.py``).
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from shardex.client import Client
from shardex.core.gcpause import gc_paused
from shardex.core.timestamp import Timestamp
from shardex.index.keyversion import KeyVersion
from shardex.pipeline.batch_callback import foreach_batch_id
from shardex.pipeline.batch_range import logged_range, read_offset
from shardex.pipeline.batch_steps import BatchStats, BatchSteps, count_changes
from shardex.pipeline.branches import follow_branches
from shardex.pipeline.indexers import advance_stability
from shardex.pipeline.registry import IndexRegistry, IndexView
from shardex.pipeline.rounds.between import (
    BetweenRounds,
    lowest_applied,
    not_applied,
    on_branch,
    stabilise_ts,
)
from shardex.pipeline.rounds.plan import views_key
from shardex.pipeline.rounds.read_ahead import ReadAhead
from shardex.pipeline.rounds.streamed import StreamedRound
from shardex.pipeline.rounds.tail import BatchTail
from shardex.pipeline.source.driver_read import PROJECT_ROWS

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession
    from pyspark.sql.streaming import StreamingQuery

__all__ = [
    "DEFAULT_DRIVER_READ_MAX",
    "DEFAULT_MAX_RECORDS",
    "MaintenanceJob",
    "read_offset",
    "stream_options",
]

log = logging.getLogger(__name__)

DEFAULT_RETRY_FOR = 300.0
# Batches of at most this many changes are read and projected on the driver (no Spark job).
# On 2 cores the driver path was 2-3x faster than Spark tasks for every batch size measured
# (the nodes and indexers need the other core), so it covers the default batch cap.
DEFAULT_DRIVER_READ_MAX = 20_000
# Admission control: the most changes one micro-batch takes (``max_records_per_batch``).
DEFAULT_MAX_RECORDS = 20_000
# Rounds between batches: a piece is read (and stabilised) once it holds this many changes
# or this many seconds passed since the last piece; each piece is a read of every partition.
DEFAULT_MIN_PIECE = 500
DEFAULT_PIECE_INTERVAL = 0.1
# ... and holds at most this many changes (a backlog is read beside the rounds, not in turn).
DEFAULT_MAX_PIECE = 10_000
# A batch that leaves its range to healthy rounds between batches holds Spark's next batch
# back this long at most (until the rounds stop): those batches only move the checkpoint.
DEFAULT_REST_WHILE_ROUNDS = 1.0


class MaintenanceJob:
    """One keyspace's streaming query. ``start()`` returns the running query."""

    # foreachBatch registered with the batch id only (``batch_callback.py``): the job never
    # executes the streaming DataFrame, so PySpark's per-batch session and DataFrame
    # wrappers (py4j round trips on Spark's critical path) are skipped. False: PySpark's
    # own ``foreachBatch``, the A/B of docs/decisions/0061-spark-per-batch-overhead.md.
    lean_callback = True

    def __init__(
        self,
        spark: SparkSession,
        client: Client,
        registry: IndexRegistry,
        source_options: dict[str, str],
        checkpoint: Path,
        *,
        starting: Timestamp | None = None,
        retry_for: float = DEFAULT_RETRY_FOR,
        trigger_interval: str = "0 seconds",
        on_batch: Callable[[BatchStats], None] | None = None,
        driver_read_max: int = DEFAULT_DRIVER_READ_MAX,
        overlap_stabilise: bool = True,
        stabilise_ahead: bool = True,
        piece_interval: float = DEFAULT_PIECE_INTERVAL,
        min_piece: int = DEFAULT_MIN_PIECE,
        max_piece: int = DEFAULT_MAX_PIECE,
        project_rows: int = PROJECT_ROWS,
        rest_while_rounds: float = DEFAULT_REST_WHILE_ROUNDS,
    ) -> None:
        self.spark = spark
        # Batches of at most this many changes are read and projected on the driver.
        self.driver_read_max = driver_read_max
        # A batch read on the driver is projected in groups of this many changes; with more
        # than one, its round starts sending them as they come (``rounds/streamed.py``).
        self.project_rows = project_rows
        self.client = client
        self.registry = registry
        self.keyspace = registry.keyspace
        self.source_options = dict(source_options)
        self.checkpoint = checkpoint
        self.starting = starting
        self.trigger_interval = trigger_interval
        self.on_batch = on_batch
        self.last: list[BatchStats] = []
        # Steps 2-5 of a batch, and every round's, with what the rounds leave behind.
        self.steps = BatchSteps(spark, client, registry, source_options, retry_for=retry_for)
        # Batches and idle rounds for index moves never overlap (``rounds/moves.py``).
        self._batch_lock = threading.Lock()
        # No two rounds overlap: a batch's, an idle one, one between batches.
        self._round_lock = threading.Lock()
        # The query is being stopped (``stop_rounds``): no read-ahead, no round between
        # batches from now on. Cleared by ``start``.
        self.stopping = False
        # The stabilise round of the last batch, beside Spark's commit (``rounds/tail.py``).
        self.overlap_stabilise = overlap_stabilise
        self.tail = BatchTail(f"stabilise-{self.keyspace}")
        self.read_ahead = ReadAhead(
            self.steps.read_and_project,
            lambda: self.client.high_seqnos(self.keyspace),
            int(
                stream_options(source_options, self.keyspace, None).get("max_records_per_batch", 0)
            ),
            min_piece=min_piece,
        )
        self.max_piece = max_piece
        # Spark's batches while rounds between batches carry the stream: each costs Spark's
        # planning and logs (~0.3 of a core at one every ~150 ms in a drain, ``docs/
        # decisions/0077-streamed-rounds-and-sustained-drain.md``) and only moves the
        # checkpoint, so such a batch rests in ``foreachBatch`` until the rounds stop (a
        # failure, new views, ``stop_rounds``) or this many seconds passed.
        self.rest_while_rounds = rest_while_rounds
        self.between = BetweenRounds(self.steps, self._round_lock)
        # A read-ahead that ended (halted, failed) ends a batch's rest too: no rounds now.
        self.read_ahead.on_end = self.between.ended.set
        self.stabilise_ahead = False
        if stabilise_ahead:
            self.stabilise_between(piece_interval)

    def stabilise_between(self, piece_interval: float = DEFAULT_PIECE_INTERVAL) -> None:
        """Run stability rounds between batches (``rounds/between.py``) from the next batch
        on: the read-ahead rolls, a piece at least ``min_piece`` changes or
        ``piece_interval`` seconds apart, and each piece gets a round with its own rows.
        Call before ``start``."""
        self.stabilise_ahead = True
        self.read_ahead.rolling = True
        self.read_ahead.piece_interval = piece_interval
        self.read_ahead.max_piece = self.max_piece

    # -- the query -----------------------------------------------------------------------------
    def start(self) -> StreamingQuery:
        # A restarted query: the previous query's last round is over (its failure, if any,
        # is caught up by the first batch from the slices' applied TS).
        self.close()
        self.stopping = False
        self.steps.cleaned.restart()  # what a previous query queued: its 1st round drops it
        self.starting = self._pin_starting()
        opts = stream_options(self.source_options, self.keyspace, self.starting)
        reader = self.spark.readStream.format("shardex").options(**opts)
        writer = reader.load().writeStream.queryName(f"shardex-maintain-{self.keyspace}")
        if self.lean_callback:
            writer = foreach_batch_id(writer, self.run_batch_id)
        else:
            writer = writer.foreachBatch(self.run_batch)
        query = (
            writer.option("checkpointLocation", str(self.checkpoint))
            .trigger(processingTime=self.trigger_interval)
            .start()
        )
        return query

    def _pin_starting(self) -> Timestamp | None:
        """The first start offset of this checkpoint, kept beside it: Spark re-plans batch 0
        from the source's initial offset after a restart, and the catch-up rule needs every
        batch's true start."""
        pinned = self.checkpoint / "shardex-start.json"
        if pinned.exists():
            return Timestamp.from_json(json.loads(pinned.read_text()))
        if self.starting is None:
            return None
        self.checkpoint.mkdir(parents=True, exist_ok=True)
        tmp = pinned.with_suffix(".tmp")
        tmp.write_text(json.dumps(self.starting.to_json()))
        tmp.replace(pinned)
        return self.starting

    def batch_range(self, batch_id: int) -> tuple[Timestamp, Timestamp]:
        start, end = logged_range(self.checkpoint, batch_id)
        if start is None:
            start = self.starting if self.starting is not None else Timestamp({})
        return start, end

    def _project(
        self,
        views: Sequence[IndexView],
        start: Timestamp,
        end: Timestamp,
        stats: BatchStats,
        rows: list[KeyVersion],
        top: Timestamp | None = None,
        floor: Timestamp | None = None,
        stream: StreamedRound | None = None,
    ) -> None:
        """Steps 2-3 (``BatchSteps.project``): on the driver for a batch of at most
        ``driver_read_max`` changes, with the read-ahead's rows."""
        self.steps.project(
            views,
            start,
            end,
            stats,
            rows,
            self.read_ahead,
            on_driver=stats.changes <= self.driver_read_max,
            group_rows=self.project_rows,
            top=top,
            floor=floor,
            stream=stream,
        )

    # -- one micro-batch -----------------------------------------------------------------------
    def run_batch(self, df: DataFrame, batch_id: int) -> None:
        """PySpark's ``foreachBatch`` signature; the DataFrame is not read (see ``_project``)."""
        self.run_batch_id(batch_id)

    def run_batch_id(self, batch_id: int) -> None:
        with self._batch_lock:
            self._run_batch(batch_id)

    def _run_batch(self, batch_id: int) -> None:
        # The previous batch's round first: its end is this batch's start. Its failure fails
        # this batch (the query restarts; the registry, not advanced, makes the re-run catch
        # the lost range up from the slices' applied TS).
        w0 = time.perf_counter()
        self.tail.join()
        t0 = time.perf_counter()
        start, end = self.batch_range(batch_id)
        stats = BatchStats(batch_id=batch_id, end=dict(end.to_wire()), wait_round=t0 - w0)
        self.registry.refresh()
        # A failover's new branch: indexes on the old one follow it, or the batch fails with
        # ROLLBACK if they applied past where it ended (``branches.py``).
        follow_branches(self.client, self.registry, end)
        rows: list[KeyVersion] = []
        stats.changes = count_changes(start, end)
        top = end  # the TS this batch stabilises at
        if self.stabilise_ahead and not self.stopping and self._left_to_rounds(end):
            # The rounds between batches carry on past this batch's end: nothing to do.
            # Spark's trigger saw new offsets: an idle read-ahead looks now, not after its
            # back-off (``rounds/read_ahead.py``).
            self.read_ahead.wake()
            stats.between = True
            stats.total = time.perf_counter() - t0
            self._record(stats)
            self.between.ended.wait(self.rest_while_rounds)
            return
        stream: StreamedRound | None = None
        if self.stabilise_ahead:
            self.read_ahead.halt()
            self.between.drain()  # a round between batches in flight ends first
            views, top = self._ahead_views(end)
            if views:
                applied = {v.id: self.registry.applied(v.id) for v in views}
                if count_changes(start, top) > self.project_rows and (
                    stats.changes <= self.driver_read_max
                ):
                    # No other round runs until this one ends: the rounds between batches
                    # are halted (above), an idle round needs the batch lock, the last
                    # batch's round was joined.
                    stream = self.steps.stream_round(views, start, top, batch_id, applied)
                try:
                    with gc_paused():
                        floor = lowest_applied(self.registry, views)
                        self._project(views, start, end, stats, rows, top, floor, stream)
                        rows = not_applied(rows, applied)
                except BaseException:
                    if stream is not None:
                        # The query fails; its restart's first round drops what this one
                        # queued (above its start, on every node: ``CleanedNodes.restart``).
                        stream.abandon()
                    raise
        else:
            # An index whose applied TS is ahead of this batch's end in some partition (it
            # joined at a T0 the stream has not reached) waits for a later batch: stabilising
            # it at ``end`` would move it backwards. Its skipped range is caught up later.
            views = [
                v for v in self.registry.maintained() if end.covers(self.registry.applied(v.id))
            ]
            if views:
                with gc_paused():
                    self._project(views, start, end, stats, rows)

        def finish() -> None:
            with self._round_lock:
                if not self._covered(views, rows, top):
                    self.steps.deliver_and_stabilise(
                        views, rows, start, top, batch_id, stats, stream
                    )
            stats.total = time.perf_counter() - t0
            self._record(stats)

        if self.overlap_stabilise:
            self.tail.start(finish)  # Spark commits this batch meanwhile (``rounds/tail.py``)
            if views and stats.on_driver and not self.stopping:
                # The next batch's changes, read beside this round and Spark's commit, and
                # stabilised in rounds of their own (``rounds/between.py``).
                hook = None
                if self.stabilise_ahead:
                    hook = self.between.hook(self.tail.future(), views, batch_id)
                self.read_ahead.start([v.definition for v in views], end, hook)
        else:
            finish()

    def _left_to_rounds(self, end: Timestamp) -> bool:
        """The rounds between batches are healthy (their thread runs, none failed or
        stopped, the last one published every index) and route by the views this batch
        would: they stabilise this batch's range too (they read up to the high seqnos, at or
        past ``end``), so the batch leaves it to them. A batch that finds otherwise halts
        them and takes over (F, ``_ahead_views``); a later failure of theirs is repaired by
        the next batch the same way (its catch-up reads from the applied TS)."""
        if not self.between.live or not self.read_ahead.running():
            return False
        if not self.steps.round_published and not self.between.in_flight():
            # (A round in flight unsets it until it ends; it started after one that
            # published every index.)
            return False
        views = self.registry.maintained()
        if not views or views_key(views) != self.between.key:
            return False  # an index joined or left, a topology or a move changed
        return all(
            on_branch(end, self.registry.applied(v.id), self.registry.ahead(v.id)) for v in views
        )

    def _ahead_views(self, end: Timestamp) -> tuple[list[IndexView], Timestamp]:
        """With rounds between batches: the indexes this batch maintains, and F, the TS it
        stabilises them at (``between.stabilise_ts``). An index is left out only where
        its applied or ahead TS is on another branch than ``end`` in some partition (a
        rollback or failover: the stream fails, or a later batch sorts it out)."""
        views = []
        for v in self.registry.maintained():
            if on_branch(end, self.registry.applied(v.id), self.registry.ahead(v.id)):
                views.append(v)
        return views, stabilise_ts(end, [self.registry.ahead(v.id) for v in views])

    def _covered(self, views: Sequence[IndexView], rows: list[KeyVersion], top: Timestamp) -> bool:
        """Rounds between batches already did this batch's round: no rows left to send, the
        last round was at ``top``, by the same views, published for every index."""
        if not self.stabilise_ahead or rows or not views:
            return False
        steps = self.steps
        if not steps.round_published or steps.round_key != views_key(views):
            return False
        if steps.stable is None or steps.stable.to_wire() != top.to_wire():
            return False
        return all(self.registry.applied(v.id).covers(top) for v in views)

    def stop_rounds(self) -> None:
        """Before the query is stopped: once this returns no stability round between batches
        runs (a stopped pipeline publishes nothing more; its last batches, if any, stabilise
        their own ranges). Waits for the batch in ``foreachBatch`` and a round in flight."""
        self.stopping = True
        self.between.ended.set()  # a batch resting while the rounds run returns now
        with self._batch_lock:
            self.read_ahead.discard()
            self.between.drain()

    def close(self, timeout: float = 60.0) -> None:
        """Wait for the last batch's round (the query is stopped): its failure is logged, not
        raised; the next job catches the batch up from the slices' applied TS."""
        try:
            with self._batch_lock:
                self.read_ahead.discard()
                try:
                    self.tail.join(timeout)
                finally:
                    self.read_ahead.discard()  # one a tail may have started meanwhile
                    self.between.drain()
        except Exception as exc:
            log.warning("last stabilise round of %s: %s", self.keyspace, exc)

    # -- index moves on an idle keyspace ---------------------------------------------------
    def idle_round(self) -> list[str]:
        """An empty stabilise round at the stream's position for the index moves no round
        has been routed to yet (``rounds/moves.py`` argues why it is exact); the ids of the
        indexes it named. Skipped while a batch runs: that batch carries the round."""
        if not self._batch_lock.acquire(blocking=False):
            return []
        try:
            # Never beside another round: one in flight (a batch's, or one between batches,
            # which only run while writes come, so batches carry the moves) skips this poll.
            if not self._round_lock.acquire(blocking=False):
                return []
            try:
                return self._idle_round()
            finally:
                self._round_lock.release()
        finally:
            self._batch_lock.release()

    def _idle_round(self) -> list[str]:
        if self.tail.busy():
            return []  # the last batch's round is still running: it carries the moves
        try:
            self.tail.join()
        except Exception as exc:  # the next batch delivers it again, or fails the query
            log.info("stabilise round of the last batch of %s failed: %s", self.keyspace, exc)
            return []
        self.registry.refresh()
        views = self.registry.maintained()
        if not any(v.moving for v in views):
            self.steps.move_rounds.pending([], Timestamp({}), self.registry.applied)
            return []
        stable = self.steps.stable
        position = stable if stable is not None else self.committed_position()
        if position is None:
            return []
        # Only indexes whose slices applied ``position`` (a batch Spark committed while its
        # round failed leaves them behind it: the next batch catches them up first).
        views = [v for v in views if self.registry.applied(v.id).covers(position)]
        moving = self.steps.move_rounds.pending(views, position, self.registry.applied)
        if not moving:
            return []
        reply = advance_stability(
            self.client,
            self.keyspace,
            position,
            sorted(moving),
            timekeeper=self.registry.timekeeper,
            moving=moving,
        )
        self.registry.advanced(reply.published, position)
        self.steps.move_rounds.confirmed(moving)
        log.info("idle stabilise round at the stream's position for moves of %s", moving)
        return sorted(moving)

    def position(self) -> Timestamp | None:
        """Where the stream stands (its last committed batch's end) while no batch or round
        runs; None while one does (the stall watchdog's view: ``watchdog.py``)."""
        if self._batch_lock.locked() or self._round_lock.locked() or self.tail.busy():
            return None
        return self.committed_position()

    def committed_position(self) -> Timestamp | None:
        """The end of the checkpoint's last committed batch (where the next batch starts),
        or the stream's first start when none committed yet."""
        commits = self.checkpoint / "commits"
        names = [p.name for p in commits.iterdir()] if commits.is_dir() else []
        ids = [int(n) for n in names if n.isdigit()]
        if ids:
            return read_offset(self.checkpoint, max(ids))
        return self.starting

    def _record(self, stats: BatchStats) -> None:
        self.last.append(stats)
        del self.last[:-100]
        if stats.errors:
            log.warning("batch %d: evaluation errors per index %s", stats.batch_id, stats.errors)
        log.debug(
            "batch %d: %d changes, %d key versions, project %.1f ms, deliver %.1f ms, "
            "stabilise %.1f ms, total %.1f ms",
            stats.batch_id,
            stats.changes,
            stats.key_versions,
            stats.project * 1e3,
            stats.deliver * 1e3,
            stats.stabilise * 1e3,
            stats.total * 1e3,
        )
        if self.on_batch is not None:
            self.on_batch(stats)


def stream_options(
    source_options: Mapping[str, str], keyspace: str, starting: Timestamp | None
) -> dict[str, str]:
    """The change source's options for a maintenance stream. Admission control: a backlog
    becomes a run of batches of at most ``max_records_per_batch`` changes (default
    ``DEFAULT_MAX_RECORDS``; "0" lifts the cap), so the driver reads and projects each one
    itself and no batch holds the stability TS back for long."""
    opts = dict(source_options, keyspace=keyspace)
    if starting is not None:
        opts["starting_offsets"] = json.dumps(starting.to_json())
    cap = opts.pop("max_records_per_batch", str(DEFAULT_MAX_RECORDS))
    if cap not in ("", "0"):
        opts["max_records_per_batch"] = cap
    return opts
