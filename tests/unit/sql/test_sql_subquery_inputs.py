"""Subqueries over whole keyspaces and with joins in the distributed pipelines: the inputs
the initiator reads first (``exec/subquery_inputs.py``: an uncorrelated subquery's value,
a correlated one's side statements), then leaves and root with those parameters, equal to
``LocalEngine`` over the same documents. The inputs are read here by ``LocalEngine`` (the
cluster runs them as queries of their own: tests/spark/test_sql_subquery_cluster.py)."""

from __future__ import annotations

import random
from typing import Any

import pytest

from shardex.errors import ErrorCode, ShardexError
from shardex.sql.exec.fragment_rows import leaf_rows, mode_of, root_rows
from shardex.sql.exec.join_plan import side_params
from shardex.sql.exec.rows import decode_rows, encode_row, to_batches
from shardex.sql.exec.subquery_inputs import inputs_of, side_statements
from shardex.sql.local import LocalEngine
from shardex.sql.local_rows import eval_count
from shardex.sql.syntax import parse_statement
from shardex.sql.syntax.bind import META_KEY, bind_select
from shardex.sql.syntax.ctes import values_in
from tests.sql_reference.documents import make_documents
from tests.sql_reference.generator import QueryGen
from tests.unit.sql.budgets import budget
from tests.unit.sql.test_sql_exec_plan import KS as USERS
from tests.unit.sql.test_sql_exec_plan import _plan


def _engine() -> LocalEngine:
    rng = random.Random(9)
    e = LocalEngine()
    for ks in ("orders", "customers", "items", "tags"):
        e.create_keyspace(ks)
    for i in range(40):
        e.keyspaces["customers"][f"c{i}"] = {
            "id": i,
            "name": f"n{i % 13}",
            "vip": i % 3 == 0,
            "items": [f"i{j}" for j in range(i % 4)],
        }
    for j in range(120):
        e.keyspaces["items"][f"i{j}"] = {
            "cid": rng.randrange(45),
            "sku": f"s{rng.randrange(30)}",
            "qty": rng.choice([0, 1, 2, 3, None]),
        }
    for k in range(8):
        e.keyspaces["tags"][f"t{k}"] = {"name": f"tag{k}"}
    for o in range(150):
        doc: dict[str, Any] = {"id": o, "tags": [f"tag{rng.randrange(12)}" for _ in range(3)]}
        if o % 9:
            doc["cid"] = rng.randrange(45)
        e.keyspaces["orders"][f"o{o}"] = doc
    return e


QUERIES = [
    # Uncorrelated: valued once.
    "SELECT o.id FROM orders o WHERE o.cid IN (SELECT RAW c.id FROM customers c WHERE c.vip) "
    "ORDER BY o.id",
    "SELECT RAW COUNT(*) FROM orders o WHERE o.cid IN "
    "(SELECT RAW c.id FROM customers c JOIN items i ON i.cid = c.id WHERE i.qty > 1)",
    "SELECT o.id FROM orders o WHERE o.cid IN (SELECT RAW c.id FROM customers c WHERE c.vip "
    "UNION SELECT RAW 7) ORDER BY o.id",
    # Correlated: over the documents the side statements read.
    "SELECT o.id, (SELECT RAW c.name FROM customers c WHERE c.id = o.cid) AS name "
    "FROM orders o ORDER BY o.id",
    "SELECT o.id, (SELECT RAW i.sku FROM customers c JOIN items i ON i.cid = c.id AND i.qty > 1 "
    "WHERE c.id = o.cid ORDER BY i.sku) AS skus FROM orders o ORDER BY o.id",
    "SELECT o.id, (SELECT c.name, i.sku FROM customers c LEFT JOIN items i ON i.cid = c.id AND "
    "i.qty = 3 WHERE c.id = o.cid ORDER BY i.sku) AS lines FROM orders o ORDER BY o.id",
    "SELECT o.id, (SELECT RAW c.name FROM customers c NEST items n ON KEYS c.items "
    "WHERE c.id = o.cid AND ARRAY_LENGTH(n) > 1) AS nested FROM orders o ORDER BY o.id",
    "SELECT RAW o.id FROM orders o WHERE EXISTS "
    "(SELECT 1 FROM items i WHERE i.cid = o.cid AND i.qty > $1) ORDER BY o.id",
    "SELECT o.cid, COUNT(*) AS n FROM orders o WHERE EXISTS (SELECT 1 FROM customers c "
    "WHERE c.id = o.cid AND c.vip) GROUP BY o.cid ORDER BY o.cid",
    # A correlated subquery over the outer row with an uncorrelated one over a keyspace.
    "SELECT o.id, (SELECT RAW x FROM o.tags AS x WHERE x IN (SELECT RAW t.name FROM tags t)) "
    "AS seen FROM orders o ORDER BY o.id",
    # A WITH inside a subquery: its term is a subquery of its own, valued once.
    "SELECT o.id, (WITH v AS (SELECT RAW c.id FROM customers c WHERE c.vip) "
    "SELECT RAW COUNT(*) FROM v AS x WHERE x = o.cid) AS vip FROM orders o ORDER BY o.id",
    # A keyspace read twice in one subquery is read whole.
    "SELECT o.id, (SELECT RAW b.name FROM customers a JOIN customers b ON b.id = a.id + 1 "
    "WHERE a.id = o.cid AND a.vip) AS next FROM orders o ORDER BY o.id",
]


def _with_inputs(eng: LocalEngine, sql: str, params: Any) -> Any:
    """``params`` with the inputs the initiator would read, read by ``eng``."""
    b = bind_select(parse_statement(sql))  # type: ignore[arg-type]
    values = {}
    for one in inputs_of(b):
        run_with = side_params(params) if one.gathers else params
        values[one.param] = eng.query(one.text, run_with)
    return values_in(params, values) if values else params


def _distributed(
    eng: LocalEngine, sql: str, params: Any, leaves: int, outer: str = "orders"
) -> list[Any]:
    b = bind_select(parse_statement(sql))  # type: ignore[arg-type]
    mode = mode_of(b)
    limit = eval_count(b.limit, params, "LIMIT")
    offset = eval_count(b.offset, params, "OFFSET") or 0
    top = None if limit is None or b.grouped or b.distinct else offset + limit
    items = sorted(eng.keyspaces[outer].items())
    random.Random(leaves).shuffle(items)
    inputs = []
    for i in range(leaves):
        scope = [{b.alias: doc, META_KEY: {"id": k}} for k, doc in items[i::leaves]]
        out = leaf_rows(b, params, mode, top, budget(), scope)
        inputs.append(iter([r for batch in to_batches(out) for r in decode_rows(batch)]))
    return list(root_rows(b, params, mode, limit, offset, budget(), inputs))


@pytest.mark.parametrize("sql", QUERIES)
@pytest.mark.parametrize("leaves", [1, 3])
def test_distributed_subqueries_over_keyspaces_equal_the_reference(sql: str, leaves: int) -> None:
    eng = _engine()
    params = [1] if "$1" in sql else None
    want = eng.query(sql, params)
    assert want and any(v not in ([], None, 0) for v in want)
    got = _distributed(eng, sql, _with_inputs(eng, sql, params), leaves)
    _same(sql, got, want)


def _same(sql: str, got: list[Any], want: list[Any]) -> None:
    if "ORDER BY o." in sql:
        assert got == want, sql
    else:
        assert sorted(map(encode_row, got)) == sorted(map(encode_row, want)), sql


def test_which_inputs_a_statement_reads_first() -> None:
    def inputs(sql: str) -> list[tuple[bool, str]]:
        return [(i.gathers, i.text) for i in inputs_of(bind_select(parse_statement(sql)))]  # type: ignore[arg-type]

    # Uncorrelated: the subquery's own text, once however often it is written.
    sub = "SELECT RAW c.id FROM customers c WHERE c.vip"
    assert inputs(f"SELECT o.id FROM orders o WHERE o.cid IN ({sub}) OR o.id IN ({sub})") == [
        (False, sub)
    ]
    # Correlated: a side statement per keyspace, narrowed by the conjuncts about it alone
    # (not the one that reads the outer row, nor the LEFT JOIN's WHERE about its inner side).
    got = inputs(
        "SELECT (SELECT RAW i.sku FROM customers c LEFT JOIN items i ON i.cid = c.id AND "
        "i.qty > 1 WHERE c.id = o.cid AND c.vip AND i.sku = 'x') FROM orders o"
    )
    assert got == [
        (True, "SELECT RAW [META(c).id, c] FROM customers AS c WHERE (c.vip)"),
        (True, "SELECT RAW [META(i).id, i] FROM items AS i WHERE (i.qty > 1)"),
    ]
    # USE KEYS documents are fetched where the subquery runs, an expression reads nothing.
    assert inputs("SELECT (SELECT RAW c FROM customers c USE KEYS o.cids) FROM orders o") == []
    assert inputs("SELECT (SELECT RAW x FROM o.tags x) FROM orders o") == []
    # A RIGHT JOIN keeps inner documents WHERE would refuse: nothing about it goes down.
    b = bind_select(
        parse_statement(
            "SELECT RAW c.id FROM customers c RIGHT JOIN items i ON i.cid = c.id WHERE c.vip"
        )
    )
    assert side_statements(b) == [  # type: ignore[arg-type]
        ("customers", "SELECT RAW [META(c).id, c] FROM customers AS c"),
        ("items", "SELECT RAW [META(i).id, i] FROM items AS i"),
    ]


def test_a_subquery_without_its_inputs_fails_clearly() -> None:
    eng = _engine()
    sql = QUERIES[3]
    with pytest.raises(ShardexError) as e:
        _distributed(eng, sql, None, 1)
    assert e.value.code is ErrorCode.BAD_REQUEST
    assert e.value.details["keyspace"] == "customers"
    assert "SELECT RAW [META(c).id, c]" in e.value.details["subquery"]
    assert "hint" in e.value.details


def test_explain_lists_the_inputs_read_first() -> None:
    sub = f"SELECT RAW u.age FROM {USERS} u WHERE u.city = 'rome'"
    plan = _plan(
        f"SELECT v.name, (SELECT RAW w.name FROM {USERS} w WHERE w.age = v.age) AS same "
        f"FROM {USERS} v WHERE v.age IN ({sub})"
    ).explain()
    inputs = plan["distributed"]["subquery_inputs"]
    assert [(i["reads"], i["statement"]) for i in inputs] == [
        ("its value", sub),  # WHERE's subquery is found before the projection's
        ("documents (side statement)", f"SELECT RAW [META(w).id, w] FROM {USERS} AS w"),
    ]
    assert "subquery_inputs" not in _plan(f"SELECT name FROM {USERS}").explain()["distributed"]


# -- generated ---------------------------------------------------------------------------------

# Each with a WHERE conjunct of its own: about the inner alias of a LEFT JOIN (it may be
# MISSING: WHERE cannot narrow that side), about d under a RIGHT JOIN (d may be MISSING).
INNER_FROM = (
    ("docs d", ""),
    ("docs d JOIN outs e ON e.b = d.b", " AND e.a > 3"),
    ("docs d LEFT JOIN outs e ON e.g = d.g AND e.a > 10", " AND e.b IS NOT VALUED"),
    ("docs d NEST outs e ON e.b = d.b", ""),
    ("docs d RIGHT JOIN outs e ON e.b = d.b AND e.g = d.g", " OR d.a IS MISSING"),
)
CORRELATION = ("", " AND d.b = o.b", " AND d.g = o.g", " AND d.a > o.a")
FORMS = (
    "SELECT RAW o.id FROM outs o WHERE o.a IN (SELECT RAW d.a FROM {sub}) ORDER BY o.id",
    "SELECT RAW o.id FROM outs o WHERE EXISTS (SELECT 1 FROM {sub}) ORDER BY o.id",
    "SELECT o.id, (SELECT RAW COUNT(*) FROM {sub})[0] AS n FROM outs o ORDER BY o.id",
    "SELECT o.id, (SELECT RAW d.id FROM {sub} ORDER BY d.id LIMIT 3) AS ids FROM outs o "
    "ORDER BY o.id",
    "SELECT o.g, COUNT(*) AS n FROM outs o WHERE NOT EXISTS (SELECT 1 FROM {sub}) GROUP BY o.g",
)


def _generated(seed: int, n: int) -> list[str]:
    gen = QueryGen(seed, "docs", "docs")  # predicates over the alias d
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        joined, own = rng.choice(INNER_FROM)
        where = f"({gen.predicate().pp}{own}){rng.choice(CORRELATION)}"
        sub = f"{joined} WHERE {where}"
        out.append(rng.choice(FORMS).format(sub=sub))
    return out


def test_generated_subqueries_over_keyspaces_equal_the_reference() -> None:
    """Random predicates (``tests/sql_reference``) in correlated and uncorrelated subqueries,
    with and without joins, under IN, EXISTS, NOT EXISTS and as values."""
    eng = LocalEngine()
    for ks, seed, n in (("docs", 21, 50), ("outs", 22, 30)):
        eng.create_keyspace(ks)
        eng.keyspaces[ks].update(make_documents(seed, n))
    nonempty = 0
    for sql in _generated(5, 100):
        want = eng.query(sql)
        nonempty += any(v not in ([], None, 0) for v in want)
        got = _distributed(eng, sql, _with_inputs(eng, sql, None), 2, outer="outs")
        _same(sql, got, want)
    assert nonempty > 50  # most statements have rows that the subquery decided
