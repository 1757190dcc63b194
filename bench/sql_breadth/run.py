"""SQL++ breadth against PostgreSQL: ``python -m bench.sql_breadth``.

``python -m bench.sql_breadth [--quick] [--docs ORDERS] [--seconds S] [--clients 1,4]
[--json PATH]``.

Customers and their orders (``data.py``: 1M orders and 100k customers by default, ``--docs``
orders and a tenth as many customers; ``--quick``: 50k and 5k), the cases of ``queries.py``
(an index nested-loop join and an index join with a selective filter, a hash join of two
large inputs, UNNEST and ANY ... SATISFIES over an array index, a correlated subquery, a
window function over a partition). One run, the systems one after the other:

1. PostgreSQL (``bench.sql``'s phase over this mix): ``orders`` and ``customers`` as jsonb
   tables with the twin expression indexes and a GIN index on the lines, VACUUM ANALYZE;
   each case's first queries answered (the reference) and checked against the row counts
   the documents imply, then measured over psycopg with prepared statements.
2. shardex: a 3-node local cluster, both keyspaces loaded, the four indexes built by the
   Spark pipeline (stopped before measuring). Each case's checked queries must equal
   PostgreSQL's answers (multisets; in order where the statement has ORDER BY) before it is
   measured; a case shardex refuses as SQL_SYNTAX is listed as not supported by this build,
   one that fails or differs with its reason, and neither is measured. Then the bytes in
   flight per exchange (``bench.sql``'s measurement, a 64 KiB and the default 1 MiB credit
   window) of the array cases, the window case, the hash join (leaves -> join fragments ->
   root, decision 0135) and its two inputs run as statements of their own; then the cases
   at request_plus; then the hash join A/B: its join at the initiator over side statements
   (tuning ``join_exchange`` off, decision 0123) and between fragments, alternating, three
   rounds at one client, with the medians and their ratios.

Each case runs at 1 and 4 concurrent clients (``--clients``), one OS process each. Tables:
every measurement; shardex / PostgreSQL per case and client count against the goal (p50
within ``P50_GOAL`` x, q/s at least ``QPS_GOAL`` x), the cases not measured with why;
each case's status; the exchanges. The machine is shared: the load average stands beside
each figure; nothing is checked against a threshold. Results in
``bench/results/sql_breadth.json`` (``sql_breadth-quick.json`` with ``--quick``).
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench.common.dataset import SEED
from bench.common.harness import bench_dir, bench_main, parse_plan_args, run_summary, spark_driver
from bench.common.runner import log, machine_info
from bench.sql.run import build_timeout, client_levels
from bench.sql.tables import goal_summary, latency_ratios
from bench.sql_breadth.data import CUSTOMERS, ORDERS

P50_GOAL = 2.0  # shardex p50 / PostgreSQL p50, at most
QPS_GOAL = 0.5  # its q/s twin
CUSTOMERS_PER_ORDER = 0.1


@dataclass
class Plan:
    docs: int = 1_000_000  # orders; customers are a tenth of them
    seconds: float = 10.0  # per measurement
    levels: tuple[int, ...] = (1, 4)
    partitions: int = 64
    load_files: int = 3
    seed: int = SEED

    @property
    def customers(self) -> int:
        return max(1, int(self.docs * CUSTOMERS_PER_ORDER))


QUICK = {"docs": 50_000, "seconds": 3.0}


def more_args(ap: argparse.ArgumentParser) -> None:
    ap.add_argument(
        "--clients", dest="levels", type=client_levels, help="client counts (default 1,4)"
    )


def pg_load(files: dict[str, list[Path]], counts: dict[str, int]) -> Any:
    """PostgreSQL's load: both tables with their twin indexes; the rows in all."""
    from bench.common.phases import pg_load_docs
    from bench.sql_breadth.queries import PG_DDL

    def load(conn: Any) -> int:
        return sum(
            pg_load_docs(conn, files[t], PG_DDL[t], counts[t], table=t) for t in (ORDERS, CUSTOMERS)
        )

    return load


def run(plan: Plan) -> dict[str, Any]:
    from bench.common.harness import load_keyspace
    from bench.common.local_cluster import shardex_cluster
    from bench.sql.phases import create_and_build, postgres_phase
    from bench.sql_breadth.data import generate
    from bench.sql_breadth.phases import MIX, ab_summary, shardex_phase, skipped_rows
    from bench.sql_breadth.queries import SHARDEX_DDL, build_queries, side_queries
    from shardex.client import connect_local

    counts = {ORDERS: plan.docs, CUSTOMERS: plan.customers}
    with bench_dir("sql_breadth", plan) as (base, extra):
        stats, files, sizes = generate(base, plan.docs, plan.customers, plan.seed, plan.load_files)
        queries = build_queries(stats)
        extra["documents"] = {"counts": counts, "jsonl_bytes": sizes}
        extra["queries"] = {
            c: [{"params": q.params, "rows": q.expected_rows} for q in qs]
            for c, qs in queries.items()
        }
        pg = postgres_phase(
            base, pg_load(files, counts), queries, plan.levels, plan.seconds, 0, MIX
        )
        extra["postgresql"] = pg.info
        with shardex_cluster(base, 3) as cdir, connect_local(cdir) as client:
            loads = {
                ks: load_keyspace(client, cdir, base, ks, files[ks], counts[ks], plan.partitions)
                for ks in (CUSTOMERS, ORDERS)
            }
            with spark_driver(base, cdir, "shardex-bench-sql-breadth") as driver:
                names, build_s = create_and_build(
                    client, driver, build_timeout(plan.docs), ddl=SHARDEX_DDL,
                    keyspaces=(ORDERS, CUSTOMERS),
                )  # fmt: skip
            extra["shardex"] = {"load_seconds": loads, "indexes": names, "build_s": build_s}
            log("Spark stopped; querying")
            sx = shardex_phase(
                client, cdir, queries, side_queries(stats), pg, plan.levels, plan.seconds
            )
            extra["shardex"].update(sx.info)
    rows = pg.rows + sx.rows
    ratios = latency_ratios(rows, p50_goal=P50_GOAL, qps_goal=QPS_GOAL)
    tables = {
        "SQL++ breadth": rows,
        "ratios shardex / PostgreSQL": ratios + skipped_rows(sx.info["status"]),
        "cases meeting the goal": goal_summary(ratios, P50_GOAL, QPS_GOAL),
        "cases on shardex": [{"case": c, "status": s} for c, s in sx.info["status"].items()],
        "bytes in flight per exchange vs the credit window": sx.info["exchanges"],
    }
    if "join_ab" in sx.info:
        tables["hash join A/B: at the initiator vs between fragments"] = sx.info["join_ab"]
        tables["hash join A/B, medians"] = ab_summary(sx.info["join_ab"])
    return {"tables": tables, **extra}


def parse_args(argv: Sequence[str] | None) -> tuple[Plan, Path]:
    return parse_plan_args(argv, "sql_breadth", __doc__, Plan, QUICK, more_args)


def main(argv: Sequence[str] | None = None) -> int:
    plan, path = parse_args(argv)
    what = (
        f"{plan.docs:,} orders, {plan.customers:,} customers, 3 nodes on "
        f"{machine_info()['cpu_count']} CPUs, clients are processes, shardex at request_plus"
    )
    return bench_main("sql_breadth", plan, path, run, lambda o, t: f"{what}; {run_summary(o, t)}")
