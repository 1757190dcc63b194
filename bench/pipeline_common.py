"""Shared pieces of ``bench.pipeline``: the in-process pipeline driver, the published
stability TS, per-batch statistics and update documents.

Nothing here imports PySpark at module level: the writer and poller processes of
``bench.pipeline_maintain`` import this module too.
"""

from __future__ import annotations

import random
import statistics
import sys
import threading
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import msgspec

from bench.data_service import percentile
from bench.runner import Row, load_average

KEYSPACE = "people"
SEED = 20240601
# The two indexes: (name, keys, where, partition_by, num_partition) and their PostgreSQL twin
# (expression index on the jsonb column, the same WHERE as a partial index).
INDEXES: list[dict[str, Any]] = [
    {
        "name": "by_city_age",
        "keys": ["address.city", "age"],
        "where": None,
        "partition_by": ["META().id"],
        "num_partition": 4,
        "pg": "CREATE INDEX pg_city_age ON docs ((body->'address'->'city'), (body->'age'))",
    },
    {
        "name": "by_email",
        "keys": ["email"],
        "where": "status = 'active'",
        "partition_by": None,
        "num_partition": None,
        "pg": "CREATE INDEX pg_email ON docs ((body->'email')) WHERE body->>'status' = 'active'",
    },
]
INDEX_NAMES = [i["name"] for i in INDEXES]


def log(msg: str) -> None:
    print(f"[pipeline] {msg}", file=sys.stderr, flush=True)


def load1() -> float | None:
    load = load_average()
    return load[0] if load else None


def ms(seconds: float) -> float:
    return round(seconds * 1e3, 1)


def pct_ms(values: Sequence[float], q: float) -> float:
    """Nearest-rank percentile of seconds, in ms."""
    return ms(percentile(sorted(values), q)) if values else float("nan")


# --- update documents --------------------------------------------------------------------


def updates(n: int, total_docs: int, seed: int) -> Iterator[tuple[str, bytes]]:
    """``n`` updates of existing documents (``user-<k>``, k < total_docs): a fresh demo user
    each, so city, age, email and status (every indexed field) change. Distinct docids while
    ``n <= total_docs``."""
    from shardex.demo.datagen import user

    rng = random.Random(seed)
    gen = random.Random(seed + 7)
    if n <= total_docs:
        picks: Sequence[int] = rng.sample(range(total_docs), n)
    else:
        picks = [rng.randrange(total_docs) for _ in range(n)]
    enc = msgspec.json.Encoder()
    for i, k in enumerate(picks):
        doc = user(gen, i)
        doc["id"] = f"user-{k:07d}"
        yield doc["id"], enc.encode(doc)


# --- the driver ----------------------------------------------------------------------------


@dataclass
class BatchLog:
    """Every BatchStats the driver reports, with the wall time it finished."""

    records: list[tuple[float, Any]] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def __call__(self, stats: Any) -> None:
        with self.lock:
            self.records.append((time.time(), stats))

    def since(self, t0: float, t1: float | None = None) -> list[tuple[float, Any]]:
        with self.lock:
            return [(t, s) for t, s in self.records if t >= t0 and (t1 is None or t <= t1)]

    def wait_end(self, target: dict[int, int], timeout: float = 30.0) -> None:
        """Until a batch whose end covers ``target`` is recorded: the driver records a batch
        just after its TS is published, so a poller can see the TS first."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            with self.lock:
                last = self.records[-1][1] if self.records else None
            if last is not None and covers({p: e[0] for p, e in last.end.items()}, target):
                return
            time.sleep(0.01)
        log("no recorded batch covers the target (stats of the last batch may be missing)")


class InProcessDriver:
    """``PipelineDriver`` on this process's SparkSession, in a thread (as the e2e tests run
    it); ``stop()`` stops its queries. A new one on the same checkpoint root resumes."""

    def __init__(
        self,
        spark: Any,
        cluster_dir: Path,
        checkpoints: Path,
        batches: BatchLog,
        poll: float,
        overlap: bool = True,
        early: str | None = None,
        source_options: dict[str, str] | None = None,
    ) -> None:
        from shardex.client import connect_local
        from shardex.pipeline.driver import PipelineDriver

        self.client = connect_local(cluster_dir, name="bench-pipeline-driver")
        self.driver = PipelineDriver(
            spark,
            self.client,
            {"cluster_dir": str(cluster_dir), **(source_options or {})},
            checkpoints,
            poll=poll,
            on_batch=batches,
            overlap_stabilize=overlap,
        )
        if early is not None:  # else the jobs' defaults
            _early_variant(self.driver, early)
        self.thread = threading.Thread(target=self.driver.run, name="pipeline-driver", daemon=True)
        self.started = time.time()
        self.thread.start()

    def keyspace(self) -> Any:
        return self.driver.keyspaces.get(KEYSPACE)

    def stop(self) -> None:
        self.driver.stop()
        self.thread.join(timeout=120)
        if self.thread.is_alive():
            log("the pipeline driver did not stop within 120 s")
        self.client.close()


EARLY_VARIANTS = ("off", "once", "rolling", "between", "between-whole")


def _early_variant(driver: Any, early: str) -> None:
    """Make ``driver``'s maintenance jobs deliver ahead as ``early`` says: "off" (the batch
    delivers every row), "once" (one read-ahead per batch, delivered once the round ended),
    "rolling" (keep reading and delivering until the next batch), "between" (stability
    rounds between batches, ``MaintenanceJob.stabilise_between``, in place of delivering
    ahead), "between-whole" (the same, but a batch's round starts only once the batch is
    projected: no ``streamed_round``)."""
    if early not in EARLY_VARIANTS:
        raise ValueError(f"early delivery variant {early!r} not in {EARLY_VARIANTS}")
    make = driver._job

    def job(*args: Any, **kwargs: Any) -> Any:
        j = make(*args, **kwargs)
        if early in ("between", "between-whole"):
            j.stabilise_between()
            if early == "between-whole":
                j.project_rows = 1 << 40  # one group: nothing sent before the round
            return j
        j.stabilise_per_batch()
        j.deliver_ahead = early != "off"
        j.read_ahead.rolling = early == "rolling"
        return j

    driver._job = job


def index_ids(client: Any) -> list[str]:
    from shardex.meta.index_state import find_index
    from shardex.pipeline.indexers import index_state

    state = index_state(client)
    out = []
    for name in INDEX_NAMES:
        rec = find_index(state.indexes, KEYSPACE, name)
        assert rec is not None, f"no index {name}"
        out.append(rec.id)
    return out


_MASTER_TTL = 2.0
_masters: dict[int, tuple[str, float]] = {}


def timekeeper_node(client: Any) -> str:
    """The coordinator master, whose timekeeper the pipeline's stabilise rounds go to (read
    again every couple of seconds)."""
    from shardex.pipeline.indexers import index_state

    hit = _masters.get(id(client))
    if hit is not None and time.monotonic() - hit[1] < _MASTER_TTL:
        return hit[0]
    master = index_state(client).master
    _masters[id(client)] = (master, time.monotonic())
    return master


def held_stability(client: Any) -> dict[str, Any]:
    """Index id -> the stability TS the master's timekeeper holds for the keyspace."""
    from shardex.api.timekeeper import StabilityReply, StabilityRequest
    from shardex.core.timestamp import Timestamp
    from shardex.pipeline.indexers import to_node

    msg = StabilityRequest(keyspace=KEYSPACE)
    reply = client._run(to_node(client, timekeeper_node(client), msg, StabilityReply))
    return {i: Timestamp.from_wire(ts) for i, ts in reply.stability.items()}


def stable_seqnos(client: Any, ids: Sequence[str]) -> dict[int, int] | None:
    """Per data partition the seqno every listed index's published stability TS covers (the
    TS held by the master's timekeeper); None until all are published."""
    held = held_stability(client)
    if any(i not in held for i in ids):
        return None
    out: dict[int, int] = {}
    for n, i in enumerate(ids):
        for p, e in held[i].items():
            out[p] = e.seqno if n == 0 else min(out.get(p, 0), e.seqno)
    return out


def covers(stable: dict[int, int] | None, target: dict[int, int]) -> bool:
    return stable is not None and all(stable.get(p, 0) >= s for p, s in target.items())


def seqnos(ts: Any) -> dict[int, int]:
    return {p: e.seqno for p, e in ts.items()}


def wait_covered(
    client: Any, ids: Sequence[str], target: dict[int, int], timeout: float, interval: float = 0.02
) -> float:
    """Poll until the published stability covers ``target``; returns that wall time."""
    deadline = time.monotonic() + timeout
    while True:
        if covers(stable_seqnos(client, ids), target):
            return time.time()
        if time.monotonic() > deadline:
            raise TimeoutError(f"stability did not cover {len(target)} partitions in {timeout}s")
        time.sleep(interval)


# --- per-batch statistics ------------------------------------------------------------------

STAT_PARTS = ("wait_round", "project", "catch_up", "deliver", "stabilize", "total")


def batch_row(part: str, records: Sequence[tuple[float, Any]]) -> Row:
    """Medians of the driver's BatchStats over the batches that carried changes."""
    stats = [s for _, s in records if s.changes > 0]
    row: Row = {"part": part, "batches": len(stats)}
    if not stats:
        return row
    row["changes/batch"] = statistics.median(s.changes for s in stats)
    row["kv/batch"] = statistics.median(s.key_versions for s in stats)
    for name in STAT_PARTS:
        row[f"{name} ms"] = ms(statistics.median(getattr(s, name) for s in stats))
    totals = sorted(s.total for s in stats)
    row["total p90 ms"] = ms(percentile(totals, 90))
    row["retries"] = sum(s.retries for s in stats)
    row["on driver"] = sum(1 for s in stats if getattr(s, "on_driver", False))
    # key versions the batch took from the read-ahead (read while Spark committed the last)
    row["read ahead kv"] = statistics.median(getattr(s, "read_ahead", 0) for s in stats)
    # of those, delivered to the indexers before the batch's round (0: it delivered all)
    row["early kv"] = statistics.median(getattr(s, "early", 0) for s in stats)
    # sent while the batch was still projected (``rounds/streamed.py``)
    row["streamed kv"] = statistics.median(getattr(s, "streamed", 0) for s in stats)
    return row


def between_row(part: str, job: Any, before: Any) -> Row:
    """The stability rounds between batches of ``job`` since ``before`` (a copy of its
    ``between.stats`` taken at the start): count, failures, stops, key versions, wall."""
    now = job.between.stats
    walls = now.walls[len(before.walls) :] if len(now.walls) >= len(before.walls) else now.walls
    return {
        "part": part,
        "rounds": now.rounds - before.rounds,
        "failed": now.failed - before.failed,
        "stopped": now.stopped - before.stopped,
        "kv/round": round((now.key_versions - before.key_versions) / max(1, len(walls))),
        "round ms p50": ms(statistics.median(walls)) if walls else float("nan"),
        "round ms p90": ms(percentile(sorted(walls), 90)) if walls else float("nan"),
        # of a round: deliver + stabilise on the indexers, then the timekeeper's publish
        "deliver ms p50": _median_ms(now.delivers[-len(walls) :] if walls else []),
        "publish ms p50": _median_ms(now.publishes[-len(walls) :] if walls else []),
    }


def _median_ms(samples: Sequence[float]) -> float:
    return ms(statistics.median(samples)) if samples else float("nan")


def progress_row(part: str, progress: Sequence[dict[str, Any]]) -> Row:
    """Medians of Spark's own durations (queryProgress durationMs) for the batches given."""
    row: Row = {"part": part, "batches": len(progress)}
    for key in (
        "triggerExecution",
        "latestOffset",
        "queryPlanning",
        "walCommit",
        "addBatch",
        "commitOffsets",
    ):
        vals = [float(p["durationMs"].get(key, 0)) for p in progress]
        row[key] = round(statistics.median(vals), 1) if vals else float("nan")
    return row
