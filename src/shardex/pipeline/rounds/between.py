"""Stability rounds between Spark's micro-batches (``MaintenanceJob(stabilise_ahead=True)``).

The design lets the Index Manager create stability timestamps "based on the SYNC messages
received and some algorithm": a stability point need not be a Spark batch's end. After batch B's
round succeeded and was published for every index, the read-ahead thread (started at B's end E_B
with B's views' definitions, rolling) keeps reading pieces and runs rounds through the batch's
own ``_attempt``, one at a time, each on a thread of its own while the next piece is read: route
by B's views, one ``DeliverAndStabilise`` per indexer with the rows read since the last round
(those not applied) and the stabilise at T' = pointwise max(their end, last stabilised TS), then
``AdvanceStability(T')``. A write is then covered about one piece + one round after it was
acknowledged instead of half a Spark cycle + Spark's planning + a read + a round.

A later batch (S, E] leaves its range to these rounds while they are healthy and route by
the views it would (``MaintenanceJob._left_to_rounds``). Otherwise it halts them (waiting for
a round in flight: ``drain``), leaves out the rows the views applied (``not_applied``) and
stabilises at F = ``stabilise_ts``: the highest of E and every view's *ahead* TS (the
registry's highest TS any slice may have applied, raised before every round, so it includes
what a round that failed half way reached); it reads (E, F] too where F > E. An index on
another branch than E in some partition (a rollback or a failover between) is left out as
before (``on_branch``). The argument (nothing lost or doubled, stability monotonic and common
to all slices): ``docs/decisions/0074-stability-rounds-between-batches.md``.
"""

from __future__ import annotations

import concurrent.futures
import logging
import threading
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from shardex.core.timestamp import SeqnoEntry, Timestamp
from shardex.index.keyversion import KeyVersion
from shardex.pipeline.registry import IndexRegistry, IndexView
from shardex.pipeline.rounds.plan import views_key
from shardex.pipeline.rounds.read_ahead import Ahead, Deliver

__all__ = [
    "BetweenRounds",
    "lowest_applied",
    "not_applied",
    "on_branch",
    "raise_floor",
    "stabilise_ts",
]

log = logging.getLogger(__name__)


class _RoundStats(Protocol):
    """What a round reports: key versions sent, its deliver + stabilise and publish times."""

    key_versions: int
    deliver: float
    stabilise: float


class _Rounds(Protocol):
    """What a between-batch round needs of the maintenance job's rounds (``BatchSteps``)."""

    registry: IndexRegistry
    stable: Timestamp | None
    round_published: bool
    round_key: tuple[object, ...] | None

    def round(self, views: Sequence[IndexView], rows: list[KeyVersion], start: Timestamp,
              end: Timestamp, batch_id: int) -> _RoundStats: ...  # fmt: skip


def on_branch(end: Timestamp, applied: Timestamp, ahead: Timestamp) -> bool:
    """A batch ending at ``end`` may maintain an index with these applied and ahead TSs:
    every partition it applied (seqno > 0) is in ``end`` on the same branch (uuid), as the
    old rule (``end.covers(applied)``) asked, and every partition where a slice may be past
    ``end`` is past it on ``end``'s branch (so F, the pointwise max, is one history)."""
    for p, a in applied.items():
        if a.seqno == 0:
            continue
        e = end.get(p)
        if e is None or e.uuid != a.uuid:
            return False
    for p, a in ahead.items():
        e = end.get(p)
        if a.seqno > (0 if e is None else e.seqno) and (e is None or e.uuid != a.uuid):
            return False
    return True


def stabilise_ts(end: Timestamp, aheads: Iterable[Timestamp]) -> Timestamp:
    """F: per partition the highest of ``end`` and ``aheads`` (all on ``end``'s branch where
    they matter, ``on_branch``): every slice is at or below it, none is asked to go back."""
    out = dict(end.items())
    for ahead in aheads:
        for p, a in ahead.items():
            e = out.get(p)
            if e is not None and a.seqno > e.seqno:
                out[p] = a
    return Timestamp(out)


def raise_floor(start: Timestamp, floor: Timestamp) -> Timestamp:
    """``start`` raised to ``floor`` in the partitions where ``floor`` is above it on the
    same branch: the records up to it are applied, there is nothing to read below."""
    out: dict[int, SeqnoEntry] | None = None
    for p, f in floor.items():
        s = start.get(p)
        if s is not None and f.uuid == s.uuid and f.seqno > s.seqno:
            if out is None:
                out = dict(start.items())
            out[p] = f
    return start if out is None else Timestamp(out)


def lowest_applied(registry: IndexRegistry, views: Sequence[IndexView]) -> Timestamp:
    """Per partition the lowest applied TS over ``views`` (what every one of them has)."""
    out: dict[int, SeqnoEntry] = {}
    for n, v in enumerate(views):
        applied = registry.applied(v.id)
        if n == 0:
            out = dict(applied.items())
            continue
        for p in list(out):
            a = applied.get(p)
            if a is None:
                del out[p]
            elif a.seqno < out[p].seqno:
                out[p] = a
    return Timestamp(out)


def not_applied(rows: list[KeyVersion], applied: dict[str, Timestamp]) -> list[KeyVersion]:
    """The rows whose index has not applied their seqno (every slice of it has: the
    registry's applied TS is the lowest over the slices). Rows of other indexes are kept."""
    floors = {i: {p: e.seqno for p, e in ts.items()} for i, ts in applied.items()}
    out = []
    for r in rows:
        floor = floors.get(r[0])
        if floor is None or r[6] > floor.get(r[5], 0):
            out.append(r)
    return out


@dataclass
class BetweenStats:
    """What the between-batch rounds did (for the bench and the logs)."""

    rounds: int = 0
    failed: int = 0
    stopped: int = 0  # rounds not run: the views changed, a branch moved, not published
    key_versions: int = 0
    walls: list[float] = field(default_factory=list)  # the last rounds' wall times (s)
    # of each of those rounds: deliver + stabilise on the indexers, the timekeeper's publish
    delivers: list[float] = field(default_factory=list)
    publishes: list[float] = field(default_factory=list)


class BetweenRounds:
    """The between-batch rounds of one maintenance job. ``lock`` is the job's round lock:
    no between-batch round overlaps a batch's round or an idle round."""

    def __init__(self, rounds: _Rounds, lock: threading.Lock) -> None:
        self.rounds = rounds
        self.lock = lock
        self.stats = BetweenStats()
        # The rounds of the current hook go on (none failed or stopped), by views ``key``;
        # ``ended`` is set whenever they stop (a batch resting while they run wakes up).
        self.ended = threading.Event()
        self.ended.set()
        self._live = False
        self.key: tuple[object, ...] | None = None
        self._inflight: _Inflight | None = None

    @property
    def live(self) -> bool:
        return self._live

    @live.setter
    def live(self, value: bool) -> None:
        self._live = value
        if value:
            self.ended.clear()
        else:
            self.ended.set()

    def hook(
        self,
        done: concurrent.futures.Future[None] | None,
        views: Sequence[IndexView],
        batch_id: int,
    ) -> Deliver:
        """The read-ahead's ``deliver`` after batch ``batch_id`` (whose round is ``done``).
        Each call that finds no round in flight and rows or a TS not stabilised yet starts a
        round with everything read so far, on a thread of its own, so the next piece is read
        while it runs (as the read-ahead overlaps a batch's round). False (no more rounds
        until a batch takes over) once one failed or may not run."""
        views = list(views)
        key = views_key(views)
        ids = {v.id for v in views}
        self.live, self.key = True, key

        def deliver(ahead: Ahead, stop: threading.Event, wait: float) -> bool:
            if done is not None:
                try:
                    done.result(timeout=wait)
                except concurrent.futures.TimeoutError:
                    return True  # the batch's round still runs: nothing may overtake it
                except BaseException:
                    self.live = False
                    return False  # it failed: the next batch raises it
            r = self._inflight
            if r is not None:
                # Wait a little (a capped read-ahead calls again at once), then read on.
                r.thread.join(wait)
                if r.thread.is_alive():
                    return True
                self._inflight = None
                if not r.ok:
                    self.live = False  # failed or stopped: a batch takes over
                    return False
                # Published for every index: those rows are applied on every slice (a batch
                # that takes over reads what is not applied itself); read on from its end.
                del ahead.rows[: r.count]
                ahead.start = r.end
            if stop.is_set():
                return False
            stable = self.rounds.stable
            if not ahead.rows and stable is not None and stable.covers(ahead.end):
                return True  # nothing new since the last round
            r = _Inflight(len(ahead.rows), ahead.end)
            rows = ahead.rows[: r.count]

            def run() -> None:
                with self.lock:
                    r.ok = self._one(rows, r.end, views, key, ids, batch_id)

            r.thread = threading.Thread(target=run, name="between-round", daemon=True)
            self._inflight = r
            r.thread.start()
            return True

        return deliver

    def in_flight(self) -> bool:
        """A round between batches is running (it started after a round that published
        every index)."""
        r = self._inflight
        return r is not None and r.thread.is_alive()

    def drain(self) -> None:
        """Wait for the round in flight (the read-ahead thread was halted: no new one)."""
        r, self._inflight = self._inflight, None
        if r is not None:
            r.thread.join()
        self.live = False

    def _one(
        self,
        rows: list[KeyVersion],
        end: Timestamp,
        views: list[IndexView],
        key: tuple[object, ...],
        ids: set[str],
        batch_id: int,
    ) -> bool:
        """One round for ``rows`` (read up to ``end``): True when it ran and published every
        index (or had nothing to do)."""
        rounds = self.rounds
        stable = rounds.stable
        if not rounds.round_published or stable is None or rounds.round_key != key:
            # The last round (the batch's or one of these) did not publish every index, or
            # routed by other views (an idle round for a move): a batch takes over.
            self.stats.stopped += 1
            return False
        if not on_branch(end, stable, stable):
            self.stats.stopped += 1  # a failover moved a partition: the batch sorts it out
            return False
        current = [v for v in rounds.registry.maintained() if v.id in ids]
        if views_key(current) != key:
            # A move started routing, a topology switched, an index was dropped or sent to
            # a rebuild: these views no longer route right. The next batch takes over.
            self.stats.stopped += 1
            return False
        applied = {v.id: rounds.registry.applied(v.id) for v in views}
        send = not_applied(rows, applied)
        to = end.merge_max(stable)
        t = time.perf_counter()
        try:
            done = rounds.round(views, send, stable, to, batch_id)
        except Exception as exc:  # not retried: the next batch stabilises past it (F)
            self.stats.failed += 1
            log.info("stability round between batches of %s failed: %s", views[0].id, exc)
            return False
        s = self.stats
        s.rounds += 1
        s.key_versions += done.key_versions
        for samples, value in (
            (s.walls, time.perf_counter() - t),
            (s.delivers, done.deliver),
            (s.publishes, done.stabilise),
        ):
            samples.append(value)
            del samples[:-200]
        return rounds.round_published


@dataclass(eq=False)
class _Inflight:
    """A round between batches on its thread: the first ``count`` rows of the read-ahead,
    read up to ``end``; ``ok`` once it ran and published every index."""

    count: int
    end: Timestamp
    ok: bool = False
    thread: threading.Thread = field(default_factory=threading.Thread)
