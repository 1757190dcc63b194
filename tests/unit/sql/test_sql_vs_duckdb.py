"""The SQL correctness suite on ``LocalEngine``: generated documents and queries, every
result compared with DuckDB's under the translation rules of ``tests/sql_reference``.
The same suite runs through ``c.query`` on a cluster in tests/spark/test_sql_surfaces.py."""

from __future__ import annotations

import re
from collections import Counter
from typing import Any

import pytest

from shardex.dbapi.local import LocalQueryClient
from tests.sql_reference.compare import compare, duck_connection, queries, run_suite
from tests.sql_reference.ctes import with_generators, with_query
from tests.sql_reference.documents import make_documents
from tests.sql_reference.generator import QueryGen
from tests.sql_reference.join_queries import (
    INDEXES,
    LEFT,
    RIGHT,
    join_connection,
    join_queries,
    make_join_documents,
)
from tests.sql_reference.setops import set_op_query
from tests.sql_reference.windows import window_query

N_DOCS = 200
N_QUERIES = 250

# Each feature the suite must exercise, as a pattern over the SQL++ text, with the least
# number of generated queries that must use it.
FEATURES = {
    "AND": (r"\bAND\b", 40),
    "OR": (r"\bOR\b", 30),
    "NOT": (r"\(NOT ", 10),
    "IN": (r"\bIN \[", 10),
    "NOT IN": (r"NOT IN \[", 2),
    "BETWEEN": (r"\bBETWEEN\b", 10),
    "LIKE": (r"\bLIKE\b", 10),
    "IS NULL": (r"IS (NOT )?NULL", 5),
    "IS MISSING": (r"IS (NOT )?MISSING", 5),
    "arithmetic": (r"[*%/]", 40),
    "ORDER BY": (r"ORDER BY", 60),
    "DESC": (r"\bDESC\b", 20),
    "NULLS FIRST": (r"NULLS FIRST", 10),
    "NULLS LAST": (r"NULLS LAST", 10),
    "LIMIT": (r"\bLIMIT\b", 30),
    "OFFSET": (r"\bOFFSET\b", 15),
    "GROUP BY": (r"GROUP BY", 30),
    "HAVING": (r"HAVING", 8),
    "COUNT(*)": (r"COUNT\(\*\)", 20),
    "COUNT(DISTINCT)": (r"COUNT\(DISTINCT", 5),
    "SUM": (r"\bSUM\(", 10),
    "AVG": (r"\bAVG\(", 10),
    "MIN": (r"\bMIN\(", 10),
    "MAX": (r"\bMAX\(", 5),
    "DISTINCT": (r"SELECT DISTINCT", 8),
    "RAW": (r"SELECT RAW", 5),
}


@pytest.fixture(scope="module")
def client() -> LocalQueryClient:
    c = LocalQueryClient()
    c.engine.create_keyspace("docs")
    c.engine.keyspaces["docs"].update(make_documents(1, N_DOCS))
    return c


def test_generated_queries_cover_the_language() -> None:
    qs = queries(2, N_QUERIES, "docs")
    counts = Counter(
        name for q in qs for name, (pat, _) in FEATURES.items() if re.search(pat, q.sqlpp)
    )
    short = {n: counts[n] for n, (_, least) in FEATURES.items() if counts[n] < least}
    assert not short, f"too few queries use {short}"
    assert sum(q.ordered for q in qs) >= 60


def test_local_engine_matches_duckdb(client: LocalQueryClient) -> None:
    qs, mismatches = run_suite(
        lambda sql: client.query(sql), keyspace="docs", n_docs=N_DOCS, n_queries=N_QUERIES
    )
    assert len(qs) == N_QUERIES
    assert not mismatches, "\n\n".join(map(str, mismatches[:10]))


def test_results_are_not_trivial(client: LocalQueryClient) -> None:
    """Most queries return rows, so agreement means something."""
    qs = queries(2, 80, "docs")
    nonempty = sum(1 for q in qs if list(client.query(q.sqlpp)))
    assert nonempty >= 55


def test_the_comparison_catches_wrong_answers(client: LocalQueryClient) -> None:
    docs = make_documents(1, N_DOCS)
    con = duck_connection(docs)
    qs = queries(2, 60, "docs")
    ordered = next(q for q in qs if q.ordered and "LIMIT 0" not in q.sqlpp)
    unordered = next(q for q in qs if not q.ordered and not q.raw)

    def drop_last(sql: str) -> list[Any]:
        return list(client.query(sql))[:-1]

    def swap(sql: str) -> list[Any]:
        rows = list(client.query(sql))
        return rows[1:] + rows[:1] if len(rows) > 1 else rows

    def null_for_missing(sql: str) -> list[Any]:
        return [{c: r.get(c) for c in unordered.columns} for r in client.query(sql)]

    assert compare(lambda s: client.query(s), con, ordered) is None
    assert compare(drop_last, con, unordered) is not None
    assert compare(swap, con, ordered) is not None or len(list(client.query(ordered.sqlpp))) < 2
    # A document edited on one side only is found.
    changed = LocalQueryClient()
    changed.engine.create_keyspace("docs")
    changed.engine.keyspaces["docs"].update(docs)
    next(iter(changed.engine.keyspaces["docs"].values()))["a"] = 10**6
    diffs = [compare(lambda s: changed.query(s), con, q) for q in qs]
    assert any(d is not None for d in diffs)
    # Reading MISSING as NULL is the rule, so an engine doing that agrees.
    assert compare(null_for_missing, con, unordered) is None
    con.close()


N_SET_OPS = 200
SET_OP_FEATURES = {
    "UNION": (r"UNION SELECT", 15),
    "UNION ALL": (r"UNION ALL", 15),
    "INTERSECT": (r"INTERSECT SELECT", 15),
    "INTERSECT ALL": (r"INTERSECT ALL", 15),
    "EXCEPT": (r"EXCEPT SELECT", 15),
    "EXCEPT ALL": (r"EXCEPT ALL", 15),
    "chained": (r"(UNION|INTERSECT|EXCEPT).*(UNION|INTERSECT|EXCEPT)", 20),
    "LIMIT": (r"\bLIMIT\b", 30),
}


def test_set_operations_match_duckdb(client: LocalQueryClient) -> None:
    con = duck_connection(make_documents(1, N_DOCS))
    gen = QueryGen(7, "docs", "docs")
    qs = [set_op_query(gen) for _ in range(N_SET_OPS)]
    counts = Counter(
        name for q in qs for name, (pat, _) in SET_OP_FEATURES.items() if re.search(pat, q.sqlpp)
    )
    short = {n: counts[n] for n, (_, least) in SET_OP_FEATURES.items() if counts[n] < least}
    assert not short, f"too few queries use {short}"
    assert sum(q.ordered for q in qs) >= 60
    mismatches = [m for q in qs if (m := compare(lambda s: client.query(s), con, q)) is not None]
    assert not mismatches, "\n\n".join(map(str, mismatches[:10]))
    # Most results have rows, so agreement means something.
    assert sum(1 for q in qs if list(client.query(q.sqlpp))) >= N_SET_OPS * 0.6
    con.close()


N_WITH = 120


def test_with_statements_match_duckdb(client: LocalQueryClient) -> None:
    con = duck_connection(make_documents(1, N_DOCS))
    gen, over = with_generators(11, "docs", "docs")
    qs = [with_query(gen, over) for _ in range(N_WITH)]
    assert sum(bool(re.search(r"\b(UNION|INTERSECT|EXCEPT)\b", q.sqlpp)) for q in qs) >= 25
    assert sum("GROUP BY" in q.sqlpp for q in qs) >= 10
    mismatches = [m for q in qs if (m := compare(lambda s: client.query(s), con, q)) is not None]
    assert not mismatches, "\n\n".join(map(str, mismatches[:10]))
    assert sum(1 for q in qs if list(client.query(q.sqlpp))) >= N_WITH * 0.6
    con.close()


N_WINDOWS = 150
WINDOW_FEATURES = {
    name: (pat, least)
    for name, pat, least in [
        ("ROW_NUMBER", r"ROW_NUMBER\(", 5),
        ("RANK", r"\bRANK\(", 3),
        ("DENSE_RANK", r"DENSE_RANK\(", 5),
        ("PERCENT_RANK", r"PERCENT_RANK\(", 5),
        ("CUME_DIST", r"CUME_DIST\(", 5),
        ("NTILE", r"NTILE\(", 5),
        ("LAG/LEAD", r"\b(LAG|LEAD)\(", 10),
        ("FIRST/LAST/NTH_VALUE", r"(FIRST|LAST|NTH)_VALUE\(", 10),
        ("aggregate", r"\b(SUM|AVG|MIN|MAX|COUNT)\(", 30),
        ("PARTITION BY", r"PARTITION BY", 40),
        ("ROWS frame", r"ROWS BETWEEN", 10),
        ("GROUPS frame", r"GROUPS BETWEEN", 10),
        ("RANGE frame", r"RANGE BETWEEN", 5),
        ("EXCLUDE", r"EXCLUDE", 5),
        ("IGNORE NULLS", r"IGNORE NULLS", 5),
    ]
}


def test_window_functions_match_duckdb(client: LocalQueryClient) -> None:
    con = duck_connection(make_documents(1, N_DOCS))
    gen = QueryGen(13, "docs", "docs")
    qs = [window_query(gen) for _ in range(N_WINDOWS)]
    counts = Counter(
        name for q in qs for name, (pat, _) in WINDOW_FEATURES.items() if re.search(pat, q.sqlpp)
    )
    short = {n: counts[n] for n, (_, least) in WINDOW_FEATURES.items() if counts[n] < least}
    assert not short, f"too few queries use {short}"
    mismatches = [m for q in qs if (m := compare(lambda s: client.query(s), con, q)) is not None]
    assert not mismatches, "\n\n".join(map(str, mismatches[:10]))
    con.close()


def test_the_set_op_comparison_catches_wrong_semantics(
    client: LocalQueryClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    """SQL's bag rule for EXCEPT ALL (or a UNION keeping duplicates) is found out."""
    import shardex.sql.operators.setops as setops

    con = duck_connection(make_documents(1, N_DOCS))
    gen = QueryGen(7, "docs", "docs")
    qs = [set_op_query(gen) for _ in range(80)]
    right = setops.set_operation

    def keeps_duplicates(op: str, all_: bool, left: Any, other: Any, **kw: Any) -> Any:
        return right(op, True, left, other, **kw)

    monkeypatch.setattr(setops, "set_operation", keeps_duplicates)
    assert any(compare(lambda s: client.query(s), con, q) is not None for q in qs)
    con.close()


@pytest.mark.slow
@pytest.mark.parametrize("seed", [3, 4, 5])
def test_local_engine_matches_duckdb_more_seeds(seed: int) -> None:
    c = LocalQueryClient()
    c.engine.create_keyspace("docs")
    c.engine.keyspaces["docs"].update(make_documents(seed, 400))
    _, mismatches = run_suite(
        lambda sql: c.query(sql),
        keyspace="docs",
        docs_seed=seed,
        n_docs=400,
        query_seed=seed * 100,
        n_queries=600,
    )
    assert not mismatches, "\n\n".join(map(str, mismatches[:10]))


# -- joins ------------------------------------------------------------------------------------

N_JOIN_QUERIES = 200
JOIN_FEATURES = {
    "JOIN": (r" JOIN ", 100),
    "LEFT JOIN": (r"LEFT (OUTER )?JOIN", 25),
    "RIGHT JOIN": (r"RIGHT JOIN", 10),
    "ON KEYS": (r"ON KEYS", 20),
    "ON KEY FOR": (r"ON KEY l\.k FOR", 10),
    "NEST": (r" NEST ", 20),
    "LEFT NEST": (r"LEFT NEST", 8),
    "USE HASH": (r"USE HASH", 10),
    "USE NL": (r"USE NL", 5),
    "chained": (r"JOIN .* JOIN ", 5),
    "GROUP BY": (r"GROUP BY", 10),
    "ORDER BY": (r"ORDER BY", 40),
}


def _join_client(indexes: bool) -> tuple[LocalQueryClient, Any]:
    left, right = make_join_documents(1, 150, 120)
    c = LocalQueryClient()
    for name, docs in ((LEFT, left), (RIGHT, right)):
        c.engine.create_keyspace(name)
        c.engine.keyspaces[name].update(docs)
    if indexes:
        for ddl in INDEXES:
            c.engine.execute(ddl)
    return c, join_connection(left, right)


def test_generated_join_queries_cover_the_forms() -> None:
    qs = join_queries(5, N_JOIN_QUERIES)
    counts = Counter(
        name for q in qs for name, (pat, _) in JOIN_FEATURES.items() if re.search(pat, q.sqlpp)
    )
    short = {n: counts[n] for n, (_, least) in JOIN_FEATURES.items() if counts[n] < least}
    assert not short, f"too few queries use {short}"


@pytest.mark.parametrize("indexes", [False, True], ids=["scans", "indexes"])
def test_joins_match_duckdb(indexes: bool) -> None:
    """Half the queries each way: without indexes (hash and nested-loop joins) and with
    indexes on the join keys (index nested loops), every result equal to DuckDB's."""
    c, con = _join_client(indexes)
    qs = join_queries(5 if indexes else 6, N_JOIN_QUERIES // 2)
    mismatches = [m for q in qs if (m := compare(lambda s: c.query(s), con, q)) is not None]
    nonempty = sum(1 for q in qs if c.query(q.sqlpp))
    con.close()
    assert not mismatches, "\n\n".join(map(str, mismatches[:10]))
    assert nonempty >= len(qs) * 0.7  # agreement on empty results would mean little


def test_the_join_comparison_catches_a_wrong_join() -> None:
    """A LEFT JOIN run as an INNER one, or a NEST losing its empty arrays, is caught."""
    c, con = _join_client(False)
    qs = [q for q in join_queries(6, 60) if "LEFT JOIN" in q.sqlpp or "LEFT NEST" in q.sqlpp]

    def as_inner(sql: str) -> Any:
        return c.query(sql.replace("LEFT JOIN", "JOIN").replace("LEFT NEST", "NEST"))

    assert qs and any(compare(as_inner, con, q) is not None for q in qs)
    con.close()


@pytest.mark.slow
@pytest.mark.parametrize("seed", [21, 22, 23])
def test_joins_match_duckdb_more_seeds(seed: int) -> None:
    c, con = _join_client(seed % 2 == 1)
    qs = join_queries(seed, 400)
    mismatches = [m for q in qs if (m := compare(lambda s: c.query(s), con, q)) is not None]
    con.close()
    assert not mismatches, "\n\n".join(map(str, mismatches[:10]))
