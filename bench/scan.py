"""Index scans against PostgreSQL: ``python -m bench.scan [--quick] [--docs N] [--json PATH]``.

One run on one machine, the two systems one after the other (never both at once):

1. PostgreSQL (``bench/postgres.py``, the Debian server, its default settings): the demo's
   documents in ``docs(id, body jsonb)`` with the twin expression indexes of ``by_city_age``
   and ``by_email`` (``pipeline_common.INDEXES``), VACUUM ANALYZE; the 100-row queries over
   psycopg (prepared statements, its own client protocol; per-case session settings give it
   its best plan, ``scan_queries.PG_SETTINGS``) and a full index-order scan.
2. shardex: a 3-node local cluster, the same documents (``shardex load``), the two indexes
   built by the Spark pipeline (in this process; ``by_city_age`` on (address.city, age)
   partitioned by hash(META().id) into 4, ``by_email`` unpartitioned WHERE status =
   'active'). Spark is then stopped: no writes happen during the scans, so the pipeline
   would only add its idle polling to the machine (request_plus still fetches the high
   seqnos and waits for stability to cover them; it just never has to wait long).
   The 100-row scans at not_bounded and request_plus, full scans (rows decoded, raw
   entries; ordered and unordered), and raw RocksDB iteration of the same slice files.

The 100-row cases (``scan_queries.py``): a (city, age) range that naturally holds ~100 rows,
an ordered ``LIMIT 100`` over a (city, age >= lo) range, and ``LIMIT 100`` over the
unpartitioned email index (one slice, no scatter-gather). Each at 1, 4 and 16 concurrent
clients, one OS process per client (``scan_clients.py``). Before measuring, a few queries of
each case are checked: row counts against the documents, and for the natural ranges the
same docids in both systems.

Ratios are shardex / PostgreSQL (> 1: shardex slower for latencies, faster for rates). The
target is the 100-row scan p50 within 2x of PostgreSQL: "gap x" = ratio / 2 (> 1: short).
The machine is shared (2 cores, other work running): the 1-minute load average is printed
beside each figure; nothing is checked against a threshold. Results in
``bench/results/scan.json`` (``scan-quick.json`` with ``--quick``) unless ``--json PATH``.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench.harness import bench_dir, bench_main, loaded_cluster, parse_plan_args, spark_driver
from bench.pipeline_common import INDEX_NAMES, SEED, log
from bench.runner import Row, machine_info
from bench.scan_queries import CASES, KeyStats, build_queries, ratio

P50_TARGET = 2.0  # shardex 100-row scan p50 / PostgreSQL p50


@dataclass
class Plan:
    docs: int = 200_000
    seconds: float = 5.0  # per measurement
    levels: tuple[int, ...] = (1, 4, 16)
    partitions: int = 64
    load_files: int = 3
    seed: int = SEED


QUICK = {"docs": 20_000, "seconds": 3.0}


def run(plan: Plan) -> dict[str, Any]:
    from bench.pipeline_build import create_indexes, shardex_build, write_docs
    from bench.scan_phases import postgres_phase, shardex_phase
    from shardex.demo.datagen import users

    with bench_dir("scan", plan) as (base, extra):
        files, size = write_docs(base, plan.docs, plan.seed, plan.load_files)
        stats = KeyStats.of(users(plan.docs, plan.seed))
        queries = build_queries(stats)
        for case in CASES:
            if not queries[case]:
                raise RuntimeError(f"no {case} queries for {plan.docs} documents")
        expected = {"by_city_age": plan.docs, "by_email": len(stats.active_emails)}
        extra["documents"] = {"count": plan.docs, "jsonl_bytes": size}
        extra["queries"] = {
            c: [{"spans": q.spans, "limit": q.limit, "rows": q.expected_rows} for q in qs]
            for c, qs in queries.items()
        }
        pg = postgres_phase(base, files, plan.docs, queries, plan.levels, plan.seconds)
        extra["postgresql"] = pg.info
        with loaded_cluster(base, files, plan.docs, plan.partitions) as (cdir, client, _):
            create_indexes(client)
            with spark_driver(base, cdir, "shardex-bench-scan") as driver:
                build_rows, _ = shardex_build(client, driver, plan.docs, timeout=7200)
                extra["build"] = build_rows
            log("Spark stopped; scanning")
            sx = shardex_phase(
                client, cdir, expected, queries, pg.answers, plan.levels, plan.seconds
            )
    rows = pg.rows + sx.rows
    tables = {
        "100-row scans": [r for r in rows if "p50 ms" in r],
        "large scans": [r for r in rows if "rows/s" in r],
    }
    tables["ratios shardex / PostgreSQL (100-row scans)"] = scan_ratios(tables["100-row scans"])
    tables["ratios (large scans)"] = large_ratios(tables["large scans"])
    return {"tables": tables, **extra}


def scan_ratios(rows: Sequence[Row]) -> list[Row]:
    """For every shardex row, its PostgreSQL twin (same case and clients): p50, p99 and
    scans/s ratios, and the gap to the p50 target."""
    pg = {(r["case"], r["clients"]): r for r in rows if r["system"] == "postgresql"}
    out: list[Row] = []
    for r in rows:
        if r["system"] != "shardex":
            continue
        p = pg.get((r["case"], r["clients"]))
        if p is None:
            continue
        p50 = ratio(r["p50 ms"], p["p50 ms"])
        out.append(
            {
                "case": r["case"],
                "consistency": r["consistency"],
                "clients": r["clients"],
                "p50 x": p50,
                "p99 x": ratio(r["p99 ms"], p["p99 ms"]),
                "scans/s x": ratio(r["scans/s"], p["scans/s"]),
                "p50 target": f"<= {P50_TARGET}",
                "gap x": None if p50 is None else round(p50 / P50_TARGET, 2),
                "load_1m": r["load_1m"],
            }
        )
    return out


def large_ratios(rows: Sequence[Row]) -> list[Row]:
    """Each shardex large scan's rows/s over PostgreSQL's index-order scan and over raw
    RocksDB iteration of the same index's slices."""
    pg = next((r["rows/s"] for r in rows if r["system"] == "postgresql"), None)
    raw = {r["case"].split(",")[0]: r["rows/s"] for r in rows if r["system"] == "rocksdb raw"}
    out: list[Row] = []
    for r in rows:
        if r["system"] != "shardex":
            continue
        head = r["case"].split(",")[0]
        out.append(
            {
                "case": r["case"],
                "rows/s": r["rows/s"],
                "/ postgresql": ratio(r["rows/s"], pg) if head == "full by_city_age" else None,
                "/ raw rocksdb": ratio(r["rows/s"], raw.get(head)),
                "load_1m": r["load_1m"],
            }
        )
    return out


def parse_args(argv: Sequence[str] | None) -> tuple[Plan, Path]:
    return parse_plan_args(argv, "scan", __doc__, Plan, QUICK)


def main(argv: Sequence[str] | None = None) -> int:
    plan, path = parse_args(argv)

    def summary(out: dict[str, Any], elapsed: float) -> str:
        return (
            f"{plan.docs:,} docs, indexes {', '.join(INDEX_NAMES)}, 3 nodes on "
            f"{machine_info()['cpu_count']} CPUs, clients are processes; load average start "
            f"{out['load_avg_start']}, end {out['load_avg_end']}; {elapsed:.0f} s. "
            "Shared machine: noisy figures."
        )

    return bench_main("scan", plan, path, run, summary)


if __name__ == "__main__":
    sys.exit(main())
