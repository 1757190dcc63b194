"""The phases of ``bench.sql``, never running at the same time: PostgreSQL (server up,
documents, twin indexes, checks, measurements, server down), then shardex (3-node cluster,
documents, indexes built by the Spark pipeline, Spark stopped, checks against PostgreSQL's
answers, bytes in flight per exchange, measurements)."""

from __future__ import annotations

import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from bench.common.clients import shardex_target
from bench.common.phases import Phase, check_rows, measure_grid, pg_load_docs
from bench.common.runner import Row, load1, log
from bench.sql.clients import ClientPool, Runner, Target, Variant
from bench.sql.queries import (
    CASES,
    GROUP,
    KEYSPACE,
    PG_DDL,
    PG_SQL,
    SHARDEX_DDL,
    SX_SQL,
    Query,
    canonical,
    differences,
    shardex_rows,
)

CHECKS = 4  # queries of each case compared between the systems before measuring
SMALL_WINDOW = 64 * 1024
PG = Variant(name="-")
CURRENT = Variant(name="current")
BASELINE = Variant(
    name="baseline",
    tuning={
        "index_order": False,
        "get_many": False,
        "plan_cache": False,
        "inline": False,
        "local": False,
        "speculate": False,
    },
)


def check(system: str, q: Query, got: list[tuple[Any, ...]]) -> None:
    check_rows(system, q.case, q.params, len(got), q.expected_rows)


def measure(
    system: str,
    pool: ClientPool,
    queries: dict[str, list[Query]],
    variants: Sequence[Variant],
    levels: Sequence[int],
    seconds: float,
) -> list[Row]:
    return measure_grid(
        system,
        pool,
        queries,
        CASES,
        variants,
        levels,
        seconds,
        column="variant",
        label=lambda v: v.name,
        rate="q/s",
    )


# --- PostgreSQL ------------------------------------------------------------------------------


def postgres_phase(
    base: Path,
    files: Sequence[Path],
    n_docs: int,
    queries: dict[str, list[Query]],
    expected_groups: list[tuple[Any, ...]],
    levels: Sequence[int],
    seconds: float,
) -> Phase:
    from bench.common.postgres import PostgresServer

    out = Phase()
    with PostgresServer(base_dir=base) as server:
        out.info["server"] = server.describe()
        with server.connect() as conn:
            count = pg_load_docs(conn, files, PG_DDL, n_docs)
        target = Target("postgresql", conninfo=server.conninfo())
        runner = Runner(target)
        try:
            plans: dict[str, list[str]] = {}
            for case in CASES:
                for k, q in enumerate(queries[case][:CHECKS]):
                    got = canonical(case, runner.rows(q, PG))
                    check("postgresql", q, got)
                    out.answers[(case, k)] = got
                q = queries[case][0]
                explain = runner.conn.execute(
                    "EXPLAIN " + PG_SQL[case], runner.pg_params(q)
                ).fetchall()
                plans[case] = [r[0] for r in explain]
            diff = differences(GROUP, out.answers[(GROUP, 0)], expected_groups)
            if diff is not None:
                raise RuntimeError(f"postgresql GROUP BY differs from the documents: {diff}")
            out.info["plans"] = plans
        finally:
            runner.close()
        log(f"postgresql: {count} documents, twin indexes, checks passed")
        with ClientPool(target, max(levels)) as pool:
            out.rows = measure("postgresql", pool, queries, [PG], levels, seconds)
    return out


# --- shardex -----------------------------------------------------------------------------------


def create_and_build(client: Any, driver: Any, timeout: float) -> tuple[list[str], float]:
    """Every index of ``SHARDEX_DDL`` deferred, then one BUILD INDEX of all; seconds until
    all are ACTIVE."""
    for ddl in SHARDEX_DDL:
        client.execute_ddl(ddl)
    names = [i["name"] for i in client.list_indexes(KEYSPACE)]
    t = time.perf_counter()
    client.build_index(KEYSPACE, *names)
    for name in names:
        client.wait_for_index(KEYSPACE, name, timeout=timeout)
    seconds = time.perf_counter() - t
    log(f"indexes {', '.join(names)} ACTIVE after {seconds:.1f} s")
    return names, seconds


def shardex_checks(client: Any, queries: dict[str, list[Query]], pg: Phase) -> dict[str, Any]:
    """Every checked query, with each variant's switches, equals PostgreSQL's answer; the
    EXPLAIN of each case (index, leaf steps)."""
    for variant in (CURRENT, BASELINE):
        for case in CASES:
            for k, q in enumerate(queries[case][:CHECKS]):
                res = client.query(SX_SQL[case], list(q.params), tuning=variant.tuning)
                got = canonical(case, shardex_rows(case, list(res)))
                check("shardex", q, got)
                diff = differences(case, got, pg.answers[(case, k)])
                if diff is not None:
                    raise RuntimeError(
                        f"shardex ({variant.name}) and postgresql differ on {case} "
                        f"{q.params}: {diff}"
                    )
    log("shardex: check queries equal postgresql's answers (both variants)")
    explains: dict[str, Any] = {}
    for case in CASES:
        q = queries[case][0]
        plan = next(iter(client.query("EXPLAIN " + SX_SQL[case], list(q.params))))
        dist = plan.get("distributed", {})
        fragments = dist.get("fragments", [])
        explains[case] = {
            "mode": dist.get("mode"),
            "source": dist.get("source"),
            "index": (dist.get("index") or {}).get("name"),
            "covering": (dist.get("index") or {}).get("covering"),
            "index_order": (dist.get("index") or {}).get("index_order"),
            "leaf": fragments[1]["does"] if len(fragments) > 1 else None,
            "root": fragments[0]["does"] if fragments else None,
        }
    return explains


def exchange_rows(
    client: Any, node_names: Sequence[str], cases: Sequence[Query], windows: Sequence[int | None]
) -> list[Row]:
    """Each query once per credit window; every node's ExchangeMeter for the query: per
    stream (leaf -> root) the bytes sent and the most the sender could have had in flight
    (``max_sender_bound`` >= sent - consumed at every instant), against the window."""
    from shardex.api.sql_exec import ExchangeStats, ExchangeStatsReply

    rows: list[Row] = []
    for q in cases:
        for window in windows:
            load = load1()
            t = time.perf_counter()
            res = client.query(SX_SQL[q.case], list(q.params), window=window, timeout=600)
            n = sum(1 for _ in res)
            seconds = time.perf_counter() - t
            if n != q.expected_rows:
                raise RuntimeError(f"shardex {q.case}: {n} rows, expected {q.expected_rows}")
            qid = res.metrics.details["query_id"]
            streams: list[Any] = []
            for node in node_names:
                reply = client.rpc.run(
                    client.rpc.router.to_node(node, ExchangeStats(query_id=qid), ExchangeStatsReply)
                )
                streams += [s for s in reply.streams if s.sent]  # the senders' side
            if not streams:
                raise RuntimeError(f"no exchange stats for {q.case} (query {qid})")
            w = streams[0].window
            worst = max(s.max_sender_bound for s in streams)
            rows.append(
                {
                    "case": q.case,
                    "window KiB": round(w / 1024, 1),
                    "rows": n,
                    "streams": len(streams),
                    "bytes sent": sum(s.sent for s in streams),
                    "max in flight": worst,
                    "max in flight / window": round(worst / w, 3),
                    "sender stalls": sum(s.stalls for s in streams),
                    "seconds": round(seconds, 2),
                    "load_1m": load,
                }
            )
            log(f"exchanges {q.case} window {w}: max in flight {worst} ({worst / w:.2f} x)")
    return rows


def shardex_phase(
    client: Any,
    cluster_dir: Path,
    queries: dict[str, list[Query]],
    large: Query,
    pg: Phase,
    levels: Sequence[int],
    seconds: float,
) -> Phase:
    """The cluster is loaded, the indexes are ACTIVE and Spark is stopped."""
    from shardex.meta import cluster_dir as cdir

    out = Phase()
    out.info["explain"] = shardex_checks(client, queries, pg)
    names = [n.name for n in cdir.load(cluster_dir).nodes]
    group = queries[GROUP][0]
    out.info["exchanges"] = exchange_rows(client, names, [group, large], [SMALL_WINDOW, None])
    with ClientPool(shardex_target(cluster_dir), max(levels)) as pool:
        out.rows = measure("shardex", pool, queries, [CURRENT, BASELINE], levels, seconds)
    return out
