"""Document expiry on the simulator's virtual clock: two data nodes (``d1`` active for every
partition, ``d2`` its replica), real ``DataService``s on memory stores, a client sending
writes with expiries, touches and reads through its ``DataRouter``.

Checked in virtual time: a document is readable until its expiry and never after, on the
active and on the replica (each against its own clock); the keyspace's ``max_ttl`` gives
an expiry to a write without one and caps a longer one; a touch extends it; the expiry
pager deletes what expired (and what a read found expired) as expirations, each with its
own seqno in the change stream, marked ``FLAG_EXPIRED``; the replica copy holds the same
tombstones. A failing seed replays with ``SHARDEX_SIM_SEED=N``."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import pytest
from data_harness import address, fixed_control_reply, sim_data_service

from shardex.api.data import (
    Get,
    GetAndTouch,
    GetReply,
    MutationReply,
    Touch,
    Upsert,
)
from shardex.api.expiry import FLAG_EXPIRED
from shardex.api.records import OP_DELETE, Change
from shardex.client.routing import DataRouter
from shardex.client.streams import RemoteStream
from shardex.core.topology import Topology
from shardex.data.records import decode_doc, doc_key
from shardex.data.service import DataService
from shardex.errors import ErrorCode, ShardexError
from shardex.meta.member_list import MemberInfo
from shardex.meta.partitioning import partition_of
from shardex.meta.state import KeyspaceMeta, StateContext
from shardex.net import RpcServer
from shardex.net.messages import Message
from shardex.sim import (
    ClusterNode,
    FaultConfig,
    Simulation,
    assert_deterministic,
    run_simulation,
    sim_seeds,
)

SECRET = "sim-expiry-secret"
KEYSPACE = "ks"
NUM_PARTITIONS = 4
NODES = ("d1", "d2")
CLIENT = "cl"
# The engines' clock: the virtual clock plus this (epoch seconds). An offset in the clock the
# engines are given, not a start time of the loop: at 1.8e9 a double's step is about
# 2.4e-7 s, coarser than the network's shortest latencies.
T0 = 1_800_000_000.0
MAX_TTL = 60
SHORT = [f"short{i}" for i in range(8)]  # expiry 5 s
PLAIN = [f"plain{i}" for i in range(4)]  # no expiry: max_ttl's 60 s
LONG = "long"  # asks a day: capped to 60 s
TOUCHED = "touched"  # expiry 5 s, touched at 3 s to 20 s


@dataclass
class Outcome:
    expiries: dict[str, int] = field(default_factory=dict)
    readable_before: set[str] = field(default_factory=set)
    unreadable_after: set[str] = field(default_factory=set)
    replica_unreadable: set[str] = field(default_factory=set)
    touched_body: Any = None
    expirations: dict[str, Change] = field(default_factory=dict)
    upserts_after: int = 0
    replica_tombstones: set[str] = field(default_factory=set)
    pager_expired: dict[str, int] = field(default_factory=dict)
    readable_just_before: set[str] = field(default_factory=set)
    touched_readable: bool = False
    replica_expiry: int = 0


class World:
    def __init__(self, sim: Simulation, pager_interval: float) -> None:
        self.sim = sim
        self.pager_interval = pager_interval
        meta = KeyspaceMeta(
            name=KEYSPACE,
            num_partitions=NUM_PARTITIONS,
            uuid="ks-1",
            created_cas=1,
            num_replicas=1,
            max_ttl=MAX_TTL,
        )
        topo = Topology(
            seq_num=1,
            assignment=dict.fromkeys(range(NUM_PARTITIONS), "d1"),
            replicas={p: ["d2"] for p in range(NUM_PARTITIONS)},
        )
        self.state = StateContext(
            cas=1, epoch=1, keyspaces={KEYSPACE: meta}, data_topologies={KEYSPACE: [topo]}
        )
        self.members = [
            MemberInfo(member_id=f"id-{h}", name=h, address=address(h), services=("data",))
            for h in NODES
        ]
        self.services: dict[str, DataService] = {}
        self.outcome = Outcome()

    async def data_main(self, node: ClusterNode) -> None:
        loop = asyncio.get_running_loop()
        svc = sim_data_service(
            node,
            self.state,
            lambda: self.members,
            boot_id=f"{node.host}/boot",
            uuids=self.sim.fork_rng(f"uuids/{node.host}"),
            clock_offset=T0,
            secret=SECRET,
            expiry_pager_interval=self.pager_interval,
        )
        server = RpcServer(node.transport, SECRET, name=node.host)
        svc.install(server)
        await svc.start()
        node.serving(await server.start(node.listen_address))
        self.services[node.host] = svc
        await loop.create_future()

    async def control(self, msg: Message, expect: type[Any]) -> Any:
        return fixed_control_reply(self.state, self.members, expect)

    async def client_main(self, node: ClusterNode) -> None:
        router = DataRouter(
            transport=node.transport,
            secret=SECRET,
            name=CLIENT,
            control=self.control,
            request_timeout=2.0,
            connect_timeout=0.5,
        )
        try:
            await self.script(router)
        finally:
            await router.close()

    async def script(self, router: DataRouter) -> None:
        loop = asyncio.get_running_loop()
        out = self.outcome
        start = loop.time()
        assert start < 0.5  # the short expiries fall after the touch at 3 s

        async def upsert(docid: str, expiry: int) -> None:
            msg = Upsert(keyspace=KEYSPACE, docid=docid, doc=b'{"v": 1}', expiry=expiry)
            await router.to_owner(KEYSPACE, docid, msg, MutationReply, idempotent=False)

        for d in SHORT:
            await upsert(d, 5)
        for d in PLAIN:
            await upsert(d, 0)
        await upsert(LONG, 86_400)
        await upsert(TOUCHED, 5)
        for d in [*SHORT, *PLAIN, LONG, TOUCHED]:
            out.expiries[d] = (await self.get(router, d)).expiry
            out.readable_before.add(d)
        await self.wait_until(start + 3)
        # the replica holds the same absolute expiry (its sender runs every 0.5 s at most)
        msg = Get(keyspace=KEYSPACE, docid=SHORT[0], replica=True)
        out.replica_expiry = (await router.to_node("d2", msg, GetReply)).expiry
        msg = Touch(keyspace=KEYSPACE, docid=TOUCHED, expiry=20)
        await router.to_owner(KEYSPACE, TOUCHED, msg, MutationReply, idempotent=False)
        got = GetAndTouch(keyspace=KEYSPACE, docid=TOUCHED, expiry=20)
        reply = await router.to_owner(KEYSPACE, TOUCHED, got, GetReply, idempotent=False)
        out.touched_body = reply.body
        out.expiries["touched-again"] = reply.expiry
        # Just before the short expiry (stored rounded up to a whole second) they are read;
        # at it, reads say "not found" on the active (and report them to the pager) and on
        # the replica, each against its own clock, whether or not the pager ran.
        await self.wait_until(min(out.expiries[d] for d in SHORT) - T0 - 0.05)
        absent = await asyncio.gather(*(self.absent(router, d) for d in SHORT))
        out.readable_just_before = {d for d, gone in zip(SHORT, absent, strict=True) if not gone}
        await self.wait_until(max(out.expiries[d] for d in SHORT) - T0)
        out.touched_readable = not await self.absent(router, TOUCHED)
        for d in SHORT:
            if await self.absent(router, d):
                out.unreadable_after.add(d)
            if await self.absent(router, d, replica=True):
                out.replica_unreadable.add(d)
        # The pager deletes them all within a few ticks: polled, with a deadline.
        deadline = loop.time() + 10
        while loop.time() < deadline:
            changes = [c for p in range(NUM_PARTITIONS) for c in await self.changes(router, p)]
            out.expirations = {c.docid: c for c in changes if c.op == OP_DELETE}
            if set(out.expirations) >= set(SHORT):
                break
            await asyncio.sleep(0.25)
        out.upserts_after = sum(1 for c in changes if c.op != OP_DELETE)
        # ... and they reach the replica copy: polled the same way
        deadline = loop.time() + 10
        while loop.time() < deadline:
            out.replica_tombstones = self.tombstones("d2")
            if out.replica_tombstones >= set(SHORT):
                break
            await asyncio.sleep(0.25)
        out.pager_expired = dict(self.services["d1"].expiry.expired_by)

    def tombstones(self, host: str) -> set[str]:
        engine = self.services[host].engine
        found = set()
        for d in [*SHORT, *PLAIN, LONG, TOUCHED]:
            part = engine._local.held(KEYSPACE, partition_of(d, NUM_PARTITIONS))
            raw = part.cf.get(doc_key(d))
            if raw is not None:
                rec = decode_doc(raw)
                if rec.deleted and rec.flags & FLAG_EXPIRED:
                    found.add(d)
        return found

    async def wait_until(self, t: float) -> None:
        await asyncio.sleep(max(0.0, t - asyncio.get_running_loop().time()))

    async def get(self, router: DataRouter, docid: str) -> GetReply:
        msg = Get(keyspace=KEYSPACE, docid=docid)
        return await router.to_owner(KEYSPACE, docid, msg, GetReply, idempotent=True)

    async def absent(self, router: DataRouter, docid: str, replica: bool = False) -> bool:
        try:
            if replica:
                msg = Get(keyspace=KEYSPACE, docid=docid, replica=True)
                await router.to_node("d2", msg, GetReply)
            else:
                await self.get(router, docid)
        except ShardexError as exc:
            return exc.code is ErrorCode.DOC_NOT_FOUND
        return False

    async def changes(self, router: DataRouter, partition: int) -> list[Change]:
        stream = RemoteStream(router, KEYSPACE, partition)
        out: list[Change] = []
        await stream.open(0, 0, None, follow=False)
        while (batch := await stream.next_batch()) is not None:
            out.extend(c for c in batch if isinstance(c, Change))
        return out


def scenario(pager_interval: float) -> Callable[[Simulation], Awaitable[World]]:
    async def main(sim: Simulation) -> World:
        world = World(sim, pager_interval)
        for host in NODES:
            sim.cluster.add(host, world.data_main)
        sim.cluster.add(CLIENT, world.client_main)
        await sim.cluster.start(*NODES, CLIENT)
        await sim.cluster[CLIENT].wait()
        sim.cluster.check()
        return world

    return main


def run(seed: int, pager_interval: float) -> World:
    return run_simulation(scenario(pager_interval), seed, FaultConfig())


def test_a_run_replays_exactly() -> None:
    assert_deterministic(scenario(1.0), 3, FaultConfig)


@pytest.mark.parametrize(
    "pager_interval",
    [1.0, 3600.0],
    ids=["walk", "on-access"],  # with an hour between walks only the reads' reports delete
)
@pytest.mark.parametrize("seed", sim_seeds(1))
def test_documents_expire_on_the_virtual_clock(seed: int, pager_interval: float) -> None:
    out = run(seed, pager_interval).outcome
    everything = {*SHORT, *PLAIN, LONG, TOUCHED}
    assert out.readable_before == everything
    written = min(out.expiries[d] for d in SHORT) - 5
    assert all(written <= out.expiries[d] - 5 <= written + 1 for d in SHORT), out.expiries
    assert all(out.expiries[d] - 60 - written in (0, 1) for d in (*PLAIN, LONG)), out.expiries
    assert out.expiries["touched-again"] - 20 - written in (3, 4), out.expiries
    assert out.touched_body == b'{"v": 1}'
    assert out.replica_expiry == out.expiries[SHORT[0]]
    assert out.readable_just_before == set(SHORT)
    assert out.touched_readable
    assert out.unreadable_after == set(SHORT)
    assert out.replica_unreadable == set(SHORT)
    # every short document deleted once, as an expiration with its own seqno; nothing else
    assert set(out.expirations) == set(SHORT), sorted(out.expirations)
    assert all(c.flags & FLAG_EXPIRED and c.body is None for c in out.expirations.values())
    assert len({(c.partition, c.seqno) for c in out.expirations.values()}) == len(SHORT)
    assert sum(out.pager_expired.values()) == len(SHORT), out.pager_expired
    if pager_interval > 60:  # no walk in the run: the reads' reports deleted them all
        assert out.pager_expired == {"access": len(SHORT), "walk": 0}
    assert out.replica_tombstones == set(SHORT)
