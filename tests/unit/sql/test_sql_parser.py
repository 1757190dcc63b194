"""The SQL++ statement parser: every statement form and error positions."""

from __future__ import annotations

import pytest

from shardex.core.expr import Field, Identifier, Literal, Param
from shardex.errors import ErrorCode, ShardexError
from shardex.sql.ddl import CreateIndexStmt, DropIndexStmt
from shardex.sql.syntax import (
    Aggregate,
    ArrayComprehension,
    CollectionPredicate,
    DeleteStmt,
    ExplainStmt,
    InsertStmt,
    SelectStmt,
    UpdateStmt,
    parse_statement,
)


def sel(text: str) -> SelectStmt:
    stmt = parse_statement(text)
    assert isinstance(stmt, SelectStmt)
    return stmt


def test_select_all_clauses() -> None:
    s = sel(
        "SELECT DISTINCT a.b AS x, c.*, * FROM ks AS k USE INDEX (i1, i2) LET v = 1 "
        "WHERE x > $1 GROUP BY a LETTING z = 2 HAVING COUNT(*) > $min "
        "ORDER BY x DESC NULLS FIRST, y LIMIT 3 OFFSET 2;"
    )
    assert s.distinct and not s.raw
    assert s.terms[0].alias == "x" and s.terms[0].expr == Field(Identifier("a"), "b")
    assert s.terms[1].star and s.terms[1].expr == Identifier("c")
    assert s.terms[2].star and s.terms[2].expr is None
    assert s.from_ is not None and (s.from_.name, s.from_.alias) == ("ks", "k")
    assert s.from_.use_index == ("i1", "i2")
    assert s.let[0][0] == "v" and s.letting[0][0] == "z"
    assert s.where is not None and Param("1") in s.where.children()
    assert s.group_by == (Identifier("a"),)
    assert s.having is not None and s.having.children()[0] == Aggregate("COUNT", None)
    assert [(o.desc, o.nulls_first) for o in s.order_by] == [(True, True), (False, None)]
    assert s.limit == Literal(3) and s.offset == Literal(2)


def test_select_variants() -> None:
    assert sel("SELECT 1+1").from_ is None
    raw = sel("select raw name from ks")
    assert raw.raw and len(raw.terms) == 1
    assert sel("SELECT VALUE x FROM ks").raw
    # OFFSET before LIMIT, implicit aliases, USE KEYS.
    s = sel("SELECT a x, `b` `y z` FROM ks k USE KEYS ['a', 'b'] OFFSET 1 LIMIT 2")
    assert [t.alias for t in s.terms] == ["x", "y z"] and s.from_ and s.from_.alias == "k"
    assert s.from_.use_keys is not None and s.limit == Literal(2) and s.offset == Literal(1)
    assert sel("SELECT META().id FROM ks").terms[0].expr.to_text() == "META().id"
    assert sel("SELECT META(k).id FROM ks k").terms[0].expr.to_text() == "META(k).id"
    agg = sel("SELECT COUNT(DISTINCT a), SUM(b), ARRAY_AGG(c) FROM ks")
    assert agg.terms[0].expr == Aggregate("COUNT", Identifier("a"), True)
    src = sel('SELECT t.a FROM ([{"a": 1}]) t')
    assert src.from_ is not None and src.from_.source is not None


def test_comprehensions() -> None:
    s = sel(
        "SELECT a FROM ks WHERE ANY v IN xs SATISFIES v > 1 END AND EVERY w IN ys SATISFIES w END"
    )
    kinds = [type(c).__name__ for c in s.where.children()]  # type: ignore[union-attr]
    assert kinds == ["CollectionPredicate", "CollectionPredicate"]
    arr = sel("SELECT ARRAY v.x FOR v IN xs WHEN v.y END AS r FROM ks").terms[0].expr
    assert isinstance(arr, ArrayComprehension) and arr.when is not None
    both = sel("SELECT 1 FROM ks WHERE ANY AND EVERY v IN xs SATISFIES v END").where
    assert isinstance(both, CollectionPredicate) and both.quantifier == "ANY AND EVERY"


def test_explain_and_dml() -> None:
    assert isinstance(parse_statement("EXPLAIN SELECT a FROM ks"), ExplainStmt)
    ins = parse_statement('INSERT INTO ks (KEY, VALUE) VALUES ("a", {"x": 1}), VALUES ("b", 2)')
    assert isinstance(ins, InsertStmt) and not ins.upsert and len(ins.values) == 2
    up = parse_statement("UPSERT INTO ks VALUES ('a', 1) RETURNING ks.*")
    assert isinstance(up, InsertStmt) and up.upsert and up.returning
    d = parse_statement("DELETE FROM ks USE KEYS 'a' WHERE x = 1 LIMIT 1")
    assert isinstance(d, DeleteStmt) and d.target.use_keys is not None and d.limit is not None
    u = parse_statement("UPDATE ks AS k SET a.b[0] = 1, c = c + 1 UNSET d WHERE e")
    assert isinstance(u, UpdateStmt) and len(u.set) == 2 and len(u.unset) == 1
    assert isinstance(parse_statement("CREATE INDEX i ON ks(a)"), CreateIndexStmt)
    assert isinstance(parse_statement("DROP INDEX ks.i"), DropIndexStmt)


@pytest.mark.parametrize(
    ("text", "line", "column", "token"),
    [
        ("SELEC 1", 1, 1, "SELEC"),
        ("SELECT a FROM", 1, 14, ""),
        ("SELECT a\nFROM ks\nWHERE a = = 1", 3, 11, "="),
        ("SELECT a FROM ks ORDER a", 1, 24, "a"),
        ("SELECT a FROM ks LIMIT 1 extra", 1, 26, "extra"),
        ("SELECT SUM(*) FROM ks", 1, 12, "*"),
        ("UPDATE ks WHERE a", 1, 11, "WHERE"),
        ("UPDATE ks SET f(a) = 1", 1, 15, "f"),
        ("SELECT 'abc", 1, 8, "'abc"),
        ("SELECT ANY v IN xs END", 1, 20, "END"),
        ("SELECT a FROM ks ORDER BY a NULLS MIDDLE", 1, 35, "MIDDLE"),
    ],
)
def test_errors_name_line_column_token(text: str, line: int, column: int, token: str) -> None:
    with pytest.raises(ShardexError) as ei:
        parse_statement(text)
    e = ei.value
    assert e.code is ErrorCode.SQL_SYNTAX
    assert (e.details["line"], e.details["column"], e.details["token"]) == (line, column, token)
    assert f"line {line}, column {column}" in e.message


def test_reserved_word_alias_hint() -> None:
    with pytest.raises(ShardexError) as ei:
        parse_statement("SELECT a AS select FROM ks")
    assert "back-ticks" in ei.value.message
    assert sel("SELECT a AS `select` FROM ks").terms[0].alias == "select"
