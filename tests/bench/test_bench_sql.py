"""The pure parts of ``bench.sql``: query parameters that return the rows they promise
(checked by brute force over the documents), the exact GROUP BY answer, how answers of the
two systems are put side by side and compared, and the ratio tables; and a slow smoke test
that runs ``python -m bench.sql --quick`` end to end."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from bench.sql.clients import Measure
from bench.sql.queries import (
    CASES,
    COLUMNS,
    COVERING,
    GROUP,
    PG_JSONB,
    PG_SQL,
    POINT_EMAIL,
    POINT_KEY,
    RANGE,
    RANGE_LIMIT,
    SX_SQL,
    DocStats,
    build_queries,
    canonical,
    differences,
    expected_group_rows,
    large_range_query,
    latency_ratios,
    shardex_rows,
    speedups,
)

from shardex.demo.datagen import users

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def docs() -> list[dict[str, Any]]:
    return list(users(5000, 13))


def matching(docs: list[dict[str, Any]], case: str, params: tuple[Any, ...]) -> list[dict]:
    """The documents a case's WHERE clause selects, evaluated here in plain Python."""
    if case == POINT_KEY:
        return [d for d in docs if d["id"] == params[0]]
    if case == POINT_EMAIL:
        return [d for d in docs if d["email"] == params[0]]
    city, lo = params[0], params[1]
    hi = params[2] if case == COVERING else None
    return [
        d
        for d in docs
        if d["address"]["city"] == city and d["age"] >= lo and (hi is None or d["age"] <= hi)
    ]


def test_every_query_returns_the_rows_it_promises(docs: list[dict[str, Any]]) -> None:
    queries = build_queries(DocStats.of(docs), k=12)
    for case in (POINT_KEY, POINT_EMAIL, RANGE, COVERING):
        assert len(queries[case]) == 12, case
        for q in queries[case]:
            n = len(matching(docs, case, q.params))
            want = min(n, RANGE_LIMIT) if case == RANGE else n
            assert want == q.expected_rows, (case, q.params)
            if case == RANGE:
                assert n >= RANGE_LIMIT  # LIMIT 20 returns exactly 20
            if case in (POINT_KEY, POINT_EMAIL):
                assert n == 1  # emails chosen are held by one user only
    assert len(queries[GROUP]) == 1
    assert queries[GROUP][0].expected_rows == len({d["address"]["city"] for d in docs})


def test_queries_are_deterministic(docs: list[dict[str, Any]]) -> None:
    assert build_queries(DocStats.of(docs)) == build_queries(DocStats.of(docs))


def test_group_answer_is_count_and_mean_age_per_city(docs: list[dict[str, Any]]) -> None:
    rows = expected_group_rows(DocStats.of(docs))
    assert sum(n for _, n, _ in rows) == len(docs)
    london = [d["age"] for d in docs if d["address"]["city"] == "London"]
    (got,) = [r for r in rows if r[0] == "London"]
    assert got == ("London", len(london), pytest.approx(sum(london) / len(london)))


def test_large_range_is_the_largest_city(docs: list[dict[str, Any]]) -> None:
    q = large_range_query(DocStats.of(docs))
    counts = {c: sum(1 for d in docs if d["address"]["city"] == c) for c in {"New York", "Paris"}}
    assert q.params == ("New York", 0)  # the heaviest city of the generator
    assert q.expected_rows == counts["New York"] > counts["Paris"]


def test_statements_and_twins_agree_on_shape() -> None:
    for case in CASES:
        assert PG_SQL[case].count("%s") == len(PG_JSONB[case])
        n_params = sum(1 for i in range(1, 4) if f"${i}" in SX_SQL[case])
        assert n_params == len(PG_JSONB[case]), case
        assert COLUMNS[case]


def test_canonical_rows_compare_across_systems() -> None:
    sx = shardex_rows(COVERING, [{"id": "b", "age": 3}, {"age": 5, "id": "a"}])
    pg = [("a", 5), ("b", 3)]
    assert differences(COVERING, canonical(COVERING, sx), canonical(COVERING, pg)) is None
    # ORDER BY cases keep their order: the same rows in another order differ.
    ranked = [("a", "Ann", 20), ("b", "Bo", 21)]
    assert differences(RANGE, canonical(RANGE, ranked), canonical(RANGE, ranked[::-1]))
    # A field shardex leaves MISSING is None, which a real value is not.
    assert shardex_rows(POINT_KEY, [{"name": "x", "age": 3}]) == [("x", None, 3)]
    assert differences(POINT_KEY, [("x", None, 3)], [("x", "e", 3)]) == (
        "row 0: ('x', None, 3) vs ('x', 'e', 3)"
    )
    assert differences(POINT_KEY, [], [("x", "e", 3)]) == "0 rows vs 1 rows"


def test_group_averages_compare_within_tolerance() -> None:
    from decimal import Decimal

    sx = canonical(GROUP, [("Paris", 3, 40.333333333333336)])
    pg = canonical(GROUP, [("Paris", 3, Decimal("40.3333333333333333"))])
    assert differences(GROUP, sx, pg) is None
    assert differences(GROUP, sx, canonical(GROUP, [("Paris", 3, 40.34)]))
    assert differences(GROUP, sx, canonical(GROUP, [("Paris", 4, 40.333333333333336)]))


def row(system: str, case: str, clients: int, p50: float, qps: float, variant: str) -> dict:
    return {
        "system": system,
        "case": case,
        "variant": variant,
        "clients": clients,
        "p50 ms": p50,
        "p99 ms": p50 * 2,
        "q/s": qps,
        "load_1m": 1.0,
    }


def test_latency_ratios_pair_each_shardex_row_with_its_twin() -> None:
    rows = [
        row("postgresql", RANGE, 1, 2.0, 500.0, "-"),
        row("shardex", RANGE, 1, 5.0, 200.0, "current"),
        row("shardex", RANGE, 1, 9.0, 100.0, "baseline"),
        row("shardex", RANGE, 4, 9.0, 100.0, "current"),  # no twin: left out
    ]
    out = latency_ratios(rows)
    assert [(r["variant"], r["p50 x"], r["p99 x"], r["q/s x"]) for r in out] == [
        ("current", 2.5, 2.5, 0.4),
        ("baseline", 4.5, 4.5, 0.2),
    ]


def test_speedups_compare_variants_of_the_same_run() -> None:
    rows = [
        row("shardex", GROUP, 4, 300.0, 3.0, "baseline"),
        row("shardex", GROUP, 4, 100.0, 9.0, "current"),
        row("postgresql", GROUP, 4, 50.0, 20.0, "-"),
    ]
    (out,) = speedups(rows, "baseline", "current")
    assert (out["p50 speedup"], out["q/s speedup"]) == (3.0, 3.0)
    assert (out["baseline p50 ms"], out["current p50 ms"]) == (300.0, 100.0)


def test_measure_summary_rates_over_the_time_clients_ran() -> None:
    m = Measure(latencies=[0.010, 0.020, 0.030, 0.040], rows=8, seconds=2.0, errors=["x"])
    s = m.summary()
    assert (s["queries"], s["p50 ms"], s["p99 ms"], s["q/s"]) == (4, 20.0, 40.0, 2.0)
    assert (s["rows/query"], s["errors"]) == (2.0, 1)


@pytest.mark.slow
@pytest.mark.timeout(3600)
def test_quick_run_end_to_end(tmp_path: Path) -> None:
    """``python -m bench.sql --quick``: both systems up and down, answers checked equal,
    every case measured, exchanges within their window."""
    out = tmp_path / "sql.json"
    env = {**os.environ, "PYTHONPATH": f"{REPO}:{REPO / 'src'}"}
    proc = subprocess.run(
        [sys.executable, "-m", "bench.sql", "--quick", "--seconds", "1", "--json", str(out)],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=3500,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    doc = json.loads(out.read_text())
    mix = doc["tables"]["SQL query mix"]
    assert {(r["system"], r["case"]) for r in mix} == {
        (s, c) for s in ("postgresql", "shardex") for c in CASES
    }
    assert all(r["errors"] == 0 and r["queries"] > 0 for r in mix)
    exchanges = doc["tables"]["bytes in flight per exchange vs the credit window"]
    assert exchanges and all(0 < r["max in flight / window"] <= 1 for r in exchanges)
    assert doc["shardex"]["explain"][RANGE]["index_order"] is True
