"""One case of ``bench.sql`` with one execution switch on and off, same cluster, same run:
``python -m bench.sql.ab [--quick] [--docs N] [--seconds S] [--clients 1,4,16]
[--case "range order limit"] [--switch late] [--rounds 2] [--json PATH]``.

shardex only (no PostgreSQL): a 3-node local cluster loaded and indexed as ``bench.sql``
does, the case's checked queries answered alike with the switch on and off (at request_plus
and not_bounded), then measured at each client count, on and off alternating ``--rounds``
times so drifting load hits both alike. The table gives each measurement (p50, q/s, the 3 nodes'
CPU per query) and the on/off ratios of the medians over the rounds (< 1: the switch on is
faster or cheaper). Results in ``bench/results/sql-ab.json`` (``sql-ab-quick.json``).
"""

from __future__ import annotations

import argparse
import statistics
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
from bench.common.runner import Row, machine_info
from bench.sql.queries import CASES, RANGE, SX_SQL, DocStats, build_queries
from bench.sql.run import build_timeout, client_levels

CPU = "server CPU ms/query"


@dataclass
class Plan:
    docs: int = 1_000_000
    seconds: float = 10.0
    levels: tuple[int, ...] = (1, 4, 16)
    case: str = RANGE
    switch: str = "late"
    rounds: int = 2
    partitions: int = 64
    load_files: int = 3
    seed: int = SEED


QUICK = {"docs": 20_000, "seconds": 3.0}


def more_args(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--clients", dest="levels", type=client_levels, help="default 1,4,16")
    ap.add_argument("--case", dest="case", choices=CASES, help=f"default {RANGE!r}")
    ap.add_argument("--switch", dest="switch", help="a tuning switch (default late)")
    ap.add_argument("--rounds", dest="rounds", type=int, help="on/off alternations (default 2)")


def ratios(rows: list[Row]) -> list[Row]:
    """Per consistency and client count: medians over the rounds, on / off."""
    out: list[Row] = []
    keys = sorted({(r["consistency"], r["clients"]) for r in rows})
    for consistency, n in keys:

        def median(switch: bool, col: str, c: str = consistency, k: int = n) -> float | None:
            vals = [
                r[col]
                for r in rows
                if r["consistency"] == c and r["clients"] == k and r["on"] is switch
            ]
            vals = [v for v in vals if v is not None]
            return statistics.median(vals) if vals else None

        row: Row = {"consistency": consistency, "clients": n}
        for col in ("p50 ms", "q/s", CPU):
            on, off = median(True, col), median(False, col)
            row[f"{col} on"], row[f"{col} off"] = on, off
            row[f"{col} on/off"] = round(on / off, 3) if on and off else None
        out.append(row)
    return out


def run(plan: Plan) -> dict[str, Any]:
    from bench.common.clients import shardex_target
    from bench.common.dataset import write_docs
    from bench.common.local_cluster import node_pids
    from bench.common.phases import measure_grid
    from bench.common.proc_cpu import process_cpu
    from bench.sql.clients import ClientPool, Variant
    from bench.sql.phases import create_and_build
    from bench.sql.queries import canonical, shardex_rows
    from shardex.demo.datagen import users
    from shardex.sql.exec.tuning import check_tuning

    check_tuning({plan.switch: False})  # an unknown switch fails before any work
    with bench_dir("sql-ab", plan) as (base, extra):
        files, _ = write_docs(base, plan.docs, plan.seed, plan.load_files)
        queries = {plan.case: build_queries(DocStats.of(users(plan.docs, plan.seed)))[plan.case]}
        with loaded_cluster(base, files, plan.docs, plan.partitions) as (cdir, client, _):
            with spark_driver(base, cdir, "shardex-bench-sql-ab") as driver:
                create_and_build(client, driver, timeout=build_timeout(plan.docs))
            sql = SX_SQL[plan.case]
            variants = [
                Variant(name=f"{plan.switch} {'on' if on else 'off'}", consistency=c,
                        tuning={plan.switch: on})
                for c in ("request_plus", "not_bounded") for on in (True, False)
            ]  # fmt: skip
            for q in queries[plan.case][:4]:
                answers = [
                    canonical(plan.case, shardex_rows(plan.case, list(client.query(
                        sql, list(q.params), v.consistency, tuning=v.tuning))))
                    for v in variants
                ]  # fmt: skip
                if any(a != answers[0] for a in answers):
                    raise RuntimeError(f"{plan.case} {q.params}: answers differ on/off")
            explain = next(iter(client.query("EXPLAIN " + sql, list(queries[plan.case][0].params))))
            extra["explain"] = explain.get("distributed")
            pids = list(node_pids(cdir).values())
            rows: list[Row] = []
            with ClientPool(shardex_target(cdir, as_user=True), max(plan.levels)) as pool:
                # On and off alternate at each client count: load drifting over the run
                # (the machine is shared) hits both alike.
                for n in plan.levels:
                    for _ in range(plan.rounds):
                        for variant in variants:
                            rows += measure_grid(
                                "shardex", pool, queries, [plan.case], [variant], [n],
                                plan.seconds, columns=Variant.columns, rate="q/s",
                                server_cpu=lambda: process_cpu(pids),
                            )  # fmt: skip
    for r in rows:
        r["on"] = r["variant"].endswith(" on")
    return {"tables": {"measurements": rows, "on / off (medians)": ratios(rows)}, **extra}


def parse_args(argv: Sequence[str] | None) -> tuple[Plan, Path]:
    return parse_plan_args(argv, "sql-ab", __doc__, Plan, QUICK, more_args)


def main(argv: Sequence[str] | None = None) -> int:
    plan, path = parse_args(argv)

    def summary(out: dict[str, Any], elapsed: float) -> str:
        return (
            f"{plan.case!r}, switch {plan.switch!r} on vs off, {plan.docs:,} docs, 3 nodes on "
            f"{machine_info()['cpu_count']} CPUs; load average start {out['load_avg_start']}, "
            f"end {out['load_avg_end']}; {elapsed:.0f} s. Shared machine: noisy figures."
        )

    return bench_main("sql-ab", plan, path, run, summary)


if __name__ == "__main__":
    raise SystemExit(main())
