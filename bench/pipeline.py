"""The index pipeline end to end: ``python -m bench.pipeline [--quick] [--docs N] [--json PATH]``.

One run on one machine: a 3-node local cluster (``shardex cluster start --no-pipeline``), the
pipeline driver (``PipelineDriver``) in this process on one SparkSession
(``build_spark_session``, local[2]), a keyspace of ``--partitions`` partitions, the demo's
user documents (``shardex.demo.datagen``), two indexes (``pipeline_common.INDEXES``):
``by_city_age`` on (address.city, age) partitioned by hash(META().id) into 4, and
``by_email`` on (email) WHERE status = 'active'. The parts (details in the modules):

1. initial build of ``--docs`` documents into both indexes, documents/s, against PostgreSQL
   CREATE INDEX of the twin expression indexes on a jsonb table (ratio shardex/PostgreSQL,
   target <= 2), and the share of Spark's own floor (the same job with a counting sink)
   (``pipeline_build.py``);
2. sustained maintenance: the drain rate of a backlog of ``--mutations`` updates (target
   25,000/s) and the driver's per-batch timings (medians);
3. freshness at ``--rate`` offered mutations/s: ack -> published stability p50/p99 (targets
   400 ms / 1.5 s);
4. the floor of a micro-batch: single isolated writes, ack -> stability p50 and the
   batch's BatchStats.total (``pipeline_maintain.py``).

``--ab`` runs parts 3 and 4 a second time on a new driver whose batches run their
deliver/stabilise round inside ``foreachBatch`` (``overlap_stabilize=False``: no overlap with
Spark's commit, no read-ahead), on the same cluster minutes later: the pair is the
comparison, not either figure alone.

"gap x" is how far from the target, > 1 short of it: measured / target for times and
latencies, target / measured for rates. PostgreSQL runs first (and is stopped) so the two
never share the machine. Everything is stopped and removed at the end, also on errors and
Ctrl-C. The machine may be shared and noisy: figures are ratios and medians with the load
average beside them, never checked against a threshold. Results: ``bench/results/
pipeline.json`` (``pipeline-quick.json`` with ``--quick``) unless ``--json PATH``.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bench.harness import DRIVER_POLL, bench_dir, bench_main, loaded_cluster, spark_session
from bench.pipeline_build import (
    create_indexes,
    postgres_build,
    shardex_build,
    spark_floor,
    write_docs,
)
from bench.pipeline_common import KEYSPACE, SEED, BatchLog, InProcessDriver, index_ids, log
from bench.pipeline_maintain import Procs, drain, floor, freshness
from bench.runner import RESULTS_DIR, Row, machine_info

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
    ab: bool = False  # parts 3 and 4 again without the overlapped round (``--ab``)
    # Part 3 (and 2) once per early-delivery variant, interleaved, ``--early-ab N`` rounds
    early_ab: int = 0
    early_variants: tuple[str, ...] = ("off", "once", "rolling")
    # Part 3 once per Spark-overhead variant (``SPARK_VARIANTS``), interleaved, N rounds
    spark_ab: int = 0
    spark_variants: tuple[str, ...] = ("pyspark", "lean")
    java_options: str | None = None  # the driver JVM's options instead of session.py's


# --spark-ab variants: (the maintenance job's lean foreachBatch callback, SQL confs set on
# the session before the variant's query starts; a query clones the session's conf).
SPARK_VARIANTS: dict[str, tuple[bool, dict[str, str]]] = {
    "pyspark": (False, {}),
    "lean": (True, {}),
    "lean-noaqe": (True, {"spark.sql.adaptive.enabled": "false"}),
    "lean-nowholestage": (True, {"spark.sql.codegen.wholeStage": "false"}),
    "lean-progress10": (True, {"spark.sql.streaming.numRecentProgressUpdates": "10"}),
    "lean-owners": (True, {}),  # SOURCE_VARIANTS: high seqnos asked of the owners directly
    "lean-gather": (True, {}),  # SOURCE_VARIANTS: high seqnos gathered by one data node
    "lean-async": (True, {}),  # ASYNC_VARIANTS: offset/commit logs off the stream thread
    "lean-async1s": (True, {}),
    "lean-between": (True, {}),  # JOB_VARIANTS: stability rounds between batches
    "lean-batches": (True, {}),  # JOB_VARIANTS: stability at Spark's batch ends only
}
# --spark-ab variants whose maintenance jobs are set up otherwise (``pipeline_common.
# _early_variant``): "between" runs stability rounds between Spark's batches.
JOB_VARIANTS: dict[str, str] = {"lean-between": "between", "lean-batches": "once"}
# --spark-ab variants with Spark's asynchronous progress tracking (``MaintenanceJob.
# async_progress_ms``: the logs written at most every N ms); every other variant runs without.
ASYNC_VARIANTS: dict[str, int] = {"lean-async": 0, "lean-async1s": 1000}
# --spark-ab variants that also set change-source options (on top of ``cluster_dir``); every
# variant's query writes its source's call statistics (``stats_path``), tabled per variant.
SOURCE_VARIANTS: dict[str, dict[str, str]] = {
    "lean-owners": {"high_seqnos": "owners"},
    "lean-gather": {"high_seqnos": "gather"},
}


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

    def new_driver(
        self,
        overlap: bool = True,
        early: str | None = None,
        source_options: dict[str, str] | None = None,
    ) -> InProcessDriver:
        return InProcessDriver(
            self.spark,
            self.cluster_dir,
            self.work / "checkpoints",
            self.batches,
            DRIVER_POLL,
            overlap=overlap,
            early=early,
            source_options=source_options,
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
        if plan.java_options is not None:
            from shardex.pipeline import session as session_mod

            session_mod.DEFAULT_CONF["spark.driver.extraJavaOptions"] = plan.java_options
            extra["driver_java_options"] = plan.java_options
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
                    if plan.early_ab:
                        driver = early_ab(ctx, driver, plan, tables, stats)
                    if plan.spark_ab:
                        driver = spark_ab(ctx, driver, plan, tables, stats)
                    if plan.ab and (3 in plan.parts or 4 in plan.parts):
                        # The same parts again with each batch's round inside foreachBatch
                        # (no overlap with Spark's commit, no read-ahead), same cluster, same
                        # minutes of machine load: the ratio is the figure.
                        driver.stop()
                        driver = ctx.new_driver(overlap=False)
                        wait_started(ctx, driver)
                        tag = " / no overlap"
                        if 3 in plan.parts:
                            _tagged_freshness(ctx, driver, plan, tables, stats, tag)
                        if 4 in plan.parts:
                            rows, st = floor(ctx, driver, plan.floor_writes)
                            tables["4 floor" + tag] = _tagged(rows, tag)
                            stats.extend(_tagged(st, tag))
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


def early_ab(
    ctx: Context,
    driver: InProcessDriver,
    plan: Plan,
    tables: dict[str, list[Row]],
    stats: list[Row],
) -> InProcessDriver:
    """Parts 2 and 3 (those asked for) once per early-delivery variant, in rounds that
    alternate the variants (``--early-variants``, default off, once, rolling;
    ``pipeline_common.EARLY_VARIANTS``), each on a new driver of the same cluster: the
    machine's load drifts, so compare within a round."""
    for n in range(plan.early_ab):
        for variant in plan.early_variants:
            driver.stop()
            driver = ctx.new_driver(early=variant)
            wait_started(ctx, driver)
            tag = f" / early {variant} #{n + 1}"
            if 2 in plan.parts:
                rows, st, driver = drain(ctx, driver, plan.mutations, variant)
                tables["2 drain" + tag] = _tagged(rows, tag)
                stats.extend(_tagged(st, tag))
            if 3 in plan.parts:
                _tagged_freshness(ctx, driver, plan, tables, stats, tag)
    return driver


def _tagged_freshness(
    ctx: Context,
    driver: InProcessDriver,
    plan: Plan,
    tables: dict[str, list[Row]],
    stats: list[Row],
    tag: str,
) -> None:
    """Part 3 once, its table and batch stats recorded under ``tag`` (an A/B variant)."""
    rows, st = freshness(ctx, driver, plan.rate, plan.fresh_seconds)
    tables["3 freshness" + tag] = _tagged(rows, tag)
    stats.extend(_tagged(st, tag))


def spark_ab(
    ctx: Context,
    driver: InProcessDriver,
    plan: Plan,
    tables: dict[str, list[Row]],
    stats: list[Row],
) -> InProcessDriver:
    """Part 3 once per Spark-overhead variant (``--spark-variants``, ``SPARK_VARIANTS``) in
    rounds that alternate them, each on a new driver (a new query on the same session and
    JVM): compare within a round, the machine's load drifts; the order alternates."""
    from shardex.pipeline.maintain import MaintenanceJob

    async_default = MaintenanceJob.async_progress_ms
    for n in range(plan.spark_ab):
        # Every other round in reverse order: a later query runs on a warmer JVM.
        order = plan.spark_variants if n % 2 == 0 else plan.spark_variants[::-1]
        for variant in order:
            lean, confs = SPARK_VARIANTS[variant]
            driver.stop()
            MaintenanceJob.lean_callback = lean
            MaintenanceJob.async_progress_ms = ASYNC_VARIANTS.get(variant)
            for key, value in confs.items():
                ctx.spark.conf.set(key, value)
            tag = f" / spark {variant} #{n + 1}"
            stats_file = ctx.work / f"source-stats-{variant}-{n + 1}.json"
            source = {**SOURCE_VARIANTS.get(variant, {}), "stats_path": str(stats_file)}
            try:
                driver = ctx.new_driver(source_options=source, early=JOB_VARIANTS.get(variant))
                wait_started(ctx, driver)
                _tagged_freshness(ctx, driver, plan, tables, stats, tag)
                driver.stop()  # the source writes its final figures as its query stops
                tables.setdefault("source calls (stats_path, median ms)", []).append(
                    source_calls_row("3 freshness" + tag, stats_file)
                )
            finally:
                if variant in ASYNC_VARIANTS:
                    forget_stopped_queries(ctx.spark)
                MaintenanceJob.lean_callback = True
                MaintenanceJob.async_progress_ms = async_default
                for key in confs:
                    ctx.spark.conf.unset(key)
    return driver


def forget_stopped_queries(spark: Any) -> None:
    """Measurement only: Spark 4.3's asynchronous progress tracking leaves a query over a
    Python data source registered as active once stopped (its cleanup commits the sources
    after stopping them, the Python source runner's socket is closed, and the exception skips
    the query manager's ``notifyQueryTermination``), so no query of the same name or
    checkpoint could start again in this session. Unregister the stopped ones by hand, so
    the A/B can go on (why the job does not use async progress: ``docs/decisions.md``,
    "Spark's offset log off the critical path")."""
    manager = spark._jsparkSession.streams()
    shared = spark._jsparkSession.sharedState().activeStreamingQueries()  # id -> execution
    for q in spark.streams.active:
        if not q._jsq.isActive():
            manager.notifyQueryTermination(q._jsq)
            shared.remove(q._jsq.id(), q._jsq.streamingQuery())


def source_calls_row(part: str, path: Path) -> Row:
    """The change source's own figures for one query (``source/stats.py``): median ms in our
    code per Spark call, the bare round trip between latestOffset and reportLatestOffset, the
    HighSeqnos RPC, and the JVM's time between calls; idle triggers apart."""
    import json

    row: Row = {"part": part}
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return {**row, "error": f"no source stats at {path}"}
    row["calls"] = data.get("calls", {})
    row.update(data.get("median_ms", {}))
    return row


def _tagged(rows: list[Row], tag: str) -> list[Row]:
    return [{**r, "part": f"{r['part']}{tag}"} for r in rows]


def wait_started(ctx: Context, driver: InProcessDriver, timeout: float = 300.0) -> None:
    """Until the new driver's query has published a batch: a write, then its stability."""
    from bench.pipeline_common import wait_covered

    ks = ctx.client.keyspace(KEYSPACE)
    r = ks.upsert("bench-warmup", b'{"id": "bench-warmup"}')
    wait_covered(ctx.client, ctx.ids, {r.partition: r.seqno}, timeout=timeout)


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
    ap.add_argument("--ab", action="store_true",
                    help="parts 3 and 4 again, each batch's round inside foreachBatch")  # fmt: skip
    ap.add_argument("--early-ab", type=int, default=0, metavar="N",
                    help="N rounds of parts 2/3 per early-delivery variant")  # fmt: skip
    ap.add_argument("--early-variants", default="off,once,rolling",
                    help="comma-separated variants for --early-ab")  # fmt: skip
    ap.add_argument("--spark-ab", type=int, default=0, metavar="N",
                    help="N rounds of part 3 per Spark-overhead variant")  # fmt: skip
    ap.add_argument("--spark-variants", default="pyspark,lean",
                    help=f"comma-separated, of {','.join(SPARK_VARIANTS)}")  # fmt: skip
    ap.add_argument("--java-options", help="the driver JVM's options, as --java-options='-XX:...'")
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
    plan.ab = args.ab
    plan.early_ab = args.early_ab
    plan.early_variants = tuple(v for v in args.early_variants.split(",") if v)
    plan.spark_ab = args.spark_ab
    plan.spark_variants = tuple(v for v in args.spark_variants.split(",") if v)
    unknown = [v for v in plan.spark_variants if v not in SPARK_VARIANTS]
    if unknown:
        ap.error(f"unknown --spark-variants {unknown}; known: {', '.join(SPARK_VARIANTS)}")
    plan.java_options = args.java_options
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


if __name__ == "__main__":
    sys.exit(main())
