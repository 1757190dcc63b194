"""The N1QL query service over HTTP against the Python client and PostgreSQL: ``python -m
bench.http``.

``python -m bench.http [--quick] [--docs N] [--seconds S] [--clients 1,4,16] [--ab]
[--json PATH]``.

The data, indexes and statements are ``bench.sql``'s (the demo's users, ``#primary``,
``by_email``, ``by_city_age`` and their PostgreSQL twins), four of its cases: ``point key``,
``point email`` (a secondary index), ``range order limit`` and ``covering``. One run, the
systems one after the other:

1. PostgreSQL (``bench.sql``'s phase): the reference answers, then each case measured over
   psycopg with prepared statements.
2. shardex: a 3-node local cluster, the documents loaded, the indexes built by the Spark
   pipeline (stopped before measuring). Every checked query over every wire must equal
   PostgreSQL's answer. Then per case and client count, back to back so they see the same
   load: the Python client (``c.query``) and the query service (``POST /query/service``, a
   JSON body, basic auth as the cluster's admin user, the whole response read and parsed),
   each at request_plus (like PostgreSQL's read committed) and not_bounded (the query
   service's default).

The HTTP client is what a tuned application would hold (``lean.py``): keep-alive
connections over raw sockets, the request's bytes built once per statement, and the
service's routing hints followed with a cluster map (a key lookup goes to the HTTP port of
its key's owner, as a Couchbase SDK sends key operations), exactly as the Python client
follows the same hints over its RPC. ``--ab`` adds the generic client as a third wire
(``shardex http plain``: the standard library's ``http.client`` and ``json`` on one
connection to the worker's node, hints ignored), measured in the same turns, with its own
ratio tables.

Each client is an OS process (``bench.common.clients``); worker ``k`` starts on node ``k
mod 3`` on every wire. The shardex grid runs ``--rounds`` times (3) in turns of a third of
``--seconds``, so every wire sees the machine's load swings alike; each row is the rounds'
median. Tables: every measurement; HTTP / Python client per case,
consistency and client count (the goal: p50 at most ``HTTP_P50_GOAL`` x for point queries,
so the wire costs little where it weighs most); HTTP / PostgreSQL and Python client /
PostgreSQL against ``bench.sql``'s goal. The machine is shared: the load average stands
beside each figure; nothing is checked against a threshold. Results in
``bench/results/http.json`` (``http-quick.json`` with ``--quick``) unless ``--json``.

Wall time on 2 cores: ``--quick`` (20k documents, 3 s per measurement, 1 and 4 clients)
about 5 minutes; the default 1M-document run at 1, 4 and 16 clients about 25 minutes.
"""

from __future__ import annotations

import argparse
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench.common.dataset import SEED
from bench.common.harness import bench_dir, bench_main, parse_plan_args, run_summary
from bench.common.phases import Phase
from bench.common.runner import Row, log, machine_info
from bench.http.clients import CLIENT, HTTP, HTTP_PLAIN, WireVariant
from bench.sql.phases import Mix
from bench.sql.queries import COVERING, POINT_EMAIL, POINT_KEY, RANGE, DocStats, build_queries
from bench.sql.run import build_timeout, client_levels
from bench.sql.tables import goal_summary, latency_ratios

CASES = (POINT_KEY, POINT_EMAIL, RANGE, COVERING)
POINT_CASES = (POINT_KEY, POINT_EMAIL)
HTTP_MIX = Mix(cases=CASES)
HTTP_P50_GOAL = 1.3  # HTTP p50 / Python client p50 for point queries, at most
HTTP_QPS_GOAL = 0.77  # its q/s twin: 1 / 1.3
CONSISTENCIES = ("request_plus", "not_bounded")
# Per consistency the client then HTTP, so each pair is measured back to back.
VARIANTS = [WireVariant(consistency=c, wire=w) for c in CONSISTENCIES for w in (CLIENT, HTTP)]
# --ab: the generic HTTP client too, in the same turns
AB_VARIANTS = [
    WireVariant(consistency=c, wire=w) for c in CONSISTENCIES for w in (CLIENT, HTTP, HTTP_PLAIN)
]


@dataclass
class Plan:
    docs: int = 1_000_000
    seconds: float = 10.0  # per measurement
    levels: tuple[int, ...] = (1, 4, 16)
    partitions: int = 64
    load_files: int = 3
    seed: int = SEED
    ab: bool = False  # the generic HTTP client measured as a third wire
    rounds: int = 3  # each shardex measurement split in turns over the whole grid


COUNTS = ("queries", "errors")  # summed over the rounds; every other figure: their median
QUICK = {"docs": 20_000, "seconds": 3.0, "levels": (1, 4)}


def more_args(ap: argparse.ArgumentParser) -> None:
    ap.add_argument(
        "--clients", dest="levels", type=client_levels, help="client counts (default 1,4,16)"
    )
    ap.add_argument(
        "--ab",
        action="store_true",
        default=None,
        help="also measure the generic HTTP client (http.client, no routing hints)",
    )
    ap.add_argument(
        "--rounds",
        type=int,
        help="turns each shardex measurement is split in, the whole grid per turn (default 3)",
    )


def merge_rounds(rounds: Sequence[Sequence[Row]]) -> list[Row]:
    """Each measurement's rows of every round as one: the counts summed, every other figure
    (latencies, rates, CPU per query, load) the rounds' median; ``rounds`` says how many."""
    out: list[Row] = []
    for same in zip(*rounds, strict=True):
        named = {
            tuple(r.get(k) for k in ("system", "case", "consistency", "clients")) for r in same
        }
        if len(named) != 1:
            raise RuntimeError(f"rounds measured different grids: {sorted(map(str, named))}")
        first = dict(same[0])
        for key in dict.fromkeys(k for r in same for k in r):
            values = [r.get(key) for r in same]
            if key in COUNTS:
                first[key] = sum(v or 0 for v in values)
            elif key != "clients" and any(
                isinstance(v, int | float) and not isinstance(v, bool) for v in values
            ):
                numbers = [v for v in values if v is not None]
                first[key] = round(statistics.median(numbers), 4)
            elif first.get(key) is None:
                first[key] = next((v for v in values if v is not None), None)
        first["rounds"] = len(same)
        out.append(first)
    return out


def _against_client(rows: Sequence[Mapping[str, Any]], system: str) -> list[Row]:
    """``system`` / the Python client (same case, clients and consistency) against the
    HTTP goal."""
    return latency_ratios(
        rows,
        system=system,
        base=CLIENT,
        match=("case", "clients", "consistency"),
        p50_goal=HTTP_P50_GOAL,
        qps_goal=HTTP_QPS_GOAL,
    )


def ratio_tables(rows: Sequence[Mapping[str, Any]]) -> dict[str, list[Row]]:
    """HTTP / Python client against the HTTP goal, with how many point cases meet it; HTTP
    and the Python client / PostgreSQL; with ``--ab``'s rows, the generic HTTP client's
    ratios too."""
    wire = _against_client(rows, HTTP)
    points = [r for r in wire if r["case"] in POINT_CASES]
    tables = {
        "ratios HTTP / Python client": wire,
        "point cases meeting the HTTP goal": goal_summary(points, HTTP_P50_GOAL, HTTP_QPS_GOAL),
        "ratios HTTP / PostgreSQL": latency_ratios(rows, system=HTTP),
        "ratios Python client / PostgreSQL": latency_ratios(rows, system=CLIENT),
    }
    if any(r.get("system") == HTTP_PLAIN for r in rows):
        tables["ratios HTTP plain / Python client"] = _against_client(rows, HTTP_PLAIN)
        tables["ratios HTTP / HTTP plain"] = latency_ratios(
            rows, system=HTTP, base=HTTP_PLAIN, match=("case", "clients", "consistency")
        )
    return tables


def shardex_phase(
    cluster_dir: Path,
    queries: dict[str, list[Any]],
    pg: Phase,
    levels: Sequence[int],
    seconds: float,
    variants: Sequence[WireVariant] = VARIANTS,
    rounds: int = 1,
) -> list[Row]:
    """Every wire's answers checked against PostgreSQL's, then every case measured over
    each (the indexes ACTIVE, Spark stopped), the grid ``rounds`` times in turns of
    ``seconds / rounds`` (``merge_rounds``)."""
    from bench.common.local_cluster import node_pids
    from bench.common.proc_cpu import process_cpu
    from bench.http.clients import WireRunner, http_target
    from bench.sql.clients import ClientPool
    from bench.sql.phases import check_answers, measure

    target = http_target(cluster_dir)
    runner = WireRunner(target)
    try:
        for wire in dict.fromkeys(v.wire for v in variants):
            on_wire = [v for v in variants if v.wire == wire]
            check_answers(wire, runner.rows, HTTP_MIX, queries, pg.answers, on_wire)
    finally:
        runner.close()
    log("shardex: every wire's check queries equal postgresql's answers")
    pids = list(node_pids(cluster_dir).values())
    with ClientPool(target, max(levels), WireRunner) as pool:
        turns = [
            measure(
                CLIENT, pool, queries, variants, levels, seconds / rounds,
                lambda: process_cpu(pids), CASES,
            )
            for _ in range(rounds)
        ]  # fmt: skip
    return merge_rounds(turns)


def run(plan: Plan) -> dict[str, Any]:
    from bench.common.dataset import write_docs
    from bench.common.phases import pg_load_docs
    from bench.sql.phases import indexed_cluster, postgres_phase
    from bench.sql.queries import PG_DDL
    from shardex.demo.datagen import users

    with bench_dir("http", plan) as (base, extra):
        files, size = write_docs(base, plan.docs, plan.seed, plan.load_files)
        queries = build_queries(DocStats.of(users(plan.docs, plan.seed)))
        for case in CASES:
            if not queries[case]:
                raise RuntimeError(f"no {case} queries for {plan.docs} documents")
        extra["documents"] = {"count": plan.docs, "jsonl_bytes": size}
        pg = postgres_phase(
            base, lambda conn: pg_load_docs(conn, files, PG_DDL, plan.docs), queries,
            plan.levels, plan.seconds, 0, HTTP_MIX,
        )  # fmt: skip
        extra["postgresql"] = pg.info
        timeout = build_timeout(plan.docs)
        app = "shardex-bench-http"
        with indexed_cluster(base, files, plan.docs, plan.partitions, app, timeout) as built:
            cdir, _, extra["shardex"] = built
            variants = AB_VARIANTS if plan.ab else VARIANTS
            rows = pg.rows + shardex_phase(
                cdir, queries, pg, plan.levels, plan.seconds, variants, plan.rounds
            )
    return {"tables": {"query mix over HTTP, the Python client and PostgreSQL": rows,
                       **ratio_tables(rows)}, **extra}  # fmt: skip


def parse_args(argv: Sequence[str] | None) -> tuple[Plan, Path]:
    return parse_plan_args(argv, "http", __doc__, Plan, QUICK, more_args)


def main(argv: Sequence[str] | None = None) -> int:
    plan, path = parse_args(argv)
    what = (
        f"{plan.docs:,} docs, 3 nodes on {machine_info()['cpu_count']} CPUs, clients are "
        "processes with one keep-alive HTTP connection each"
    )
    return bench_main("http", plan, path, run, lambda o, t: f"{what}; {run_summary(o, t)}")
