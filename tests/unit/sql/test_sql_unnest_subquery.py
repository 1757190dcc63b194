"""UNNEST and subquery expressions on the reference engine: the parser's forms, name
binding (aliases, correlation, what grouping allows) and the rows each gives, EXPLAIN."""

from __future__ import annotations

import copy

import pytest

from shardex.errors import ShardexError
from shardex.sql.local import LocalEngine
from shardex.sql.syntax import parse_statement
from shardex.sql.syntax.bind import bind_select

DOCS = {
    "u1": {"name": "Ann", "age": 41, "tags": ["a", "b"], "friend": "u2",
           "orders": [{"id": 1, "lines": [{"p": "x", "n": 2}, {"p": "y", "n": 1}]}]},
    "u2": {"name": "Bo", "age": 30, "tags": ["b"], "friend": ["u1", "u3"],
           "orders": [{"id": 2, "lines": []}, {"id": 3, "lines": [{"p": "x", "n": 5}]}]},
    "u3": {"name": "Cy", "age": 30, "tags": []},
    "u4": {"name": "Di", "tags": "not an array"},
}  # fmt: skip


@pytest.fixture
def eng() -> LocalEngine:
    e = LocalEngine()
    e.create_keyspace("users")
    e.keyspaces["users"].update(copy.deepcopy(DOCS))
    return e


# -- UNNEST -------------------------------------------------------------------------------------


def test_unnest_gives_a_row_per_element_and_drops_non_arrays(eng: LocalEngine) -> None:
    rows = eng.query("SELECT u.name, t FROM users AS u UNNEST u.tags AS t ORDER BY u.name, t")
    assert rows == [{"name": "Ann", "t": "a"}, {"name": "Ann", "t": "b"}, {"name": "Bo", "t": "b"}]
    # INNER UNNEST is the same; a bare name is a field of the FROM term.
    assert eng.query("SELECT RAW t FROM users INNER UNNEST tags t ORDER BY t") == ["a", "b", "b"]


def test_left_unnest_keeps_rows_without_elements(eng: LocalEngine) -> None:
    rows = eng.query(
        "SELECT u.name, t FROM users u LEFT OUTER UNNEST u.tags AS t ORDER BY u.name, t"
    )
    assert rows == [
        {"name": "Ann", "t": "a"},
        {"name": "Ann", "t": "b"},
        {"name": "Bo", "t": "b"},
        {"name": "Cy"},  # empty array: kept once, t MISSING
        {"name": "Di"},  # not an array: kept once
    ]
    assert len(eng.query("SELECT u.name FROM users u LEFT UNNEST u.tags t")) == 5


def test_chained_unnests_where_group_order(eng: LocalEngine) -> None:
    sql = (
        "SELECT l.p, SUM(l.n) AS n, COUNT(*) AS c FROM users u UNNEST u.orders o "
        "UNNEST o.lines l WHERE l.n > 1 GROUP BY l.p ORDER BY l.p"
    )
    assert eng.query(sql) == [{"p": "x", "n": 7, "c": 2}]
    # A later UNNEST reads an earlier one's alias; LEFT keeps the order without lines.
    rows = eng.query(
        "SELECT o.id, l.p FROM users u UNNEST u.orders o LEFT UNNEST o.lines l ORDER BY o.id, l.p"
    )
    assert rows == [{"id": 1, "p": "x"}, {"id": 1, "p": "y"}, {"id": 2}, {"id": 3, "p": "x"}]


def test_select_star_has_every_from_alias(eng: LocalEngine) -> None:
    rows = eng.query("SELECT * FROM users u UNNEST u.tags t WHERE u.name = 'Bo'")
    assert rows == [{"u": DOCS["u2"], "t": "b"}]


def test_unnest_alias_errors_and_names() -> None:
    with pytest.raises(ShardexError, match="already bound"):
        bind_select(parse_statement("SELECT 1 FROM users u UNNEST u.tags u"))  # type: ignore[arg-type]
    # LEFT stays usable as an alias and a field name where no UNNEST follows.
    stmt = parse_statement("SELECT left FROM ks left")
    assert stmt.from_.alias == "left" and not stmt.unnests  # type: ignore[union-attr]
    # Without AS the alias is the path's last field.
    stmt = parse_statement("SELECT 1 FROM ks k UNNEST k.a.items")
    assert stmt.unnests[0].alias == "items"  # type: ignore[union-attr]


# -- subquery expressions -------------------------------------------------------------------


def test_correlated_subquery_over_the_outer_row(eng: LocalEngine) -> None:
    sql = (
        "SELECT u.name, (SELECT RAW SUM(o.id) FROM u.orders AS o)[0] AS s "
        "FROM users u WHERE u.age IS VALUED ORDER BY u.name"
    )
    # Cy has no orders: SUM over no rows is NULL (one row, as any global aggregate).
    expected = [{"name": "Ann", "s": 1}, {"name": "Bo", "s": 5}, {"name": "Cy", "s": None}]
    assert eng.query(sql) == expected
    # FROM over a path of the outer alias with its implied alias (N1QL's own form).
    sql = "SELECT RAW (SELECT RAW orders.id FROM users.orders) FROM users ORDER BY users.name"
    assert eng.query(sql) == [[1], [2, 3], [], []]


def test_uncorrelated_subquery_over_a_keyspace(eng: LocalEngine) -> None:
    sql = "SELECT RAW u.name FROM users u WHERE u.age = (SELECT RAW MAX(age) FROM users)[0]"
    assert eng.query(sql) == ["Ann"]
    # Inside a subquery a FROM name the enclosing query binds is that variable (N1QL's
    # expression term), not the keyspace: here each outer document alone.
    sql = "SELECT RAW (SELECT RAW MAX(age) FROM users)[0] FROM users ORDER BY name"
    assert eng.query(sql) == [41, 30, 30, None]
    # With USE KEYS the name is the keyspace.
    sql = "SELECT RAW (SELECT RAW v.name FROM users v USE KEYS 'u2')[0] FROM users ORDER BY name"
    assert eng.query(sql) == ["Bo"] * 4
    sql = "SELECT RAW (SELECT RAW name FROM users USE KEYS 'u2')[0] FROM users ORDER BY name"
    assert eng.query(sql) == ["Bo"] * 4
    assert eng.query("SELECT RAW (SELECT RAW COUNT(*) FROM users)[0]") == [4]
    # A parameter inside the subquery is the statement's.
    sql = (
        "SELECT RAW u.name FROM users u WHERE u.name IN (SELECT RAW name FROM users WHERE age > $1)"
    )
    assert eng.query(sql, [35]) == ["Ann"]
    with pytest.raises(ShardexError):
        eng.query(sql)  # $1 is not given


def test_exists_in_any_over_subqueries(eng: LocalEngine) -> None:
    exists = (
        "SELECT RAW u.name FROM users u WHERE EXISTS "
        "(SELECT 1 FROM u.orders o UNNEST o.lines l WHERE l.p = 'y') ORDER BY u.name"
    )
    assert eng.query(exists) == ["Ann"]
    not_exists = exists.replace("WHERE EXISTS", "WHERE NOT EXISTS")
    assert eng.query(not_exists) == ["Bo", "Cy", "Di"]
    any_sql = (
        "SELECT RAW u.name FROM users u WHERE ANY n IN (SELECT RAW l.n FROM u.orders o "
        "UNNEST o.lines l) SATISFIES n >= 5 END"
    )
    assert eng.query(any_sql) == ["Bo"]
    assert eng.query("SELECT RAW EXISTS (SELECT 1 FROM [] AS x)") == [False]


def test_use_keys_from_the_outer_row(eng: LocalEngine) -> None:
    sql = (
        "SELECT u.name, (SELECT RAW f.name FROM users f USE KEYS u.friend) AS friends "
        "FROM users u WHERE u.friend IS VALUED ORDER BY u.name"
    )
    assert eng.query(sql) == [
        {"name": "Ann", "friends": ["Bo"]},
        {"name": "Bo", "friends": ["Ann", "Cy"]},
    ]


def test_subqueries_in_from_and_let(eng: LocalEngine) -> None:
    sql = "SELECT t.n FROM (SELECT name AS n FROM users WHERE age > 35) AS t"
    assert eng.query(sql) == [{"n": "Ann"}]
    sql = (
        "SELECT u.name, c FROM users u LET c = ARRAY_LENGTH((SELECT RAW t FROM u.tags AS t)) "
        "WHERE c > 0 ORDER BY u.name"
    )
    # Di's tags is a string: FROM over a non-array value is one row (N1QL).
    assert eng.query(sql) == [
        {"name": "Ann", "c": 2},
        {"name": "Bo", "c": 1},
        {"name": "Di", "c": 1},
    ]


def test_grouping_rules_for_correlated_subqueries(eng: LocalEngine) -> None:
    # Correlated on a group key's variable: not allowed (the group has no single row).
    with pytest.raises(ShardexError, match="group keys or aggregates"):
        eng.query(
            "SELECT COUNT(*) AS n FROM users u GROUP BY u.age "
            "LETTING x = (SELECT RAW 1 FROM u.tags AS t)"
        )
    # An aggregate inside the subquery over its own rows is fine.
    sql = "SELECT RAW (SELECT RAW COUNT(*) FROM u.tags AS t)[0] FROM users u ORDER BY u.name"
    assert eng.query(sql) == [2, 1, 0, 1]


def test_explain_shows_unnest_and_subqueries(eng: LocalEngine) -> None:
    (plan,) = eng.query(
        "EXPLAIN SELECT t FROM users u LEFT UNNEST u.tags t "
        "WHERE EXISTS (SELECT 1 FROM u.orders AS o)"
    )
    unnest = next(op for op in plan["plan"] if op["operator"] == "Unnest")
    assert unnest == {"operator": "Unnest", "expr": "u.tags", "as": "t", "outer": True}
    (sub,) = plan["subqueries"]
    assert sub["correlated"] == ["u"] and sub["keyspaces"] == []
    assert sub["plan"][0]["operator"] == "ExpressionScan"


def test_meta_of_an_enclosing_alias_inside_subqueries(eng: LocalEngine) -> None:
    sql = (
        "SELECT (SELECT RAW META(u).id || ':' || META().id FROM users v USE KEYS META(u).id) "
        "AS s, (SELECT RAW (SELECT RAW META(u).id FROM [2] y)[0] FROM [1] x) AS nested "
        "FROM users u WHERE u.age > 35"
    )
    assert eng.query(sql) == [{"s": ["u1:u1"], "nested": ["u1"]}]
    with pytest.raises(ShardexError, match="META\\(zz\\)"):
        eng.query("SELECT (SELECT RAW META(zz).id FROM [1] x) FROM users u")
