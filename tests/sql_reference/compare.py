"""Run generated queries on shardex (anything with ``query(sql)``) and on DuckDB and compare
them result for result: in order when the ORDER BY is total, as multisets otherwise, with
the comparison of the conformance runner (numbers by value, floats within 1e-12)."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from decimal import Decimal
from typing import Any

from shardex.testing.sql_conformance import compare_results
from tests.sql_reference.documents import load_duckdb, make_documents
from tests.sql_reference.generator import QueryGen, RefQuery


def shardex_row(row: Any, q: RefQuery) -> list[Any]:
    """A SQL++ row as a list in projection order; an absent (MISSING) field is None."""
    if q.raw:
        return [row]
    return [row.get(c) for c in q.columns]


def _plain(v: Any) -> Any:
    return float(v) if isinstance(v, Decimal) else v


def duck_row(row: tuple[Any, ...], q: RefQuery) -> list[Any]:
    values = row[: len(row) - q.hidden] if q.hidden else row
    return [_plain(v) for v in values]


@dataclass
class Mismatch:
    query: RefQuery
    reason: str

    def __str__(self) -> str:
        return f"{self.reason}\n  sql++:  {self.query.sqlpp}\n  duckdb: {self.query.duck}"


def compare(run: Callable[[str], Iterable[Any]], con: Any, q: RefQuery) -> Mismatch | None:
    try:
        got = [shardex_row(r, q) for r in run(q.sqlpp)]
    except Exception as e:  # a failing statement is a mismatch to report, not a crash
        return Mismatch(q, f"shardex raised {e!r}")
    want = [duck_row(r, q) for r in con.execute(q.duck).fetchall()]
    diff = compare_results(got, want, q.ordered)
    return None if diff is None else Mismatch(q, diff)


def duck_connection(docs: dict[str, dict[str, Any]], table: str = "docs") -> Any:
    import duckdb

    # One thread: the queries are tiny, and the test machine is shared.
    con = duckdb.connect(":memory:", config={"threads": 1})
    load_duckdb(con, table, docs)
    return con


def queries(seed: int, n: int, keyspace: str, table: str = "docs") -> list[RefQuery]:
    gen = QueryGen(seed, keyspace, table)
    return [gen.query() for _ in range(n)]


def run_suite(
    run: Callable[[str], Iterable[Any]],
    *,
    keyspace: str,
    docs_seed: int = 1,
    n_docs: int = 300,
    query_seed: int = 2,
    n_queries: int = 400,
) -> tuple[list[RefQuery], list[Mismatch]]:
    """Generate the queries, run each on both engines, return (queries, mismatches). The
    caller has loaded ``make_documents(docs_seed, n_docs)`` into ``keyspace``."""
    con = duck_connection(make_documents(docs_seed, n_docs))
    qs = queries(query_seed, n_queries, keyspace)
    out = [m for q in qs if (m := compare(run, con, q)) is not None]
    con.close()
    return qs, out
