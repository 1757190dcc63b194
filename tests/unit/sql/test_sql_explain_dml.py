"""EXPLAIN of every statement in the parser and the reference engine: INSERT/UPSERT (VALUES
and ... SELECT), DELETE, UPDATE, MERGE and EXECUTE give the plan of the query each runs and
then the write steps, and nothing is written."""

from __future__ import annotations

import pytest

from shardex.api.privileges import AuthFailed, Principal
from shardex.errors import ErrorCode, ShardexError
from shardex.sql.exec.statement_checks import check_statement
from shardex.sql.local import LocalEngine
from shardex.sql.syntax import DeleteStmt, ExplainStmt, InsertStmt, UpdateStmt, parse_statement
from shardex.sql.syntax.ast import ExecuteStmt
from shardex.sql.syntax.merge import MergeStmt

DOCS = {"a": {"x": 1, "tags": ["p"]}, "b": {"x": 2}, "c": {"x": 3}}


@pytest.fixture
def eng() -> LocalEngine:
    e = LocalEngine()
    e.create_keyspace("u")
    e.keyspaces["u"].update({k: dict(v) for k, v in DOCS.items()})
    return e


@pytest.mark.parametrize(
    ("sql", "kind"),
    [
        ("EXPLAIN INSERT INTO u VALUES ('k', {})", InsertStmt),
        ("EXPLAIN UPSERT INTO u (KEY id) SELECT META().id AS id FROM u", InsertStmt),
        ("EXPLAIN DELETE FROM u WHERE x = 1", DeleteStmt),
        ("EXPLAIN UPDATE u SET y = 1", UpdateStmt),
        ("EXPLAIN MERGE INTO u USING [] AS s ON KEY s.k WHEN MATCHED THEN DELETE", MergeStmt),
        ("EXPLAIN EXECUTE p USING [1]", ExecuteStmt),
    ],
)
def test_explain_parses_every_statement(sql: str, kind: type) -> None:
    stmt = parse_statement(sql)
    assert isinstance(stmt, ExplainStmt) and isinstance(stmt.statement, kind)


@pytest.mark.parametrize(
    "sql", ["EXPLAIN PREPARE p FROM SELECT 1", "EXPLAIN CREATE INDEX i ON u(x)"]
)
def test_explain_of_what_has_no_plan_is_a_syntax_error(sql: str) -> None:
    with pytest.raises(ShardexError) as err:
        parse_statement(sql)
    assert err.value.code is ErrorCode.SQL_SYNTAX
    assert "after EXPLAIN" in str(err.value) and err.value.details["column"] == 9


def test_explain_delete_shows_the_derived_select_and_writes_nothing(eng: LocalEngine) -> None:
    [plan] = eng.query("EXPLAIN DELETE FROM u WHERE x >= 1 RETURNING META().id")
    assert plan["statement"] == "DELETE" and plan["keyspace"] == "u"
    query_ops = [op["operator"] for op in plan["query"]["plan"]]
    assert query_ops == ["KeyspaceScan", "Filter", "Project"]
    assert plan["query"]["plan"][1]["condition"] == "u.x >= 1"
    assert [op["operator"] for op in plan["plan"]] == ["SendDelete", "Returning"]
    assert eng.keyspaces["u"] == DOCS  # nothing deleted
    assert eng.execute("DELETE FROM u WHERE x >= 1").mutation_count == 3  # the real one does


def test_explain_update_shows_its_assignments_and_changes_nothing(eng: LocalEngine) -> None:
    [plan] = eng.query("EXPLAIN UPDATE u USE KEYS ['a'] SET y = x + 1 UNSET tags LIMIT 1")
    assert plan["query"]["plan"][0] == {
        "operator": "KeyspaceScan",
        "keyspace": "u",
        "as": "u",
        "use_keys": '["a"]',
    }
    assert plan["query"]["plan"][-1] == {"operator": "Limit", "expr": "1"}
    set_op, send = plan["plan"]
    assert set_op == {"operator": "Set", "set": [{"path": "y", "expr": "x + 1"}], "unset": ["tags"]}
    assert send == {"operator": "SendUpdate", "keyspace": "u", "as": "u"}
    assert eng.keyspaces["u"] == DOCS


def test_explain_insert_values_and_insert_select(eng: LocalEngine) -> None:
    [values] = eng.query("EXPLAIN INSERT INTO u VALUES ('d', {'x': 4}), ('e', {'x': 5})")
    assert "query" not in values
    assert values["plan"][0] == {
        "operator": "ValueScan",
        "values": [['"d"', '{"x": 4}'], ['"e"', '{"x": 5}']],
    }
    assert values["plan"][1] == {"operator": "SendInsert", "keyspace": "u"}
    sql = "EXPLAIN UPSERT INTO u (KEY 'n' || id) SELECT META().id AS id, x FROM u WHERE x > 1"
    [select] = eng.query(sql)
    assert select["statement"] == "UPSERT"
    assert select["query"]["plan"][1] == {"operator": "Filter", "condition": "u.x > 1"}
    assert select["plan"] == [
        {"operator": "SendUpsert", "keyspace": "u", "key": '"n" || id', "value": "the row"}
    ]
    [setop] = eng.query("EXPLAIN INSERT INTO u (KEY k) SELECT 'z' AS k UNION SELECT 'y' AS k")
    assert len(setop["query"]["branches"]) == 2
    assert eng.keyspaces["u"] == DOCS


def test_explain_merge_over_a_keyspace_and_over_an_expression(eng: LocalEngine) -> None:
    sql = (
        "EXPLAIN MERGE INTO u AS t USING u AS s USE KEYS ['a'] ON KEY META(s).id || '2' "
        "WHEN MATCHED THEN UPDATE SET t.m = 1 WHERE t.x > 0 "
        "WHEN NOT MATCHED THEN INSERT {'n': s.x} LIMIT 5"
    )
    [plan] = eng.query(sql)
    assert plan["query"]["plan"][0]["use_keys"] == '["a"]'
    limit, merge = plan["plan"]
    assert limit == {"operator": "Limit", "expr": "5"}
    assert merge["on_key"] == 'META(s).id || "2"' and merge["update"]["where"] == "t.x > 0"
    assert merge["insert"] == {"value": '{"n": s.x}'} and "delete" not in merge
    [expr] = eng.query(
        "EXPLAIN MERGE INTO u AS t USING [{'k': 'a'}] AS s ON KEY s.k WHEN MATCHED THEN DELETE"
    )
    assert "query" not in expr
    assert expr["plan"][0] == {"operator": "ExpressionScan", "expr": '[{"k": "a"}]', "as": "s"}
    assert expr["plan"][1]["delete"] == {}
    assert eng.keyspaces["u"] == DOCS


def test_explain_execute_explains_the_prepared_statement(eng: LocalEngine) -> None:
    eng.execute("PREPARE gone FROM DELETE FROM u WHERE x = $1")
    [plan] = eng.query("EXPLAIN EXECUTE gone USING [2]")
    assert plan["statement"] == "DELETE"
    assert plan["query"]["plan"][1]["condition"] == "u.x = $1"
    eng.execute("PREPARE seen FROM EXPLAIN SELECT x FROM u")
    [again] = eng.query("EXPLAIN EXECUTE seen")  # already an EXPLAIN: explained once
    assert again["statement"] == "SELECT"
    assert eng.keyspaces["u"] == DOCS


def test_explain_names_a_missing_keyspace(eng: LocalEngine) -> None:
    for sql in (
        "EXPLAIN DELETE FROM nope",
        "EXPLAIN INSERT INTO nope VALUES ('k', {})",
        "EXPLAIN MERGE INTO nope USING [] AS s ON KEY s.k WHEN MATCHED THEN DELETE",
    ):
        with pytest.raises(ShardexError) as err:
            eng.execute(sql)
        assert err.value.code is ErrorCode.KEYSPACE_NOT_FOUND, sql
        assert err.value.details["keyspace"] == "nope"


def test_explain_needs_the_privileges_of_what_it_explains() -> None:
    reader = Principal("user", "r", ("query_select(u)",))
    writer = Principal("user", "w", ("query_update(u)",))
    for sql in (
        "EXPLAIN DELETE FROM u",
        "EXPLAIN UPDATE u SET y = 1",
        "EXPLAIN UPSERT INTO u VALUES ('k', {})",
    ):
        with pytest.raises(AuthFailed):
            check_statement(reader, parse_statement(sql))
        check_statement(writer, parse_statement(sql))
    check_statement(reader, parse_statement("EXPLAIN SELECT * FROM u"))
