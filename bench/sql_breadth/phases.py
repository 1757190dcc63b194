"""shardex's phase of ``bench.sql_breadth`` (PostgreSQL's is ``bench.sql``'s, over this mix):
each case tried once and, when it runs, its checked queries compared with PostgreSQL's
answers; the bytes in flight per exchange of the array cases, of the hash join (between
fragments: leaves -> join fragments -> root) and of its inputs run alone; then every case
that ran and agreed, measured; then the hash join A/B: at the initiator (decision 0123)
and between fragments (0135), alternating, ``AB_ROUNDS`` rounds. A case shardex cannot run
is reported with its reason and left out (``SQL_SYNTAX``: not supported by this build),
never measured; a case that disagrees with PostgreSQL is reported with the first difference
and left out."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from bench.common.phases import Phase
from bench.common.runner import Row, log
from bench.sql.clients import Runner, Variant
from bench.sql.phases import CURRENT, SMALL_WINDOW, Mix, check_answers
from bench.sql.queries import Query, differences
from bench.sql_breadth.queries import (
    ANY,
    CASES,
    COLUMNS,
    HASH_JOIN,
    PG_SQL,
    SIDE_SQL,
    SX_SQL,
    UNNEST,
    WINDOW,
    canonical,
    pg_args,
)

CHECKED = "checked equal"
# The hash join with its join at the initiator over side statements: the A/B's other arm.
AT_INITIATOR = Variant(name="join at initiator", tuning={"join_exchange": False})
AB_ROUNDS = 3
UNSUPPORTED = "not supported by this build"


class BreadthRunner(Runner):
    """``bench.sql``'s runner with this mix's statements; PostgreSQL's parameters per
    ``pg_args`` (their order and form may differ from shardex's)."""

    NAME = "bench-sql-breadth"
    SX = SX_SQL
    PG = PG_SQL

    def pg_params(self, q: Query) -> tuple[Any, ...]:
        return tuple(self.jsonb(v) if j else v for v, j in pg_args(q.case, q.params))


MIX = Mix(
    cases=CASES, runner=BreadthRunner, canonical=canonical, differences=differences,
    columns=COLUMNS,
)  # fmt: skip


def case_status(code: str | None, message: str) -> str:
    """How the cases table names a case shardex refused: its SQL_SYNTAX is this build
    lacking the syntax; any other error is named with its code."""
    if code == "SQL_SYNTAX":
        return f"{UNSUPPORTED} ({message[:120]})"
    return f"error {code}: {message[:200]}"


def try_cases(
    client: Any, queries: dict[str, list[Query]], pg: Phase, variant: Variant
) -> dict[str, str]:
    """Each case: ``CHECKED`` when its checked queries equal PostgreSQL's answers, else why
    not (refused, failed, or the first difference)."""
    from shardex.errors import ShardexError

    def rows_of(q: Query, v: Variant) -> list[Any]:
        res = client.query(SX_SQL[q.case], list(q.params), v.consistency, timeout=600)
        return list(res)

    out: dict[str, str] = {}
    for case in CASES:
        try:
            check_answers(
                "shardex", rows_of, dataclasses.replace(MIX, cases=(case,)), queries,
                pg.answers, [variant],
            )  # fmt: skip
            out[case] = CHECKED
        except ShardexError as e:
            out[case] = case_status(str(e.code), str(e))
        except RuntimeError as e:  # rows or answers differ
            out[case] = f"differs: {e}"[:300]
        log(f"shardex {case}: {out[case]}")
    return out


def explain(client: Any, queries: dict[str, list[Query]], cases: Sequence[str]) -> dict[str, Any]:
    """Each case's EXPLAIN (its first query): the plan the measurements ran."""
    return {
        c: next(iter(client.query("EXPLAIN " + SX_SQL[c], list(queries[c][0].params))))
        for c in cases
    }


def shardex_phase(
    client: Any,
    cluster_dir: Path,
    queries: dict[str, list[Query]],
    sides: Sequence[Query],
    pg: Phase,
    levels: Sequence[int],
    seconds: float,
) -> Phase:
    """The keyspaces are loaded, the indexes ACTIVE and Spark stopped."""
    from bench.common.clients import shardex_target
    from bench.common.local_cluster import node_pids
    from bench.common.proc_cpu import process_cpu
    from bench.sql.clients import ClientPool
    from bench.sql.phases import exchange_rows, measure
    from shardex.client import connect_local
    from shardex.meta import cluster_dir as cdir

    out = Phase()
    status = try_cases(client, queries, pg, CURRENT)
    ok = [c for c in CASES if status[c] == CHECKED]
    out.info["status"] = status
    out.info["explain"] = explain(client, queries, ok)
    names = [n.name for n in cdir.load(cluster_dir).nodes]
    streamed = [queries[c][0] for c in (UNNEST, ANY, WINDOW, HASH_JOIN) if c in ok] + list(sides)
    # ExchangeStats is an internal message: asked as a node, not as the admin user.
    with connect_local(cluster_dir, as_node=True, name="bench-breadth-exchanges") as node:
        out.info["exchanges"] = exchange_rows(
            node, names, streamed, [SMALL_WINDOW, None], {**SX_SQL, **SIDE_SQL}
        )
    pids = list(node_pids(cluster_dir).values())
    target = shardex_target(cluster_dir, as_user=True)
    with ClientPool(target, max(levels), BreadthRunner) as pool:
        cpu = lambda: process_cpu(pids)  # noqa: E731
        out.rows = measure("shardex", pool, queries, [CURRENT], levels, seconds, cpu, ok)
        if HASH_JOIN in ok:
            arms = [AT_INITIATOR, CURRENT] * AB_ROUNDS
            out.info["join_ab"] = measure(
                "shardex", pool, queries, arms, [1], seconds, cpu, [HASH_JOIN]
            )
    return out


def ab_summary(rows: Sequence[Row]) -> list[Row]:
    """Per arm of the hash join A/B: the median over its rounds of p50 and of the servers'
    CPU per query, and each as a ratio to the initiator arm's."""
    from statistics import median

    def med(arm: str, key: str) -> float | None:
        vals = [r[key] for r in rows if r.get("variant") == arm and r.get(key) is not None]
        return median(vals) if vals else None

    base_p50 = med(AT_INITIATOR.name, "p50 ms")
    base_cpu = med(AT_INITIATOR.name, "server CPU ms/query")
    out: list[Row] = []
    for arm in (AT_INITIATOR.name, CURRENT.name):
        p50, cpu = med(arm, "p50 ms"), med(arm, "server CPU ms/query")
        out.append(
            {
                "arm": arm,
                "rounds": sum(1 for r in rows if r.get("variant") == arm),
                "median p50 ms": p50,
                "p50 / initiator": round(p50 / base_p50, 3) if p50 and base_p50 else None,
                "median server CPU ms/query": cpu,
                "CPU / initiator": round(cpu / base_cpu, 3) if cpu and base_cpu else None,
            }
        )
    return out


def skipped_rows(status: dict[str, str]) -> list[Row]:
    """A line per case not measured on shardex, saying why (for the ratios table)."""
    return [{"case": c, "note": s} for c, s in status.items() if s != CHECKED]
