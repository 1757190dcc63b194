"""PREPARE / EXECUTE and INSERT / UPSERT ... SELECT: the parser, and the semantics on
``LocalEngine`` (the node's ``SqlService`` runs the same ``PreparedStatements`` and
``inserted_values``; tests/cluster/test_sql_setops_cluster.py runs both on real nodes)."""

from __future__ import annotations

import pytest

from shardex.api.privileges import AuthFailed, Principal
from shardex.errors import ErrorCode, ShardexError
from shardex.sql.exec.service import check_statement
from shardex.sql.local import LocalEngine
from shardex.sql.prepared import PreparedStatements
from shardex.sql.syntax import InsertStmt, SelectStmt, parse_statement
from shardex.sql.syntax.ast import ExecuteStmt, PrepareStmt, SetOpStmt, WithStmt


@pytest.fixture
def eng() -> LocalEngine:
    e = LocalEngine()
    e.create_keyspace("src")
    e.create_keyspace("dst")
    e.keyspaces["src"].update({f"s{i}": {"n": i, "g": "ab"[i % 2]} for i in range(6)})
    return e


# -- parser ------------------------------------------------------------------------------------


def test_prepare_and_execute_forms() -> None:
    p = parse_statement("PREPARE q1 FROM SELECT n FROM src WHERE n > $1;")
    assert isinstance(p, PrepareStmt) and p.name == "q1" and not p.force
    assert p.text == "SELECT n FROM src WHERE n > $1" and isinstance(p.statement, SelectStmt)
    forced = parse_statement("PREPARE FORCE 'a name' AS SELECT 1 UNION SELECT 2")
    assert isinstance(forced, PrepareStmt) and forced.force and forced.name == "a name"
    assert isinstance(forced.statement, SetOpStmt)
    unnamed = parse_statement("PREPARE WITH t AS (1) SELECT t")
    assert isinstance(unnamed, PrepareStmt) and isinstance(unnamed.statement, WithStmt)
    assert unnamed.name.startswith("p") and len(unnamed.name) > 8
    e = parse_statement("EXECUTE q1 USING [5]")
    assert isinstance(e, ExecuteStmt) and e.name == "q1" and e.using is not None
    assert parse_statement("EXECUTE `q1`") == ExecuteStmt("q1")


def test_insert_select_forms() -> None:
    s = parse_statement(
        "INSERT INTO dst (KEY 'c_' || id, VALUE {'n': n}) SELECT META().id AS id, n FROM src "
        "WHERE n > 2 RETURNING META().id"
    )
    assert isinstance(s, InsertStmt) and s.values == () and s.returning
    assert s.select_text == "SELECT META().id AS id, n FROM src WHERE n > 2"
    assert s.key is not None and s.value is not None
    u = parse_statement("UPSERT INTO dst (KEY k) WITH t AS ([1]) SELECT RAW {'k': 'x'}")
    assert isinstance(u, InsertStmt) and u.upsert and u.value is None
    assert isinstance(u.select, WithStmt)


@pytest.mark.parametrize(
    ("sql", "says"),
    [
        ("PREPARE q FROM CREATE PRIMARY INDEX ON src", "CREATE cannot be prepared"),
        ("PREPARE q FROM PREPARE r FROM SELECT 1", "PREPARE cannot be prepared"),
        ("PREPARE q FROM", "empty statement"),
        ("EXECUTE", "the name of a prepared statement"),
        ("EXECUTE 5", "the name of a prepared statement"),
        ("EXECUTE q USING", "expected an expression"),
        ("INSERT INTO dst (KEY k VALUE v) SELECT 1", "')' after the KEY and VALUE"),
        ("INSERT INTO dst (KEY k) VALUES ('a', {})", "the SELECT whose results are inserted"),
        ("INSERT INTO dst (KEY k, n) SELECT 1", "expected VALUE"),
    ],
)
def test_malformed_forms_are_syntax_errors(sql: str, says: str) -> None:
    with pytest.raises(ShardexError) as err:
        parse_statement(sql)
    assert err.value.code is ErrorCode.SQL_SYNTAX
    assert says in str(err.value)


# -- PREPARE / EXECUTE ---------------------------------------------------------------------------


def test_execute_with_positional_and_named_parameters(eng: LocalEngine) -> None:
    [row] = eng.query("PREPARE big FROM SELECT RAW n FROM src WHERE n >= $1 ORDER BY n")
    assert row == {"name": "big", "text": "SELECT RAW n FROM src WHERE n >= $1 ORDER BY n"}
    assert eng.query("EXECUTE big USING [4]") == [4, 5]
    assert eng.query("EXECUTE big", [3]) == [3, 4, 5]
    eng.query("PREPARE g AS SELECT RAW n FROM src WHERE g = $g ORDER BY n")
    assert eng.query("EXECUTE g USING {'g': 'b'}") == [1, 3, 5]
    assert eng.query("EXECUTE g", {"g": "a"}) == [0, 2, 4]


def test_prepared_dml_and_set_operations(eng: LocalEngine) -> None:
    eng.query("PREPARE ins FROM INSERT INTO dst (KEY, VALUE) VALUES ($1, {'v': $2})")
    assert eng.execute("EXECUTE ins USING ['k1', 10]").mutation_count == 1
    assert eng.keyspaces["dst"]["k1"] == {"v": 10}
    eng.query("PREPARE u FROM SELECT RAW n FROM src WHERE n < 2 UNION SELECT RAW 9")
    assert sorted(eng.query("EXECUTE u")) == [0, 1, 9]


def test_prepare_errors(eng: LocalEngine) -> None:
    eng.query("PREPARE q FROM SELECT 1")
    eng.query("PREPARE q FROM SELECT 1")  # the same text again: fine
    with pytest.raises(ShardexError, match="prepared as 'q' already") as err:
        eng.query("PREPARE q FROM SELECT 2")
    assert "PREPARE FORCE" in err.value.details["hint"]
    eng.query("PREPARE FORCE q FROM SELECT RAW 2")
    assert eng.query("EXECUTE q") == [2]
    with pytest.raises(ShardexError, match="no statement is prepared as 'nope'"):
        eng.query("EXECUTE nope")
    with pytest.raises(ShardexError, match="USING and with the request both"):
        eng.query("EXECUTE q USING [1]", [1])
    with pytest.raises(ShardexError, match="takes an array or an object"):
        eng.query("EXECUTE q USING 5")
    with pytest.raises(ShardexError, match="not allowed in WHERE"):
        eng.query("PREPARE bad FROM SELECT 1 FROM src WHERE RANK() OVER () > 1")
    with pytest.raises(ShardexError, match="no statement is prepared as 'bad'"):
        eng.query("EXECUTE bad")


def test_the_least_recently_used_name_is_forgotten_past_the_limit() -> None:
    names = PreparedStatements(limit=3)
    for i in range(3):
        names.prepare(parse_statement(f"PREPARE q{i} FROM SELECT {i}"))  # type: ignore[arg-type]
    names.text("q0")  # used: q1 is now the oldest
    names.prepare(parse_statement("PREPARE q3 FROM SELECT 3"))  # type: ignore[arg-type]
    assert names.text("q0") == "SELECT 0"
    with pytest.raises(ShardexError, match="no statement is prepared as 'q1'"):
        names.text("q1")


# -- INSERT / UPSERT ... SELECT ------------------------------------------------------------------


def test_insert_select_keys_values_and_returning(eng: LocalEngine) -> None:
    res = eng.execute(
        "INSERT INTO dst (KEY 'c_' || id, VALUE {'n': n * 10, 'from': id}) "
        "SELECT META().id AS id, n FROM src WHERE n >= $1 RETURNING META().id AS k, n",
        [4],
    )
    assert res.mutation_count == 2
    assert sorted(res.rows, key=lambda r: r["k"]) == [
        {"k": "c_s4", "n": 40},
        {"k": "c_s5", "n": 50},
    ]
    assert eng.keyspaces["dst"]["c_s4"] == {"n": 40, "from": "s4"}


def test_without_value_the_row_is_the_document(eng: LocalEngine) -> None:
    eng.execute("INSERT INTO dst (KEY k) SELECT 'x' || TOSTRING(n) AS k, g FROM src WHERE n < 2")
    assert eng.keyspaces["dst"] == {"x0": {"k": "x0", "g": "a"}, "x1": {"k": "x1", "g": "b"}}


def test_upsert_select_over_with_and_set_operations(eng: LocalEngine) -> None:
    eng.keyspaces["dst"]["a"] = {"old": True}
    sql = (
        "UPSERT INTO dst (KEY SELF.g, VALUE {'count': SELF.c}) WITH t AS (SELECT RAW g FROM src) "
        "SELECT g, COUNT(*) AS c FROM t AS g GROUP BY g"
    )
    assert eng.execute(sql).mutation_count == 2
    assert eng.keyspaces["dst"] == {"a": {"count": 3}, "b": {"count": 3}}
    union = (
        "UPSERT INTO dst (KEY SELF, VALUE {'u': TRUE}) SELECT RAW g FROM src UNION SELECT RAW 'z'"
    )
    assert eng.execute(union).mutation_count == 3


def test_insert_select_is_checked_before_any_write(eng: LocalEngine) -> None:
    with pytest.raises(ShardexError) as err:
        eng.execute("INSERT INTO dst (KEY g) SELECT g FROM src")  # 'a' three times
    assert err.value.code is ErrorCode.DOC_EXISTS
    assert eng.keyspaces["dst"] == {}
    with pytest.raises(ShardexError, match="document key must be a non-empty string"):
        eng.execute("INSERT INTO dst (KEY n) SELECT n FROM src")
    assert eng.keyspaces["dst"] == {}


def test_insert_select_needs_select_on_what_it_reads() -> None:
    writer = Principal("user", "w", ("query_update(dst)",))
    both = Principal("user", "b", ("query_update(dst)", "query_select(src)"))
    sql = "INSERT INTO dst (KEY k) SELECT META().id AS k FROM src"
    with pytest.raises(AuthFailed) as err:
        check_statement(writer, parse_statement(sql))
    assert err.value.details["keyspace"] == "src"
    check_statement(both, parse_statement(sql))
