"""The phases of ``bench.sql``, never running at the same time: PostgreSQL (server up,
documents, twin indexes, checks, measurements, cold path, server down), then shardex (3-node
cluster, documents, indexes built by the Spark pipeline, Spark stopped, checks against
PostgreSQL's answers, bytes in flight per exchange, measurements, cold path).

CPU per query: PostgreSQL's is the postmaster's and its children's (the clients' backends,
the background processes); shardex's the 3 node processes'; both over the measured window
only (``bench.common.clients.ClientPool.measure``)."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bench.common.clients import shardex_target
from bench.common.phases import Phase, check_rows, measure_grid
from bench.common.runner import Row, load1, log
from bench.sql.clients import ClientPool, Runner, Target, Variant, cold_path
from bench.sql.queries import (
    CASES,
    COLUMNS,
    GROUP,
    KEYSPACE,
    SHARDEX_DDL,
    SX_SQL,
    Query,
    canonical,
    differences,
    shardex_rows,
)

CHECKS = 4  # queries of each case compared between the systems before measuring
PROGRESS_EVERY = 30.0  # seconds between progress lines of the index build
SMALL_WINDOW = 64 * 1024
COLD_TIMEOUT = 600.0  # seconds for one case's new clients, in their own process
# PostgreSQL's default isolation: every statement sees every write committed before it.
PG = Variant(name="-", consistency="read committed")
CURRENT = Variant(name="current")  # request_plus: the like-for-like level, the headline
NOT_BOUNDED = Variant(name="current", consistency="not_bounded")
BASELINE = Variant(
    name="baseline",
    tuning={
        "index_order": False,
        "get_many": False,
        "plan_cache": False,
        "inline": False,
        "local": False,
        "speculate": False,
        "late": False,
    },
)


def shardex_variants(baseline: bool) -> list[Variant]:
    """What shardex is measured at: request_plus and not_bounded with every fast path on,
    and with ``baseline`` also request_plus with them off."""
    return [CURRENT, NOT_BOUNDED] + ([BASELINE] if baseline else [])


@dataclass(frozen=True)
class Mix:
    """A query mix as the phases run it: its cases in order, the runner holding its
    statements, how an answer becomes comparable (``canonical``) and is compared
    (``differences``: None when equal), and each case's result columns."""

    cases: Sequence[str] = CASES
    runner: type[Runner] = Runner
    canonical: Callable[[str, Sequence[Sequence[Any]]], list[tuple[Any, ...]]] = canonical
    differences: Callable[[str, Sequence[Any], Sequence[Any]], str | None] = differences
    columns: Mapping[str, tuple[str, ...]] = field(default_factory=lambda: COLUMNS)


SQL_MIX = Mix()


def check(system: str, q: Query, got: list[tuple[Any, ...]]) -> None:
    check_rows(system, q.case, q.params, len(got), q.expected_rows)


def check_answers(
    system: str,
    rows_of: Callable[[Query, Variant], list[Any]],
    mix: Mix,
    queries: Mapping[str, list[Query]],
    answers: Mapping[tuple[str, int], Any],
    variants: Sequence[Variant],
) -> None:
    """Every checked query of every case (``rows_of``: its result dicts), at each variant,
    returns its rows and equals the reference ``answers`` (PostgreSQL's), or a
    ``RuntimeError`` saying what differs."""
    for variant in variants:
        for case in mix.cases:
            for k, q in enumerate(queries[case][:CHECKS]):
                got = mix.canonical(case, shardex_rows(case, rows_of(q, variant), mix.columns))
                check(system, q, got)
                diff = mix.differences(case, got, answers[(case, k)])
                if diff is not None:
                    raise RuntimeError(
                        f"{system} ({variant.name}, {variant.consistency}) and postgresql "
                        f"differ on {case} {q.params}: {diff}"
                    )


def measure(
    system: str,
    pool: ClientPool,
    queries: dict[str, list[Query]],
    variants: Sequence[Variant],
    levels: Sequence[int],
    seconds: float,
    server_cpu: Callable[[], float],
    cases: Sequence[str] = CASES,
) -> list[Row]:
    return measure_grid(
        system,
        pool,
        queries,
        cases,
        variants,
        levels,
        seconds,
        columns=lambda v: v.columns(),  # a subclass may name more (a wire)
        rate="q/s",
        server_cpu=server_cpu,
    )


def cold(
    system: str, target: Target, queries: dict[str, list[Query]], variant: Variant, clients: int
) -> list[dict[str, Any]]:
    """Every case's cold path (``clients.cold_path``): ``clients`` new clients in a fresh
    process per case."""
    out: list[dict[str, Any]] = []
    for case in CASES:
        got = cold_path(target, queries[case], variant, clients, COLD_TIMEOUT)
        out.append({"system": system, "case": case, "consistency": variant.consistency, **got})
        first = sorted(got["first s"][1:] or got["first s"])
        median_ms = first[len(first) // 2] * 1e3
        log(f"{system} {case}: a new client's first query, median {median_ms:.1f} ms")
    return out


# --- PostgreSQL ------------------------------------------------------------------------------


def postgres_phase(
    base: Path,
    load: Callable[[Any], int],
    queries: dict[str, list[Query]],
    levels: Sequence[int],
    seconds: float,
    cold_clients: int,
    mix: Mix = SQL_MIX,
) -> Phase:
    """A PostgreSQL server up; ``load(conn)`` (tables, twin indexes, ANALYZE: the row
    count); every case's first queries answered (``answers``, the reference) with their
    row counts checked, each case's EXPLAIN; the measurements; with ``cold_clients`` the
    cold path; the server down."""
    from bench.common.postgres import PostgresServer
    from bench.common.proc_cpu import tree_cpu

    out = Phase()
    with PostgresServer(base_dir=base) as server:
        out.info["server"] = server.describe()
        with server.connect() as conn:
            count = load(conn)
        target = Target("postgresql", conninfo=server.conninfo())
        runner = mix.runner(target)
        try:
            plans: dict[str, list[str]] = {}
            for case in mix.cases:
                for k, q in enumerate(queries[case][:CHECKS]):
                    got = mix.canonical(case, runner.rows(q, PG))
                    check("postgresql", q, got)
                    out.answers[(case, k)] = got
                q = queries[case][0]
                explain = runner.conn.execute(
                    "EXPLAIN " + runner.PG[case], runner.pg_params(q)
                ).fetchall()
                plans[case] = [r[0] for r in explain]
            out.info["plans"] = plans
        finally:
            runner.close()
        log(f"postgresql: {count} rows, twin indexes, checks passed")
        postmaster = server.postmaster_pid()
        if postmaster is None:
            raise RuntimeError("postgresql: no postmaster pid to read the server's CPU from")
        with ClientPool(target, max(levels), mix.runner) as pool:
            out.rows = measure(
                "postgresql", pool, queries, [PG], levels, seconds,
                lambda: tree_cpu([postmaster]), mix.cases,
            )  # fmt: skip
        out.info["cpu"] = "the postmaster and its children (backends, background processes)"
        if cold_clients:
            out.info["cold"] = cold("postgresql", target, queries, PG, cold_clients)
    return out


# --- shardex -----------------------------------------------------------------------------------


def create_and_build(
    client: Any,
    driver: Any,
    timeout: float,
    progress_every: float = PROGRESS_EVERY,
    ddl: Sequence[str] = SHARDEX_DDL,
    keyspaces: Sequence[str] = (KEYSPACE,),
) -> tuple[list[str], float]:
    """Every index of ``ddl`` deferred, then one BUILD INDEX of all per keyspace; seconds
    until all are ACTIVE (a line of progress every ``progress_every`` s; past ``timeout`` s
    the client's TIMEOUT error). The names are ``keyspace.index`` with several keyspaces."""
    from shardex.errors import RequestTimeout

    for statement in ddl:
        client.execute_ddl(statement)
    indexes = [(ks, i["name"]) for ks in keyspaces for i in client.list_indexes(ks)]
    t = time.perf_counter()
    for ks in keyspaces:
        client.build_index(ks, *[name for k, name in indexes if k == ks])
    for ks, name in indexes:
        while True:
            left = timeout - (time.perf_counter() - t)
            try:
                client.wait_for_index(ks, name, timeout=max(0.0, min(progress_every, left)))
                break
            except RequestTimeout as e:
                if left <= progress_every:
                    raise
                d = e.details
                log(
                    f"index {name} {d.get('state')}, progress {d.get('progress')}, "
                    f"{time.perf_counter() - t:.0f} s"
                )
    seconds = time.perf_counter() - t
    names = [name if len(keyspaces) == 1 else f"{ks}.{name}" for ks, name in indexes]
    log(f"indexes {', '.join(names)} ACTIVE after {seconds:.1f} s")
    return names, seconds


@contextlib.contextmanager
def indexed_cluster(
    base: Path, files: Sequence[Path], n_docs: int, partitions: int, app: str, timeout: float
) -> Iterator[tuple[Path, Any, dict[str, Any]]]:
    """``bench.sql``'s cluster: 3 nodes, the documents loaded, ``SHARDEX_DDL`` built by the
    Spark pipeline (``app``; stopped before this yields: nothing writes meanwhile). Its dir,
    a client, and what to report (load and build seconds, the indexes)."""
    from bench.common.harness import loaded_cluster, spark_driver

    with loaded_cluster(base, files, n_docs, partitions) as (cdir, client, load_s):
        with spark_driver(base, cdir, app) as driver:
            names, build_s = create_and_build(client, driver, timeout=timeout)
        log("Spark stopped; querying")
        yield cdir, client, {"load_seconds": load_s, "indexes": names, "build_s": build_s}


def shardex_checks(
    client: Any, queries: dict[str, list[Query]], pg: Phase, variants: Sequence[Variant]
) -> dict[str, Any]:
    """Every checked query, with each variant's consistency and switches, equals
    PostgreSQL's answer; the EXPLAIN of each case (index, leaf steps)."""

    def rows_of(q: Query, variant: Variant) -> list[Any]:
        res = client.query(
            SX_SQL[q.case], list(q.params), variant.consistency, tuning=variant.tuning
        )
        return list(res)

    check_answers("shardex", rows_of, SQL_MIX, queries, pg.answers, variants)
    log("shardex: check queries equal postgresql's answers (every variant)")
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
    client: Any,
    node_names: Sequence[str],
    cases: Sequence[Query],
    windows: Sequence[int | None],
    sql: Mapping[str, str] = SX_SQL,
) -> list[Row]:
    """Each query once per credit window; every node's ExchangeMeter for the query: per
    stream (leaf -> root) the bytes sent and the most the sender could have had in flight
    (``max_sender_bound`` >= sent - consumed at every instant), against the window. A
    query no node reports a stream for (its leaves ran beside the initiator, say) gets a
    row saying so, with 0 streams and no ratio."""
    from shardex.api.sql_exec import ExchangeStats, ExchangeStatsReply

    rows: list[Row] = []
    for q in cases:
        for window in windows:
            load = load1()
            t = time.perf_counter()
            # The protocol's streams are what is measured: a small result would otherwise
            # ask its leaves by request and reply (``leaf_calls``), with no stream at all.
            res = client.query(
                sql[q.case],
                list(q.params),
                window=window,
                timeout=600,
                tuning={"leaf_calls": False},
            )
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
                rows.append(
                    {
                        "case": q.case,
                        "window KiB": "default" if window is None else round(window / 1024, 1),
                        "rows": n,
                        "streams": 0,
                        "note": "no exchange stream reported for the query",
                        "seconds": round(seconds, 2),
                        "load_1m": load,
                    }
                )
                log(f"exchanges {q.case} window {window}: no stream reported (query {qid})")
                continue
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
    baseline: bool,
    cold_clients: int,
) -> Phase:
    """The cluster is loaded, the indexes are ACTIVE and Spark is stopped."""
    from bench.common.local_cluster import node_pids
    from bench.common.proc_cpu import process_cpu
    from shardex.client import connect_local
    from shardex.meta import cluster_dir as cdir

    out = Phase()
    variants = shardex_variants(baseline)
    out.info["explain"] = shardex_checks(client, queries, pg, variants)
    names = [n.name for n in cdir.load(cluster_dir).nodes]
    group = queries[GROUP][0]
    # ExchangeStats is an internal message: asked as a node, not as the admin user.
    with connect_local(cluster_dir, as_node=True, name="bench-sql-exchanges") as node_client:
        out.info["exchanges"] = exchange_rows(
            node_client, names, [group, large], [SMALL_WINDOW, None]
        )
    pids = list(node_pids(cluster_dir).values())
    if len(pids) != len(names):
        raise RuntimeError(f"shardex: {len(pids)} node pids for {len(names)} nodes")
    target = shardex_target(cluster_dir, as_user=True)
    with ClientPool(target, max(levels)) as pool:
        out.rows = measure(
            "shardex", pool, queries, variants, levels, seconds, lambda: process_cpu(pids)
        )
    out.info["cpu"] = "the 3 node processes"
    out.info["clients"] = f"logged in as the cluster's {target.username or 'node secret'!r}"
    out.info["cold"] = cold("shardex", target, queries, CURRENT, cold_clients)
    return out
