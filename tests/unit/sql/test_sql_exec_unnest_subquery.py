"""UNNEST and subquery expressions in the distributed row pipelines: documents split over
several leaves (each unnests and evaluates the subqueries of the documents it read), the
root over their shipped rows; the result must equal ``LocalEngine`` over all documents.
Also what the planner refuses (a subquery over a keyspace) and the memory charge of a
subquery's result."""

from __future__ import annotations

import random
from typing import Any

import pytest

from shardex.api.privileges import AuthFailed, Principal
from shardex.errors import ErrorCode, ShardexError
from shardex.sql.exec.analyze import doc_where, read_paths
from shardex.sql.exec.fragment_rows import leaf_rows
from shardex.sql.exec.plan import lookup_keys
from shardex.sql.exec.service import check_statement
from shardex.sql.exec.subquery_inputs import inputs_of
from shardex.sql.local import LocalEngine
from shardex.sql.syntax import parse_statement
from shardex.sql.syntax.bind import META_KEY, bind_select
from tests.unit.sql.budgets import budget
from tests.unit.sql.test_sql_exec_fragment_rows import KS, _canon, _run


def _docs(n: int = 120) -> dict[str, Any]:
    rng = random.Random(7)
    out: dict[str, Any] = {}
    for i in range(n):
        d: dict[str, Any] = {"k": i, "g": rng.choice(["x", "y", None])}
        shape = rng.random()
        if shape < 0.7:
            d["items"] = [
                {"p": rng.choice(["a", "b", "c"]), "n": rng.randrange(5), "tags": ["t"] * (j % 3)}
                for j in range(rng.randrange(5))
            ]
        elif shape < 0.85:
            d["items"] = rng.choice([None, "text", {"p": "a"}])
        out[f"d{i:03d}"] = d
    return out


QUERIES = [
    f"SELECT d.k, i.p FROM {KS} AS d UNNEST d.items AS i WHERE i.n > 1",
    f"SELECT d.k, i FROM {KS} d LEFT UNNEST d.items i ORDER BY d.k, i.p, i.n",
    f"SELECT i.p, COUNT(*) AS c, SUM(i.n) AS s FROM {KS} d UNNEST d.items i GROUP BY i.p",
    f"SELECT d.k, t FROM {KS} d UNNEST d.items i UNNEST i.tags t ORDER BY d.k DESC LIMIT 9",
    f"SELECT DISTINCT RAW i.p FROM {KS} d INNER UNNEST items i",
    f"SELECT COUNT(*) AS c FROM {KS} d LEFT OUTER UNNEST d.items i WHERE d.g = 'x'",
    f"SELECT d.k, (SELECT RAW SUM(i.n) FROM d.items AS i)[0] AS s FROM {KS} d ORDER BY d.k",
    f"SELECT RAW d.k FROM {KS} d WHERE EXISTS (SELECT 1 FROM d.items i WHERE i.p = 'c')",
    f"SELECT RAW d.k FROM {KS} d WHERE 'b' IN (SELECT RAW i.p FROM d.items i) ORDER BY d.k",
    f"SELECT RAW d.k FROM {KS} d WHERE ANY n IN (SELECT RAW i.n FROM d.items i) "
    f"SATISFIES n = 4 END",
    f"SELECT d.g, SUM(ARRAY_LENGTH((SELECT 1 FROM d.items i WHERE i.n > 2))) AS n "
    f"FROM {KS} d GROUP BY d.g",
    f"SELECT d.g, COUNT(*) AS c FROM {KS} d GROUP BY d.g "
    f"HAVING COUNT(*) > (SELECT RAW 10)[0] ORDER BY d.g",
]


@pytest.mark.parametrize("sql", QUERIES)
@pytest.mark.parametrize("leaves", [1, 4])
def test_distributed_unnest_and_subqueries_equal_the_reference(sql: str, leaves: int) -> None:
    docs = _docs()
    ref = LocalEngine()
    ref.create_keyspace(KS)
    ref.keyspaces[KS].update(docs)
    want = ref.query(sql)
    assert want, "the query should return rows for the comparison to mean something"
    got = _run(sql, docs, leaves)
    if "ORDER BY" in sql and "GROUP BY" not in sql.split("ORDER BY")[-1]:
        assert got == want
    else:
        assert sorted(map(_canon, got)) == sorted(map(_canon, want))


def test_unnest_conjuncts_are_no_document_predicates() -> None:
    b = bind_select(
        parse_statement(f"SELECT 1 FROM {KS} d UNNEST d.items i WHERE i.n > 1 AND d.k = 3")
    )
    where = doc_where(b)
    # The element condition becomes what it implies of the document (for array indexes).
    assert where is not None
    assert where.to_text() == "ANY i IN items SATISFIES i.n > 1 END AND k = 3"
    assert read_paths(b) is None  # whole documents: an index cannot cover element paths
    # LEFT UNNEST keeps documents without elements, and a term over two UNNESTs is about
    # pairs: neither implies anything of the document.
    b = bind_select(
        parse_statement(
            f"SELECT 1 FROM {KS} d LEFT UNNEST d.items i UNNEST d.tags t "
            "WHERE i.n > 1 AND i.n = t AND d.k = 3"
        )
    )
    assert doc_where(b).to_text() == "k = 3"


def test_a_subquery_over_a_keyspace_is_an_input_read_first() -> None:
    b = bind_select(
        parse_statement(f"SELECT k FROM {KS} WHERE k IN (SELECT RAW k FROM other WHERE k > 1)")
    )
    [one] = inputs_of(b)
    assert not one.gathers and one.text == "SELECT RAW k FROM other WHERE k > 1"
    # Over the outer row it reads nothing first.
    assert (
        inputs_of(bind_select(parse_statement(f"SELECT (SELECT RAW x FROM d.items x) FROM {KS} d")))
        == []
    )


def test_a_subquery_result_is_charged_to_the_query_budget() -> None:
    b = bind_select(parse_statement(f"SELECT (SELECT RAW x FROM d.big AS x) AS v FROM {KS} d"))
    scope = [{"d": {"big": list(range(20_000))}, META_KEY: {"id": "1"}}]
    with pytest.raises(ShardexError) as e:
        list(leaf_rows(b, None, "rows", None, budget(64 * 1024), iter(scope)))
    assert e.value.code == ErrorCode.QUERY_MEMORY_LIMIT
    assert e.value.details["operator"] == "subquery"
    # Within the budget the same row passes.
    small = [{"d": {"big": [1, 2]}, META_KEY: {"id": "1"}}]
    assert list(leaf_rows(b, None, "rows", None, budget(64 * 1024), iter(small))) == [{"v": [1, 2]}]


def test_use_keys_from_an_expression_subquery() -> None:
    b = bind_select(
        parse_statement(f"SELECT RAW k FROM {KS} USE KEYS (SELECT RAW 'd' || x FROM ['1', '2'] x)")
    )
    assert lookup_keys(b.from_.use_keys, None, dedupe=False) == ["d1", "d2"]  # type: ignore[union-attr]


def test_a_subquery_needs_select_on_the_keyspace_it_reads() -> None:
    bob = Principal("user", "bob", ("query_select(t)", "query_update(t)"))
    check_statement(bob, parse_statement(f"SELECT (SELECT RAW x FROM d.items x) FROM {KS} d"))
    for sql in [
        f"SELECT k FROM {KS} WHERE k IN (SELECT RAW s.k FROM secret s USE KEYS 'a')",
        f"DELETE FROM {KS} WHERE EXISTS (SELECT 1 FROM secret USE KEYS 'a')",
        "EXPLAIN SELECT (SELECT RAW (SELECT 1 FROM secret) FROM [1] q)",
    ]:
        with pytest.raises(AuthFailed) as e:
            check_statement(bob, parse_statement(sql))
        assert e.value.details["keyspace"] == "secret"


def test_use_keys_subqueries_read_documents_through_fetch() -> None:
    sql = (
        f"SELECT d.k, (SELECT RAW f.k FROM {KS} f USE KEYS d.friends) AS fk FROM {KS} d "
        "ORDER BY d.k"
    )
    b = bind_select(parse_statement(sql))
    assert inputs_of(b) == []  # USE KEYS: fetched where it runs
    store = {f"d{i}": {"k": i} for i in range(3)}
    asked: list[list[str]] = []

    def fetch(keyspace: str, ids: list[str]) -> list[tuple[str, Any]]:
        assert keyspace == KS
        asked.append(ids)
        return [(i, store[i]) for i in ids if i in store]

    scope = [
        {"d": {"k": 0, "friends": ["d2", "d1", "d2", "nope"]}, META_KEY: {"id": "d0"}},
        {"d": {"k": 1, "friends": "d0"}, META_KEY: {"id": "d1"}},
    ]
    out = list(leaf_rows(b, None, "sort", None, budget(), iter(scope), fetch=fetch))
    assert [v for _, v in out] == [{"k": 0, "fk": [2, 1, 2]}, {"k": 1, "fk": [0]}]
    # One read for both rows' keys, each key once (decision 0142).
    assert asked == [["d2", "d1", "nope", "d0"]]
    # Without a way to read documents the subquery is refused, not silently empty.
    with pytest.raises(ShardexError, match="cannot run here"):
        list(leaf_rows(b, None, "sort", None, budget(), iter(scope)))
