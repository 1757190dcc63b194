"""The data service in the simulator: real data nodes on simulated disks, a client, crashes.

Nodes:

* ``d1``..``d3``: data nodes. Each runs the real ``DataService`` (group commit, change
  streams, recovery) with ``inline_io`` on a ``MemoryStore`` over the node's simulated disk
  (``MemoryDisk`` in ``ClusterNode.disk``). A kill -9 keeps every write the node made; a
  power-off keeps what was synced and a random run of the later batches, and boots the
  node anew (a new boot id, which is how recovery tells the two apart). Its partitions come
  from its own reconciliation against a fixed cluster state (one keyspace, one topology).
* ``cl``: the client: writers sending upserts, CAS replaces and deletes through the
  client's ``DataRouter`` (its retry rules: a write whose outcome is unknown is not resent),
  each write ``"persist"`` (synced before the ack) or, in phases, ``"memory"``. Once the
  faults are over it reads everything back: each partition's change stream from 0, every
  document, and a stream at each lost acknowledged change (which must be told to roll back).

The data engine's clock (CAS values) and uuids (new branches) come from the simulation (the
virtual clock, a seeded generator per process), so a seed replays exactly: with the wall
clock the replies' CAS values differ between runs. ``data_checker.check`` judges the run
from ``World.history`` and ``World.final``; failover logs are read from the engines (no
message carries one), everything else through the client.
"""

from __future__ import annotations

import asyncio
import json
import random
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from data_checker import DataHistory, FinalRead, Logs, Write

from shardex.api.coordinator import StateReply
from shardex.api.data import Delete, Get, GetReply, MutationReply, Replace, Upsert
from shardex.api.membership import MembersReply
from shardex.api.records import Change
from shardex.client.routing import DataRouter
from shardex.client.streams import RemoteStream
from shardex.core.topology import Topology
from shardex.data.engine import DataEngine
from shardex.data.service import DataService
from shardex.errors import ErrorCode, ShardexError
from shardex.meta.member_list import UP, MemberInfo, MemberView
from shardex.meta.state import KeyspaceMeta, StateContext
from shardex.net import RpcServer
from shardex.net.messages import Message
from shardex.sim import ClusterNode, Simulation
from shardex.storage.memory import MemoryDisk, MemoryStore

SECRET = "sim-data-secret"
KEYSPACE = "ks"
NUM_PARTITIONS = 6
DATA_NODES = ("d1", "d2", "d3")
CLIENT = "cl"
PORT = 7000
READ_ATTEMPTS = 5
_TRANSIENT = (ErrorCode.CONNECTION_CLOSED, ErrorCode.TIMEOUT, ErrorCode.NODE_UNAVAILABLE)


def address(host: str) -> str:
    return f"{host}:{PORT}"


class StateStandIn:
    """The coordinator as a data node sees it: a fixed state (``PlacementView``)."""

    def __init__(self, state: StateContext) -> None:
        self.state = state

    def on_change(self, callback: Any) -> None:
        return None


@dataclass
class Params:
    writers: int = 3
    writes: int = 40  # per writer
    docs: int = 18  # docids the writers share
    think: float = 0.15  # the most a writer waits between two writes
    # Writes alternate between phases of "memory" writes (acknowledged before a sync) and
    # of durable ones, so a power-off can meet a long unsynced tail (a WAL sync comes only
    # with a durable write or the service's periodic sync).
    phase: tuple[float, float] = (0.3, 2.0)
    chaos: bool = True
    power_off: float = 0.5  # share of the crashes that are power-offs
    request_timeout: float = 1.0


@dataclass
class World:
    sim: Simulation
    params: Params
    rng: random.Random
    owner: dict[int, str] = field(
        default_factory=lambda: {p: DATA_NODES[p % len(DATA_NODES)] for p in range(NUM_PARTITIONS)}
    )
    services: dict[str, DataService] = field(default_factory=dict)
    crashes: list[str] = field(default_factory=list)
    final: FinalRead | None = None  # what the client read back at the end
    summary: dict[str, int] = field(default_factory=dict)  # the checker's counts

    def __post_init__(self) -> None:
        meta = KeyspaceMeta(
            name=KEYSPACE, num_partitions=NUM_PARTITIONS, uuid="ks-1", created_cas=1
        )
        topo = Topology(seq_num=1, assignment=dict(self.owner))
        self.state = StateContext(
            cas=1, epoch=1, keyspaces={KEYSPACE: meta}, data_topologies={KEYSPACE: [topo]}
        )
        self.members = [
            MemberInfo(member_id=f"id-{h}", name=h, address=address(h), services=("data",))
            for h in DATA_NODES
        ]
        self.history = DataHistory(owner=dict(self.owner))
        self.writes_done = asyncio.Event()
        self.memory_phase = False
        self.faults_over = asyncio.Event()

    def add_nodes(self) -> None:
        for host in DATA_NODES:
            self.sim.cluster.add(host, self._data_main)
        self.sim.cluster.add(CLIENT, self._client_main)

    # -- a data node ---------------------------------------------------------------------

    async def _data_main(self, node: ClusterNode) -> None:
        loop = asyncio.get_running_loop()
        svc = sim_data_service(
            node,
            self.state,
            lambda: self.members,
            boot_id=f"{node.host}/boot{node.disk.get('boot', 0)}",
            uuids=self.sim.fork_rng(f"uuids/{node.host}/{node.incarnation}"),
        )
        server = RpcServer(node.transport, SECRET, name=node.host)
        svc.install(server)
        await svc.start()
        self.history.opened(node.host, loop.time(), _partition_logs(svc.engine))
        node.serving(await server.start(node.listen_address))
        self.services[node.host] = svc
        try:
            await loop.create_future()
        finally:
            # kill -9 or power-off: nothing graceful (a clean stop would sync)
            self.services.pop(node.host, None)

    # -- the client ----------------------------------------------------------------------

    async def _control(self, msg: Message, expect: type[Any]) -> Any:
        """The client's control connection, answered with the fixed state and members."""
        return fixed_control_reply(self.state, self.members, expect)

    async def _client_main(self, node: ClusterNode) -> None:
        router = DataRouter(
            transport=node.transport,
            secret=SECRET,
            name=CLIENT,
            control=self._control,
            request_timeout=self.params.request_timeout,
            connect_timeout=0.5,
        )
        phases = asyncio.get_running_loop().create_task(self.phases())
        try:
            await asyncio.gather(*(self.writer(router, w) for w in range(self.params.writers)))
            self.writes_done.set()
            await phases
            await self.faults_over.wait()
            self.final = await self.read_back(router)
        finally:
            await router.close()

    async def phases(self) -> None:
        rng = self.sim.fork_rng("phases")
        while not self.writes_done.is_set():
            await asyncio.sleep(rng.uniform(*self.params.phase))
            self.memory_phase = not self.memory_phase

    async def writer(self, router: DataRouter, w: int) -> None:
        rng = self.sim.fork_rng(f"writer/{w}")
        loop = asyncio.get_running_loop()
        known: dict[str, int] = {}  # docid -> CAS of this writer's last acknowledged write
        for i in range(self.params.writes):
            await asyncio.sleep(rng.uniform(0.0, self.params.think))
            docid = f"doc{rng.randrange(self.params.docs)}"
            kind = rng.choice(("upsert", "upsert", "upsert", "upsert", "replace", "delete"))
            if kind == "replace" and docid not in known:
                kind = "upsert"
            durability = "memory" if self.memory_phase else "persist"
            wid = f"w{w}.{i}"
            body = None if kind == "delete" else json.dumps({"write": wid}).encode()
            msg: Message
            if body is None:
                msg = Delete(keyspace=KEYSPACE, docid=docid, durability=durability)
            elif kind == "replace":
                cas = known[docid]
                msg = Replace(
                    keyspace=KEYSPACE, docid=docid, doc=body, cas=cas, durability=durability
                )
            else:
                msg = Upsert(keyspace=KEYSPACE, docid=docid, doc=body, durability=durability)
            self.history.sent(Write(wid, w, docid, kind, body, durability))
            try:
                reply = await router.to_owner(KEYSPACE, docid, msg, MutationReply, idempotent=False)
            except ShardexError as exc:
                self.history.failed(wid, exc)
                known.pop(docid, None)
                continue
            self.history.acked(wid, reply.result, loop.time())
            if kind == "delete":
                known.pop(docid, None)
            else:
                known[docid] = reply.result.cas

    async def read_back(self, router: DataRouter) -> FinalRead:
        """Every partition's stream and failover log, every document, and a stream opened at
        each lost acknowledged change (where a consumer that saw it would resume)."""
        streams = {p: await _read_stream(router, p, 0, 0) for p in range(NUM_PARTITIONS)}
        logs: Logs = {}
        for host in DATA_NODES:
            logs.update(_partition_logs(self.services[host].engine))
        docs: dict[str, tuple[bytes, int, int] | None] = {}
        for d in sorted({w.docid for w in self.history.writes.values()}):
            try:
                got = await router.to_owner(
                    KEYSPACE, d, Get(keyspace=KEYSPACE, docid=d), GetReply, idempotent=True
                )
                docs[d] = (got.body, got.cas, got.seqno)
            except ShardexError as exc:
                if exc.code is not ErrorCode.DOC_NOT_FOUND:
                    raise
                docs[d] = None
        final = FinalRead(streams, logs, docs)
        for w in self.history.lost_acks(final):
            r = w.result
            assert r is not None
            try:
                await _read_stream(router, r.partition, r.seqno, r.uuid)
                final.rollbacks[(r.partition, r.uuid, r.seqno)] = None
            except ShardexError as exc:
                if exc.code is not ErrorCode.ROLLBACK:
                    raise
                final.rollbacks[(r.partition, r.uuid, r.seqno)] = exc.details["rollback_seqno"]
        return final

    # -- faults ----------------------------------------------------------------------------

    async def crash(self, host: str, power_off: bool) -> None:
        """Kill ``host`` (its tasks end: nothing more reaches its disk), then crash its disk:
        a power-off also loses unsynced batches and boots the machine anew."""
        cluster = self.sim.cluster
        at = asyncio.get_running_loop().time()
        svc = self.services.get(host)
        logs = {} if svc is None else _partition_logs(svc.engine)
        await cluster.crash(host, power_off=power_off)
        node = cluster[host]
        lost = node.disk["store"].crash(power_off=power_off, rng=self.rng)
        if power_off:
            node.disk["boot"] = node.disk.get("boot", 0) + 1
        self.history.crashed(host, at, power_off, logs)
        kind = f"power-off, {lost} unsynced batches lost" if power_off else "kill -9"
        self.crashes.append(f"{at:.3f} {host} {kind}")

    async def chaos(self) -> None:
        """While the writers write: crash and restart data nodes (kill -9 or power-off) and
        cut the client off from one for a while."""
        cluster = self.sim.cluster
        while not self.writes_done.is_set():
            await asyncio.sleep(self.rng.uniform(0.3, 1.5))
            host = self.rng.choice(DATA_NODES)
            if self.rng.random() < 0.25:
                cluster.partition([CLIENT], [host])
                await asyncio.sleep(self.rng.uniform(0.2, 2.0))
                cluster.heal()
                continue
            await self.crash(host, power_off=self.rng.random() < self.params.power_off)
            await asyncio.sleep(self.rng.uniform(0.0, 0.5))
            await cluster.restart(host)

    async def restart_all(self) -> None:
        """Every data node crashes once more and restarts: the reads come after recovery."""
        for host in DATA_NODES:
            await self.crash(host, power_off=self.rng.random() < self.params.power_off)
            await self.sim.cluster.restart(host)
        for host in DATA_NODES:
            await self.sim.cluster[host].wait_serving()


def _partition_logs(engine: DataEngine) -> Logs:
    if KEYSPACE not in {k.name for k in engine.keyspaces()}:
        return {}  # the first start: reconciliation opens the partitions later
    out = {}
    for p in engine.partitions(KEYSPACE):
        info = engine.partition_info(KEYSPACE, p)
        out[p] = (list(info.failover_log), info.high_seqno)
    return out


async def _read_stream(router: DataRouter, partition: int, seqno: int, uuid: int) -> list[Change]:
    """The partition's changes after (``uuid``, ``seqno``) up to its high seqno, through the
    client's stream (ROLLBACK raised as the node answers it). A stream broken by the network
    (a connection left from before a restart) is read again: reading changes nothing."""
    for attempt in range(READ_ATTEMPTS):
        stream = RemoteStream(router, KEYSPACE, partition)
        out: list[Change] = []
        try:
            await stream.open(seqno, uuid, None, follow=False)
            while (batch := await stream.next_batch()) is not None:
                out.extend(c for c in batch if isinstance(c, Change))
            return out
        except ShardexError as exc:
            if exc.code not in _TRANSIENT or attempt == READ_ATTEMPTS - 1:
                raise
            await stream.cancel()
            await asyncio.sleep(0.1)
    raise AssertionError("unreachable")


def fixed_control_reply(state: Any, members: Any, expect: type[Any]) -> Any:
    """A client's control connection in a simulation whose cluster never changes: the state
    and every member up, as a manager would answer them."""
    if expect is StateReply:
        return StateReply(node="manager", master="manager", is_master=True, state=state)
    views = [
        MemberView(
            member_id=m.member_id,
            name=m.name,
            address=m.address,
            services=m.services,
            incarnation=1,
            state=UP,
            last_heartbeat_age=0.0,
        )
        for m in members
    ]
    return MembersReply(
        observer=CLIENT,
        observer_id=f"id-{CLIENT}",
        observer_is_manager=False,
        version=1,
        digest="",
        heartbeat_interval=1.0,
        failure_timeout=5.0,
        members=views,
    )


def sim_data_service(
    node: ClusterNode,
    state: Any,
    members: Any,
    *,
    boot_id: str,
    uuids: Any,
    clock_offset: float = 0.0,
    secret: str = SECRET,
    **options: Any,
) -> DataService:
    """A simulated node's data service over its in-memory disk, its clock the loop's
    (virtual) time plus ``clock_offset`` seconds, the coordinator a stand-in of ``state``;
    ``options`` go to ``DataService``."""
    disk: MemoryDisk = node.disk.setdefault("store", MemoryDisk())
    loop = asyncio.get_running_loop()

    def open_engine(path: Path) -> DataEngine:
        return DataEngine(
            path,
            open_store=lambda _path: MemoryStore(disk),
            boot_id=boot_id,
            clock_ns=lambda: int((clock_offset + loop.time()) * 1e9),
            uuids=lambda: uuids.getrandbits(63) or 1,
        )

    coordinator = StateStandIn(state)
    return DataService(
        data_dir=Path(node.host),
        node_name=node.host,
        transport=node.transport,
        secret=secret,
        coordinator=lambda: coordinator,
        members=members,
        reconcile_interval=0.5,
        inline_io=True,
        open_engine=open_engine,
        **options,
    )
