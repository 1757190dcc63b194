"""What the simulated clusters of real ``Node``s share: the settings, ``sim_node`` (a
host's Node, its identity and member list in the host's simulated disk), the bounded wait in
virtual time, and ``ManagerCluster`` for the coordinator scenarios (``test_coordinator_sim``,
``index_ddl_harness``; ``test_membership_sim`` uses the rest).

``ManagerCluster`` adds each host to the ``SimCluster`` (the others join through the first), keeps
the live ``Node`` of each host, and answers the questions every coordinator scenario asks: who is
master, have all nodes converged on one state, crash / restart a host. A subclass writes its node
main: ``manager_node`` builds the Node, the scenario registers its ops and hooks, ``serve`` runs it.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from typing import Any

from shardex.manager.coordinator import Coordinator
from shardex.manager.membership import MemoryMemberStore
from shardex.meta.state import MemoryStateStore, StateContext, state_digest
from shardex.net import ConnectionPool
from shardex.node.server import Node
from shardex.sim import ClusterNode, NodeMain, Simulation
from shardex.testing.checkers_coordinator import Version

SECRET = "sim-secret-0123456789abcdef"
HB = 0.5
FT = 3.0
HOSTS = ("n1", "n2", "n3")


def version(state: StateContext) -> Version:
    return (state.epoch, state.cas, state_digest(state))


async def wait_until(cond: Callable[[], bool], timeout: float, step: float = 0.05) -> float:
    """Virtual seconds until ``cond`` holds; fails after ``timeout`` virtual seconds."""
    loop = asyncio.get_running_loop()
    start = loop.time()
    while not cond():
        if loop.time() - start > timeout:
            raise AssertionError(f"condition not met within {timeout} virtual seconds")
        await asyncio.sleep(step)
    return loop.time() - start


def sim_node(
    node: ClusterNode,
    host: str,
    seeds: Sequence[str],
    services: Sequence[str],
    first_member_id: str | None = None,
    **node_kwargs: Any,
) -> Node:
    """The Node of ``host`` in this incarnation of its simulated machine. Its member id
    (``first_member_id``, default ``<host>-id``, on the first start) and member list live
    in ``node.disk``, which survives crashes: they play the data dir."""
    disk = node.disk
    disk.setdefault("member_id", first_member_id or f"{host}-id")
    return Node(
        transport=node.transport,
        secret=SECRET,
        name=host,
        member_id=disk["member_id"],
        address=node.listen_address,
        services=services,
        store=disk.setdefault("members", MemoryMemberStore()),
        seeds=seeds,
        heartbeat_interval=HB,
        failure_timeout=FT,
        **node_kwargs,
    )


class ManagerCluster:
    """Node mains for a SimCluster plus handles on the live coordinators."""

    def __init__(self, sim: Simulation, hosts: tuple[str, ...] = HOSTS) -> None:
        self.sim = sim
        self.hosts = hosts
        self.live: dict[str, Node] = {}

    def add_hosts(self, main_for: Callable[[str, tuple[str, ...]], NodeMain]) -> None:
        """Every host into the SimCluster with its node main ``main_for(host, seeds)`` (the
        first host seeds the others), and a client pool beside them. A subclass calls it
        once the records its mains write into exist."""
        for i, host in enumerate(self.hosts):
            seeds = () if i == 0 else (f"{self.hosts[0]}:7000",)
            self.sim.cluster.add(host, main_for(host, seeds))
        self.client = ConnectionPool(
            self.sim.network.transport("client"), SECRET, name="client", connect_timeout=1.0
        )

    def manager_node(
        self,
        node: ClusterNode,
        host: str,
        seeds: tuple[str, ...],
        services: tuple[str, ...],
        **node_kwargs: Any,
    ) -> tuple[Node, Coordinator]:
        """``host``'s Node and its coordinator: the coordinator record lives in the host's
        simulated disk too, and record ids come from the simulation's seed (a run replays)."""
        disk = node.disk
        ids = self.sim.fork_rng(f"ids/{host}/{node.incarnation}")
        n = sim_node(
            node,
            host,
            seeds,
            services,
            state_store=disk.setdefault("coordinator", MemoryStateStore()),
            id_factory=lambda: f"{ids.getrandbits(64):016x}",
            **node_kwargs,
        )
        coord = n.coordinator
        assert coord is not None
        return n, coord

    async def serve(self, host: str, node: ClusterNode, n: Node) -> None:
        """Start ``n`` and run until the simulator crashes the host (kill -9: every task is
        cancelled)."""
        await n.start()
        self.live[host] = n
        node.serving(n.address)
        await asyncio.get_running_loop().create_future()

    async def start(self) -> None:
        await self.sim.cluster.start()
        await wait_until(self.all_voters, 20)

    def all_voters(self) -> bool:
        """Every host live and a voter in the master's committed state (the managers that
        joined the founder have been admitted)."""
        master = self.master()
        if master is None or len(self.live) != len(self.hosts):
            return False
        return set(self.coord(master).state.voters) == set(self.hosts)

    def coord(self, host: str) -> Coordinator:
        c = self.live[host].coordinator
        assert c is not None
        return c

    def master(self) -> str | None:
        masters = [h for h in self.live if self.coord(h).is_master]
        return masters[0] if len(masters) == 1 else None

    async def crash(self, host: str, power_off: bool = False) -> None:
        """kill -9 (peers get a reset) or, with ``power_off``, silence (they time out)."""
        self.live.pop(host, None)  # a dead node's last Node object must not answer checks
        await self.sim.cluster.crash(host, power_off=power_off)

    async def restart(self, host: str) -> None:
        self.live.pop(host, None)
        await self.sim.cluster.restart(host)
        await wait_until(lambda: host in self.live, 2)

    def converged(self) -> bool:
        if len(self.live) != len(self.hosts) or self.master() is None:
            return False
        return len({version(self.coord(h).state) for h in self.hosts}) == 1
