"""MERGE (lookup form): the grammar's errors and the rules, on the reference engine."""

from __future__ import annotations

import pytest

from shardex.errors import ErrorCode, ShardexError
from shardex.sql.local import LocalEngine
from shardex.sql.syntax import KeyspaceRef, SelectStmt, parse_statement
from shardex.sql.syntax.merge import MergeStmt


def _engine() -> LocalEngine:
    e = LocalEngine()
    e.create_keyspace("t")
    e.execute("INSERT INTO t (KEY, VALUE) VALUES ('a', {'n': 1, 'x': 0}), ('b', {'n': 2, 'x': 0})")
    return e


def test_the_three_sources_parse() -> None:
    s = parse_statement(
        "MERGE INTO t USING u USE KEYS ['k'] ON PRIMARY KEY u.k WHEN MATCHED THEN DELETE"
    )
    assert isinstance(s, MergeStmt) and isinstance(s.source, KeyspaceRef) and s.source_alias == "u"
    s = parse_statement(
        "MERGE INTO t AS x USING (SELECT 1 AS k) s ON KEY s.k WHEN MATCHED THEN DELETE"
    )
    assert isinstance(s.source, SelectStmt) and s.alias == "x"
    s = parse_statement("MERGE INTO t USING [1] s ON KEY 'k' WHEN NOT MATCHED THEN INSERT {s}")
    assert s.insert is not None and s.update is None


@pytest.mark.parametrize(
    ("sql", "fragment"),
    [
        ("MERGE INTO t USING [1] s ON t.k = s WHEN MATCHED THEN DELETE", "ANSI MERGE"),
        ("MERGE INTO t USING [1] s ON KEY 'k'", "WHEN MATCHED or WHEN NOT MATCHED"),
        ("MERGE INTO t USING [1] ON KEY 'k' WHEN MATCHED THEN DELETE", "needs an alias"),
        ("MERGE INTO t USING t ON KEY 'k' WHEN MATCHED THEN DELETE", "both named"),
        ("MERGE INTO t USING [1] s ON KEY 'k' WHEN MATCHED THEN INSERT {}", "UPDATE or DELETE"),
        (
            "MERGE INTO t USING [1] s ON KEY 'k' WHEN MATCHED THEN DELETE WHEN MATCHED THEN DELETE",
            "given twice",
        ),
    ],
)
def test_grammar_errors_name_what_is_wrong(sql: str, fragment: str) -> None:
    with pytest.raises(ShardexError) as err:
        parse_statement(sql)
    assert err.value.code is ErrorCode.SQL_SYNTAX and fragment in str(err.value)


def test_update_wins_over_delete_and_each_where_gates_its_action() -> None:
    e = _engine()
    r = e.execute(
        "MERGE INTO t USING [{'k': 'a'}, {'k': 'b'}, {'k': 'c'}, {'k': 'd'}] s ON KEY s.k "
        "WHEN MATCHED THEN UPDATE SET x = 5 WHERE t.n = 1 "
        "WHEN MATCHED THEN DELETE WHERE t.n = 2 "
        "WHEN NOT MATCHED THEN INSERT {'from': s.k} WHERE s.k = 'c' "
        "RETURNING META(t).id AS id"
    )
    assert r.mutation_count == 3
    assert sorted(row["id"] for row in r.rows) == ["a", "b", "c"]
    assert e.keyspaces["t"] == {"a": {"n": 1, "x": 5}, "c": {"from": "c"}}


def test_limit_takes_the_first_source_rows_and_bad_keys_change_nothing() -> None:
    e = _engine()
    r = e.execute(
        "MERGE INTO t USING ['p', 'q', 'r'] s ON KEY s WHEN NOT MATCHED THEN INSERT {} LIMIT 2"
    )
    assert r.mutation_count == 2 and set(e.keyspaces["t"]) == {"a", "b", "p", "q"}
    before = dict(e.keyspaces["t"])
    for bad in (
        "MERGE INTO t USING ['z', 3] s ON KEY s WHEN NOT MATCHED THEN INSERT {}",
        "MERGE INTO t USING ['z', 'z'] s ON KEY s WHEN NOT MATCHED THEN INSERT {}",
        "MERGE INTO t USING ['z'] s ON KEY s WHEN NOT MATCHED THEN INSERT s.nothing",
    ):
        with pytest.raises(ShardexError) as err:
            e.execute(bad)
        assert err.value.code is ErrorCode.BAD_REQUEST
    assert e.keyspaces["t"] == before


def test_object_fields_take_their_names_from_paths() -> None:
    e = _engine()
    assert e.query("SELECT {t.n, x, 'y': 1} AS o FROM t USE KEYS 'a'") == [
        {"o": {"n": 1, "x": 0, "y": 1}}
    ]
