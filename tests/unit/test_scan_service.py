"""The scan path over real TCP in one process: two indexer nodes (``IndexService`` with the
scan server and a scan coordinator each, behind ``RpcServer``s on loopback), fed by the
pipeline's projector and router, scanned through the real ``Client``.

The coordinator state comes from a holder object standing in for the manager replica (the
cluster test in ``tests/spark/test_scan.py`` runs the real one). Every scan result is checked
against the oracle's entries for the documents at the scan's TS.
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import msgspec
import pytest

from shardex.client import Client, connect
from shardex.core.keycodec import decode_entry
from shardex.core.timestamp import Timestamp
from shardex.core.topology import Topology
from shardex.errors import ErrorCode, ShardexError
from shardex.index.definition import IndexDefinition
from shardex.index.delivery_messages import (
    Delivered,
    DeliverKeyVersions,
    PublishStability,
    RollbackSlices,
    SlicesRolledBack,
    StabilityPublished,
    Stabilized,
    StabilizeSlices,
)
from shardex.index.messages import AllocateSlices, SlicesAllocated
from shardex.index.oracle import expected_entries
from shardex.index.scan_server import IndexScanServer
from shardex.index.service import IndexService
from shardex.index.spans import in_ranges, spans_to_ranges
from shardex.index.testing import FakeKeyspace, random_workload, workload_definitions
from shardex.manager.coordinator_messages import StateReply
from shardex.manager.index_state import ACTIVE, BUILDING, IndexRecord
from shardex.manager.member_list import MemberInfo
from shardex.manager.state import KeyspaceMeta, StateContext
from shardex.net import ConnectionPool, RpcServer, TcpTransport
from shardex.net.messages import Message
from shardex.pipeline.projector import project
from shardex.pipeline.router import IndexRoute, route
from shardex.scan.coordinator import ScanCoordinator
from shardex.scan.spans import encode_spans, to_user_spans
from shardex.scan.streams import OutStreams

SECRET = "s" * 32
KS = "ks"
NODES = ("n1", "n2")


class StateHolder:
    """What the coordinator reads of a manager: ``state`` and a fresh ``submit``."""

    def __init__(self, state: StateContext) -> None:
        self.state = state

    async def submit(self, msg: Message) -> StateReply:
        return StateReply(state=self.state, node="m", master="m", is_master=True)


class Node:
    def __init__(self, name: str, path: Path, holder: StateHolder, members: list[MemberInfo]):
        self.name = name
        self.svc = IndexService(
            node_name=name,
            transport=TcpTransport(),
            secret=SECRET,
            path=path,
            reconcile_interval=3600,
        )
        self.server = RpcServer(TcpTransport(), SECRET, name=name)
        self.streams = OutStreams()
        self.streams.install(self.server.router)
        self.svc.install(self.server)
        self.scan_server = IndexScanServer(self.svc, self.streams)
        self.scan_server.install(self.server)
        self.coord = ScanCoordinator(
            transport=TcpTransport(),
            secret=SECRET,
            name=name,
            coordinator=lambda: holder,
            members=lambda: members,
            streams=self.streams,
        )
        self.coord.install(self.server)
        self.address = ""

    async def start(self) -> None:
        await self.svc.start()
        self.address = await self.server.start("127.0.0.1:0")

    async def stop(self) -> None:
        await self.server.stop()
        await self.streams.close()
        await self.coord.stop()
        await self.scan_server.close()
        await self.svc.stop()


class Env:
    def __init__(self, tmp: Path) -> None:
        self.defs = {d.name: d for d in workload_definitions(KS)}
        self.placement = {
            d.id: {p: NODES[p % 2] for p in range(d.num_partition)} for d in self.defs.values()
        }
        self.holder = StateHolder(self._state(ACTIVE))
        self.members: list[MemberInfo] = []
        self.nodes = {n: Node(n, tmp / n, self.holder, self.members) for n in NODES}
        self.pool = ConnectionPool(TcpTransport(), SECRET, name="pipe")
        self.routes = {d.id: IndexRoute.of(d, self.placement[d.id]) for d in self.defs.values()}
        self.ks = FakeKeyspace(num_partitions=8)
        self.delivered: Timestamp | None = None
        self.client: Client | None = None

    def _state(self, state: str, name: str | None = None) -> StateContext:
        return StateContext(
            cas=1,
            keyspaces={KS: KeyspaceMeta(name=KS, num_partitions=8, uuid="u", created_cas=1)},
            indexes={
                d.id: IndexRecord(definition=d, state=state if d.name == name else ACTIVE)
                for d in self.defs.values()
            },
            index_topologies={
                i: [Topology(seq_num=1, assignment=a)] for i, a in self.placement.items()
            },
        )

    async def ask(self, node: str, msg: Message, expect: type[Any]) -> Any:
        return await self.pool.request(self.nodes[node].address, msg, 10, expect=expect)

    async def start(self) -> None:
        for n in self.nodes.values():
            await n.start()
            self.members.append(
                MemberInfo(member_id=n.name, name=n.name, address=n.address, services=("index",))
            )
        for d in self.defs.values():
            for node in NODES:
                mine = [p for p, n in self.placement[d.id].items() if n == node]
                await self.ask(node, AllocateSlices(definition=d, partitions=mine), SlicesAllocated)
        self.client = await asyncio.to_thread(connect, self.nodes["n1"].address, secret=SECRET)

    async def stop(self) -> None:
        if self.client is not None:
            await asyncio.to_thread(self.client.close)
        await self.pool.close()
        for n in self.nodes.values():
            await n.stop()

    async def deliver(self, ts: Timestamp) -> None:
        changes = self.ks.changes(self.delivered, ts)
        rows = route(project(list(self.defs.values()), changes).rows, self.routes).by_node
        for node in NODES:
            msg = DeliverKeyVersions(keyspace=KS, batch_id=1, rows=rows.get(node, []))
            await self.ask(node, msg, Delivered)
        self.delivered = ts

    async def stabilize(self, ts: Timestamp, publish: bool = True) -> None:
        ids = [d.id for d in self.defs.values()]
        for node in NODES:
            msg = StabilizeSlices(keyspace=KS, ts=dict(ts.to_wire()), index_ids=ids)
            await self.ask(node, msg, Stabilized)
        if publish:
            wire = dict(ts.to_wire())
            for node in NODES:
                msg = PublishStability(keyspace=KS, stability={i: wire for i in ids})
                await self.ask(node, msg, StabilityPublished)

    async def round(self, rng: random.Random, n: int) -> Timestamp:
        random_workload(self.ks, rng, n)
        ts = self.ks.ts()
        await self.deliver(ts)
        await self.stabilize(ts)
        return ts

    async def scan(self, *args: Any, **kw: Any) -> list[dict[str, Any]]:
        assert self.client is not None
        client = self.client
        return await asyncio.to_thread(lambda: list(client.scan(KS, *args, **kw)))


@pytest.fixture
async def env(tmp_path: Path) -> AsyncIterator[Env]:
    e = Env(tmp_path)
    await e.start()
    try:
        yield e
    finally:
        await e.stop()


async def _until(cond: Callable[[], bool], timeout: float = 30.0) -> None:
    """Poll ``cond`` on the loop until it holds; fail the test past ``timeout`` seconds."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while not cond():
        assert loop.time() < deadline, "condition not reached in time"
        await asyncio.sleep(0.01)


def oracle_rows(defn: IndexDefinition, docs: dict[str, Any], spans: Any) -> list[tuple[Any, str]]:
    ranges = spans_to_ranges(encode_spans(to_user_spans(spans), defn))
    entries = sorted(e for _, e in expected_entries(defn, docs) if in_ranges(e, ranges))
    return [tuple(decode_entry(e, defn.desc)) for e in entries]  # type: ignore[misc]


def as_rows(rows: list[dict[str, Any]]) -> list[tuple[Any, str]]:
    return [(r["key"], r["docid"]) for r in rows]


async def test_scans_equal_the_oracle_with_spans_limit_offset_and_order(env: Env) -> None:
    rng = random.Random(3)
    ts = await env.round(rng, 300)
    docs = env.ks.documents_at(ts)
    cases: list[tuple[str, Any]] = [
        ("by_name", None),
        ("by_name", [{"low": ["bob"], "high": ["dee"], "inclusion": "low"}]),
        ("by_name", [{"low": ["ann", 1], "high": ["ann", 3]}, {"low": ["eve"]}]),
        ("by_age", [{"low": [1], "high": [3], "inclusion": "neither"}]),
        ("by_city", [{"low": ["oslo"], "high": ["rome"]}]),
        ("#primary", [{"low": ["doc1"], "high": ["doc3"]}]),
    ]
    for name, spans in cases:
        defn = env.defs[name]
        want = oracle_rows(defn, docs, spans)
        assert want, name
        got = await env.scan(name, spans, consistency="at_plus", at=ts)
        assert as_rows(got) == want, name
        for _ in range(4):
            offset, limit = rng.randrange(0, len(want) + 2), rng.randrange(0, 15)
            page = await env.scan(name, spans, "at_plus", ts, limit=limit, offset=offset)
            assert as_rows(page) == want[offset : offset + limit], (name, offset, limit)
        unordered = await env.scan(name, spans, "at_plus", ts, ordered=False)
        assert sorted(as_rows(unordered), key=repr) == sorted(want, key=repr)
        ids = await env.scan(name, spans, "at_plus", ts, covering=False)
        assert ids == [{"docid": d} for _, d in want]
    # not_bounded reads the tips: the same here, nothing is queued.
    assert as_rows(await env.scan("by_name")) == oracle_rows(env.defs["by_name"], docs, None)


async def test_an_equality_span_on_the_partition_key_reads_one_slice(env: Env) -> None:
    ts = await env.round(random.Random(4), 200)
    assert env.client is not None
    client = env.client
    spans = [{"low": ["rome"], "high": ["rome"]}]
    # by_city is unpartitioned; by_name partitions by city but leads with name: no elimination
    res = await asyncio.to_thread(client.scan, KS, "by_name", [{"low": ["ann"], "high": ["ann"]}])
    assert res.partitions == [0, 1, 2, 3]
    res.close()
    defn = msgspec.structs.replace(env.defs["by_city"])
    res = await asyncio.to_thread(client.scan, KS, "by_city", spans, "at_plus", ts)
    rows = await asyncio.to_thread(list, res)
    assert as_rows(rows) == oracle_rows(defn, env.ks.documents_at(ts), spans)
    assert res.ts == ts and res.partitions == [0]


async def test_at_plus_waits_for_the_stabilise_then_sees_the_writes(env: Env) -> None:
    rng = random.Random(5)
    await env.round(rng, 100)
    random_workload(env.ks, rng, 50)
    ahead = env.ks.ts()
    await env.deliver(ahead)  # queued, not stabilised: a scan at_plus ahead must wait
    scan = asyncio.ensure_future(env.scan("by_name", consistency="at_plus", at=ahead))
    watch = env.nodes["n1"].scan_server.watch
    await _until(lambda: bool(watch._events) or scan.done())  # waiting on n1's slices
    assert not scan.done()
    await env.stabilize(ahead)
    got = await scan
    assert as_rows(got) == oracle_rows(env.defs["by_name"], env.ks.documents_at(ahead), None)


async def test_a_scan_that_cannot_catch_up_times_out_naming_the_lag(env: Env) -> None:
    ts = await env.round(random.Random(6), 60)
    p = next(iter(ts))
    ahead = ts.with_entry(p, ts.seqno(p) + 7, ts[p].uuid)
    with pytest.raises(ShardexError) as info:
        await env.scan("by_city", consistency="at_plus", at=ahead, timeout=0.5)
    assert info.value.code is ErrorCode.SCAN_TIMEOUT
    assert info.value.details["behind"] == {str(p): [ts.seqno(p) + 7, ts.seqno(p)]}
    assert "7 mutation(s) behind" in info.value.message


async def test_query_stability_pins_a_ts_until_it_is_released(env: Env) -> None:
    rng = random.Random(7)
    ts = await env.round(rng, 120)
    assert env.client is not None
    ctx = env.client.query_context()

    def scan_in_ctx() -> list[dict[str, Any]]:
        return list(ctx.scan(KS, "by_name", consistency="at_plus", at=ts))

    first = await asyncio.to_thread(scan_in_ctx)
    assert ctx.pinned[KS] == ts
    await env.round(rng, 40)  # newer TS: the context still reads the pinned one
    assert await asyncio.to_thread(scan_in_ctx) == first
    for _ in range(5):  # the slices keep 5 snapshots: the pinned one is released
        await env.round(rng, 10)
    with pytest.raises(ShardexError) as info:
        await asyncio.to_thread(scan_in_ctx)
    assert info.value.code is ErrorCode.SNAPSHOT_TOO_OLD


async def test_errors_name_the_index_and_change_nothing(env: Env) -> None:
    await env.round(random.Random(8), 50)
    with pytest.raises(ShardexError) as info:
        await env.scan("nope")
    assert info.value.code is ErrorCode.INDEX_NOT_FOUND
    assert info.value.details["index"] == "nope"
    env.holder.state = env._state(BUILDING, "by_age")
    with pytest.raises(ShardexError) as info:
        await env.scan("by_age")
    assert info.value.code is ErrorCode.INDEX_NOT_READY
    assert info.value.details["state"] == BUILDING
    with pytest.raises(ShardexError) as info:
        await env.scan("by_name", [{"low": [1], "inclusion": "all"}])
    assert info.value.code is ErrorCode.BAD_REQUEST
    with pytest.raises(ShardexError) as info:
        await env.scan("by_name", consistency="at_plus")
    assert info.value.code is ErrorCode.BAD_REQUEST
    # A rolled-back data partition: the slices that applied beyond it answer INDEX_IN_ROLLBACK.
    p = next(p for p, e in env.ks.ts().items() if e.seqno > 1)
    for node in NODES:
        await env.ask(node, RollbackSlices(keyspace=KS, partition=p, seqno=0), SlicesRolledBack)
    with pytest.raises(ShardexError) as info:
        await env.scan("by_city")
    assert info.value.code is ErrorCode.INDEX_IN_ROLLBACK


async def test_back_pressure_bounds_what_a_slow_reader_is_sent(env: Env) -> None:
    for i in range(12_000):
        env.ks.upsert(f"d{i:05}", {"city": "paris"})
    ts = env.ks.ts()
    await env.deliver(ts)
    await env.stabilize(ts)
    assert env.client is not None
    client = env.client
    res = await asyncio.to_thread(client.scan, KS, "#primary", None, "at_plus", ts)
    blocks = res.blocks()
    first = await asyncio.to_thread(next, blocks)
    assert first[0] < first[-1]
    out = env.nodes["n1"].streams
    (stream,) = [s for (c, _), s in out._streams.items() if c.peer_name == client.name + "/scan"]
    await _until(lambda: stream.credit <= 0)  # sends until its credit is spent, then waits
    assert stream.blocks == 1 + 4  # the block the reader took back + the initial credit
    rest = await asyncio.to_thread(lambda: [e for b in blocks for e in b])
    assert len(first) + len(rest) == 12_000
    assert out.open_streams == 0
