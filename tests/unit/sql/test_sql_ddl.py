"""The index DDL statement parser: every construct, and every error with its position."""

from __future__ import annotations

import pytest

from shardex.errors import ErrorCode, ShardexError
from shardex.sql import (
    BuildIndexStmt,
    CreateIndexStmt,
    DropIndexStmt,
    parse_ddl,
    parse_index_key,
)

# --- constructs -------------------------------------------------------------------------


def test_create_index_full() -> None:
    stmt = parse_ddl(
        "CREATE INDEX by_age ON users(age DESC, LOWER(name) ASC, address.city)\n"
        "  WHERE age > 18 AND active\n"
        "  PARTITION BY HASH(META().id)\n"
        '  WITH {"num_partition": 8, "defer_build": true, "nodes": ["node1", "node2"]};'
    )
    assert stmt == CreateIndexStmt(
        keyspace="users",
        name="by_age",
        keys=(("age", True), ("LOWER(name)", False), ("address.city", False)),
        where="age > 18 AND active",
        partition_by=("META().id",),
        num_partition=8,
        defer_build=True,
        nodes=("node1", "node2"),
    )


def test_create_index_minimal_and_case_insensitive() -> None:
    stmt = parse_ddl("create index i on ks(a)")
    assert stmt == CreateIndexStmt(keyspace="ks", name="i", keys=(("a", False),))


def test_partition_by_before_where_and_using_gsi() -> None:
    stmt = parse_ddl("CREATE INDEX i ON ks(a) PARTITION BY HASH(a, b) WHERE b = 1 USING GSI")
    assert isinstance(stmt, CreateIndexStmt)
    assert stmt.partition_by == ("a", "b") and stmt.where == "b = 1"


def test_expressions_are_canonical_text() -> None:
    stmt = parse_ddl("CREATE INDEX i ON ks( `first name` , a.b[0], x+1 ) WHERE 'x' = y")
    assert isinstance(stmt, CreateIndexStmt)
    assert stmt.keys == (("`first name`", False), ("a.b[0]", False), ("x + 1", False))
    assert stmt.where == '"x" = y'


def test_names_back_ticks_and_dashes() -> None:
    stmt = parse_ddl("CREATE INDEX `index` ON my-ks-2(a)")
    assert isinstance(stmt, CreateIndexStmt)
    assert stmt.name == "index" and stmt.keyspace == "my-ks-2"
    # a space around '-' makes it an operator, not part of the name
    with pytest.raises(ShardexError) as err:
        parse_ddl("CREATE INDEX i ON my - ks(a)")
    assert err.value.details["token"] == "-"


def test_create_primary_index() -> None:
    assert parse_ddl("CREATE PRIMARY INDEX ON ks") == CreateIndexStmt(
        keyspace="ks", name=None, is_primary=True
    )
    stmt = parse_ddl('CREATE PRIMARY INDEX pk ON ks WITH {"defer_build": true}')
    assert stmt == CreateIndexStmt(keyspace="ks", name="pk", is_primary=True, defer_build=True)
    stmt = parse_ddl("CREATE PRIMARY INDEX ON ks PARTITION BY HASH(META().id)")
    assert isinstance(stmt, CreateIndexStmt) and stmt.partition_by == ("META().id",)


def test_with_variants() -> None:
    stmt = parse_ddl("CREATE INDEX i ON ks(a) WITH {num_partition: 2.0, `nodes`: 'n1'}")
    assert isinstance(stmt, CreateIndexStmt)
    assert stmt.num_partition == 2 and stmt.nodes == ("n1",)
    stmt = parse_ddl("CREATE INDEX i ON ks(a) WITH {}")
    assert isinstance(stmt, CreateIndexStmt) and stmt.num_partition is None
    assert stmt.num_replica == 0
    stmt = parse_ddl('CREATE INDEX i ON ks(a) WITH {"num_replica": 2, "defer_build": true}')
    assert isinstance(stmt, CreateIndexStmt) and stmt.num_replica == 2 and stmt.defer_build
    stmt = parse_ddl("CREATE PRIMARY INDEX ON ks WITH {num_replica: 1.0}")
    assert isinstance(stmt, CreateIndexStmt) and stmt.num_replica == 1


def test_build_index() -> None:
    assert parse_ddl("BUILD INDEX ON ks(a, `b`, c-1)") == BuildIndexStmt(
        keyspace="ks", names=("a", "b", "c-1")
    )


def test_drop_forms() -> None:
    assert parse_ddl("DROP INDEX ks.i") == DropIndexStmt(keyspace="ks", name="i")
    assert parse_ddl("DROP INDEX `my ks`.`my i`;") == DropIndexStmt(keyspace="my ks", name="my i")
    assert parse_ddl("DROP INDEX i ON ks") == DropIndexStmt(keyspace="ks", name="i")
    assert parse_ddl("DROP PRIMARY INDEX ON ks") == DropIndexStmt(
        keyspace="ks", name=None, is_primary=True
    )
    assert parse_ddl("DROP PRIMARY INDEX pk ON ks") == DropIndexStmt(
        keyspace="ks", name="pk", is_primary=True
    )


def test_parse_index_key() -> None:
    assert parse_index_key("age") == ("age", False)
    assert parse_index_key("age DESC") == ("age", True)
    assert parse_index_key("LOWER(name) asc") == ("LOWER(name)", False)
    with pytest.raises(ShardexError) as err:
        parse_index_key("age DESC x")
    assert err.value.details["column"] == 10


# --- errors: code SQL_SYNTAX, message and details name line, column and token ----------------

ERRORS = [
    # (statement, line, column, token, words in the message)
    ("", 1, 1, "", "expected CREATE, BUILD or DROP"),
    ("SELECT 1", 1, 1, "SELECT", "expected CREATE, BUILD or DROP"),
    ("CREATE TABLE t", 1, 8, "TABLE", "expected INDEX"),
    ("CREATE INDEX ON ks(a)", 1, 14, "ON", "reserved word 'ON' cannot be an index name"),
    ("CREATE INDEX 1x ON ks(a)", 1, 14, "1x", "malformed number"),
    ("CREATE INDEX i ks(a)", 1, 16, "ks", "expected ON"),
    ("CREATE INDEX i ON (a)", 1, 19, "(", "expected a keyspace name"),
    ("CREATE INDEX i ON ks", 1, 21, "", "expected '(' and the index key expressions"),
    ("CREATE INDEX i ON ks()", 1, 22, ")", "expected an expression"),
    ("CREATE INDEX i ON ks(a", 1, 23, "", "expected ASC, DESC, ',' or ')'"),
    ("CREATE INDEX i ON ks(a b)", 1, 24, "b", "expected ASC, DESC, ',' or ')'"),
    ("CREATE INDEX i ON ks(a +)", 1, 25, ")", "expected an expression"),
    ("CREATE INDEX i ON ks(NOPE(a))", 1, 22, "NOPE", "unknown function 'NOPE'"),
    ("CREATE INDEX i ON ks(a) WHERE", 1, 30, "", "expected an expression"),
    ("CREATE INDEX i ON ks(a) WHERE a WHERE b", 1, 33, "WHERE", "WHERE given twice"),
    ("CREATE INDEX i ON ks(a) PARTITION HASH(a)", 1, 35, "HASH", "expected BY"),
    ("CREATE INDEX i ON ks(a) PARTITION BY RANGE(a)", 1, 38, "RANGE", "expected HASH"),
    ("CREATE INDEX i ON ks(a) PARTITION BY HASH()", 1, 43, ")", "expected an expression"),
    ("CREATE INDEX i ON ks(a) USING VIEW", 1, 31, "VIEW", "expected GSI"),
    ("CREATE INDEX i ON ks(a) WITH []", 1, 30, "[", "WITH takes a JSON object"),
    ('CREATE INDEX i ON ks(a) WITH {"x": 1}', 1, 31, '"x"', "unknown WITH option 'x'"),
    ("CREATE INDEX i ON ks(a) WITH {1: 1}", 1, 31, "1", "expected an option name"),
    ('CREATE INDEX i ON ks(a) WITH {"nodes" ["a"]}', 1, 39, "[", "expected ':'"),
    ('CREATE INDEX i ON ks(a) WITH {"num_partition": 0}', 1, 48, "0", "in 1..1024"),
    ('CREATE INDEX i ON ks(a) WITH {"num_partition": 1025}', 1, 48, "1025", "in 1..1024"),
    ('CREATE INDEX i ON ks(a) WITH {"num_partition": "4"}', 1, 48, '"4"', "an integer"),
    ('CREATE INDEX i ON ks(a) WITH {"num_partition": 1.5}', 1, 48, "1.5", "an integer"),
    ('CREATE INDEX i ON ks(a) WITH {"num_partition": x}', 1, 48, "x", "must be a constant"),
    ('CREATE INDEX i ON ks(a) WITH {"defer_build": 1}', 1, 46, "1", "true or false"),
    ('CREATE INDEX i ON ks(a) WITH {"num_replica": 4}', 1, 46, "4", "in 0..3"),
    ('CREATE INDEX i ON ks(a) WITH {"num_replica": -1}', 1, 46, "-", "in 0..3"),
    ('CREATE INDEX i ON ks(a) WITH {"num_replica": true}', 1, 46, "true", "an integer"),
    ('CREATE INDEX i ON ks(a) WITH {"nodes": []}', 1, 40, "[", "non-empty list"),
    ('CREATE INDEX i ON ks(a) WITH {"nodes": [1]}', 1, 40, "[", "node names"),
    ('CREATE INDEX i ON ks(a) WITH {"nodes": ["a", "a"]}', 1, 40, "[", "a node twice"),
    (
        'CREATE INDEX i ON ks(a) WITH {"nodes": ["a"], "nodes": ["b"]}',
        1,
        47,
        '"nodes"',
        "given twice",
    ),
    ('CREATE INDEX i ON ks(a) WITH {"nodes": ["a"] x', 1, 46, "x", "expected ',' or '}'"),
    ("CREATE INDEX i ON ks(a) extra", 1, 25, "extra", "expected the end of the statement"),
    ("CREATE INDEX i ON ks(a);;", 1, 25, ";", "expected the end of the statement"),
    ("CREATE PRIMARY INDEX ON ks(a)", 1, 27, "(", "a primary index takes no key list"),
    ("CREATE PRIMARY INDEX ON ks WHERE a", 1, 28, "WHERE", "a primary index has no WHERE"),
    ("CREATE INDEX i\nON ks(a)\nWHERE 'open", 3, 7, "'open", "unterminated string"),
    ("BUILD INDEX ks(a)", 1, 13, "ks", "expected ON"),
    ("BUILD INDEX ON ks", 1, 18, "", "expected '(' and the index names"),
    ("BUILD INDEX ON ks()", 1, 19, ")", "expected an index name"),
    ("BUILD INDEX ON ks(a, a)", 1, 22, "a", "named twice"),
    ("BUILD INDEX ON ks(a b)", 1, 21, "b", "expected ',' or ')'"),
    ("DROP INDEX i", 1, 13, "", "expected '.' and the index name, or ON and the keyspace"),
    ("DROP INDEX ks.", 1, 15, "", "expected an index name"),
    ("DROP INDEX i ON", 1, 16, "", "expected a keyspace name"),
    ("DROP PRIMARY INDEX ks", 1, 22, "", "expected ON"),
    ("DROP TABLE t", 1, 6, "TABLE", "expected INDEX"),
]


@pytest.mark.parametrize(("text", "line", "column", "token", "words"), ERRORS)
def test_errors_name_line_column_and_token(
    text: str, line: int, column: int, token: str, words: str
) -> None:
    with pytest.raises(ShardexError) as err:
        parse_ddl(text)
    e = err.value
    assert e.code is ErrorCode.SQL_SYNTAX
    assert (e.details["line"], e.details["column"], e.details["token"]) == (line, column, token)
    assert f"line {line}, column {column}" in e.message
    assert words in e.message, e.message
    assert e.details["text"] == text


def test_not_a_string() -> None:
    with pytest.raises(TypeError):
        parse_ddl(123)  # type: ignore[arg-type]
