"""Replica chain placement: distinct nodes, distinct server groups, balance, determinism,
too few nodes, and restoring chains after a node is removed (property-style loops over
cluster shapes)."""

from __future__ import annotations

from collections import Counter

import pytest

from shardex.core.topology import Topology, balanced_assignment, rebalance_moves
from shardex.errors import ErrorCode, ShardexError
from shardex.meta.replica_placement import (
    chain_assignment,
    check_num_replicas,
    default_num_replicas,
    restore_replicas,
)

PARTITION_COUNTS = (*range(1, 20), 31, 64, 100)


def names(n: int) -> list[str]:
    return [f"n{i}" for i in range(n)]


def replica_load(replicas: dict[int, list[str]], nodes: list[str]) -> Counter[str]:
    load: Counter[str] = Counter(dict.fromkeys(nodes, 0))
    for chain in replicas.values():
        load.update(chain)
    return load


def spread(load: Counter[str]) -> int:
    return max(load.values()) - min(load.values())


def test_without_groups_chains_are_distinct_full_and_balanced() -> None:
    for n in range(1, 8):
        nodes = names(n)
        for r in range(4):
            for p in PARTITION_COUNTS:
                placed = chain_assignment(p, nodes, r, {})
                assert placed.assignment == balanced_assignment(p, nodes)  # actives as before
                want = min(r, n - 1)
                assert set(placed.replicas) == (set(range(p)) if want else set())
                for part, reps in placed.replicas.items():
                    chain = [placed.assignment[part], *reps]
                    assert len(reps) == want and len(set(chain)) == len(chain), (n, r, p)
                if want:
                    assert spread(replica_load(placed.replicas, nodes)) <= 1, (n, r, p)
                assert bool(placed.warnings) == (r > 0 and n < r + 1), (n, r, placed.warnings)


def test_neighbouring_partitions_rotate_their_replicas() -> None:
    placed = chain_assignment(6, ["a", "b", "c"], 1, {})
    assert placed.replicas == {0: ["b"], 1: ["c"], 2: ["a"], 3: ["b"], 4: ["c"], 5: ["a"]}
    assert placed.warnings == []
    assert chain_assignment(4, ["a", "b"], 0, {}).replicas == {}


def test_the_placement_is_deterministic_whatever_the_node_order() -> None:
    nodes = names(5)
    groups = {n: f"g{i % 3}" for i, n in enumerate(nodes)}
    first = chain_assignment(64, nodes, 2, groups)
    assert chain_assignment(64, list(reversed(nodes)), 2, dict(reversed(groups.items()))) == first
    assert chain_assignment(64, nodes, 2, groups) == first


def test_copies_go_to_distinct_groups_when_there_are_enough() -> None:
    for num_groups in range(2, 5):
        for per_group in range(1, 4):
            nodes = names(num_groups * per_group)
            groups = {n: f"zone{i % num_groups}" for i, n in enumerate(nodes)}
            for r in range(1, num_groups):  # enough groups for every copy
                for p in (1, 7, 16, 64):
                    placed = chain_assignment(p, nodes, r, groups)
                    assert placed.warnings == []
                    for part, reps in placed.replicas.items():
                        chain = [placed.assignment[part], *reps]
                        assert len({groups[x] for x in chain}) == r + 1, (num_groups, r, chain)
                    # equal groups: balance is possible, and kept
                    assert spread(replica_load(placed.replicas, nodes)) <= 1


def test_uneven_groups_keep_copies_apart_before_balance() -> None:
    # one node in rack a, three in rack b: every b-partition's replica must be on a1
    groups = {"a1": "a", "b1": "b", "b2": "b", "b3": "b"}
    placed = chain_assignment(8, list(groups), 1, groups)
    for part, reps in placed.replicas.items():
        assert groups[placed.assignment[part]] != groups[reps[0]]
    assert placed.warnings == []


def test_too_few_groups_falls_back_to_distinct_nodes_and_warns() -> None:
    nodes = names(4)
    groups = {n: f"g{i % 2}" for i, n in enumerate(nodes)}
    placed = chain_assignment(16, nodes, 2, groups)  # chains of 3 copies, 2 groups
    assert len(placed.warnings) == 1 and "2 server group(s)" in placed.warnings[0]
    for part, reps in placed.replicas.items():
        chain = [placed.assignment[part], *reps]
        assert len(set(chain)) == 3
        assert {groups[x] for x in chain} == {"g0", "g1"}  # as spread as the groups allow
    # unlabelled nodes are groups of their own: no group warning
    assert chain_assignment(16, nodes, 2, {}).warnings == []


def test_too_few_nodes_places_what_fits_and_warns() -> None:
    placed = chain_assignment(4, ["a", "b"], 3, {})
    assert all(len(r) == 1 for r in placed.replicas.values())
    assert "not enough data nodes" in placed.warnings[0] and "2 node(s)" in placed.warnings[0]
    alone = chain_assignment(4, ["a"], 1, {})
    assert alone.replicas == {} and "not enough data nodes" in alone.warnings[0]


def test_num_replicas_is_checked() -> None:
    assert [check_num_replicas(v) for v in range(4)] == [0, 1, 2, 3]
    for bad in (-1, 4, True, "1", 1.5, None):
        with pytest.raises(ShardexError) as info:
            check_num_replicas(bad)
        assert info.value.code == ErrorCode.BAD_REQUEST
        assert repr(bad) in info.value.message and "0 to 3" in info.value.message
    with pytest.raises(ShardexError):
        chain_assignment(4, ["a", "b"], 4, {})
    assert [default_num_replicas(n) for n in (0, 1, 2, 5)] == [0, 0, 1, 1]


def failover(topology: Topology, gone: str) -> Topology:
    """What a failover leaves: ``gone`` out of every chain, its actives promoted to their
    first replica (a partition with no replica left keeps its lost active)."""
    assignment, replicas = {}, {}
    for p in topology.assignment:
        chain = [n for n in topology.chain(p) if n != gone] or [gone]
        assignment[p], replicas[p] = chain[0], chain[1:]
    return Topology(seq_num=topology.seq_num + 1, assignment=assignment, replicas=replicas)


def chains(topology: Topology) -> dict[int, list[str]]:
    return {p: r for p, r in topology.replicas.items() if r}


def check_restored(before: Topology, after: Topology, up: list[str], r: int) -> None:
    # a new topology exactly when something changed
    assert after is before or after.seq_num == before.seq_num + 1
    assert (after is before) == (chains(after) == chains(before))
    assert after.assignment == before.assignment  # actives never move
    for p in before.assignment:
        chain = after.chain(p)
        assert len(set(chain)) == len(chain)
        assert all(n in up for n in chain[1:])
        others = [n for n in up if n != before.assignment[p]]
        assert len(chain) - 1 == min(r, len(others))
        kept = [n for n in before.replicas.get(p, ()) if n in up]
        assert chain[1 : 1 + len(kept)] == kept  # surviving copies kept, first in line


def test_restore_after_a_failover_for_every_node_shape() -> None:
    for n in range(2, 7):
        nodes = names(n)
        for r in range(1, 4):
            for p in (1, 5, 8, 13, 64):
                placed = chain_assignment(p, nodes, r, {})
                topo = Topology(seq_num=1, assignment=placed.assignment, replicas=placed.replicas)
                for gone in nodes:
                    up = [x for x in nodes if x != gone]
                    short = failover(topo, gone)
                    restored = restore_replicas(short, up, r, {})
                    check_restored(short, restored, up, r)
                    assert gone not in {x for q in restored.assignment for x in restored.chain(q)}
                    # nothing left to do: the same object, no new topology
                    assert restore_replicas(restored, up, r, {}) is restored
                    assert restore_replicas(short, list(reversed(up)), r, {}) == restored


def test_restore_removes_replicas_of_a_node_whose_actives_were_moved_away() -> None:
    for n in range(3, 7):
        nodes = names(n)
        for r in range(1, 4):
            placed = chain_assignment(32, nodes, r, {})
            topo = Topology(seq_num=1, assignment=placed.assignment, replicas=placed.replicas)
            up = nodes[:-1]
            moved = topo.with_moves(rebalance_moves(topo.assignment, up))
            restored = restore_replicas(moved, up, r, {})
            check_restored(moved, restored, up, r)


def test_restore_fills_an_empty_placement_like_a_fresh_one() -> None:
    for n in range(2, 7):
        nodes = names(n)
        for r in range(1, 4):
            bare = Topology(seq_num=4, assignment=balanced_assignment(40, nodes))
            restored = restore_replicas(bare, nodes, r, {})
            assert spread(replica_load(restored.replicas, nodes)) <= 1
            check_restored(bare, restored, nodes, r)


def test_restore_spreads_a_lost_nodes_copies_over_the_survivors() -> None:
    placed = chain_assignment(8, ["n0", "n1", "n2", "n3"], 1, {})
    topo = Topology(seq_num=1, assignment=placed.assignment, replicas=placed.replicas)
    restored = restore_replicas(failover(topo, "n3"), ["n0", "n1", "n2"], 1, {})
    copies: Counter[str] = Counter()
    for p in restored.assignment:
        copies.update(restored.chain(p))
    assert spread(copies) <= 1 and sum(copies.values()) == 16


def test_restore_honours_groups_and_trims_nothing_it_need_not() -> None:
    groups = {"a1": "a", "a2": "a", "b1": "b", "b2": "b"}
    placed = chain_assignment(8, list(groups), 1, groups)
    topo = Topology(seq_num=1, assignment=placed.assignment, replicas=placed.replicas)
    up = ["a1", "a2", "b1"]
    restored = restore_replicas(failover(topo, "b2"), up, 1, groups)
    for p in restored.assignment:
        chain = restored.chain(p)
        assert {groups[x] for x in chain} == {"a", "b"}
    assert restore_replicas(topo, list(groups), 1, groups) is topo
    # a lower num_replicas trims the chains from the end of the promotion order
    two = chain_assignment(8, list(groups), 2, groups)
    topo2 = Topology(seq_num=1, assignment=two.assignment, replicas=two.replicas)
    trimmed = restore_replicas(topo2, list(groups), 1, groups)
    assert trimmed.replicas == {p: r[:1] for p, r in two.replicas.items()}


def test_restore_keeps_a_down_actives_group_apart() -> None:
    # p0's active a1 is down (not failed over yet): its replica must still avoid rack a
    groups = {"a1": "a", "a2": "a", "b1": "b"}
    short = Topology(seq_num=3, assignment={0: "a1"}, replicas={0: []})
    restored = restore_replicas(short, ["a2", "b1"], 1, groups)
    assert restored.replicas == {0: ["b1"]}
