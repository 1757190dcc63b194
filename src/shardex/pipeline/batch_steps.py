"""One micro-batch's steps 2-5 for the maintenance job (``maintain.py``, which sets up the
query and runs each batch through them), and every round's:

* steps 2-3, project: the key versions of (start, end] - read and projected on the driver
  for a small batch (the read-ahead's rows first), by a projected batch read on Spark's
  workers for a larger one - and of the catch-up of any index behind the batch's start;
* steps 4-5, the round: route, one ``DeliverAndStabilise`` per indexer, the timekeeper's
  check and publish, retried with back-off for what time can heal.

``BatchSteps`` is the job's collaborator for both, and holds what the rounds leave behind
(the last TS stabilised, whether every index of the last round published, the nodes a round
dropped on); the job, the rounds between batches (``rounds/between.py``) and idle rounds
read it. ``BatchStats`` records what each step took.
"""

from __future__ import annotations

import json
import logging
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from shardex.client import Client
from shardex.core.gcpause import gc_paused
from shardex.core.timestamp import SeqnoEntry, Timestamp
from shardex.errors import ShardexError
from shardex.index.keyversion import ERROR, KeyVersion, from_arrow
from shardex.meta.index_definition import IndexDefinition
from shardex.pipeline.project.router import route
from shardex.pipeline.registry import IndexRegistry, IndexView
from shardex.pipeline.rounds.between import raise_floor
from shardex.pipeline.rounds.cleaned import CleanedNodes
from shardex.pipeline.rounds.machine import RoundEnds
from shardex.pipeline.rounds.moves import MoveRounds
from shardex.pipeline.rounds.plan import round_slices, stabilise_plan, views_key
from shardex.pipeline.rounds.read_ahead import ReadAhead
from shardex.pipeline.rounds.retry import retry_pause, retryable
from shardex.pipeline.rounds.sender import RoundSender, run_round
from shardex.pipeline.rounds.streamed import StreamedRound
from shardex.pipeline.source.driver_read import read_and_project
from shardex.pipeline.source.projected import ProjectSpec

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

__all__ = ["BatchStats", "BatchSteps", "count_changes", "min_ts"]

log = logging.getLogger(__name__)


@dataclass
class BatchStats:
    """Per-batch timings (seconds) and counts, kept for the last batches and logged."""

    batch_id: int
    changes: int = 0
    key_versions: int = 0
    errors: dict[str, int] = field(default_factory=dict)
    project: float = 0.0  # read + project of (start, end] (what the read-ahead left)
    catch_up: float = 0.0
    deliver: float = 0.0  # route + DeliverAndStabilise on every indexer (the last attempt)
    stabilise: float = 0.0  # the timekeeper's check and publish
    total: float = 0.0  # from the batch's start to its publication (the round included)
    # foreachBatch waiting for the previous batch's round (``tail.join``), before ``total``'s
    # start: the part of Spark's addBatch that is our round outlasting Spark's commit.
    wait_round: float = 0.0
    retries: int = 0
    on_driver: bool = False  # read and projected on the driver (small batch)
    read_ahead: int = 0  # key versions taken from the read-ahead (``rounds/read_ahead.py``)
    between: bool = False  # left to the stability rounds between batches (``rounds/between.py``)
    streamed: int = 0  # key versions sent while the batch was projected (``rounds/streamed.py``)
    end: dict[int, tuple[int, int]] = field(default_factory=dict)


class BatchSteps:
    """Steps 2-5 of one keyspace's micro-batches and the rounds between them: the
    maintenance job's reads, projections and rounds, with the state the rounds leave."""

    def __init__(
        self,
        spark: SparkSession,
        client: Client,
        registry: IndexRegistry,
        source_options: dict[str, str],
        *,
        retry_for: float,
    ) -> None:
        self.spark = spark
        self.client = client
        self.registry = registry
        self.keyspace = registry.keyspace
        self.source_options = dict(source_options)
        self.retry_for = retry_for
        self.errors: Counter[str] = Counter()  # evaluation errors per index id
        self.stable: Timestamp | None = None  # the last TS this job had published
        # The last round that succeeded: every index of it published, and what it routed by
        # (a between-batch round follows only a round that published all, by the same views).
        self.round_published = True
        self.round_key: tuple[Any, ...] | None = None
        self.move_rounds = MoveRounds()
        # The nodes a round of this query dropped on above its start (``rounds/cleaned.py``).
        self.cleaned = CleanedNodes()

    def project(
        self,
        views: Sequence[IndexView],
        start: Timestamp,
        end: Timestamp,
        stats: BatchStats,
        rows: list[KeyVersion],
        read_ahead: ReadAhead,
        *,
        on_driver: bool,
        group_rows: int,
        top: Timestamp | None = None,
        floor: Timestamp | None = None,
        stream: StreamedRound | None = None,
    ) -> None:
        """Steps 2-3: the key versions of (start, end] and of any catch-up, into ``rows``.
        ``on_driver``: read and project here (``read_ahead``'s rows first), in groups of
        ``group_rows`` changes; else by a projected batch read on Spark's workers (and
        ``read_ahead`` is discarded). Between-batch rounds (``rounds/between.py``): the range
        read goes up to ``top`` (F >= end) and starts no lower than ``floor`` (what every
        view applied), so only what is not applied is read. ``stream``: the rows of a batch
        read on the driver go to it group by group too, as they are projected (its round
        starts sending them, ``rounds/streamed.py``)."""
        t = time.perf_counter()

        def add(group: list[KeyVersion]) -> None:
            rows.extend(group)
            if stream is not None and group:
                stream.offer(group)

        upto = end if top is None else top
        defs = [v.definition for v in views]
        if on_driver:
            # Small batch: read (start, end] here and project in this process. A Spark
            # job (plan, Python worker round trips, Arrow collect) costs more than the
            # work itself; the rows are the same either way (the DataFrame is the same
            # range of the same source and is simply not executed).
            stats.on_driver = True
            got = read_ahead.take(defs, start, end)
            rest = start
            if got is not None:  # read while Spark committed the previous batch
                rest = got.covered
                stats.read_ahead = len(got.rows)
                add(got.rows)
            if floor is not None:
                rest = raise_floor(rest, floor)
            if rest != upto and stream is None:
                rows.extend(self.read_and_project(defs, rest, upto))
            elif rest != upto:
                read_and_project(
                    self.client,
                    self.keyspace,
                    defs,
                    rest,
                    upto,
                    group_rows=group_rows,
                    on_group=add,
                )
        else:
            stream = None  # one table from Spark: nothing to stream
            read_ahead.discard()
            rows.extend(self._read_and_project_on_workers(defs, start, end))
            if upto != end:
                rest = end if floor is None else raise_floor(end, floor)
                rows.extend(self.read_and_project(defs, rest, upto))
        stats.project = time.perf_counter() - t
        t = time.perf_counter()
        add(self._catch_up(views, start))
        stats.catch_up = time.perf_counter() - t

    def read_and_project(
        self, defs: Sequence[IndexDefinition], start: Timestamp, end: Timestamp
    ) -> list[KeyVersion]:
        # Stream items straight into the projector's columns, rows kept as tuples, every
        # partition's stream open at once (``source/driver_read.py``).
        return read_and_project(self.client, self.keyspace, defs, start, end)

    def _read_and_project_on_workers(
        self, defs: Sequence[IndexDefinition], start: Timestamp, end: Timestamp
    ) -> list[KeyVersion]:
        """(start, end] through a projected batch read: the micro-batch's own DataFrame
        covers the same range but carries whole documents through the JVM and back into a
        second Python worker (``mapInArrow``); this read's tasks project where they read."""
        opts = {
            k: v
            for k, v in self.source_options.items()
            if k not in ("starting_offsets", "max_records_per_batch", "reader")
        }
        opts.update(
            keyspace=self.keyspace,
            mode="changes",
            start_ts=json.dumps(start.to_json()),
            end_ts=json.dumps(end.to_json()),
            project=ProjectSpec.definitions_option(defs),
        )
        table = self.spark.read.format("shardex").options(**opts).load().toArrow()
        out: list[KeyVersion] = []
        for b in table.to_batches():
            out.extend(from_arrow(b))
        return out

    def _catch_up(self, views: Sequence[IndexView], start: Timestamp) -> list[KeyVersion]:
        """Key versions of (applied, start] for every index whose applied TS is behind the
        batch's start (read on the driver: these ranges are small, a build's tail)."""
        behind = [v for v in views if not self.registry.applied(v.id).covers(start)]
        if not behind:
            return []
        low = self.registry.applied(behind[0].id)
        for v in behind[1:]:
            low = min_ts(low, self.registry.applied(v.id))
        lower = min_ts(low, start)
        defs = [v.definition for v in behind]
        out = read_and_project(self.client, self.keyspace, defs, lower, start)
        log.info(
            "caught up %d change(s) for %s behind the stream",
            count_changes(lower, start),
            ", ".join(v.id for v in behind),
        )
        return out

    def deliver_and_stabilise(
        self,
        views: Sequence[IndexView],
        rows: list[KeyVersion],
        start: Timestamp,
        end: Timestamp,
        batch_id: int,
        stats: BatchStats,
        streamed: StreamedRound | None = None,
    ) -> None:
        """Steps 4-5, retrying what time can heal with back-off for ``retry_for`` seconds
        (every retry delivers the whole batch again, after the indexers dropped what was
        queued above ``start``: slices drop what they hold). ``streamed``: the first
        attempt's rows sent while the batch was projected."""
        deadline = time.monotonic() + self.retry_for
        attempt = 0
        while True:
            try:
                self._attempt(views, rows, start, end, batch_id, stats, streamed)
                return
            except ShardexError as exc:
                if not retryable(exc) or time.monotonic() > deadline:
                    raise
                attempt += 1
                stats.retries = attempt
                streamed = None  # the frames sent while projecting may be gone: all rows again
                stats.streamed = 0
                pause = retry_pause(attempt)
                log.warning(
                    "batch %d of %s: %s (%s); retrying in %.2f s",
                    batch_id,
                    self.keyspace,
                    exc,
                    exc.code,
                    pause,
                )
                time.sleep(pause)
                self.registry.refresh(force=True)
                views = [v for v in self.registry.maintained() if v.id in {w.id for w in views}]

    def _attempt(
        self,
        views: Sequence[IndexView],
        rows: list[KeyVersion],
        start: Timestamp,
        end: Timestamp,
        batch_id: int,
        stats: BatchStats,
        streamed: StreamedRound | None = None,
    ) -> None:
        """Route, then one ``DeliverAndStabilise`` per indexer (in parallel), then the
        timekeeper checks the replies and publishes. The indexers first drop what may have
        been queued above ``start`` by rounds this query does not know of
        (``rounds/cleaned.py``). With ``streamed`` (rows already sent by the same views while
        the batch was projected) only the rest is routed, and the round's frames continue
        its sender's."""
        if not views:
            self.stable = end
            self.round_published, self.round_key = True, ()
            return
        if streamed is not None and not streamed.started:
            streamed = None  # nothing went out early: the usual round
        t = time.perf_counter()
        routes = {v.id: v.route() for v in views}
        send = rows if streamed is None else streamed.rest(rows)
        with gc_paused():
            routed = route((r for r in send if r[0] in routes or r[2] == ERROR), routes)
        if streamed is not None:
            errors = Counter(r[0] for r in rows if r[2] == ERROR)
        else:
            errors = routed.errors
        stats.errors = dict(errors)
        stats.key_versions = sum(len(r) for r in routed.by_node.values())
        plan, moving_by_node = stabilise_plan(views)
        # Before anything is sent: some slices may apply ``end`` even if the round fails.
        self.round_published = False
        self.registry.attempted(sorted(routes), end)
        how: dict[str, Any]
        if streamed is not None:
            stats.streamed = streamed.key_versions
            stats.key_versions += streamed.key_versions
            dropped = streamed.dropped
            how = {"sender": streamed.sender}
        else:
            drop = self.cleaned.drop_above(start, end, plan)
            dropped = drop is not None
            how = {"drop_above": drop}
        moving = {v.id: dict(v.moving) for v in views if v.moving}  # index moves' targets
        ends = RoundEnds(
            ts=end,
            by_node=routed.by_node,
            plan=plan,
            index_ids=sorted(routes),
            slices=round_slices(views),
            moving=moving_by_node,
            advance_moving=moving,
        )
        done, stats.stabilise = run_round(
            self.client,
            self.keyspace,
            batch_id,
            ends,
            timekeeper=self.registry.timekeeper,
            **how,
        )
        # ``deliver``: route, deliver and stabilise on the indexers; ``stabilise``: the
        # timekeeper's check and publish
        stats.deliver = time.perf_counter() - t - stats.stabilise
        self.registry.advanced(done.published, end)
        self.move_rounds.confirmed(moving)
        for index_id, n in stats.errors.items():
            self.errors[index_id] += n
        self.stable = end
        self.round_published = set(routes) <= set(done.published)
        self.round_key = key = views_key(views)
        self.cleaned.round_done(key, done.report.incarnations, dropped, missed=done.report.missed)
        if done.report.missed:
            # Nodes that missed the round: copies of theirs may have left the topology
            # (``manager/index_copies.py``); the next round must route without them.
            log.warning(
                "batch %d of %s: %s missed the round; published %s, dropped copies %s",
                batch_id,
                self.keyspace,
                ", ".join(f"{n} ({e.code})" for n, e in sorted(done.report.missed.items())),
                done.published,
                dict(done.dropped_copies),
            )
            self.registry.refresh(force=True)

    def stream_round(
        self,
        views: Sequence[IndexView],
        start: Timestamp,
        end: Timestamp,
        batch_id: int,
        applied: dict[str, Timestamp],
    ) -> StreamedRound:
        """The round of a batch (start, end] by ``views``, begun while its rows are still
        projected (``rounds/streamed.py``). Its first rows drop what may be queued above
        ``start`` where the round would (``CleanedNodes.drop_above``); before them, as
        before any round's, the registry learns that the slices may reach ``end``."""
        routes = {v.id: v.route() for v in views}
        plan, _moving = stabilise_plan(views)
        drop = self.cleaned.drop_above(start, end, plan)

        def begin() -> None:
            self.round_published = False
            self.registry.attempted(sorted(routes), end)

        sender = RoundSender(self.client, self.keyspace, batch_id, drop_above=drop)
        return StreamedRound(sender, routes, applied, begin, dropped=drop is not None)

    def round(
        self,
        views: Sequence[IndexView],
        rows: list[KeyVersion],
        start: Timestamp,
        end: Timestamp,
        batch_id: int,
    ) -> BatchStats:
        """A stability round between batches (``rounds/between.py``): the same ``_attempt``
        as a batch's round, once (no retry: the next batch repairs). What it did."""
        stats = BatchStats(batch_id=batch_id)
        self._attempt(views, rows, start, end, batch_id, stats)
        return stats


def count_changes(start: Timestamp, end: Timestamp) -> int:
    """The changes in (start, end]: per partition, how far end's seqno is past start's."""
    return sum(max(0, e.seqno - start.seqno(p)) for p, e in end.items())


def min_ts(a: Timestamp, b: Timestamp) -> Timestamp:
    """Per partition the lower of the two entries (absent = seqno 0)."""
    zero = SeqnoEntry(0, 0)
    return Timestamp(
        {p: min(a.get(p, zero), b.get(p, zero), key=lambda e: e.seqno) for p in set(a) | set(b)}
    )
