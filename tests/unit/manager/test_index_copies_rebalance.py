"""A rebalance restores lost index copies, master side, against a fake coordinator and fake
indexers: the whole ``Rebalancer`` run plans an ``add`` per missing copy, builds it like a
move's target (prepare, routing, copy from a surviving copy, catch-up) and commits a topology
where the copy joins the chain as a replica, the source keeping its own and hearing nothing;
a partition's moves run one after the other; a failed copy is aborted and the target told
to drop it, and so is one whose target missed a stability round published meanwhile (the
timekeeper fails its move before publishing: the target's queue lacks that round's rows)."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from itertools import count
from typing import Any

import msgspec

from shardex.api.delivery import SliceAck, Stabilised
from shardex.api.index import ListSlices, SliceInfo, SliceList
from shardex.api.index_ddl import DropIndexCopies
from shardex.api.rebalance import StartRebalance
from shardex.api.slice_copy import (
    AbortIncomingSlice,
    CopySliceIn,
    IncomingSliceReady,
    IndexPartitionSwitched,
    PrepareIncomingSlice,
    SliceCopied,
    SliceMoveDone,
)
from shardex.core.timestamp import Timestamp
from shardex.core.topology import Topology
from shardex.errors import ErrorCode, ShardexError
from shardex.index import make_definition
from shardex.manager.index_copies import drop_index_copies
from shardex.manager.index_rebalance import _begin_check
from shardex.manager.rebalance import Rebalancer
from shardex.manager.timekeeper import check_acks, plan_stabilise
from shardex.meta.index_rebalance_state import (
    ADD,
    CANCELLED,
    DONE,
    FAILED,
    MOVING,
    new_index_moves,
)
from shardex.meta.index_state import ACTIVE, IndexRecord
from shardex.meta.rebalance_state import RebalanceRecord
from shardex.meta.state import StateContext
from shardex.net.messages import Message
from tests.unit.manager import coordinator_fakes as fakes

DEFN = make_definition(
    id="r", name="by_k", keyspace="ks", keys=["k"], partition_by=["META().id"], num_partition=3
)
REC = IndexRecord(definition=DEFN, state=ACTIVE, num_replica=1)
# n3 died and its copies left the topology: partitions 0 and 2 have one copy each.
SHORT = Topology(seq_num=5, assignment={0: "n1", 1: "n2", 2: "n2"}, replicas={1: ["n1"]})
TS = {0: (6, 1)}


class IndexerPool:
    """The indexers as the master's pool sees them: every command answered, each one
    recorded (node, message); a CopySliceIn to a node in ``failing`` fails."""

    def __init__(
        self,
        failing: set[str] | None = None,
        on_copy: Callable[[CopySliceIn], Awaitable[None]] | None = None,
    ) -> None:
        self.sent: list[tuple[str, Message]] = []
        self.failing = failing or set()
        self.on_copy = on_copy  # runs when a copy completes (before its reply)
        self.copying: set[tuple[str, int]] = set()
        self.overlapped = False

    async def request(self, address: str, msg: Message, timeout: float, expect: type) -> Any:
        node = address.split(":")[0]
        self.sent.append((node, msg))
        if isinstance(msg, PrepareIncomingSlice):
            return IncomingSliceReady(node=node, incarnation="i1")
        if isinstance(msg, CopySliceIn):
            key = (msg.index_id, msg.partition)
            self.overlapped |= key in self.copying  # two copies of one partition at once
            self.copying.add(key)
            await asyncio.sleep(0.01)
            self.copying.discard(key)
            if node in self.failing:
                raise ShardexError(f"{node} lost it", code=ErrorCode.NODE_UNAVAILABLE)
            if self.on_copy is not None:
                await self.on_copy(msg)
            return SliceCopied(node=node, ts=TS, items=3, bytes=30, seconds=0.01)
        if isinstance(msg, ListSlices):
            info = [
                SliceInfo(index_id="r", name="by_k", keyspace="ks", partition=p, state="active",
                          applied=TS, stability=TS)
                for p in range(3)
            ]  # fmt: skip
            return SliceList(node=node, slices=info)
        assert isinstance(msg, (IndexPartitionSwitched, AbortIncomingSlice)), msg
        return SliceMoveDone(node=node)


class Coordinator:
    def __init__(self, ctx: fakes.FakeCtx, pool: IndexerPool) -> None:
        self.ctx = ctx
        self.membership = ctx.membership
        self.pool = pool
        self.epoch = 1
        self.tasks: list[asyncio.Task[Any]] = []

    @property
    def state(self) -> StateContext:
        return self.ctx.state

    async def exclusive(self, epoch: int, fn: Callable[[Any], Awaitable[Any]]) -> Any:
        return await fn(self.ctx)

    def spawn(self, coro: Any) -> asyncio.Task[Any]:
        task = asyncio.get_running_loop().create_task(coro)
        self.tasks.append(task)
        return task


def make_ctx(topology: Topology = SHORT, up: dict[str, bool] | None = None) -> fakes.FakeCtx:
    state = StateContext(indexes={"r": REC}, index_topologies={"r": [topology]})
    membership = fakes.FakeMembership(
        up or {"n1": True, "n2": True, "n3": False, "n4": True}, ("data", "index")
    )
    ctx = fakes.FakeCtx(state, membership, (f"id{i}" for i in count(1)), request_id=None)
    ctx.epoch = 1  # type: ignore[attr-defined]
    return ctx


async def rebalance(ctx: fakes.FakeCtx, pool: IndexerPool) -> RebalanceRecord:
    c = Coordinator(ctx, pool)
    r = Rebalancer(c)
    await r.start(StartRebalance(), ctx)
    await asyncio.gather(*c.tasks)
    record = ctx.state.rebalance
    assert record is not None
    return record


async def test_a_rebalance_adds_the_lost_copies_as_replicas_and_keeps_the_sources() -> None:
    ctx = make_ctx()
    pool = IndexerPool()
    record = await rebalance(ctx, pool)
    assert record.state == DONE, record.message
    assert [(m.kind, m.partition, m.source, m.target, m.status) for m in record.index_moves] == [
        (ADD, 0, "n1", "n4", DONE),
        (ADD, 2, "n2", "n4", DONE),
    ]
    history = ctx.state.index_topologies["r"]
    latest = history[-1]
    assert [latest.chain(p) for p in range(3)] == [["n1", "n4"], ["n2", "n1"], ["n2", "n4"]]
    assert [t.seq_num for t in history] == [5, 6, 7]
    # Built like a move's target: prepared, routed, copied from the surviving copy.
    to_n4 = [
        type(m).__name__
        for n, m in pool.sent
        if n == "n4" and getattr(m, "partition", 0) == 0 and not isinstance(m, ListSlices)
    ]
    assert to_n4 == ["PrepareIncomingSlice", "CopySliceIn", "IndexPartitionSwitched"]
    copies = [m for _n, m in pool.sent if isinstance(m, CopySliceIn)]
    assert {(m.partition, m.source) for m in copies} == {(0, "n1"), (2, "n2")}
    # Only the target hears of the switch: the source keeps serving its copy.
    switched = [n for n, m in pool.sent if isinstance(m, IndexPartitionSwitched)]
    assert switched == ["n4", "n4"]
    # Routed to the target while copying: a commit had the move ``moving`` with routing.
    assert any(
        m.routing and m.status == MOVING
        for s in ctx.commits
        if s.rebalance is not None
        for m in s.rebalance.index_moves
    )
    # Run again: every chain is full, nothing to do.
    again = await rebalance(ctx, IndexerPool())
    assert again.index_moves == []


async def test_a_failed_copy_is_aborted_and_leaves_the_topology_alone() -> None:
    ctx = make_ctx(up={"n1": True, "n2": True, "n3": True, "n4": False})
    pool = IndexerPool(failing={"n3"})
    record = await rebalance(ctx, pool)
    assert record.state == FAILED
    assert {(m.target, m.status) for m in record.index_moves} == {("n3", FAILED)}
    assert all("n3 lost it" in m.error and not m.routing for m in record.index_moves)
    assert ctx.state.index_topologies["r"][-1] is SHORT
    aborted = [(n, m.partition) for n, m in pool.sent if isinstance(m, AbortIncomingSlice)]
    assert sorted(aborted) == [("n3", 0), ("n3", 2)]


async def test_a_partitions_moves_run_one_after_the_other() -> None:
    # Two copies missing from each partition (num_replica 2): two additions per partition.
    rec = msgspec.structs.replace(REC, num_replica=2)
    ctx = make_ctx(Topology(seq_num=1, assignment={0: "n1", 1: "n2", 2: "n4"}))
    ctx.state = msgspec.structs.replace(ctx.state, indexes={"r": rec})
    ctx.membership.up["n3"] = True
    pool = IndexerPool()
    record = await rebalance(ctx, pool)
    assert record.state == DONE, record.message
    assert len(record.index_moves) == 6 and not pool.overlapped
    latest = ctx.state.index_topologies["r"][-1]
    assert all(len(set(latest.chain(p))) == 3 for p in range(3))


def test_an_addition_copies_from_any_live_copy_and_is_cancelled_once_not_needed() -> None:
    state = StateContext(indexes={"r": REC}, index_topologies={"r": [SHORT]})
    (m,) = [
        msgspec.structs.replace(x, status="planned")
        for x in _planned(2, "n3", "n4")  # the planned source left the chain
    ]
    assert _begin_check(state, m, ["n1", "n2", "n4"]) == ("n2", "", MOVING)
    full = Topology(seq_num=6, assignment=SHORT.assignment, replicas={**SHORT.replicas, 2: ["n1"]})
    state = msgspec.structs.replace(state, index_topologies={"r": [full]})
    _source, why, status = _begin_check(state, m, ["n1", "n2", "n4"])
    assert status == CANCELLED and "has its copies already" in why
    # A move (not an addition) needs its own source.
    move = msgspec.structs.replace(m, kind="move")
    assert _begin_check(state, move, ["n1", "n2", "n4"])[2] == FAILED


def _planned(p: int, source: str, target: str) -> list[Any]:
    return new_index_moves([("r", "by_k", "ks", p, source, target, 5, ADD)], ["mid"])


def _acks(node: str, parts: list[int], ts: Timestamp, state: str = "active") -> Stabilised:
    wire = dict(ts.to_wire()) if state == "active" else {}
    acks = [
        SliceAck(index_id="r", partition=p, applied=wire, items_count=1, state=state) for p in parts
    ]
    return Stabilised(node=node, incarnation="i", acks=acks, missing=[])


def test_the_timekeeper_names_move_targets_that_did_not_answer_a_ready_round() -> None:
    state = StateContext(indexes={"r": REC}, index_topologies={"r": [SHORT]})
    plan = plan_stabilise(state, "ks", ["r"], {"r": {0: "n4", 2: "n3"}})
    ts = Timestamp({0: (9, 1)})
    copies = {"n1": _acks("n1", [0, 1], ts), "n2": _acks("n2", [1, 2], ts)}
    # n4 did not answer; n3's copy is still loading but answered: it queued the rows.
    check = check_acks(plan, {**copies, "n3": _acks("n3", [2], ts, "loading")}, ts)
    assert check.ready == {"r": 3} and check.targets_behind == {"r": [(0, "n4")]}
    check = check_acks(plan, {**copies, "n4": _acks("n4", [0], ts, "loading")}, ts)
    assert check.targets_behind == {"r": [(2, "n3")]}
    # Not published (partition 0's only copy did not answer): its rows come again.
    check = check_acks(plan, {"n2": _acks("n2", [1, 2], ts)}, ts)
    assert check.ready == {} and check.targets_behind == {}


async def test_drop_index_copies_fails_the_moves_of_late_targets_in_one_commit() -> None:
    ctx = make_ctx()
    late, other = [
        msgspec.structs.replace(m, status=MOVING, routing=True)
        for m in new_index_moves(
            [
                ("r", "by_k", "ks", 0, "n1", "n4", 5, ADD),
                ("r", "by_k", "ks", 2, "n2", "n4", 5, ADD),
            ],
            ["m0", "m2"],
        )
    ]
    record = RebalanceRecord(id="rb", kind="rebalance", started_at=1.0, index_moves=[late, other])
    ctx.state = msgspec.structs.replace(ctx.state, rebalance=record)
    msg = DropIndexCopies(index_id="r", copies=[], ts={0: (9, 1)}, targets=[(0, "n4")])
    reply = await drop_index_copies(msg, ctx)
    assert reply.failed_moves == ["m0"] and reply.dropped == [] and len(ctx.commits) == 1
    moves = {m.migration_id: m for m in ctx.state.rebalance.index_moves}
    assert moves["m0"].status == FAILED and not moves["m0"].routing
    assert "missed the stability round" in moves["m0"].error
    assert moves["m2"].status == MOVING and moves["m2"].routing
    assert ctx.state.index_topologies["r"] == [SHORT]
    again = await drop_index_copies(msg, ctx)
    assert again.failed_moves == [] and len(ctx.commits) == 1  # idempotent


async def test_a_copy_whose_target_missed_a_round_is_aborted_not_switched_in() -> None:
    ctx = make_ctx()

    async def timekeeper_fails_it(copy: CopySliceIn) -> None:
        if copy.partition == 0:  # a round was published while n4 did not answer
            msg = DropIndexCopies(index_id="r", copies=[], targets=[(0, "n4")])
            await drop_index_copies(msg, ctx)

    pool = IndexerPool(on_copy=timekeeper_fails_it)
    record = await rebalance(ctx, pool)
    assert record.state == FAILED
    status = {m.partition: (m.status, m.error) for m in record.index_moves}
    assert status[2] == (DONE, "") and status[0][0] == FAILED
    assert "missed the stability round" in status[0][1]
    latest = ctx.state.index_topologies["r"][-1]
    assert latest.chain(0) == ["n1"] and latest.chain(2) == ["n2", "n4"]
    aborted = [(n, m.partition) for n, m in pool.sent if isinstance(m, AbortIncomingSlice)]
    assert aborted == [("n4", 0)]
    switched = [m.partition for _n, m in pool.sent if isinstance(m, IndexPartitionSwitched)]
    assert switched == [2]
