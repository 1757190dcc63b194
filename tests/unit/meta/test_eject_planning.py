"""Planning an eject (pure): chains widened with replacement replicas before the ejected
replicas leave them, actives moved off the ejected nodes onto nodes outside their chains,
and member tombstones that no merge order or incarnation brings back."""

from __future__ import annotations

import itertools

import msgspec
import pytest

from shardex.core.topology import Topology
from shardex.errors import ShardexError
from shardex.meta.member_list import MemberInfo, merge_members, self_entry
from shardex.meta.rebalance_state import plan_eject_moves
from shardex.meta.replica_placement import added_replicas, chains_after_moves, narrowed, widened


def widen_chains(
    before: Topology,
    remaining: list[str],
    r: int,
    groups: dict[str, str],
    targets: dict[int, str] | None = None,
) -> Topology:
    """What an eject's step 1 makes of ``before``."""
    return widened(before, chains_after_moves(before, remaining, r, groups, targets))


def narrow(
    before: Topology, now: Topology, remaining: list[str], targets: dict[int, str] | None = None
) -> Topology:
    """What an eject's step 3 makes of ``now``: the chains planned on ``before``."""
    return narrowed(now, chains_after_moves(before, remaining, 1, {}, targets))


def topo(assignment: dict[int, str], replicas: dict[int, list[str]], seq: int = 1) -> Topology:
    return Topology(seq_num=seq, assignment=assignment, replicas=replicas)


# three nodes, one replica each, balanced: what `cluster start --nodes 3` creates
THREE = topo(
    {0: "n1", 1: "n2", 2: "n3", 3: "n1", 4: "n2", 5: "n3"},
    {0: ["n2"], 1: ["n3"], 2: ["n1"], 3: ["n3"], 4: ["n1"], 5: ["n2"]},
)


def test_widening_appends_a_replacement_and_keeps_the_ejected_replica() -> None:
    wide = widen_chains(THREE, ["n1", "n2"], 1, {})
    assert wide.seq_num == 2 and wide.assignment == THREE.assignment
    # the chains with a replica on n3 get one on the remaining node outside the chain
    assert wide.replicas == {
        0: ["n2"],
        1: ["n3", "n1"],
        2: ["n1"],
        3: ["n3", "n2"],
        4: ["n1"],
        5: ["n2"],
    }
    assert added_replicas(THREE, wide) == {1: ["n1"], 3: ["n2"]}
    for p in wide.assignment:  # copies of a partition stay on distinct nodes
        assert len(set(wide.chain(p))) == len(wide.chain(p))
    narrow_t = narrow(THREE, wide, ["n1", "n2"])
    assert narrow_t.seq_num == 3
    assert narrow_t.replicas == {0: ["n2"], 1: ["n1"], 2: ["n1"], 3: ["n2"], 4: ["n1"], 5: ["n2"]}
    # no chain got shorter at any step: widened >= before, narrowed >= 1 + num_replicas
    for p in THREE.assignment:
        assert len(wide.chain(p)) >= len(THREE.chain(p))
        assert len(narrow_t.chain(p)) == 2
    # before the new replicas are in the chains (not widened), nothing leaves them
    assert narrow(THREE, THREE, ["n1", "n2"]) is THREE


def test_nothing_to_replace_returns_the_same_topology() -> None:
    t = topo({0: "n1", 1: "n2"}, {0: ["n2"], 1: ["n1"]})
    assert widen_chains(t, ["n1", "n2"], 1, {}) is t
    assert narrow(t, t, ["n1", "n2"]) is t
    assert added_replicas(t, t) == {}


def test_widening_with_no_node_to_spare_adds_nothing() -> None:
    # two nodes, n2 ejected: the chain can only be n1 alone afterwards
    t = topo({0: "n1", 1: "n2"}, {0: ["n2"], 1: ["n1"]})
    assert widen_chains(t, ["n1"], 1, {}) is t
    assert narrow(t, t, ["n1"]).replicas == {1: ["n1"]}


def test_widening_respects_server_groups() -> None:
    groups = {"n1": "a", "n2": "b", "n3": "a", "n4": "b"}
    t = topo({0: "n1", 1: "n3"}, {0: ["n4"], 1: ["n2"]})
    wide = widen_chains(t, ["n1", "n2", "n3"], 1, groups)  # n4 ejected
    assert wide.replicas[0] == ["n4", "n2"]  # the other group, not n3 (group a, like n1)


def test_eject_moves_go_outside_the_chain_and_spread() -> None:
    narrow_t = narrow(THREE, widen_chains(THREE, ["n1", "n2"], 1, {}), ["n1", "n2"])
    moves = plan_eject_moves({"ks": ("u", narrow_t)}, ["n3"], ["n1", "n2", "n3"])
    assert moves == [("ks", "u", 2, "n3", "n2", 3), ("ks", "u", 5, "n3", "n1", 3)]
    for _ks, _u, p, _src, target, _seq in moves:
        assert target not in narrow_t.chain(p)  # the replica keeps its copy: chain full


def test_eject_moves_fall_back_to_the_least_loaded_when_every_node_is_in_the_chain() -> None:
    t = topo({0: "n3", 1: "n3", 2: "n1"}, {0: ["n1", "n2"], 1: ["n2", "n1"], 2: ["n2"]})
    moves = plan_eject_moves({"ks": ("u", t)}, ["n3"], ["n1", "n2"])
    assert [(p, target) for _k, _u, p, _s, target, _q in moves] == [(0, "n2"), (1, "n1")]


def test_eject_moves_only_touch_ejected_nodes() -> None:
    t = topo({0: "n1", 1: "n1", 2: "n1", 3: "n2"}, {})  # unbalanced, nobody ejected from
    assert plan_eject_moves({"ks": ("u", t)}, ["n4"], ["n1", "n2", "n3"]) == []


def test_eject_of_every_node_is_refused() -> None:
    with pytest.raises(ShardexError) as e:
        plan_eject_moves({"ks": ("u", THREE)}, ["n1", "n2"], ["n1", "n2"])
    assert e.value.code.name == "BAD_REQUEST" and e.value.details["eject"] == ["n1", "n2"]


def member(mid: str, inc: int = 1, removed: bool = False) -> MemberInfo:
    return MemberInfo(
        member_id=mid,
        name=mid,
        address=f"{mid}:1",
        services=("data",),
        incarnation=inc,
        removed=removed,
    )


def test_a_tombstone_wins_every_merge_order_and_any_later_incarnation() -> None:
    tomb = member("n3", 2, removed=True)
    lists = [[member("n3", 1)], [tomb], [member("n3", 9)], [member("n1")]]
    for order in itertools.permutations(lists):
        merged: dict[str, MemberInfo] = {}
        for entries in order:
            merged = merge_members(merged, entries)
        assert merged["n3"] == tomb and merged["n1"] == member("n1")


def test_a_removed_node_restarting_keeps_its_tombstone() -> None:
    tomb = member("n3", 2, removed=True)
    assert self_entry("n3", "n3", "n3:1", ("data",), [tomb]) == tomb
    # an entry persisted before tombstones existed decodes as a live member
    old = msgspec.msgpack.encode({"member_id": "x", "name": "x", "address": "a", "services": []})
    assert msgspec.msgpack.decode(old, type=MemberInfo).removed is False


def test_an_active_moving_onto_its_replicas_node_gets_that_replica_replaced_first() -> None:
    # both partitions of n3 have their replica on n1: balance sends one of them there
    t = topo(
        {0: "n1", 1: "n2", 2: "n3", 3: "n1", 4: "n2", 5: "n3"},
        {0: ["n2"], 1: ["n3"], 2: ["n1"], 3: ["n2"], 4: ["n3"], 5: ["n1"]},
    )
    moves = plan_eject_moves({"ks": ("u", t)}, ["n3"], ["n1", "n2"])
    targets = {p: target for _k, _u, p, _s, target, _q in moves}
    assert targets == {2: "n2", 5: "n1"}  # 3 actives each: balanced, not all on n2
    wide = widen_chains(t, ["n1", "n2"], 1, {}, targets)
    # p5: n1 becomes its active (its replica copy is dropped when the copy starts): n2 is
    # added as the replica it will have; p1, p4: n3's replicas replaced by n1
    assert wide.replicas == {
        0: ["n2"],
        1: ["n3", "n1"],
        2: ["n1"],
        3: ["n2"],
        4: ["n3", "n1"],
        5: ["n1", "n2"],
    }
    narrow_t = narrow(t, wide, ["n1", "n2"], targets)
    assert narrow_t.replicas[5] == ["n1", "n2"]  # n1 stays until its move drops it
    after = narrow_t.with_moves(targets)
    for p in range(6):
        assert sorted(after.chain(p)) == ["n1", "n2"]
    # during p5's copy (n1's replica copy dropped), n2 holds a caught-up replica
    assert "n2" in narrow_t.replicas[5]
