"""The tables ``bench.sql`` derives from its measurement rows: shardex / PostgreSQL ratios per
case, consistency and client count, marked against the goal; how many cases meet it; the cold
path (a new client's first query against a warm one); and shardex with its fast paths on
against off. Pure functions over rows (unit-tested in ``tests/bench/test_bench_sql.py``).

The goal, for every case at every client count: shardex's p50 within ``P50_GOAL`` x
PostgreSQL's and its queries/s at least ``QPS_GOAL`` x PostgreSQL's; a new client's first
query within ``COLD_GOAL`` x its warm p50. The tables only say met / not met: nothing fails
on them (a shared machine's figures are noisy).
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping, Sequence
from typing import Any

from bench.scan.queries import ratio

Row = dict[str, Any]

P50_GOAL = 1.5  # shardex p50 / PostgreSQL p50, at most
QPS_GOAL = 0.67  # shardex q/s / PostgreSQL q/s, at least
COLD_GOAL = 3.0  # first query of a new client / warm p50, at most
MET, NOT_MET = "met", "not met"
COLD_MARK = f"1st <= {COLD_GOAL:g}x warm"

SERVER_CPU = "server CPU ms/query"
CLIENT_CPU = "client CPU ms/query"
CURRENT = "current"  # shardex's variant with every fast path on
PG_VARIANT = "-"


def mark(value: float | None, limit: float, *, at_most: bool) -> str | None:
    """``MET`` when ``value`` is within ``limit`` (at most, or at least), else ``NOT_MET``;
    None when there is no value (a case without queries)."""
    if value is None:
        return None
    return MET if (value <= limit if at_most else value >= limit) else NOT_MET


def _raw(a: float | None, b: float | None) -> float | None:
    return None if a is None or b is None or b == 0 else a / b


def p50_mark(goal: float) -> str:
    """The column marking a p50 ratio against ``goal`` (at most)."""
    return f"p50 <= {goal:g}x"


def qps_mark(goal: float) -> str:
    """The column marking a q/s ratio against ``goal`` (at least)."""
    return f"q/s >= {goal:g}x"


P50_MARK = p50_mark(P50_GOAL)
QPS_MARK = qps_mark(QPS_GOAL)


def latency_ratios(
    rows: Sequence[Mapping[str, Any]],
    *,
    system: str = "shardex",
    base: str = "postgresql",
    match: Sequence[str] = ("case", "clients"),
    p50_goal: float = P50_GOAL,
    qps_goal: float = QPS_GOAL,
) -> list[Row]:
    """For every ``system`` row, its ``base`` twin (the same values of ``match``): p50, p99,
    q/s and CPU-per-query ratios (> 1: ``system`` slower or costlier, except q/s: faster),
    and whether p50 and q/s meet the goals (judged on the unrounded ratios). By default
    shardex against PostgreSQL per case and client count."""
    twins = {tuple(r.get(k) for k in match): r for r in rows if r["system"] == base}
    p50_col, qps_col = p50_mark(p50_goal), qps_mark(qps_goal)
    out: list[Row] = []
    for r in rows:
        if r["system"] != system:
            continue
        p = twins.get(tuple(r.get(k) for k in match))
        if p is None:
            continue
        out.append(
            {
                "case": r["case"],
                "consistency": r.get("consistency", ""),
                "variant": r.get("variant", ""),
                "clients": r["clients"],
                "p50 x": ratio(r["p50 ms"], p["p50 ms"]),
                "p99 x": ratio(r["p99 ms"], p["p99 ms"]),
                "q/s x": ratio(r["q/s"], p["q/s"]),
                "server CPU/query x": ratio(r.get(SERVER_CPU), p.get(SERVER_CPU)),
                "client CPU/query x": ratio(r.get(CLIENT_CPU), p.get(CLIENT_CPU)),
                p50_col: mark(_raw(r["p50 ms"], p["p50 ms"]), p50_goal, at_most=True),
                qps_col: mark(_raw(r["q/s"], p["q/s"]), qps_goal, at_most=False),
                "load_1m": r.get("load_1m"),
            }
        )
    return out


def goal_summary(
    ratios: Sequence[Mapping[str, Any]], p50_goal: float = P50_GOAL, qps_goal: float = QPS_GOAL
) -> list[Row]:
    """Per consistency, variant and client count (in the order measured: request_plus
    first): how many cases meet the p50 goal, the q/s goal and both, out of the cases
    measured (``latency_ratios`` with the same goals)."""
    p50_col, qps_col = p50_mark(p50_goal), qps_mark(qps_goal)
    groups: dict[tuple[str, str, int], list[Mapping[str, Any]]] = {}
    for r in ratios:
        groups.setdefault((r["consistency"], r["variant"], r["clients"]), []).append(r)
    out: list[Row] = []
    for (consistency, variant, clients), rs in groups.items():
        out.append(
            {
                "consistency": consistency,
                "variant": variant,
                "clients": clients,
                "cases": len(rs),
                f"{p50_col} met": sum(1 for r in rs if r[p50_col] == MET),
                f"{qps_col} met": sum(1 for r in rs if r[qps_col] == MET),
                "both met": sum(1 for r in rs if r[p50_col] == MET and r[qps_col] == MET),
            }
        )
    return out


def speedups(rows: Sequence[Mapping[str, Any]], baseline: str, current: str) -> list[Row]:
    """shardex ``current`` over ``baseline`` at the same consistency (the same run, the same
    load): p50 of the baseline / p50 now, q/s now / q/s of the baseline (> 1: faster now)."""
    base = {
        (r["case"], r["clients"], r.get("consistency")): r
        for r in rows
        if r["system"] == "shardex" and r.get("variant") == baseline
    }
    out: list[Row] = []
    for r in rows:
        if r["system"] != "shardex" or r.get("variant") != current:
            continue
        b = base.get((r["case"], r["clients"], r.get("consistency")))
        if b is None:
            continue
        out.append(
            {
                "case": r["case"],
                "consistency": r.get("consistency", ""),
                "clients": r["clients"],
                f"{baseline} p50 ms": b["p50 ms"],
                f"{current} p50 ms": r["p50 ms"],
                "p50 speedup": ratio(b["p50 ms"], r["p50 ms"]),
                "q/s speedup": ratio(r["q/s"], b["q/s"]),
                "load_1m": r.get("load_1m"),
            }
        )
    return out


# --- the cold path -----------------------------------------------------------------------------


def _median_ms(values: Sequence[float]) -> float | None:
    return round(statistics.median(values) * 1e3, 2) if values else None


def warm_p50(rows: Sequence[Mapping[str, Any]], system: str, case: str, consistency: str) -> Any:
    """The p50 (ms) of ``case`` at 1 client: shardex's ``current`` variant at
    ``consistency``, or PostgreSQL's; None when not measured."""
    for r in rows:
        if (
            r["system"] == system
            and r["case"] == case
            and r["clients"] == 1
            and r.get("consistency") == consistency
            and r.get("variant") in (CURRENT, PG_VARIANT)
        ):
            return r["p50 ms"]
    return None


def cold_rows(samples: Sequence[Mapping[str, Any]], rows: Sequence[Mapping[str, Any]]) -> list[Row]:
    """The cold path, per system and case, from ``samples`` (``system``, ``case``,
    ``consistency`` and per new client, in order, ``connect s``, ``first s`` and ``second s``:
    the connection with its login, then its first and second query). The first new client
    of a process pays the process's one-time costs too: shown on its own, the medians are
    over the others. ``1st / warm x`` (the goal's ratio) is the first query after the
    connection is up over the warm p50 of the same case at 1 client (``rows``);
    ``connect+1st / warm x`` counts the connection too."""
    out: list[Row] = []
    for s in samples:
        connect, first, second = s["connect s"], s["first s"], s["second s"]
        both = [c + f for c, f in zip(connect, first, strict=True)]
        rest = slice(1, None) if len(first) > 1 else slice(None)
        warm = warm_p50(rows, s["system"], s["case"], s["consistency"])
        first_ms = _median_ms(first[rest])
        both_ms = _median_ms(both[rest])
        out.append(
            {
                "system": s["system"],
                "case": s["case"],
                "consistency": s["consistency"],
                "new clients": len(first),
                "connect ms": _median_ms(connect[rest]),
                "1st query ms": first_ms,
                "2nd query ms": _median_ms(second[rest]),
                "connect+1st ms": both_ms,
                "process's 1st client: connect+1st ms": round(both[0] * 1e3, 2) if both else None,
                "warm p50 ms": warm,
                "1st / warm x": ratio(first_ms, warm),
                "connect+1st / warm x": ratio(both_ms, warm),
                COLD_MARK: mark(_raw(first_ms, warm), COLD_GOAL, at_most=True),
            }
        )
    return out
