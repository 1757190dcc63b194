"""``list_indexes``' stability TS, entry count and progress: from the indexers' slices (fake
indexers answering ``ListSlices`` over real TCP), falling back to the index record when an
indexer does not answer."""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import pytest

from shardex.api.coordinator import StateReply, StateRequest
from shardex.api.index import ListSlices, SliceInfo, SliceList
from shardex.client.index_stats import index_stats
from shardex.client.indexes import IndexOps
from shardex.core.topology import Topology
from shardex.errors import NodeUnavailable
from shardex.meta.index_definition import make_definition
from shardex.meta.index_state import ACTIVE, BUILDING, INIT, IndexRecord
from shardex.meta.state import StateContext
from shardex.net import Connection, ConnectionPool, RpcServer, TcpTransport

pytestmark = pytest.mark.timeout(30)

SECRET = "index-stats-test-secret"
U = 5


def slice_(
    index_id: str, p: int, items: int, stability: dict[int, int] | None, name: str = "ix"
) -> SliceInfo:
    return SliceInfo(
        index_id=index_id,
        name=name,
        keyspace="ks",
        partition=p,
        state="active",
        items_count=items,
        stability=None if stability is None else {dp: (s, U) for dp, s in stability.items()},
    )


class FakeIndexer:
    def __init__(self, name: str) -> None:
        self.name = name
        self.slices: list[SliceInfo] = []
        self.asked: list[str | None] = []
        self.server = RpcServer(TcpTransport(), SECRET, name=name)
        self.server.route(ListSlices, self._on_list)

    async def _on_list(self, msg: ListSlices, conn: Connection) -> SliceList:
        self.asked.append(msg.index_id)
        mine = [s for s in self.slices if msg.index_id in (None, s.index_id)]
        return SliceList(node=self.name, slices=mine)


class FakeRouter:
    def __init__(self, indexers: dict[str, FakeIndexer]) -> None:
        self.indexers = indexers
        self.pool = ConnectionPool(TcpTransport(), SECRET, name="client")

    async def address(self, node: str) -> str:
        ix = self.indexers.get(node)
        if ix is None or ix.server.address is None:
            raise NodeUnavailable(f"node {node!r} is not a cluster member")
        return ix.server.address


class FakeRpc:
    """The ``RpcSession`` ``list_indexes`` uses: the state from ``request``, the indexers
    through ``router``."""

    request_timeout = 5.0

    def __init__(self, state: StateContext, router: FakeRouter) -> None:
        self.state = state
        self.router = router

    async def request(self, msg: Any, expect: Any, idempotent: bool) -> Any:
        assert isinstance(msg, StateRequest)
        return StateReply(node="m", master="m", is_master=True, state=self.state)


class Listing(IndexOps):
    def __init__(self, state: StateContext, router: FakeRouter) -> None:
        self.rpc = FakeRpc(state, router)  # type: ignore[assignment]


def record(index_id: str, state: str, **kw: Any) -> IndexRecord:
    defn = make_definition(
        id=index_id,
        name=f"ix_{index_id}",
        keyspace="ks",
        keys=["age"],
        partition_by=["META().id"],
        num_partition=2,
    )
    return IndexRecord(definition=defn, state=state, **kw)


@dataclass
class World:
    listing: Listing
    indexers: dict[str, FakeIndexer]

    async def listed(self) -> dict[str, dict[str, Any]]:
        return {d["id"]: d for d in await self.listing._list_indexes("ks", True, True)}


@pytest.fixture
async def world() -> AsyncIterator[World]:
    """a: ACTIVE on n1 (p0), n2 (p1); b: BUILDING on n2 (p0, p1); c: INIT on n3."""
    indexers = {n: FakeIndexer(n) for n in ("n1", "n2", "n3")}
    for ix in indexers.values():
        await ix.server.start("127.0.0.1:0")
    recs = [
        (
            record("a", ACTIVE, stability_ts={0: (3, U), 1: (4, U)}, items_count=7, progress=0.9),
            {0: "n1", 1: "n2"},
        ),
        (record("b", BUILDING, progress=0.25, items_count=2), {0: "n2", 1: "n2"}),
        (record("c", INIT), {0: "n3", 1: "n3"}),
    ]
    state = StateContext(
        cas=9,
        indexes={r.id: r for r, _ in recs},
        index_topologies={r.id: [Topology(seq_num=1, assignment=a)] for r, a in recs},
    )
    indexers["n1"].slices = [slice_("a", 0, 10, {0: 8, 1: 6})]
    indexers["n2"].slices = [
        slice_("a", 1, 15, {0: 7, 1: 9}),
        slice_("b", 0, 1, None),
        slice_("b", 1, 2, {0: 7, 1: 9}),
    ]
    router = FakeRouter(indexers)
    try:
        yield World(Listing(state, router), indexers)
    finally:
        await router.pool.close()
        for ix in indexers.values():
            await ix.server.stop()


async def test_stability_and_items_come_from_the_indexers(world: World) -> None:
    listed = await world.listed()
    a, b, c = listed["a"], listed["b"], listed["c"]
    # a: per data partition, the lowest seqno any slice was published.
    assert (a["stability_ts"], a["items_count"], a["stats_source"]) == (
        {0: 7, 1: 6},
        25,
        "indexers",
    )
    assert a["progress"] == 1.0  # ACTIVE
    # b: a slice without a published TS: none for the index; items summed anyway.
    assert (b["stability_ts"], b["items_count"], b["stats_source"]) == (None, 3, "indexers")
    assert b["progress"] == 0.25
    # c (INIT): its indexer is not asked; the record's values.
    assert (c["stability_ts"], c["items_count"], c["stats_source"]) == (None, 0, "state")
    assert world.indexers["n3"].asked == []
    # One node, one request: filtered by index when it hosts only one of them.
    assert world.indexers["n1"].asked == ["a"] and world.indexers["n2"].asked == [None]
    # The rest of the description is unchanged.
    assert a["state"] == ACTIVE and a["cas"] == 9 and a["nodes"] == ["n1", "n2"]


async def test_falls_back_to_the_record_when_an_indexer_does_not_answer(world: World) -> None:
    await world.indexers["n1"].server.stop()
    listed = await world.listed()
    a, b = listed["a"], listed["b"]
    assert (a["stability_ts"], a["items_count"], a["stats_source"]) == (
        {0: 3, 1: 4},
        7,
        "state",
    )
    assert b["stats_source"] == "indexers"  # n2 still answers for b
    # A slice missing from the node the topology names: the record too.
    world.indexers["n2"].slices = [s for s in world.indexers["n2"].slices if s.index_id != "b"]
    assert (await world.listed())["b"]["stats_source"] == "state"


async def test_without_stats_no_indexer_is_asked(world: World) -> None:
    listed = {d["id"]: d for d in await world.listing._list_indexes("ks", True, False)}
    assert listed["a"]["stats_source"] == "state" and listed["a"]["stability_ts"] == {0: 3, 1: 4}
    assert all(ix.asked == [] for ix in world.indexers.values())


def test_index_stats_partitions_missing_from_a_slice_count_as_zero() -> None:
    topo = Topology(seq_num=1, assignment={0: "n1", 1: "n2"})
    slices = {"n1": [slice_("a", 0, 1, {0: 5, 1: 5})], "n2": [slice_("a", 1, 2, {0: 6})]}
    assert index_stats("a", topo, slices) == ({0: 5, 1: 0}, 3)
    assert index_stats("a", topo, {"n1": slices["n1"]}) is None
    assert index_stats("a", None, slices) is None
