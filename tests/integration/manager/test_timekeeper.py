"""The timekeeper (mutation-flow steps 12-16) against fake indexers over real TCP: what it
stabilises where (nodes, index ids, incarnations), that it waits for every ACK (in parallel),
publishes only what every slice acknowledged, fails whole on any failure (keeping
STALE_DELIVERY's code) and holds the published TS monotonically."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any

import pytest

from shardex.api.delivery import (
    PublishStability,
    SliceAck,
    Stabilised,
    StabiliseSlices,
    StabilityPublished,
)
from shardex.api.timekeeper import (
    AdvanceStability,
    StabilityAdvanced,
    StabilityReply,
    StabilityRequest,
)
from shardex.core.timestamp import Timestamp
from shardex.core.topology import Topology
from shardex.errors import ErrorCode, NodeUnavailable, ShardexError
from shardex.manager.timekeeper import Timekeeper, plan_stabilise
from shardex.meta.index_definition import make_definition
from shardex.meta.index_state import ACTIVE, BUILDING, DELETED, INIT, IndexRecord
from shardex.meta.member_list import DOWN, UP, MemberInfo
from shardex.meta.state import StateContext
from shardex.net import Connection, ConnectionPool, RpcServer, TcpTransport

pytestmark = pytest.mark.timeout(30)

SECRET = "timekeeper-test-secret"
U = 77  # the partitions' uuid


def ts(*seqnos: int) -> dict[int, tuple[int, int]]:
    return {p: (s, U) for p, s in enumerate(seqnos)}


# --- fakes -------------------------------------------------------------------------------------


@dataclass
class FakeSlice:
    state: str = "active"
    items: int = 0
    applied: dict[int, tuple[int, int]] = field(default_factory=dict)


class FakeIndexer:
    """An indexer's StabiliseSlices / PublishStability on a real RpcServer. Slices in
    ``active`` / ``created`` reach the requested TS; others keep their applied TS."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.incarnation = f"inc-{name}"
        self.slices: dict[tuple[str, int], FakeSlice] = {}
        self.stabilise: list[StabiliseSlices] = []
        self.publish: list[PublishStability] = []
        self.fail: ShardexError | None = None
        self.gate: Callable[[StabiliseSlices], Any] | None = None  # awaited before answering
        self.publish_gate: Callable[[PublishStability], Any] | None = None  # before applying
        self.held: dict[str, Timestamp] = {}  # index id -> stability TS, as IndexDelivery
        self.server = RpcServer(TcpTransport(), SECRET, name=name)
        self.server.route(StabiliseSlices, self._on_stabilise)
        self.server.route(PublishStability, self._on_publish)

    async def _on_stabilise(self, msg: StabiliseSlices, conn: Connection) -> Stabilised:
        self.stabilise.append(msg)
        if self.gate is not None:
            await self.gate(msg)
        if self.fail is not None:
            raise self.fail
        if msg.incarnation and msg.incarnation != self.incarnation:
            raise ShardexError(
                f"{self.name} restarted since the delivery",
                code=ErrorCode.STALE_DELIVERY,
                details={"incarnation": self.incarnation},
            )
        acks, missing = [], []
        for index_id in msg.index_ids:
            mine = sorted((p, s) for (i, p), s in self.slices.items() if i == index_id)
            if not mine:
                missing.append(index_id)
            for p, s in mine:
                if s.state in ("active", "created"):
                    s.applied = dict(msg.ts)
                acks.append(
                    SliceAck(
                        index_id=index_id,
                        partition=p,
                        applied=s.applied,
                        items_count=s.items,
                        state=s.state,
                    )
                )
        return Stabilised(node=self.name, incarnation=self.incarnation, acks=acks, missing=missing)

    async def _on_publish(self, msg: PublishStability, conn: Connection) -> StabilityPublished:
        self.publish.append(msg)
        if self.publish_gate is not None:
            await self.publish_gate(msg)
        for index_id, wire in msg.stability.items():  # IndexDelivery.on_publish's rule
            at = Timestamp.from_wire(wire)
            held = self.held.get(index_id)
            if held is None or not held.covers(at):
                self.held[index_id] = at
        return StabilityPublished(node=self.name)


class FakeMembership:
    def __init__(self, indexers: dict[str, FakeIndexer]) -> None:
        self.members = [
            MemberInfo(
                member_id=f"id-{n}", name=n, address=ix.server.address or "", services=("index",)
            )
            for n, ix in sorted(indexers.items())
        ]
        self.down: set[str] = set()

    def state_of(self, member_id: str, now: float) -> tuple[str, float]:
        return (DOWN if member_id[3:] in self.down else UP), 0.0


class FakeCoordinator:
    def __init__(self, state: StateContext) -> None:
        self.state = state


def index(
    index_id: str, assignment: dict[int, str], state: str = ACTIVE, keyspace: str = "ks"
) -> tuple[IndexRecord, Topology]:
    defn = make_definition(
        id=index_id,
        name=f"ix_{index_id}",
        keyspace=keyspace,
        keys=["age"],
        partition_by=["META().id"] if len(assignment) > 1 else None,
        num_partition=len(assignment),
    )
    return IndexRecord(definition=defn, state=state), Topology(seq_num=1, assignment=assignment)


def state_of(*recs: tuple[IndexRecord, Topology]) -> StateContext:
    return StateContext(
        epoch=1,
        cas=5,
        indexes={r.id: r for r, _ in recs},
        index_topologies={r.id: [Topology(seq_num=0, assignment={}), t] for r, t in recs},
    )


@dataclass
class World:
    tk: Timekeeper
    server: RpcServer
    client: ConnectionPool
    indexers: dict[str, FakeIndexer]
    membership: FakeMembership
    coordinator: FakeCoordinator

    async def advance(
        self,
        index_ids: list[str],
        at: dict[int, tuple[int, int]],
        incarnations: dict[str, str] | None = None,
        keyspace: str = "ks",
    ) -> StabilityAdvanced:
        msg = AdvanceStability(
            keyspace=keyspace,
            ts=at,
            index_ids=index_ids,
            batch_id=3,
            incarnations=incarnations or {},
        )
        assert self.server.address is not None
        return await self.client.request(self.server.address, msg, 10, expect=StabilityAdvanced)

    async def held(self, keyspace: str = "ks") -> dict[str, dict[int, tuple[int, int]]]:
        assert self.server.address is not None
        msg = StabilityRequest(keyspace=keyspace)
        reply = await self.client.request(self.server.address, msg, 10, expect=StabilityReply)
        return {i: Timestamp.from_wire(t).to_wire() for i, t in reply.stability.items()}

    def sent(self) -> dict[str, list[tuple[list[str], str]]]:
        return {
            n: [(m.index_ids, m.incarnation) for m in ix.stabilise]
            for n, ix in sorted(self.indexers.items())
            if ix.stabilise
        }

    async def published_to(self) -> dict[str, list[dict[str, Any]]]:
        """What each indexer was told. The publishes follow the reply to AdvanceStability:
        wait (with a deadline) until every one queued so far has been answered."""
        async with asyncio.timeout(5):
            await self.tk.drain_publishes()
        return {
            n: [dict(m.stability) for m in ix.publish]
            for n, ix in sorted(self.indexers.items())
            if ix.publish
        }


@pytest.fixture
async def world() -> AsyncIterator[World]:
    """Indexers n1..n4; indexes:
    a: 3 partitions on n1, n2, n3 (active), b: 1 partition on n2, c: 2 partitions on n1, n3,
    d: on n4, DELETED; e: INIT on n4; f: 2 partitions on n1, n2 of keyspace "other"."""
    indexers = {n: FakeIndexer(n) for n in ("n1", "n2", "n3", "n4")}
    for ix in indexers.values():
        await ix.server.start("127.0.0.1:0")
    recs = [
        index("a", {0: "n1", 1: "n2", 2: "n3"}),
        index("b", {0: "n2"}, state=BUILDING),
        index("c", {0: "n1", 1: "n3"}),
        index("d", {0: "n4"}, state=DELETED),
        index("e", {0: "n4"}, state=INIT),
        index("f", {0: "n1", 1: "n2"}, keyspace="other"),
    ]
    for rec, topo in recs:
        for p, node in topo.assignment.items():
            indexers[node].slices[(rec.id, p)] = FakeSlice(items=10 * (p + 1))
    coordinator = FakeCoordinator(state_of(*recs))
    membership = FakeMembership(indexers)
    async with serve_timekeeper(coordinator, membership, indexers) as (tk, server, client):
        yield World(tk, server, client, indexers, membership, coordinator)


@asynccontextmanager
async def serve_timekeeper(
    coordinator: Any, membership: FakeMembership, indexers: dict[str, FakeIndexer], **kw: Any
) -> AsyncIterator[tuple[Timekeeper, RpcServer, ConnectionPool]]:
    """Timekeeper ``m1`` serving on a real server (``kw``: its further arguments), a client
    for the driver; everything (the indexers too) stopped on the way out."""
    tk = Timekeeper(
        transport=TcpTransport(),
        secret=SECRET,
        name="m1",
        coordinator=lambda: coordinator,
        membership=lambda: membership,
        stabilise_timeout=5,
        publish_timeout=5,
        **kw,
    )
    server = RpcServer(TcpTransport(), SECRET, name="m1")
    tk.install(server)
    await server.start("127.0.0.1:0")
    client = ConnectionPool(TcpTransport(), SECRET, name="driver")
    try:
        yield tk, server, client
    finally:
        await client.close()
        await tk.stop()
        await server.stop()
        for ix in indexers.values():
            await ix.server.stop()


# --- tests -------------------------------------------------------------------------------------


async def test_all_ack_publishes_and_holds_monotonically(world: World) -> None:
    reply = await world.advance(["a", "c"], ts(5, 7))
    assert reply.published == ["a", "c"] and reply.skipped == []
    assert reply.items_count == {"a": 10 + 20 + 30, "c": 10 + 20}
    assert Timestamp.from_wire(reply.ts) == Timestamp.from_wire(ts(5, 7))
    assert await world.held() == {"a": ts(5, 7), "c": ts(5, 7)}
    # Every indexer was told the TS of exactly the indexes it hosts.
    assert await world.published_to() == {
        "n1": [{"a": ts(5, 7), "c": ts(5, 7)}],
        "n2": [{"a": ts(5, 7)}],
        "n3": [{"a": ts(5, 7), "c": ts(5, 7)}],
    }
    reply = await world.advance(["a"], ts(6, 9))
    assert reply.published == ["a"]
    assert await world.held() == {"a": ts(6, 9), "c": ts(5, 7)}
    # A retried older batch is acknowledged (the slices are past it) but moves nothing back.
    reply = await world.advance(["a"], ts(5, 7))
    assert reply.published == ["a"]
    assert await world.held() == {"a": ts(6, 9), "c": ts(5, 7)}
    assert world.tk.published["ks"]["a"] == Timestamp.from_wire(ts(6, 9))
    # Another keyspace's map is its own.
    assert await world.held("other") == {}
    reply = await world.advance(["f"], ts(1, 1), keyspace="other")
    assert reply.published == ["f"] and await world.held("other") == {"f": ts(1, 1)}
    assert "f" not in await world.held()


async def test_requests_reach_only_the_hosting_nodes_with_their_incarnation(world: World) -> None:
    reply = await world.advance(
        ["b", "c", "c"], ts(3), incarnations={"n1": "inc-n1", "n2": "inc-n2", "n4": "inc-x"}
    )
    assert reply.published == ["b", "c"]
    # n4 hosts neither: never asked (its wrong incarnation would have refused otherwise);
    # n3 got no delivery this batch: "" (any incarnation will do).
    assert world.sent() == {
        "n1": [(["c"], "inc-n1")],
        "n2": [(["b"], "inc-n2")],
        "n3": [(["c"], "")],
    }
    assert all(
        m.keyspace == "ks" and m.ts == ts(3) for ix in world.indexers.values() for m in ix.stabilise
    )


async def test_unknown_deleted_init_and_foreign_indexes_are_skipped(world: World) -> None:
    reply = await world.advance(["zz", "d", "e", "f", "b"], ts(4))
    assert reply.published == ["b"]
    assert reply.skipped == ["d", "e", "f", "zz"]
    assert world.sent() == {"n2": [(["b"], "")]}  # nothing went to n4 (d, e) or for f
    assert await world.held() == {"b": ts(4)}
    # Only skipped indexes: no request at all, nothing published.
    reply = await world.advance(["zz"], ts(5))
    assert (reply.published, reply.skipped, reply.items_count) == ([], ["zz"], {})
    assert world.sent() == {"n2": [(["b"], "")]}


async def test_an_index_with_a_loading_slice_is_skipped(world: World) -> None:
    world.indexers["n2"].slices[("a", 1)].state = "loading"
    world.indexers["n3"].slices[("c", 1)].state = "needs_rebuild"
    reply = await world.advance(["a", "b", "c"], ts(2, 2))
    assert reply.published == ["b"] and reply.skipped == ["a", "c"]
    assert reply.items_count == {"b": 10}
    assert await world.held() == {"b": ts(2, 2)}
    assert await world.published_to() == {"n2": [{"b": ts(2, 2)}]}
    # "created" (allocated, nothing loaded) is stable once its applied TS covers the TS.
    world.indexers["n2"].slices[("a", 1)] = FakeSlice(state="created")
    assert (await world.advance(["a"], ts(2, 2))).published == ["a"]


async def test_a_slice_that_did_not_reach_the_ts_or_is_missing_is_skipped(world: World) -> None:
    # An indexer that answers but lost a slice (or never had it): the index is not stable.
    del world.indexers["n3"].slices[("c", 1)]
    world.indexers["n1"].slices[("a", 0)].state = "weird"
    reply = await world.advance(["a", "c"], ts(1, 1))
    assert reply.published == [] and reply.skipped == ["a", "c"]
    assert await world.published_to() == {} and await world.held() == {}


async def test_one_failing_indexer_fails_the_request_and_publishes_nothing(world: World) -> None:
    await world.advance(["a"], ts(1, 1))
    world.indexers["n2"].fail = NodeUnavailable("disk on fire")
    with pytest.raises(ShardexError) as err:
        await world.advance(["a", "c"], ts(2, 2))
    assert err.value.code is ErrorCode.NODE_UNAVAILABLE
    assert err.value.details["node"] == "n2" and "disk on fire" in err.value.details["error"]
    assert err.value.details["hint"]
    assert "nothing was published" in err.value.message
    assert await world.held() == {"a": ts(1, 1)}  # c was fine on n1, n3: still not published
    assert await world.published_to() == {n: [{"a": ts(1, 1)}] for n in ("n1", "n2", "n3")}
    # The others were asked anyway (in parallel); a retry after the fix publishes both.
    assert sorted(world.sent()) == ["n1", "n2", "n3"]
    world.indexers["n2"].fail = None
    assert (await world.advance(["a", "c"], ts(2, 2))).published == ["a", "c"]


async def test_an_unreachable_indexer_fails_the_request(world: World) -> None:
    await world.indexers["n3"].server.stop()  # connection refused
    with pytest.raises(ShardexError) as err:
        await world.advance(["a"], ts(1, 1))
    assert err.value.code is ErrorCode.NODE_UNAVAILABLE and err.value.details["node"] == "n3"
    assert await world.held() == {} and await world.published_to() == {}
    # Down in the membership view: refused at once, nothing sent to it.
    world.membership.down.add("n2")
    asked = len(world.indexers["n2"].stabilise)
    with pytest.raises(ShardexError) as err:
        await world.advance(["b"], ts(1, 1))
    assert err.value.details["node"] == "n2" and "down" in err.value.details["error"]
    assert len(world.indexers["n2"].stabilise) == asked


async def test_stale_delivery_keeps_its_code(world: World) -> None:
    with pytest.raises(ShardexError) as err:
        await world.advance(
            ["a"], ts(1, 1), incarnations={"n1": "inc-n1", "n2": "old", "n3": "inc-n3"}
        )
    assert err.value.code is ErrorCode.STALE_DELIVERY
    assert err.value.details["node"] == "n2" and err.value.details["incarnation"] == "inc-n2"
    assert await world.held() == {} and await world.published_to() == {}
    # Even when another node fails differently, the caller learns it must re-deliver.
    world.indexers["n1"].fail = NodeUnavailable("n1 broke")
    with pytest.raises(ShardexError) as err:
        await world.advance(["a"], ts(1, 1), incarnations={"n2": "old"})
    assert err.value.code is ErrorCode.STALE_DELIVERY
    assert sorted(err.value.details["failed"]) == ["n1", "n2"]


async def test_stabilise_requests_go_out_in_parallel(world: World) -> None:
    # Each indexer answers only once all three hold their request: sequential sends would
    # never get there (the barrier times out and fails the request).
    barrier = asyncio.Barrier(3)

    async def gate(_: StabiliseSlices) -> None:
        async with asyncio.timeout(5):
            await barrier.wait()

    for ix in world.indexers.values():
        ix.gate = gate
    assert (await world.advance(["a"], ts(1, 1))).published == ["a"]


async def test_requests_of_one_keyspace_are_serialised(world: World) -> None:
    """A second batch of a keyspace waits for the first; another keyspace does not."""
    release = asyncio.Event()
    arrived: list[tuple[str, int]] = []
    first_in = asyncio.Event()
    other_in = asyncio.Event()

    async def gate(msg: StabiliseSlices) -> None:
        arrived.append((msg.keyspace, msg.ts[0][0]))
        if msg.keyspace == "other":
            other_in.set()
        elif msg.ts[0][0] == 1:
            first_in.set()
            await release.wait()

    world.indexers["n2"].gate = gate
    first = asyncio.create_task(world.advance(["b"], ts(1)))
    await first_in.wait()
    second = asyncio.create_task(world.advance(["b"], ts(2)))
    other = asyncio.create_task(world.advance(["f"], ts(9, 9), keyspace="other"))
    # The other keyspace's request went out after the second was sent to the timekeeper
    # (same connection, in order): had the second not waited, it would be here before it.
    await other_in.wait()
    assert arrived == [("ks", 1), ("other", 9)]
    release.set()
    assert (await first).published == ["b"]
    assert (await second).published == ["b"]
    assert (await other).published == ["f"]
    assert arrived == [("ks", 1), ("other", 9), ("ks", 2)]
    assert await world.held() == {"b": ts(2)}


async def test_held_stability_forgets_dropped_indexes(world: World) -> None:
    await world.advance(["a", "c"], ts(1, 1))
    state = world.coordinator.state
    world.coordinator.state = StateContext(
        epoch=state.epoch,
        cas=state.cas + 1,
        indexes={i: r for i, r in state.indexes.items() if i != "a"},
        index_topologies={i: t for i, t in state.index_topologies.items() if i != "a"},
    )
    assert await world.held() == {"c": ts(1, 1)}


def test_plan_groups_partitions_by_the_latest_topology() -> None:
    rec, topo = index("a", {0: "n1", 1: "n2"})
    moved = Topology(seq_num=2, assignment={0: "n3", 1: "n2"})
    state = StateContext(indexes={"a": rec}, index_topologies={"a": [topo, moved]})
    plan = plan_stabilise(state, "ks", ["a", "a"])
    assert plan.by_node == {"n2": ["a"], "n3": ["a"]}
    assert plan.topologies == {"a": moved} and plan.skipped == {}


async def test_bad_timestamp_is_refused(world: World) -> None:
    with pytest.raises(ShardexError) as err:
        await world.advance(["a"], {0: (-1, U)})
    assert err.value.code is ErrorCode.BAD_REQUEST
    assert world.sent() == {}
