"""Three full ``Node``s (manager + data) in the simulator, clients recording a linearizability
history, and the faults that make the cluster fail a node over: a partition that isolates the
node holding the active copies with a minority, or a power-off of that node.

Nodes ``n1``..``n3``: each a ``Node`` built as ``manager_cluster.sim_node`` builds one
(membership, the replicated coordinator with automatic failover on, heartbeat 0.25 s, failure
timeout 1 s, auto-failover timeout 2 s) plus the real ``DataService`` on a ``MemoryStore`` over
the host's simulated disk (``MemoryDisk``, so a power-off loses the unsynced tail), with inline
I/O, the engine's clock and uuids from the simulation, and the serving lease
``Membership.majority_heard`` (or none, for the negative control). The in-process ``Node``
builds its data service only with a data directory (RocksDB), so the harness builds it and hands
it to the Node before start.

Clients ``c1``..``c3``: one host beside each node (a partition puts it on its node's side),
routing with the client's ``DataRouter`` (topology and addresses from the coordinator state,
through a control connection that asks its own node first) but one attempt per call
(``FailoverCluster.call``: re-routed only after NOT_MY_PARTITION / NODE_FAILED_OVER; after a
timeout or an unreachable node the next call fetches the topology again). Each client runs a few
sequential processes doing reads, upserts and CAS (a read, then a replace with that CAS token,
or an insert when the document was absent), all writes at durability ``majority`` with a value
unique per write, recorded in a ``History`` on the virtual clock (``shardex.testing.outcomes``
says which errors are ``fail`` and which ``info``).
"""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from manager_cluster import SECRET, ManagerCluster, wait_until

from shardex.api.coordinator import StateRequest
from shardex.api.data import Get, GetReply, Insert, MutationReply, Replace, Upsert
from shardex.api.failover import Recover, Recovered
from shardex.api.keyspaces import CreateKeyspace, KeyspaceCreated
from shardex.client.routing import DataRouter
from shardex.core.topology import Topology
from shardex.data.engine import DataEngine
from shardex.data.service import DataService
from shardex.errors import ErrorCode, ShardexError
from shardex.manager.auto_failover import AutoFailoverSettings
from shardex.manager.membership import MemoryMemberStore
from shardex.meta.partitioning import partition_of
from shardex.meta.state import MemoryStateStore, StateContext
from shardex.net import ConnectionPool
from shardex.net.messages import Message
from shardex.node.server import Node
from shardex.sim import ClusterNode, NodeMain, Simulation
from shardex.storage.memory import MemoryDisk, MemoryStore
from shardex.testing.history import History, OpId
from shardex.testing.outcomes import write_outcome

KEYSPACE = "ks"
NUM_PARTITIONS = 6
NUM_REPLICAS = 2
HOSTS = ("n1", "n2", "n3")
CLIENTS = {"c1": "n1", "c2": "n2", "c3": "n3"}  # client host -> the node beside it
HEARTBEAT = 0.25
FAILURE_TIMEOUT = 1.0
AUTO_FAILOVER_TIMEOUT = 2.0
ROUTE_ATTEMPTS = 4
REROUTE = (ErrorCode.NOT_MY_PARTITION, ErrorCode.NODE_FAILED_OVER)
# after these the next call fetches the topology again (the owner may have been failed over)
UNREACHABLE = (ErrorCode.TIMEOUT, ErrorCode.CONNECTION_CLOSED, ErrorCode.NODE_UNAVAILABLE)
RETRY_REASONS = {"no_master", "not_master", "commit_failed", "deposed", None}


@dataclass
class Params:
    processes: int = 3  # per client host
    keys_on_victim: int = 4  # documents whose partition the victim holds active
    keys_elsewhere: int = 2
    think: float = 0.1  # the most a process waits between two calls
    lease: bool = True  # False: the negative control (a data node serves without the lease)
    request_timeout: float = 2.0
    cut_off: float = 5.0  # virtual seconds the partition lasts after the failover
    readers: int = 1  # per client host, processes that only read
    heal: bool = True  # False: stop while still cut off (no heal, no recovery)
    durability: str = "majority"


@dataclass
class Counts:
    """What the run did, by status (tests assert the scenario really happened)."""

    by_status: dict[str, int] = field(default_factory=dict)

    def add(self, status: str) -> None:
        self.by_status[status] = self.by_status.get(status, 0) + 1


class FailoverCluster(ManagerCluster):
    """The nodes, their data services and the clients (module docstring)."""

    def __init__(self, sim: Simulation, params: Params) -> None:
        super().__init__(sim, HOSTS)
        self.params = params
        self.data: dict[str, DataService] = {}
        loop = asyncio.get_running_loop()
        self.history = History(clock=lambda: int(loop.time() * 1e9))
        self.counts = Counts()
        self.stop_workload = asyncio.Event()
        self.keys: list[str] = []
        self.rng = sim.fork_rng("failover-scenario")
        self._control_pools: list[ConnectionPool] = []
        self._stale: dict[DataRouter, bool] = {}
        self.add_hosts(self._main)

    # -- nodes ------------------------------------------------------------------------------

    def _main(self, host: str, seeds: tuple[str, ...]) -> NodeMain:
        async def main(node: ClusterNode) -> None:
            n = self._node(node, host, seeds)
            await self.serve(host, node, n)

        return main

    def _node(self, node: ClusterNode, host: str, seeds: tuple[str, ...]) -> Node:
        """``host``'s Node in this incarnation: member id, member list and coordinator record
        in the host's simulated disk (as ``manager_cluster.sim_node``, with faster failure
        detection), and the data service the harness builds."""
        disk = node.disk
        disk.setdefault("member_id", f"{host}-id")
        ids = self.sim.fork_rng(f"ids/{host}/{node.incarnation}")
        n = Node(
            transport=node.transport,
            secret=SECRET,
            name=host,
            member_id=disk["member_id"],
            address=node.listen_address,
            services=("manager", "data"),
            store=disk.setdefault("members", MemoryMemberStore()),
            seeds=seeds,
            heartbeat_interval=HEARTBEAT,
            failure_timeout=FAILURE_TIMEOUT,
            state_store=disk.setdefault("coordinator", MemoryStateStore()),
            id_factory=lambda: f"{ids.getrandbits(64):016x}",
            auto_failover=AutoFailoverSettings(enabled=True, timeout=AUTO_FAILOVER_TIMEOUT),
        )
        svc = self._data_service(node, host, n)
        svc.install(n.server)
        n.data = svc  # the Node starts it before its server and stops it last
        self.data[host] = svc
        return n

    def _data_service(self, node: ClusterNode, host: str, n: Node) -> DataService:
        store: MemoryDisk = node.disk.setdefault("store", MemoryDisk())
        boot_id = f"{host}/boot{node.disk.get('boot', 0)}"
        uuids = self.sim.fork_rng(f"uuids/{host}/{node.incarnation}")
        loop = asyncio.get_running_loop()

        def open_engine(path: Path) -> DataEngine:
            return DataEngine(
                path,
                open_store=lambda _path: MemoryStore(store),
                boot_id=boot_id,
                clock_ns=lambda: int(loop.time() * 1e9),
                uuids=lambda: uuids.getrandbits(63) or 1,
            )

        def lease() -> bool:
            m = n.membership
            return m is None or m.majority_heard(FAILURE_TIMEOUT)

        return DataService(
            data_dir=Path(host),
            node_name=host,
            transport=node.transport,
            secret=SECRET,
            coordinator=lambda: n.coordinator,
            members=lambda: n.membership.members if n.membership else [],
            reconcile_interval=0.5,
            inline_io=True,
            open_engine=open_engine,
            lease=lease if self.params.lease else None,
        )

    # -- cluster ops ------------------------------------------------------------------------

    async def request(self, msg: Message, expect: type[Any], hosts: tuple[str, ...] = HOSTS) -> Any:
        """An op through any reachable manager, the same request id on every attempt."""
        last: ShardexError | None = None
        for i in range(12):
            host = hosts[i % len(hosts)]
            try:
                return await self.client.request(f"{host}:7000", msg, 10.0, expect=expect)
            except ShardexError as exc:
                retry = exc.code in (ErrorCode.CONNECTION_CLOSED, ErrorCode.TIMEOUT) or (
                    exc.code is ErrorCode.NODE_UNAVAILABLE
                    and exc.details.get("reason") in RETRY_REASONS
                )
                if not retry:
                    raise
                last = exc
                await asyncio.sleep(0.5)
        assert last is not None
        raise last

    async def create_keyspace(self) -> Topology:
        msg = CreateKeyspace(
            name=KEYSPACE,
            num_partitions=NUM_PARTITIONS,
            num_replicas=NUM_REPLICAS,
            request_id="create-ks",
        )
        created: KeyspaceCreated = await self.request(msg, KeyspaceCreated)

        def opened() -> bool:
            for svc in self.data.values():
                if svc._engine is None or KEYSPACE not in {k.name for k in svc.engine.keyspaces()}:
                    return False
                if len(svc.engine.partitions(KEYSPACE)) != NUM_PARTITIONS:
                    return False
            return True

        await wait_until(opened, 20)
        return created.topology

    def state(self, host: str) -> StateContext:
        return self.coord(host).state

    async def recover(self, host: str, others: tuple[str, ...]) -> Recovered:
        return await self.request(
            Recover(node=host, kind="delta", request_id="recover"), Recovered, others
        )

    def choose_keys(self, topo: Topology, victim: str) -> list[str]:
        """Docids on partitions ``victim`` holds active first, then some elsewhere."""
        on, off = [], []
        i = 0
        while len(on) < self.params.keys_on_victim or len(off) < self.params.keys_elsewhere:
            docid = f"doc{i}"
            i += 1
            mine = topo.assignment[partition_of(docid, NUM_PARTITIONS)] == victim
            if mine and len(on) < self.params.keys_on_victim:
                on.append(docid)
            elif not mine and len(off) < self.params.keys_elsewhere:
                off.append(docid)
        return on + off

    # -- clients ----------------------------------------------------------------------------

    def router(self, client: str) -> DataRouter:
        transport = self.sim.network.transport(client)
        control_pool = ConnectionPool(
            transport, SECRET, name=f"{client}/control", connect_timeout=0.5
        )
        home = CLIENTS[client]
        order = [home] + [h for h in HOSTS if h != home]

        async def control(msg: Message, expect: type[Any]) -> Any:
            """The client's control connection: its own node first; a node that cannot
            reach the master answers from its own copy of the state."""
            last: ShardexError | None = None
            tries: list[tuple[str, Message]] = [(h, msg) for h in order]
            if isinstance(msg, StateRequest):
                stale = StateRequest(sections=msg.sections, fresh=False)
                tries += [(h, stale) for h in order]
            for host, m in tries:
                try:
                    return await control_pool.request(f"{host}:7000", m, 0.3, expect=expect)
                except ShardexError as exc:
                    last = exc
            assert last is not None
            raise last

        router = DataRouter(
            transport=transport,
            secret=SECRET,
            name=client,
            control=control,
            request_timeout=self.params.request_timeout,
            connect_timeout=0.5,
        )
        self._control_pools.append(control_pool)
        return router

    async def run_clients(self) -> None:
        routers = {c: self.router(c) for c in CLIENTS}
        try:
            await asyncio.gather(
                *(
                    self.process(routers[c], f"{c}/{p}", reader=p >= self.params.processes)
                    for c in CLIENTS
                    for p in range(self.params.processes + self.params.readers)
                )
            )
        finally:
            for r in routers.values():
                await r.close()
            for pool in self._control_pools:
                await pool.close()

    async def process(self, router: DataRouter, name: str, reader: bool) -> None:
        rng = self.sim.fork_rng(f"process/{name}")
        seq = 0
        while not self.stop_workload.is_set():
            await asyncio.sleep(rng.uniform(0.0, self.params.think))
            key = rng.choice(self.keys)
            kind = "read" if reader else rng.choice(("read", "read", "write", "cas", "cas"))
            seq += 1
            value = f"{name}#{seq}"
            if kind == "read":
                await self.read(router, name, key)
            elif kind == "write":
                await self.write(router, name, key, value)
            else:
                await self.cas(router, name, key, value)

    async def call(self, router: DataRouter, key: str, msg: Message, expect: type[Any]) -> Any:
        """One call to the owner of ``key``'s partition in the cached topology. Unlike
        ``DataRouter.to_owner`` it does not retry a node that answers NODE_UNAVAILABLE or
        times out: a client beside an isolated node keeps calling it (and records each call)
        instead of spending seconds inside one. It re-routes, with a fresh topology, after the
        refusals that name another owner (NOT_MY_PARTITION, NODE_FAILED_OVER)."""
        refresh = self._stale.pop(router, False)
        for attempt in range(ROUTE_ATTEMPTS):
            meta, topo = await router.keyspace(KEYSPACE, refresh=refresh)
            node = topo.assignment[partition_of(key, meta.num_partitions)]
            try:
                conn = await router.pool.get(await router.address(node), router.request_timeout)
                return await conn.request(msg, router.request_timeout, expect=expect)
            except ShardexError as exc:
                if exc.code in UNREACHABLE:
                    self._stale[router] = True  # the owner may have been failed over
                if exc.code not in REROUTE or attempt == ROUTE_ATTEMPTS - 1:
                    raise
                refresh = True
                await asyncio.sleep(0.05 * 2**attempt)
        raise AssertionError("unreachable")

    async def read(self, router: DataRouter, name: str, key: str) -> tuple[bool, Any, int]:
        """(read ok, value, CAS token) of ``key``, recorded as a read."""
        op = self.history.invoke(name, key, "read")
        try:
            got = await self.call(router, key, Get(keyspace=KEYSPACE, docid=key), GetReply)
        except ShardexError as exc:
            if exc.code is ErrorCode.DOC_NOT_FOUND:
                self._complete(name, op, "ok", None)
                return True, None, 0
            self._complete(name, op, "info", exc.code.value)  # a read changes nothing
            return False, None, 0
        value = json.loads(got.body)["v"]
        self._complete(name, op, "ok", value)
        return True, value, got.cas

    async def write(self, router: DataRouter, name: str, key: str, value: str) -> None:
        msg = Upsert(
            keyspace=KEYSPACE, docid=key, doc=_body(value), durability=self.params.durability
        )
        op = self.history.invoke(name, key, "write", value)
        await self._mutate(router, name, key, op, msg, conditional=False)

    async def cas(self, router: DataRouter, name: str, key: str, value: str) -> None:
        """Read ``key``, then write ``value`` only if it is unchanged: a replace with the CAS
        token read (an insert if it was absent), recorded as ``cas (read value, value)``."""
        ok, expected, token = await self.read(router, name, key)
        if not ok:
            return
        msg: Message
        if expected is None:
            msg = Insert(
                keyspace=KEYSPACE, docid=key, doc=_body(value), durability=self.params.durability
            )
        else:
            msg = Replace(
                keyspace=KEYSPACE,
                docid=key,
                doc=_body(value),
                cas=token,
                durability=self.params.durability,
            )
        op = self.history.invoke(name, key, "cas", (expected, value))
        await self._mutate(router, name, key, op, msg, conditional=True)

    async def _mutate(
        self, router: DataRouter, name: str, key: str, op: OpId, msg: Message, *, conditional: bool
    ) -> None:
        try:
            await self.call(router, key, msg, MutationReply)
        except ShardexError as exc:
            status, result = write_outcome(exc, conditional=conditional)
            self._complete(name, op, status, result)
            return
        self._complete(name, op, "ok", None)

    def _complete(self, name: str, op: OpId, status: Any, result: Any) -> None:
        self.history.complete(op, status, result)
        self.counts.add(status)


def _body(value: str) -> bytes:
    return json.dumps({"v": value}).encode()


def ok_writes_inside(history: History, client: str, start: float, end: float) -> list[str]:
    """Writes by ``client``'s processes acknowledged with their whole call inside
    [``start``, ``end``] (virtual seconds): none may exist while the client is cut off with an
    isolated node, which cannot reach a majority of the copies."""
    out = []
    for o in history.operations():
        if (
            str(o.process).startswith(f"{client}/")
            and o.op in ("write", "cas")
            and o.status == "ok"
            and o.complete_ns is not None
            and o.invoke_ns >= start * 1e9
            and o.complete_ns <= end * 1e9
        ):
            out.append(o.describe())
    return out


@dataclass
class Run:
    """A finished scenario: the cluster (history, counts) and when things happened."""

    cluster: FailoverCluster
    victim: str
    fault: str
    cut_at: float
    failed_over_at: float
    healed_at: float | None  # None: the run stopped while still cut off
    recovered_at: float | None


async def failover_scenario(sim: Simulation, params: Params, fault: str = "partition") -> Run:
    """Workload; then ``fault`` on the node holding the documents' active copies
    ("partition": it and its client cut off from the rest; "power_off": the machine dies, its
    unsynced writes with it); the majority fails it over by itself; the workload goes on on
    both sides; heal (or restart); recover the node (delta); workload; stop."""
    loop = asyncio.get_running_loop()
    c = FailoverCluster(sim, params)
    await c.start()
    topo = await c.create_keyspace()
    victim = c.rng.choice(HOSTS)
    c.keys = c.choose_keys(topo, victim)
    others = tuple(h for h in HOSTS if h != victim)
    workload = loop.create_task(c.run_clients())
    await asyncio.sleep(3.0)
    cut_at = loop.time()
    if fault == "partition":
        near = [h for h, n in CLIENTS.items() if n == victim]
        minority = [victim, *near]
        sim.cluster.partition(minority, [*others, *(h for h in CLIENTS if h not in near)])
    elif fault == "power_off":
        await c.crash(victim, power_off=True)
        node = sim.cluster[victim]
        node.disk["store"].crash(power_off=True, rng=c.rng)
        node.disk["boot"] = node.disk.get("boot", 0) + 1
    else:
        raise ValueError(f"unknown fault {fault!r}")
    await wait_until(lambda: victim in c.state(others[0]).failed_over, 30)
    failed_over_at = loop.time()
    await asyncio.sleep(params.cut_off)
    healed_at = recovered_at = None
    if params.heal:
        if fault == "partition":
            sim.cluster.heal()
        else:
            await c.restart(victim)
        healed_at = loop.time()
        await asyncio.sleep(3.0)
        await c.recover(victim, others)
        await wait_until(
            lambda: victim not in c.state(others[0]).failed_over and not c.data[victim].failed_over,
            30,
        )
        recovered_at = loop.time()
        await asyncio.sleep(3.0)
    c.stop_workload.set()
    await workload
    return Run(c, victim, fault, cut_at, failed_over_at, healed_at, recovered_at)
