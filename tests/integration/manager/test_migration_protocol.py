"""The migration protocol in one process: real ``DataService`` nodes on loopback RPC, the real
``Rebalancer`` and ``MigrationDriver``, and a fake coordinator (one state, one master term,
commits that just bump ``cas``). Failure cases that are slow or racy with processes are
driven step by step here: a target that dies mid-copy, a master that dies after the release
(the new master's recovery rolls forward), a deposed master's late commands, a freeze whose
lease runs out, and a source that cannot be reached while resolving."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
from collections.abc import AsyncIterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import msgspec
import pytest

from shardex.api.migration import (
    AbortIncoming,
    CatchUp,
    CatchUpReply,
    FreezeOutgoing,
    FreezeReply,
    MigrateIn,
    MigrateInReply,
    Outcome,
    ReleaseOutgoing,
    ResolveOutgoing,
)
from shardex.api.rebalance import GetRebalance, MovePartition, StartRebalance
from shardex.api.records import Change
from shardex.core.topology import Topology, balanced_assignment
from shardex.data.service import DataService
from shardex.errors import ErrorCode, NodeUnavailable, ShardexError
from shardex.manager.migration_driver import MigrationDriver
from shardex.manager.rebalance import Rebalancer
from shardex.manager.replication import unavailable
from shardex.meta.member_list import DOWN, UP, MemberInfo
from shardex.meta.partitioning import partition_of
from shardex.meta.rebalance_state import DONE, FAILED, MOVING, UNRESOLVED, new_record, with_move
from shardex.meta.state import KeyspaceMeta, StateContext
from shardex.net import ConnectionPool, RpcServer, TcpTransport

SECRET = "s" * 32
NP = 4


class FakeMembership:
    def __init__(self) -> None:
        self.members: list[MemberInfo] = []
        self.down: set[str] = set()

    def state_of(self, member_id: str, now: float) -> tuple[str, float]:
        name = next(m.name for m in self.members if m.member_id == member_id)
        return (DOWN if name in self.down else UP), 0.0


class Ctx:
    def __init__(self, coord: FakeCoordinator, epoch: int) -> None:
        self._c, self.epoch, self.request_id = coord, epoch, None
        self.membership = coord.membership

    @property
    def state(self) -> StateContext:
        return self._c.state

    def new_id(self) -> str:
        return self._c.new_id()

    async def commit(self, new: StateContext, *, reply: Any = None) -> StateContext:
        assert new.cas == self._c.state.cas, "built on a stale state"
        self._c.state = msgspec.structs.replace(new, cas=new.cas + 1, epoch=self.epoch)
        for cb in self._c.callbacks:
            cb(self._c.state)
        return self._c.state


class FakeCoordinator:
    """Master of term ``epoch``; also the state every data node reconciles against."""

    def __init__(self) -> None:
        self.state = StateContext()
        self.epoch = 1
        self.membership = FakeMembership()
        self.pool = ConnectionPool(TcpTransport(), SECRET, name="master")
        self.callbacks: list[Any] = []
        self.ops: dict[type, Any] = {}
        self.recovery: list[Any] = []
        self.tasks: list[asyncio.Task[Any]] = []
        self._ids = itertools.count(1)

    def on_change(self, cb: Any) -> None:
        self.callbacks.append(cb)

    def new_id(self) -> str:
        return f"id{next(self._ids)}"

    def register_op(self, t: type, op: Any) -> None:
        self.ops[t] = op

    def register_recovery(self, hook: Any) -> None:
        self.recovery.append(hook)

    def spawn(self, coro: Any) -> asyncio.Task[Any]:
        task = asyncio.get_running_loop().create_task(coro)
        self.tasks.append(task)
        return task

    async def exclusive(self, epoch: int, fn: Any) -> Any:
        if epoch != self.epoch:
            raise unavailable("deposed", "deposed", epoch=epoch)
        return await fn(Ctx(self, epoch))

    async def op(self, msg: Any) -> Any:
        return await self.ops[type(msg)](msg, Ctx(self, self.epoch))

    async def settle(self) -> None:
        """Wait for every background task (rebalance, resolver)."""
        while any(not t.done() for t in self.tasks):
            await asyncio.gather(*self.tasks, return_exceptions=True)


class Node:
    def __init__(self, coord: FakeCoordinator, name: str, path: Path) -> None:
        self.coord, self.name, self.path = coord, name, path
        self.ds: DataService | None = None
        self.server: RpcServer | None = None

    async def start(self, port: int = 0) -> None:
        self.ds = DataService(
            data_dir=self.path,
            node_name=self.name,
            transport=TcpTransport(),
            secret=SECRET,
            coordinator=lambda: self.coord,
            members=lambda: self.coord.membership.members,
            reconcile_interval=3600,
        )
        self.server = RpcServer(TcpTransport(), SECRET, name=self.name)
        self.ds.install(self.server)
        await self.ds.start()
        address = await self.server.start(f"127.0.0.1:{port}")
        members = [m for m in self.coord.membership.members if m.name != self.name]
        info = MemberInfo(member_id=self.name, name=self.name, address=address, services=("data",))
        self.coord.membership.members = sorted([*members, info], key=lambda m: m.name)
        self.coord.membership.down.discard(self.name)

    @property
    def port(self) -> int:
        return int(
            next(m for m in self.coord.membership.members if m.name == self.name).address.rsplit(
                ":", 1
            )[1]
        )

    async def stop(self) -> None:
        assert self.server is not None and self.ds is not None
        await self.server.stop()
        await self.ds.stop()
        self.coord.membership.down.add(self.name)

    @property
    def engine(self) -> Any:
        assert self.ds is not None
        return self.ds.engine


@pytest.fixture
async def cluster(tmp_path: Path) -> AsyncIterator[tuple[FakeCoordinator, Rebalancer, dict]]:
    coord = FakeCoordinator()
    rebalancer = Rebalancer(coord)
    rebalancer.register()
    nodes = {n: Node(coord, n, tmp_path / n) for n in ("n1", "n2")}
    for node in nodes.values():
        await node.start()
    meta = KeyspaceMeta(name="ks", num_partitions=NP, uuid="u1", created_cas=1)
    topo = Topology(seq_num=1, assignment=balanced_assignment(NP, ["n1"]))
    coord.state = StateContext(cas=1, keyspaces={"ks": meta}, data_topologies={"ks": [topo]})
    for node in nodes.values():
        await node.ds.reconcile()
    try:
        yield coord, rebalancer, nodes
    finally:
        for t in coord.tasks:
            t.cancel()
        await asyncio.gather(*coord.tasks, return_exceptions=True)
        await coord.pool.close()
        for node in nodes.values():
            with contextlib.suppress(Exception):
                await node.stop()


def docs(partition: int, n: int, prefix: str = "d") -> list[str]:
    return [
        d for d in (f"{prefix}{i}" for i in range(n * NP * 4)) if partition_of(d, NP) == partition
    ][:n]


def latest(coord: FakeCoordinator) -> Topology:
    return coord.state.data_topologies["ks"][-1]


async def test_rebalance_moves_half_and_keeps_every_write(cluster) -> None:
    coord, _rb, nodes = cluster
    n1 = nodes["n1"].engine
    for p in range(NP):
        n1.mutate_many("ks", [("upsert", d, {"p": p}, None) for d in docs(p, 200)])
    acked: list[tuple[int, int]] = []
    stop = asyncio.Event()

    async def writer() -> None:  # writes go on at the source until it refuses them
        for i, d in enumerate(docs(3, 5000, "w")):
            if stop.is_set():
                return
            try:
                r = await asyncio.to_thread(n1.upsert, "ks", d, {"i": i})
            except ShardexError as e:
                assert e.code == ErrorCode.NOT_MY_PARTITION
                return
            acked.append((r.seqno, r.cas))

    task = asyncio.create_task(writer())
    reply = await coord.op(StartRebalance(max_parallel=2))
    await coord.settle()
    stop.set()
    await task
    rec = coord.state.rebalance
    assert rec.state == DONE and {m.partition for m in rec.moves} == {2, 3}
    assert [t.seq_num for t in coord.state.data_topologies["ks"]] == [1, 2, 3]
    assert latest(coord).partitions_of("n2") == [2, 3] and reply.record.id == rec.id
    n2 = nodes["n2"].engine
    info = n2.partition_info("ks", 3)
    assert info.state == "active" and n1.partition_state("ks", 3) == "absent"
    stream = {c.seqno: c.cas for c in n2.stream("ks", 3, 0, 0) if isinstance(c, Change)}
    assert list(stream) == list(range(1, info.high_seqno + 1))
    assert all(stream[s] == cas for s, cas in acked)
    assert n1.topology_floor("ks") >= 2 and all(m.pause_ms > 0 for m in rec.moves)
    status = await coord.op(GetRebalance())
    assert status.record == rec and status.phases == {}


async def test_target_dying_mid_copy_leaves_the_partition_at_the_source(cluster) -> None:
    coord, _rb, nodes = cluster
    n1 = nodes["n1"].engine
    for d in docs(1, 300):
        n1.upsert("ks", d, {"pad": "x" * 2000})
    await coord.op(MovePartition(keyspace="ks", partition=1, target="n2", rate_limit=200_000))
    for _ in range(200):
        if nodes["n2"].engine.incoming():
            break
        await asyncio.sleep(0.01)
    assert nodes["n2"].engine.incoming()
    await asyncio.sleep(0.2)
    port = nodes["n2"].port
    await nodes["n2"].stop()
    await coord.settle()
    move = coord.state.rebalance.moves[0]
    assert move.status == FAILED and latest(coord).assignment[1] == "n1"
    assert n1.upsert("ks", docs(1, 1)[0], {"after": 1}).partition == 1
    await nodes["n2"].start(port)
    await nodes["n2"].ds.reconcile()
    n2 = nodes["n2"].engine
    assert not n2.incoming() and n2.partition_state("ks", 1) == "absent"
    assert not (nodes["n2"].path / "data" / "data-ingest").exists()


async def run_until_released(coord: FakeCoordinator, nodes: dict, partition: int) -> Any:
    """An old master (term 1) that records the move, copies, freezes, catches up and releases
    ... and dies before publishing."""
    plan = [("ks", "u1", partition, "n1", "n2", 1)]
    rec = with_move(new_record("r1", "move", plan, ["m1"], 0.0), "m1", status=MOVING)
    coord.state = msgspec.structs.replace(coord.state, cas=coord.state.cas + 1, rebalance=rec)
    addr = {m.name: m.address for m in coord.membership.members}
    common = {"migration_id": "m1", "epoch": 1, "keyspace": "ks", "partition": partition}
    await coord.pool.request(
        addr["n2"],
        MigrateIn(
            **common,
            keyspace_uuid="u1",
            created_cas=1,
            num_partitions=NP,
            source="n1",
            source_address=addr["n1"],
            base_seq=1,
            record_cas=coord.state.cas,
        ),
        30,
        expect=MigrateInReply,
    )
    fr = await coord.pool.request(
        addr["n1"], FreezeOutgoing(**common, lease=5), 5, expect=FreezeReply
    )
    await coord.pool.request(
        addr["n2"],
        CatchUp(**common, until=fr.high_seqno, source_address=addr["n1"]),
        5,
        expect=CatchUpReply,
    )
    return addr, common, fr


async def test_new_master_rolls_forward_a_released_hand_over(cluster) -> None:
    coord, rb, nodes = cluster
    for d in docs(0, 50):
        nodes["n1"].engine.upsert("ks", d, {"v": 1})
    addr, common, fr = await run_until_released(coord, nodes, 0)
    await coord.pool.request(addr["n1"], ReleaseOutgoing(**common, high_seqno=fr.high_seqno), 5)
    coord.epoch = 2  # failover: the new master's recovery hook
    await rb.recover(Ctx(coord, 2))
    assert coord.state.rebalance.state == FAILED  # the rebalance itself was interrupted
    await coord.settle()
    move = coord.state.rebalance.moves[0]
    assert move.status == DONE and latest(coord).assignment[0] == "n2"
    assert nodes["n2"].engine.partition_info("ks", 0).state == "active"
    assert nodes["n2"].engine.get("ks", docs(0, 1)[0]).doc == {"v": 1}
    assert nodes["n1"].engine.partition_state("ks", 0) == "absent"
    # The old master's late commands are refused by the term fence.
    with pytest.raises(ShardexError) as info:
        await coord.pool.request(
            addr["n1"], FreezeOutgoing(**{**common, "partition": 1}, lease=5), 5
        )
    assert info.value.details.get("reason") == "deposed"


async def test_new_master_aborts_an_unreleased_hand_over_and_fences_it(cluster) -> None:
    coord, rb, nodes = cluster
    for d in docs(1, 50):
        nodes["n1"].engine.upsert("ks", d, {"v": 1})
    addr, common, fr = await run_until_released(coord, nodes, 1)
    coord.epoch = 2
    await rb.recover(Ctx(coord, 2))
    await coord.settle()
    assert coord.state.rebalance.moves[0].status == FAILED
    assert latest(coord).assignment[1] == "n1"
    n1 = nodes["n1"].engine
    assert n1.upsert("ks", docs(1, 1)[0], {"v": 2}).partition == 1  # unfrozen, serving
    assert nodes["n2"].engine.partition_state("ks", 1) == "absent"
    assert not nodes["n2"].engine.incoming()
    # A release from the deposed master arriving now changes nothing.
    with pytest.raises(ShardexError):
        await coord.pool.request(addr["n1"], ReleaseOutgoing(**common, high_seqno=fr.high_seqno), 5)
    assert n1.partition_state("ks", 1) == "active"


async def test_freeze_lease_expiry_and_resolve_fence(cluster) -> None:
    coord, _rb, nodes = cluster
    n1 = nodes["n1"].engine
    d = docs(2, 1)[0]
    n1.upsert("ks", d, {"v": 1})
    addr = {m.name: m.address for m in coord.membership.members}
    common = {"migration_id": "m9", "epoch": 1, "keyspace": "ks", "partition": 2}
    fr = await coord.pool.request(
        addr["n1"], FreezeOutgoing(**common, lease=0.2), 5, expect=FreezeReply
    )
    with pytest.raises(ShardexError) as info:
        n1.upsert("ks", d, {"v": 2})
    assert info.value.details["retryable"] is True
    await asyncio.sleep(0.4)
    n1.upsert("ks", d, {"v": 3})  # the lease ran out: writes resume
    with pytest.raises(ShardexError):
        await coord.pool.request(addr["n1"], ReleaseOutgoing(**common, high_seqno=fr.high_seqno), 5)
    out = await coord.pool.request(addr["n1"], ResolveOutgoing(**common), 5, expect=Outcome)
    assert out.state == "active"
    with pytest.raises(ShardexError):  # resolved as aborted: this id can never freeze again
        await coord.pool.request(addr["n1"], FreezeOutgoing(**common, lease=5), 5)


async def test_unreachable_source_leaves_the_move_unresolved_until_it_answers(
    cluster, monkeypatch: pytest.MonkeyPatch
) -> None:
    coord, rb, nodes = cluster
    monkeypatch.setattr("shardex.manager.rebalance.RESOLVE_INTERVAL", 0.2)
    for d in docs(3, 20):
        nodes["n1"].engine.upsert("ks", d, {"v": 1})
    await run_until_released(coord, nodes, 3)
    port = nodes["n1"].port
    await nodes["n1"].stop()  # the source: frozen, not released, and gone
    coord.epoch = 2
    await rb.recover(Ctx(coord, 2))
    await asyncio.sleep(0.5)
    move = coord.state.rebalance.moves[0]
    assert move.status == UNRESOLVED and nodes["n2"].engine.incoming()  # copy kept
    with pytest.raises(ShardexError):
        await coord.op(StartRebalance())  # nobody knows where partition 3 is: refuse
    await nodes["n1"].start(port)  # restarted: unfrozen, active -> the resolver aborts
    await coord.settle()
    assert coord.state.rebalance.moves[0].status == FAILED
    assert nodes["n1"].engine.partition_info("ks", 3).state == "active"
    assert not nodes["n2"].engine.incoming()


async def test_source_dying_mid_copy_fails_the_move_at_once(cluster) -> None:
    coord, _rb, nodes = cluster
    for d in docs(2, 300):
        nodes["n1"].engine.upsert("ks", d, {"pad": "x" * 2000})
    await coord.op(MovePartition(keyspace="ks", partition=2, target="n2", rate_limit=200_000))
    for _ in range(200):
        if nodes["n2"].engine.incoming():
            break
        await asyncio.sleep(0.01)
    port = nodes["n1"].port
    await nodes["n1"].stop()
    await coord.settle()
    # No release was ever sent, so the source cannot have handed over: failed, not unresolved
    # (which would block every new rebalance until the source is back).
    move = coord.state.rebalance.moves[0]
    assert move.status == FAILED and latest(coord).assignment[2] == "n1"
    assert not nodes["n2"].engine.incoming()
    assert nodes["n2"].engine.partition_state("ks", 2) == "absent"
    await nodes["n1"].start(port)
    assert nodes["n1"].engine.partition_info("ks", 2).state == "active"


async def test_a_best_effort_command_survives_a_failure_but_not_a_deposed_master() -> None:
    """Activate, drop, abort and the resolver's question are best effort (the node reconciles
    by itself): any failure is logged and the move goes on, except the term fence saying this
    master is deposed, which stops the driver."""

    class FailingPool:
        def __init__(self) -> None:
            self.error: ShardexError = NodeUnavailable("n2 is unreachable")

        async def request(self, address: str, msg: Any, timeout: float, expect: Any) -> Any:
            raise self.error

    member = MemberInfo(member_id="id-n2", name="n2", address="n2:1", services=("data",))
    pool = FailingPool()
    coord = SimpleNamespace(membership=SimpleNamespace(members=[member]), pool=pool)
    driver = MigrationDriver(coord, {}, lambda epoch: None)
    msg = AbortIncoming(migration_id="m1", epoch=1, keyspace="ks", partition=0)
    assert await driver._tell("m1", "n2", msg, "not told to abort") is None
    pool.error = unavailable("deposed", "deposed", epoch=1)
    with pytest.raises(ShardexError) as info:
        await driver._tell("m1", "n2", msg, "not told to abort")
    assert info.value.details["reason"] == "deposed"
