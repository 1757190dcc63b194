"""The Spark pipeline's floor:
``python -m bench.diagnostics.pipeline_floor [--rate N] [--reader R] [--quick]``.

What one micro-batch costs before any projecting or indexing, per stream reader of the
change source: ``partitioned`` (offsets on the driver, Spark tasks read in Python workers),
``follow`` (``SimpleDataSourceStreamReader``: live streams push changes into the driver,
which hands them to Spark; the default here with ``partitioned``) and ``driver`` (the simple
reader with a high-seqno round trip and range reads per batch; ``--reader driver``). One run,
one 1-node local cluster (``shardex cluster start``), one keyspace of 64 partitions, one
SparkSession (``build_spark_session``, local[2]), ``trigger(processingTime="0 seconds")``,
each query warmed up with ``warmup`` single-write batches first (the C1-only driver JVM gets
markedly faster over its first batches):

1. ``latestOffset`` cost: the driver-side offset call measured in-process, and how often Spark
   calls it when idle (counted by the reader, ``stats_path``).
2. floor: single writes, each after the previous one was seen. ``noop``: the foreachBatch
   sink does not touch the DataFrame (no read task runs: offsets, WAL, planning, commit);
   ``1 row``: the sink collects (partition, seqno) of the batch (the data path included).
3. small batches: bursts of 100 upserts, one at a time, the sink collecting them.
4. steady: a writer at ``--rate`` mutations/s (chunks every 20 ms) for ``--steady`` seconds.

Reported per reader and phase: micro-batch duration (Spark's ``triggerExecution``) p50/p99,
its parts (medians of walCommit, latestOffset, queryPlanning, addBatch, commitOffsets), and
write->foreachBatch latency p50/p99: from the write's acknowledgement to the moment the sink
sees its (partition, seqno) (noop: the sink call of the batch that contains it). All clocks
are this process's (the sink runs in the driver). The machine is shared: the load average is
in the table title and the JSON.
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import json
import os
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bench.common.local_cluster import shardex_cluster
from bench.common.runner import Row, load_average, percentile, print_table, report

KEYSPACE = "floor"
NUM_PARTITIONS = 64
READERS = ("partitioned", "driver", "follow")
DEFAULT_READERS = ("partitioned", "follow")  # --reader driver adds the range-reading driver
# Spark's durationMs parts of a micro-batch, with the short names of the table's columns.
PARTS = {
    "walCommit": "wal",
    "latestOffset": "offset",
    "queryPlanning": "plan",
    "addBatch": "addBatch",
    "commitOffsets": "commit",
}


def log(msg: str) -> None:
    print(f"[pipeline_floor] {msg}", file=sys.stderr, flush=True)


@dataclass
class Plan:
    rate: int = 2000
    steady: float = 5.0
    floor_writes: int = 4
    small_bursts: int = 3
    idle: float = 2.0
    warmup: int = 6  # single-write batches first: the JVM (C1 only) speeds up over them
    readers: Sequence[str] = DEFAULT_READERS
    interval_ms: float | None = None  # None: the source's default


@dataclass
class Sink:
    """The foreachBatch function and what it saw (runs on the driver, in this process)."""

    read: bool = True
    seen: dict[tuple[int, int], float] = field(default_factory=dict)
    calls: list[tuple[int, float]] = field(default_factory=list)  # (batch id, time)
    cond: threading.Condition = field(default_factory=threading.Condition)

    def __call__(self, df: Any, batch_id: int) -> None:
        if self.read:
            table = df.select("partition", "seqno").toArrow()
            now = time.time()
            parts = table.column("partition").to_pylist()
            seqnos = table.column("seqno").to_pylist()
            with self.cond:
                for key in zip(parts, seqnos, strict=True):
                    self.seen[key] = now
        now = time.time()
        with self.cond:
            self.calls.append((batch_id, now))
            self.cond.notify_all()

    def wait_seen(self, keys: Sequence[tuple[int, int]], timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        with self.cond:
            while not all(k in self.seen for k in keys):
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self.cond.wait(left)
        return True

    def wait_call_after(self, t: float, timeout: float) -> float | None:
        deadline = time.monotonic() + timeout
        with self.cond:
            while True:
                after = [c for _, c in self.calls if c >= t]
                if after:
                    return after[0]
                left = deadline - time.monotonic()
                if left <= 0:
                    return None
                self.cond.wait(left)


def pct(values: Sequence[float], q: float) -> float:
    return round(percentile(sorted(values), q), 1) if values else float("nan")


def latest_offset_cost(cluster_dir: Path, n: int = 300) -> list[Row]:
    """The driver's offset call measured here, without Spark: one HighSeqnos round trip."""
    from shardex.pipeline.source.options import SourceOptions
    from shardex.pipeline.source.stream import _OffsetSource

    rows: list[Row] = []
    for interval_ms in (0, 20, 50):
        opts = SourceOptions.parse(
            {
                "cluster_dir": str(cluster_dir),
                "keyspace": KEYSPACE,
                "latest_offset_interval_ms": str(interval_ms),
            }
        )
        src = _OffsetSource(opts)
        start = src.initial()
        lat: list[float] = []
        try:
            for _ in range(n):
                t = time.perf_counter()
                src.next_end(start, None)
                lat.append((time.perf_counter() - t) * 1000)
                time.sleep(0.002)
        finally:
            src.close()
        rows.append(
            {
                "bench": "latestOffset (in-process)",
                "case": f"interval {interval_ms} ms",
                "calls": n,
                "p50": pct(lat, 50),
                "p99": pct(lat, 99),
                "rpcs": int(src.stats["rpc_calls"]),
            }
        )
    return rows


@contextlib.contextmanager
def running_query(
    spark: Any,
    cluster_dir: Path,
    reader: str,
    sink: Sink,
    work: Path,
    interval_ms: float | None,
    start: dict[str, Any],
) -> Iterator[tuple[Any, Path]]:
    stats = work / f"stats-{reader}.json"
    query = (
        spark.readStream.format("shardex")
        .option("cluster_dir", str(cluster_dir))
        .option("keyspace", KEYSPACE)
        # An explicit start: "latest" is taken whenever the query gets to it, which may be
        # after the warm-up write.
        .option("starting_offsets", json.dumps(start))
        .option("reader", reader)
        .option("stats_path", str(stats))
        .options(**({} if interval_ms is None else {"latest_offset_interval_ms": str(interval_ms)}))
        .load()
        .writeStream.foreachBatch(sink)
        .option("checkpointLocation", str(work / f"checkpoint-{reader}"))
        .trigger(processingTime="0 seconds")
        .start()
    )
    try:
        yield query, stats
    finally:
        query.stop()


def progress_rows(query: Any, batch_ids: set[int]) -> list[dict[str, Any]]:
    return [p for p in query.recentProgress if p["batchId"] in batch_ids]


def batch_figures(progress: list[dict[str, Any]]) -> Row:
    total = [float(p["durationMs"].get("triggerExecution", 0)) for p in progress]
    row: Row = {
        "batches": len(progress),
        "rows/batch": round(statistics.mean(p["numInputRows"] for p in progress), 1)
        if progress
        else 0,
        "batch p50": pct(total, 50),
        "batch p99": pct(total, 99),
    }
    for part, short in PARTS.items():
        vals = [float(p["durationMs"].get(part, 0)) for p in progress]
        row[short] = round(statistics.median(vals), 1) if vals else float("nan")
    return row


def run_reader(
    spark: Any,
    cluster_dir: Path,
    ks_client: Any,
    reader: str,
    plan: Plan,
    work: Path,
    *,
    first: bool = False,
) -> list[Row]:
    ks = ks_client.keyspace(KEYSPACE)
    rows: list[Row] = []
    sink = Sink(read=False)
    ids = itertools.count()

    def batches_since(n_calls: int) -> set[int]:
        with sink.cond:
            return {b for b, _ in sink.calls[n_calls:]}

    start = ks_client.high_seqnos(KEYSPACE).to_json()
    with running_query(spark, cluster_dir, reader, sink, work, plan.interval_ms, start) as (
        q,
        stats,
    ):
        # Warm up: the first batch starts Python workers and connects; later ones let the
        # JIT compile the micro-batch loop (measured: the floor halves over ~20 batches).
        sink.read = True
        for i in range(plan.warmup * (2 if first else 1)):
            r = ks.upsert(f"warm-{reader}-{i}", {"n": 0})
            if not sink.wait_seen([(r.partition, r.seqno)], 120 if i == 0 else 30):
                raise RuntimeError(f"{reader}: warm-up write {i} was not seen in time")

        # Idle: how often Spark asks for the latest offset.
        before = _read_stats(stats)
        time.sleep(plan.idle)
        after = _read_stats(stats)
        calls = after.get("latest_calls", 0) - before.get("latest_calls", 0)
        rpcs = after.get("rpc_calls", 0) - before.get("rpc_calls", 0)
        rpc_s = after.get("rpc_seconds", 0) - before.get("rpc_seconds", 0)
        rows.append(
            {
                "bench": reader,
                "case": "idle",
                "calls/s": round(calls / plan.idle, 1),
                "rpcs/s": round(rpcs / plan.idle, 1),
                "rpc ms": round(1000 * rpc_s / rpcs, 2) if rpcs else float("nan"),
            }
        )

        for read in (False, True):
            sink.read = read
            n0 = len(sink.calls)
            lat: list[float] = []
            for _ in range(plan.floor_writes):
                time.sleep(0.3)
                r = ks.upsert(f"f{next(ids)}", {"n": 1})
                acked = time.time()
                if read:
                    if sink.wait_seen([(r.partition, r.seqno)], 30):
                        lat.append((sink.seen[(r.partition, r.seqno)] - acked) * 1000)
                else:
                    t = sink.wait_call_after(acked, 30)
                    if t is not None:
                        lat.append((t - acked) * 1000)
            time.sleep(0.2)
            prog = progress_rows(q, batches_since(n0))
            rows.append(
                {
                    "bench": reader,
                    "case": "floor, 1 row" if read else "floor, noop sink",
                    **batch_figures(prog),
                    "lat p50": pct(lat, 50),
                    "lat p99": pct(lat, 99),
                }
            )

        sink.read = True
        n0 = len(sink.calls)
        lat = []
        for _ in range(plan.small_bursts):
            time.sleep(0.3)
            docs = [(f"s{next(ids)}", {"n": i}) for i in range(100)]
            results = ks.upsert_many(docs)
            acked = time.time()
            keys = [(x.partition, x.seqno) for x in results]
            if sink.wait_seen(keys, 30):
                lat.extend((sink.seen[k] - acked) * 1000 for k in keys)
        time.sleep(0.2)
        rows.append(
            {
                "bench": reader,
                "case": "100-upsert bursts",
                **batch_figures(progress_rows(q, batches_since(n0))),
                "lat p50": pct(lat, 50),
                "lat p99": pct(lat, 99),
            }
        )

        n0 = len(sink.calls)
        cpu0, t0 = node_cpu(cluster_dir), time.monotonic()
        acks = steady_writer(ks, plan.rate, plan.steady, ids)
        sink.wait_seen(list(acks), 30)
        node_share = (node_cpu(cluster_dir) - cpu0) / (time.monotonic() - t0)
        lat = [(sink.seen[k] - t) * 1000 for k, t in acks.items() if k in sink.seen]
        prog = progress_rows(q, batches_since(n0))
        rows.append(
            {
                "bench": reader,
                "case": f"steady {plan.rate}/s",
                **batch_figures(prog),
                "lat p50": pct(lat, 50),
                "lat p99": pct(lat, 99),
                "written/s": round(len(acks) / plan.steady),
                "node cpu %": round(100 * node_share),
                "lost": len(acks) - len(lat),
            }
        )
    return rows


def steady_writer(
    ks: Any, rate: int, seconds: float, ids: Iterator[int]
) -> dict[tuple[int, int], float]:
    """Upserts at ``rate``/s in chunks every 20 ms (sequential: a slow ack delays the next
    chunk, so the achieved rate is reported too); returns ack time per (partition, seqno)."""
    tick = 0.02
    per_tick = max(1, round(rate * tick))
    acks: dict[tuple[int, int], float] = {}
    start = time.monotonic()
    k = 0
    while time.monotonic() - start < seconds:
        docs = [(f"w{next(ids)}", {"n": i, "pad": "x" * 64}) for i in range(per_tick)]
        results = ks.upsert_many(docs)
        now = time.time()
        for r in results:
            acks[(r.partition, r.seqno)] = now
        k += 1
        delay = start + k * tick - time.monotonic()
        if delay > 0:
            time.sleep(delay)
    return acks


def node_cpu(cluster_dir: Path) -> float:
    """CPU seconds the data node has used (user + system): what serving the source costs."""
    from shardex.runtime.pidfile import read_pid

    pid = read_pid(cluster_dir / "node1")
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return float("nan")
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _read_stats(path: Path) -> dict[str, float]:
    for _ in range(20):
        with contextlib.suppress(OSError, ValueError):
            data: dict[str, float] = json.loads(path.read_text())
            return data
        time.sleep(0.1)
    return {}


def run(plan: Plan) -> tuple[list[Row], dict[str, Any]]:
    from shardex.client import connect_local
    from shardex.pipeline.session import build_spark_session

    rows: list[Row] = []
    extra: dict[str, Any] = {"plan": plan.__dict__ | {"readers": list(plan.readers)}}
    with tempfile.TemporaryDirectory(prefix="shardex-floor-") as tmp:
        work = Path(tmp)
        with shardex_cluster(work, 1) as cluster_dir, connect_local(cluster_dir) as client:
            client.create_keyspace(KEYSPACE, num_partitions=NUM_PARTITIONS, num_replicas=0)
            rows.extend(latest_offset_cost(cluster_dir))
            t = time.perf_counter()
            spark = build_spark_session(app_name="shardex-bench-floor")
            extra["session_start_s"] = round(time.perf_counter() - t, 1)
            log(f"SparkSession up in {extra['session_start_s']} s")
            try:
                for i, reader in enumerate(plan.readers):
                    log(f"reader={reader}")
                    # The first query also warms the fresh JVM up: twice as long, so
                    # the readers are compared on an equally warm JVM.
                    rows.extend(
                        run_reader(spark, cluster_dir, client, reader, plan, work, first=i == 0)
                    )
            finally:
                spark.stop()
    return rows, extra


def parse_args(argv: Sequence[str] | None) -> Plan:
    parser = argparse.ArgumentParser(
        prog="python -m bench.diagnostics.pipeline_floor", description=__doc__
    )
    parser.add_argument("--rate", type=int, default=2000, help="steady writes per second")
    parser.add_argument("--steady", type=float, default=5.0, help="seconds of steady writes")
    parser.add_argument(
        "--reader",
        action="append",
        choices=READERS,
        help=f"repeatable; default: {', '.join(DEFAULT_READERS)}",
    )
    parser.add_argument(
        "--interval-ms", type=float, help="latest_offset_interval_ms (default: the source's)"
    )
    parser.add_argument("--quick", action="store_true", help="shorter phases")
    args = parser.parse_args(argv)
    plan = Plan(rate=args.rate, steady=args.steady, interval_ms=args.interval_ms)
    if args.reader:
        plan.readers = tuple(args.reader)
    if args.quick:
        plan.steady, plan.floor_writes, plan.small_bursts, plan.idle = 4.0, 3, 2, 1.0
        plan.warmup = 3
    return plan


def main(argv: Sequence[str] | None = None, *, runner: Callable[[Plan], Any] = run) -> int:
    plan = parse_args(argv)
    load_start = load_average()
    t = time.perf_counter()
    rows, extra = runner(plan)
    offsets = [r for r in rows if "calls" in r or "calls/s" in r]
    batches = [r for r in rows if r not in offsets]
    print_table("latestOffset: cost per call and idle polling (ms)", offsets)
    extra.update(load_start=load_start, load_end=load_average(), offset_rows=offsets)
    report(
        "pipeline_floor",
        batches,
        elapsed=time.perf_counter() - t,
        extra=extra,
        title="micro-batches: durations and write->foreachBatch latency (ms)",
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
