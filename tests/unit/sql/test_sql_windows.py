"""Window functions: the parser (OVER, frames, null treatment, malformed forms), each
function's N1QL semantics on ``LocalEngine`` against values worked out by hand, and the
distributed pipelines (leaves send scope rows, the root computes the windows within the
query's memory budget) equal to the reference whatever the split."""

from __future__ import annotations

from typing import Any

import pytest

from shardex.errors import ErrorCode, ShardexError
from shardex.sql.exec.analyze import read_paths
from shardex.sql.exec.fragment_rows import leaf_rows, mode_of, root_rows
from shardex.sql.local import LocalEngine
from shardex.sql.syntax import parse_statement
from shardex.sql.syntax.ast import WindowCall
from shardex.sql.syntax.bind import META_KEY, bind_select
from tests.unit.sql.budgets import budget
from tests.unit.sql.test_sql_exec_fragment_rows import KS, _canon, _docs, _run
from tests.unit.sql.test_sql_exec_plan import KS as USERS
from tests.unit.sql.test_sql_exec_plan import _plan

# k: 0..7, g alternating a/b, v: 3 1 4 1 5 9 2 6 (two 1s: peers)
V = [3, 1, 4, 1, 5, 9, 2, 6]


@pytest.fixture
def eng() -> LocalEngine:
    e = LocalEngine()
    e.create_keyspace("x")
    e.keyspaces["x"].update({f"r{i}": {"k": i, "g": "ab"[i % 2], "v": V[i]} for i in range(8)})
    e.keyspaces["x"]["r8"] = {"k": 8, "g": "b"}  # v MISSING
    e.keyspaces["x"]["r9"] = {"k": 9, "g": "a", "v": None}
    return e


def _col(eng: LocalEngine, expr: str, where: str = "v IS VALUED") -> list[Any]:
    """``expr`` for each row (ordered by k) of those with ``where``."""
    rows = eng.query(f"SELECT k, {expr} AS w FROM x WHERE {where} ORDER BY k")
    return [r.get("w") for r in rows]


# -- parser ------------------------------------------------------------------------------------


def test_over_clause_parts() -> None:
    stmt = parse_statement(
        "SELECT NTH_VALUE(v, 2) FROM LAST IGNORE NULLS OVER (PARTITION BY g, k % 2 "
        "ORDER BY v DESC NULLS LAST GROUPS BETWEEN 1 PRECEDING AND UNBOUNDED FOLLOWING "
        "EXCLUDE TIES) AS w FROM x"
    )
    call = stmt.terms[0].expr  # type: ignore[union-attr]
    assert isinstance(call, WindowCall)
    assert call.from_last and call.ignore_nulls and len(call.partition) == 2
    assert call.order[0].desc and call.order[0].nulls_first is False
    assert call.frame is not None and call.frame.unit == "GROUPS"
    assert (call.frame.start.kind, call.frame.end.kind) == ("PRECEDING", "UNBOUNDED FOLLOWING")
    assert call.frame.exclude == "TIES"
    single = parse_statement("SELECT SUM(v) OVER (ORDER BY k ROWS 2 PRECEDING) FROM x")
    frame = single.terms[0].expr.frame  # type: ignore[union-attr]
    assert (frame.start.kind, frame.end.kind) == ("PRECEDING", "CURRENT ROW")
    plain = parse_statement("SELECT COUNT(*) OVER (), COUNT(DISTINCT v) OVER () FROM x")
    assert [t.expr.star for t in plain.terms] == [True, False]  # type: ignore[union-attr]


@pytest.mark.parametrize(
    ("sql", "says"),
    [
        ("SELECT ROW_NUMBER() FROM x", "ROW_NUMBER needs OVER"),
        ("SELECT RANK(v) OVER () FROM x", "takes 0 arguments, got 1"),
        ("SELECT LAG(v, 1, 2, 3) OVER () FROM x", "takes 1 to 3 arguments"),
        ("SELECT RANK() OVER (ORDER BY v ROWS 1 PRECEDING) FROM x", "RANK takes no window frame"),
        ("SELECT SUM(v) OVER (RANGE 1 PRECEDING) FROM x", "RANGE frame needs ORDER BY"),
        (
            "SELECT SUM(v) OVER (ORDER BY v ROWS BETWEEN 1 FOLLOWING AND CURRENT ROW) FROM x",
            "empty",
        ),
        ("SELECT SUM(v) OVER (ORDER BY v ROWS UNBOUNDED FOLLOWING) FROM x", "empty"),
        ("SELECT SUM(v) OVER 5 FROM x", "or a window's name"),
        ("SELECT 1 FROM x WINDOW w AS (ORDER BY v), w AS (ORDER BY k)", "WINDOW names 'w' twice"),
        ("SELECT SUM(v) OVER (ORDER BY v ROWS 1) FROM x", "PRECEDING or FOLLOWING"),
        ("SELECT SUM(v) OVER (ORDER BY v ROWS 1 PRECEDING EXCLUDE ALL) FROM x", "EXCLUDE"),
        ("SELECT ROW_NUMBER() OVER (ORDER BY v FROM x", "')' after the window"),
        ("SELECT DENSE_RANK() RESPECT NULLS OVER () FROM x", "takes no RESPECT NULLS"),
    ],
)
def test_malformed_windows_are_syntax_errors(sql: str, says: str) -> None:
    with pytest.raises(ShardexError) as err:
        parse_statement(sql)
    assert err.value.code is ErrorCode.SQL_SYNTAX
    assert says in str(err.value)


@pytest.mark.parametrize(
    ("sql", "says"),
    [
        ("SELECT k FROM x WHERE ROW_NUMBER() OVER () > 1", "not allowed in WHERE"),
        ("SELECT k FROM x LET r = RANK() OVER (ORDER BY k)", "not allowed in LET"),
        ("SELECT COUNT(*) FROM x GROUP BY RANK() OVER ()", "not allowed in GROUP BY"),
        ("SELECT SUM(ROW_NUMBER() OVER ()) OVER () FROM x", "cannot be nested"),
        ("SELECT k, RANK() OVER (ORDER BY v) FROM x GROUP BY g", "neither a GROUP BY key"),
    ],
)
def test_windows_where_they_cannot_be(sql: str, says: str) -> None:
    with pytest.raises(ShardexError, match=says):
        bind_select(parse_statement(sql))  # type: ignore[arg-type]


# -- semantics ---------------------------------------------------------------------------------


def test_ranking_functions(eng: LocalEngine) -> None:
    # v by k: 3 1 4 1 5 9 2 6; ascending: 1 1 2 3 4 5 6 9
    assert _col(eng, "ROW_NUMBER() OVER (ORDER BY v, k)") == [4, 1, 5, 2, 6, 8, 3, 7]
    assert _col(eng, "RANK() OVER (ORDER BY v)") == [4, 1, 5, 1, 6, 8, 3, 7]
    assert _col(eng, "DENSE_RANK() OVER (ORDER BY v)") == [3, 1, 4, 1, 5, 7, 2, 6]
    assert _col(eng, "PERCENT_RANK() OVER (ORDER BY v)") == [
        3 / 7,
        0,
        4 / 7,
        0,
        5 / 7,
        1,
        2 / 7,
        6 / 7,
    ]
    assert _col(eng, "CUME_DIST() OVER (ORDER BY v)") == [
        0.5,
        0.25,
        0.625,
        0.25,
        0.75,
        1,
        0.375,
        0.875,
    ]
    assert _col(eng, "NTILE(3) OVER (ORDER BY k)") == [1, 1, 1, 2, 2, 2, 3, 3]
    assert _col(eng, "NTILE(20) OVER (ORDER BY k)") == [1, 2, 3, 4, 5, 6, 7, 8]
    assert _col(eng, "RANK() OVER ()") == [1] * 8  # no ORDER BY: every row a peer
    # MISSING (k 8) and NULL (k 9) are partitions of their own, as GROUP BY's groups.
    assert _col(eng, "COUNT(*) OVER (PARTITION BY v)", "TRUE") == [1, 2, 1, 2, 1, 1, 1, 1, 1, 1]
    # Per partition (g: a for even k, b for odd).
    assert _col(eng, "ROW_NUMBER() OVER (PARTITION BY g ORDER BY v DESC)") == [
        3,
        3,
        2,
        4,
        1,
        1,
        4,
        2,
    ]


def test_lag_lead(eng: LocalEngine) -> None:
    assert _col(eng, "LAG(v) OVER (ORDER BY k)") == [None, 3, 1, 4, 1, 5, 9, 2]
    assert _col(eng, "LEAD(v, 2, -1) OVER (ORDER BY k)") == [4, 1, 5, 9, 2, 6, -1, -1]
    assert _col(eng, "LAG(v, 0) OVER (ORDER BY k)") == V
    assert _col(eng, "LEAD(k) OVER (PARTITION BY g ORDER BY k)") == [2, 3, 4, 5, 6, 7, None, None]
    # IGNORE NULLS counts only valued rows (r8 MISSING, r9 NULL come last by k).
    everyone = "TRUE"
    assert _col(eng, "LEAD(v) IGNORE NULLS OVER (ORDER BY k)", everyone)[6:] == [
        6,
        None,
        None,
        None,
    ]
    assert _col(eng, "LAG(v, 1, 0) IGNORE NULLS OVER (ORDER BY k)", everyone)[8:] == [6, 6]


def test_first_last_nth_value_over_frames(eng: LocalEngine) -> None:
    assert _col(eng, "FIRST_VALUE(v) OVER (ORDER BY k)") == [3] * 8
    # The default frame ends at the current row's last peer.
    assert _col(eng, "LAST_VALUE(k) OVER (ORDER BY v)") == [0, 3, 2, 3, 4, 5, 6, 7]
    whole = "ROWS BETWEEN UNBOUNDED PRECEDING AND UNBOUNDED FOLLOWING"
    assert _col(eng, f"LAST_VALUE(v) OVER (ORDER BY k {whole})") == [6] * 8
    assert _col(eng, "NTH_VALUE(v, 2) OVER (ORDER BY k)") == [None, 1, 1, 1, 1, 1, 1, 1]
    nth_last = f"NTH_VALUE(v, 2) FROM LAST OVER (ORDER BY k {whole})"
    assert _col(eng, nth_last) == [2] * 8
    nulls = "FIRST_VALUE(v) IGNORE NULLS OVER (ORDER BY k DESC)"
    assert _col(eng, nulls, "TRUE") == [6] * 8 + [None, None]  # k 9 and 8 frame no value
    assert _col(eng, "FIRST_VALUE(v) OVER (ORDER BY k DESC)", "TRUE") == [None] * 10


def test_aggregates_over_frames(eng: LocalEngine) -> None:
    running = "SUM(v) OVER (ORDER BY k)"
    assert _col(eng, running) == [3, 4, 8, 9, 14, 23, 25, 31]
    # RANGE (the default): peers (the two 1s) share one running value; ROWS does not.
    assert _col(eng, "SUM(v) OVER (ORDER BY v)") == [7, 2, 11, 2, 16, 31, 4, 22]
    rows = "SUM(v) OVER (ORDER BY v, k ROWS UNBOUNDED PRECEDING)"
    assert _col(eng, rows) == [7, 1, 11, 2, 16, 31, 4, 22]
    sliding = "SUM(v) OVER (ORDER BY k ROWS BETWEEN 1 PRECEDING AND 1 FOLLOWING)"
    assert _col(eng, sliding) == [4, 8, 6, 10, 15, 16, 17, 8]
    ahead = "COUNT(*) OVER (ORDER BY k ROWS BETWEEN 2 FOLLOWING AND 3 FOLLOWING)"
    assert _col(eng, ahead) == [2, 2, 2, 2, 2, 1, 0, 0]
    empty = "SUM(v) OVER (ORDER BY k ROWS BETWEEN 2 FOLLOWING AND 3 FOLLOWING)"
    assert _col(eng, empty)[-2:] == [None, None]
    # RANGE by value: v within 1 of the row's v (1 1 2 | 3 4 | ...).
    near = "COUNT(*) OVER (ORDER BY v RANGE BETWEEN 1 PRECEDING AND 1 FOLLOWING)"
    assert _col(eng, near) == [3, 3, 3, 3, 3, 1, 4, 2]
    desc = "MIN(v) OVER (ORDER BY v DESC RANGE BETWEEN CURRENT ROW AND 2 FOLLOWING)"
    assert _col(eng, desc) == [1, 1, 2, 1, 3, 9, 1, 4]
    # GROUPS: the peer group before, the row's and the one after.
    groups = "ARRAY_AGG(k) OVER (ORDER BY v GROUPS BETWEEN 1 PRECEDING AND 1 FOLLOWING)"
    assert _col(eng, groups)[1] == [1, 3, 6]
    excl = "SUM(v) OVER (ORDER BY v ROWS BETWEEN UNBOUNDED PRECEDING AND UNBOUNDED FOLLOWING "
    assert _col(eng, excl + "EXCLUDE CURRENT ROW)")[0] == 28
    assert _col(eng, excl + "EXCLUDE GROUP)")[1] == 29
    assert _col(eng, excl + "EXCLUDE TIES)")[1] == 30
    assert _col(eng, "AVG(v) OVER (PARTITION BY g)") == [3.5, 4.25] * 4
    assert _col(eng, "RATIO_TO_REPORT(v) OVER (PARTITION BY g)") == [
        v / (14 if i % 2 == 0 else 17) for i, v in enumerate(V)
    ]
    assert _col(eng, "RATIO_TO_REPORT(v - v) OVER ()") == [None] * 8  # a sum of 0
    assert _col(eng, "COUNT(DISTINCT v) OVER ()") == [7] * 8
    assert _col(eng, "MAX(v) OVER (PARTITION BY g ORDER BY k)") == [3, 1, 4, 1, 5, 9, 5, 9]


def test_windows_over_groups_and_in_order_by(eng: LocalEngine) -> None:
    sql = (
        "SELECT g, SUM(v) AS s, RANK() OVER (ORDER BY SUM(v) DESC) AS r, "
        "SUM(SUM(v)) OVER () AS total FROM x GROUP BY g ORDER BY g"
    )
    assert eng.query(sql) == [
        {"g": "a", "s": 14, "r": 2, "total": 31},
        {"g": "b", "s": 17, "r": 1, "total": 31},
    ]
    top = (
        "SELECT RAW k FROM x WHERE v IS VALUED "
        "ORDER BY ROW_NUMBER() OVER (ORDER BY v DESC, k) LIMIT 3"
    )
    assert eng.query(top) == [5, 7, 4]
    alias = "SELECT k, DENSE_RANK() OVER (ORDER BY v) AS d FROM x WHERE v < 3 ORDER BY d DESC, k"
    assert eng.query(alias) == [{"k": 6, "d": 2}, {"k": 1, "d": 1}, {"k": 3, "d": 1}]
    distinct = "SELECT DISTINCT RAW COUNT(*) OVER (PARTITION BY g) FROM x"
    assert eng.query(distinct) == [5]


def test_frame_offsets_come_from_parameters_and_are_checked(eng: LocalEngine) -> None:
    sql = (
        "SELECT k, SUM(v) OVER (ORDER BY k ROWS $n PRECEDING) AS w FROM x "
        "WHERE v IS VALUED ORDER BY k"
    )
    assert [r["w"] for r in eng.query(sql, {"n": 1})] == [3, 4, 5, 5, 6, 14, 11, 8]
    for bad in (-1, 1.5, "2"):
        with pytest.raises(ShardexError, match="frame offset must be a whole number >= 0"):
            eng.query(sql, {"n": bad})
    # A positional parameter the window alone reads counts as the statement's.
    positional = sql.replace("$n", "$1")
    assert [r["w"] for r in eng.query(positional, [2])][:3] == [3, 4, 8]


def test_named_windows(eng: LocalEngine) -> None:
    sql = (
        "SELECT k, ROW_NUMBER() OVER w AS rn, SUM(v) OVER (w ROWS 1 PRECEDING) AS s, "
        "RANK() OVER (byg ORDER BY v) AS r FROM x WHERE v IS VALUED "
        "WINDOW w AS (byg ORDER BY k), byg AS (PARTITION BY g) ORDER BY k"
    )
    inline = (
        "SELECT k, ROW_NUMBER() OVER (PARTITION BY g ORDER BY k) AS rn, "
        "SUM(v) OVER (PARTITION BY g ORDER BY k ROWS 1 PRECEDING) AS s, "
        "RANK() OVER (PARTITION BY g ORDER BY v) AS r FROM x WHERE v IS VALUED ORDER BY k"
    )
    assert eng.query(sql) == eng.query(inline)
    assert [r["rn"] for r in eng.query(sql)] == [1, 1, 2, 2, 3, 3, 4, 4]
    # WINDOW stays usable as a name.
    assert eng.query("SELECT window.w FROM [{'w': 1}] AS window") == [{"w": 1}]


@pytest.mark.parametrize(
    ("sql", "says"),
    [
        ("SELECT RANK() OVER nope FROM x", "window 'nope' is not defined"),
        ("SELECT RANK() OVER (w ORDER BY k) FROM x WINDOW w AS (ORDER BY v)", "ORDER BY already"),
        ("SELECT RANK() OVER (w PARTITION BY g) FROM x WINDOW w AS ()", "takes its PARTITION BY"),
        ("SELECT RANK() OVER a FROM x WINDOW a AS (b), b AS (a)", "defined through itself"),
        ("SELECT SUM(v) OVER (w RANGE 1 PRECEDING) FROM x WINDOW w AS ()", "needs ORDER BY"),
    ],
)
def test_named_windows_that_cannot_be(eng: LocalEngine, sql: str, says: str) -> None:
    with pytest.raises(ShardexError, match=says) as err:
        eng.query(sql)
    assert err.value.code is ErrorCode.BAD_REQUEST


def test_explain_shows_the_window_operator(eng: LocalEngine) -> None:
    [plan] = eng.query("EXPLAIN SELECT k, RANK() OVER (ORDER BY v) AS r FROM x")
    ops = [op["operator"] for op in plan["plan"]]
    assert ops.index("Window") == ops.index("Project") - 1
    assert plan["plan"][ops.index("Window")]["functions"] == ["RANK() OVER (ORDER BY v)"]


# -- the distributed pipelines -------------------------------------------------------------------

DISTRIBUTED = [
    f"SELECT k, ROW_NUMBER() OVER (PARTITION BY g ORDER BY v, k) AS rn FROM {KS}",
    f"SELECT k, SUM(a) OVER (PARTITION BY g ORDER BY k ROWS 3 PRECEDING) AS s FROM {KS} "
    "WHERE k < 200 ORDER BY k LIMIT 20 OFFSET 5",
    f"SELECT g, COUNT(*) AS c, RANK() OVER (ORDER BY COUNT(*) DESC) AS r FROM {KS} GROUP BY g",
    f"SELECT DISTINCT RAW DENSE_RANK() OVER (ORDER BY a) FROM {KS}",
    f"SELECT k, LAG(a, 2) OVER (ORDER BY k) AS p, NTILE(7) OVER (ORDER BY k) AS nt FROM {KS} "
    "ORDER BY k",
]


@pytest.mark.parametrize("sql", DISTRIBUTED)
@pytest.mark.parametrize("leaves", [1, 3])
def test_distributed_windows_equal_the_reference(sql: str, leaves: int) -> None:
    docs = _docs()
    ref = LocalEngine()
    ref.create_keyspace(KS)
    ref.keyspaces[KS].update(docs)
    want = ref.query(sql)
    assert want
    got = _run(sql, docs, leaves)
    if "ORDER BY k" in sql.rsplit(")", 1)[-1]:
        assert got == want
    else:
        assert sorted(map(_canon, got)) == sorted(map(_canon, want))


def test_window_mode_leaves_send_scope_rows_and_read_the_window_paths() -> None:
    b = bind_select(parse_statement(f"SELECT k, SUM(a) OVER (PARTITION BY g) AS s FROM {KS}"))  # type: ignore[arg-type]
    assert mode_of(b) == "window"
    paths = read_paths(b)
    assert paths is not None and {("k",), ("a",), ("g",)} <= paths
    scope = [{KS: {"k": 1, "a": 2, "g": "x"}, META_KEY: {"id": "d1"}}]
    assert list(leaf_rows(b, None, "window", None, budget(), scope)) == scope


def test_a_windows_rows_are_held_within_the_budget() -> None:
    b = bind_select(parse_statement(f"SELECT k, RANK() OVER (ORDER BY k) AS r FROM {KS}"))  # type: ignore[arg-type]
    rows = [{KS: {"k": i, "pad": "p" * 100}, META_KEY: {"id": f"d{i}"}} for i in range(3000)]
    with pytest.raises(ShardexError) as err:
        list(root_rows(b, None, "window", None, 0, budget(64 * 1024), [iter(rows)]))
    assert err.value.code is ErrorCode.QUERY_MEMORY_LIMIT
    assert err.value.details["operator"] == "WINDOW"
    assert len(list(root_rows(b, None, "window", None, 0, budget(), [iter(rows)]))) == 3000


def test_the_physical_plan_of_a_window_query() -> None:
    p = _plan(
        f"SELECT age, RANK() OVER (PARTITION BY city ORDER BY age) AS r FROM {USERS} "
        "WHERE age > 3 ORDER BY age LIMIT 5"
    )
    # Every row after WHERE goes to the root: no limit pushed down, no index order.
    assert p.mode == "window" and p.top is None and not p.ordered and not p.late
    assert p.leaves and p.choice is not None
    explained = p.explain()["distributed"]["fragments"]
    assert "ScopeRows" in explained[1]["does"] and "Limit(5)" not in explained[1]["does"]
    assert explained[0]["does"][:3] == ["Concat", "Window", "Project"]
    grouped = _plan(f"SELECT city, RANK() OVER (ORDER BY COUNT(*)) AS r FROM {USERS} GROUP BY city")
    assert (
        grouped.mode == "group"
        and "Window" in grouped.explain()["distributed"]["fragments"][0]["does"]
    )


def test_window_mode_leaves_send_only_the_paths_the_statement_reads() -> None:
    doc = {"k": 1, "g": {"x": 1, "y": [1, 2], "z": 3}, "pad": "p" * 50, "arr": [{"q": 1}, 5]}
    scope = [{KS: doc, META_KEY: {"id": "d1"}}]

    def sent(select: str) -> Any:
        b = bind_select(parse_statement(f"SELECT {select} FROM {KS}"))  # type: ignore[arg-type]
        assert mode_of(b) == "window"
        (row,) = leaf_rows(b, None, "window", None, budget(), scope)
        assert row[META_KEY] == {"id": "d1"}
        return row[KS]

    over = "ROW_NUMBER() OVER (PARTITION BY g.x ORDER BY k)"
    assert sent(f"k, {over} AS r") == {"k": 1, "g": {"x": 1}}
    # A field missing from the document stays missing; an element read keeps its array.
    assert sent(f"k, nope.a AS n, arr[0].q AS q, {over} AS r") == {
        "k": 1,
        "g": {"x": 1},
        "arr": [{"q": 1}, 5],
    }
    # A value read whole keeps everything below it; reading the document keeps all of it.
    assert sent(f"g AS whole, g.y[1] AS y, {over} AS r") == {"k": 1, "g": doc["g"]}
    assert sent(f"OBJECT_LENGTH(self) AS n, {over} AS r") == doc
    assert sent(f"{KS} AS d, {over} AS r") == doc


NESTED = [
    f"SELECT k, ROW_NUMBER() OVER (PARTITION BY n.g ORDER BY n.v, k) AS rn, n.v AS v FROM {KS}",
    f"SELECT k, SUM(n.a) OVER (PARTITION BY n.g) AS s, OBJECT_LENGTH(n) AS w FROM {KS}",
    f"SELECT k, RANK() OVER (ORDER BY n.v) AS r, n.missing AS m FROM {KS} WHERE n.a > 2",
]


@pytest.mark.parametrize("sql", NESTED)
def test_windows_over_cut_documents_equal_the_reference(sql: str) -> None:
    docs = {
        d: {"k": doc["k"], "n": {f: doc[f] for f in ("g", "v", "a") if f in doc}, "pad": [1] * 9}
        for d, doc in _docs().items()
    }
    ref = LocalEngine()
    ref.create_keyspace(KS)
    ref.keyspaces[KS].update(docs)
    want = ref.query(sql)
    assert want
    got = _run(sql, docs, 3)
    assert sorted(map(_canon, got)) == sorted(map(_canon, want))
