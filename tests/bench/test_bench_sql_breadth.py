"""The pure parts of ``bench.sql_breadth``: deterministic customers and orders whose
``order_ids`` hold each order once; every case's queries return the rows they promise on
the reference engine (``LocalEngine``, the hash join's inputs too) and the window case's by
brute force; PostgreSQL's parameters and statements line up with shardex's; answers
compared as multisets or in order; a refused case named "not supported by this build"; and
a slow smoke test that runs ``python -m bench.sql_breadth --quick`` end to end."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections import Counter
from decimal import Decimal
from pathlib import Path

import pytest
from bench.sql.queries import differences, shardex_rows
from bench.sql_breadth.data import CUSTOMERS_PER_REGION, Stats, generate, make_orders
from bench.sql_breadth.phases import (
    AT_INITIATOR,
    CHECKED,
    UNSUPPORTED,
    ab_summary,
    case_status,
    skipped_rows,
)
from bench.sql_breadth.queries import (
    ANY,
    CASES,
    COLUMNS,
    HASH_JOIN,
    NL_JOIN,
    PG_SQL,
    SIDE_SQL,
    SUBQUERY,
    SX_SQL,
    UNNEST,
    WINDOW,
    build_queries,
    canonical,
    pg_args,
    side_queries,
)
from bench.sql_breadth.run import parse_args

from shardex.sql.local import LocalEngine

REPO = Path(__file__).resolve().parents[2]
N_ORDERS, N_CUSTOMERS, SEED = 3000, 300, 11


@pytest.fixture(scope="module")
def data(tmp_path_factory: pytest.TempPathFactory) -> tuple[Stats, dict[str, list[dict]]]:
    work = tmp_path_factory.mktemp("breadth")
    stats, files, sizes = generate(work, N_ORDERS, N_CUSTOMERS, SEED, 2)
    docs = {
        ks: [json.loads(line) for p in paths for line in p.read_text().splitlines()]
        for ks, paths in files.items()
    }
    assert all(sizes[ks] == sum(p.stat().st_size for p in files[ks]) for ks in files)
    return stats, docs


@pytest.fixture(scope="module")
def engine(data: tuple[Stats, dict[str, list[dict]]]) -> LocalEngine:
    eng = LocalEngine()
    for ks, docs in data[1].items():
        eng.create_keyspace(ks)
        eng.keyspace(ks).update({d["id"]: d for d in docs})
    return eng


def test_documents_are_deterministic_and_customers_list_their_orders(
    data: tuple[Stats, dict[str, list[dict]]],
) -> None:
    stats, docs = data
    assert list(make_orders(50, 10, SEED)) == list(make_orders(50, 10, SEED))
    assert (len(docs["orders"]), len(docs["customers"])) == (N_ORDERS, N_CUSTOMERS)
    listed = Counter(o for c in docs["customers"] for o in c["order_ids"])
    assert listed == Counter(o["id"] for o in docs["orders"])  # each order once
    owner = {o: c["id"] for c in docs["customers"] for o in c["order_ids"]}
    assert all(owner[o["id"]] == o["customer_id"] for o in docs["orders"])
    assert all(o["total"] == sum(x["qty"] * x["price"] for x in o["lines"]) for o in docs["orders"])
    per_region = Counter(stats.region_of.values())
    assert len(per_region) == N_CUSTOMERS // CUSTOMERS_PER_REGION


@pytest.mark.parametrize("case", [c for c in CASES if c != WINDOW])
def test_queries_return_the_rows_they_promise_on_the_reference_engine(
    data: tuple[Stats, dict[str, list[dict]]], engine: LocalEngine, case: str
) -> None:
    queries = build_queries(data[0], k=3)[case]
    assert queries
    for q in queries:
        rows = engine.query(SX_SQL[case], list(q.params))
        assert len(rows) == q.expected_rows > 0, (case, q.params)
        got = shardex_rows(case, rows, COLUMNS)
        assert all(None not in r for r in got)  # every column named by the statement


def test_window_rows_by_brute_force(data: tuple[Stats, dict[str, list[dict]]]) -> None:
    stats, docs = data
    for q in build_queries(stats, k=4)[WINDOW]:
        status, lo, hi = q.params
        n = sum(1 for o in docs["orders"] if o["status"] == status and lo <= o["date"] <= hi)
        assert n == q.expected_rows > 0


def test_hash_join_inputs_as_statements_of_their_own(
    data: tuple[Stats, dict[str, list[dict]]], engine: LocalEngine
) -> None:
    for q in side_queries(data[0]):
        assert len(engine.query(SIDE_SQL[q.case], list(q.params))) == q.expected_rows > 0


def test_postgresql_twins_take_the_parameters_they_name() -> None:
    assert set(SX_SQL) == set(PG_SQL) == set(COLUMNS) == set(CASES)
    params = {
        NL_JOIN: ("r1",), HASH_JOIN: ("paid", "2025-01-01"), UNNEST: ("s1",), ANY: ("s1",),
        SUBQUERY: ("r1", "paid"), WINDOW: ("paid", "2025-01-01", "2025-01-31"),
    }  # fmt: skip
    for case in CASES:
        args = pg_args(case, params.get(case, ("r1",)))
        assert PG_SQL[case].count("%s") == len(args), case
    assert pg_args(UNNEST, ("s1",)) == [([{"sku": "s1"}], True), ("s1", False)]
    assert pg_args(SUBQUERY, ("r1", "paid")) == [("paid", True), ("r1", True)]
    with pytest.raises(ValueError, match="nope"):
        pg_args("nope", ())


def test_answers_compare_as_multisets_unless_ordered() -> None:
    a = canonical(NL_JOIN, [("c1", "o2", 5.0), ("c1", "o1", Decimal(3))])
    b = canonical(NL_JOIN, [("c1", "o1", 3), ("c1", "o2", 5)])
    assert a == b and differences(NL_JOIN, a, b) is None
    x = canonical(HASH_JOIN, [("r2", 1, 10), ("r1", 2, 20)])
    y = canonical(HASH_JOIN, [("r1", 2, 20), ("r2", 1, 10)])
    assert differences(HASH_JOIN, x, y) == "row 0: ('r2', 1, 10) vs ('r1', 2, 20)"
    assert canonical(UNNEST, [("o1", 1, 2.5)]) == [("o1", 1, 2.5)]


def test_a_refused_case_says_why() -> None:
    assert case_status("SQL_SYNTAX", "unknown function 'ROW_NUMBER'").startswith(UNSUPPORTED)
    assert (
        case_status("QUERY_MEMORY_LIMIT", "over budget") == "error QUERY_MEMORY_LIMIT: over budget"
    )
    status = {NL_JOIN: CHECKED, WINDOW: f"{UNSUPPORTED} (x)"}
    assert skipped_rows(status) == [{"case": WINDOW, "note": f"{UNSUPPORTED} (x)"}]


def test_quick_plan_scales_orders_and_customers() -> None:
    plan, path = parse_args(["--quick"])
    assert (plan.docs, plan.customers, path.name) == (50_000, 5_000, "sql_breadth-quick.json")
    assert parse_args([])[0].customers == 100_000


@pytest.mark.slow
@pytest.mark.timeout(3600)
def test_quick_run_end_to_end(tmp_path: Path) -> None:
    """``python -m bench.sql_breadth --quick``: every case answered by PostgreSQL, each
    shardex case checked or refused with its reason, the checked ones measured."""
    out = tmp_path / "breadth.json"
    env = {**os.environ, "PYTHONPATH": f"{REPO}:{REPO / 'src'}"}
    cmd = [sys.executable, "-m", "bench.sql_breadth", "--quick", "--seconds", "1"]
    proc = subprocess.run(
        [*cmd, "--json", str(out)], cwd=REPO, env=env, capture_output=True, text=True,
        timeout=3500,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-4000:]
    tables = json.loads(out.read_text())["tables"]
    status = {r["case"]: r["status"] for r in tables["cases on shardex"]}
    assert set(status) == set(CASES)
    measured = {(r["system"], r["case"]) for r in tables["SQL++ breadth"]}
    assert {c for s, c in measured if s == "postgresql"} == set(CASES)
    assert {c for s, c in measured if s == "shardex"} == {c for c in CASES if status[c] == CHECKED}
    exchanges = tables["bytes in flight per exchange vs the credit window"]
    streamed = [r for r in exchanges if r["streams"]]
    assert streamed and all(0 < r["max in flight / window"] <= 1 for r in streamed)


def test_the_hash_join_ab_summary_takes_medians_per_arm() -> None:
    def row(arm: str, p50: float, cpu: float | None) -> dict:
        return {"variant": arm, "p50 ms": p50, "server CPU ms/query": cpu}

    rows = [
        row(AT_INITIATOR.name, 30.0, 50.0),
        row("current", 12.0, 40.0),
        row(AT_INITIATOR.name, 10.0, 60.0),
        row("current", 6.0, None),  # a window below the CPU counter's resolution
        row(AT_INITIATOR.name, 20.0, 55.0),
        row("current", 9.0, 44.0),
    ]
    initiator, fragments = ab_summary(rows)
    assert initiator["arm"] == AT_INITIATOR.name and initiator["rounds"] == 3
    assert (initiator["median p50 ms"], initiator["median server CPU ms/query"]) == (20.0, 55.0)
    assert (fragments["median p50 ms"], fragments["p50 / initiator"]) == (9.0, 0.45)
    assert (fragments["median server CPU ms/query"], fragments["CPU / initiator"]) == (42.0, 0.764)
