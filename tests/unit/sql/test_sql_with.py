"""WITH (common table expressions): the parser, the semantics on ``LocalEngine`` (a term
evaluated once per statement, usable in FROM and in expressions, shadowed by the query's own
names), WITH inside a subquery expression, and what the distributed path relies on: the
terms' values travel as parameters, so a member binds a query behind its WITH clause alone."""

from __future__ import annotations

from typing import Any

import pytest

from shardex.api.privileges import AuthFailed, Principal
from shardex.core.expr import Param, walk
from shardex.errors import ErrorCode, ShardexError
from shardex.sql.exec.compound import is_compound
from shardex.sql.exec.fragment_rows import root_rows
from shardex.sql.exec.service import check_statement
from shardex.sql.exec.statements import bound_statement
from shardex.sql.local import LocalEngine
from shardex.sql.syntax import ExplainStmt, SelectStmt, parse_statement
from shardex.sql.syntax.ast import SetOpStmt, WithStmt
from shardex.sql.syntax.bind import META_KEY, BoundSelect, bind_select
from shardex.sql.syntax.cte_names import cte_param
from tests.unit.sql.budgets import budget


@pytest.fixture
def eng() -> LocalEngine:
    e = LocalEngine()
    e.create_keyspace("orders")
    e.create_keyspace("people")
    e.keyspaces["orders"].update(
        {f"o{i}": {"who": f"p{i % 3}", "total": i * 10, "lines": [i, i + 1]} for i in range(6)}
    )
    e.keyspaces["people"].update({f"p{i}": {"name": f"n{i}", "vip": i == 1} for i in range(3)})
    return e


# -- parser ------------------------------------------------------------------------------------


def test_terms_texts_and_query() -> None:
    sql = (
        "WITH big AS (SELECT RAW total FROM orders WHERE total > $1), "
        "n AS (ARRAY_LENGTH(big)) SELECT n"
    )
    stmt = parse_statement(sql)
    assert isinstance(stmt, WithStmt)
    big, n = stmt.terms
    assert big.name == "big" and isinstance(big.query, SelectStmt) and big.expr is None
    assert big.inner == "SELECT RAW total FROM orders WHERE total > $1"
    assert n.query is None and n.expr is not None and n.text == "n AS (ARRAY_LENGTH(big))"
    assert stmt.body_text == "SELECT n"
    assert stmt.header(1) == "WITH big AS (SELECT RAW total FROM orders WHERE total > $1) "
    assert isinstance(parse_statement("WITH a AS (SELECT 1 UNION SELECT 2) SELECT a"), WithStmt)
    body = parse_statement("WITH a AS (1) SELECT a UNION SELECT 2 ORDER BY SELF")
    assert isinstance(body, WithStmt) and isinstance(body.body, SetOpStmt)
    explained = parse_statement("EXPLAIN WITH a AS (1) SELECT a")
    assert isinstance(explained, ExplainStmt) and is_compound(explained.statement)
    assert not is_compound(explained)  # an EXPLAIN is planned, not run (explain_statement)


@pytest.mark.parametrize(
    ("sql", "says"),
    [
        ("WITH RECURSIVE a AS (SELECT 1) SELECT a", "WITH RECURSIVE is not supported"),
        ("WITH a AS (1), a AS (2) SELECT a", "WITH names 'a' twice"),
        ("WITH a (1) SELECT a", "expected AS"),
        ("WITH a AS 1 SELECT a", "'(' and the query or expression a stands for"),
        ("WITH a AS (1 SELECT a", "')' after the definition of a"),
        ("WITH a AS (1)", "the SELECT that uses them"),
        ("WITH a AS (1) DELETE FROM x", "the SELECT that uses them"),
        ("WITH select AS (1) SELECT 1", "reserved word"),
    ],
)
def test_malformed_with_is_a_syntax_error(sql: str, says: str) -> None:
    with pytest.raises(ShardexError) as err:
        parse_statement(sql)
    assert err.value.code is ErrorCode.SQL_SYNTAX
    assert says in str(err.value)


# -- semantics ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("sql", "rows"),
    [
        ("WITH a AS ((SELECT RAW total FROM orders ORDER BY total DESC)[0]) SELECT RAW a", [50]),
        ("WITH a AS ((SELECT RAW 1)[0] + 1) SELECT RAW a", [2]),
        ("WITH a AS ((SELECT RAW 1) UNION (SELECT RAW 2)) SELECT RAW ARRAY_LENGTH(a)", [2]),
        ("WITH a AS ((SELECT RAW 3)) SELECT RAW a[0]", [3]),
    ],
)
def test_a_term_that_starts_with_a_query_in_parentheses(
    eng: LocalEngine, sql: str, rows: list[Any]
) -> None:
    """What follows the parenthesised query tells an expression (``(SELECT ...)[0]``) from the
    term's whole query or a set operation's first branch."""
    assert eng.query(sql) == rows


def test_a_term_in_from_and_in_expressions(eng: LocalEngine) -> None:
    sql = (
        "WITH vips AS (SELECT RAW META().id FROM people WHERE vip), "
        "big AS (SELECT o.who, o.total FROM orders AS o WHERE o.total >= 30) "
        "SELECT b.who, b.total, b.who IN vips AS vip FROM big AS b ORDER BY b.total"
    )
    assert eng.query(sql) == [
        {"who": "p0", "total": 30, "vip": False},
        {"who": "p1", "total": 40, "vip": True},
        {"who": "p2", "total": 50, "vip": False},
    ]


def test_a_term_used_twice_is_evaluated_once(
    eng: LocalEngine, monkeypatch: pytest.MonkeyPatch
) -> None:
    runs: list[Any] = []
    original = LocalEngine.run_select

    def counted(self: LocalEngine, b: BoundSelect, *args: Any, **kw: Any) -> Any:
        runs.append(b.from_.name if b.from_ is not None else None)
        return original(self, b, *args, **kw)

    monkeypatch.setattr(LocalEngine, "run_select", counted)
    sql = (
        "WITH t AS (SELECT RAW total FROM orders) "
        "SELECT RAW [ARRAY_SUM(t), ARRAY_LENGTH(t)] FROM t AS x WHERE x IN t LIMIT 1"
    )
    assert eng.query(sql) == [[150, 6]]
    assert runs.count("orders") == 1


def test_later_terms_read_earlier_ones_and_parameters(eng: LocalEngine) -> None:
    sql = (
        "WITH t AS (SELECT RAW total FROM orders WHERE total > $min), "
        "m AS (ARRAY_MAX(t)), top AS (SELECT RAW v FROM t AS v WHERE v = m) "
        "SELECT m, top, $min AS lo"
    )
    assert eng.query(sql, {"min": 15}) == [{"m": 50, "top": [50], "lo": 15}]
    with pytest.raises(ShardexError, match=r"\$min"):
        eng.query(sql)


def test_the_querys_own_names_shadow_a_term(eng: LocalEngine) -> None:
    # FROM t (no alias): the alias t is an element, not the WITH value, within the query.
    sql = "WITH t AS (SELECT RAW total FROM orders WHERE total < 20) SELECT RAW t + 1 FROM t"
    assert sorted(eng.query(sql)) == [1, 11]
    sql = "WITH x AS ([1, 2]) SELECT RAW x FROM [7] AS x"
    assert eng.query(sql) == [7]
    sql = "WITH x AS ([1, 2]) SELECT RAW ARRAY v * 2 FOR v IN x END"
    assert eng.query(sql) == [[2, 4]]


def test_set_operation_body_and_term(eng: LocalEngine) -> None:
    sql = (
        "WITH a AS (SELECT RAW who FROM orders UNION SELECT RAW 'p9') "
        "SELECT RAW v FROM a AS v EXCEPT SELECT RAW META().id FROM people WHERE vip ORDER BY SELF"
    )
    assert eng.query(sql) == ["p0", "p2", "p9"]


def test_a_grouped_query_reads_a_term(eng: LocalEngine) -> None:
    sql = (
        "WITH vips AS (SELECT RAW META().id FROM people WHERE vip) "
        "SELECT o.who, SUM(o.total) AS s FROM orders AS o WHERE o.who NOT IN vips "
        "GROUP BY o.who HAVING SUM(o.total) > ARRAY_LENGTH(vips) ORDER BY o.who"
    )
    assert eng.query(sql) == [{"who": "p0", "s": 30}, {"who": "p2", "s": 70}]


def test_with_inside_a_subquery_expression(eng: LocalEngine) -> None:
    sql = (
        "SELECT RAW (WITH ls AS (SELECT RAW l FROM o.lines AS l) "
        "SELECT RAW ARRAY_SUM(ls) * 10)[0] FROM orders AS o WHERE o.total < 20 ORDER BY o.total"
    )
    assert eng.query(sql) == [10, 30]
    union = "SELECT RAW (WITH a AS (1) SELECT RAW a UNION SELECT RAW 2 ORDER BY SELF)"
    assert eng.query(union) == [[1, 2]]


# A term read twice: equal in one evaluation when it is valued once per evaluation of its
# subquery; valued again for the next row (UUID() differs at every call).
ONCE_PER_EVALUATION = [
    "SELECT RAW (WITH u AS (UUID()) SELECT RAW [u, u, x])[0] FROM [1, 2, 3] AS x",
    "SELECT RAW (WITH u AS (SELECT RAW UUID() || TOSTRING(x)), w AS (u[0]) "
    "SELECT RAW [u[0], w, x] FROM [1] AS y)[0] FROM [1, 2, 3] AS x",
]


def _valued_once_per_evaluation(rows: list[Any]) -> None:
    assert [r[2] for r in rows] == [1, 2, 3]
    assert all(r[0] == r[1] for r in rows)  # one value per evaluation
    assert len({r[0] for r in rows}) == 3  # a value of its own for each


@pytest.mark.parametrize("sql", ONCE_PER_EVALUATION)
def test_a_subquery_with_term_is_valued_once_per_evaluation(eng: LocalEngine, sql: str) -> None:
    _valued_once_per_evaluation(eng.query(sql))
    # The distributed pipelines (a leaf evaluates the projection) do the same.
    b = bind_select(parse_statement(sql))  # type: ignore[arg-type]
    scope = [{"x": x, META_KEY: {}} for x in (1, 2, 3)]
    rows = list(root_rows(b, None, "local", None, 0, budget(), [iter(scope)]))
    _valued_once_per_evaluation(rows)


def test_explain_shows_the_terms(eng: LocalEngine) -> None:
    [plan] = eng.query("EXPLAIN WITH t AS (SELECT RAW total FROM orders) SELECT RAW v FROM t AS v")
    assert plan["with"][0]["name"] == "t"
    assert plan["with"][0]["plan"][0]["keyspace"] == "orders"
    assert plan["plan"][0]["operator"] == "ExpressionScan"


def test_an_aggregate_term_expression_is_refused(eng: LocalEngine) -> None:
    with pytest.raises(ShardexError, match="not allowed in WITH n"):
        eng.query("WITH n AS (COUNT(*)) SELECT n")


# -- what the distributed path relies on -------------------------------------------------------


def test_a_member_binds_a_query_behind_its_with_clause_alone() -> None:
    stmt = parse_statement("WITH ids AS (SELECT RAW 'p1') SELECT name FROM people USE KEYS ids")
    assert isinstance(stmt, WithStmt)
    b = bound_statement(stmt.header() + stmt.body_text, False)
    assert b.from_ is not None and b.from_.name == "people"
    assert b.from_.use_keys == Param(cte_param("ids"))
    assert cte_param("ids") in {
        n.name for e in b.expressions() for n in walk(e) if isinstance(n, Param)
    }


def test_privileges_see_through_with_names() -> None:
    ann = Principal("user", "ann", ("query_select(orders)",))
    check_statement(
        ann, parse_statement("WITH people AS (SELECT RAW 1) SELECT RAW p FROM people AS p")
    )
    check_statement(ann, parse_statement("WITH t AS (SELECT RAW total FROM orders) SELECT t"))
    for sql in [
        "WITH t AS (SELECT RAW name FROM people) SELECT t",
        "WITH t AS (1) SELECT RAW name FROM people",
        "EXPLAIN WITH t AS ((SELECT RAW 1 FROM people USE KEYS 'k')) SELECT t",
    ]:
        with pytest.raises(AuthFailed) as err:
            check_statement(ann, parse_statement(sql))
        assert err.value.details["keyspace"] == "people"
