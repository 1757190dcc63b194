"""Set operations (UNION / INTERSECT / EXCEPT [ALL]): the parser, N1QL's semantics on
``LocalEngine``, and the distributed path's initiator side (``exec/setops.py``: each branch
gathered as its own query, the operators within the statement's memory budget)."""

from __future__ import annotations

import asyncio
import functools
import random
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from shardex.api.privileges import AuthFailed, Principal
from shardex.errors import ErrorCode, ShardexError
from shardex.sql.exec.memory import SPILL_DIR, NodeMemory
from shardex.sql.exec.rows import decode_row, encode_row
from shardex.sql.exec.service import check_statement
from shardex.sql.exec.setops import set_op_texts, set_op_values, start_set_op
from shardex.sql.exec.spill_groups import FANOUT
from shardex.sql.exec.subquery_inputs import inputs_of
from shardex.sql.local import LocalEngine
from shardex.sql.operators.setops import combine
from shardex.sql.syntax import SelectStmt, parse_statement
from shardex.sql.syntax.ast import SetOpStmt
from shardex.sql.syntax.bind import bind_select
from shardex.sql.syntax.setops import bind_set_op
from tests.unit.sql.budgets import budget
from tests.unit.sql.test_sql_exec_fragment_rows import _canon, _run
from tests.unit.sql.test_sql_exec_unnest_subquery import _docs


@pytest.fixture
def eng() -> LocalEngine:
    e = LocalEngine()
    e.create_keyspace("x")
    e.create_keyspace("y")
    e.keyspaces["x"].update(
        {"1": {"a": 1, "g": "p"}, "2": {"a": 2}, "3": {"a": 2}, "4": {"a": 1.0}, "5": {}}
    )
    e.keyspaces["y"].update({"1": {"b": 2}, "2": {"b": 3}, "3": {"b": None}})
    return e


# -- parser ------------------------------------------------------------------------------------


def test_branches_operators_and_texts() -> None:
    stmt = parse_statement(
        "SELECT a FROM x UNION ALL (SELECT b FROM y ORDER BY b LIMIT 2) "
        "INTERSECT SELECT RAW 1 ORDER BY a DESC LIMIT 3 OFFSET $1"
    )
    assert isinstance(stmt, SetOpStmt)
    assert stmt.ops == (("UNION", True), ("INTERSECT", False))
    assert stmt.texts == ("SELECT a FROM x", "SELECT b FROM y ORDER BY b LIMIT 2", "SELECT RAW 1")
    _, second, third = stmt.branches
    assert isinstance(second, SelectStmt) and second.limit is not None  # its own LIMIT
    assert isinstance(third, SelectStmt) and third.limit is None  # the whole's LIMIT
    assert [o.desc for o in stmt.order_by] == [True]
    assert stmt.limit is not None and stmt.offset is not None
    # Every branch's text is a statement of its own that parses to the same branch.
    assert [parse_statement(t) for t in stmt.texts] == list(stmt.branches)


def test_a_single_select_stays_a_select() -> None:
    assert isinstance(parse_statement("SELECT a FROM x ORDER BY a LIMIT 2"), SelectStmt)
    inner = parse_statement("(SELECT a FROM x)")
    assert isinstance(inner, SelectStmt)
    ordered = parse_statement("(SELECT a FROM x LIMIT 5) ORDER BY a")
    assert isinstance(ordered, SetOpStmt) and len(ordered.branches) == 1


def test_nested_set_operation_in_parentheses() -> None:
    stmt = parse_statement("SELECT 1 EXCEPT (SELECT 2 UNION SELECT 3) ORDER BY SELF")
    assert isinstance(stmt, SetOpStmt) and isinstance(stmt.branches[1], SetOpStmt)
    assert set_op_texts(stmt) == ["SELECT 1", "SELECT 2", "SELECT 3"]


@pytest.mark.parametrize(
    ("sql", "says"),
    [
        ("SELECT a FROM x ORDER BY a UNION SELECT 1", "UNION cannot follow them"),
        ("SELECT a FROM x LIMIT 1 EXCEPT SELECT 1", "EXCEPT cannot follow them"),
        ("SELECT 1 UNION", "SELECT or a parenthesised query after UNION"),
        ("SELECT 1 INTERSECT ALL 2", "SELECT or a parenthesised query after INTERSECT"),
        ("(SELECT 1 UNION SELECT 2", "')' after the parenthesised query"),
        ("SELECT 1 UNION ALL ALL SELECT 2", "after UNION"),
        ("EXPLAIN (1)", "MERGE or EXECUTE after EXPLAIN"),
    ],
)
def test_malformed_set_operations_are_syntax_errors(sql: str, says: str) -> None:
    with pytest.raises(ShardexError) as err:
        parse_statement(sql)
    assert err.value.code is ErrorCode.SQL_SYNTAX
    assert says in str(err.value)
    assert "line 1" in str(err.value)


def test_aggregate_in_the_set_operations_order_by_is_refused() -> None:
    with pytest.raises(ShardexError, match="not allowed in the ORDER BY of a set operation"):
        bind_set_op(parse_statement("SELECT 1 AS a UNION SELECT 2 AS a ORDER BY COUNT(*)"))  # type: ignore[arg-type]


# -- semantics (LocalEngine) -------------------------------------------------------------------


@pytest.mark.parametrize(
    ("sql", "want"),
    [
        # UNION drops duplicates within a branch too; 1 and 1.0 are one value (the first kept).
        ("SELECT RAW a FROM x UNION SELECT RAW b FROM y", [1, 2, 3, None]),
        ("SELECT RAW a FROM x UNION ALL SELECT RAW b FROM y", [1, 2, 2, 1.0, 2, 3, None]),
        # N1QL: INTERSECT ALL keeps every left row whose value the right has (not min(m, n)).
        ("SELECT RAW a FROM x INTERSECT ALL SELECT RAW b FROM y", [2, 2]),
        ("SELECT RAW a FROM x INTERSECT SELECT RAW b FROM y", [2]),
        ("SELECT RAW a FROM x EXCEPT ALL SELECT RAW b FROM y", [1, 1.0]),
        ("SELECT RAW a FROM x EXCEPT SELECT RAW b FROM y", [1]),
        ("SELECT RAW a FROM x INTERSECT SELECT RAW b FROM y WHERE b > 9", []),
        # Objects compare whole: a MISSING field is an absent key, so {} is its own value.
        (
            "SELECT a FROM x UNION SELECT b AS a FROM y",
            [{"a": 1}, {"a": 2}, {}, {"a": 3}, {"a": None}],
        ),
    ],
)
def test_n1ql_semantics(eng: LocalEngine, sql: str, want: list[Any]) -> None:
    got = eng.query(sql)
    assert sorted(map(encode_row, got)) == sorted(map(encode_row, want))
    assert [type(v) for v in got if v == 1] == [type(v) for v in want if v == 1]


def test_left_to_right_with_one_precedence(eng: LocalEngine) -> None:
    # (1, 2 UNION 2, 3) EXCEPT 2 = {1, 3}; with SQL's INTERSECT-first rule it would differ.
    sql = "SELECT RAW 1 UNION SELECT RAW 2 INTERSECT SELECT RAW 2 ORDER BY SELF"
    assert eng.query(sql) == [2]
    assert eng.query("SELECT RAW 1 UNION (SELECT RAW 2 INTERSECT SELECT RAW 2) ORDER BY SELF") == [
        1,
        2,
    ]


def test_order_limit_offset_apply_to_the_whole(eng: LocalEngine) -> None:
    sql = "SELECT a FROM x UNION ALL SELECT b AS a FROM y ORDER BY a DESC LIMIT 3 OFFSET 1"
    assert eng.query(sql) == [{"a": 2}, {"a": 2}, {"a": 2}]
    sql = "SELECT RAW b FROM y UNION ALL SELECT RAW a FROM x ORDER BY SELF NULLS LAST LIMIT $n"
    assert eng.query(sql, {"n": 4}) == [1, 1.0, 2, 2]
    assert eng.query("SELECT RAW a FROM x UNION SELECT RAW 5 ORDER BY SELF LIMIT 0") == []
    # A parenthesised branch keeps its own ORDER BY / LIMIT.
    sql = "(SELECT RAW a FROM x WHERE a IS VALUED ORDER BY a DESC LIMIT 1) UNION ALL SELECT RAW 7"
    assert sorted(eng.query(sql)) == [2, 7]


def test_parameters_in_branches(eng: LocalEngine) -> None:
    sql = "SELECT RAW a FROM x WHERE a = $1 UNION SELECT RAW b FROM y WHERE b = $2"
    assert sorted(eng.query(sql, [1, 3])) == [1, 3]
    with pytest.raises(ShardexError, match="uses 2 positional parameters, 1 supplied"):
        eng.query(sql, [1])


def test_explain_shows_branches_and_operators(eng: LocalEngine) -> None:
    [plan] = eng.query("EXPLAIN SELECT a FROM x EXCEPT ALL SELECT b FROM y ORDER BY a LIMIT 2")
    assert [b["plan"][0]["keyspace"] for b in plan["branches"]] == ["x", "y"]
    assert [op["operator"] for op in plan["plan"]] == ["ExceptAll", "TopN", "Limit"]


# -- the initiator's side of the distributed plan ---------------------------------------------


async def _gathered(eng: LocalEngine, sql: str, params: Any = None, quota: int = 1 << 24) -> list:
    """The set operation run as the initiator runs it, each branch's rows coming from its own
    text (run here by the reference engine, in chunks as a gather delivers them)."""
    stmt = parse_statement(sql)
    assert isinstance(stmt, SetOpStmt)
    started: list[str] = []

    async def branch(text: str, select: SelectStmt) -> AsyncIterator[list[bytes]]:
        started.append(text)
        # Not ``eng.query``: a branch's parameters are checked against the whole statement.
        cells = [encode_row(v) for v in eng.run_select(bind_select(select), params)]

        async def chunks() -> AsyncIterator[list[bytes]]:
            for i in range(0, len(cells), 2):
                yield cells[i : i + 2]

        return chunks()

    rows = await start_set_op(stmt, params, branch, NodeMemory(1 << 26), quota, True)
    out = [decode_row(c) async for chunk in rows for c in chunk]
    assert started == set_op_texts(stmt)
    return out


SETOP_QUERIES = [
    "SELECT a FROM x UNION SELECT b AS a FROM y ORDER BY a",
    "SELECT RAW a FROM x UNION ALL SELECT RAW b FROM y ORDER BY SELF DESC LIMIT 4 OFFSET 1",
    "SELECT RAW a FROM x INTERSECT ALL SELECT RAW b FROM y",
    "SELECT RAW a FROM x EXCEPT SELECT RAW b FROM y",
    "SELECT RAW a FROM x EXCEPT ALL (SELECT RAW b FROM y UNION SELECT RAW 1) ORDER BY SELF",
    "SELECT RAW a FROM x WHERE a > $1 UNION SELECT RAW b FROM y ORDER BY SELF",
]


@pytest.mark.parametrize("sql", SETOP_QUERIES)
def test_initiator_equals_the_reference(eng: LocalEngine, sql: str) -> None:
    params = [1] if "$1" in sql else None
    want = eng.query(sql, params)
    got = asyncio.run(_gathered(eng, sql, params))
    if "ORDER BY" in sql:
        assert got == want
    else:
        assert sorted(map(encode_row, got)) == sorted(map(encode_row, want))


def _values(n: int, start: int = 0) -> list[dict[str, Any]]:
    return [{"k": i % 700, "pad": "x" * 40} for i in range(start, start + n)]


def test_union_and_order_by_spill_past_the_budget_and_equal_the_in_memory_result(
    tmp_path: Path,
) -> None:
    q = bind_set_op(parse_statement("SELECT 1 AS k UNION SELECT 2 AS k ORDER BY k DESC"))  # type: ignore[arg-type]
    left, right = _values(3000), _values(3000, 350)
    small = budget(64 * 1024, data_dir=tmp_path)
    got = list(set_op_values(q, [iter(left), iter(right)], small, None))
    want = list(set_op_values(q, [iter(left), iter(right)], budget(), None))
    assert got == want and len(got) == 700
    assert small.query.files > 0, "the operators should have spilled at this budget"


def _membership_values(n: int, seed: int) -> list[Any]:
    """Values with many duplicates and SQL++ equalities (1 and 1.0, MISSING fields)."""
    rng = random.Random(seed)
    out: list[Any] = []
    for i in range(n):
        k = rng.randrange(n // 3)
        v: dict[str, Any] = {"k": k if i % 5 else float(k), "pad": "z" * rng.randrange(30)}
        if i % 7:
            v["g"] = k % 4
        out.append(v)
    return out


MEMBERSHIP = [
    "SELECT 1 AS k INTERSECT ALL SELECT 2 AS k",
    "SELECT 1 AS k INTERSECT SELECT 2 AS k",
    "SELECT 1 AS k EXCEPT ALL SELECT 2 AS k",
    "SELECT 1 AS k EXCEPT SELECT 2 AS k",
    "SELECT 1 AS k EXCEPT ALL SELECT 2 AS k INTERSECT ALL SELECT 3 AS k ORDER BY k DESC",
]


@pytest.mark.parametrize("sql", MEMBERSHIP)
def test_intersect_and_except_spill_past_the_budget_and_equal_the_in_memory_result(
    sql: str, tmp_path: Path
) -> None:
    """The values of each branch are made up (the branch texts only fix the operators); the
    right sides' sets are far over 16 KiB: partitioned to disk, two levels deep."""
    q = bind_set_op(parse_statement(sql))  # type: ignore[arg-type]
    branches = [_membership_values(6000, seed) for seed in range(len(q.ops) + 1)]
    node = NodeMemory(1 << 30, query_max=16 * 1024, data_dir=tmp_path)
    with node.fragment("q/setops") as mem:
        small = mem.budget()
        got = list(set_op_values(q, [iter(b) for b in branches], small, None))
        files = small.query.files
    want = list(set_op_values(q, [iter(b) for b in branches], budget(), None))
    reference = list(combine(q.ops, [functools.partial(iter, b) for b in branches]))
    assert want and got == want
    if "ORDER BY" not in sql:
        assert want == reference  # the in-memory operators are the reference engine's
    assert files > 2 * FANOUT, "the right side's set should have spilled two levels deep"
    assert not (tmp_path / SPILL_DIR).exists() or not any((tmp_path / SPILL_DIR).iterdir())


def test_intersect_right_side_past_the_budget_without_spilling_is_a_clear_error() -> None:
    q = bind_set_op(parse_statement("SELECT 1 AS k INTERSECT ALL SELECT 2 AS k"))  # type: ignore[arg-type]
    right = [{"k": i, "pad": "y" * 60} for i in range(5000)]
    with pytest.raises(ShardexError) as err:
        list(
            set_op_values(q, [iter(_values(10)), iter(right)], budget(64 * 1024, spill=False), None)
        )
    assert err.value.code is ErrorCode.QUERY_MEMORY_LIMIT
    assert err.value.details["operator"] == "INTERSECT/EXCEPT"
    assert "spilling is off" in err.value.message


def test_a_set_operation_needs_select_on_every_branch() -> None:
    ann = Principal("user", "ann", ("query_select(x)",))
    check_statement(ann, parse_statement("SELECT a FROM x UNION SELECT RAW 1"))
    for sql in [
        "SELECT a FROM x UNION SELECT b FROM y",
        "EXPLAIN SELECT 1 EXCEPT (SELECT 2 UNION SELECT b FROM y)",
        "SELECT a FROM x INTERSECT SELECT RAW 1 WHERE EXISTS (SELECT 1 FROM y USE KEYS 'k')",
    ]:
        with pytest.raises(AuthFailed) as e:
            check_statement(ann, parse_statement(sql))
        assert e.value.details["keyspace"] == "y"


# -- set operations in subquery expressions -------------------------------------------------------


def test_set_operations_in_subquery_expressions(eng: LocalEngine) -> None:
    assert eng.query("SELECT RAW a FROM x WHERE a IN (SELECT RAW 2 UNION SELECT RAW 7)") == [2, 2]
    sql = "SELECT RAW t FROM (SELECT RAW b FROM y UNION ALL SELECT RAW 9) AS t ORDER BY t"
    assert eng.query(sql) == [None, 2, 3, 9]
    correlated = (
        "SELECT d.k, (SELECT RAW v FROM d.l AS v EXCEPT SELECT RAW 2 ORDER BY SELF DESC) AS r "
        "FROM [{'k': 1, 'l': [1, 2, 3]}, {'k': 2, 'l': [2]}] AS d ORDER BY d.k"
    )
    assert eng.query(correlated) == [{"k": 1, "r": [3, 1]}, {"k": 2, "r": []}]
    [plan] = eng.query("EXPLAIN SELECT (SELECT RAW 1 INTERSECT SELECT RAW 1) AS s")
    assert plan["subqueries"][0]["plan"] == [{"operator": "Intersect", "branch": 1}]


UNNEST_KS = "t"
SUBQUERY_SETOPS = [
    f"SELECT d.k, (SELECT RAW i.p FROM d.items AS i UNION SELECT RAW 'z') AS ps FROM {UNNEST_KS} d",
    f"SELECT RAW d.k FROM {UNNEST_KS} d WHERE 'a' IN (SELECT RAW i.p FROM d.items AS i "
    f"INTERSECT SELECT RAW 'a') ORDER BY d.k",
    f"SELECT d.k, ARRAY_LENGTH((SELECT RAW i.n FROM d.items AS i EXCEPT ALL SELECT RAW 0)) AS n "
    f"FROM {UNNEST_KS} d ORDER BY d.k",
]


@pytest.mark.parametrize("sql", SUBQUERY_SETOPS)
@pytest.mark.parametrize("leaves", [1, 4])
def test_subquery_set_operations_in_the_distributed_pipelines(sql: str, leaves: int) -> None:
    docs = _docs()
    ref = LocalEngine()
    ref.create_keyspace(UNNEST_KS)
    ref.keyspaces[UNNEST_KS].update(docs)
    want = ref.query(sql)
    assert want
    got = _run(sql, docs, leaves)
    if "ORDER BY d.k" in sql:
        assert got == want
    else:
        assert sorted(map(_canon, got)) == sorted(map(_canon, want))


def test_a_subquery_set_operation_over_a_keyspace_is_read_first_and_checked() -> None:
    sql = "SELECT a FROM x WHERE a IN (SELECT RAW 1 UNION SELECT RAW b FROM y)"
    [one] = inputs_of(bind_select(parse_statement(sql)))  # type: ignore[arg-type]
    assert one.text == "SELECT RAW 1 UNION SELECT RAW b FROM y" and not one.gathers
    ann = Principal("user", "ann", ("query_select(x)",))
    for sub in [sql, "SELECT (WITH t AS (1) SELECT RAW b FROM y USE KEYS 'k') AS s"]:
        with pytest.raises(AuthFailed) as denied:
            check_statement(ann, parse_statement(sub))
        assert denied.value.details["keyspace"] == "y"
