"""The two setups of ``bench.scan``, each system's own part before the interleaved 100-row
measurements (``interleaved.py``): PostgreSQL (documents and twin indexes in a running
server, check queries, plans, its large scan), then shardex (check queries against
PostgreSQL's answers, large scans). Each returns its rows and what the other needs for
checks (PostgreSQL's answers to the check queries)."""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from bench.common.dataset import INDEXES, KEYSPACE
from bench.common.phases import Phase, check_rows, pg_load_docs
from bench.common.runner import Row, load1, log
from bench.scan.queries import CASES, PG_SETTINGS, PG_SQL, Query

__all__ = ["NOT_BOUNDED", "REQUEST_PLUS", "Phase", "postgres_setup", "shardex_setup"]

NOT_BOUNDED = "not_bounded"
REQUEST_PLUS = "request_plus"
CHECKS = 4  # queries of each case checked (rows and docids) before measuring


def check_answer(system: str, q: Query, docids: list[str]) -> None:
    check_rows(system, q.case, q.pg_params, len(docids), q.expected_rows)


# --- PostgreSQL ------------------------------------------------------------------------------


def postgres_setup(
    server: Any, files: Sequence[Path], n_docs: int, queries: dict[str, list[Query]]
) -> Phase:
    """``server`` (a started ``PostgresServer``) loaded, checked and scanned in full; it
    stays up for the measurements."""
    from psycopg.types.json import Jsonb

    out = Phase()
    out.info["server"] = server.describe()
    with server.connect() as conn:
        count = pg_load_docs(conn, files, (i["pg"] for i in INDEXES), n_docs)
        plans = {}
        for case in CASES:
            conn.execute("RESET ALL")
            for setting in PG_SETTINGS[case]:
                conn.execute(setting)
            for k, q in enumerate(queries[case][:CHECKS]):
                params = tuple(Jsonb(p) for p in q.pg_params)
                got = [r[0] for r in conn.execute(PG_SQL[q.case], params).fetchall()]
                check_answer("postgresql", q, got)
                out.answers[(case, k)] = sorted(got)
            q = queries[case][0]
            params = tuple(Jsonb(p) for p in q.pg_params)
            plan = conn.execute("EXPLAIN " + PG_SQL[case], params).fetchall()
            plans[case] = [r[0] for r in plan]
        out.info["plans"] = plans
        out.info["session_settings"] = {c: list(PG_SETTINGS[c]) for c in CASES}
        conn.execute("RESET ALL")
        log(f"postgresql: {count} documents, twin indexes built, checks passed")
        pid = server.postmaster_pid()
        postmaster = CpuPerRow({} if pid is None else {"postgresql": pid}, tree=True)
        out.rows.extend(large_scan_pg(conn, n_docs, postmaster))
    return out


LARGE_PG_SQL = (
    "SELECT id, body->'address'->'city', body->'age' FROM docs "
    "WHERE body->'address'->'city' >= '\"\"'::jsonb "
    "ORDER BY body->'address'->'city', body->'age'"
)


def large_scan_pg(conn: Any, n_docs: int, cpu: CpuPerRow) -> list[Row]:
    """Every entry of the by_city_age twin in index order, through an index scan (seq scans
    and bitmap scans off: the like-for-like of a full index scan), fetched over psycopg."""
    conn.execute("SET enable_seqscan = off")
    plan = [r[0] for r in conn.execute("EXPLAIN " + LARGE_PG_SQL).fetchall()]
    rows: list[Row] = []
    for attempt in ("warm", "measured"):
        load = load1()
        cpu0 = cpu.sample()
        t = time.perf_counter()
        got = conn.execute(LARGE_PG_SQL).fetchall()
        seconds = time.perf_counter() - t
        if len(got) != n_docs:
            raise RuntimeError(f"postgresql large scan: {len(got)} rows, expected {n_docs}")
        if attempt == "measured":
            rows.append(
                large_row("postgresql", "full by_city_age, index order", n_docs, seconds, load)
                | cpu.columns(cpu0, n_docs)
                | {"detail": plan[0][:60]}
            )
    conn.execute("RESET enable_seqscan")
    return rows


def large_row(system: str, case: str, n: int, seconds: float, load: float | None) -> Row:
    return {
        "system": system,
        "case": case,
        "rows": n,
        "seconds": round(seconds, 3),
        "rows/s": round(n / seconds),
        "load_1m": load,
    }


# --- shardex -----------------------------------------------------------------------------------


def shardex_setup(
    client: Any,
    cluster_dir: Path,
    expected: dict[str, int],
    queries: dict[str, list[Query]],
    pg_answers: dict[tuple[str, int], list[str]],
) -> Phase:
    """The cluster is loaded and both indexes are ACTIVE; Spark is stopped."""
    out = Phase()
    for consistency in (NOT_BOUNDED, REQUEST_PLUS):
        for case in CASES:
            for k, q in enumerate(queries[case][:CHECKS]):
                res = client.scan(
                    KEYSPACE, q.index, q.spans, consistency=consistency, limit=q.limit
                )
                got = [r["docid"] for r in res]
                check_answer("shardex", q, got)
                pg = pg_answers.get((case, k))
                # Natural ranges hold the same docids in both; LIMIT picks ties by docid
                # in shardex and by heap order in PostgreSQL, so only counts compare there.
                if pg is not None and q.limit is None and sorted(got) != pg:
                    raise RuntimeError(f"shardex and postgresql differ on {case} {q.pg_params}")
    log("shardex: check queries passed (rows, and docids against postgresql)")
    out.rows.extend(large_scans_shardex(client, cluster_dir, expected))
    return out


def _timed(fn: Callable[[], int]) -> tuple[int, float, float | None]:
    load = load1()
    t = time.perf_counter()
    n = fn()
    return n, time.perf_counter() - t, load


def _own_cpu() -> float:
    """This process's CPU seconds so far (user + system, every thread)."""
    t = os.times()
    return t.user + t.system


class CpuPerRow:
    """CPU per row of a large scan, per process: ``sample()`` before and ``columns(before,
    n)`` after it. ``servers``: name -> pid of the server processes (a shardex node, or a
    PostgreSQL postmaster with its backends: ``tree``); the client is this process."""

    def __init__(self, servers: dict[str, int], *, tree: bool = False) -> None:
        self.servers = servers
        self.tree = tree

    def sample(self) -> dict[str, float]:
        from bench.common.proc_cpu import process_cpu, tree_cpu

        read = tree_cpu if self.tree else process_cpu
        return {name: read([pid]) for name, pid in self.servers.items()} | {"": _own_cpu()}

    def columns(self, before: dict[str, float], n: int) -> Row:
        """``cpu us/row server`` (all the servers), ``... client``, and each server's own
        (``cpu us/row by process``); 10 ms ticks, so read them over scans of a second or
        more."""
        after = self.sample()
        per = {k: round((after[k] - before[k]) * 1e6 / n, 3) for k in before}
        client = per.pop("")
        return {
            "cpu us/row server": round(sum(per.values()), 3),
            "cpu us/row client": client,
            "cpu us/row by process": per,
        }


def large_scans_shardex(client: Any, cluster_dir: Path, expected: dict[str, int]) -> list[Row]:
    """Full scans of both indexes through the client (rows decoded, or raw entry blocks),
    ordered (k-way merge) and unordered, against raw RocksDB iteration of the same slices."""
    from bench.scan.raw import raw_iterate, slice_locations

    def rows_of(index: str, ordered: bool) -> Callable[[], int]:
        return lambda: sum(1 for _ in client.scan(KEYSPACE, index, ordered=ordered, timeout=300))

    def entries_of(index: str, ordered: bool) -> Callable[[], int]:
        def run() -> int:
            res = client.scan(KEYSPACE, index, ordered=ordered, timeout=300)
            return sum(len(b) for b in res.blocks())

        return run

    from bench.common.local_cluster import node_pids

    cpu = CpuPerRow(node_pids(cluster_dir))
    out: list[Row] = []
    for index, n_expected in expected.items():
        cases = [
            (f"full {index}, ordered, rows", rows_of(index, True)),
            (f"full {index}, unordered, rows", rows_of(index, False)),
            (f"full {index}, ordered, raw entries", entries_of(index, True)),
        ]
        rows_of(index, True)()  # warm: connections, the page cache, the slices' blocks
        for case, fn in cases:
            cpu0 = cpu.sample()
            n, seconds, load = _timed(fn)
            if n != n_expected:
                raise RuntimeError(f"shardex {case}: {n} rows, expected {n_expected}")
            out.append(large_row("shardex", case, n, seconds, load) | cpu.columns(cpu0, n))
        locations = slice_locations(client, cluster_dir, KEYSPACE, index)
        raw_iterate(locations)  # warm
        load = load1()
        n, seconds, cpu_seconds = raw_iterate(locations)
        if n != n_expected:
            raise RuntimeError(f"raw RocksDB {index}: {n} keys, expected {n_expected}")
        row = large_row("rocksdb raw", f"full {index}, keys", n, seconds, load)
        row["cpu us/row client"] = round(cpu_seconds * 1e6 / n, 3)
        out.append(row | {"detail": f"{len(locations)} slices, read-only open, 1 thread"})
        log(f"large scans of {index} done")
    return out
