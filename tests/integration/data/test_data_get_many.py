"""``data.GetMany``: several documents from their owner in one request, on real TCP between
two in-process data services; and ``sql.exec.documents.DocumentAccess.get_many`` routing
per owner and re-routing the docids whose partition is elsewhere."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import msgspec
import pytest

from shardex.api.data import GetMany, GetManyReply
from shardex.core.topology import Topology, balanced_assignment
from shardex.data.reads import GET_MANY_MAX
from shardex.data.service import DataService
from shardex.errors import ErrorCode, ShardexError
from shardex.meta.partitioning import partition_of
from shardex.meta.state import KeyspaceMeta, StateContext
from shardex.net import ConnectionPool, RpcServer, TcpTransport
from shardex.sql.exec.documents import DocumentAccess

SECRET = "s" * 32
KS = "ks"
PARTS = 8
NODES = ("n1", "n2")


def state_on(nodes: tuple[str, ...]) -> StateContext:
    meta = KeyspaceMeta(name=KS, num_partitions=PARTS, uuid="u1", created_cas=1)
    topo = Topology(seq_num=1, assignment=balanced_assignment(PARTS, list(nodes)))
    return StateContext(cas=1, keyspaces={KS: meta}, data_topologies={KS: [topo]})


class Coordinator:
    def __init__(self, state: StateContext) -> None:
        self.state = state

    def on_change(self, cb: object) -> None:
        pass


class View:
    """What DocumentAccess reads of the cluster: a (possibly stale) state and addresses."""

    def __init__(self, stale: StateContext, fresh: StateContext) -> None:
        self.stale, self.fresh = stale, fresh
        self.addresses: dict[str, str] = {}
        self.fresh_reads = 0

    async def state(self, *, fresh: bool = False) -> StateContext:
        self.fresh_reads += fresh
        return self.fresh if fresh else self.stale

    def address(self, node: str) -> str:
        return self.addresses[node]


@pytest.fixture
async def cluster(tmp_path: Path) -> AsyncIterator[tuple[dict[str, DataService], dict[str, str]]]:
    coord = Coordinator(state_on(NODES))
    services: dict[str, DataService] = {}
    servers: list[RpcServer] = []
    addresses: dict[str, str] = {}
    try:
        for name in NODES:
            ds = DataService(
                data_dir=tmp_path / name,
                node_name=name,
                transport=TcpTransport(),
                secret=SECRET,
                coordinator=lambda: coord,
                reconcile_interval=3600,
            )
            await ds.start()
            await ds.reconcile()
            services[name] = ds
            server = RpcServer(TcpTransport(), SECRET, name=name)
            ds.install(server)
            addresses[name] = await server.start("127.0.0.1:0")
            servers.append(server)
        yield services, addresses
    finally:
        for server in servers:
            await server.stop()
        for ds in services.values():
            await ds.stop()


def owner(docid: str) -> str:
    return balanced_assignment(PARTS, list(NODES))[partition_of(docid, PARTS)]


def put(services: dict[str, DataService], docid: str, doc: dict) -> None:
    services[owner(docid)].engine.upsert(KS, docid, doc)


async def test_get_many_answers_each_docid_in_order(cluster) -> None:
    services, addresses = cluster
    mine = [d for d in (f"doc-{i}" for i in range(60)) if owner(d) == "n1"][:6]
    for k, d in enumerate(mine[:4]):
        put(services, d, {"k": k})
    services["n1"].engine.delete(KS, mine[1])
    pool = ConnectionPool(TcpTransport(), SECRET, name="t")
    try:
        ask = [mine[3], mine[1], mine[5], mine[0]]  # mine[5] was never written
        reply = await pool.request(
            addresses["n1"], GetMany(keyspace=KS, docids=ask), 5.0, expect=GetManyReply
        )
    finally:
        await pool.close()
    got = [None if b is None else msgspec.json.decode(b) for b in reply.bodies]
    assert got == [{"k": 3}, None, None, {"k": 0}]  # deleted and never written: absent
    assert reply.errors == []


async def test_docids_of_another_owner_are_per_item_errors(cluster) -> None:
    services, addresses = cluster
    on_n2 = [d for d in (f"doc-{i}" for i in range(40)) if owner(d) == "n2"][:3]
    on_n1 = [d for d in (f"doc-{i}" for i in range(40)) if owner(d) == "n1"][:2]
    for d in on_n1 + on_n2:
        put(services, d, {"id": d})
    pool = ConnectionPool(TcpTransport(), SECRET, name="t")
    try:
        ask = [on_n1[0], on_n2[0], on_n1[1], on_n2[1]]
        reply = await pool.request(
            addresses["n1"], GetMany(keyspace=KS, docids=ask), 5.0, expect=GetManyReply
        )
    finally:
        await pool.close()
    assert [b is not None for b in reply.bodies] == [True, False, True, False]
    assert [e.index for e in reply.errors] == [1, 3]
    assert {e.error.code for e in reply.errors} == {ErrorCode.NOT_MY_PARTITION.value}
    assert all(e.error.details.get("owner_hint") == "n2" for e in reply.errors)


async def test_bad_requests_fail_whole_and_change_nothing(cluster) -> None:
    _, addresses = cluster
    pool = ConnectionPool(TcpTransport(), SECRET, name="t")
    try:
        too_many = GetMany(keyspace=KS, docids=["d"] * (GET_MANY_MAX + 1))
        with pytest.raises(ShardexError) as info:
            await pool.request(addresses["n1"], too_many, 5.0, expect=GetManyReply)
        assert info.value.code == ErrorCode.BAD_REQUEST
        assert info.value.details["value"] == GET_MANY_MAX + 1
        with pytest.raises(ShardexError) as info:
            await pool.request(
                addresses["n1"], GetMany(keyspace="nope", docids=["a"]), 5.0, expect=GetManyReply
            )
        assert info.value.code == ErrorCode.KEYSPACE_NOT_FOUND
        # The node still serves.
        reply = await pool.request(
            addresses["n1"], GetMany(keyspace=KS, docids=[]), 5.0, expect=GetManyReply
        )
        assert reply.bodies == []
    finally:
        await pool.close()


async def test_document_access_reroutes_moved_docids(cluster) -> None:
    services, addresses = cluster
    docids = [f"user-{i}" for i in range(60)]
    for i, d in enumerate(docids):
        if i % 7 != 3:  # some absent
            put(services, d, {"i": i})
    # A stale view placing every partition on n1: n2's docids come back NOT_MY_PARTITION
    # and are re-routed after a fresh read of the state.
    view = View(stale=state_on(("n1",)), fresh=state_on(NODES))
    view.addresses = addresses
    pool = ConnectionPool(TcpTransport(), SECRET, name="t")
    try:
        access = DocumentAccess(view, pool)  # type: ignore[arg-type]
        ask = [*reversed(docids), docids[0]]  # order kept, repeats answered
        got = await access.get_many(KS, ask)
    finally:
        await pool.close()
    expect = [(d, {"i": int(d.split("-")[1])}) for d in ask if int(d.split("-")[1]) % 7 != 3]
    assert got == expect
    assert view.fresh_reads >= 1
    assert any(owner(d) == "n2" for d, _ in got)
