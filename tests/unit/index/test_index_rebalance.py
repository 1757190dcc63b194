"""Index rebalance: the plan, the replicated move records, the dual routing, the timekeeper's
round, and the copy protocol on two real engines ending with the oracle."""

from __future__ import annotations

import random
from types import SimpleNamespace

import msgspec
import pytest

from shardex.api.slice_copy import ReadSliceCopy
from shardex.client.types import rebalance_from
from shardex.core.timestamp import Timestamp
from shardex.core.topology import Topology
from shardex.errors import ErrorCode, ShardexError
from shardex.index import make_definition
from shardex.index.engine import IndexerEngine
from shardex.index.keyversion import BROADCAST, DELETE, UPSERT
from shardex.index.records import STATE_ACTIVE, STATE_LOADING
from shardex.index.slice_copy import SliceMoves, back_rows_to_key_versions
from shardex.manager.index_rebalance import settle_index_moves
from shardex.meta.index_rebalance_state import (
    DONE,
    FAILED,
    MOVING,
    IndexMoveRecord,
    interrupt_index_moves,
    new_index_moves,
    plan_index_moves,
    publish_index_move,
    routed_targets,
)
from shardex.meta.index_state import ACTIVE, BUILDING, IndexRecord
from shardex.meta.rebalance_state import RebalanceRecord, finish
from shardex.meta.slice_weight import UNIT
from shardex.pipeline.project.router import IndexRoute, route
from shardex.testing.index import FakeKeyspace, LocalPipeline, random_workload

MOVABLE = make_definition(
    id="m", name="by_k", keyspace="ks", keys=["k"], partition_by=["k"], num_partition=4
)


def _index(index_id: str, n: int, *, state: str = ACTIVE, pinned: bool = False) -> IndexRecord:
    d = make_definition(
        id=index_id,
        name=f"ix_{index_id}",
        keyspace="ks",
        keys=["k"],
        partition_by=["META().id"] if n > 1 else None,
        num_partition=n,
    )
    return IndexRecord(definition=d, state=state, nodes=["n1"] if pinned else None)


def _load(moves, topologies, indexes) -> dict[str, int]:
    """Load per node (``slice_weight`` units) after ``moves``."""
    after = {i: dict(h[-1].assignment) for i, h in topologies.items()}
    for index_id, _name, _ks, p, src, dst, _seq, _kind in moves:
        assert after[index_id][p] == src
        after[index_id][p] = dst
    load: dict[str, int] = {}
    for index_id, a in after.items():
        for n in a.values():
            load[n] = load.get(n, 0) + UNIT // indexes[index_id].definition.num_partition
    return load


def test_plan_balances_slices_over_a_new_node_with_the_fewest_moves() -> None:
    indexes = {"a": _index("a", 4), "b": _index("b", 4)}
    topologies = {
        "a": [Topology(seq_num=1, assignment={0: "n1", 1: "n2", 2: "n3", 3: "n1"})],
        "b": [Topology(seq_num=2, assignment={0: "n2", 1: "n3", 2: "n1", 3: "n2"})],
    }
    nodes = ["n1", "n2", "n3", "n4"]
    moves = plan_index_moves(indexes, topologies, nodes, nodes)
    load = _load(moves, topologies, indexes)
    assert sorted(load.values()) == [UNIT // 2] * 4  # slices of one weight: 2 per node
    assert len(moves) == 2
    assert all(m[5] == "n4" for m in moves)
    assert {m[0] for m in moves} == {"a", "b"}  # spread: one slice of each index
    assert all(m[6] == topologies[m[0]][-1].seq_num for m in moves)
    assert plan_index_moves(indexes, topologies, nodes, nodes) == moves  # deterministic
    assert plan_index_moves(indexes, topologies, nodes[:2], nodes[:2]) == []  # 4/4


def test_plan_weighs_an_unpartitioned_slice_as_its_whole_index() -> None:
    # The same two indexes plus an unpartitioned one on n3: n3 carries 1.5 indexes' load.
    # Its one slice (a whole index) goes to the new node, and nothing else is worth a move.
    indexes = {"a": _index("a", 4), "b": _index("b", 4), "c": _index("c", 1)}
    topologies = {
        "a": [Topology(seq_num=1, assignment={0: "n1", 1: "n2", 2: "n3", 3: "n1"})],
        "b": [Topology(seq_num=2, assignment={0: "n2", 1: "n3", 2: "n1", 3: "n2"})],
        "c": [Topology(seq_num=1, assignment={0: "n3"})],
    }
    nodes = ["n1", "n2", "n3", "n4"]
    moves = plan_index_moves(indexes, topologies, nodes, nodes)
    assert [(m[0], m[3], m[4], m[5]) for m in moves] == [("c", 0, "n3", "n4")]


def test_plan_rebalances_partitioned_and_unpartitioned_indexes_by_weight() -> None:
    # One index partitioned 8 ways over 3 nodes (3/3/2), then two unpartitioned ones on the
    # nodes with the fewest slices. Counted in slices that is balanced (4/3/3); weighed,
    # n1 carries 1.375 indexes and n2 0.375: the 8-way index's slices move to n2.
    indexes = {"p": _index("p", 8), "x": _index("x", 1), "y": _index("y", 1)}
    topologies = {
        "p": [Topology(seq_num=1, assignment={i: f"n{i % 3 + 1}" for i in range(8)})],
        "x": [Topology(seq_num=1, assignment={0: "n3"})],
        "y": [Topology(seq_num=1, assignment={0: "n1"})],
    }
    nodes = ["n1", "n2", "n3"]
    moves = plan_index_moves(indexes, topologies, nodes, nodes)
    load = _load(moves, topologies, indexes)
    assert max(load.values()) - min(load.values()) <= UNIT // 8, load
    assert {m[0] for m in moves} == {"p"} and {m[5] for m in moves} == {"n2"}
    assert plan_index_moves(indexes, topologies, nodes, nodes) == moves  # deterministic


def test_plan_moves_only_active_unpinned_indexes_and_refuses_a_down_holder() -> None:
    indexes = {"a": _index("a", 4, state=BUILDING), "p": _index("p", 4, pinned=True)}
    topologies = {
        "a": [Topology(seq_num=1, assignment={p: "n1" for p in range(4)})],
        "p": [Topology(seq_num=1, assignment={p: "n1" for p in range(4)})],
    }
    assert plan_index_moves(indexes, topologies, ["n1", "n2"], ["n1", "n2"]) == []
    indexes["b"] = _index("b", 2)
    topologies["b"] = [Topology(seq_num=1, assignment={0: "n1", 1: "n1"})]
    moves = plan_index_moves(indexes, topologies, ["n1", "n2"], ["n1", "n2"])
    assert [(m[0], m[5]) for m in moves] == [("b", "n2"), ("b", "n2")]
    with pytest.raises(ShardexError) as err:
        plan_index_moves(indexes, topologies, ["n1", "n2"], ["n2"])
    assert err.value.code is ErrorCode.NODE_UNAVAILABLE
    assert err.value.details["down"] == ["n1"]
    # A replicated index's primary on a down node: the hint says its copy is about to leave
    # the topology; a replica copy there refuses nothing.
    indexes = {"r": _index("r", 2)}
    topologies = {"r": [Topology(seq_num=1, assignment={0: "n3", 1: "n2"}, replicas={0: ["n1"]})]}
    with pytest.raises(ShardexError) as err:
        plan_index_moves(indexes, topologies, ["n1", "n2", "n3"], ["n1", "n2"])
    assert err.value.details["down"] == ["n3"]
    assert "leave the index topology at the next published" in err.value.details["hint"]
    topologies = {"r": [Topology(seq_num=1, assignment={0: "n1", 1: "n2"}, replicas={0: ["n3"]})]}
    assert plan_index_moves(indexes, topologies, ["n1", "n2", "n3"], ["n1", "n2"]) == []


def test_plan_keeps_replicated_indexes_in_place_but_counts_their_copies() -> None:
    indexes = {"r": _index("r", 2), "b": _index("b", 1)}
    topologies = {
        "r": [Topology(seq_num=1, assignment={0: "n1", 1: "n2"}, replicas={0: ["n2"], 1: ["n1"]})],
        "b": [Topology(seq_num=1, assignment={0: "n1"})],
    }
    nodes = ["n1", "n2", "n3"]
    # n1 holds 3 slices (2 of them replicated ones), n2 2, n3 none: only b's slice may move.
    moves = plan_index_moves(indexes, topologies, nodes, nodes)
    assert [(m[0], m[3], m[4], m[5]) for m in moves] == [("b", 0, "n1", "n3")]


def _move(status: str = MOVING, routing: bool = True, p: int = 1) -> IndexMoveRecord:
    (m,) = new_index_moves([("m", "by_k", "ks", p, "n1", "n2", 3)], ["mid"])
    return msgspec.structs.replace(m, status=status, routing=routing)


def test_only_routing_moves_are_dual_routed_and_failover_aborts_moving_ones() -> None:
    assert routed_targets([_move()]) == {"m": {1: "n2"}}
    assert routed_targets([_move(routing=False)]) == {}  # the target's slice may not exist
    assert routed_targets([_move(status=DONE, routing=False)]) == {}
    after = interrupt_index_moves(
        [_move(), _move(status="planned", routing=False, p=2)], "master failover"
    )
    assert [(m.status, m.routing) for m in after] == [(FAILED, False), ("cancelled", False)]
    assert after[0].error == "master failover"
    record = RebalanceRecord(id="r", kind="rebalance", started_at=1.0, index_moves=[_move()])
    settled = finish(settle_index_moves(record, "crashed"), 2.0)
    assert settled.state == FAILED and settled.index_moves[0].status == FAILED
    done = RebalanceRecord(
        id="r", kind="rebalance", started_at=1.0, index_moves=[_move(status=DONE)]
    )
    assert finish(done, 2.0).state == DONE
    result = rebalance_from(done, {})
    assert [(m.index, m.partition, m.status) for m in result.moves] == [("by_k", 1, DONE)]


def test_publish_appends_the_next_index_topology_or_refuses_a_stale_source() -> None:
    history = [Topology(seq_num=3, assignment={0: "n1", 1: "n1", 2: "n2", 3: "n3"})]
    new_history, topo = publish_index_move(history, _move())
    assert [t.seq_num for t in new_history] == [3, 4]
    assert topo.assignment[1] == "n2" and new_history[0] is history[0]
    with pytest.raises(ShardexError) as err:
        publish_index_move(new_history, _move())
    assert err.value.code is ErrorCode.STALE_TOPOLOGY


def test_router_sends_a_moving_partition_to_source_and_target() -> None:
    place = {0: "n1", 1: "n1", 2: "n2", 3: "n3"}
    plain = {"m": IndexRoute.of(MOVABLE, place)}
    both = {"m": IndexRoute.of(MOVABLE, place, {1: "n4"})}
    rows = [
        ("m", 1, UPSERT, b"e1", "d1", 5, 10),  # into slice 1
        ("m", 2, UPSERT, b"e2", "d2", 5, 11),  # into slice 2: a deletion to slice 1 too
        ("m", BROADCAST, DELETE, b"", "d3", 6, 12),  # to every slice
    ]
    a, b = route(rows, plain), route(rows, both)
    for node in ("n1", "n2", "n3"):
        assert a.rows_for(node) == b.rows_for(node)
    slice1 = [r for r in b.rows_for("n1") if r[1] == 1]
    assert b.rows_for("n4") == slice1 and len(slice1) == 3


def test_timekeeper_round_includes_the_target_but_publishes_on_the_topology() -> None:
    from shardex.api.delivery import SliceAck, Stabilised
    from shardex.manager.timekeeper import plan_stabilise, verify_acks
    from shardex.meta.state import StateContext

    rec = IndexRecord(definition=MOVABLE, state=ACTIVE)
    topo = Topology(seq_num=1, assignment={0: "n1", 1: "n1", 2: "n2", 3: "n2"})
    state = StateContext(indexes={"m": rec}, index_topologies={"m": [topo]})
    plan = plan_stabilise(state, "ks", ["m"], {"m": {1: "n3"}})
    assert plan.by_node == {"n1": ["m"], "n2": ["m"], "n3": ["m"]}
    assert plan.moving == {"n3": {"m": [1]}}
    ts = Timestamp({0: (5, 1)})

    def ack(p: int, state: str = STATE_ACTIVE) -> SliceAck:
        applied = dict(ts.to_wire()) if state == STATE_ACTIVE else {}
        return SliceAck(index_id="m", partition=p, applied=applied, items_count=1, state=state)

    replies = {
        "n1": Stabilised(node="n1", incarnation="i", acks=[ack(0), ack(1)], missing=[]),
        "n2": Stabilised(node="n2", incarnation="i", acks=[ack(2), ack(3)], missing=[]),
        "n3": Stabilised(node="n3", incarnation="i", acks=[ack(1, STATE_LOADING)], missing=[]),
    }
    ready, not_ready = verify_acks(plan, replies, ts)
    assert ready == {"m": 4} and not_ready == {}  # the loading copy does not hold it back


def test_copy_protocol_on_two_engines_keeps_the_oracle(tmp_path) -> None:
    """Source n1 serves slice p; target n2 allocates a catching-up copy; batches are routed
    to both; n2 copies n1's back index at n1's applied TS T1 (queued versions <= T1 dropped,
    later ones kept), the topology switches, n1 drops its slice: the oracle holds at every
    later stability TS, including re-delivered batches."""
    rng = random.Random(7)
    ks = FakeKeyspace(num_partitions=4)
    engines = {n: IndexerEngine(tmp_path / n) for n in ("n1", "n2")}
    place = {"m": {p: "n1" for p in range(4)}}
    defn = make_definition(
        id="m", name="by_k", keyspace="ks", keys=["name"], partition_by=["city"], num_partition=4
    )
    pipe = LocalPipeline([defn], engines, place)
    pipe.create_slices()
    prev = ks.ts()

    def batch(n: int, stabilise_target: bool = False) -> Timestamp:
        nonlocal prev
        random_workload(ks, rng, n)
        end = ks.ts()
        changes = ks.changes(prev, end)
        pipe.deliver(changes, rng=rng, redeliver=0.3)
        pipe.stabilise(end)
        if stabilise_target:
            engines["n2"].stabilise_many(["m"], end)
        prev = end
        return end

    batch(60)
    p = 2
    target = engines["n2"].create_slice(defn, p)
    target.begin_load(Timestamp(), restart=True)  # what PrepareIncomingSlice does
    pipe.routes["m"] = IndexRoute.of(defn, place["m"], {p: "n2"})  # commit ``routing``
    e1 = batch(40, stabilise_target=True)
    assert target.state == STATE_LOADING and target.queued() > 0
    batch(40, stabilise_target=True)  # the source moves on: T1 > E1
    host = SimpleNamespace(engine=engines["n1"], name="n1", inline_io=True)
    moves = SliceMoves(host, None, None)  # type: ignore[arg-type]
    msg = ReadSliceCopy(copy_id="c", index_id="m", partition=p, not_before=dict(e1.to_wire()))
    session = moves._open_copy(msg)
    t1 = session.ts
    assert t1.covers(e1) and t1 != e1
    random_workload(ks, rng, 40)  # delivered while the copy runs, stabilised after it
    mid_end = ks.ts()
    pipe.deliver(ks.changes(prev, mid_end))
    after: bytes | None = None
    while True:
        rows, done = moves._read_chunk(session, after, 200)
        engines["n2"].load_chunk("m", p, t1, back_rows_to_key_versions("m", p, rows))
        if done:
            break
        after = rows[-1][0]
    engines["n2"].load_finish("m", p, t1)
    assert target.state == STATE_ACTIVE and target.applied_ts() == t1
    assert sorted(target.entries(t1)) == sorted(engines["n1"].slice("m", p).entries(t1))
    pipe.stabilise(mid_end)
    engines["n2"].stabilise_many(["m"], mid_end)
    prev = mid_end
    # switch: the new topology names n2; n1 drops its slice
    place["m"][p] = "n2"
    pipe.routes["m"] = IndexRoute.of(defn, place["m"])
    assert engines["n1"].drop_slice("m", p) and not engines["n1"].drop_slice("m", p)
    for _ in range(3):
        end = batch(50)
        pipe.check(end, ks.documents_at(end))
    with pytest.raises(ShardexError) as err:
        moves._open_copy(msg)  # the dropped slice cannot be copied again
    assert err.value.code is ErrorCode.INDEX_NOT_FOUND
    for e in engines.values():
        e.close()


def test_copy_refuses_a_source_behind_the_routed_round(tmp_path) -> None:
    engine = IndexerEngine(tmp_path / "s")
    engine.create_slice(MOVABLE, 0)
    engine.stabilise("m", Timestamp({0: (3, 1)}))
    host = SimpleNamespace(engine=engine, name="s", inline_io=True)
    moves = SliceMoves(host, None, None)  # type: ignore[arg-type]
    msg = ReadSliceCopy(copy_id="c", index_id="m", partition=0, not_before={0: (5, 1)})
    with pytest.raises(ShardexError) as err:
        moves._open_copy(msg)
    assert err.value.code is ErrorCode.INDEX_NOT_READY and err.value.details["retryable"]
    engine.close()
