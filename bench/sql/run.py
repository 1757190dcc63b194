"""SQL against PostgreSQL, query by query, at 1, 4 and 16 clients: ``python -m bench.sql``.

``python -m bench.sql [--quick] [--docs N] [--seconds S] [--clients 1,4,16] [--baseline]
[--cold-clients K] [--json PATH]``.

One run on one machine, the two systems one after the other (never both at once):

1. PostgreSQL (``bench/common/postgres.py``, the Debian server, default settings): the demo's users
   in ``docs(id, body jsonb)`` (primary key on id) with the twin expression indexes
   (``queries.PG_DDL``), VACUUM ANALYZE; each case's first queries answered (the
   reference), then measured over psycopg with prepared statements at read committed (its
   default), then the cold path.
2. shardex: a 3-node local cluster, the same documents (``shardex load``), ``#primary``,
   ``by_email`` and ``by_city_age`` built by the Spark pipeline (in this process; Spark is
   stopped before measuring: nothing writes meanwhile). The checked queries must equal
   PostgreSQL's answers at every consistency and variant measured; then the bytes in flight
   per exchange of the GROUP BY and of a large range, with a 64 KiB and the default 1 MiB
   credit window; then every case through ``c.query`` at request_plus (the headline: like
   PostgreSQL's read committed, it sees every write acknowledged before the query) and at
   not_bounded, every execution switch on; with ``--baseline`` also at request_plus with
   ``index_order``, ``get_many``, ``plan_cache`` and ``inline`` off (the execution before
   them), so before/after come from the same run and load; then the cold path.

The query mix is ``bench/sql/queries.py`` (point by key, point by email, range with ORDER BY
LIMIT 20, GROUP BY city over every document, a covering range). Each case runs at 1, 4 and 16
concurrent clients, one OS process per client (``clients.py``). Every measurement has the
servers' CPU per query (PostgreSQL: the postmaster and its children; shardex: the 3 node
processes) and the client processes', over the measured window.

Tables (``tables.py``): ratios shardex / PostgreSQL per case, consistency and client count
(> 1: shardex slower or costlier, except q/s: faster), each marked met / not met against the
goal (p50 within 1.5x of PostgreSQL's, q/s at least 0.67x) and a count of the cases meeting
it; the cold path: ``--cold-clients`` new clients per case one after the other in a fresh
process, each timed for its connection (connect and login), its first and its second
query, against the warm p50 at 1 client (goal: the first query after connecting within 3x
of the warm p50; ``connect+first`` is shown beside it). The machine is shared: the 1-minute
load average is printed beside each figure; nothing is checked against a threshold.
Results in ``bench/results/sql.json`` (``sql-quick.json`` with ``--quick``) unless ``--json``.

Wall time on 2 cores: ``--quick`` (20k documents, 3 s per measurement) about 4 minutes; the
default 1M-document run about 18 minutes (documents and PostgreSQL's load ~2 min, shardex's
load and index build ~1.5 min, 45 measurements of 10 s plus warm-up, more for the GROUP BY
at 16 clients, ~12 min; checks and cold paths ~2 min), ~5 minutes more with
``--baseline``. The load and the index build print their progress and give up past
``harness.load_timeout`` (1000 s for 1M documents) and ``build_timeout`` (1000 s).
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench.common.dataset import SEED
from bench.common.harness import bench_dir, bench_main, parse_plan_args
from bench.common.runner import machine_info
from bench.sql.queries import (
    CASES,
    GROUP,
    PG_DDL,
    DocStats,
    build_queries,
    differences,
    expected_group_rows,
    large_range_query,
)
from bench.sql.tables import cold_rows, goal_summary, latency_ratios, speedups


@dataclass
class Plan:
    docs: int = 1_000_000
    seconds: float = 10.0  # per measurement
    levels: tuple[int, ...] = (1, 4, 16)
    baseline: bool = False  # also shardex with its fast paths off (request_plus)
    cold_clients: int = 10  # new clients per case for the cold path
    partitions: int = 64
    load_files: int = 3
    seed: int = SEED


QUICK = {"docs": 20_000, "seconds": 3.0, "cold_clients": 5}
MIN_BUILD_SECONDS = 600.0
MIN_BUILD_RATE = 1000.0  # documents/s below which the index build counts as stuck


def build_timeout(n_docs: int) -> float:
    """Seconds the index build of ``n_docs`` may take: 1M documents, 1000 s."""
    return max(MIN_BUILD_SECONDS, n_docs / MIN_BUILD_RATE)


def client_levels(text: str) -> tuple[int, ...]:
    """``--clients 1,4,16``: distinct positive counts, ascending."""
    try:
        levels = sorted({int(x) for x in text.split(",") if x.strip()})
    except ValueError:
        raise argparse.ArgumentTypeError(f"--clients {text!r}: comma-separated counts") from None
    if not levels or levels[0] < 1:
        raise argparse.ArgumentTypeError(f"--clients {text!r}: counts of at least 1")
    return tuple(levels)


def more_args(ap: argparse.ArgumentParser) -> None:
    ap.add_argument(
        "--clients", dest="levels", type=client_levels, help="client counts (default 1,4,16)"
    )
    ap.add_argument(
        "--baseline",
        action="store_true",
        default=None,
        help="also measure shardex with its fast paths off (request_plus)",
    )
    ap.add_argument(
        "--cold-clients",
        dest="cold_clients",
        type=int,
        help="new clients per case for the cold path (default 10, 5 with --quick)",
    )


def run(plan: Plan) -> dict[str, Any]:
    from bench.common.dataset import write_docs
    from bench.common.phases import pg_load_docs
    from bench.sql.phases import indexed_cluster, postgres_phase, shardex_phase
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
            base, lambda conn: pg_load_docs(conn, files, PG_DDL, plan.docs), queries,
            plan.levels, plan.seconds, plan.cold_clients,
        )  # fmt: skip
        diff = differences(GROUP, pg.answers[(GROUP, 0)], expected_group_rows(stats))
        if diff is not None:
            raise RuntimeError(f"postgresql GROUP BY differs from the documents: {diff}")
        extra["postgresql"] = pg.info
        timeout = build_timeout(plan.docs)
        app = "shardex-bench-sql"
        with indexed_cluster(base, files, plan.docs, plan.partitions, app, timeout) as built:
            cdir, client, extra["shardex"] = built
            sx = shardex_phase(
                client, cdir, queries, large, pg, plan.levels, plan.seconds, plan.baseline,
                plan.cold_clients,
            )  # fmt: skip
            extra["shardex"].update(sx.info)
    rows = pg.rows + sx.rows
    ratios = latency_ratios(rows)
    tables = {
        "SQL query mix": rows,
        "ratios shardex / PostgreSQL": ratios,
        "cases meeting the goal": goal_summary(ratios),
        "cold path: a new client's first query vs a warm one": cold_rows(
            pg.info["cold"] + sx.info["cold"], rows
        ),
        "shardex current vs baseline (same run)": speedups(rows, "baseline", "current"),
        "bytes in flight per exchange vs the credit window": sx.info["exchanges"],
    }
    return {"tables": tables, **extra}


def parse_args(argv: Sequence[str] | None) -> tuple[Plan, Path]:
    return parse_plan_args(argv, "sql", __doc__, Plan, QUICK, more_args)


def main(argv: Sequence[str] | None = None) -> int:
    plan, path = parse_args(argv)

    levels = "request_plus and not_bounded" + (" and baseline" if plan.baseline else "")

    def summary(out: dict[str, Any], elapsed: float) -> str:
        return (
            f"{plan.docs:,} docs, 3 nodes on {machine_info()['cpu_count']} CPUs, clients are "
            f"processes, shardex at {levels}; load average start {out['load_avg_start']}, "
            f"end {out['load_avg_end']}; {elapsed:.0f} s. Shared machine: noisy figures."
        )

    return bench_main("sql", plan, path, run, summary)
