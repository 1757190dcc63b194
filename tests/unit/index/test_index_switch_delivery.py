"""``IndexPartitionSwitched`` reaches the source: the master re-sends it
until acknowledged, the node is down or its term ended; the source takes it idempotently;
and a source that never got it learns the switch from the committed state at its next
reconciliation (not the orphan drop's 30 s later)."""

from __future__ import annotations

import asyncio
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import msgspec
import pytest

from shardex.api.slice_copy import (
    IndexPartitionSwitched,
    PrepareIncomingSlice,
    SliceMoveDone,
)
from shardex.core.timestamp import Timestamp
from shardex.errors import ErrorCode, ShardexError
from shardex.index import slice_copy
from shardex.manager.index_rebalance import IndexMoveDriver
from shardex.meta.index_rebalance_state import DONE, MOVING
from shardex.meta.index_state import ACTIVE
from shardex.meta.member_list import UP
from shardex.meta.state import StateContext
from tests.unit.index.test_index_service import (
    FakeCoordinator,
    held_slices,
    record,
    tracked_service,
    with_move,
)

SWITCHED = IndexPartitionSwitched(
    migration_id="mv-1", index_id="1.1.a", partition=1, source="me", target="other",
    topology_seq=2, grace=0.0,
)  # fmt: skip


class _Membership:
    def __init__(self) -> None:
        self.members = [
            SimpleNamespace(name=n, member_id=n, address=f"{n}:1", services=["index"])
            for n in ("me", "other")
        ]
        self.down: set[str] = set()

    def state_of(self, member_id: str, now: float) -> tuple[str, float | None]:
        return ("down" if member_id in self.down else UP), 0.0


class _Coordinator:
    """The master's pool and membership as ``IndexMoveDriver`` uses them: every request to
    a node fails while ``failures[node]`` lasts."""

    def __init__(self, failures: dict[str, int]) -> None:
        self.epoch: int | None = 7
        self.membership = _Membership()
        self.pool = self
        self.failures = failures
        self.sent: list[str] = []

    async def request(self, address: str, msg: Any, timeout: float, expect: Any) -> Any:
        node = address.split(":")[0]
        self.sent.append(node)
        if self.failures.get(node, 0) > 0:
            self.failures[node] -= 1
            raise ShardexError(f"{node}: connection reset", code=ErrorCode.CONNECTION_CLOSED)
        return SliceMoveDone(node=node)


def _driver(coord: _Coordinator) -> IndexMoveDriver:
    driver = IndexMoveDriver(coord, {})
    driver.switch_retry = (0.001, 0.004)
    return driver


async def test_the_switch_is_resent_until_the_source_acknowledges() -> None:
    coord = _Coordinator({"me": 4})
    assert await _driver(coord).tell_switched("me", SWITCHED, 7)
    assert coord.sent == ["me"] * 5  # four lost, the fifth acknowledged


async def test_resending_stops_when_the_node_is_down_or_the_term_ended() -> None:
    coord = _Coordinator({"me": 10**6})
    driver = _driver(coord)
    task = asyncio.create_task(driver.tell_switched("me", SWITCHED, 7))
    while len(coord.sent) < 3:
        await asyncio.sleep(0)
    coord.membership.down.add("me")  # declared dead: it learns the switch from the state
    assert await task is False
    coord = _Coordinator({"me": 1})
    coord.epoch = None  # deposed meanwhile
    assert await _driver(coord).tell_switched("me", SWITCHED, 7) is False
    assert coord.sent == ["me"]


def _states(rec: Any, topo: Any) -> tuple[StateContext, StateContext]:
    """(before, after) the switch of partition 1 from "me" to "other": the committed index
    topology history gains seq 2."""
    moved = msgspec.structs.replace(topo, seq_num=2, assignment={0: "me", 1: "other"})
    before = StateContext(epoch=2, cas=9, indexes={rec.id: rec}, index_topologies={rec.id: [topo]})
    after = msgspec.structs.replace(before, cas=10, index_topologies={rec.id: [topo, moved]})
    return before, after


async def test_a_source_that_missed_the_switch_learns_it_from_the_state(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(slice_copy, "SWITCH_DROP_GRACE", 0.0)
    rec, topo = record("1.1.a", ACTIVE, {0: "me", 1: "me"})
    before, after = _states(rec, topo)
    now = [0.0]
    coord = FakeCoordinator(before, before)
    svc = tracked_service(tmp_path, coord, now)
    await svc.start()
    moves = svc.slice_moves
    try:
        await svc.reconcile()
        moves.check_serving(rec.id, 1)  # served here
        woken: list[str] = []
        svc.host.listeners.append(woken.append)
        # The switch commits; its IndexPartitionSwitched is lost. The next reconcile learns.
        coord.state = coord.committed = after
        assert (await svc.reconcile()).orphans == []  # retired, not an orphan drop
        with pytest.raises(ShardexError) as err:
            moves.check_serving(rec.id, 1)  # stale topologies are told to retry
        assert err.value.code is ErrorCode.STALE_TOPOLOGY and err.value.details["owner"] == "other"
        assert moves.moved_to(rec.id, 1) == "other" and rec.id in woken
        assert svc.scan_migrations._get(rec.id).known_topo == 2
        moves.check_serving(rec.id, 0)  # the partition that stayed is served
        # The message arrives late after all (the master's re-send): acknowledged, no-op.
        tasks = set(moves._tasks)
        late = msgspec.structs.replace(SWITCHED, index_id=rec.id, grace=3600.0)
        assert (await moves.on_switched(late, None)).node == "me"  # type: ignore[arg-type]
        assert moves._tasks <= tasks
        await asyncio.gather(*tasks)  # the drop after the (zero) grace
        assert [(i, p) for i, p, _ in held_slices(svc)] == [(rec.id, 0)]
        assert (await svc.reconcile()).orphans == []
    finally:
        await svc.stop()


async def test_an_aborted_copy_is_not_taken_for_a_switched_source(tmp_path: Path) -> None:
    """A held slice no topology ever gave to this node (a move's target that missed the
    abort) is not 'switched away': the orphan drop handles it after its grace."""
    rec, topo = record("1.1.a", ACTIVE, {0: "me", 1: "other"})
    moved = msgspec.structs.replace(topo, seq_num=2, assignment={0: "me", 1: "third"})
    state = StateContext(
        epoch=2, cas=9, indexes={rec.id: rec}, index_topologies={rec.id: [topo, moved]}
    )
    svc = tracked_service(tmp_path, FakeCoordinator(state, state), [0.0])
    await svc.start()
    try:
        await svc.reconcile()
        await svc.host.run(svc.engine.create_slice, rec.definition, 1)  # the stray copy
        assert (await svc.reconcile()).orphans == []
        assert svc.slice_moves.moved_to(rec.id, 1) is None and svc.orphans.since
    finally:
        await svc.stop()


async def test_a_target_that_missed_the_switch_learns_its_arrival(tmp_path: Path) -> None:
    rec, topo = record("1.1.a", ACTIVE, {0: "me", 1: "other"})
    before, _ = _states(rec, topo)
    moved = msgspec.structs.replace(topo, seq_num=2, assignment={0: "me", 1: "me"})
    after = msgspec.structs.replace(before, cas=10, index_topologies={rec.id: [topo, moved]})
    routing = with_move(before, rec.id, 1, MOVING)
    coord = FakeCoordinator(routing, routing)
    svc = tracked_service(tmp_path, coord, [0.0])
    await svc.start()
    moves = svc.slice_moves
    scans = svc.scan_migrations
    try:
        await svc.reconcile()
        prep = PrepareIncomingSlice(migration_id="mv-1", definition=rec.definition, partition=1)
        await moves.on_prepare(prep, None)  # type: ignore[arg-type]
        await svc.reconcile()  # the move still runs: the copy stays incoming
        assert moves.awaiting_switch() and not scans._get(rec.id).is_open(1)
        # An older state where this node owned the partition (before an earlier move away)
        # does not count: only this copy's own move being done does.
        coord.committed = msgspec.structs.replace(after, rebalance=None)
        await svc.reconcile()
        assert moves.awaiting_switch()
        # The switch commits with this move done; its IndexPartitionSwitched is lost.
        coord.state = coord.committed = with_move(after, rec.id, 1, DONE)
        await svc.reconcile()
        assert not moves.awaiting_switch() and scans._get(rec.id).is_open(1)
        assert scans._get(rec.id).known_topo == 2
        moves.check_serving(rec.id, 1)
    finally:
        await svc.stop()


async def test_an_added_copy_arrives_as_a_replica_learnt_from_the_state(tmp_path: Path) -> None:
    """An addition (a new index copy) commits the target as a replica of the partition: a
    target that missed its IndexPartitionSwitched learns the arrival from that chain."""
    rec, topo = record("1.1.a", ACTIVE, {0: "me", 1: "other"})
    before, _ = _states(rec, topo)
    added = msgspec.structs.replace(topo, seq_num=2, replicas={1: ["me"]})
    after = msgspec.structs.replace(before, cas=10, index_topologies={rec.id: [topo, added]})
    routing = with_move(before, rec.id, 1, MOVING)
    coord = FakeCoordinator(routing, routing)
    svc = tracked_service(tmp_path, coord, [0.0])
    await svc.start()
    moves = svc.slice_moves
    try:
        await svc.reconcile()
        prep = PrepareIncomingSlice(migration_id="mv-1", definition=rec.definition, partition=1)
        await moves.on_prepare(prep, None)  # type: ignore[arg-type]
        coord.state = coord.committed = with_move(after, rec.id, 1, DONE)
        assert (await svc.reconcile()).orphans == []
        assert not moves.awaiting_switch() and svc.scan_migrations._get(rec.id).is_open(1)
        moves.check_serving(rec.id, 1)
        assert [(p, s) for _i, p, s in held_slices(svc)] == [(0, "created"), (1, "loading")]
    finally:
        await svc.stop()


async def test_a_copy_the_topology_dropped_is_replaced_by_an_incoming_one(tmp_path: Path) -> None:
    """A node back after its copy of a partition left the topology still holds that slice
    (the orphan drop comes later): a move or addition onto it starts the copy afresh. A
    slice handed over moments ago and still read by scans is not replaced."""
    rec, topo = record("1.1.a", ACTIVE, {0: "me", 1: "other"})
    state = StateContext(epoch=2, cas=9, indexes={rec.id: rec}, index_topologies={rec.id: [topo]})
    svc = tracked_service(tmp_path, FakeCoordinator(state, state), [0.0])
    await svc.start()
    moves = svc.slice_moves
    try:
        await svc.reconcile()
        engine = svc.engine
        await svc.host.run(engine.create_slice, rec.definition, 1)  # the dropped copy
        await svc.host.run(engine.stabilise, rec.id, Timestamp({0: (3, 1)}))  # both slices
        assert engine.slice(rec.id, 1).state == engine.slice(rec.id, 0).state == "active"
        prep = PrepareIncomingSlice(migration_id="mv-1", definition=rec.definition, partition=1)
        await moves.on_prepare(prep, None)  # type: ignore[arg-type]
        fresh = engine.slice(rec.id, 1)
        assert fresh.state == "loading" and fresh.applied_ts() == Timestamp()
        # Slice 0 was handed over and its drop grace runs: a copy back here must wait.
        moves._retired[(rec.id, 0)] = "other"
        again = PrepareIncomingSlice(migration_id="mv-2", definition=rec.definition, partition=0)
        with pytest.raises(ShardexError) as err:
            await moves.on_prepare(again, None)  # type: ignore[arg-type]
        assert err.value.code is ErrorCode.BAD_REQUEST and "still read by scans" in str(err.value)
        assert engine.slice(rec.id, 0).state == "active"
    finally:
        await svc.stop()
