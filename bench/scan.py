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

from bench.data_service import fs_type, shardex_cluster
from bench.pipeline_common import INDEX_NAMES, KEYSPACE, SEED, BatchLog, InProcessDriver, log
from bench.postgres import signals_raise
from bench.runner import RESULTS_DIR, Row, load_average, machine_info, print_table
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
    from bench.pipeline_build import create_indexes, shardex_build, shardex_load, write_docs
    from bench.scan_phases import postgres_phase, shardex_phase
    from shardex.client import connect_local
    from shardex.demo.datagen import users
    from shardex.pipeline.session import build_spark_session

    extra: dict[str, Any] = {"plan": asdict(plan), "load_avg_start": load_average()}
    base = Path(tempfile.mkdtemp(prefix="shardex-bench-scan-"))
    base.chmod(0o711)  # the postgres OS user must reach its dir inside
    extra["disk"] = {"dir": str(base), "fs_type": fs_type(base)}
    try:
        with signals_raise():
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
            with shardex_cluster(base, 3) as cdir, connect_local(cdir) as client:
                client.create_keyspace(KEYSPACE, num_partitions=plan.partitions)
                shardex_load(cdir, files, base)
                total = client.keyspace_stats(KEYSPACE).total_docs
                if total != plan.docs:
                    raise RuntimeError(f"shardex holds {total} documents, expected {plan.docs}")
                create_indexes(client)
                spark = build_spark_session(
                    app_name="shardex-bench-scan",
                    conf_overrides={
                        "spark.sql.warehouse.dir": str(base / "spark-warehouse"),
                        "spark.local.dir": str(base / "spark-tmp"),
                    },
                )
                driver = None
                try:
                    driver = InProcessDriver(spark, cdir, base / "checkpoints", BatchLog(), 0.3)
                    build_rows, _ = shardex_build(client, driver, plan.docs, timeout=7200)
                    extra["build"] = build_rows
                finally:
                    if driver is not None:
                        driver.stop()
                    spark.stop()
                log("Spark stopped; scanning")
                sx = shardex_phase(
                    client, cdir, expected, queries, pg.answers, plan.levels, plan.seconds
                )
    finally:
        shutil.rmtree(base, ignore_errors=True)
    extra["load_avg_end"] = load_average()
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
    ap = argparse.ArgumentParser(prog="python -m bench.scan", description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="20k docs, 3 s per measurement")
    ap.add_argument("--docs", type=int, help="documents (default 200,000)")
    ap.add_argument("--seconds", type=float, help="seconds per measurement (default 5)")
    ap.add_argument("--json", type=Path, help="where to write the JSON")
    args = ap.parse_args(argv)
    plan = Plan(**QUICK) if args.quick else Plan()  # type: ignore[arg-type]
    if args.docs is not None:
        plan.docs = args.docs
    if args.seconds is not None:
        plan.seconds = args.seconds
    default = "scan-quick.json" if args.quick else "scan.json"
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
        f"{plan.docs:,} docs, indexes {', '.join(INDEX_NAMES)}, 3 nodes on "
        f"{machine_info()['cpu_count']} CPUs, clients are processes; load average start "
        f"{out['load_avg_start']}, end {load}; {elapsed:.0f} s. Shared machine: noisy figures."
    )
    doc = {"name": "scan", "machine": machine_info(), "elapsed": elapsed, **out}
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(doc, indent=2, default=str) + "\n")
    print(f"wrote {path}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
