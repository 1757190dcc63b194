"""SQL index leaves on other copies of their partitions (``sql/exec/failover.py``): the plan
puts each leaf on the first live copy not avoided, a lost leaf node is recognised in the
protocol's errors, and the statement runs again only while no row has left."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import pytest

from shardex.core.topology import Topology
from shardex.errors import ErrorCode, NodeUnavailable, ShardexError
from shardex.meta.index_definition import make_definition
from shardex.meta.index_state import ACTIVE, IndexRecord
from shardex.meta.state import KeyspaceMeta, StateContext
from shardex.sql.exec.failover import failed_leaf, failing_over, or_else_when_lost
from shardex.sql.exec.plan import PhysicalPlan, plan_select
from shardex.sql.protocol.initiator import cancelled
from shardex.sql.syntax import parse_statement
from shardex.sql.syntax.bind import bind_select

KS = "users"
MEMBERS = {"n1": "m1", "n2": "m2", "n3": "m3"}
BY_AGE = IndexRecord(
    definition=make_definition(
        id="id-age",
        name="by_age",
        keyspace=KS,
        keys=["age"],
        num_partition=3,
        partition_by=["META().id"],
    ),
    state=ACTIVE,
)
# Each partition's primary on n(p+1), its replica on the next node.
TOPO = Topology(
    seq_num=1,
    assignment={0: "n1", 1: "n2", 2: "n3"},
    replicas={0: ["n2"], 1: ["n3"], 2: ["n1"]},
)
STATE = StateContext(
    keyspaces={KS: KeyspaceMeta(name=KS, num_partitions=8, uuid="u", created_cas=1)},
    indexes={BY_AGE.id: BY_AGE},
    index_topologies={BY_AGE.id: [TOPO]},
)
SQL = f"SELECT age FROM {KS} WHERE age > 1"


def _plan(members: dict[str, str] = MEMBERS, avoid: frozenset[str] = frozenset()) -> PhysicalPlan:
    b = bind_select(parse_statement(SQL))
    return plan_select(b, None, state=STATE, members=members, avoid=avoid)


def _leaves(plan: PhysicalPlan) -> dict[str, list[int]]:
    return {leaf.node: leaf.partitions for leaf in plan.leaves}


def test_leaves_go_to_the_first_live_copy_not_avoided() -> None:
    assert _leaves(_plan()) == {"n1": [0], "n2": [1], "n3": [2]}
    assert _leaves(_plan(avoid=frozenset({"n2"}))) == {"n1": [0], "n3": [1, 2]}
    down = {n: m for n, m in MEMBERS.items() if n != "n3"}  # n3 not a live member
    assert _leaves(_plan(down)) == {"n1": [0, 2], "n2": [1]}
    with pytest.raises(ShardexError) as err:
        _plan(down, avoid=frozenset({"n2"}))  # partition 1: n2 avoided, n3 down
    assert err.value.code is ErrorCode.NODE_UNAVAILABLE
    assert err.value.details["partition"] == 1 and err.value.details["node"] == ["n2", "n3"]


def test_the_lost_leaf_node_is_read_from_the_protocols_errors() -> None:
    plan = _plan()
    assert failed_leaf(cancelled("lost", "link_lost", member="m2"), plan) == "n2"
    assert failed_leaf(cancelled("gone", "participant_left", member="m3"), plan) == "n3"
    assert failed_leaf(NodeUnavailable("down", details={"value": "m1"}), plan) == "n1"
    assert failed_leaf(NodeUnavailable("down", details={"indexer": "n2"}), plan) == "n2"
    # a timeout, a member that runs no leaf, a slice's own error: not a lost leaf
    assert failed_leaf(cancelled("slow", "timeout"), plan) is None
    assert failed_leaf(cancelled("lost", "link_lost", member="m9"), plan) is None
    rollback = ShardexError("rb", code=ErrorCode.INDEX_IN_ROLLBACK, details={"indexer": "n1"})
    assert failed_leaf(rollback, plan) is None


async def _chunks(rows: list[list[bytes]], error: ShardexError | None) -> AsyncIterator[Any]:
    for chunk in rows:
        yield chunk
    if error is not None:
        raise error


async def test_a_leaf_lost_before_any_row_runs_the_statement_again_elsewhere() -> None:
    plan = _plan()
    reruns: list[str] = []

    async def rerun(node: str) -> tuple[PhysicalPlan, AsyncIterator[Any]]:
        reruns.append(node)
        return _plan(avoid=frozenset(reruns)), _chunks([[b"a", b"b"], [b"c"]], None)

    lost = cancelled("lost", "link_lost", member="m2")
    got = [c async for c in failing_over(plan, _chunks([[]], lost), rerun, deadline=1e12)]
    assert got == [[], [b"a", b"b"], [b"c"]] and reruns == ["n2"]


async def test_once_rows_left_or_without_a_copy_the_error_ends_the_statement() -> None:
    plan = _plan()
    lost = cancelled("lost", "link_lost", member="m2")

    async def rerun(node: str) -> tuple[PhysicalPlan, AsyncIterator[Any]]:
        raise AssertionError("rows were sent: no re-run")

    with pytest.raises(ShardexError) as err:
        _ = [c async for c in failing_over(plan, _chunks([[b"a"]], lost), rerun, 1e12)]
    assert err.value is lost

    async def no_copy(node: str) -> tuple[PhysicalPlan, AsyncIterator[Any]]:
        raise ShardexError("no copy", code=ErrorCode.NODE_UNAVAILABLE)

    with pytest.raises(ShardexError) as err:
        _ = [c async for c in failing_over(plan, _chunks([], lost), no_copy, 1e12)]
    assert err.value is lost  # the lost leaf's error, not the re-plan's


async def test_a_repeatable_statement_resumes_after_the_rows_it_sent() -> None:
    """Rows went to the client, then a leaf was lost: a repeatable plan (the same rows in
    the same order at the pinned TS) runs again and skips what was handed on already, even
    across chunk boundaries and a second loss; an unrepeatable one ends with the error."""
    plan = _plan()
    rows = [b"r0", b"r1", b"r2", b"r3", b"r4", b"r5"]
    runs = iter(
        [
            _chunks([rows[0:1], rows[1:4]], cancelled("lost", "link_lost", member="m3")),
            _chunks([rows[0:2], rows[2:6]], None),
        ]
    )

    async def rerun(node: str) -> tuple[PhysicalPlan, AsyncIterator[Any]]:
        return _plan(avoid=frozenset({node})), next(runs)

    first = _chunks([rows[0:2]], cancelled("lost", "link_lost", member="m2"))
    got = [c async for c in failing_over(plan, first, rerun, 1e12, repeatable=True)]
    assert [r for c in got for r in c] == rows  # each row once, in order
    assert [] not in got  # chunks wholly sent before are not handed on empty


async def test_a_resumed_run_that_comes_up_short_fails_rather_than_lose_rows() -> None:
    async def rerun(node: str) -> tuple[PhysicalPlan, AsyncIterator[Any]]:
        return _plan(avoid=frozenset({node})), _chunks([[b"r0"]], None)

    lost = cancelled("lost", "link_lost", member="m2")
    with pytest.raises(ShardexError) as err:
        _ = [
            c
            async for c in failing_over(
                _plan(), _chunks([[b"r0", b"r1"]], lost), rerun, 1e12, repeatable=True
            )
        ]
    assert err.value.code is ErrorCode.INTERNAL and err.value.details["missing"] == 1


@pytest.mark.parametrize(
    ("sql", "repeatable"),
    [
        (f"SELECT age, META().id AS id FROM {KS} WHERE age > 1 ORDER BY age, META().id", True),
        (f"SELECT age FROM {KS} WHERE age > 1 ORDER BY age DESC, META().id DESC", True),
        (f"SELECT age FROM {KS} WHERE age > 1 ORDER BY age", False),  # ties: any order
        (f"SELECT age FROM {KS} WHERE age > 1", False),  # no order at all
        (f"SELECT name FROM {KS} WHERE age > 1 ORDER BY age, META().id", False),  # fetched
        (f"SELECT DISTINCT age FROM {KS} WHERE age > 1 ORDER BY age, META().id", False),
    ],
)
def test_which_plans_are_repeatable(sql: str, repeatable: bool) -> None:
    b = bind_select(parse_statement(sql))
    plan = plan_select(b, None, state=STATE, members=MEMBERS)
    assert plan.repeatable is repeatable


async def test_a_plan_without_failover_runs_the_other_way_when_a_node_is_lost_first() -> None:
    """A join between fragments (no copy holds a join fragment's state) falls back to a plan
    whose parts fail over, but only while no row has left and only for a lost node."""
    fallbacks: list[int] = []

    async def fallback() -> AsyncIterator[Any]:
        fallbacks.append(1)
        return _chunks([[b"x"], [b"y"]], None)

    lost = cancelled("lost", "participant_left", member="m2")
    got = [c async for c in or_else_when_lost(_chunks([[]], lost), fallback, "join")]
    assert got == [[], [b"x"], [b"y"]] and fallbacks == [1]

    down = ShardexError("cannot connect", code=ErrorCode.NODE_UNAVAILABLE)
    got = [c async for c in or_else_when_lost(_chunks([], down), fallback, "join")]
    assert got == [[b"x"], [b"y"]] and fallbacks == [1, 1]

    with pytest.raises(ShardexError) as err:  # a row left: the loss is the statement's error
        _ = [c async for c in or_else_when_lost(_chunks([[b"a"]], lost), fallback, "join")]
    assert err.value is lost and fallbacks == [1, 1]

    for other in (
        ShardexError("bad", code=ErrorCode.EXPRESSION_EVAL),
        ShardexError("too slow", code=ErrorCode.TIMEOUT),
        cancelled("by the user", "cancelled"),
    ):
        with pytest.raises(ShardexError) as err:
            _ = [c async for c in or_else_when_lost(_chunks([], other), fallback, "join")]
        assert err.value is other and fallbacks == [1, 1]
