"""The distributed path of a join statement in one process: ``join_sides`` (which
conjuncts each side statement gets, each join's method over the cluster's indexes) and
``run_join`` (side statements started, inner sides gathered, fetched by key or probed per
batch, then the root's operators), with side statements answered by ``LocalEngine`` over
the same documents. Every generated join query of ``tests/sql_reference`` must give what
``LocalEngine`` gives for the whole statement, with and without indexes on the join keys."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from types import SimpleNamespace
from typing import Any

import pytest

from shardex.errors import ErrorCode, ShardexError
from shardex.meta.index_definition import IndexDefinition, IndexKey
from shardex.meta.index_state import ACTIVE
from shardex.sql.exec.join_plan import join_sides, probe_params, side_params
from shardex.sql.exec.join_run import run_join
from shardex.sql.exec.memory import NodeMemory
from shardex.sql.exec.plan import PhysicalPlan
from shardex.sql.exec.rows import decode_row, encode_row
from shardex.sql.local import LocalEngine
from shardex.sql.local_rows import eval_count
from shardex.sql.syntax import parse_statement
from shardex.sql.syntax.bind import bind_select
from tests.sql_reference.join_queries import (
    INDEXES,
    LEFT,
    RIGHT,
    join_queries,
    make_join_documents,
)

MiB = 1 << 20


def _state(*indexes: tuple[str, str, str]) -> Any:
    """A cluster state with ``lj``, ``rj`` and built indexes (name, keyspace, key)."""
    records = {
        name: SimpleNamespace(
            definition=IndexDefinition(id=name, name=name, keyspace=ks, keys=[IndexKey(expr=key)]),
            state=ACTIVE,
        )
        for name, ks, key in indexes
    }
    return SimpleNamespace(keyspaces={LEFT: 1, RIGHT: 1, "o": 1, "c": 1}, indexes=records)


def _sides(sql: str, *indexes: tuple[str, str, str]) -> Any:
    return join_sides(bind_select(parse_statement(sql)), _state(*indexes))  # type: ignore[arg-type]


def test_side_statements_get_only_the_conjuncts_that_cannot_change_the_result() -> None:
    s = _sides(
        "SELECT * FROM o JOIN c ON c.k = o.k AND c.x > 1 AND o.y = 2 "
        "WHERE o.z = 3 AND c.w = 4 AND o.a = c.a"
    )
    assert s.from_sql == "SELECT RAW [META(o).id, o] FROM o AS o WHERE (o.z = 3)"
    assert s.gathered[0] == "SELECT RAW [META(c).id, c] FROM c AS c WHERE (c.x > 1) AND (c.w = 4)"
    # LEFT: WHERE about c is evaluated after c may be MISSING; ON about c narrows c.
    s = _sides("SELECT * FROM o LEFT JOIN c ON c.k = o.k AND c.x > 1 WHERE c.w = 4")
    assert s.gathered[0].endswith("WHERE (c.x > 1)")
    s = _sides("SELECT * FROM o NEST c ON c.k = o.k WHERE c IS NOT MISSING")
    assert "WHERE" not in s.gathered[0]
    # RIGHT: o may be MISSING (WHERE about o stays at the join), c is kept whole (its ON
    # conjuncts stay); ON about o narrows o, WHERE about c narrows c.
    s = _sides(
        "SELECT * FROM o RIGHT JOIN c ON c.k = o.k AND o.y = 2 AND c.x = 1 "
        "WHERE o.z = 3 AND c.w = 4"
    )
    assert s.from_sql.endswith("WHERE (o.y = 2)")
    assert s.gathered[0].endswith("WHERE (c.w = 4)")
    # Subqueries, LET variables and other aliases never go down.
    s = _sides(
        "SELECT * FROM o JOIN c ON c.k = o.k LET v = 1 "
        "WHERE o.a = v AND o.b IN (SELECT RAW 1) AND o.c = 1"
    )
    assert s.from_sql.endswith("WHERE (o.c = 1)")


def test_side_statements_bind_and_keep_meta_and_hints() -> None:
    s = _sides(
        "SELECT * FROM o USE KEYS $1 JOIN c USE INDEX (ix) ON c.k = o.k AND META(c).id > 'c1'"
    )
    assert s.from_sql == "SELECT RAW [META(o).id, o] FROM o AS o USE KEYS $1"
    # USE INDEX names the index a probe reads: a gathered side chooses its own.
    assert s.gathered[0] == 'SELECT RAW [META(c).id, c] FROM c AS c WHERE (META(c).id > "c1")'
    for sql in (s.from_sql, s.gathered[0]):
        bind_select(parse_statement(sql))  # type: ignore[arg-type]
    s = _sides("SELECT * FROM o JOIN c ON c.k = o.k + 1", ("by_k", "c", "k"))
    assert s.plans[0].method == "index_nl"
    assert s.probes[0] == (
        "SELECT RAW [META(c).id, c] FROM c AS c USE INDEX (by_k) WHERE (c.k IN $shardex_join_keys)"
    )
    # A partial index, or one USE INDEX does not name, is no probe's.
    assert (
        _sides("SELECT * FROM o JOIN c USE INDEX (other) ON c.k = o.k", ("by_k", "c", "k"))
        .plans[0]
        .method
        == "hash"
    )
    s = _sides("SELECT * FROM o JOIN c ON META(c).id = o.cid")
    assert (s.plans[0].method, s.probes[0]) == (
        "index_nl",
        "SELECT RAW [META(c).id, c] FROM c AS c WHERE (META(c).id IN $shardex_join_keys)",
    )


def test_side_statements_carry_only_the_fields_the_statement_reads() -> None:
    def docs(sql: str) -> list[str]:
        s = _sides(sql)
        assert s.from_sql is not None
        sides = [s.from_sql, *s.gathered.values()]
        for text in sides:
            bind_select(parse_statement(text))  # type: ignore[arg-type]
        return [t.split(" FROM ")[0].removeprefix("SELECT RAW ") for t in sides]

    # The fields read anywhere (projection, ON, WHERE, ORDER BY), nested ones nested; an
    # array element read keeps its array; META() is no field.
    assert docs(
        "SELECT o.a.b AS x, c.l[0].y AS y FROM o JOIN c ON c.k = o.k "
        "WHERE META(o).id > 'a' AND o.a.z = 1 ORDER BY c.s"
    ) == [
        '[META(o).id, {"a": {"b": o.a.b, "z": o.a.z}, "k": o.k}]',
        '[META(c).id, {"k": c.k, "l": c.l, "s": c.s}]',
    ]
    # Read whole: a field read whole keeps what is below it; the alias alone, a subquery
    # over it, a dynamic field or UNNEST (its element paths) keep the whole document.
    assert (
        docs("SELECT o.a, o.a.b FROM o JOIN c ON c.k = o.k")[0]
        == '[META(o).id, {"a": o.a, "k": o.k}]'
    )
    assert docs("SELECT o, c.v FROM o JOIN c ON c.k = o.k")[0] == "[META(o).id, o]"
    assert docs("SELECT * FROM o JOIN c ON c.k = o.k") == ["[META(o).id, o]", "[META(c).id, c]"]
    assert (
        docs("SELECT (SELECT RAW 1 FROM c.l x) AS s FROM o JOIN c ON c.k = o.k")[1]
        == "[META(c).id, c]"
    )
    assert docs("SELECT c[o.f] AS v FROM o JOIN c ON c.k = o.k")[1] == "[META(c).id, c]"
    assert docs("SELECT u FROM o JOIN c ON c.k = o.k UNNEST o.l u") == [
        "[META(o).id, o]",
        "[META(c).id, c]",
    ]
    # NEST: the alias is the array of matches; reading it whole keeps the documents whole.
    assert docs("SELECT n FROM o NEST c n ON n.k = o.k")[1] == "[META(n).id, n]"


def test_side_parameters_are_named() -> None:
    assert side_params([10, "x"]) == {"1": 10, "2": "x"}
    assert side_params({"a": 1}) == {"a": 1} and side_params(None) is None
    assert probe_params([10], ["k"]) == {"1": 10, "shardex_join_keys": ["k"]}


class _Docs:
    """``DocumentAccess`` over a ``LocalEngine``'s keyspaces."""

    def __init__(self, engine: LocalEngine) -> None:
        self.engine = engine
        self.fetches = 0

    async def get_many(self, keyspace: str, ids: list[str]) -> list[tuple[str, Any]]:
        self.fetches += 1
        docs = self.engine.keyspace(keyspace)
        return [(i, docs[i]) for i in ids if i in docs]

    def get_many_now(self, keyspace: str, ids: list[str]) -> None:
        return None


def statement_plan(sql: str, state: Any, params: Any = None) -> PhysicalPlan:
    """A join statement's plan as ``plan_select`` makes it: LIMIT, OFFSET and its sides."""
    b = bind_select(parse_statement(sql))  # type: ignore[arg-type]
    plan = PhysicalPlan(
        b,
        "join",
        "join",
        limit=eval_count(b.limit, params, "LIMIT"),
        offset=eval_count(b.offset, params, "OFFSET") or 0,
    )
    plan.join = join_sides(b, state)
    return plan


def join_engine(seed: int, n_left: int, n_right: int) -> LocalEngine:
    """``LocalEngine`` over ``make_join_documents``' two keyspaces."""
    left, right = make_join_documents(seed, n_left, n_right)
    e = LocalEngine()
    for name, docs in ((LEFT, left), (RIGHT, right)):
        e.create_keyspace(name)
        e.keyspaces[name].update(docs)
    return e


def _distributed(
    engine: LocalEngine, sql: str, state: Any, params: Any = None, budget: int = 64 * MiB
) -> tuple[list[Any], list[str]]:
    """The statement's rows through ``join_sides`` and ``run_join``, and the side
    statements it started."""
    plan = statement_plan(sql, state, params)
    plan.query_id = "q1"
    started: list[str] = []

    async def start(side: str, side_params: Any) -> AsyncIterator[list[bytes]]:
        started.append(side)
        rows = engine.query(side, side_params)

        async def chunks() -> AsyncIterator[list[bytes]]:
            for i in range(0, len(rows), 7):  # several chunks
                yield [encode_row(r) for r in rows[i : i + 7]]

        return chunks()

    async def run() -> list[Any]:
        out: list[Any] = []
        chunks = run_join(plan, params, start, _Docs(engine), NodeMemory(), budget, False)
        async for cells in chunks:  # type: ignore[attr-defined]
            out += [decode_row(c) for c in cells]
        return out

    return asyncio.run(run()), started


@pytest.fixture(scope="module")
def engine() -> LocalEngine:
    e = join_engine(1, 150, 120)
    for ddl in INDEXES:  # what a probe statement's USE INDEX names (the results are the same)
        e.execute(ddl)
    return e


@pytest.mark.parametrize("indexed", [False, True], ids=["gathered", "probed"])
def test_the_distributed_join_equals_the_local_engine(engine: LocalEngine, indexed: bool) -> None:
    state = _state(("rj_b", RIGHT, "b"), ("lj_k", LEFT, "k")) if indexed else _state()
    probes = 0
    for q in join_queries(11 if indexed else 12, 60):
        got, started = _distributed(engine, q.sqlpp, state)
        want = engine.query(q.sqlpp)
        probes += sum("shardex_join_keys" in s for s in started)
        if q.ordered:
            assert got == want, q.sqlpp
        else:
            assert sorted(map(repr, got)) == sorted(map(repr, want)), q.sqlpp
    assert (probes > 0) is indexed  # the indexes were probed, and only then


def test_lookup_joins_fetch_per_batch_not_per_row(engine: LocalEngine) -> None:
    docs = _Docs(engine)
    sql = f"SELECT l.id, r.id AS rid FROM {LEFT} AS l JOIN {RIGHT} AS r ON KEYS l.k"
    b = bind_select(parse_statement(sql))  # type: ignore[arg-type]
    plan = PhysicalPlan(b, "join", "join", query_id="q2")
    plan.join = join_sides(b, _state())

    async def start(side: str, p: Any) -> AsyncIterator[list[bytes]]:
        rows = engine.query(side, p)

        async def chunks() -> AsyncIterator[list[bytes]]:
            yield [encode_row(r) for r in rows]

        return chunks()

    async def run() -> int:
        n = 0
        async for cells in run_join(plan, None, start, docs, NodeMemory(), 64 * MiB, False):  # type: ignore[attr-defined]
            n += len(cells)
        return n

    assert asyncio.run(run()) == len(engine.query(sql))
    assert docs.fetches == 1  # 150 rows: one batch


def test_a_gathered_inner_side_is_charged_to_the_query_budget(engine: LocalEngine) -> None:
    sql = f"SELECT COUNT(*) AS n FROM {LEFT} AS l JOIN {RIGHT} AS r ON l.b = r.b"
    with pytest.raises(ShardexError) as e:
        _distributed(engine, sql, _state(), budget=20_000)
    assert e.value.code is ErrorCode.QUERY_MEMORY_LIMIT and e.value.details["operator"] == "join"


def test_a_table_of_the_left_rows_is_charged_too(engine: LocalEngine) -> None:
    """USE HASH(PROBE) and RIGHT JOIN hold the left rows: over the budget, the same error."""
    for sql in (
        f"SELECT COUNT(*) AS n FROM {LEFT} AS l JOIN {RIGHT} AS r USE HASH(PROBE) "
        "ON l.b = r.b AND r.id < 3",
        f"SELECT COUNT(*) AS n FROM {LEFT} AS l RIGHT JOIN {RIGHT} AS r ON l.b = r.b "
        "WHERE r.id < 3",
    ):
        assert _distributed(engine, sql, _state())[0] == engine.query(sql)
        with pytest.raises(ShardexError) as e:
            _distributed(engine, sql, _state(), budget=20_000)
        assert e.value.code is ErrorCode.QUERY_MEMORY_LIMIT, sql


def test_unnest_and_joins_interleave_at_the_initiator() -> None:
    e = LocalEngine()
    e.create_keyspace("o")
    e.create_keyspace("c")
    e.keyspaces["c"].update({f"c{i}": {"name": f"n{i}", "tier": i % 3} for i in range(6)})
    e.keyspaces["o"].update(
        {f"o{i}": {"items": [f"c{j}" for j in range(i % 4)], "t": i % 3} for i in range(9)}
    )
    state = _state()
    for sql in (
        "SELECT META(o).id AS o, i, c.name FROM o UNNEST o.items AS i JOIN c ON KEYS i",
        "SELECT META(o).id AS o, i, c.name FROM o LEFT UNNEST o.items AS i "
        "LEFT JOIN c ON META(c).id = i WHERE o.t > 0",
        "SELECT META(o).id AS o, d.name, x FROM o JOIN c AS d ON d.tier = o.t "
        "UNNEST o.items AS x ORDER BY o, d.name, x",
        "SELECT o.t, COUNT(*) AS n FROM o NEST c ON KEYS o.items UNNEST c AS x GROUP BY o.t",
    ):
        got, _ = _distributed(e, sql, state)
        want = e.query(sql)
        assert want and (got == want if "ORDER BY" in sql else _bag(got) == _bag(want)), sql


def _bag(rows: list[Any]) -> list[str]:
    return sorted(map(repr, rows))
