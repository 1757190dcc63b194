"""SQL against PostgreSQL: ``python -m bench.sql [--quick] [--docs N] [--seconds S] [--json PATH]``.

One run on one machine, the two systems one after the other (never both at once):

1. PostgreSQL (``bench/postgres.py``, the Debian server, default settings): the demo's users
   in ``docs(id, body jsonb)`` (primary key on id) with the twin expression indexes
   (``sql_queries.PG_DDL``), VACUUM ANALYZE; each case's first queries answered (the
   reference), then measured over psycopg with prepared statements.
2. shardex: a 3-node local cluster, the same documents (``shardex load``), ``#primary``,
   ``by_email`` and ``by_city_age`` built by the Spark pipeline (in this process; Spark is
   stopped before measuring: nothing writes meanwhile). The checked queries must equal
   PostgreSQL's answers, with the fast paths on and off; then the bytes in flight per
   exchange of the GROUP BY and of a large range, with a 64 KiB and the default 1 MiB credit
   window; then every case through ``c.query`` at request_plus, twice: ``current`` (every
   execution switch on) and ``baseline`` (``index_order``, ``get_many`` and ``plan_cache``
   off: the execution before them), so before/after come from the same run and load.

The query mix is ``bench/sql_queries.py`` (point by key, point by email, range with ORDER BY
LIMIT 20, GROUP BY city over every document, a covering range). Each case runs at 1 and 4
concurrent clients, one OS process per client (``sql_clients.py``). Ratios are shardex /
PostgreSQL (> 1: shardex slower for latencies, faster for q/s). The machine is shared: the
1-minute load average is printed beside each figure; nothing is checked against a threshold.
Results in ``bench/results/sql.json`` (``sql-quick.json`` with ``--quick``) unless ``--json``.
"""

from __future__ import annotations

import argparse
import json
import logging
import shutil
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from bench.pipeline_common import SEED, BatchLog, InProcessDriver, log
from bench.postgres import signals_raise
from bench.runner import RESULTS_DIR, load_average, machine_info, print_table
from bench.sql_queries import (
    CASES,
    KEYSPACE,
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
    from bench.data_service import fs_type, shardex_cluster
    from bench.pipeline_build import shardex_load, write_docs
    from bench.sql_phases import create_and_build, postgres_phase, shardex_phase
    from shardex.client import connect_local
    from shardex.demo.datagen import users
    from shardex.pipeline.session import build_spark_session

    extra: dict[str, Any] = {"plan": asdict(plan), "load_avg_start": load_average()}
    base = Path(tempfile.mkdtemp(prefix="shardex-bench-sql-"))
    base.chmod(0o711)  # the postgres OS user must reach its dir inside
    extra["disk"] = {"dir": str(base), "fs_type": fs_type(base)}
    try:
        with signals_raise():
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
            with shardex_cluster(base, 3) as cdir, connect_local(cdir) as client:
                client.create_keyspace(KEYSPACE, num_partitions=plan.partitions)
                load_s = shardex_load(cdir, files, base)
                total = client.keyspace_stats(KEYSPACE).total_docs
                if total != plan.docs:
                    raise RuntimeError(f"shardex holds {total} documents, expected {plan.docs}")
                spark = build_spark_session(
                    app_name="shardex-bench-sql",
                    conf_overrides={
                        "spark.sql.warehouse.dir": str(base / "spark-warehouse"),
                        "spark.local.dir": str(base / "spark-tmp"),
                    },
                )
                driver = None
                try:
                    driver = InProcessDriver(spark, cdir, base / "checkpoints", BatchLog(), 0.3)
                    names, build_s = create_and_build(client, driver, timeout=7200)
                finally:
                    if driver is not None:
                        driver.stop()
                    spark.stop()
                extra["shardex"] = {"load_seconds": load_s, "indexes": names, "build_s": build_s}
                log("Spark stopped; querying")
                sx = shardex_phase(client, cdir, queries, large, pg, plan.levels, plan.seconds)
                extra["shardex"].update(sx.info)
    finally:
        shutil.rmtree(base, ignore_errors=True)
    extra["load_avg_end"] = load_average()
    rows = pg.rows + sx.rows
    tables = {
        "SQL query mix": rows,
        "ratios shardex / PostgreSQL": latency_ratios(rows),
        "shardex current vs baseline (same run)": speedups(rows, "baseline", "current"),
        "bytes in flight per exchange vs the credit window": sx.info["exchanges"],
    }
    return {"tables": tables, **extra}


def parse_args(argv: Sequence[str] | None) -> tuple[Plan, Path]:
    ap = argparse.ArgumentParser(prog="python -m bench.sql", description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="20k docs, 3 s per measurement")
    ap.add_argument("--docs", type=int, help="documents (default 1,000,000)")
    ap.add_argument("--seconds", type=float, help="seconds per measurement (default 10)")
    ap.add_argument("--json", type=Path, help="where to write the JSON")
    args = ap.parse_args(argv)
    plan = Plan(**QUICK) if args.quick else Plan()  # type: ignore[arg-type]
    if args.docs is not None:
        plan.docs = args.docs
    if args.seconds is not None:
        plan.seconds = args.seconds
    default = "sql-quick.json" if args.quick else "sql.json"
    return plan, args.json or RESULTS_DIR / default


def main(argv: Sequence[str] | None = None) -> int:
    plan, path = parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    logging.getLogger("py4j").setLevel(logging.WARNING)
    t = time.perf_counter()
    try:
        out = run(plan)
    except KeyboardInterrupt as e:
        print(
            f"interrupted ({e or 'SIGINT'}); cluster, Spark and PostgreSQL stopped", file=sys.stderr
        )
        return 130
    elapsed = time.perf_counter() - t
    load = out["load_avg_end"]
    for title, rows in out["tables"].items():
        if rows:
            print_table(f"{title} (load at end {load[0]:.1f})" if load else title, rows)
    print(
        f"{plan.docs:,} docs, 3 nodes on {machine_info()['cpu_count']} CPUs, clients are "
        f"processes, shardex at request_plus; load average start {out['load_avg_start']}, "
        f"end {load}; {elapsed:.0f} s. Shared machine: noisy figures."
    )
    doc = {"name": "sql", "machine": machine_info(), "elapsed": elapsed, **out}
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(doc, indent=2, default=str) + "\n")
    print(f"wrote {path}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
