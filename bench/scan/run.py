"""Index scans against PostgreSQL: ``python -m bench.scan [--quick] [--rounds R] [--json PATH]``.

One run on one machine, both systems up together for the 100-row measurements, which take
turns (``rounds.py``, ``interleaved.py``):

1. PostgreSQL (``bench/common/postgres.py``, the Debian server, its default settings): the demo's
   documents in ``docs(id, body jsonb)`` with the twin expression indexes of ``by_city_age``
   and ``by_email`` (``bench.common.dataset.INDEXES``), VACUUM ANALYZE, check queries and a full
   index-order scan. The server stays up.
2. shardex: a 3-node local cluster, the same documents (``shardex load``), the two indexes
   built by the Spark pipeline (in this process; ``by_city_age`` on (address.city, age)
   partitioned by hash(META().id) into 4, ``by_email`` unpartitioned WHERE status =
   'active'). Spark is then stopped: no writes happen during the scans, so the pipeline
   would only add its idle polling to the machine (request_plus still fetches the high
   seqnos and waits for stability to cover them; it just never has to wait long).
   Check queries, full scans (rows decoded, raw entries; ordered and unordered) and raw
   RocksDB iteration of the same slice files, each with its CPU per row: every node
   process's and the client's (this process), from /proc; PostgreSQL's large scan with its
   server's (postmaster and backends) and its client's.
3. The 100-row queries, interleaved: in each of R rounds (``--rounds``, default 3) every
   case x clients slot measures PostgreSQL (over psycopg, prepared statements, per-case
   session settings for its best plan, ``queries.PG_SETTINGS``) and shardex at
   not_bounded and request_plus one after the other, the order reversed every other round;
   ``--seconds`` per measurement (27 x R of them). Per arm the median over rounds of p50,
   p99 and scans/s; ratios of the medians and the per-round ratios' min and max. Around each
   measurement the CPU of both systems' server processes (and client processes) is read
   from /proc: "own cpu %" is the measured system's servers, "peer cpu %" what the idle
   other system cost meanwhile (% of one core).

The 100-row cases (``queries.py``): a (city, age) range that naturally holds ~100 rows,
an ordered ``LIMIT 100`` over a (city, age >= lo) range, and ``LIMIT 100`` over the
unpartitioned email index (one slice, no scatter-gather). Each at 1, 4 and 16 concurrent
clients, one OS process per client (``clients.py``; one pool per system, both open for
the whole measurement). Before measuring, a few queries of each case are checked: row
counts against the documents, and for the natural ranges the same docids in both systems.

Ratios are shardex / PostgreSQL (> 1: shardex slower for latencies, faster for rates). The
target is the 100-row scan p50 within 2x of PostgreSQL: "gap x" = ratio / 2 (> 1: short).
The machine is shared (2 cores, other work running): the 1-minute load average is printed
beside each measurement ("100-row scans, every measurement") and each median row; nothing
is checked against a threshold. Results in ``bench/results/scan.json`` (``scan-quick.json``
with ``--quick``) unless ``--json PATH``.
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench.common.dataset import INDEX_NAMES, SEED
from bench.common.harness import (
    bench_dir,
    bench_main,
    loaded_cluster,
    parse_plan_args,
    spark_driver,
)
from bench.common.runner import Row, log, machine_info
from bench.scan.queries import CASES, KeyStats, build_queries, ratio
from bench.scan.rounds import P50_TARGET, median_rows, scan_ratios

__all__ = ["P50_TARGET", "Plan", "large_ratios", "main", "run", "scan_ratios"]


@dataclass
class Plan:
    docs: int = 200_000
    # Per measurement: 27 per round (3 cases x 3 levels x 3 arms); 3 rounds of 1.5 s are
    # 121 s measured, under the 135 s (27 x 5 s) of the one-after-the-other layout.
    seconds: float = 1.5
    rounds: int = 3
    levels: tuple[int, ...] = (1, 4, 16)
    partitions: int = 64
    load_files: int = 3
    seed: int = SEED


QUICK = {"docs": 20_000, "seconds": 1.0}  # 81 s measured, as 27 x 3 s before


def run(plan: Plan) -> dict[str, Any]:
    from bench.common.clients import shardex_target
    from bench.common.dataset import create_indexes, write_docs
    from bench.common.driver import shardex_build
    from bench.common.postgres import PostgresServer
    from bench.scan.clients import Target
    from bench.scan.interleaved import measure_interleaved
    from bench.scan.phases import NOT_BOUNDED, REQUEST_PLUS, postgres_setup, shardex_setup
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
        with PostgresServer(base_dir=base) as server:
            pg = postgres_setup(server, files, plan.docs, queries)
            extra["postgresql"] = pg.info
            with loaded_cluster(base, files, plan.docs, plan.partitions) as (cdir, client, _):
                create_indexes(client)
                with spark_driver(base, cdir, "shardex-bench-scan") as driver:
                    build_rows, _ = shardex_build(client, driver, plan.docs, timeout=7200)
                    extra["build"] = build_rows
                log("Spark stopped; scanning")
                sx = shardex_setup(client, cdir, expected, queries, pg.answers)
                log(f"100-row scans: {plan.rounds} rounds, both systems up, taking turns")
                samples = measure_interleaved(
                    Target("postgresql", conninfo=server.conninfo()),
                    server.data_dir,
                    shardex_target(cdir),
                    cdir,
                    queries,
                    [NOT_BOUNDED, REQUEST_PLUS],
                    plan.levels,
                    plan.rounds,
                    plan.seconds,
                )
    scans = median_rows(samples, CASES)
    large = pg.rows + sx.rows
    tables = {
        "100-row scans": scans,
        "large scans": large,
        "ratios shardex / PostgreSQL (100-row scans)": scan_ratios(scans, samples),
        "ratios (large scans)": large_ratios(large),
        "100-row scans, every measurement": samples,
    }
    return {"tables": tables, **extra}


def large_ratios(rows: Sequence[Row]) -> list[Row]:
    """Each shardex large scan's rows/s over PostgreSQL's index-order scan and over raw
    RocksDB iteration of the same index's slices, its CPU per row (servers + client) and
    raw iteration's CPU per row over it."""
    pg = next((r["rows/s"] for r in rows if r["system"] == "postgresql"), None)
    raws = [r for r in rows if r["system"] == "rocksdb raw"]
    raw = {r["case"].split(",")[0]: r["rows/s"] for r in raws}
    raw_cpu = {r["case"].split(",")[0]: r.get("cpu us/row client") for r in raws}
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
                "cpu us/row": _cpu_per_row(r),
                # Raw iteration's CPU per row over the scan's: the same ratio as rows/s on an
                # idle machine with the scan alone on one core, steadier on a loaded one (the
                # raw scan is short, so its rows/s moves with the scheduler).
                "cpu: raw rocksdb /": ratio(raw_cpu.get(head), _cpu_per_row(r)),
                "load_1m": r["load_1m"],
            }
        )
    return out


def _cpu_per_row(row: Row) -> float | None:
    """Servers' and client's CPU per row of a large scan (None when not measured)."""
    server, client = row.get("cpu us/row server"), row.get("cpu us/row client")
    return None if server is None or client is None else round(server + client, 3)


def parse_args(argv: Sequence[str] | None) -> tuple[Plan, Path]:
    """The shared ``--quick/--docs/--seconds/--json`` and this bench's ``--rounds``."""
    ap = argparse.ArgumentParser(prog="python -m bench.scan", add_help=False)
    ap.add_argument("--rounds", type=int)
    known, rest = ap.parse_known_args(argv)
    plan, path = parse_plan_args(rest, "scan", __doc__, Plan, QUICK)
    if known.rounds is not None:
        if known.rounds < 1:
            ap.error(f"--rounds must be >= 1, got {known.rounds}")
        plan.rounds = known.rounds
    return plan, path


def main(argv: Sequence[str] | None = None) -> int:
    plan, path = parse_args(argv)

    def summary(out: dict[str, Any], elapsed: float) -> str:
        return (
            f"{plan.docs:,} docs, indexes {', '.join(INDEX_NAMES)}, 3 nodes on "
            f"{machine_info()['cpu_count']} CPUs, clients are processes; load average start "
            f"{out['load_avg_start']}, end {out['load_avg_end']}; {elapsed:.0f} s. "
            f"100-row scans: {plan.rounds} rounds of {plan.seconds:g} s per measurement, "
            "the systems taking turns (medians over rounds). Shared machine: noisy figures."
        )

    return bench_main("scan", plan, path, run, summary)
