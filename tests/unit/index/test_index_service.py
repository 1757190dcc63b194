"""The index service's DDL side over a real ``IndexerEngine``: idempotent allocate / drop,
and reconciliation (what a state makes an indexer create or drop, and what it must not)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import msgspec

from shardex.api.coordinator import StateReply, StateRequest
from shardex.api.index import AllocateSlices, DropSlices, ListSlices
from shardex.api.slice_copy import IndexPartitionSwitched, PrepareIncomingSlice
from shardex.core.topology import Topology
from shardex.index.orphans import OrphanTracker, plan_orphans
from shardex.index.service import IndexService, plan_reconcile
from shardex.meta.index_definition import make_definition
from shardex.meta.index_rebalance_state import FAILED, MOVING, IndexMoveRecord
from shardex.meta.index_state import (
    ACTIVE,
    BUILDING,
    DELETED,
    ERROR,
    INIT,
    READY,
    IndexRecord,
)
from shardex.meta.rebalance_state import RebalanceRecord
from shardex.meta.state import StateContext
from shardex.net.tcp import TcpTransport
from shardex.scan.elastic_adapters_index import IndexScanMigrations


def record(index_id: str, state: str, assignment: dict[int, str]) -> tuple[IndexRecord, Topology]:
    defn = make_definition(
        id=index_id,
        name=f"i{index_id.replace('.', '_')}",
        keyspace="ks",
        keys=["age"],
        partition_by=["META().id"],
        num_partition=len(assignment),
    )
    return IndexRecord(definition=defn, state=state), Topology(seq_num=1, assignment=assignment)


def state_of(epoch: int, cas: int, *recs: tuple[IndexRecord, Topology]) -> StateContext:
    return StateContext(
        epoch=epoch,
        cas=cas,
        indexes={r.id: r for r, _ in recs},
        index_topologies={r.id: [t] for r, t in recs},
    )


def test_plan_creates_assigned_slices_of_settled_indexes_only() -> None:
    recs = [
        record(f"1.{i}.x", s, {0: "me", 1: "other", 2: "me"})
        for i, s in enumerate((INIT, READY, BUILDING, ACTIVE, ERROR, DELETED))
    ]
    plan = plan_reconcile("me", state_of(2, 9, *recs), {"1.2.x": {0}})
    assert [(d.id, parts) for d, parts in plan.create] == [
        ("1.1.x", [0, 2]),
        ("1.2.x", [2]),  # partition 0 is already here
        ("1.3.x", [0, 2]),
        ("1.4.x", [0, 2]),
    ]  # INIT: only the master's AllocateSlices creates; DELETED: never


def test_plan_drops_deleted_and_removed_but_not_what_a_lagging_state_lacks() -> None:
    deleted = record("1.1.gone", DELETED, {0: "me"})
    live = record("1.2.live", READY, {0: "other"})  # not assigned here: left alone
    held = {"1.1.gone": {0}, "1.2.live": {0}, "3.7.new": {0}, "1.5.old": {0}, "legacy": {0}}
    plan = plan_reconcile("me", state_of(3, 7, deleted, live), held)
    # "3.7.new" was created on a state at (3, 7): a state at (3, 7) is not newer, so it proves
    # nothing; "1.5.old" is absent from a newer state: removed; "legacy" has no base: kept.
    assert plan.drop == ["1.1.gone", "1.5.old"]
    assert plan_reconcile("me", state_of(3, 8), {"3.7.new": {0}}).drop == ["3.7.new"]
    # An older term never proves removal, whatever its cas.
    assert plan_reconcile("me", state_of(2, 99), {"3.7.new": {0}}).drop == []


class FakeCoordinator:
    """The local replica's state, and the master's committed one for fresh reads."""

    def __init__(self, local: StateContext, committed: StateContext) -> None:
        self.state = local
        self.committed = committed
        self.callbacks: list[Any] = []

    def on_change(self, cb: Any) -> None:
        self.callbacks.append(cb)

    async def submit(self, msg: StateRequest) -> StateReply:
        assert msg.fresh
        return StateReply(node="m", master="m", is_master=False, state=self.committed)


def service(tmp_path: Path, coord: Any = None) -> IndexService:
    return IndexService(
        node_name="me",
        transport=TcpTransport(),
        secret="s" * 32,
        path=tmp_path / "index",
        inline_io=True,
        coordinator=lambda: coord,
        reconcile_interval=3600,
        scan_migrations=IndexScanMigrations("me"),
    )


async def test_allocate_drop_list_are_idempotent(tmp_path: Path) -> None:
    rec, _ = record("1.1.x", INIT, {0: "me", 1: "me", 2: "other"})
    svc = service(tmp_path)
    await svc.start()
    try:
        msg = AllocateSlices(definition=rec.definition, partitions=[0, 1])
        first = await svc._on_allocate(msg, None)  # type: ignore[arg-type]
        assert first.partitions == [0, 1] and first.created == [0, 1]
        again = await svc._on_allocate(msg, None)  # type: ignore[arg-type]
        assert again.partitions == [0, 1] and again.created == []
        listed = await svc._on_list(ListSlices(), None)  # type: ignore[arg-type]
        assert [(s.index_id, s.partition, s.state) for s in listed.slices] == [
            ("1.1.x", 0, "created"),
            ("1.1.x", 1, "created"),
        ]
        dropped = await svc._on_drop(DropSlices(index_id="1.1.x"), None)  # type: ignore[arg-type]
        assert dropped.dropped == 2
        assert (await svc._on_drop(DropSlices(index_id="1.1.x"), None)).dropped == 0  # type: ignore[arg-type]
    finally:
        await svc.stop()
    # Durable: a reopened engine has what was allocated.
    svc = service(tmp_path)
    await svc.start()
    try:
        await svc._on_allocate(AllocateSlices(definition=rec.definition, partitions=[2]), None)  # type: ignore[arg-type]
    finally:
        await svc.stop()
    svc = service(tmp_path)
    await svc.start()
    try:
        assert [(s.index_id, s.partition) for s in svc.engine.slices()] == [("1.1.x", 2)]
    finally:
        await svc.stop()


async def test_reconcile_confirms_drops_against_the_committed_state(tmp_path: Path) -> None:
    kept, kept_topo = record("1.1.keep", BUILDING, {0: "me"})
    svc = service(tmp_path)
    await svc.start()
    await svc._on_allocate(AllocateSlices(definition=kept.definition, partitions=[0]), None)  # type: ignore[arg-type]
    await svc.stop()
    # This node's replica holds an old master's uncommitted DELETED; the committed state
    # still has the index BUILDING: the slice must stay.
    local = state_of(2, 5, (msgspec.structs.replace(kept, state=DELETED), kept_topo))
    committed = state_of(3, 5, (kept, kept_topo))
    coord = FakeCoordinator(local, committed)
    svc = service(tmp_path, coord)
    await svc.start()
    try:
        done = await svc.reconcile()
        assert done.drop == [] and len(svc.engine.slices()) == 1
        # Once the committed state has dropped it, the slice goes.
        coord.committed = state_of(3, 6)
        done = await svc.reconcile()
        assert done.drop == ["1.1.keep"] and svc.engine.slices() == []
        # A live index assigned here is (re)created.
        ready, ready_topo = record("3.6.new", READY, {0: "other", 1: "me"})
        coord.state = state_of(3, 7, (ready, ready_topo))
        done = await svc.reconcile()
        assert [(d.id, p) for d, p in done.create] == [("3.6.new", [1])]
        assert [(s.index_id, s.partition) for s in svc.engine.slices()] == [("3.6.new", 1)]
        assert coord.callbacks  # reconciles on every state change
    finally:
        await svc.stop()


# --- orphan slice copies (``shardex.index.orphans``) --------------------------------------------


def with_move(state: StateContext, index_id: str, partition: int, status: str) -> StateContext:
    """``state`` with a rebalance record holding one move of ``partition`` from "other" to
    "me" in ``status``."""
    move = IndexMoveRecord(
        migration_id=f"mv-{partition}",
        index_id=index_id,
        index_name="i",
        keyspace="ks",
        partition=partition,
        source="other",
        target="me",
        base_seq=1,
        status=status,
        routing=status == MOVING,
    )
    rebalance = RebalanceRecord(id="r1", kind="rebalance", started_at=0.0, index_moves=[move])
    return msgspec.structs.replace(state, rebalance=rebalance)


def test_plan_orphans_keeps_assigned_and_incoming_slices_only() -> None:
    active = record("1.1.a", ACTIVE, {0: "me", 1: "other", 2: "other", 3: "other"})
    init = record("1.2.i", INIT, {0: "other"})
    held = {"1.1.a": {0, 1, 2, 3}, "1.2.i": {0}, "1.3.gone": {0}}
    state = state_of(2, 9, active, init)
    # 0 is assigned here; 1, 2, 3 are not; INIT and unknown indexes are not this rule's.
    assert plan_orphans("me", state, held) == [("1.1.a", 1), ("1.1.a", 2), ("1.1.a", 3)]
    # A move in flight to this node keeps its catching-up copy; a failed one does not.
    moving = with_move(state, "1.1.a", 2, MOVING)
    assert plan_orphans("me", moving, held) == [("1.1.a", 1), ("1.1.a", 3)]
    failed = with_move(state, "1.1.a", 2, FAILED)
    assert plan_orphans("me", failed, held) == [("1.1.a", 1), ("1.1.a", 2), ("1.1.a", 3)]
    assert plan_reconcile("me", moving, held).orphans == [("1.1.a", 1), ("1.1.a", 3)]


def test_replica_copies_are_created_and_never_orphans() -> None:
    rec, topo = record("1.1.r", ACTIVE, {0: "me", 1: "other", 2: "third"})
    topo = Topology(seq_num=1, assignment=topo.assignment, replicas={1: ["me"], 2: ["other"]})
    state = StateContext(epoch=2, cas=9, indexes={rec.id: rec}, index_topologies={rec.id: [topo]})
    plan = plan_reconcile("me", state, {"1.1.r": {0}})
    assert [(d.id, parts) for d, parts in plan.create] == [("1.1.r", [1])]
    # Its primary and its replica copy stay; a copy of partition 2 here is an orphan.
    assert plan_orphans("me", state, {"1.1.r": {0, 1, 2}}) == [("1.1.r", 2)]


def test_orphan_tracker_waits_the_grace_and_restarts_the_clock() -> None:
    now = [100.0]
    tracker = OrphanTracker(grace=30.0, clock=lambda: now[0])
    a, b = ("x", 1), ("x", 2)
    assert tracker.due([a, b], in_use=set()) == []
    now[0] += 29.0
    assert tracker.due([a, b], in_use={b}) == []  # b is busy: its clock is forgotten
    now[0] += 1.0
    assert tracker.due([a, b], in_use=set()) == [a]  # b orphaned again only now
    now[0] += 30.0
    assert tracker.due([b], in_use=set()) == [b]  # a is no orphan any more: forgotten
    assert tracker.since == {b: 130.0}


def tracked_service(tmp_path: Path, coord: Any, now: list[float]) -> IndexService:
    svc = service(tmp_path, coord)
    svc.orphans = OrphanTracker(grace=30.0, clock=lambda: now[0])
    return svc


def held_slices(svc: IndexService) -> list[tuple[str, int, str]]:
    return [(s.index_id, s.partition, s.state) for s in svc.engine.slices()]


async def test_a_target_down_when_its_move_aborted_drops_its_copy(tmp_path: Path) -> None:
    rec, topo = record("1.1.a", ACTIVE, {0: "me", 1: "other"})
    state = state_of(2, 9, (rec, topo))
    now = [0.0]
    coord = FakeCoordinator(
        with_move(state, rec.id, 1, MOVING), with_move(state, rec.id, 1, MOVING)
    )
    svc = tracked_service(tmp_path, coord, now)
    await svc.start()
    try:
        await svc.reconcile()  # creates slice 0
        prep = PrepareIncomingSlice(migration_id="mv-1", definition=rec.definition, partition=1)
        await svc.slice_moves.on_prepare(prep, None)  # type: ignore[arg-type]
        assert held_slices(svc) == [(rec.id, 0, "created"), (rec.id, 1, "loading")]
        # The move is in flight to this node: its copy stays whatever the time.
        now[0] += 100.0
        assert (await svc.reconcile()).orphans == []
    finally:
        await svc.stop()  # the target goes down with its copy half loaded
    # Meanwhile the move failed; the abort never reached this node.
    svc = tracked_service(tmp_path, coord, now)
    await svc.start()
    try:
        assert held_slices(svc) == [(rec.id, 0, "created"), (rec.id, 1, "needs_rebuild")]
        # This node's replica says failed, but the master's committed state does not (yet):
        # no drop on the replica's word, and no clock runs.
        coord.state = with_move(state, rec.id, 1, FAILED)
        for _ in range(2):
            assert (await svc.reconcile()).orphans == []
            now[0] += 60.0
        assert svc.orphans.since == {}
        coord.committed = coord.state
        assert (await svc.reconcile()).orphans == []  # first seen orphaned: grace runs
        now[0] += 29.0
        assert (await svc.reconcile()).orphans == []
        now[0] += 1.0
        assert (await svc.reconcile()).orphans == [(rec.id, 1)]
        assert held_slices(svc) == [(rec.id, 0, "created")]  # the assigned slice stays
        assert svc.orphans.since == {}
        assert (await svc.reconcile()).orphans == []
    finally:
        await svc.stop()


async def test_a_source_restarted_in_its_drop_grace_drops_the_old_slice(tmp_path: Path) -> None:
    rec, topo = record("1.1.a", ACTIVE, {0: "me", 1: "me"})
    now = [0.0]
    coord = FakeCoordinator(state_of(2, 9, (rec, topo)), state_of(2, 9, (rec, topo)))
    svc = tracked_service(tmp_path, coord, now)
    await svc.start()
    try:
        await svc.reconcile()
        # Partition 1 moved to "other": the committed state has the new topology; the switch
        # message starts this node's own drop timer (an hour here), which reconcile leaves be.
        moved = msgspec.structs.replace(topo, seq_num=2, assignment={0: "me", 1: "other"})
        coord.state = coord.committed = state_of(2, 10, (rec, moved))
        switched = IndexPartitionSwitched(
            migration_id="mv-1", index_id=rec.id, partition=1, source="me", target="other",
            topology_seq=2, grace=3600.0,
        )  # fmt: skip
        await svc.slice_moves.on_switched(switched, None)  # type: ignore[arg-type]
        for _ in range(3):
            assert (await svc.reconcile()).orphans == []
            now[0] += 60.0
        assert [(i, p) for i, p, _ in held_slices(svc)] == [(rec.id, 0), (rec.id, 1)]
    finally:
        await svc.stop()  # restarted before its timer fired
    svc = tracked_service(tmp_path, coord, now)
    await svc.start()
    try:
        assert (await svc.reconcile()).orphans == []
        now[0] += 30.0
        assert (await svc.reconcile()).orphans == [(rec.id, 1)]
        assert [(i, p) for i, p, _ in held_slices(svc)] == [(rec.id, 0)]
    finally:
        await svc.stop()
