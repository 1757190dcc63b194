"""LocalEngine end to end: SELECT over in-memory keyspaces, grouping, ordering, parameters,
DML, EXPLAIN and bad input (clear errors that change nothing)."""

from __future__ import annotations

import copy

import pytest

from shardex.errors import ErrorCode, ShardexError
from shardex.sql.local import LocalEngine

DOCS = {
    "u1": {"name": "Ann", "age": 41, "city": "Oslo", "tags": ["a", "b"]},
    "u2": {"name": "Bo", "age": 30, "city": "Rome", "tags": ["b"]},
    "u3": {"name": "Cy", "age": 30, "city": "Oslo", "tags": []},
    "u4": {"name": "Di", "city": None},
}


@pytest.fixture
def eng() -> LocalEngine:
    e = LocalEngine()
    e.create_keyspace("users")
    e.keyspaces["users"].update(copy.deepcopy(DOCS))
    return e


def test_select_where_order_limit(eng: LocalEngine) -> None:
    rows = eng.query("SELECT name, age FROM users WHERE age >= 30 ORDER BY age DESC, name")
    assert rows == [
        {"name": "Ann", "age": 41},
        {"name": "Bo", "age": 30},
        {"name": "Cy", "age": 30},
    ]
    assert eng.query("SELECT RAW name FROM users ORDER BY name DESC LIMIT 2 OFFSET 1") == [
        "Cy",
        "Bo",
    ]
    # MISSING sorts first ascending; an alias of the projection is usable in ORDER BY.
    assert eng.query("SELECT age AS a FROM users ORDER BY a LIMIT 2") == [{}, {"a": 30}]
    assert eng.query("SELECT age FROM users ORDER BY age NULLS LAST LIMIT 1") == [{"age": 30}]


def test_projection_forms(eng: LocalEngine) -> None:
    row = eng.query(
        "SELECT META().id, u.*, * , 1 + 1, u.name || '!' AS x FROM users u USE KEYS 'u2'"
    )
    assert row == [{"id": "u2", **DOCS["u2"], "u": DOCS["u2"], "$1": 2, "x": "Bo!"}]
    assert eng.query("SELECT 1 + 1 AS two, 'x' AS s") == [{"two": 2, "s": "x"}]
    assert sorted(eng.query("SELECT DISTINCT RAW city FROM users"), key=str) == [
        None,
        "Oslo",
        "Rome",
    ]
    assert eng.query("SELECT name FROM users WHERE ANY t IN tags SATISFIES t = 'a' END") == [
        {"name": "Ann"}
    ]
    rows = eng.query("SELECT ARRAY UPPER(t) FOR t IN tags END AS up FROM users USE KEYS 'u1'")
    assert rows == [{"up": ["A", "B"]}]
    assert eng.query("SELECT v FROM users USE KEYS ['u1'] LET v = age * 2") == [{"v": 82}]


def test_self_is_the_from_item(eng: LocalEngine) -> None:
    # SELF (a keyword, as N1QL) is the FROM item; a field named self must be back-quoted.
    eng.keyspaces["users"]["u5"] = {"name": "Ed", "self": 7}
    rows = eng.query("SELECT SELF AS s, `self` AS f FROM users u USE KEYS 'u5'")
    assert rows == [{"s": {"name": "Ed", "self": 7}, "f": 7}]
    assert eng.query("SELECT RAW name FROM users WHERE self.age = 41") == ["Ann"]
    assert eng.query("SELECT RAW OBJECT_LENGTH(self) FROM users USE KEYS 'u2'") == [4]
    assert eng.query("SELECT self FROM users USE KEYS 'u2'") == [{"$1": DOCS["u2"]}]
    with pytest.raises(ShardexError, match="SELF is the whole document"):
        eng.execute("UPDATE users SET self.x = 1")
    eng.execute("UPDATE users USE KEYS 'u2' SET `self` = 1")
    assert eng.keyspaces["users"]["u2"]["self"] == 1


def test_from_a_constant_object_is_one_row(eng: LocalEngine) -> None:
    assert eng.query("SELECT t.a, OBJECT_NAMES(t) AS n FROM {'a': 1, 'b': 2} t") == [
        {"a": 1, "n": ["a", "b"]}
    ]


def test_group_by_having_letting(eng: LocalEngine) -> None:
    rows = eng.query(
        "SELECT city, COUNT(*) AS n, AVG(age) AS avg_age, MIN(name) AS lo, "
        "COUNT(DISTINCT age) AS ages FROM users GROUP BY city LETTING big = COUNT(*) > 1 "
        "HAVING big OR city IS NULL ORDER BY n DESC"
    )
    assert rows == [
        {"city": "Oslo", "n": 2, "avg_age": 35.5, "lo": "Ann", "ages": 2},
        {"city": None, "n": 1, "avg_age": None, "lo": "Di", "ages": 0},
    ]
    assert eng.query("SELECT COUNT(*) AS n, SUM(age) AS s FROM users WHERE age > 99") == [
        {"n": 0, "s": None}
    ]
    assert eng.query(
        "SELECT LOWER(city) AS c, COUNT(*) n FROM users GROUP BY LOWER(city) ORDER BY c LIMIT 1"
    ) == [{"c": None, "n": 1}]


def test_parameters(eng: LocalEngine) -> None:
    assert eng.query("SELECT RAW name FROM users WHERE age = $1 ORDER BY name", [30]) == [
        "Bo",
        "Cy",
    ]
    assert eng.query(
        "SELECT RAW name FROM users WHERE city = $c LIMIT $n", {"c": "Rome", "n": 5}
    ) == ["Bo"]
    with pytest.raises(ShardexError, match="parameter count mismatch") as ei:
        eng.query("SELECT RAW name FROM users WHERE age = $1", [30, 31])
    assert ei.value.code is ErrorCode.BAD_REQUEST
    with pytest.raises(ShardexError, match=r"\$c"):
        eng.query("SELECT RAW name FROM users WHERE city = $c", {})


def test_dml(eng: LocalEngine) -> None:
    r = eng.execute(
        "INSERT INTO users (KEY, VALUE) VALUES ('u5', {'name': 'Ed'}), ('u6', $1)", [{"name": "Fa"}]
    )
    assert r.mutation_count == 2 and eng.keyspaces["users"]["u6"] == {"name": "Fa"}
    with pytest.raises(ShardexError) as ei:
        eng.execute("INSERT INTO users VALUES ('u7', {}), ('u1', {})")
    assert ei.value.code is ErrorCode.DOC_EXISTS and "u7" not in eng.keyspaces["users"]
    eng.execute("UPSERT INTO users VALUES ('u1', {'name': 'Ann2'})")
    assert eng.keyspaces["users"]["u1"] == {"name": "Ann2"}
    r = eng.execute(
        "UPDATE users SET age = age + 1, meta.seen = TRUE UNSET tags WHERE city = "
        "'Oslo' RETURNING name, age"
    )
    assert r.rows == [{"name": "Cy", "age": 31}]
    assert eng.keyspaces["users"]["u3"] == {
        "name": "Cy",
        "age": 31,
        "city": "Oslo",
        "meta": {"seen": True},
    }
    r = eng.execute("DELETE FROM users WHERE age = 30 OR name = 'Ed'")
    assert r.mutation_count == 2 and set(eng.keyspaces["users"]) == {"u1", "u3", "u4", "u6"}
    assert eng.execute("DELETE FROM users USE KEYS ['u6', 'nope'] LIMIT 5").mutation_count == 1


def test_explain_and_ddl(eng: LocalEngine) -> None:
    eng.execute("CREATE INDEX by_age ON users(age)")
    (plan,) = eng.query(
        "EXPLAIN SELECT name FROM users USE INDEX (by_age) WHERE age > 1 ORDER BY name LIMIT 3"
    )
    ops = [op["operator"] for op in plan["plan"]]
    assert ops == ["KeyspaceScan", "Filter", "Project", "TopN", "Limit"]
    assert plan["plan"][0]["use_index"] == ["by_age"]
    with pytest.raises(ShardexError) as ei:
        eng.query("SELECT name FROM users USE INDEX (nope)")
    assert ei.value.code is ErrorCode.INDEX_NOT_FOUND


@pytest.mark.parametrize(
    ("sql", "code", "fragment"),
    [
        ("SELECT * FROM nope", ErrorCode.KEYSPACE_NOT_FOUND, "nope"),
        ("SELECT name FROM users LIMIT 'x'", ErrorCode.BAD_REQUEST, "LIMIT"),
        ("SELECT name, COUNT(*) FROM users", ErrorCode.BAD_REQUEST, "GROUP BY"),
        ("SELECT name FROM users WHERE COUNT(*) > 1", ErrorCode.BAD_REQUEST, "WHERE"),
        ("SELECT a AS x, b AS x FROM users", ErrorCode.BAD_REQUEST, "duplicate"),
        ("SELECT META(z).id FROM users", ErrorCode.BAD_REQUEST, "META(z)"),
        ("SELECT name FROM users WHERE", ErrorCode.SQL_SYNTAX, "line 1"),
        ("INSERT INTO users VALUES (1, {})", ErrorCode.BAD_REQUEST, "key"),
    ],
)
def test_bad_input_is_a_clear_error_and_changes_nothing(
    eng: LocalEngine, sql: str, code: ErrorCode, fragment: str
) -> None:
    before = copy.deepcopy(eng.keyspaces)
    with pytest.raises(ShardexError) as ei:
        eng.execute(sql)
    assert ei.value.code is code and fragment in ei.value.message
    assert eng.keyspaces == before
