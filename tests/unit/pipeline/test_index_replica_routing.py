"""Index replicas in the pipeline: the router sends every row of a slice to each of its
copies, a round names every copy, and the timekeeper stabilises every copy (and counts
the items once)."""

from __future__ import annotations

import msgspec

from shardex.api.delivery import SliceAck, Stabilised
from shardex.core.timestamp import Timestamp
from shardex.core.topology import Topology
from shardex.index import BROADCAST, DELETE, UPSERT, UPSERT_DELETION, make_definition
from shardex.manager.timekeeper import check_acks, plan_stabilise, verify_acks
from shardex.meta.index_state import ACTIVE, IndexRecord
from shardex.meta.state import StateContext
from shardex.pipeline.project.projector import project
from shardex.pipeline.project.router import IndexRoute, route
from shardex.pipeline.registry import IndexView
from shardex.pipeline.rounds.plan import plan_nodes, round_slices, stabilise_plan, views_key
from shardex.pipeline.source.projected import LoadSpec

MOVING = make_definition(
    id="m", name="m", keyspace="ks", keys=["k"], partition_by=["k"], num_partition=3
)
TOPO = Topology(
    seq_num=1, assignment={0: "n1", 1: "n2", 2: "n3"}, replicas={0: ["n2"], 1: ["n3"], 2: ["n1"]}
)


def got(res) -> list[tuple[str, int, int]]:
    return sorted((node, r[1], r[2]) for node, rows in res.by_node.items() for r in rows)


def test_every_copy_gets_the_partitions_rows() -> None:
    routes = {"m": IndexRoute.of(MOVING, TOPO)}
    doc = {"k": "paris"}
    rows = project([MOVING], [("x", 0, 7, "upsert", msgspec.json.encode(doc))]).rows
    res = got(route(rows, routes))
    upserts = [(n, p) for n, p, k in res if k == UPSERT]
    (p,) = {p for _n, p in upserts}
    assert sorted(n for n, _p in upserts) == sorted(TOPO.chain(p))
    dels = sorted((n, q) for n, q, k in res if k == UPSERT_DELETION)
    assert dels == sorted((n, q) for q in range(3) if q != p for n in TOPO.chain(q))
    # A broadcast delete reaches every copy of every partition.
    res = got(route([("m", BROADCAST, DELETE, b"", "x", 0, 8)], routes))
    assert res == sorted((n, q, DELETE) for q in range(3) for n in TOPO.chain(q))


def test_a_moving_partition_goes_to_its_copies_and_the_target() -> None:
    routes = {"m": IndexRoute.of(MOVING, TOPO, {1: "n4"})}
    res = got(route([("m", 1, DELETE, b"", "x", 0, 8)], routes))
    assert res == [("n2", 1, DELETE), ("n3", 1, DELETE), ("n4", 1, DELETE)]


def test_a_round_names_every_copy() -> None:
    views = [IndexView(IndexRecord(definition=MOVING, state=ACTIVE), TOPO, {})]
    assert round_slices(views) == {
        "n1": {"m": [0, 2]},
        "n2": {"m": [0, 1]},
        "n3": {"m": [1, 2]},
    }
    plan, moving = stabilise_plan(views)
    assert plan == {"n1": ["m"], "n2": ["m"], "n3": ["m"]} and moving == {}
    assert plan_nodes(views_key(views)) == {"n1", "n2", "n3"}
    # A replica moved to another node changes the views key (rows go elsewhere).
    other = Topology(seq_num=1, assignment=TOPO.assignment, replicas={**TOPO.replicas, 0: ["n3"]})
    moved = [IndexView(views[0].record, other, {})]
    assert views_key(moved) != views_key(views)


def test_load_spec_carries_the_replicas() -> None:
    spec = LoadSpec(Timestamp({0: (3, 9)}), {"m": ("n1", "n2", "n3")}, {"m": {0: ("n2",)}})
    back = LoadSpec.from_option(spec.to_option())
    assert back == spec and back.copies("m", 0) == ("n1", "n2") and back.copies("m", 1) == ("n2",)


def _state() -> StateContext:
    rec = IndexRecord(definition=MOVING, state=ACTIVE, num_replica=1)
    return StateContext(indexes={"m": rec}, index_topologies={"m": [TOPO]})


def _reply(node: str, ts: Timestamp, items: int = 5) -> Stabilised:
    parts = TOPO.copies_of(node)
    acks = [
        SliceAck(
            index_id="m", partition=p, applied=dict(ts.to_wire()), items_count=items, state="active"
        )
        for p in parts
    ]
    return Stabilised(node=node, incarnation="i", acks=acks)


def test_timekeeper_stabilises_every_copy_and_counts_items_once() -> None:
    plan = plan_stabilise(_state(), "ks", ["m"])
    assert plan.slices == {"n1": {"m": [0, 2]}, "n2": {"m": [0, 1]}, "n3": {"m": [1, 2]}}
    ts = Timestamp({0: (4, 1)})
    ready, not_ready = verify_acks(plan, {n: _reply(n, ts) for n in ("n1", "n2", "n3")}, ts)
    assert ready == {"m": 15} and not_ready == {}  # 3 partitions x 5 items, not 6 copies


def test_an_index_is_ready_when_each_partition_has_a_copy_at_the_ts() -> None:
    plan = plan_stabilise(_state(), "ks", ["m"])
    ts = Timestamp({0: (4, 1)})
    old = Timestamp({0: (3, 1)})
    # n2 is down: partition 0 has n1, partition 1 has n3; both of n2's copies are behind.
    check = check_acks(plan, {"n1": _reply("n1", ts), "n3": _reply("n3", ts)}, ts)
    assert check.ready == {"m": 15} and check.not_ready == {}
    assert sorted(check.behind["m"]) == [(0, "n2"), (1, "n2")]
    assert "n2 did not acknowledge" in check.behind["m"][(0, "n2")]
    # n3 answered but has not applied the TS: partition 1 still has n2, partition 2 n1.
    replies = {n: _reply(n, ts) for n in ("n1", "n2")} | {"n3": _reply("n3", old)}
    check = check_acks(plan, replies, ts)
    assert check.ready == {"m": 15} and sorted(check.behind["m"]) == [(1, "n3"), (2, "n3")]
    # n2 and n3 down: partition 1 has no copy at the TS: the index waits, nothing is behind.
    check = check_acks(plan, {"n1": _reply("n1", ts)}, ts)
    assert check.ready == {} and check.behind == {}
    assert check.not_ready == {"m": "missing: n2 did not acknowledge partition 1"}
    assert verify_acks(plan, {"n1": _reply("n1", ts)}, ts) == ({}, check.not_ready)
