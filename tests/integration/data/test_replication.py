"""Replica copies on real TCP between three in-process data services: the active feeds its
replicas from its change log, durable writes wait for a majority, reads never see a durable
write before it is durable, a down replica makes majority writes impossible (not silently
weaker), and a promoted replica continues the history on a new branch with every
majority-acknowledged write."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import AsyncIterator
from pathlib import Path

import msgspec
import pytest

import shardex.data.replication as replication
from shardex.api.data import (
    Get,
    GetMany,
    GetReply,
    MutateMany,
    MutateManyReply,
    MutationReply,
    OpItem,
)
from shardex.api.data import Upsert as UpsertMsg
from shardex.api.records import STATE_ACTIVE, STATE_REPLICA
from shardex.core.timestamp import Timestamp
from shardex.core.topology import Topology
from shardex.data.replica import ReplicaOps
from shardex.data.service import DataService
from shardex.errors import ErrorCode, ShardexError
from shardex.meta.member_list import MemberInfo
from shardex.meta.partitioning import partition_of
from shardex.meta.state import KeyspaceMeta, StateContext
from shardex.net import ConnectionPool, RpcServer, TcpTransport
from shardex.scan.at_plus import on_current_branches
from shardex.scan.cluster_view import ClusterView

SECRET = "s" * 32
KS = "ks"
PARTS = 4
NODES = ("n1", "n2", "n3")


def chains_state(num_replicas: int, cas: int = 1) -> StateContext:
    """Partition p: active on NODES[p % 3], replicas on the next ``num_replicas`` nodes."""
    assignment = {p: NODES[p % 3] for p in range(PARTS)}
    replicas = {p: [NODES[(p + k) % 3] for k in range(1, num_replicas + 1)] for p in range(PARTS)}
    meta = KeyspaceMeta(
        name=KS, num_partitions=PARTS, uuid="u1", created_cas=1, num_replicas=num_replicas
    )
    topo = Topology(seq_num=1, assignment=assignment, replicas=replicas)
    return StateContext(cas=cas, keyspaces={KS: meta}, data_topologies={KS: [topo]})


class Coordinator:
    def __init__(self, state: StateContext) -> None:
        self.state = state

    def on_change(self, cb: object) -> None:
        pass


class Cluster:
    def __init__(self, coord: Coordinator) -> None:
        self.coord = coord
        self.services: dict[str, DataService] = {}
        self.servers: dict[str, RpcServer] = {}
        self.addresses: dict[str, str] = {}
        self.pool = ConnectionPool(TcpTransport(), SECRET, name="test")

    def members(self) -> list[MemberInfo]:
        return [
            MemberInfo(member_id=n, name=n, address=a, services=("data",))
            for n, a in self.addresses.items()
        ]

    async def publish(self, state: StateContext) -> None:
        self.coord.state = state
        for ds in self.services.values():
            await ds.reconcile()

    async def upsert(self, docid: str, doc: dict, durability: str) -> MutationReply:
        p = partition_of(docid, PARTS)
        topo = self.coord.state.data_topologies[KS][-1]
        msg = UpsertMsg(
            keyspace=KS, docid=docid, doc=msgspec.json.encode(doc), durability=durability
        )
        return await self.pool.request(
            self.addresses[topo.assignment[p]], msg, 10.0, expect=MutationReply
        )

    async def replica_get(self, node: str, docid: str) -> dict | None:
        try:
            reply = await self.pool.request(
                self.addresses[node],
                Get(keyspace=KS, docid=docid, replica=True),
                5.0,
                expect=GetReply,
            )
        except ShardexError as exc:
            if exc.code is ErrorCode.DOC_NOT_FOUND:
                return None
            raise
        return msgspec.json.decode(reply.body)

    async def start_node(self, name: str, data_dir: Path) -> DataService:
        """A data service on ``data_dir`` (a new node, or one restarted on its old data)
        serving on a fresh loopback port, registered under ``name``."""
        ds = DataService(
            data_dir=data_dir,
            node_name=name,
            transport=TcpTransport(),
            secret=SECRET,
            coordinator=lambda: self.coord,
            members=self.members,
            reconcile_interval=3600,
        )
        await ds.start()
        self.services[name] = ds
        server = RpcServer(TcpTransport(), SECRET, name=name)
        ds.install(server)
        self.addresses[name] = await server.start("127.0.0.1:0")
        self.servers[name] = server
        return ds

    async def stop_node(self, node: str) -> None:
        await self.servers.pop(node).stop()
        await self.services.pop(node).stop()


@pytest.fixture
async def cluster(tmp_path: Path) -> AsyncIterator[Cluster]:
    c = Cluster(Coordinator(chains_state(1)))
    try:
        for name in NODES:
            await c.start_node(name, tmp_path / name)
        for ds in c.services.values():
            await ds.reconcile()
        senders = [s for ds in c.services.values() for s in ds.replication.senders.values()]
        for s in senders:
            s.wake()
        await _until(
            lambda: _true_async(all(s.healthy and s.rounds > 0 for s in senders)),
            "every sender has reached its replica",
        )
        yield c
    finally:
        await c.pool.close()
        for server in c.servers.values():
            await server.stop()
        for ds in c.services.values():
            await ds.stop()


def docid_in(partition: int, n: int = 0) -> str:
    found = [d for d in (f"doc-{i}" for i in range(10_000)) if partition_of(d, PARTS) == partition]
    return found[n]


async def fail_over_n1(cluster: Cluster) -> StateContext:
    """Publish n1 failed over (state cas 2): its actives (partitions 0 and 3) promoted on n2,
    n1 out of every chain; its data topologies are [before, after]. Returns that state."""
    state = cluster.coord.state
    topo = state.data_topologies[KS][-1]
    failed = Topology(
        seq_num=2,
        assignment={**topo.assignment, 0: "n2", 3: "n2"},
        replicas={p: [n for n in r if n not in ("n1", "n2")] for p, r in topo.replicas.items()},
    )
    failed_state = msgspec.structs.replace(
        state, cas=2, data_topologies={KS: [topo, failed]}, failed_over={"n1": 2}
    )
    await cluster.publish(failed_state)
    return failed_state


async def test_majority_write_is_on_the_replica_when_acknowledged(cluster: Cluster) -> None:
    for p in range(PARTS):
        d = docid_in(p)
        reply = await cluster.upsert(d, {"p": p}, "majority")
        replica = NODES[(p + 1) % 3]
        # acknowledged at majority: the replica holds it already, same seqno and branch
        assert await cluster.replica_get(replica, d) == {"p": p}
        info = cluster.services[replica].engine.partition_info(KS, p)
        assert info.state == STATE_REPLICA
        assert (info.high_seqno, info.uuid) == (reply.result.seqno, reply.result.uuid)


async def test_persist_majority_waits_for_the_replica_fsync(cluster: Cluster) -> None:
    d = docid_in(0)
    reply = await cluster.upsert(d, {"v": 1}, "persist_majority")
    part = cluster.services["n2"].engine.replicas._local.parts[(KS, 0)]
    assert part.persisted_seqno >= reply.result.seqno


async def test_replicas_catch_up_on_writes_at_durability_none(cluster: Cluster) -> None:
    docs = [docid_in(1, i) for i in range(30)]
    for i, d in enumerate(docs):
        await cluster.upsert(d, {"i": i}, "none")
    active = cluster.services["n2"].engine.partition_info(KS, 1)

    async def level() -> bool:
        return cluster.services["n3"].engine.partition_info(KS, 1).high_seqno == active.high_seqno

    await _until(level, "the replica of partition 1 catches up")
    assert [await cluster.replica_get("n3", d) for d in docs] == [{"i": i} for i in range(30)]


async def test_a_commit_no_wake_named_still_reaches_its_replica(cluster: Cluster) -> None:
    """A round looks at the partitions named since the last one; a commit that named none
    (written straight into the engine here) is found by the look at every partition that a
    sender takes at least every probe interval, even while writes to another partition keep
    it busy (n1 feeds n2 partitions 0 and 3)."""
    active = cluster.services["n1"]
    active.engine.upsert(KS, docid_in(0, 0), {"unnamed": True}, durability="none")
    high = active.engine.partition_info(KS, 0).high_seqno

    async def busy_elsewhere() -> None:  # never idle: no idle probe would look
        i = 0
        while True:
            await cluster.upsert(docid_in(3, i % 5), {"i": i}, "majority")
            i += 1

    async def replicated() -> bool:
        return cluster.services["n2"].engine.partition_info(KS, 0).high_seqno == high

    writer = asyncio.ensure_future(busy_elsewhere())
    try:
        await _until(replicated, "the unnamed commit reaches the replica of partition 0")
        assert not writer.done()  # it was busy all along
    finally:
        writer.cancel()
        await asyncio.gather(writer, return_exceptions=True)
    assert await cluster.replica_get("n2", docid_in(0, 0)) == {"unnamed": True}


async def test_mutate_many_at_majority(cluster: Cluster) -> None:
    docs = [docid_in(2, i) for i in range(10)]
    ops = [OpItem("upsert", d, msgspec.json.encode({"i": i}), None) for i, d in enumerate(docs)]
    reply = await cluster.pool.request(
        cluster.addresses["n3"],
        MutateMany(keyspace=KS, ops=ops, durability="majority"),
        10.0,
        expect=MutateManyReply,
    )
    assert reply.errors == []
    assert [await cluster.replica_get("n1", d) for d in docs] == [{"i": i} for i in range(10)]


async def test_a_down_replica_makes_majority_writes_impossible_not_weaker(
    cluster: Cluster,
) -> None:
    d = docid_in(0)  # active n1, replica n2
    await cluster.upsert(d, {"v": 1}, "majority")
    await cluster.stop_node("n2")
    sender = cluster.services["n1"].replication.senders[(KS, "n2")]
    sender.wake()
    await _until(lambda: _false_async(sender.healthy), "the sender notices n2 is gone")
    with pytest.raises(ShardexError) as err:
        await cluster.upsert(d, {"v": 2}, "majority")
    assert err.value.code is ErrorCode.DURABILITY_IMPOSSIBLE
    assert err.value.details["reachable"] == 1 and err.value.details["majority"] == 2
    # nothing was written: the document still has its durable value
    assert await cluster.replica_get("n1", d) == {"v": 1}
    await cluster.upsert(d, {"v": 3}, "persist_active")  # a level that needs no replica


async def test_a_timed_out_durable_write_is_ambiguous_and_reads_wait(
    cluster: Cluster, monkeypatch: pytest.MonkeyPatch
) -> None:
    # every apply in the I/O pool, where the stall below blocks a thread, not the loop
    monkeypatch.setattr(replication, "INLINE_APPLY", -1)
    d = docid_in(0)
    await cluster.upsert(d, {"v": 1}, "majority")
    n1, n2 = cluster.services["n1"], cluster.services["n2"]
    n1.replication.waits.timeout = 0.5
    gate = threading.Event()
    real = n2.engine.replicas.apply_runs

    def stalled(*args, **kwargs):  # the replica holds its answer back (in its I/O thread)
        gate.wait(10)
        return real(*args, **kwargs)

    n2.engine.replicas.apply_runs = stalled  # type: ignore[method-assign]
    write = asyncio.create_task(cluster.upsert(d, {"v": 2}, "majority"))
    await _until(lambda: _true_async(n1.replication.waits.pending((KS, 0), d)), "write pending")
    # a read of the document on the active waits for the pending durable write
    read = asyncio.create_task(
        cluster.pool.request(
            cluster.addresses["n1"], Get(keyspace=KS, docid=d), 5.0, expect=GetReply
        )
    )
    with pytest.raises(ShardexError) as err:
        await write
    assert err.value.code is ErrorCode.DURABILITY_AMBIGUOUS
    gate.set()
    got = await read
    assert msgspec.json.decode(got.body) == {"v": 2}  # it did reach the active


async def test_a_get_many_waits_for_a_pending_durable_write_as_a_get_does(
    cluster: Cluster, monkeypatch: pytest.MonkeyPatch
) -> None:
    """SQL's fetches (``GetMany``, in-process or from another node) never read a document
    while its durable write waits: the read ends only once the write is no longer pending."""
    monkeypatch.setattr(replication, "INLINE_APPLY", -1)  # applies in the pool, as above
    d, other = docid_in(0, 0), docid_in(0, 1)
    await cluster.upsert(d, {"v": 1}, "majority")
    await cluster.upsert(other, {"v": 1}, "majority")
    n1, n2 = cluster.services["n1"], cluster.services["n2"]
    n1.replication.waits.timeout = 0.5
    gate = threading.Event()
    real = n2.engine.replicas.apply_runs

    def stalled(*args, **kwargs):
        gate.wait(10)
        return real(*args, **kwargs)

    n2.engine.replicas.apply_runs = stalled  # type: ignore[method-assign]
    write = asyncio.create_task(cluster.upsert(d, {"v": 2}, "majority"))
    await _until(lambda: _true_async(n1.replication.waits.pending((KS, 0), d)), "write pending")
    msg = GetMany(keyspace=KS, docids=[other, d])
    assert n1.reads.get_many_now(msg) is None  # not answered at once: there is a wait
    pending_when_read: list[bool] = []
    read = asyncio.create_task(n1.reads.get_many_local(msg))
    read.add_done_callback(
        lambda _: pending_when_read.append(n1.replication.waits.pending((KS, 0), d))
    )
    with pytest.raises(ShardexError) as err:
        await write
    assert err.value.code is ErrorCode.DURABILITY_AMBIGUOUS
    gate.set()
    got = await read
    assert pending_when_read == [False]
    assert [msgspec.json.decode(b) for b in got.bodies if b is not None] == [{"v": 1}, {"v": 2}]


async def test_a_write_waits_its_own_durability_timeout(
    cluster: Cluster, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(replication, "INLINE_APPLY", -1)  # applies in the pool, as above
    d, e = docid_in(0, 0), docid_in(0, 1)
    await cluster.upsert(d, {"v": 1}, "majority")
    n1, n2 = cluster.services["n1"], cluster.services["n2"]
    n1.replication.waits.timeout = 60.0  # the node's default: not what these writes wait
    gate = threading.Event()
    real = n2.engine.replicas.apply_runs

    def stalled(*args, **kwargs):
        gate.wait(10)
        return real(*args, **kwargs)

    n2.engine.replicas.apply_runs = stalled  # type: ignore[method-assign]
    try:
        one = UpsertMsg(
            keyspace=KS, docid=d, doc=b'{"v":2}', durability="majority", durability_timeout=0.3
        )
        with pytest.raises(ShardexError) as err:
            await cluster.pool.request(cluster.addresses["n1"], one, 10.0, expect=MutationReply)
        assert err.value.code is ErrorCode.DURABILITY_AMBIGUOUS
        assert err.value.details["durability_timeout"] == 0.3
        many = MutateMany(
            keyspace=KS,
            ops=[OpItem("upsert", e, b"{}")],
            durability="majority",
            durability_timeout=0.3,
        )
        reply = await cluster.pool.request(
            cluster.addresses["n1"], many, 10.0, expect=MutateManyReply
        )
        assert reply.results == [None]
        (item,) = reply.errors
        assert item.error.code == ErrorCode.DURABILITY_AMBIGUOUS.value
        assert item.error.details["durability_timeout"] == 0.3
    finally:
        gate.set()
    # a timeout out of bounds is refused before anything is written
    bad = UpsertMsg(
        keyspace=KS, docid=d, doc=b'{"v":3}', durability="majority", durability_timeout=0.0
    )
    with pytest.raises(ShardexError) as err:
        await cluster.pool.request(cluster.addresses["n1"], bad, 10.0, expect=MutationReply)
    assert err.value.code is ErrorCode.BAD_REQUEST
    assert err.value.details["durability_timeout"] == "0.0"
    got = await cluster.pool.request(
        cluster.addresses["n1"], Get(keyspace=KS, docid=d), 10.0, expect=GetReply
    )
    assert msgspec.json.decode(got.body) == {"v": 2}


async def test_promotion_keeps_every_majority_write_on_a_new_branch(cluster: Cluster) -> None:
    docs = [docid_in(0, i) for i in range(20)]  # partition 0: active n1, replica n2
    acked = {}
    for i, d in enumerate(docs):
        acked[d] = (await cluster.upsert(d, {"i": i}, "majority")).result
    old = cluster.services["n1"].engine.partition_info(KS, 0)
    await cluster.stop_node("n1")
    state = cluster.coord.state
    topo = state.data_topologies[KS][-1]
    failed = Topology(
        seq_num=2,
        assignment={**topo.assignment, 0: "n2", 2: "n3"},
        replicas={p: [n for n in r if n != "n1"] for p, r in topo.replicas.items()} | {0: []},
    )
    await cluster.publish(
        msgspec.structs.replace(
            state,
            cas=2,
            data_topologies={KS: [topo, failed]},
            failed_over={"n1": 2},
        )
    )
    info = cluster.services["n2"].engine.partition_info(KS, 0)
    assert info.state == STATE_ACTIVE
    assert info.high_seqno == old.high_seqno  # nothing majority-acknowledged was lost
    assert info.uuid != old.uuid and info.failover_log[1].uuid == old.uuid
    assert info.failover_log[0].seqno == old.high_seqno  # the branch point
    for i, d in enumerate(docs):
        got = await cluster.pool.request(
            cluster.addresses["n2"], Get(keyspace=KS, docid=d), 5.0, expect=GetReply
        )
        assert msgspec.json.decode(got.body) == {"i": i}
        assert got.seqno == acked[d].seqno
    # the new active writes on its branch; a chain of one copy takes majority of 2: impossible
    with pytest.raises(ShardexError) as err:
        await cluster.upsert(docs[0], {"i": -1}, "majority")
    assert err.value.code is ErrorCode.DURABILITY_IMPOSSIBLE
    reply = await cluster.upsert(docs[0], {"i": -1}, "none")
    assert reply.result.uuid == info.uuid and reply.result.seqno == old.high_seqno + 1


async def _false_async(value: bool) -> bool:
    return not value


async def _true_async(value: bool) -> bool:
    return value


async def _until(check, what: str, timeout: float = 10.0) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while True:
        result = check()
        if asyncio.iscoroutine(result):
            result = await result
        if result:
            return
        if loop.time() > deadline:
            raise AssertionError(f"timed out waiting until {what}")
        await asyncio.sleep(0.02)


async def test_a_failed_over_node_serves_nothing_until_recovered(cluster: Cluster) -> None:
    docs = [docid_in(0, i) for i in range(5)]  # partition 0: active n1, replica n2
    for i, d in enumerate(docs):
        await cluster.upsert(d, {"i": i}, "majority")
    n1_dir = cluster.services["n1"].path.parent
    await cluster.stop_node("n1")
    # n1 wrote more while cut off (durability none): a tail nobody else has
    failed_state = await fail_over_n1(cluster)
    back = await cluster.start_node("n1", n1_dir)  # back on its old data
    await back.reconcile()
    address = cluster.addresses["n1"]
    # a client with the old topology still sends here: refused, not served stale
    with pytest.raises(ShardexError) as err:
        await cluster.pool.request(address, Get(keyspace=KS, docid=docs[0]), 5.0, expect=GetReply)
    assert err.value.code is ErrorCode.NODE_FAILED_OVER
    msg = UpsertMsg(keyspace=KS, docid=docs[0], doc=b'{"stale": 1}', durability="none")
    with pytest.raises(ShardexError) as err:
        await cluster.pool.request(address, msg, 5.0, expect=MutationReply)
    assert err.value.code is ErrorCode.NODE_FAILED_OVER
    assert back.engine.replicas.failed_over_mark() == 2
    # recovered (full): its stale active copies are dropped, and it serves again
    cluster.coord.state = msgspec.structs.replace(
        failed_state, cas=3, failed_over={}, recovering={"n1": "full"}
    )
    await back.reconcile()
    assert not back.failed_over
    assert back.engine.replicas.failed_over_mark() is None
    # its old actives are active elsewhere, its replica copy's chain lost it: all gone
    assert back.engine.local_partitions(KS) == []
    with pytest.raises(ShardexError) as err:  # serving again: it holds no copy
        await cluster.pool.request(address, Get(keyspace=KS, docid=docs[0]), 5.0, expect=GetReply)
    assert err.value.code is ErrorCode.NOT_MY_PARTITION


async def test_a_replica_behind_the_purge_is_rebuilt_from_a_snapshot(cluster: Cluster) -> None:
    docs = [docid_in(0, i) for i in range(40)]  # partition 0: active n1, replica n2
    for i, d in enumerate(docs[:10]):
        await cluster.upsert(d, {"i": i}, "majority")
    n2_dir = cluster.services["n2"].path.parent
    await cluster.stop_node("n2")
    n1 = cluster.services["n1"]
    for i, d in enumerate(docs[10:], start=10):
        await cluster.upsert(d, {"i": i}, "none")
    n1.engine.retention_seqnos = 5
    n1.engine.purge()  # the changes the stopped replica lacks are gone from the change log
    active = n1.engine.partition_info(KS, 0)
    assert active.purge_seqno > 10
    back = await cluster.start_node("n2", n2_dir)  # back on its old data
    await back.reconcile()
    n1.replication.senders[(KS, "n2")].wake()

    async def rebuilt() -> bool:
        try:
            info = back.engine.partition_info(KS, 0)
        except ShardexError:  # the old copy is dropped as the snapshot's is installed
            return False
        return info.state == STATE_REPLICA and info.high_seqno == active.high_seqno

    await _until(rebuilt, "the replica copy is rebuilt from the active's snapshot")
    info = back.engine.partition_info(KS, 0)
    assert (info.uuid, info.purge_seqno) == (active.uuid, active.purge_seqno)
    assert [await cluster.replica_get("n2", d) for d in docs] == [{"i": i} for i in range(40)]
    # and it is fed again from there: a majority write needs it (once the active has heard)
    await _until(
        lambda: _true_async(n1.replication.senders[(KS, "n2")].reachable(0)), "n2 acknowledges"
    )
    await cluster.upsert(docs[0], {"i": -1}, "majority")
    assert await cluster.replica_get("n2", docs[0]) == {"i": -1}


async def test_at_plus_tokens_follow_a_failover_or_fail_clearly(
    cluster: Cluster, monkeypatch: pytest.MonkeyPatch
) -> None:
    kept = (await cluster.upsert(docid_in(0, 0), {"v": "kept"}, "majority")).result
    n2 = cluster.services["n2"]
    # n2 stops taking runs (it answers where it stands): the next write never reaches it
    monkeypatch.setattr(
        n2.engine.replicas,
        "apply_runs",
        lambda keyspace, runs, sync: n2.engine.replicas.acks(keyspace, [r.partition for r in runs]),
    )
    lost = (await cluster.upsert(docid_in(0, 1), {"v": "lost"}, "none")).result
    assert lost.seqno == kept.seqno + 1
    await cluster.stop_node("n1")
    await fail_over_n1(cluster)
    now = cluster.services["n2"].engine.partition_info(KS, 0)
    assert now.high_seqno == kept.seqno and now.uuid != kept.uuid
    view = ClusterView(
        pool=cluster.pool, coordinator=lambda: cluster.coord, members=cluster.members
    )
    # a token of the old branch at or below its end: the same point on the new branch
    got = await on_current_branches(view, KS, Timestamp.from_wire({0: (kept.seqno, kept.uuid)}))
    assert got.to_wire() == {0: (kept.seqno, now.uuid)}
    # a token past it names a write the failover lost
    with pytest.raises(ShardexError) as err:
        await on_current_branches(view, KS, Timestamp.from_wire({0: (lost.seqno, lost.uuid)}))
    assert err.value.code is ErrorCode.ROLLBACK
    assert err.value.details["partition"] == 0
    assert err.value.details["rollback_seqno"] == kept.seqno


async def test_delta_recovery_rolls_a_diverged_copy_back_in_place(
    cluster: Cluster, monkeypatch: pytest.MonkeyPatch
) -> None:
    restarted: list[tuple[str, int]] = []
    real_restart = ReplicaOps.restart_empty

    def restart_empty(self: ReplicaOps, keyspace: str, partition: int) -> None:
        restarted.append((keyspace, partition))
        real_restart(self, keyspace, partition)

    monkeypatch.setattr(ReplicaOps, "restart_empty", restart_empty)
    docs = [docid_in(0, i) for i in range(12)]  # partition 0: active n1, replica n2
    for i, d in enumerate(docs[:10]):
        await cluster.upsert(d, {"i": i}, "majority")
    common = cluster.services["n1"].engine.partition_info(KS, 0).high_seqno
    n1_dir, n2_dir = (cluster.services[n].path.parent for n in ("n1", "n2"))
    await cluster.stop_node("n2")
    # n1 writes a tail n2 never receives: an update, an insert and a delete
    await cluster.upsert(docs[0], {"i": "lost"}, "none")
    await cluster.upsert(docs[10], {"i": "lost"}, "none")
    msg = OpItem(kind="delete", docid=docs[1])
    await cluster.pool.request(
        cluster.addresses["n1"],
        MutateMany(keyspace=KS, ops=[msg], durability="none"),
        5.0,
        expect=MutateManyReply,
    )
    assert cluster.services["n1"].engine.partition_info(KS, 0).high_seqno == common + 3
    await cluster.stop_node("n1")
    # n2 comes back and is promoted: n1's actives (0, 3) on n2, n1 out of every chain
    await cluster.start_node("n2", n2_dir)
    failed_state = await fail_over_n1(cluster)
    topo, failed = failed_state.data_topologies[KS]
    # the new branch changes documents of both kinds: one n1 also changed, one it did not
    await cluster.upsert(docs[0], {"i": "new"}, "none")
    await cluster.upsert(docs[2], {"i": "new"}, "none")
    # n1 returns on its old data, is recovered (delta) and put back in partition 0's chain
    back = await cluster.start_node("n1", n1_dir)
    restored = Topology(
        seq_num=3,
        assignment=failed.assignment,
        replicas={**failed.replicas, 0: ["n1"]},
    )
    await cluster.publish(
        msgspec.structs.replace(
            failed_state,
            cas=3,
            failed_over={},
            recovering={"n1": "delta"},
            data_topologies={KS: [topo, failed, restored]},
        )
    )
    active = cluster.services["n2"].engine.partition_info(KS, 0)

    def level() -> bool:
        mine = back.engine.partition_info(KS, 0)
        return mine.state == STATE_REPLICA and (mine.high_seqno, mine.uuid) == (
            active.high_seqno,
            active.uuid,
        )

    for s in cluster.services["n2"].replication.senders.values():
        s.wake()
    await _until(level, "n1's copy of partition 0 is level with n2's")
    assert restarted == []  # rolled back in place, not rebuilt
    expect = {d: {"i": i} for i, d in enumerate(docs[:10])} | {
        docs[0]: {"i": "new"},
        docs[2]: {"i": "new"},
    }
    for d in docs:  # none of n1's lost tail is there: docs[10] absent, docs[1] back
        assert await cluster.replica_get("n1", d) == expect.get(d), d
    assert back.engine.partition_info(KS, 0).failover_log == active.failover_log


async def test_a_node_recovered_before_it_heard_of_its_failover_settles_on_restart(
    cluster: Cluster,
) -> None:
    docs = [docid_in(0, i) for i in range(3)]  # partition 0: active n1, replica n2
    for i, d in enumerate(docs):
        await cluster.upsert(d, {"i": i}, "majority")
    n1_dir = cluster.services["n1"].path.parent
    await cluster.stop_node("n1")  # down before the failover: it never writes the mark
    failed_state = await fail_over_n1(cluster)
    # recovered (delta) while still down: the state no longer names it failed over
    cluster.coord.state = msgspec.structs.replace(
        failed_state, cas=3, failed_over={}, recovering={"n1": "delta"}
    )
    back = await cluster.start_node("n1", n1_dir)
    await back.reconcile()
    # its old actives are replica copies now, not active copies serving a stale branch
    states = {i.partition: i.state for i in back.engine.local_partitions(KS)}
    assert states[0] == STATE_REPLICA and states[3] == STATE_REPLICA
    assert not back.failed_over
    msg = UpsertMsg(keyspace=KS, docid=docs[0], doc=b'{"stale": 1}', durability="none")
    with pytest.raises(ShardexError) as err:
        await cluster.pool.request(cluster.addresses["n1"], msg, 5.0, expect=MutationReply)
    assert err.value.code is ErrorCode.NOT_MY_PARTITION
