"""The two-node scan setup the scan integration tests share (the ``env`` fixture of
``tests/integration/conftest.py``): two indexer nodes (``IndexService`` with the scan server
and a scan coordinator each, behind ``RpcServer``s on loopback TCP), fed by the pipeline's
projector and router from a ``FakeKeyspace``, scanned through the real ``Client``. The
coordinator state comes from a holder object standing in for the manager replica; the
oracle helpers give the entries a scan must return.
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import Callable
from pathlib import Path
from typing import Any

from shardex.api.coordinator import StateReply
from shardex.api.delivery import (
    Delivered,
    DeliverKeyVersions,
    PublishStability,
    Stabilised,
    StabiliseSlices,
    StabilityPublished,
)
from shardex.api.index import AllocateSlices, SlicesAllocated
from shardex.api.scan_streams import OutStreams
from shardex.api.spans import encode_spans, to_user_spans
from shardex.client import Client, connect
from shardex.core.keycodec import decode_entry
from shardex.core.spans import in_ranges, spans_to_ranges
from shardex.core.timestamp import Timestamp
from shardex.core.topology import Topology
from shardex.index.oracle import expected_entries
from shardex.index.scan_server import IndexScanServer
from shardex.index.service import IndexService
from shardex.meta.index_definition import IndexDefinition
from shardex.meta.index_state import ACTIVE, IndexRecord
from shardex.meta.member_list import MemberInfo
from shardex.meta.state import KeyspaceMeta, StateContext
from shardex.net import ConnectionPool, RpcServer, TcpTransport
from shardex.net.messages import Message
from shardex.pipeline.project.projector import project
from shardex.pipeline.project.router import IndexRoute, route
from shardex.scan.coordinator import ScanCoordinator
from shardex.scan.elastic_adapters_index import IndexScanMigrations
from shardex.testing.index import FakeKeyspace, random_workload, workload_definitions
from shardex.testing.procs import until

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
            scan_migrations=IndexScanMigrations(name),
        )
        self.server = RpcServer(TcpTransport(), SECRET, name=name)
        self.streams = OutStreams()
        self.streams.install(self.server.router)
        self.svc.install(self.server)
        self.scan_server = IndexScanServer(
            self.svc.host, self.streams, check_serving=self.svc.slice_moves.check_serving
        )
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
    def __init__(self, tmp: Path, *, replicas: bool = False) -> None:
        self.defs = {d.name: d for d in workload_definitions(KS)}
        self.placement = {
            d.id: {p: NODES[p % 2] for p in range(d.num_partition)} for d in self.defs.values()
        }
        # With ``replicas``: a replica copy of every index partition on the other node.
        self.replicas = {
            i: {p: [NODES[1 - NODES.index(n)]] for p, n in a.items()} if replicas else {}
            for i, a in self.placement.items()
        }
        self.holder = StateHolder(self._state(ACTIVE))
        self.members: list[MemberInfo] = []
        self.nodes = {n: Node(n, tmp / n, self.holder, self.members) for n in NODES}
        self.pool = ConnectionPool(TcpTransport(), SECRET, name="pipe")
        self.routes = {d.id: IndexRoute.of(d, self.topology(d.id)) for d in self.defs.values()}
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
            index_topologies={i: [self.topology(i)] for i in self.placement},
        )

    def topology(self, index_id: str) -> Topology:
        return Topology(
            seq_num=1, assignment=self.placement[index_id], replicas=self.replicas[index_id]
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
                mine = self.topology(d.id).copies_of(node)
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

    async def stabilise(self, ts: Timestamp, publish: bool = True) -> None:
        ids = [d.id for d in self.defs.values()]
        for node in NODES:
            msg = StabiliseSlices(keyspace=KS, ts=dict(ts.to_wire()), index_ids=ids)
            await self.ask(node, msg, Stabilised)
        if publish:
            wire = dict(ts.to_wire())
            for node in NODES:
                msg = PublishStability(keyspace=KS, stability={i: wire for i in ids})
                await self.ask(node, msg, StabilityPublished)

    async def round(self, rng: random.Random, n: int) -> Timestamp:
        random_workload(self.ks, rng, n)
        ts = self.ks.ts()
        await self.deliver(ts)
        await self.stabilise(ts)
        return ts

    async def many_in_paris(self, n: int = 12_000) -> Timestamp:
        """``n`` documents in one city, delivered and stabilised: a scan of many blocks."""
        for i in range(n):
            self.ks.upsert(f"d{i:05}", {"city": "paris"})
        ts = self.ks.ts()
        await self.deliver(ts)
        await self.stabilise(ts)
        return ts

    async def scan(self, *args: Any, **kw: Any) -> list[dict[str, Any]]:
        assert self.client is not None
        client = self.client
        return await asyncio.to_thread(lambda: list(client.scan(KS, *args, **kw)))


async def _until(cond: Callable[[], bool], timeout: float = 30.0) -> None:
    """``testing.procs.until`` with this module's longer default bound."""
    await until(cond, timeout)


def oracle_rows(defn: IndexDefinition, docs: dict[str, Any], spans: Any) -> list[tuple[Any, str]]:
    ranges = spans_to_ranges(encode_spans(to_user_spans(spans), defn))
    entries = sorted(e for _, e in expected_entries(defn, docs) if in_ranges(e, ranges))
    return [tuple(decode_entry(e, defn.desc)) for e in entries]  # type: ignore[misc]


def as_rows(rows: list[dict[str, Any]]) -> list[tuple[Any, str]]:
    return [(r["key"], r["docid"]) for r in rows]
