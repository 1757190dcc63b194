"""The index pipeline end to end: ``python -m bench.pipeline [--quick] [--docs N] [--json PATH]``.

One run on one machine: a 3-node local cluster (``shardex cluster start --no-pipeline``), the
pipeline driver (``PipelineDriver``) in this process on one SparkSession
(``build_spark_session``, local[2]), a keyspace of ``--partitions`` partitions, the demo's
user documents (``shardex.demo.datagen``), two indexes (``bench.common.dataset.INDEXES``):
``by_city_age`` on (address.city, age) partitioned by hash(META().id) into 4, and
``by_email`` on (email) WHERE status = 'active'. The parts (details in the modules):

1. initial build of ``--docs`` documents into both indexes, documents/s, against PostgreSQL
   CREATE INDEX of the twin expression indexes on a jsonb table (ratio shardex/PostgreSQL,
   target <= 2), and the share of Spark's own floor (the same job with a counting sink)
   (``build.py``);
2. sustained maintenance: the drain rate of a backlog of ``--mutations`` updates (target
   25,000/s) and the driver's per-batch timings (medians);
3. freshness at ``--rate`` offered mutations/s: ack -> published stability p50/p99 (targets
   400 ms / 1.5 s);
4. the floor of a micro-batch: single isolated writes, ack -> stability p50 and the
   batch's BatchStats.total (``maintain.py``).

``--rebalance`` runs ``shardex rebalance`` after the build, before parts 2-4 (the indexers
balanced by index load; the JSON's ``index_placement`` has the slices per node before and
after, and the moves).

"gap x" is how far from the target, > 1 short of it: measured / target for times and
latencies, target / measured for rates. PostgreSQL runs first (and is stopped) so the two
never share the machine. Everything is stopped and removed at the end, also on errors and
Ctrl-C. The machine may be shared and noisy: figures are ratios and medians with the load
average beside them, never checked against a threshold. Results: ``bench/results/
pipeline.json`` (``pipeline-quick.json`` with ``--quick``) unless ``--json PATH``.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bench.common.dataset import KEYSPACE, SEED, create_indexes, write_docs
from bench.common.driver import BatchLog, InProcessDriver, shardex_build
from bench.common.harness import DRIVER_POLL, bench_dir, bench_main, loaded_cluster, spark_session
from bench.common.runner import RESULTS_DIR, Row, log, machine_info
from bench.pipeline.build import postgres_build, spark_floor
from bench.pipeline.maintain import Procs, drain, floor, freshness
from bench.pipeline.stats import index_ids

BUILD_TARGET = 2.0  # shardex build time / PostgreSQL CREATE INDEX time


@dataclass
class Plan:
    docs: int = 1_000_000
    mutations: int = 200_000
    rate: float = 5000.0
    fresh_seconds: float = 30.0
    floor_writes: int = 20
    partitions: int = 64
    writers: int = 2  # writer processes
    threads: int = 2  # writer threads per process
    load_files: int = 3  # ``shardex load`` processes
    seed: int = SEED
    parts: list[int] = field(default_factory=lambda: [1, 2, 3, 4])
    rebalance: bool = False  # rebalance the indexers after the build


QUICK = {"docs": 50_000, "mutations": 20_000, "fresh_seconds": 10.0, "floor_writes": 10}


@dataclass
class Context:
    """What parts 2-4 share."""

    work: Path
    cluster_dir: Path
    client: Any
    spark: Any
    procs: Procs
    batches: BatchLog
    ids: list[str]
    docs: int
    partitions: int
    writers: int
    threads: int
    seed: int

    def new_driver(self) -> InProcessDriver:
        return InProcessDriver(
            self.spark, self.cluster_dir, self.work / "checkpoints", self.batches, DRIVER_POLL
        )


def run(plan: Plan) -> dict[str, Any]:
    from shardex.pipeline.indexers import index_state

    tables: dict[str, list[Row]] = {}
    procs = Procs()
    with bench_dir("pipeline", plan, cleanup=procs.close) as (base, extra):
        t = time.perf_counter()
        files, size = write_docs(base, plan.docs, plan.seed, plan.load_files)
        extra["documents"] = {
            "source": "shardex.demo.datagen users",
            "count": plan.docs,
            "jsonl_bytes": size,
            "generate_seconds": round(time.perf_counter() - t, 1),
        }
        log(f"{plan.docs} documents ({size / 1e6:.0f} MB) in {time.perf_counter() - t:.0f} s")
        build_rows: list[Row] = []
        if 1 in plan.parts:
            pg_rows, extra["postgresql"] = postgres_build(base, files, plan.docs)
            build_rows.extend(pg_rows)
        with loaded_cluster(base, files, plan.docs, plan.partitions) as (cdir, client, load_s):
            extra["shardex_load"] = {"seconds": round(load_s, 1), "docs/s": plan.docs / load_s}
            log(f"shardex load: {plan.docs} documents in {load_s:.0f} s")
            for f in files:
                f.unlink()
            create_indexes(client)
            t = time.perf_counter()
            with spark_session(base, "shardex-bench-pipeline") as spark:
                extra["spark_session_seconds"] = round(time.perf_counter() - t, 1)
                batches = BatchLog()
                ctx = Context(
                    work=base,
                    cluster_dir=cdir,
                    client=client,
                    spark=spark,
                    procs=procs,
                    batches=batches,
                    ids=[],
                    docs=plan.docs,
                    partitions=plan.partitions,
                    writers=plan.writers,
                    threads=plan.threads,
                    seed=plan.seed,
                )
                driver: InProcessDriver | None = None
                try:
                    defs = [
                        r.definition
                        for r in index_state(client).indexes.values()
                        if r.keyspace == KEYSPACE
                    ]
                    build_rows[:0] = spark_floor(spark, client, cdir, defs)
                    driver = ctx.new_driver()
                    rows, result = shardex_build(client, driver, plan.docs, timeout=7200)
                    build_rows[:0] = rows
                    tables["1 initial build"] = build_rows
                    extra["build_items"] = {
                        i["name"]: i["items_count"] for i in client.list_indexes(KEYSPACE)
                    }
                    pg_items = extra.get("postgresql", {}).get("entries")
                    tables["1 build summary"] = build_summary(
                        build_rows, result, extra["build_items"], pg_items
                    )
                    if plan.rebalance:
                        extra["index_placement"] = rebalance_indexes(client)
                    extra.setdefault("index_placement", {})["used"] = index_placement(client)
                    ctx.ids = index_ids(client)
                    stats: list[Row] = []
                    if 2 in plan.parts:
                        rows, st, driver = drain(ctx, driver, plan.mutations)
                        tables["2 drain"] = rows
                        stats.extend(st)
                    if 3 in plan.parts:
                        rows, st = freshness(ctx, driver, plan.rate, plan.fresh_seconds)
                        tables["3 freshness"] = rows
                        stats.extend(st)
                    if 4 in plan.parts:
                        rows, st = floor(ctx, driver, plan.floor_writes)
                        tables["4 floor"] = rows
                        stats.extend(st)
                    tables["per-batch medians (BatchStats, ms)"] = [
                        r for r in stats if "triggerExecution" not in r
                    ]
                    tables["Spark durationMs medians of the same batches"] = [
                        r for r in stats if "triggerExecution" in r and r["batches"]
                    ]
                finally:
                    if driver is not None:
                        driver.stop()
    return {"tables": tables, **extra}


def index_placement(client: Any) -> dict[str, dict[str, int]]:
    """index name -> node -> slices (primaries) of the bench's indexes."""
    out: dict[str, dict[str, int]] = {}
    for i in client.list_indexes(KEYSPACE, fresh=True):
        nodes: dict[str, int] = {}
        for node in i["partitions"].values():
            nodes[node] = nodes.get(node, 0) + 1
        out[i["name"]] = dict(sorted(nodes.items()))
    return out


def rebalance_indexes(client: Any) -> dict[str, Any]:
    """``client.rebalance()`` with the placement before it and its index moves."""
    before = index_placement(client)
    t = time.perf_counter()
    result = client.rebalance()
    moves = [f"{m.index}/{m.partition} {m.source} -> {m.target}" for m in result.moves if m.index]
    log(f"rebalance: {len(moves)} index move(s) in {time.perf_counter() - t:.1f} s")
    return {"before": before, "moves": moves, "seconds": round(time.perf_counter() - t, 1)}


def build_summary(
    rows: Sequence[Row],
    result: Any,
    items: dict[str, int],
    pg_items: dict[str, int] | None,
) -> list[Row]:
    by = {r["case"]: r for r in rows}
    wall = by["BUILD INDEX x2 -> both ACTIVE"]["seconds"]
    job = by["build job (BuildResult.seconds)"]["seconds"]
    pg = [r["seconds"] for r in rows if r["system"] == "postgresql"]
    out: list[Row] = []
    if pg:
        best = min(pg)
        for label, s in (("BUILD INDEX -> ACTIVE", wall), ("build job", job)):
            out.append(
                {
                    "metric": f"{label} / PostgreSQL (faster of 2 ways)",
                    "value": round(s / best, 2),
                    "target": f"<= {BUILD_TARGET}",
                    "gap x": round(s / best / BUILD_TARGET, 2),
                }
            )
    for case in (
        "snapshot read, no Spark (read_ranges)",
        "Spark floor: snapshot read, count",
        "Spark floor: read + project x2, count",
        "Spark floor: projected read x2 in the read task, count",
    ):
        if case in by:
            out.append(
                {
                    "metric": f"{case} / build job",
                    "value": round(by[case]["seconds"] / job, 3),
                    "target": "",
                    "gap x": "",
                }
            )
    out.append({"metric": "build job T0 docs", "value": result.docs, "target": "", "gap x": ""})
    for name, n in items.items():
        pg = None if pg_items is None else pg_items.get(name)
        same = "" if pg is None else (" = PostgreSQL" if pg == n else f" != PostgreSQL {pg}")
        out.append({"metric": f"entries {name}{same}", "value": n, "target": "", "gap x": ""})
    return out


def parse_args(argv: Sequence[str] | None) -> tuple[Plan, Path]:
    ap = argparse.ArgumentParser(
        prog="python -m bench.pipeline", description=__doc__.split("\n")[0]
    )
    ap.add_argument("--quick", action="store_true", help="50k docs, 20k mutations: minutes")
    ap.add_argument("--docs", type=int, help="documents to build from (default 1,000,000)")
    ap.add_argument("--mutations", type=int, help="backlog of the drain (default 200,000)")
    ap.add_argument("--rate", type=float, help="offered mutations/s for freshness (5000)")
    ap.add_argument("--seconds", type=float, help="seconds of the freshness load (30)")
    ap.add_argument("--partitions", type=int, help="keyspace partitions (64)")
    ap.add_argument("--part", type=int, action="append", choices=[1, 2, 3, 4],
                    help="parts to run (repeatable; the build always runs)")  # fmt: skip
    ap.add_argument("--rebalance", action="store_true",
                    help="rebalance the indexers after the build, before parts 2-4")  # fmt: skip
    ap.add_argument("--json", type=Path, help="where to write the JSON")
    args = ap.parse_args(argv)
    plan = Plan(**QUICK) if args.quick else Plan()
    for name, attr in (
        ("docs", "docs"),
        ("mutations", "mutations"),
        ("rate", "rate"),
        ("seconds", "fresh_seconds"),
        ("partitions", "partitions"),
    ):
        if getattr(args, name) is not None:
            setattr(plan, attr, getattr(args, name))
    if args.part:
        plan.parts = sorted(set(args.part))
    plan.rebalance = args.rebalance
    default = "pipeline-quick.json" if args.quick else "pipeline.json"
    return plan, args.json or RESULTS_DIR / default


def main(argv: Sequence[str] | None = None) -> int:
    plan, path = parse_args(argv)

    def summary(out: dict[str, Any], elapsed: float) -> str:
        return (
            f"{plan.docs:,} docs, {plan.partitions} partitions, 3 nodes + Spark local[2] on "
            f"{machine_info()['cpu_count']} CPUs; load average start {out['load_avg_start']}, "
            f"end {out['load_avg_end']}; {elapsed:.0f} s. Shared machine: figures are noisy."
        )

    return bench_main("pipeline", plan, path, run, summary, load_label="load")
