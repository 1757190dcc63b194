"""The indexer's side of the index pipeline over real TCP: two ``IndexService`` nodes behind
``RpcServer``s on loopback, driven by a test pipeline (projector -> router -> deliveries,
stabilise, publish; initial-build chunks) and checked with the oracle at every stability TS.
"""

from __future__ import annotations

import random
from collections.abc import AsyncIterator, Sequence
from pathlib import Path
from typing import Any, TypeVar

import pytest

from shardex.api.delivery import (
    Delivered,
    DeliverKeyVersions,
    LoadChunk,
    LoadChunkAck,
    LoadFinish,
    LoadFinished,
    PublishStability,
    Stabilised,
    StabiliseSlices,
    StabilityPublished,
)
from shardex.api.index import (
    AllocateSlices,
    DropSlices,
    ListSlices,
    SliceInfo,
    SliceList,
    SlicesAllocated,
    SlicesDropped,
)
from shardex.core.timestamp import Timestamp
from shardex.errors import ErrorCode, ShardexError
from shardex.index.oracle import check_index
from shardex.index.service import IndexService
from shardex.meta.index_definition import IndexDefinition
from shardex.net import ConnectionPool, RpcServer, TcpTransport
from shardex.net.messages import Message
from shardex.pipeline.project.projector import OP_DELETE, ChangeRow, project
from shardex.pipeline.project.router import IndexRoute, route
from shardex.scan.elastic_adapters_index import IndexScanMigrations
from shardex.testing.index import FakeKeyspace, random_workload, workload_definitions

SECRET = "s" * 32
KS = "ks"
NODES = ("n1", "n2")
M = TypeVar("M", bound=Message)


class Indexer:
    """One indexer node: an ``IndexService`` (real engine, I/O thread) behind an RpcServer."""

    def __init__(self, name: str, path: Path) -> None:
        self.name, self.path = name, path
        self.svc: IndexService | None = None
        self.server: RpcServer | None = None
        self.address = ""

    async def start(self) -> None:
        self.svc = IndexService(
            node_name=self.name,
            transport=TcpTransport(),
            secret=SECRET,
            path=self.path,
            reconcile_interval=3600,
            scan_migrations=IndexScanMigrations(self.name),
        )
        self.server = RpcServer(TcpTransport(), SECRET, name=self.name)
        self.svc.install(self.server)
        await self.svc.start()
        self.address = await self.server.start("127.0.0.1:0")

    async def stop(self) -> None:
        assert self.server is not None and self.svc is not None
        await self.server.stop()
        await self.svc.stop()

    @property
    def service(self) -> IndexService:
        assert self.svc is not None
        return self.svc

    @property
    def engine(self) -> Any:
        return self.service.engine


class Pipe:
    """The pipeline's side: placement, projection and routing, the RPCs."""

    def __init__(self, nodes: dict[str, Indexer], defs: Sequence[IndexDefinition]) -> None:
        self.nodes = nodes
        self.defs = list(defs)
        self.ids = [d.id for d in defs]
        self.placement = {
            d.id: {p: NODES[p % len(NODES)] for p in range(d.num_partition)} for d in defs
        }
        self.routes = {d.id: IndexRoute.of(d, self.placement[d.id]) for d in defs}
        self.pool = ConnectionPool(TcpTransport(), SECRET, name="pipe")
        self.batch = 0
        self.docs_sent: dict[tuple[str, int], int] = {}  # by ``load``

    async def ask(self, node: str, msg: Message, expect: type[M]) -> M:
        return await self.pool.request(self.nodes[node].address, msg, 10, expect=expect)

    async def allocate(self) -> None:
        for d in self.defs:
            for node in NODES:
                mine = [p for p, n in self.placement[d.id].items() if n == node]
                if mine:
                    msg = AllocateSlices(definition=d, partitions=mine)
                    await self.ask(node, msg, SlicesAllocated)

    def by_node(self, changes: Sequence[ChangeRow]) -> dict[str, list[Any]]:
        return route(project(self.defs, changes).rows, self.routes).by_node

    async def deliver(self, changes: Sequence[ChangeRow]) -> dict[str, Delivered]:
        self.batch += 1
        out = {}
        for node, rows in self.by_node(changes).items():
            msg = DeliverKeyVersions(keyspace=KS, batch_id=self.batch, rows=rows)
            out[node] = await self.ask(node, msg, Delivered)
        return out

    async def stabilise(
        self, ts: Timestamp, incarnations: dict[str, str] | None = None
    ) -> dict[str, Stabilised]:
        out = {}
        for node in NODES:
            msg = StabiliseSlices(
                keyspace=KS,
                ts=dict(ts.to_wire()),
                index_ids=self.ids,
                incarnation=(incarnations or {}).get(node, ""),
            )
            out[node] = await self.ask(node, msg, Stabilised)
        return out

    async def publish(self, ts: Timestamp, ids: Sequence[str] | None = None) -> None:
        wire = dict(ts.to_wire())
        msg = PublishStability(keyspace=KS, stability={i: wire for i in ids or self.ids})
        for node in NODES:
            assert (await self.ask(node, msg, StabilityPublished)).node == node

    async def list(self, node: str, index_id: str | None = None) -> list[SliceInfo]:
        return (await self.ask(node, ListSlices(index_id=index_id), SliceList)).slices

    def check(self, ts: Timestamp, documents: dict[str, Any]) -> None:
        """The oracle for every index at the snapshots ``ts`` of all its slices."""
        for d in self.defs:
            entries: dict[int, list[bytes]] = {}
            for node in NODES:
                for p, e in self.nodes[node].engine.entries(d.id, ts).items():
                    assert p not in entries
                    entries[p] = e
            assert sorted(entries) == list(range(d.num_partition))
            check_index(d, entries, documents, context=repr(ts))


@pytest.fixture
async def pipe(tmp_path: Path) -> AsyncIterator[Pipe]:
    nodes = {n: Indexer(n, tmp_path / n / "index") for n in NODES}
    for node in nodes.values():
        await node.start()
    p = Pipe(nodes, workload_definitions(KS))
    await p.allocate()
    try:
        yield p
    finally:
        await p.pool.close()
        for node in nodes.values():
            if node.svc is not None and node.svc.host.is_open:
                await node.stop()


def snapshot_changes(ks: FakeKeyspace, ts0: Timestamp) -> list[ChangeRow]:
    """What an initial build reads at ``ts0``: each live document's last version."""
    last: dict[str, ChangeRow] = {}
    for p in range(ks.num_partitions):
        for seqno, docid, op, body in ks.log.get(p, ()):
            if seqno > ts0.seqno(p):
                break
            last[docid] = (docid, p, seqno, op, body)
    return [c for c in last.values() if c[3] != OP_DELETE]


def incarnations(pipe: Pipe) -> dict[str, str]:
    return {n: pipe.nodes[n].service.incarnation for n in NODES}


# --- maintenance stream ----------------------------------------------------------------------


async def test_deliver_stabilise_publish_round_trips_match_the_oracle(pipe: Pipe) -> None:
    rng = random.Random(5)
    ks = FakeKeyspace(num_partitions=8)
    delivered: Timestamp | None = None
    for round_no in range(5):
        random_workload(ks, rng, rng.randint(20, 60))
        ts = ks.ts()
        changes = ks.changes(delivered, ts)
        sent = pipe.by_node(changes)
        replies = await pipe.deliver(changes)
        for node, reply in replies.items():
            assert reply.node == node
            assert reply.incarnation == pipe.nodes[node].service.incarnation
            assert reply.accepted == len(sent[node]) and reply.unknown == 0
        stab = await pipe.stabilise(ts, incarnations(pipe))
        for node, reply in stab.items():
            hosted = {i for i, pl in pipe.placement.items() if node in pl.values()}
            assert sorted(reply.missing) == sorted(set(pipe.ids) - hosted)
            assert {(a.index_id, a.partition) for a in reply.acks} == {
                (i, p) for i, pl in pipe.placement.items() for p, n in pl.items() if n == node
            }
            assert all(a.state == "active" and a.applied == ts.to_wire() for a in reply.acks)
        await pipe.publish(ts)
        pipe.check(ts, ks.documents_at(ts))
        delivered = ts
        # The same batch again (an at-least-once re-run): dropped, and nothing changes.
        before = {n: pipe.nodes[n].engine.entries("w_name") for n in NODES}
        again = await pipe.deliver(changes)
        assert all(r.accepted == 0 and r.dropped == len(sent[n]) for n, r in again.items())
        await pipe.stabilise(ts)
        assert {n: pipe.nodes[n].engine.entries("w_name") for n in NODES} == before
        pipe.check(ts, ks.documents_at(ts))

        listed = [s for n in NODES for s in await pipe.list(n)]
        assert len(listed) == sum(d.num_partition for d in pipe.defs), round_no
        for s in listed:
            assert s.applied == ts.to_wire() and s.stability == ts.to_wire()
            assert s.queued == 0 and s.load_rows == 0 and s.state == "active"
        # items_count over the slices of an index is the size of the index
        by_index: dict[str, int] = {}
        for s in listed:
            by_index[s.index_id] = by_index.get(s.index_id, 0) + s.items_count
        for d in pipe.defs:
            total = sum(len(e) for n in NODES for e in pipe.nodes[n].engine.entries(d.id).values())
            assert by_index[d.id] == total


async def test_list_slices_filters_by_index_and_shows_the_queue(pipe: Pipe) -> None:
    ks = FakeKeyspace(num_partitions=8)
    random_workload(ks, random.Random(1), 40)
    ts = ks.ts()
    sent = pipe.by_node(ks.changes(None, ts))
    await pipe.deliver(ks.changes(None, ts))
    only = await pipe.list("n1", "w_city")
    assert [(s.index_id, s.partition) for s in only] == [("w_city", 0)]
    listed = await pipe.list("n1")
    assert sum(s.queued for s in listed) == len(sent["n1"])
    assert all(s.state == "created" and s.applied == {} and s.stability is None for s in listed)


async def test_stabilise_after_a_restart_is_refused_then_redelivery_recovers(
    pipe: Pipe,
) -> None:
    rng = random.Random(9)
    ks = FakeKeyspace(num_partitions=8)
    random_workload(ks, rng, 50)
    ts1 = ks.ts()
    await pipe.deliver(ks.changes(None, ts1))
    await pipe.stabilise(ts1, incarnations(pipe))
    random_workload(ks, rng, 50)
    ts2 = ks.ts()
    await pipe.deliver(ks.changes(ts1, ts2))
    old = incarnations(pipe)

    n1 = pipe.nodes["n1"]
    await n1.stop()  # the queue filled by the delivery dies with the process
    await n1.start()
    new = n1.service.incarnation
    assert new != old["n1"]
    with pytest.raises(ShardexError) as err:
        await pipe.ask(
            "n1",
            StabiliseSlices(
                keyspace=KS, ts=dict(ts2.to_wire()), index_ids=pipe.ids, incarnation=old["n1"]
            ),
            Stabilised,
        )
    assert err.value.code == ErrorCode.STALE_DELIVERY
    assert err.value.details["expected"] == old["n1"]
    assert err.value.details["incarnation"] == new
    assert old["n1"] in err.value.message and new in err.value.message and "n1" in err.value.message
    listed = await pipe.list("n1")
    assert all(s.queued == 0 and s.applied == ts1.to_wire() for s in listed)  # durable

    # The pipeline re-delivers from the applied TS to the new incarnation: exact again.
    replies = await pipe.deliver(ks.changes(ts1, ts2))
    assert replies["n1"].incarnation == new
    await pipe.stabilise(ts2, {n: r.incarnation for n, r in replies.items()})
    pipe.check(ts2, ks.documents_at(ts2))


async def test_dropped_indexes_are_unknown_and_missing_and_keyspaces_are_checked(
    pipe: Pipe,
) -> None:
    ks = FakeKeyspace(num_partitions=8)
    random_workload(ks, random.Random(3), 40)
    ts = ks.ts()
    sent = pipe.by_node(ks.changes(None, ts))
    on_n1 = sum(1 for r in sent["n1"] if r[0] == "w_city")
    assert on_n1 > 0
    dropped = await pipe.ask("n1", DropSlices(index_id="w_city"), SlicesDropped)
    assert dropped.dropped == 1
    replies = await pipe.deliver(ks.changes(None, ts))
    assert replies["n1"].unknown == on_n1
    assert replies["n1"].accepted == len(sent["n1"]) - on_n1
    stab = await pipe.stabilise(ts)
    assert "w_city" in stab["n1"].missing
    assert all(a.index_id != "w_city" for a in stab["n1"].acks)
    await pipe.publish(ts)
    assert all(s.stability == ts.to_wire() for s in await pipe.list("n1"))
    assert "w_city" not in pipe.nodes["n1"].service.delivery.published

    # Rows or a stabilise for an index of another keyspace: not this keyspace's slices.
    msg = DeliverKeyVersions(keyspace="other", batch_id=99, rows=sent["n2"])
    other = await pipe.ask("n2", msg, Delivered)
    assert other.unknown == len(sent["n2"]) and other.accepted == 0
    with pytest.raises(ShardexError) as err:
        bad = StabiliseSlices(keyspace="other", ts=dict(ts.to_wire()), index_ids=["w_name"])
        await pipe.ask("n2", bad, Stabilised)
    assert err.value.code == ErrorCode.BAD_REQUEST


async def test_published_stability_is_monotonic(pipe: Pipe) -> None:
    ks = FakeKeyspace(num_partitions=8)
    rng = random.Random(4)
    random_workload(ks, rng, 30)
    ts1 = ks.ts()
    random_workload(ks, rng, 30)
    ts2 = ks.ts()
    for ts in (ts1, ts2):
        await pipe.deliver(ks.changes(None, ts))
        await pipe.stabilise(ts)
    await pipe.publish(ts2, ["w_name"])
    await pipe.publish(ts1, ["w_name"])  # older: ignored
    stab = {s.partition: s.stability for s in await pipe.list("n1", "w_name")}
    assert stab and all(v == ts2.to_wire() for v in stab.values())
    assert all(s.stability is None for s in await pipe.list("n1", "w_age"))
    # A TS on a new history branch (after a rollback) replaces it.
    branch = Timestamp({p: (e.seqno, e.uuid + 1) for p, e in ts1.items()})
    await pipe.publish(branch, ["w_name"])
    assert all(s.stability == branch.to_wire() for s in await pipe.list("n1", "w_name"))


# --- initial builds ----------------------------------------------------------------------------


def load_rows(pipe: Pipe, ks: FakeKeyspace, ts0: Timestamp) -> dict[tuple[str, int], list]:
    out: dict[tuple[str, int], list] = {}
    for rows in pipe.by_node(snapshot_changes(ks, ts0)).values():
        for r in rows:
            out.setdefault((r[0], r[1]), []).append(r)
    return out


async def load(
    pipe: Pipe,
    ts0: Timestamp,
    rows: dict[tuple[str, int], list],
    rng: random.Random,
    *,
    finish: bool = True,
) -> dict[tuple[str, int], int]:
    """Open every slice's load with an empty chunk (so the maintenance stream's stabilise
    skips it), send its rows in random chunks, some twice (task retries), then finish."""
    held: dict[tuple[str, int], int] = {}
    pipe.docs_sent = {}
    wire = dict(ts0.to_wire())
    for d in pipe.defs:
        for p, node in pipe.placement[d.id].items():
            msg = LoadChunk(index_id=d.id, partition=p, ts0=wire, rows=[])
            held[(d.id, p)] = (await pipe.ask(node, msg, LoadChunkAck)).rows
    for (index_id, p), slice_rows in sorted(rows.items()):
        node = pipe.placement[index_id][p]
        i = 0
        while i < len(slice_rows):
            n = rng.randint(1, 25)
            chunk = slice_rows[i : i + n]
            msg = LoadChunk(index_id=index_id, partition=p, ts0=wire, rows=chunk, docs=len(chunk))
            for _ in range(2 if rng.random() < 0.4 else 1):
                ack = await pipe.ask(node, msg, LoadChunkAck)
                key = (index_id, p)
                pipe.docs_sent[key] = pipe.docs_sent.get(key, 0) + len(chunk)
                assert ack.incarnation == pipe.nodes[node].service.incarnation
            held[(index_id, p)] = ack.rows
            i += n
    if finish:
        for d in pipe.defs:
            for p, node in pipe.placement[d.id].items():
                inc = pipe.nodes[node].service.incarnation
                msg = LoadFinish(index_id=d.id, partition=p, ts0=wire, incarnation=inc)
                done = await pipe.ask(node, msg, LoadFinished)
                assert (done.index_id, done.partition, done.node) == (d.id, p, node)
    return held


async def test_initial_build_by_chunks_then_maintenance(pipe: Pipe) -> None:
    rng = random.Random(11)
    ks = FakeKeyspace(num_partitions=8)
    random_workload(ks, rng, 150)
    ts0 = ks.ts()
    rows = load_rows(pipe, ks, ts0)
    upserts = {k: {r[4] for r in v if r[2] == 0} for k, v in rows.items()}
    held = await load(pipe, ts0, rows, rng, finish=False)
    # duplicates (chunks sent twice, UpsertDeletions of other slices) collapse per docid
    assert held == {k: len(upserts.get(k, ())) for k in held}
    assert any(len(v) > 1 for v in upserts.values())
    listed = {(s.index_id, s.partition): s for n in NODES for s in await pipe.list(n)}
    assert len(listed) == sum(d.num_partition for d in pipe.defs)
    for k, s in listed.items():
        assert s.state == "loading" and s.load_rows == len(upserts.get(k, ()))
        assert s.load_docs == pipe.docs_sent.get(k, 0)  # repeated chunks count again

    # Maintenance while loading: rows <= T0 dropped, later ones queued; no stabilise yet.
    random_workload(ks, rng, 60)
    ts1 = ks.ts()
    replies = await pipe.deliver(ks.changes(None, ts1))
    sent = pipe.by_node(ks.changes(None, ts1))
    for n, reply in replies.items():
        below = sum(1 for r in sent[n] if r[6] <= ts0.seqno(r[5]))
        assert 0 < below < len(sent[n])
        assert (reply.dropped, reply.accepted) == (below, len(sent[n]) - below)
    stab = await pipe.stabilise(ts1)
    acks = [a for r in stab.values() for a in r.acks]
    assert len(acks) == len(listed)
    assert all(a.state == "loading" and a.applied == {} for a in acks)  # not stabilised

    # Finish: the oracle at T0, then the queued maintenance applies up to T1.
    for d in pipe.defs:
        for p, node in pipe.placement[d.id].items():
            done = await pipe.ask(
                node,
                LoadFinish(index_id=d.id, partition=p, ts0=dict(ts0.to_wire())),
                LoadFinished,
            )
            if (d.id, p) not in rows:
                assert done.items_count == 0
    pipe.check(ts0, ks.documents_at(ts0))
    stab = await pipe.stabilise(ts1)
    assert all(a.state == "active" for r in stab.values() for a in r.acks)
    pipe.check(ts1, ks.documents_at(ts1))
    after = [s for n in NODES for s in await pipe.list(n)]
    assert all(s.load_rows == 0 and s.load_docs == 0 for s in after)


async def test_load_finish_is_idempotent_and_an_empty_load_is_empty(pipe: Pipe) -> None:
    ks = FakeKeyspace(num_partitions=8)
    rng = random.Random(12)
    random_workload(ks, rng, 80)
    ts0 = ks.ts()
    wire = dict(ts0.to_wire())
    rows = load_rows(pipe, ks, ts0)
    await load(pipe, ts0, rows, rng)
    pipe.check(ts0, ks.documents_at(ts0))
    counts = {(s.index_id, s.partition): s.items_count for n in NODES for s in await pipe.list(n)}
    # Retried finishes and a late chunk of the same load: nothing changes.
    for (index_id, p), count in counts.items():
        node = pipe.placement[index_id][p]
        again = await pipe.ask(
            node, LoadFinish(index_id=index_id, partition=p, ts0=wire), LoadFinished
        )
        assert again.items_count == count
        late = LoadChunk(index_id=index_id, partition=p, ts0=wire, rows=rows.get((index_id, p), []))
        assert (await pipe.ask(node, late, LoadChunkAck)).rows == count
    pipe.check(ts0, ks.documents_at(ts0))

    # A load at another T0 into an active slice is refused, with a hint.
    random_workload(ks, rng, 10)
    newer = dict(ks.ts().to_wire())
    with pytest.raises(ShardexError) as err:
        await pipe.ask(
            "n1", LoadChunk(index_id="w_city", partition=0, ts0=newer, rows=[]), LoadChunkAck
        )
    assert err.value.code == ErrorCode.BAD_REQUEST
    assert "active" in err.value.message and err.value.details["hint"]

    # An index never sent a chunk: LoadFinish alone makes an empty, active slice.
    fresh = ks.ts()
    drop = await pipe.ask("n2", DropSlices(index_id="w_age"), SlicesDropped)
    assert drop.dropped > 0
    await pipe.ask("n2", AllocateSlices(definition=pipe.defs[1], partitions=[1]), SlicesAllocated)
    done = await pipe.ask(
        "n2", LoadFinish(index_id="w_age", partition=1, ts0=dict(fresh.to_wire())), LoadFinished
    )
    assert done.items_count == 0
    (info,) = await pipe.list("n2", "w_age")
    assert info.state == "active" and info.applied == fresh.to_wire() and info.items_count == 0
    assert pipe.nodes["n2"].engine.entries("w_age", fresh) == {1: []}


async def test_a_restarted_build_replaces_the_session_and_stale_loads_are_refused(
    pipe: Pipe,
) -> None:
    rng = random.Random(13)
    ks = FakeKeyspace(num_partitions=8)
    random_workload(ks, rng, 80)
    ts_a = ks.ts()
    await load(pipe, ts_a, load_rows(pipe, ks, ts_a), rng, finish=False)
    random_workload(ks, rng, 40)
    ts_b = ks.ts()
    rows_b = load_rows(pipe, ks, ts_b)
    key = ("w_name", 1)  # on n2
    first = rows_b[key][:3]
    msg = LoadChunk(index_id=key[0], partition=key[1], ts0=dict(ts_b.to_wire()), rows=first)
    ack = await pipe.ask("n2", msg, LoadChunkAck)
    assert ack.rows == len({r[4] for r in first if r[2] == 0})  # the session at A is gone
    # A straggler of the abandoned build at A: refused, the session at B is kept.
    stale = LoadChunk(index_id=key[0], partition=key[1], ts0=dict(ts_a.to_wire()), rows=[])
    with pytest.raises(ShardexError) as err:
        await pipe.ask("n2", stale, LoadChunkAck)
    assert err.value.code == ErrorCode.BAD_REQUEST and "older" in err.value.message
    (info,) = [s for s in await pipe.list("n2", "w_name") if s.partition == 1]
    assert info.load_rows == ack.rows

    await load(pipe, ts_b, rows_b, rng)
    pipe.check(ts_b, ks.documents_at(ts_b))


async def test_a_load_interrupted_by_a_restart_is_refused_then_rebuilt(pipe: Pipe) -> None:
    rng = random.Random(14)
    ks = FakeKeyspace(num_partitions=8)
    random_workload(ks, rng, 80)
    ts0 = ks.ts()
    rows = load_rows(pipe, ks, ts0)
    await load(pipe, ts0, rows, rng, finish=False)
    old = incarnations(pipe)
    n2 = pipe.nodes["n2"]
    await n2.stop()
    await n2.start()
    states = {(s.index_id, s.partition): s.state for s in await pipe.list("n2")}
    assert states and set(states.values()) == {"needs_rebuild"}  # torn loads
    key = next(k for k in rows if pipe.placement[k[0]][k[1]] == "n2")
    finish = LoadFinish(
        index_id=key[0], partition=key[1], ts0=dict(ts0.to_wire()), incarnation=old["n2"]
    )
    with pytest.raises(ShardexError) as err:
        await pipe.ask("n2", finish, LoadFinished)
    assert err.value.code == ErrorCode.STALE_DELIVERY
    # The pipeline restarts the build (same T0 is fine: nothing was written meanwhile).
    await load(pipe, ts0, rows, rng)
    pipe.check(ts0, ks.documents_at(ts0))


async def test_every_start_is_a_new_incarnation(tmp_path: Path) -> None:
    svc = IndexService(
        node_name="n",
        transport=TcpTransport(),
        secret=SECRET,
        path=tmp_path,
        inline_io=True,
        scan_migrations=IndexScanMigrations("n"),
    )
    seen = set()
    for _ in range(2):
        await svc.start()
        seen.add(svc.incarnation)
        assert len(svc.incarnation) == 32
        await svc.stop()
    assert len(seen) == 2
