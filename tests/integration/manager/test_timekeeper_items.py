"""An ACTIVE index's ``items_count`` in the coordinator state follows the entries its slices
acknowledge in the stability rounds after the build (inserts and deletes), through the
timekeeper's ``ItemsRecorder`` and the master's ``RecordIndexItems`` op: a drift past a tenth
is recorded, a smaller one and a second one within the interval are not (no commit per
round)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import dataclass
from itertools import count

import msgspec
import pytest

from shardex.api.index_ddl import IndexUpdated, RecordIndexItems
from shardex.api.timekeeper import AdvanceStability, StabilityAdvanced
from shardex.errors import ErrorCode, ShardexError
from shardex.manager.index_ddl import IndexDDL
from shardex.manager.index_items import ItemsRecorder, drifted
from shardex.manager.timekeeper import Timekeeper
from shardex.meta.index_state import ACTIVE, BUILDING
from shardex.meta.state import StateContext
from shardex.net import ConnectionPool, RpcServer
from tests.integration.manager.test_timekeeper import (
    FakeIndexer,
    FakeMembership,
    FakeSlice,
    index,
    serve_timekeeper,
    state_of,
    ts,
)
from tests.unit.manager import coordinator_fakes as fakes

pytestmark = pytest.mark.timeout(30)


class MasterCoordinator:
    """The local replica's state and ``submit`` running the op as the master would, on a
    context that keeps every commit."""

    def __init__(self, state: StateContext) -> None:
        self.ctx = fakes.FakeCtx(state, fakes.FakeMembership({}, ()), iter(str(i) for i in count()))
        self.ddl = IndexDDL(self)

    @property
    def state(self) -> StateContext:
        return self.ctx.state

    async def submit(self, msg: RecordIndexItems) -> IndexUpdated:
        self.ctx.request_id = msg.request_id
        return await self.ddl.record_items(msg, self.ctx)

    def items(self, index_id: str) -> int:
        return self.state.indexes[index_id].items_count


@dataclass
class World:
    tk: Timekeeper
    server: RpcServer
    client: ConnectionPool
    indexer: FakeIndexer
    coordinator: MasterCoordinator
    now: list[float]

    def set_items(self, index_id: str, *per_partition: int) -> None:
        for p, n in enumerate(per_partition):
            self.indexer.slices[(index_id, p)].items = n

    async def round(self, *index_ids: str) -> StabilityAdvanced:
        """One stability round, then whatever count it sent has been answered."""
        self.now[0] += 1.0  # rounds a second apart
        msg = AdvanceStability(keyspace="ks", ts=ts(int(self.now[0])), index_ids=list(index_ids))
        assert self.server.address is not None
        reply = await self.client.request(self.server.address, msg, 10, expect=StabilityAdvanced)
        async with asyncio.timeout(5):
            await self.tk.items.drain()
        return reply


@pytest.fixture
async def world() -> AsyncIterator[World]:
    """Index a: ACTIVE, 2 partitions on n1, built with 100 entries (recorded); index b:
    BUILDING on n1."""
    indexer = FakeIndexer("n1")
    await indexer.server.start("127.0.0.1:0")
    a, topo_a = index("a", {0: "n1", 1: "n1"})
    b = index("b", {0: "n1"}, state=BUILDING)
    state = state_of((msgspec.structs.replace(a, items_count=100), topo_a), b)
    indexer.slices = {("a", 0): FakeSlice(items=60), ("a", 1): FakeSlice(items=40)}
    indexer.slices[("b", 0)] = FakeSlice(items=7)
    coordinator = MasterCoordinator(state)
    indexers = {"n1": indexer}
    now = [0.0]
    recorder = ItemsRecorder(lambda: coordinator, interval=30.0, clock=lambda: now[0])
    served = serve_timekeeper(coordinator, FakeMembership(indexers), indexers, items=recorder)
    async with served as (tk, server, client):
        yield World(tk, server, client, indexer, coordinator, now)


async def test_items_count_follows_inserts_and_deletes_after_the_build(world: World) -> None:
    commits = world.coordinator.ctx.commits
    assert (await world.round("a")).items_count == {"a": 100}
    assert commits == []  # the build's count is current: nothing to write
    world.set_items("a", 90, 60)  # inserts: 150
    await world.round("a")
    assert world.coordinator.items("a") == 150 and len(commits) == 1
    world.now[0] += 30.0
    world.set_items("a", 20, 10)  # deletes: 30
    await world.round("a")
    assert world.coordinator.items("a") == 30 and len(commits) == 2


async def test_small_changes_and_fast_ones_do_not_write_each_round(world: World) -> None:
    commits = world.coordinator.ctx.commits
    for n in range(10):  # up to 9 % more, one round each
        world.set_items("a", 60 + n, 40)
        await world.round("a")
    assert commits == [] and world.coordinator.items("a") == 100
    world.set_items("a", 100, 40)  # 140: past a tenth
    await world.round("a")
    assert world.coordinator.items("a") == 140 and len(commits) == 1
    # Within the interval a drift waits (however large), then the latest count goes.
    for n in (300, 500, 700):
        world.set_items("a", n, 40)
        await world.round("a")
    assert world.coordinator.items("a") == 140 and len(commits) == 1
    world.now[0] += 30.0
    await world.round("a")
    assert world.coordinator.items("a") == 740 and len(commits) == 2


async def test_a_building_index_is_left_to_the_build(world: World) -> None:
    assert (await world.round("a", "b")).items_count == {"a": 100, "b": 7}
    assert world.coordinator.items("b") == 0 and world.coordinator.ctx.commits == []


async def test_the_op_refuses_bad_counts_and_commits_only_a_change(world: World) -> None:
    c = world.coordinator
    with pytest.raises(ShardexError) as exc:
        await c.submit(RecordIndexItems(index_id="a", items_count=-1))
    assert exc.value.code is ErrorCode.BAD_REQUEST and "-1" in exc.value.message
    with pytest.raises(ShardexError) as exc:
        await c.submit(RecordIndexItems(index_id="zz", items_count=1))
    assert exc.value.code is ErrorCode.INDEX_NOT_FOUND
    assert (
        await c.submit(RecordIndexItems(index_id="a", items_count=100))
    ).index.items_count == 100
    assert (await c.submit(RecordIndexItems(index_id="b", items_count=5))).index.state == BUILDING
    assert c.ctx.commits == []
    reply = await c.submit(RecordIndexItems(index_id="a", items_count=5))
    assert reply.index.items_count == 5 and reply.index.state == ACTIVE
    assert c.state.indexes["a"].items_count == 5 and len(c.ctx.commits) == 1


def test_drift_is_relative_to_the_recorded_count() -> None:
    assert not drifted(100, 110) and drifted(100, 111) and drifted(100, 89)
    assert drifted(0, 1) and not drifted(0, 0) and drifted(5, 0)
