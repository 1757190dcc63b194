"""How correlated subqueries read their documents in the distributed pipelines, counted:
a USE KEYS subquery's documents read a batch of rows at a time, each key once
(``exec/subquery_keys.py``); an equality-correlated subquery over gathered documents looking
them up in a table made once (``exec/subquery_lookup.py``). Results stay ``LocalEngine``'s."""

from __future__ import annotations

from typing import Any

import pytest

from shardex.sql.exec import subquery_keys
from shardex.sql.exec.fragment_rows import leaf_rows, mode_of, root_rows
from shardex.sql.exec.rows import decode_rows, encode_row, to_batches
from shardex.sql.exec.subquery_lookup import lookup_key
from shardex.sql.local import LocalEngine
from shardex.sql.syntax import parse_statement
from shardex.sql.syntax.bind import META_KEY, bind_select
from tests.unit.sql.budgets import budget
from tests.unit.sql.test_sql_subquery_inputs import _with_inputs


def _bound(sql: str) -> Any:
    return bind_select(parse_statement(sql))  # type: ignore[arg-type]


# -- USE KEYS: batched reads -------------------------------------------------------------------


class _Store:
    """A ``Fetch`` over a dict that records every read."""

    def __init__(self, docs: dict[str, Any]) -> None:
        self.docs = docs
        self.asked: list[list[str]] = []

    def __call__(self, keyspace: str, ids: list[str]) -> list[tuple[str, Any]]:
        assert keyspace == "orders"
        self.asked.append(list(ids))
        return [(i, self.docs[i]) for i in ids if i in self.docs]


def _orders(n: int) -> dict[str, Any]:
    return {f"o{i}": {"status": "ab"[i % 2], "total": i} for i in range(n)}


def _customers(n: int, per: int, orders: int) -> list[dict[str, Any]]:
    """Customers whose order keys repeat across rows (and name a missing order)."""
    return [
        {
            "c": {"order_ids": [f"o{(i * 7 + j) % orders}" for j in range(per)] + ["nope"]},
            META_KEY: {"id": f"c{i}"},
        }
        for i in range(n)
    ]


def _leaf(sql: str, scope: list[Any], fetch: Any, params: Any = None) -> list[Any]:
    b = _bound(sql)
    return list(leaf_rows(b, params, mode_of(b), None, budget(), iter(scope), fetch=fetch))


def _reference(sql: str, scope: list[Any], orders: dict[str, Any], params: Any = None) -> Any:
    eng = LocalEngine()
    eng.create_keyspace("customers")
    eng.create_keyspace("orders")
    eng.keyspaces["customers"].update({r[META_KEY]["id"]: r["c"] for r in scope})
    eng.keyspaces["orders"].update(orders)
    return eng.query(sql, params)


COUNT_SQL = (
    "SELECT META(c).id AS cid, (SELECT RAW COUNT(*) FROM orders o USE KEYS c.order_ids "
    "WHERE o.status = $1)[0] AS n FROM customers c"
)


def test_a_use_keys_subquery_reads_each_key_once_per_batch_of_rows() -> None:
    rows = subquery_keys.BATCH_ROWS + 44  # two batches
    orders = _orders(90)
    scope = _customers(rows, 6, 90)
    store = _Store(orders)
    got = _leaf(COUNT_SQL, scope, store, ["a"])
    assert sorted(map(encode_row, got)) == sorted(
        map(encode_row, _reference(COUNT_SQL, scope, orders, ["a"]))
    )
    # One read per batch, each of its distinct keys once; no read per row.
    assert len(store.asked) == 2
    for ids, part in zip(store.asked, (scope[: rows - 44], scope[rows - 44 :]), strict=True):
        want = list(dict.fromkeys(k for r in part for k in r["c"]["order_ids"]))
        assert ids == want


def test_batched_keys_in_where_and_through_let_and_keys_read_per_row() -> None:
    orders = _orders(40)
    scope = _customers(30, 3, 40)
    cases = [
        # WHERE runs the subquery: its keys are read before WHERE, for every row.
        (
            "SELECT RAW META(c).id FROM customers c WHERE "
            "(SELECT RAW SUM(o.total) FROM orders o USE KEYS c.order_ids)[0] > 50",
            1,
        ),
        # USE KEYS reads a LET name (bound to its definition): batched as well.
        (
            "SELECT META(c).id AS cid, (SELECT RAW o.total FROM orders o USE KEYS ks) AS t "
            "FROM customers c LET ks = c.order_ids",
            1,
        ),
        # USE KEYS is a subquery (evaluating it ahead would run it twice): a read per row.
        (
            "SELECT META(c).id AS cid, (SELECT RAW o.total FROM orders o USE KEYS "
            "(SELECT RAW x FROM c.order_ids x)) AS t FROM customers c",
            30,
        ),
    ]
    for sql, reads in cases:
        store = _Store(orders)
        got = _leaf(sql, scope, store)
        assert sorted(map(encode_row, got)) == sorted(
            map(encode_row, _reference(sql, scope, orders))
        ), sql
        assert len(store.asked) == reads, sql


def test_a_projection_subquery_reads_no_keys_of_rows_where_drops() -> None:
    orders = _orders(40)
    scope = _customers(20, 2, 40)
    store = _Store(orders)
    sql = (
        "SELECT META(c).id AS cid, (SELECT RAW o.total FROM orders o USE KEYS c.order_ids) AS t "
        "FROM customers c WHERE META(c).id = 'c3'"
    )
    got = _leaf(sql, scope, store)
    assert got == _reference(sql, scope, orders)
    assert store.asked == [scope[3]["c"]["order_ids"]]


# -- equality-correlated subqueries over gathered documents ------------------------------------


def _engine() -> LocalEngine:
    eng = LocalEngine()
    eng.create_keyspace("outs")
    eng.create_keyspace("docs")
    # Keys of every kind: numbers equal across int and float, strings, NULL, MISSING,
    # arrays and objects (compared by value).
    keys: list[Any] = [1, 1.0, 2, "1", "x", None, [1, 2], {"a": 1}, True]
    for i in range(30):
        doc: dict[str, Any] = {"id": i, "v": i % 4}
        if i % 10 != 9:
            doc["k"] = keys[i % len(keys)]
        eng.keyspaces["docs"][f"d{i}"] = doc
    for j in range(12):
        out: dict[str, Any] = {"id": j}
        if j != 11:
            out["k"] = keys[j % len(keys)]
        eng.keyspaces["outs"][f"o{j}"] = out
    return eng


def _distributed(eng: LocalEngine, sql: str, params: Any) -> list[Any]:
    b = _bound(sql)
    mode = mode_of(b)
    outs = sorted(eng.keyspaces["outs"].items())
    scope = [{b.alias: doc, META_KEY: {"id": k}} for k, doc in outs]
    out = leaf_rows(b, params, mode, None, budget(), scope)
    shipped = iter([r for batch in to_batches(out) for r in decode_rows(batch)])
    return list(root_rows(b, params, mode, None, 0, budget(), [shipped]))


# (statement, the subquery's conjuncts about d alone: its side statement reads only those)
LOOKUP_SQL = [
    (
        "SELECT o.id, (SELECT RAW d.id FROM docs d WHERE d.k = o.k ORDER BY d.id) AS ids "
        "FROM outs o ORDER BY o.id",
        "",
    ),
    (
        "SELECT o.id, (SELECT RAW COUNT(*) FROM docs d WHERE o.k = d.k AND d.v > 0)[0] AS n "
        "FROM outs o ORDER BY o.id",
        " AND d.v > 0",
    ),
    (
        "SELECT RAW o.id FROM outs o WHERE EXISTS (SELECT 1 FROM docs d WHERE d.k = o.k "
        "AND META(d).id != 'd0') ORDER BY o.id",
        " AND META(d).id != 'd0'",
    ),
]


@pytest.mark.parametrize(("sql", "own"), LOOKUP_SQL)
def test_an_equality_correlated_subquery_scans_only_its_matches(
    sql: str, own: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    eng = _engine()
    want = eng.query(sql)
    params = _with_inputs(eng, sql, None)
    scanned: list[int] = []
    docs = LocalEngine.docs

    def counted(*args: Any, **kw: Any) -> Any:
        out = docs(*args, **kw)
        scanned.append(len(out))
        return out

    monkeypatch.setattr(LocalEngine, "docs", staticmethod(counted))
    got = _distributed(eng, sql, params)
    assert got == want
    # Each outer row's evaluation scanned the documents whose key equals its own, not all.
    monkeypatch.undo()
    inner = eng.keyspaces["docs"]
    matches = [  # N1QL's equality (1 = 1.0, 1 != TRUE, NULL and MISSING equal nothing)
        eng.query(f"SELECT RAW COUNT(*) FROM docs d WHERE d.k = $1{own}", [o["k"]])[0]
        for o in eng.keyspaces["outs"].values()
        if "k" in o
    ]
    assert sorted(n for n in scanned if n) == sorted(n for n in matches if n)
    assert sum(scanned) < len(inner) * len(eng.keyspaces["outs"]) / 3


def test_which_equalities_are_lookup_keys() -> None:
    def key(sql: str) -> tuple[str, str] | None:
        b = _bound(f"SELECT ({sql}) FROM outs o")
        sub = b.terms[0].expr.bound
        found = lookup_key(sub)
        return None if found is None else (found[0].to_text(), found[1].to_text())

    assert key("SELECT 1 FROM docs d WHERE d.v > 1 AND o.k = d.k") == ("o.k", "d.k")
    # Not an outer value: the subquery's own LET name, or both sides inner.
    assert key("SELECT 1 FROM docs d LET z = d.v WHERE d.k = z") is None
    assert key("SELECT 1 FROM docs d WHERE d.k = d.v") is None
    # Not a lookup: an OR, a join (its keyspaces read as before), USE KEYS.
    assert key("SELECT 1 FROM docs d WHERE d.k = o.k OR d.v = 1") is None
    assert key("SELECT 1 FROM docs d JOIN docs e ON e.id = d.id WHERE d.k = o.k") is None
    assert key("SELECT 1 FROM docs d USE KEYS o.ids WHERE d.k = o.k") is None


def test_a_use_keys_expression_that_fails_on_a_row_the_subquery_skips_is_no_error() -> None:
    # Read ahead for every row, the USE KEYS expression fails on those WHERE's first
    # conjunct drops before the subquery runs: as without the batch, no error.
    orders = _orders(40)
    scope = _customers(20, 2, 40)
    sql = (
        "SELECT RAW META(c).id FROM customers c WHERE META(c).id = 'c3' AND "
        "(SELECT RAW COUNT(*) FROM orders o USE KEYS CASE WHEN META(c).id = 'c3' "
        "THEN c.order_ids ELSE REGEXP_CONTAINS('a', '[') END)[0] > 0"
    )
    store = _Store(orders)
    assert _leaf(sql, scope, store) == _reference(sql, scope, orders) == ["c3"]
    assert store.asked == [scope[3]["c"]["order_ids"]]


def test_an_outer_key_that_fails_is_evaluated_only_where_where_is() -> None:
    # No document passes the subquery's own conjunct: WHERE never runs, so its failing
    # outer side is no error, with or without the table.
    eng = _engine()
    sql = (
        "SELECT o.id, (SELECT RAW d.id FROM docs d WHERE d.v > 100 AND "
        "d.k = REGEXP_CONTAINS(TOSTRING(o.id), '[')) AS ids FROM outs o ORDER BY o.id"
    )
    want = eng.query(sql)
    assert want == [{"id": j, "ids": []} for j in range(12)]
    assert _distributed(eng, sql, _with_inputs(eng, sql, None)) == want
