"""The pure parts of ``bench.scan``: the span choice that yields ~100 / exactly 100 rows
(checked by brute force over the documents), the latency summary and the ratio tables; and
a slow smoke test that runs ``python -m bench.scan --quick`` end to end."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from bench.scan.clients import Measure
from bench.scan.queries import (
    LIMIT,
    LIMIT_ONE_SLICE,
    PG_SETTINGS,
    PG_SQL,
    RANGE,
    KeyStats,
    build_queries,
    email_starts,
    limit_starts,
    natural_ranges,
    ratio,
)
from bench.scan.run import large_ratios, scan_ratios

from shardex.demo.datagen import users

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def docs() -> list[dict[str, Any]]:
    return list(users(6000, 11))


def count_range(docs: list[dict[str, Any]], city: str, lo: int, hi: int | None) -> int:
    return sum(
        1
        for d in docs
        if d["address"]["city"] == city and d["age"] >= lo and (hi is None or d["age"] <= hi)
    )


def test_natural_ranges_hold_exactly_the_counted_rows_closest_first(
    docs: list[dict[str, Any]],
) -> None:
    stats = KeyStats.of(docs)
    ranges = natural_ranges(stats.city_age, target=100, k=20)
    assert len(ranges) == 20
    for city, lo, hi, n in ranges:
        assert lo <= hi
        assert count_range(docs, city, lo, hi) == n
    misses = [abs(n - 100) for *_, n in ranges]
    assert misses == sorted(misses)
    assert misses[0] <= 2  # 6000 documents over 16 cities: a window lands next to 100


def test_natural_ranges_pick_the_window_nearest_the_target() -> None:
    counts = Counter({("a", 1): 60, ("a", 2): 30, ("a", 3): 50, ("b", 5): 100})
    got = natural_ranges(counts, target=100, k=10)
    assert got[0] == ("b", 5, 5, 100)
    # From age 1: 60+30 = 90 (10 short) beats 60+30+50 = 140 (40 over).
    assert ("a", 1, 2, 90) in got
    # From age 3 the city runs out at 50 rows: still a candidate, ranked last.
    assert got[-1] == ("a", 3, 3, 50)


def test_limit_starts_leave_at_least_the_limit(docs: list[dict[str, Any]]) -> None:
    stats = KeyStats.of(docs)
    starts = limit_starts(stats.city_age, limit=100, k=25)
    assert len(starts) == 25 and starts == sorted(set(starts))
    for city, lo in starts:
        assert count_range(docs, city, lo, None) >= 100
    tiny = Counter({("x", 1): 99})
    assert limit_starts(tiny, limit=100) == []


def test_email_starts_leave_at_least_the_limit_duplicates_included() -> None:
    emails = sorted(["a"] * 3 + [f"m{i:03d}" for i in range(120)] + ["z"] * 5)
    starts = email_starts(emails, limit=100, k=40)
    assert starts
    for e in starts:
        assert sum(1 for x in emails if x >= e) >= 100
    assert email_starts(emails[:99], limit=100) == []


def test_build_queries_spans_limits_and_postgres_parameters(docs: list[dict[str, Any]]) -> None:
    stats = KeyStats.of(docs)
    q = build_queries(stats, k=8)
    assert {len(v) for v in q.values()} == {8}
    r = q[RANGE][0]
    city, lo, hi = r.pg_params
    assert r.spans == [{"low": [city, lo], "high": [city, hi], "inclusion": "both"}]
    assert r.limit is None and r.expected_rows == count_range(docs, city, lo, hi)
    lim = q[LIMIT][0]
    assert lim.limit == 100 and lim.expected_rows == 100
    assert lim.spans == [
        {"low": list(lim.pg_params), "high": [lim.pg_params[0]], "inclusion": "both"}
    ]
    one = q[LIMIT_ONE_SLICE][0]
    assert one.index == "by_email" and one.spans == [{"low": [one.pg_params[0]]}]
    assert set(PG_SQL) == set(PG_SETTINGS) == set(q)  # every case has its twin and settings
    active = sum(1 for d in docs if d["status"] == "active")
    assert len(stats.active_emails) == active


def test_measure_summary_percentiles_and_rate() -> None:
    m = Measure([0.001 * k for k in range(1, 101)], rows=10_000, seconds=2.0, errors=["x"])
    s = m.summary()
    assert s["scans"] == 100 and s["p50 ms"] == 50.0 and s["p99 ms"] == 99.0
    assert s["scans/s"] == 50.0 and s["rows/scan"] == 100.0 and s["errors"] == 1
    empty = Measure([], 0, 1.0, []).summary()
    assert empty["scans"] == 0 and empty["p50 ms"] is None


def test_ratio_tables_pair_shardex_with_its_postgres_twin() -> None:
    rows = [
        {"system": "postgresql", "case": RANGE, "consistency": "read committed", "clients": 4,
         "p50 ms": 2.0, "p99 ms": 5.0, "scans/s": 400.0, "load_1m": 1.0},
        {"system": "shardex", "case": RANGE, "consistency": "request_plus", "clients": 4,
         "p50 ms": 6.0, "p99 ms": 10.0, "scans/s": 100.0, "load_1m": 2.0},
        {"system": "shardex", "case": RANGE, "consistency": "not_bounded", "clients": 16,
         "p50 ms": 1.0, "p99 ms": 1.0, "scans/s": 1.0, "load_1m": 2.0},
    ]  # fmt: skip
    out = scan_ratios(rows)
    assert len(out) == 1  # no PostgreSQL row at 16 clients: no ratio
    assert out[0]["p50 x"] == 3.0 and out[0]["p99 x"] == 2.0 and out[0]["scans/s x"] == 0.25
    assert out[0]["gap x"] == 1.5 and out[0]["consistency"] == "request_plus"
    large = [
        {"system": "postgresql", "case": "full by_city_age, index order", "rows/s": 100_000},
        {"system": "rocksdb raw", "case": "full by_city_age, keys", "rows/s": 1_000_000,
         "cpu us/row client": 0.25},
        {"system": "rocksdb raw", "case": "full by_email, keys", "rows/s": 500_000},
        {"system": "shardex", "case": "full by_city_age, ordered, rows", "rows/s": 50_000,
         "load_1m": 1.0, "cpu us/row server": 0.75, "cpu us/row client": 0.5},
        {"system": "shardex", "case": "full by_email, ordered, rows", "rows/s": 50_000,
         "load_1m": 1.0},
    ]  # fmt: skip
    lr = large_ratios(large)
    assert lr[0]["/ postgresql"] == 0.5 and lr[0]["/ raw rocksdb"] == 0.05
    assert lr[0]["cpu us/row"] == 1.25 and lr[0]["cpu: raw rocksdb /"] == 0.2
    assert lr[1]["/ postgresql"] is None and lr[1]["/ raw rocksdb"] == 0.1
    assert lr[1]["cpu us/row"] is None and lr[1]["cpu: raw rocksdb /"] is None
    assert ratio(None, 1.0) is None and ratio(1.0, 0) is None


@pytest.mark.slow
@pytest.mark.timeout(1800)
def test_quick_run_end_to_end(tmp_path: Path) -> None:
    """``python -m bench.scan --quick``, fewer documents, shorter measurements, 2 rounds:
    every table is there, both systems answered every case in every round without errors,
    each measurement with its load and both systems' server CPU."""
    out = tmp_path / "scan.json"
    env = {**os.environ, "PYTHONPATH": f"{REPO}:{REPO / 'src'}"}
    cmd = [sys.executable, "-m", "bench.scan", "--quick", "--docs", "6000", "--seconds", "1"]
    cmd += ["--rounds", "2"]
    proc = subprocess.run(
        [*cmd, "--json", str(out)], cwd=REPO, env=env, capture_output=True, text=True
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    doc = json.loads(out.read_text())
    scans = doc["tables"]["100-row scans"]
    assert len(scans) == 3 * 3 + 3 * 2 * 3  # PostgreSQL: 3 cases x 3; shardex x 2 consistencies
    assert all(r["errors"] == 0 and r["scans"] > 0 and r["rounds"] == 2 for r in scans)
    ratios = doc["tables"]["ratios shardex / PostgreSQL (100-row scans)"]
    assert len(ratios) == 18
    # a_i <= c * b_i in every round implies median(a) <= c * median(b): the ratio of
    # medians lies within the per-round ratios (give or take their rounding).
    assert all(r["p50 x min"] - 0.02 <= r["p50 x"] <= r["p50 x max"] + 0.02 for r in ratios)
    every = doc["tables"]["100-row scans, every measurement"]
    assert len(every) == 2 * (3 * 3 + 3 * 2 * 3)
    assert {r["round"] for r in every} == {0, 1}
    assert all(r["load_1m"] is not None and r["own cpu %"] > 0 for r in every)
    assert all(r["peer cpu %"] is not None for r in every)
    systems = {r["system"] for r in doc["tables"]["large scans"]}
    assert systems == {"postgresql", "shardex", "rocksdb raw"}
    # CPU per row of every large scan: each node's and the client's for shardex
    for r in doc["tables"]["large scans"]:
        assert r["cpu us/row client"] >= 0, r
        if r["system"] == "shardex":
            assert len(r["cpu us/row by process"]) == 3 and r["cpu us/row server"] > 0, r
