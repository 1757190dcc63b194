"""The index service's DDL side over a real ``IndexerEngine``: idempotent allocate / drop,
and reconciliation (what a state makes an indexer create or drop, and what it must not)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import msgspec

from shardex.core.topology import Topology
from shardex.index.definition import make_definition
from shardex.index.messages import AllocateSlices, DropSlices, ListSlices
from shardex.index.service import IndexService, plan_reconcile
from shardex.manager.coordinator_messages import StateReply, StateRequest
from shardex.manager.index_state import (
    ACTIVE,
    BUILDING,
    DELETED,
    ERROR,
    INIT,
    READY,
    IndexRecord,
)
from shardex.manager.state import StateContext
from shardex.net.tcp import TcpTransport


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
