"""Planning the index copies a rebalance builds (``plan_index_copies``) and publishing them
(``publish_index_move``): lost replicas restored on up indexers without a copy, spread by
load and server group; an ejected indexer's copies moved; what cannot be placed said."""

from __future__ import annotations

import msgspec
import pytest

from shardex.core.topology import Topology
from shardex.errors import ErrorCode, ShardexError
from shardex.index import make_definition
from shardex.meta.index_copy_plan import plan_index_copies, slice_load
from shardex.meta.index_rebalance_state import (
    ADD,
    MOVE,
    new_index_moves,
    publish_index_move,
)
from shardex.meta.index_state import ACTIVE, BUILDING, IndexRecord
from shardex.meta.slice_weight import UNIT


def _index(
    index_id: str,
    parts: int,
    num_replica: int = 1,
    *,
    state: str = ACTIVE,
    nodes: list[str] | None = None,
) -> IndexRecord:
    defn = make_definition(
        id=index_id,
        name=f"ix_{index_id}",
        keyspace="ks",
        keys=["k"],
        partition_by=["META().id"],
        num_partition=parts,
    )
    return IndexRecord(definition=defn, state=state, num_replica=num_replica, nodes=nodes)


def _adds(plan) -> list[tuple[str, int, str, str]]:
    return [(m.index_id, m.partition, m.source, m.target) for m in plan.moves if m.kind == ADD]


def _moves(plan) -> list[tuple[str, int, str, str]]:
    return [(m.index_id, m.partition, m.source, m.target) for m in plan.moves if m.kind == MOVE]


# n3 died: its copies left the topology (DropIndexCopies), two chains are one copy short.
AFTER_LOSS = Topology(seq_num=5, assignment={0: "n1", 1: "n2", 2: "n2"}, replicas={1: ["n1"]})


def test_short_chains_get_copies_on_the_least_loaded_up_nodes_without_one() -> None:
    indexes = {"r": _index("r", 3)}
    plan = plan_index_copies(indexes, {"r": [AFTER_LOSS]}, ["n1", "n2", "n4"])
    # n4 holds nothing: both new copies go there (each from the partition's surviving copy).
    assert _adds(plan) == [("r", 0, "n1", "n4"), ("r", 2, "n2", "n4")]
    assert all(m.base_seq == 5 and m.index_name == "ix_r" for m in plan.moves)
    assert plan.unplaced == [] and plan.short == []
    # Without n4 each goes to the other live node; never onto the node holding the copy.
    plan = plan_index_copies(indexes, {"r": [AFTER_LOSS]}, ["n1", "n2"])
    assert _adds(plan) == [("r", 0, "n1", "n2"), ("r", 2, "n2", "n1")]


def test_copies_spread_by_load_and_prefer_a_new_server_group() -> None:
    indexes = {"r": _index("r", 4)}
    lost = Topology(seq_num=2, assignment={0: "n1", 1: "n1", 2: "n1", 3: "n1"})
    up = ["n1", "n2", "n3", "n4"]
    plan = plan_index_copies(indexes, {"r": [lost]}, up)
    assert sorted(t for *_x, t in _adds(plan)) == ["n2", "n2", "n3", "n4"]
    # n2 shares n1's rack: the copies go to the other rack, however loaded.
    groups = {"n1": "rack-a", "n2": "rack-a", "n3": "rack-b", "n4": "rack-b"}
    plan = plan_index_copies(indexes, {"r": [lost]}, up, groups)
    assert sorted(t for *_x, t in _adds(plan)) == ["n3", "n3", "n4", "n4"]
    # Other indexes' slices break ties (``slice_load``): n3 is full of them, so n4 takes
    # the first copy; this index's own spread comes first, so they alternate after it.
    other = {"o": _index("o", 6, num_replica=0)}
    busy = Topology(seq_num=1, assignment=dict.fromkeys(range(6), "n3"))
    topologies = {"r": [lost], "o": [busy]}
    assert slice_load({**indexes, **other}, topologies)["n3"] == 6 * (UNIT // 6)
    plan = plan_index_copies({**indexes, **other}, topologies, up, groups)
    assert [t for *_x, t in _adds(plan)] == ["n4", "n3", "n4", "n3"]


def test_full_chains_unreplicated_and_building_indexes_get_nothing() -> None:
    full = Topology(seq_num=1, assignment={0: "n1", 1: "n2"}, replicas={0: ["n2"], 1: ["n1"]})
    alone = Topology(seq_num=1, assignment={0: "n1", 1: "n2"})
    indexes = {
        "full": _index("full", 2),
        "plain": _index("plain", 2, num_replica=0),
        "building": _index("building", 2, state=BUILDING),
    }
    topologies = {"full": [full], "plain": [alone], "building": [alone]}
    plan = plan_index_copies(indexes, topologies, ["n1", "n2", "n3"])
    assert plan.moves == [] and plan.short == [] and plan.unplaced == []


def test_pinned_nodes_first_and_what_cannot_be_added_is_short() -> None:
    pinned = {"r": _index("r", 3, nodes=["n1", "n2", "n3"])}
    # n4 is emptier, but the index was pinned to n1..n3.
    plan = plan_index_copies(pinned, {"r": [AFTER_LOSS]}, ["n1", "n2", "n3", "n4"])
    assert [t for *_x, t in _adds(plan)] == ["n3", "n3"]
    # Two replicas wanted, one other node: one copy each, the rest reported short.
    two = {"r": _index("r", 3, num_replica=2)}
    plan = plan_index_copies(two, {"r": [AFTER_LOSS]}, ["n1", "n2"])
    assert _adds(plan) == [("r", 0, "n1", "n2"), ("r", 2, "n2", "n1")]
    assert [(u.slice, u.why) for u in plan.short] == [
        ("ks.ix_r/0", "every up indexer holds a copy of it already"),
        ("ks.ix_r/1", "every up indexer holds a copy of it already"),
        ("ks.ix_r/2", "every up indexer holds a copy of it already"),
    ]
    # The only copy of partition 0 is on a down node: nothing to build from.
    plan = plan_index_copies({"r": _index("r", 3)}, {"r": [AFTER_LOSS]}, ["n2", "n3"])
    assert ("r", 0) not in {(i, p) for i, p, *_x in _adds(plan)}
    assert [(u.slice, u.why) for u in plan.short] == [("ks.ix_r/0", "no up copy to build one from")]


def test_an_ejected_nodes_primary_and_replica_copies_move_to_nodes_without_one() -> None:
    indexes = {"r": _index("r", 3), "plain": _index("plain", 2, num_replica=0)}
    topo = Topology(
        seq_num=7, assignment={0: "n3", 1: "n1", 2: "n2"}, replicas={0: ["n1"], 1: ["n3"]}
    )
    plain = Topology(seq_num=2, assignment={0: "n3", 1: "n1"})
    topologies = {"r": [topo], "plain": [plain]}
    plan = plan_index_copies(indexes, topologies, ["n1", "n2", "n3"], eject=["n3"], restore=False)
    assert _moves(plan) == [("plain", 0, "n3", "n2"), ("r", 0, "n3", "n2"), ("r", 1, "n3", "n2")]
    assert _adds(plan) == [] and plan.unplaced == []  # r/2 is short: the next rebalance's
    # With restoring, r/2 gets its copy too, never on the node being ejected.
    plan = plan_index_copies(indexes, topologies, ["n1", "n2", "n3"], eject=["n3"])
    assert _adds(plan) == [("r", 2, "n2", "n1")]


def test_an_ejected_copy_with_nowhere_to_go_is_unplaced_saying_why() -> None:
    indexes = {"r": _index("r", 2), "b": _index("b", 1, state=BUILDING)}
    topo = Topology(seq_num=3, assignment={0: "n1", 1: "n3"}, replicas={0: ["n3"], 1: ["n1"]})
    building = Topology(seq_num=1, assignment={0: "n3"})
    topologies = {"r": [topo], "b": [building]}
    plan = plan_index_copies(indexes, topologies, ["n1", "n3"], eject=["n3"], restore=False)
    assert plan.moves == []
    assert [str(u) for u in plan.unplaced] == [
        "ks.ix_b/0 on n3: the index is BUILDING (only an ACTIVE index's slices move)",
        "ks.ix_r/0 on n3: every other up indexer holds a copy of the partition already",
        "ks.ix_r/1 on n3: every other up indexer holds a copy of the partition already",
    ]
    down = plan_index_copies(indexes, topologies, ["n1", "n2"], eject=["n3"], restore=False)
    assert {u.why for u in down.unplaced if u.slice.startswith("ks.ix_r")} == {
        "the node is down: its slice cannot be copied off it"
    }


def _record(source: str, target: str, kind: str, p: int = 1):
    (m,) = new_index_moves([("r", "ix_r", "ks", p, source, target, 4, kind)], ["mid"])
    return msgspec.structs.replace(m, status="moving")


def test_publish_adds_a_replica_or_replaces_the_moved_copy_in_its_place() -> None:
    topo = Topology(seq_num=4, assignment={0: "n1", 1: "n2"}, replicas={0: ["n2"]})
    history, added = publish_index_move([topo], _record("n2", "n3", ADD))
    assert added.seq_num == 5 and added.chain(1) == ["n2", "n3"] and added.chain(0) == ["n1", "n2"]
    assert history == [topo, added]
    _h, moved = publish_index_move([topo], _record("n2", "n3", MOVE, p=0))  # a replica's place
    assert moved.chain(0) == ["n1", "n3"] and moved.chain(1) == ["n2"]
    _h, moved = publish_index_move([topo], _record("n1", "n3", MOVE, p=0))  # the primary's
    assert moved.chain(0) == ["n3", "n2"]
    for record, why in (
        (_record("n1", "n2", ADD, p=0), "holds a copy of it already"),
        (_record("n3", "n1", ADD, p=1), "holds no copy of it any more"),
    ):
        with pytest.raises(ShardexError) as err:
            publish_index_move([topo], record)
        assert err.value.code is ErrorCode.STALE_TOPOLOGY and why in err.value.message
