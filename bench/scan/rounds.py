"""The interleaving of ``bench.scan``'s 100-row measurements, as pure logic (no cluster, no
server; unit-tested in ``tests/bench/test_bench_scan_rounds.py``): which measurement runs
when, and how the rounds are summed up.

The machine is shared and its load moves within minutes, so measuring one system after the
other compares the load as much as the code. Instead both systems stay up and every slot
(case x clients) measures its arms - PostgreSQL, shardex at each consistency - one after the
other, in ``rounds`` rounds over the whole grid, the arms' order reversed every other round
(so neither system always goes first, right after the other's load). Per arm the median
over rounds of p50, p99 and scans/s; per shardex arm the ratio of those medians to
PostgreSQL's, and the per-round ratios (each round's shardex figure over the same round's
PostgreSQL figure of the same slot) as min/max, so the spread is visible.
"""

from __future__ import annotations

import statistics
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from bench.common.runner import Row
from bench.scan.queries import ratio

POSTGRESQL = "postgresql"
SHARDEX = "shardex"
PG_LABEL = "read committed"  # PostgreSQL's consistency column
P50_TARGET = 2.0  # shardex 100-row scan p50 / PostgreSQL p50
SYSTEM_ORDER = {POSTGRESQL: 0, SHARDEX: 1}


@dataclass(frozen=True)
class Arm:
    """One system with one setting: ``setting`` goes to the client (a consistency, "-" for
    PostgreSQL), ``label`` to the table's consistency column."""

    system: str
    setting: str
    label: str


@dataclass(frozen=True)
class Step:
    """One measurement of the schedule."""

    round: int
    case: str
    clients: int
    arm: Arm


def arms(consistencies: Sequence[str]) -> list[Arm]:
    """PostgreSQL first, then shardex at each consistency."""
    return [Arm(POSTGRESQL, "-", PG_LABEL)] + [Arm(SHARDEX, c, c) for c in consistencies]


def round_order(slot_arms: Sequence[Arm], rnd: int) -> list[Arm]:
    """The arms in their order on even rounds, reversed on odd ones."""
    return list(slot_arms) if rnd % 2 == 0 else list(reversed(slot_arms))


def schedule(
    cases: Sequence[str], levels: Sequence[int], slot_arms: Sequence[Arm], rounds: int
) -> Iterator[Step]:
    """Round by round (so each slot's rounds are spread over the whole run), every case at
    every concurrency, its arms in ``round_order``."""
    if rounds < 1:
        raise ValueError(f"rounds must be >= 1, got {rounds}")
    for rnd in range(rounds):
        for case in cases:
            for n in levels:
                for arm in round_order(slot_arms, rnd):
                    yield Step(rnd, case, n, arm)


def _median(values: Sequence[float | None]) -> float | None:
    present = [v for v in values if v is not None]
    return round(statistics.median(present), 2) if present else None


def _key(r: Row) -> tuple[str, str, str, int]:
    return (r["system"], r["case"], r["consistency"], r["clients"])


def median_rows(samples: Sequence[Row], cases: Sequence[str]) -> list[Row]:
    """One row per arm and slot from its per-round ``samples``: medians of p50, p99, mean,
    scans/s, rows/scan, load and CPU; scans and errors summed; the rounds' loads listed."""
    groups: dict[tuple[str, str, str, int], list[Row]] = {}
    for s in samples:
        groups.setdefault(_key(s), []).append(s)
    case_order = {c: i for i, c in enumerate(cases)}
    # Consistencies in the order first measured (not_bounded before request_plus), as the
    # one-after-the-other layout had them: case, then consistency, then clients.
    seen: dict[str, int] = {}
    for s in samples:
        seen.setdefault(s["consistency"], len(seen))
    ordered = sorted(
        groups.items(),
        key=lambda kv: (
            SYSTEM_ORDER.get(kv[0][0], len(SYSTEM_ORDER)),
            case_order.get(kv[0][1], len(case_order)),
            seen[kv[0][2]],
            kv[0][3],
        ),
    )
    rows: list[Row] = []
    for (system, case, consistency, clients), group in ordered:
        group.sort(key=lambda s: s["round"])
        row: Row = {
            "system": system,
            "case": case,
            "consistency": consistency,
            "clients": clients,
            "rounds": len(group),
            "scans": sum(s["scans"] for s in group),
        }
        for col in ("p50 ms", "p99 ms", "mean ms", "scans/s", "rows/scan"):
            row[col] = _median([s.get(col) for s in group])
        row["errors"] = sum(s["errors"] for s in group)
        row["own cpu %"] = _median([s.get("own cpu %") for s in group])
        row["peer cpu %"] = _median([s.get("peer cpu %") for s in group])
        row["load_1m"] = _median([s.get("load_1m") for s in group])
        row["load per round"] = " ".join(_load_text(s.get("load_1m")) for s in group)
        first_error = next((s["first error"] for s in group if "first error" in s), None)
        if first_error is not None:
            row["first error"] = first_error
        rows.append(row)
    return rows


def _load_text(load: float | None) -> str:
    return "-" if load is None else f"{load:.1f}"


def _per_round(samples: Sequence[Row], col: str) -> dict[tuple[str, str, str, int], dict[int, Any]]:
    """Per arm and slot: ``col`` by round."""
    out: dict[tuple[str, str, str, int], dict[int, Any]] = {}
    for s in samples:
        out.setdefault(_key(s), {})[s["round"]] = s.get(col)
    return out


def round_ratios(samples: Sequence[Row], shardex: Row, col: str) -> list[float | None]:
    """Per round: the shardex arm's ``col`` over PostgreSQL's in the same round and slot."""
    pg_key = (POSTGRESQL, shardex["case"], PG_LABEL, shardex["clients"])
    by_round = _per_round(samples, col)
    sx = by_round.get(_key(shardex), {})
    pg = by_round.get(pg_key, {})
    return [ratio(sx[r], pg.get(r)) for r in sorted(sx)]


def _span(values: Sequence[float | None]) -> tuple[float | None, float | None]:
    present = [v for v in values if v is not None]
    return (min(present), max(present)) if present else (None, None)


def scan_ratios(rows: Sequence[Row], samples: Sequence[Row] = ()) -> list[Row]:
    """For every shardex row, its PostgreSQL twin (same case and clients): the ratios of the
    medians of p50, p99 and scans/s, the gap to the p50 target, and - given the per-round
    ``samples`` - the min and max of the per-round p50 and scans/s ratios."""
    pg = {(r["case"], r["clients"]): r for r in rows if r["system"] == POSTGRESQL}
    out: list[Row] = []
    for r in rows:
        if r["system"] != SHARDEX:
            continue
        p = pg.get((r["case"], r["clients"]))
        if p is None:
            continue
        p50 = ratio(r["p50 ms"], p["p50 ms"])
        row: Row = {
            "case": r["case"],
            "consistency": r["consistency"],
            "clients": r["clients"],
            "p50 x": p50,
        }
        if samples:
            p50_rounds = round_ratios(samples, r, "p50 ms")
            rate_rounds = round_ratios(samples, r, "scans/s")
            row["p50 x min"], row["p50 x max"] = _span(p50_rounds)
        row["p99 x"] = ratio(r["p99 ms"], p["p99 ms"])
        row["scans/s x"] = ratio(r["scans/s"], p["scans/s"])
        if samples:
            row["scans/s x min"], row["scans/s x max"] = _span(rate_rounds)
        row["p50 target"] = f"<= {P50_TARGET}"
        row["gap x"] = None if p50 is None else round(p50 / P50_TARGET, 2)
        row["load_1m"] = r["load_1m"]
        out.append(row)
    return out


def sample_row(step: Step, summary: dict[str, Any], load: float | None) -> Row:
    """One measurement's row: the step, the client summary and the load before it."""
    return {
        "round": step.round,
        "system": step.arm.system,
        "case": step.case,
        "consistency": step.arm.label,
        "clients": step.clients,
        **summary,
        "load_1m": load,
    }
