"""UPDATE ... SET path = value FOR v IN array [WHEN cond] END on the reference engine (the
cluster runs the same ``operators.mutate.apply_edits``; tests/spark/test_sql_cluster.py)."""

from __future__ import annotations

import pytest

from shardex.errors import ErrorCode, ShardexError
from shardex.sql.local import LocalEngine


def _engine() -> LocalEngine:
    e = LocalEngine()
    e.create_keyspace("o")
    e.execute(
        "INSERT INTO o (KEY, VALUE) VALUES ('a', {'items': [{'sku': 'x', 'q': 1}, "
        "{'sku': 'y', 'q': 2}], 'tags': [1, 2, 3], 'k': 10}), ('b', {'items': 'none'})"
    )
    return e


def test_each_element_is_set_where_its_condition_holds() -> None:
    e = _engine()
    r = e.execute(
        "UPDATE o SET i.q = i.q * k FOR i IN items WHEN i.sku = 'y' END, "
        "t = t + 1 FOR t IN tags END, i.seen = TRUE FOR i IN o.items END, n = 1 "
        "WHERE META().id = 'a' RETURNING o.*"
    )
    # Every value reads the document as it was: k, and i.q before the statement.
    assert r.rows == [
        {
            "items": [{"sku": "x", "q": 1, "seen": True}, {"sku": "y", "q": 20, "seen": True}],
            "tags": [2, 3, 4],
            "k": 10,
            "n": 1,
        }
    ]


def test_no_array_leaves_the_document_as_it_is() -> None:
    e = _engine()
    e.execute("UPDATE o SET i.q = 0 FOR i IN items END, m = 1 WHERE META().id = 'b'")
    assert e.keyspaces["o"]["b"] == {"items": "none", "m": 1}


@pytest.mark.parametrize(
    ("sql", "code", "fragment"),
    [
        ("UPDATE o SET q = 1 FOR i IN items END", ErrorCode.SQL_SYNTAX, "must start with i"),
        ("UPDATE o SET i.q = 1 FOR i IN items", ErrorCode.SQL_SYNTAX, "END"),
        ("UPDATE o SET i.q = 1 FOR i WITHIN items END", ErrorCode.SQL_SYNTAX, "WITHIN"),
        ("UPDATE o SET i.q = 1 FOR i IN LOWER(x) END", ErrorCode.BAD_REQUEST, "a path"),
    ],
)
def test_errors_name_the_problem_and_change_nothing(sql: str, code, fragment: str) -> None:
    e = _engine()
    before = {k: dict(v) for k, v in e.keyspaces["o"].items()}
    with pytest.raises(ShardexError) as err:
        e.execute(sql)
    assert err.value.code is code and fragment in str(err.value)
    assert e.keyspaces["o"] == before
