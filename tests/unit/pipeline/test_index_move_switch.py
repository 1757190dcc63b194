"""An index move's switch seen by the stabilise rounds: a round stabilises
exactly the slices its rows were routed to, per node, so a source that still holds a
switched-away slice never snapshots a TS whose changes went to the target only."""

from __future__ import annotations

import random
from typing import Any

from shardex.api.delivery import DeliverAndStabilise, Stabilised
from shardex.core.timestamp import Timestamp
from shardex.core.topology import Topology
from shardex.index import make_definition
from shardex.index.delivery import IndexDelivery
from shardex.index.engine import IndexerEngine
from shardex.index.engine_host import EngineHost
from shardex.index.keyversion import UPSERT
from shardex.index.oracle import check_index
from shardex.manager.timekeeper import plan_stabilise, verify_acks
from shardex.meta.index_state import ACTIVE, IndexRecord
from shardex.meta.state import StateContext
from shardex.pipeline.project.router import route
from shardex.pipeline.registry import IndexView
from shardex.pipeline.rounds.plan import round_slices, stabilise_plan
from shardex.testing.index import FakeKeyspace, LocalPipeline, random_workload

DEFN = make_definition(
    id="m", name="by_k", keyspace="ks", keys=["name"], partition_by=["city"], num_partition=4
)
MOVED = 2


def _views(place: dict[int, str], moving: dict[int, str] | None = None) -> list[IndexView]:
    topo = Topology(seq_num=2 if place[MOVED] == "t" else 1, assignment=dict(place))
    return [IndexView(IndexRecord(definition=DEFN, state=ACTIVE), topo, moving or {})]


async def _round(
    deliveries: dict[str, IndexDelivery],
    views: list[IndexView],
    pipe: LocalPipeline,
    changes: list[Any],
    end: Timestamp,
    batch_id: int,
) -> dict[str, Stabilised]:
    """One batch the way ``BatchSteps._attempt`` sends it: routed by ``views``, one
    ``DeliverAndStabilise`` per node of the round's plan."""
    routes = {v.id: v.route() for v in views}
    rows = [r for rows in pipe.project_and_route(changes).values() for r in rows]
    by_node = route(rows, routes).by_node
    plan, moving = stabilise_plan(views)
    slices = round_slices(views)
    out = {}
    for node in sorted(set(plan) | set(by_node)):
        msg = DeliverAndStabilise(
            keyspace="ks",
            batch_id=batch_id,
            rows=list(by_node.get(node, [])),
            ts=dict(end.to_wire()),
            index_ids=list(plan.get(node, [])),
            moving=moving.get(node, {}),
            slices=slices.get(node, {}),
        )
        out[node] = await deliveries[node].on_deliver_and_stabilise(msg, None)  # type: ignore[arg-type]
    return out


async def test_a_switched_source_slice_is_not_stabilised_by_rounds_routed_past_it(
    tmp_path,
) -> None:
    """Source s keeps partitions 0-3 of index m, target t takes partition 2. After the switch
    the rows of partition 2 go to t only: a round must not advance s's old slice 2 (it would
    take a snapshot labelled with a TS whose changes it lacks, and a scan routed by the old
    topology would read stale rows there), while s's other slices and t's copy advance."""
    rng = random.Random(3)
    ks = FakeKeyspace(num_partitions=4)
    engines = {n: IndexerEngine(tmp_path / n) for n in ("s", "t")}
    place = {p: "s" for p in range(4)}
    pipe = LocalPipeline([DEFN], engines, {"m": place})
    pipe.create_slices()
    deliveries = {}
    for n, e in engines.items():
        host = EngineHost(n, lambda e=e: e, inline_io=True)  # the engine, run inline
        await host.open()
        deliveries[n] = IndexDelivery(host, note_routed=lambda moving, ts: None)
    random_workload(ks, rng, 80)
    t0 = ks.ts()
    await _round(deliveries, _views(place), pipe, ks.changes(None, t0), t0, 1)
    # The move, compressed: t gets s's slice at t0 (what CopySliceIn leaves there).
    src = engines["s"].slice("m", MOVED)
    engines["t"].create_slice(DEFN, MOVED)
    engines["t"].bulk_load("m", MOVED, _back_rows(src), t0)
    switched = {**place, MOVED: "t"}
    views = _views(switched)
    assert round_slices(views) == {"s": {"m": [0, 1, 3]}, "t": {"m": [MOVED]}}
    before = src.snapshot_timestamps()
    prev = t0
    for batch in range(2, 5):
        random_workload(ks, rng, 60)
        end = ks.ts()
        replies = await _round(deliveries, views, pipe, ks.changes(prev, end), end, batch)
        assert src.applied_ts() == t0 and src.snapshot_timestamps() == before
        acked = {(a.index_id, a.partition) for a in replies["s"].acks}
        assert acked == {("m", 0), ("m", 1), ("m", 3)}
        # The timekeeper publishes on the new topology: every owner acknowledged.
        state = StateContext(
            indexes={"m": views[0].record}, index_topologies={"m": [views[0].topology]}
        )
        ready, not_ready = verify_acks(plan_stabilise(state, "ks", ["m"]), replies, end)
        assert ready and not not_ready
        # The owners' snapshots at ``end`` hold exactly the documents as of ``end``.
        owned = {p: engines[n].slice("m", p).entries(end) for p, n in switched.items()}
        check_index(DEFN, owned, ks.documents_at(end), context=repr(end))
        prev = end
    for e in engines.values():
        e.close()


def _back_rows(sl: Any) -> list[Any]:
    """The slice's live entries as UPSERT key versions (``back_rows_to_key_versions``)."""
    return [("m", sl.partition, UPSERT, entry, docid, dp, seqno)
            for docid, (dp, seqno, entry) in sorted(sl.back_rows().items()) if entry]  # fmt: skip


def test_timekeeper_rounds_name_the_slices_of_their_topology() -> None:
    """The timekeeper's own rounds (idle rounds for moves) name slices the same way: the
    source's switched-away partition is not named; a move's target is named for its copy."""
    rec = IndexRecord(definition=DEFN, state=ACTIVE)
    old = Topology(seq_num=1, assignment={p: "s" for p in range(4)})
    new = Topology(seq_num=2, assignment={**old.assignment, MOVED: "t"})
    routing = StateContext(indexes={"m": rec}, index_topologies={"m": [old]})
    plan = plan_stabilise(routing, "ks", ["m"], {"m": {MOVED: "t"}})
    assert plan.slices == {"s": {"m": [0, 1, 2, 3]}, "t": {"m": [MOVED]}}
    done = StateContext(indexes={"m": rec}, index_topologies={"m": [old, new]})
    assert plan_stabilise(done, "ks", ["m"]).slices == {"s": {"m": [0, 1, 3]}, "t": {"m": [2]}}
    # The pipeline's view while the move routes: the same slices.
    assert round_slices(_views(old.assignment, {MOVED: "t"})) == plan.slices
