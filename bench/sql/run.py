"""SQL against PostgreSQL: ``python -m bench.sql [--quick] [--docs N] [--seconds S] [--json PATH]``.

One run on one machine, the two systems one after the other (never both at once):

1. PostgreSQL (``bench/common/postgres.py``, the Debian server, default settings): the demo's users
   in ``docs(id, body jsonb)`` (primary key on id) with the twin expression indexes
   (``queries.PG_DDL``), VACUUM ANALYZE; each case's first queries answered (the
   reference), then measured over psycopg with prepared statements.
2. shardex: a 3-node local cluster, the same documents (``shardex load``), ``#primary``,
   ``by_email`` and ``by_city_age`` built by the Spark pipeline (in this process; Spark is
   stopped before measuring: nothing writes meanwhile). The checked queries must equal
   PostgreSQL's answers, with the fast paths on and off; then the bytes in flight per
   exchange of the GROUP BY and of a large range, with a 64 KiB and the default 1 MiB credit
   window; then every case through ``c.query`` at request_plus, twice: ``current`` (every
   execution switch on) and ``baseline`` (``index_order``, ``get_many``, ``plan_cache``
   and ``inline`` off: the execution before them), so before/after come from the same run
   and load.

The query mix is ``bench/sql/queries.py`` (point by key, point by email, range with ORDER BY
LIMIT 20, GROUP BY city over every document, a covering range). Each case runs at 1 and 4
concurrent clients, one OS process per client (``clients.py``). Ratios are shardex /
PostgreSQL (> 1: shardex slower for latencies, faster for q/s). The machine is shared: the
1-minute load average is printed beside each figure; nothing is checked against a threshold.
Results in ``bench/results/sql.json`` (``sql-quick.json`` with ``--quick``) unless ``--json``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench.common.dataset import SEED
from bench.common.harness import (
    bench_dir,
    bench_main,
    loaded_cluster,
    parse_plan_args,
    spark_driver,
)
from bench.common.runner import log, machine_info
from bench.sql.queries import (
    CASES,
    DocStats,
    build_queries,
    expected_group_rows,
    large_range_query,
    latency_ratios,
    speedups,
)


@dataclass
class Plan:
    docs: int = 1_000_000
    seconds: float = 10.0  # per measurement
    levels: tuple[int, ...] = (1, 4)
    partitions: int = 64
    load_files: int = 3
    seed: int = SEED


QUICK = {"docs": 20_000, "seconds": 3.0}


def run(plan: Plan) -> dict[str, Any]:
    from bench.common.dataset import write_docs
    from bench.sql.phases import create_and_build, postgres_phase, shardex_phase
    from shardex.demo.datagen import users

    with bench_dir("sql", plan) as (base, extra):
        files, size = write_docs(base, plan.docs, plan.seed, plan.load_files)
        stats = DocStats.of(users(plan.docs, plan.seed))
        queries = build_queries(stats)
        for case in CASES:
            if not queries[case]:
                raise RuntimeError(f"no {case} queries for {plan.docs} documents")
        large = large_range_query(stats)
        extra["documents"] = {"count": plan.docs, "jsonl_bytes": size}
        extra["queries"] = {
            c: [{"params": q.params, "rows": q.expected_rows} for q in qs]
            for c, qs in queries.items()
        }
        pg = postgres_phase(
            base, files, plan.docs, queries, expected_group_rows(stats), plan.levels,
            plan.seconds,
        )  # fmt: skip
        extra["postgresql"] = pg.info
        with loaded_cluster(base, files, plan.docs, plan.partitions) as (cdir, client, load_s):
            with spark_driver(base, cdir, "shardex-bench-sql") as driver:
                names, build_s = create_and_build(client, driver, timeout=7200)
            extra["shardex"] = {"load_seconds": load_s, "indexes": names, "build_s": build_s}
            log("Spark stopped; querying")
            sx = shardex_phase(client, cdir, queries, large, pg, plan.levels, plan.seconds)
            extra["shardex"].update(sx.info)
    rows = pg.rows + sx.rows
    tables = {
        "SQL query mix": rows,
        "ratios shardex / PostgreSQL": latency_ratios(rows),
        "shardex current vs baseline (same run)": speedups(rows, "baseline", "current"),
        "bytes in flight per exchange vs the credit window": sx.info["exchanges"],
    }
    return {"tables": tables, **extra}


def parse_args(argv: Sequence[str] | None) -> tuple[Plan, Path]:
    return parse_plan_args(argv, "sql", __doc__, Plan, QUICK)


def main(argv: Sequence[str] | None = None) -> int:
    plan, path = parse_args(argv)

    def summary(out: dict[str, Any], elapsed: float) -> str:
        return (
            f"{plan.docs:,} docs, 3 nodes on {machine_info()['cpu_count']} CPUs, clients are "
            f"processes, shardex at request_plus; load average start {out['load_avg_start']}, "
            f"end {out['load_avg_end']}; {elapsed:.0f} s. Shared machine: noisy figures."
        )

    return bench_main("sql", plan, path, run, summary)
