"""Part 4 of ``bench.replication``: what a replica costs the index pipeline.

The same run of ``bench.pipeline``'s parts on two 3-node clusters one after the other, the
keyspace loaded with ``num_replicas=0`` on the first and ``num_replicas=1`` on the second
(``harness.loaded_cluster``), both indexes built, then (``bench/pipeline/maintain.py``,
unchanged):

* drain: the driver stopped, a backlog of updates written, the driver restarted and timed
  until the published stability TS covers the high seqnos (mutations/s, also from the first
  batch);
* freshness: paced writers at an offered rate; per write, ack -> the first published
  stability TS that covers it (p50/p99): the moment a ``request_plus`` scan started at the
  ack can answer with the write, since it waits for exactly that TS.

Both clusters share one SparkSession (its start-up is not the replica's cost); each gets a
fresh driver and checkpoints. The first cluster's index build also warms the JVM, so the
build's rate is listed but not compared. Ratios 1 replica / 0 replicas are reported: > 1 is
slower for times, < 1 for rates. The replicas are fed from the actives' change streams inside the
cluster, so they compete with the pipeline's own reads for the same cores and disk.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench.common.runner import Row, log

REPLICA_COUNTS = (0, 1)


@dataclass
class PipelinePlan:
    docs: int = 200_000
    mutations: int = 100_000
    rate: float = 5000.0  # offered mutations/s of the freshness load
    seconds: float = 30.0  # of the freshness load
    partitions: int = 64


PIPELINE_QUICK = PipelinePlan(docs=20_000, mutations=10_000, rate=1000.0, seconds=8.0)


def measure_pipeline(base: Path, plan: PipelinePlan, seed: int) -> tuple[list[Row], Any]:
    """Load, build, drain and freshness per replica count; the rows and the run's info."""
    from bench.common.dataset import write_docs
    from bench.common.harness import spark_session
    from bench.pipeline.maintain import Procs

    files, size = write_docs(base, plan.docs, seed, 3)
    rows: list[Row] = []
    info: dict[str, Any] = {"documents": {"count": plan.docs, "jsonl_bytes": size}}
    procs = Procs()
    try:
        with spark_session(base, "shardex-bench-replication") as spark:
            for replicas in REPLICA_COUNTS:
                row, failed_over = _one_cluster(base, plan, seed, files, spark, procs, replicas)
                rows.append(row)
                info[f"failed_over_during_measurement_{replicas}"] = failed_over
    finally:
        procs.close()
    info["cluster"] = (
        f"3 nodes, keyspace of {plan.partitions} partitions, 2 indexes (bench.pipeline's), "
        "Spark local[2] in this process; one cluster per replica count, one after the other"
    )
    return rows, info


def _one_cluster(
    base: Path,
    plan: PipelinePlan,
    seed: int,
    files: list[Path],
    spark: Any,
    procs: Any,
    replicas: int,
) -> tuple[Row, list[str]]:
    from bench.common.dataset import KEYSPACE, create_indexes
    from bench.common.driver import BatchLog, shardex_build
    from bench.common.harness import loaded_cluster
    from bench.pipeline.maintain import drain, freshness
    from bench.pipeline.run import Context
    from bench.pipeline.stats import index_ids

    work = base / f"pipeline-{replicas}"
    work.mkdir()
    log(f"pipeline with num_replicas={replicas}: loading {plan.docs} documents")
    with loaded_cluster(base, files, plan.docs, plan.partitions, replicas) as loaded:
        cdir, client, load_s = loaded
        desc = next(k for k in client.list_keyspaces() if k.name == KEYSPACE)
        if (desc.num_replicas, desc.min_replicas) != (replicas, replicas):
            raise RuntimeError(f"{KEYSPACE}: {desc.min_replicas}/{desc.num_replicas} replicas")
        create_indexes(client)
        ctx = Context(
            work=work,
            cluster_dir=cdir,
            client=client,
            spark=spark,
            procs=procs,
            batches=BatchLog(),
            ids=[],
            docs=plan.docs,
            partitions=plan.partitions,
            writers=2,
            threads=2,
            seed=seed,
        )
        driver = ctx.new_driver()
        try:
            build, _result = shardex_build(client, driver, plan.docs, timeout=3600)
            ctx.ids = index_ids(client)
            (drained,), _stats, driver = drain(ctx, driver, plan.mutations)
            (fresh,), _stats = freshness(ctx, driver, plan.rate, plan.seconds)
        finally:
            driver.stop()
        # A node failed over mid-run (a starved heartbeat) would make the figures moot.
        failed_over = client.failed_over()
    if failed_over:
        log(f"WARNING: failed over during the run: {failed_over}")
    row: Row = {
        "replicas": replicas,
        "load docs/s": round(plan.docs / load_s),
        "build docs/s": build[0]["docs/s"],
        "drain mutations/s": drained["mutations/s"],
        "drain /s (batches)": drained["mutations/s (batches)"],
        "fresh offered/s": fresh["offered/s"],
        "fresh achieved/s": fresh["achieved/s"],
        "fresh p50 ms": fresh["p50 ms"],
        "fresh p99 ms": fresh["p99 ms"],
        "unmatched": fresh["unmatched"],
        "load_1m": fresh["load_1m"],
    }
    log(f"pipeline with num_replicas={replicas}: {row}")
    return row, failed_over


# The figures compared; for rates a ratio < 1 is the replica's cost, for times > 1.
_COMPARED = (
    "load docs/s",
    "drain mutations/s",
    "drain /s (batches)",
    "fresh p50 ms",
    "fresh p99 ms",
)


def pipeline_ratio_rows(rows: list[Row]) -> list[Row]:
    """Each figure with 1 replica against 0, as a ratio 1 / 0."""
    by = {r["replicas"]: r for r in rows}
    if set(REPLICA_COUNTS) - set(by):
        return []
    return [
        {
            "metric": col,
            "0 replicas": by[0][col],
            "1 replica": by[1][col],
            "1 / 0": round(by[1][col] / by[0][col], 2) if by[0][col] else None,
        }
        for col in _COMPARED
    ]
