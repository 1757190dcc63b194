"""A join between fragments (decision 0135) in one process: which statements qualify
(``exchange_join``), the leaves' partitioning of each side by its join key
(``partition_pack``), the join fragments' work on their partitions (``fragment_rows``) and
the root's merge (``root_rows``), with the side statements answered by ``LocalEngine``.
Every generated INNER / LEFT hash join of ``tests/sql_reference`` must give, over 1, 3 and
4 join fragments, what ``LocalEngine`` gives for the whole statement; a row sent to any
partition but its key's would lose its matches."""

from __future__ import annotations

from typing import Any

import pytest

from shardex.sql.exec.fragment_rows import mode_of, root_rows
from shardex.sql.exec.join_exchange import (
    FROM_SIDE,
    INNER_SIDE,
    exchange_query_plan,
    fragment_rows,
    partition_pack,
    side_texts,
)
from shardex.sql.exec.join_plan import exchange_join, side_params
from shardex.sql.exec.plan import PhysicalPlan
from shardex.sql.exec.rows import decode_row, encode_row
from shardex.sql.local import LocalEngine
from shardex.sql.planner.joins import plan_join
from shardex.sql.syntax import parse_statement
from shardex.sql.syntax.bind import bind_select
from tests.sql_reference.join_queries import LEFT, RIGHT, join_queries
from tests.unit.sql.budgets import budget
from tests.unit.sql.test_sql_exec_joins import _state, join_engine, statement_plan


@pytest.fixture(scope="module")
def engine() -> LocalEngine:
    return join_engine(3, 160, 110)


def _plan(sql: str, params: Any = None) -> PhysicalPlan:
    return statement_plan(sql, _state(), params)


def exchanged(engine: LocalEngine, sql: str, partitions: int, params: Any = None) -> list[Any]:
    """The statement's rows as the fragments of an exchange join make them: each side's
    rows partitioned, each partition joined, the outputs (through the wire's encoding)
    merged by the root."""
    plan = _plan(sql, params)
    b, sides = plan.bound, plan.join
    assert sides is not None and sides.exchange == "hash", sql
    named = side_params(params)
    parts: dict[str, list[list[Any]]] = {}
    for side, text in zip((FROM_SIDE, INNER_SIDE), side_texts(sides), strict=True):
        out: list[list[Any]] = [[] for _ in range(partitions)]
        for p, batch in partition_pack(b, side, named, partitions)(engine.query(text, named)):
            out[p] += [decode_row(c) for c in batch.column(0).to_pylist()]
        parts[side] = out
    mode = mode_of(b)
    args = {"mode": mode, "top": plan.top}
    plans = [plan_join(j) for j in b.joins]
    outputs = []
    for i in range(partitions):
        rows = fragment_rows(
            b,
            plans,
            parts[FROM_SIDE][i],
            parts[INNER_SIDE][i],
            named,
            args,
            budget(),
            None,  # type: ignore[arg-type]
        )
        outputs.append(iter([decode_row(encode_row(r)) for r in rows]))
    return list(root_rows(b, named, mode, plan.limit, plan.offset, budget(), outputs))


def test_which_joins_run_between_fragments() -> None:
    def method(sql: str) -> str | None:
        return _plan(sql).join.exchange  # type: ignore[union-attr]

    on = "ON l.b = r.b"
    assert method(f"SELECT * FROM {LEFT} l JOIN {RIGHT} r {on}") == "hash"
    assert method(f"SELECT * FROM {LEFT} l LEFT JOIN {RIGHT} r USE HASH(PROBE) {on}") == "hash"
    assert method(f"SELECT * FROM {LEFT} l RIGHT JOIN {RIGHT} r {on}") == "hash"
    for sql in (
        f"SELECT * FROM {LEFT} l RIGHT JOIN {RIGHT} r ON l.b < r.b",  # no key: a nested loop
        f"SELECT * FROM {LEFT} l NEST {RIGHT} r {on}",
        f"SELECT * FROM {LEFT} l JOIN {RIGHT} r ON KEYS l.k",
        f"SELECT * FROM {LEFT} l JOIN {RIGHT} r ON META(r).id = l.k",  # by key: index_nl
        f"SELECT * FROM {LEFT} l JOIN {RIGHT} r USE NL {on}",
        f"SELECT * FROM {LEFT} l JOIN {RIGHT} r ON l.b < r.b",  # no equi-join key
        f"SELECT * FROM {LEFT} l JOIN {RIGHT} r {on} JOIN {RIGHT} s ON s.b = r.b",
        f"SELECT * FROM {LEFT} l UNNEST l.xs AS x JOIN {RIGHT} r ON r.b = x",
        f"SELECT * FROM [1, 2] AS l JOIN {RIGHT} r ON r.b = l",
    ):
        assert method(sql) is None, sql
    b = bind_select(parse_statement(f"SELECT * FROM {LEFT} l JOIN {RIGHT} r {on}"))  # type: ignore[arg-type]
    assert exchange_join([plan_join(j) for j in b.joins], None) is None


@pytest.mark.parametrize("partitions", [1, 3, 4])
def test_the_exchange_join_equals_the_local_engine(engine: LocalEngine, partitions: int) -> None:
    checked = 0
    for q in join_queries(21 + partitions, 80):
        if _plan(q.sqlpp).join.exchange is None:  # type: ignore[union-attr]
            continue
        got, want = exchanged(engine, q.sqlpp, partitions), engine.query(q.sqlpp)
        if q.ordered:
            assert got == want, q.sqlpp
        else:
            assert sorted(map(repr, got)) == sorted(map(repr, want)), q.sqlpp
        checked += 1
    assert checked >= 20


def test_keys_of_any_spelling_meet_and_unkeyed_left_rows_come_out(engine: LocalEngine) -> None:
    """1 and 1.0 are equal keys (one partition); the kept side's rows whose key is NULL or
    MISSING come out unmatched (a LEFT JOIN's left rows, a RIGHT JOIN's inner documents),
    the other side's are dropped at the leaf."""
    e = LocalEngine()
    e.create_keyspace("a")
    e.create_keyspace("c")
    e.keyspaces["a"].update({f"a{i}": {"k": v} for i, v in enumerate([1, 2.0, None, "1", [1]])})
    e.keyspaces["a"]["a9"] = {}
    e.keyspaces["c"].update({f"c{i}": {"k": v} for i, v in enumerate([1.0, 2, None, "1", [1.0]])})
    for sql in (
        "SELECT META(a).id AS a, META(c).id AS c FROM a JOIN c ON c.k = a.k",
        "SELECT META(a).id AS a, META(c).id AS c FROM a LEFT JOIN c ON c.k = a.k",
        "SELECT META(a).id AS a, META(c).id AS c FROM a RIGHT JOIN c ON c.k = a.k",
    ):
        want = sorted(map(repr, e.query(sql)))
        assert len(want) >= 4
        for n in (2, 5, 7):
            assert sorted(map(repr, exchanged(e, sql, n))) == want, (sql, n)
    rows = e.query("SELECT RAW [META(c).id, c] FROM c AS c")
    b = _plan("SELECT * FROM a JOIN c ON c.k = a.k").bound
    sent = [p for p, _ in partition_pack(b, INNER_SIDE, None, 3)(rows)]
    assert (
        sent
        and sum(batch.num_rows for _, batch in partition_pack(b, INNER_SIDE, None, 3)(rows))
        == len(rows) - 1
    )  # c2's key is NULL


def test_the_query_plan_hashes_both_sides_into_join_fragments_on_the_leaf_nodes() -> None:
    from types import SimpleNamespace

    plan = _plan(f"SELECT l.a, r.a AS ra FROM {LEFT} l JOIN {RIGHT} r ON l.b = r.b ORDER BY l.a")
    sides = side_texts(plan.join)  # type: ignore[arg-type]

    def side(leaves: dict[str, list[int]]) -> Any:
        def query_plan(*_: Any) -> Any:
            from shardex.api.sql_protocol import FragmentSpec

            frags = [
                FragmentSpec(
                    fragment_id=i + 1,
                    kind="sql.leaf",
                    members=[m],
                    args={"partitions": parts, "sql": "s"},
                    output=i + 1,
                )
                for i, (m, parts) in enumerate(leaves.items())
            ]
            return SimpleNamespace(fragments=[None, *frags])

        return SimpleNamespace(
            leaves=[SimpleNamespace(member=m) for m in leaves], query_plan=query_plan
        )

    qplan = exchange_query_plan(
        plan,
        "the statement",
        [(sides[0], side({"m2": [0, 1], "m3": [2]}), None), (sides[1], side({"m4": [0]}), None)],
        "m1",
        1 << 20,
        True,
    )
    root, join, from_leaves, inner_leaves = qplan.fragments
    assert root.members == ["m1"] and root.args["mode"] == "sort"
    assert root.args["by_sender"]  # the join fragments' sorted runs merge, one input each
    streamed = _plan(f"SELECT l.a FROM {LEFT} l JOIN {RIGHT} r ON l.b = r.b")
    qplan = exchange_query_plan(
        streamed, "s", [(sides[0], side({"m2": [0]}), None), (sides[1], side({"m3": [0]}), None)],
        "m1", 1 << 20, True,
    )  # fmt: skip
    # Streamed rows are taken as they come from any join fragment: reading one fragment's
    # stream alone would leave the others' senders, and the leaves they share, waiting.
    assert qplan.fragments[0].args["mode"] == "rows" and not qplan.fragments[0].args["by_sender"]
    assert join.members == ["m2", "m3", "m4"] and join.inputs == [2, 3]
    assert from_leaves.exchange == inner_leaves.exchange == "hash"
    assert from_leaves.members == ["m2", "m3"] and from_leaves.output == 2
    assert from_leaves.args["partitions_by_member"] == {"m2": [0, 1], "m3": [2]}
    assert inner_leaves.args["partition"] == {"sql": "the statement", "side": "inner"}


def test_explain_says_where_the_join_runs() -> None:
    from types import SimpleNamespace

    from shardex.sql.exec.join_plan import explain_join
    from shardex.sql.exec.tuning import check_tuning

    def planner(source: str) -> Any:
        side = SimpleNamespace(
            source=source, leaves=[object()], explain=lambda: {"distributed": {"source": source}}
        )
        return lambda sql, resolve: side

    sql = f"SELECT l.a FROM {LEFT} l LEFT JOIN {RIGHT} r ON r.b = l.b + 1"
    plan = _plan(sql)
    plan.side_planner = planner("index")
    where = explain_join(plan, plan.join)["distributed"]["join"]  # type: ignore[arg-type]
    assert where["exchange"] == "hash" and where["partition_by"] == ["l.b + 1", "r.b"]
    plan.side_planner = planner("keys")  # a side read by key: the initiator joins
    assert explain_join(plan, plan.join)["distributed"]["join"]["on"] == "initiator"  # type: ignore[arg-type]
    plan.side_planner = planner("index")
    plan.tuning = check_tuning({"join_exchange": False})
    assert explain_join(plan, plan.join)["distributed"]["join"]["on"] == "initiator"  # type: ignore[arg-type]


def test_equal_join_keys_hash_alike() -> None:
    from shardex.core.values import MISSING
    from shardex.sql.exec.join_exchange import hash_key

    for a, b in (
        ([1], [1.0]),
        ([2**60], [float(2**60)]),
        (["x"], ["x"]),
        ([[1, "a"]], [[1.0, "a"]]),
        ([{"k": 2}], [{"k": 2.0}]),
        ([1, "a"], [1.0, "a"]),
        ([-0.0], [0]),
    ):
        assert hash_key(a) == hash_key(b) is not None, (a, b)
    assert hash_key([1.5]) != hash_key([1]) and hash_key([True]) != hash_key([1])
    assert hash_key([None]) is None and hash_key([MISSING]) is None
    assert hash_key([1, None]) is None


def test_a_join_fragments_build_side_is_charged_to_the_query_budget(engine: LocalEngine) -> None:
    from shardex.errors import ErrorCode, ShardexError

    plan = _plan(f"SELECT COUNT(*) AS n FROM {LEFT} AS l JOIN {RIGHT} AS r ON l.b = r.b")
    b, sides = plan.bound, plan.join
    assert sides is not None
    from_rows, inner_rows = (engine.query(t) for t in side_texts(sides))
    plans = [plan_join(j) for j in b.joins]
    args = {"mode": mode_of(b), "top": None}
    rows = fragment_rows(b, plans, from_rows, inner_rows, None, args, budget(), None)  # type: ignore[arg-type]
    assert list(rows)
    with pytest.raises(ShardexError) as e:
        list(fragment_rows(b, plans, from_rows, inner_rows, None, args, budget(20_000), None))  # type: ignore[arg-type]
    assert e.value.code is ErrorCode.QUERY_MEMORY_LIMIT and e.value.details["operator"] == "join"


async def test_every_step_of_a_join_gets_what_is_left_of_the_statements_timeout(
    monkeypatch: Any,
) -> None:
    """The sides' pins, the query between fragments and, when a node is lost, the run at the
    initiator share the statement's one timeout: each step gets what the earlier ones left
    (before, each got the whole timeout: a stuck join could run several timeouts long)."""
    import asyncio
    from types import SimpleNamespace

    import shardex.sql.exec.join_start as join_start
    from shardex.api.query_ids import QueryId
    from shardex.api.sql_exec import SqlQuery
    from shardex.errors import ErrorCode, ShardexError
    from shardex.sql.exec.memory import NodeMemory

    sql = f"SELECT l.a FROM {LEFT} l JOIN {RIGHT} r ON l.b = r.b"
    plan = _plan(sql)
    step = 0.05  # each pin takes this long (a real wait: loop time only grows)
    timeout = 10.0
    got: dict[str, list[float]] = {"pin": [], "execute": [], "side": []}

    def side_plan(*_: Any, **__: Any) -> Any:
        from shardex.api.sql_protocol import FragmentSpec

        leaf = FragmentSpec(
            fragment_id=1, kind="sql.leaf", members=["m2"], args={"partitions": [0]}, output=1
        )
        return SimpleNamespace(
            source="index",
            leaves=[SimpleNamespace(member="m2")],
            query_plan=lambda *_: SimpleNamespace(fragments=[None, leaf]),
        )

    async def pin(p: Any, consistency: str, at: Any, left: float) -> None:
        got["pin"].append(left)
        await asyncio.sleep(step)

    async def execute(qplan: Any, named: Any, *, timeout: float, window: Any) -> Any:
        got["execute"].append(timeout)
        raise ShardexError(
            "lost", code=ErrorCode.QUERY_CANCELLED, details={"reason": "link_lost"}
        )  # a node lost while it starts: the join runs at the initiator

    async def start_select(msg: SqlQuery, *_: Any) -> Any:
        got["side"].append(msg.timeout)

        async def none() -> Any:
            return
            yield

        return None, None, none()

    async def state() -> None:
        return None

    monkeypatch.setattr(join_start, "plan_select", side_plan)
    svc = SimpleNamespace(
        quota=lambda msg: 1 << 20,
        query=SimpleNamespace(
            member_id="m1", new_query_id=lambda: QueryId("m1", "q"), execute=execute
        ),
        stability=SimpleNamespace(pin=pin),
        scan=SimpleNamespace(view=SimpleNamespace(state=state)),
        start_select=start_select,
        documents=None,
        memory=NodeMemory(),
    )
    msg = SqlQuery(stream_id=1, statement=sql, timeout=timeout)
    chunks = await join_start.start_join(svc, msg, sql, plan, None, dict)  # type: ignore[arg-type]
    assert [c async for c in chunks] == []
    (first, second), (execute_left,) = got["pin"], got["execute"]
    assert first <= timeout and second <= timeout - step
    assert execute_left <= timeout - 2 * step
    assert len(got["side"]) == 2 and all(t <= timeout - 2 * step for t in got["side"])
