"""Topology math: balanced placement, minimal rebalance moves, the history."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from shardex.core.topology import (
    Topology,
    TopologyHistory,
    balanced_assignment,
    rebalance_moves,
)
from shardex.errors import ErrorCode, ShardexError

node_names = st.lists(st.sampled_from([f"n{i}" for i in range(6)]), min_size=1, unique=True)


@given(st.integers(1, 200), node_names)
def test_balanced_assignment_is_within_one(n, nodes):
    counts = {}
    for node in balanced_assignment(n, nodes).values():
        counts[node] = counts.get(node, 0) + 1
    loads = [counts.get(x, 0) for x in nodes]
    assert max(loads) - min(loads) <= 1 and sum(loads) == n


@given(st.integers(1, 128), node_names, node_names)
def test_rebalance_balances_with_few_moves(n, before, after):
    assignment = balanced_assignment(n, before)
    moves = rebalance_moves(assignment, after)
    result = {**assignment, **moves}
    loads = [sum(1 for v in result.values() if v == x) for x in after]
    assert max(loads) - min(loads) <= 1
    assert set(result.values()) <= set(after)
    assert all(assignment[p] != node for p, node in moves.items())  # no pointless moves
    # every partition on a removed node moves; beyond that, only surplus moves
    forced = sum(1 for v in assignment.values() if v not in after)
    surplus = sum(
        max(0, sum(1 for v in assignment.values() if v == x) - (n // len(set(after)) + 1))
        for x in set(after)
    )
    assert len(moves) <= forced + surplus + len(set(after))


def test_rebalance_is_a_no_op_when_balanced():
    a = balanced_assignment(64, ["a", "b", "c"])
    assert rebalance_moves(a, ["a", "b", "c"]) == {}


def test_adding_a_node_moves_only_to_it():
    a = balanced_assignment(64, ["a", "b"])
    moves = rebalance_moves(a, ["a", "b", "c"])
    assert set(moves.values()) == {"c"} and len(moves) == 21


def test_with_moves_and_moved_since():
    t0 = Topology(seq_num=1, assignment=balanced_assignment(4, ["a", "b"]))
    t1 = t0.with_moves({1: "c"})
    assert t1.seq_num == 2 and t1.owner(1) == "c" and t0.owner(1) == "b"
    assert t1.moved_since(t0) == {1: ("b", "c")}
    assert t1.partitions_of("c") == [1]
    with pytest.raises(ShardexError):
        t0.with_moves({99: "a"})


def test_history_keeps_every_topology_and_refuses_gaps():
    t0 = Topology(seq_num=0, assignment={0: "a"})
    h = TopologyHistory([t0])
    t1 = t0.with_moves({0: "b"})
    h.append(t1)
    assert h.get(0) == t0 and h.get(1) == t1 and h.latest == t1 and len(h) == 2
    with pytest.raises(ShardexError) as err:
        h.append(Topology(seq_num=5, assignment={}))
    assert err.value.code is ErrorCode.STALE_TOPOLOGY
    with pytest.raises(ShardexError) as err:
        h.get(7)
    assert err.value.code is ErrorCode.TOPOLOGY_NOT_FOUND


def test_bad_partition_count_is_refused():
    with pytest.raises(ShardexError) as err:
        balanced_assignment(0, ["a"])
    assert err.value.details["value"] == 0
