"""Membership under the simulator: the real ``Node`` (RPC server + membership) on a simulated
network in virtual time. Crash, restart, partition; detection bounds checked in virtual time."""

from __future__ import annotations

import asyncio
from collections.abc import Iterable

import pytest
from manager_cluster import FT, HB, HOSTS, SECRET, sim_node, wait_until

from shardex.api.membership import MembersReply, MembersRequest
from shardex.errors import ShardexError
from shardex.manager.membership import Membership, list_digest, merge_members
from shardex.meta.member_list import MemberInfo
from shardex.net import connect
from shardex.node.server import Node
from shardex.sim import ClusterNode, FaultConfig, Simulation, run_simulation, sim_seeds

BOUND = FT + 2 * HB  # the stated failure-detection bound


class SimNodes:
    """Node mains for a SimCluster plus handles on the live ``Node`` objects."""

    def __init__(self, sim: Simulation) -> None:
        self.sim = sim
        self.live: dict[str, Node] = {}

    def add(self, host: str, seeds: Iterable[str] = (), services: Iterable[str] = ()) -> None:
        seeds, services = tuple(seeds), tuple(services) or ("data", "index", "query", "manager")

        async def main(node: ClusterNode) -> None:
            # A new incarnation keeps the first one's member id (the disk survives crashes).
            first_id = f"{host}-id{node.incarnation}"
            n = sim_node(node, host, seeds, services, first_member_id=first_id)
            await n.start()
            self.live[host] = n
            node.serving(n.address)
            # Runs until the simulator crashes the host (all its tasks are cancelled, no
            # cleanup runs: that is kill -9).
            await asyncio.get_running_loop().create_future()

        self.sim.cluster.add(host, main)

    async def crash(self, host: str) -> None:
        self.live.pop(host, None)  # a dead node's last Node object must not answer checks
        await self.sim.cluster.crash(host)

    async def restart(self, host: str) -> None:
        self.live.pop(host, None)
        await self.sim.cluster.restart(host)
        await wait_until(lambda: host in self.live, 1)

    def m(self, host: str) -> Membership:
        membership = self.live[host].membership
        assert membership is not None
        return membership

    def state(self, observer: str, member: str) -> str | None:
        if observer not in self.live:
            return None
        for m in self.m(observer).view().members:
            if m.name == member:
                return m.state
        return None

    def all_see(self, observers: Iterable[str], member: str, state: str) -> bool:
        return all(self.state(o, member) == state for o in observers)


async def start_three(sim: Simulation) -> SimNodes:
    nodes = SimNodes(sim)
    nodes.add("n1")
    nodes.add("n2", seeds=["n1:7000"])
    nodes.add("n3", seeds=["n1:7000"])
    await sim.cluster.start()
    # Pessimistic start: a member is "up" only once heard from, so this waits for heartbeats.
    await wait_until(
        lambda: len(nodes.live) == 3 and all(nodes.all_see(HOSTS, h, "up") for h in HOSTS), 10
    )
    return nodes


@pytest.mark.parametrize("seed", sim_seeds(6))
def test_crash_is_detected_within_bound_and_restart_rejoins(seed: int) -> None:
    async def main(sim: Simulation) -> None:
        nodes = await start_three(sim)
        loop = asyncio.get_running_loop()
        # Any node may die, the founder (no seed) included, at any phase of the heartbeats.
        victim = sim.rng.choice(HOSTS)
        others = [h for h in HOSTS if h != victim]
        await asyncio.sleep(sim.rng.uniform(0, HB))
        version = nodes.m("n1").version

        crashed_at = loop.time()
        await nodes.crash(victim)
        waited = await wait_until(lambda: nodes.all_see(others, victim, "down"), BOUND + 1)
        assert waited <= BOUND, f"{victim} marked down after {waited:.3f}s > {BOUND}s"
        # Only silence marks a member down: never before failure_timeout minus one period.
        assert waited >= FT - HB, f"{victim} marked down too early ({waited:.3f}s)"
        assert loop.time() - crashed_at == pytest.approx(waited, abs=0.06)
        assert all(nodes.all_see(others, h, "up") for h in others)

        await nodes.restart(victim)
        back = await wait_until(lambda: nodes.all_see(HOSTS, victim, "up"), 2 * HB + 1)
        assert back <= 2 * HB + 0.5
        await wait_until(lambda: all(nodes.all_see([victim], h, "up") for h in HOSTS), 2 * HB + 1)
        for h in HOSTS:
            m = nodes.m(h)
            # Re-join with the persisted identity is idempotent: same ids, same version.
            assert [x.member_id for x in m.members] == ["n1-id1", "n2-id1", "n3-id1"]
            assert m.version == version == 3

        # The view as any client sees it, over the (simulated) wire.
        client = sim.network.transport("client")
        conn = await connect(client, f"{others[0]}:7000", SECRET, name="client")
        reply = await conn.request(MembersRequest(), 1.0, expect=MembersReply)
        await conn.close()
        assert reply.observer == others[0] and reply.version == 3
        assert {m.name: m.state for m in reply.members} == {h: "up" for h in HOSTS}
        sim.cluster.check()

    run_simulation(main, seed)


@pytest.mark.parametrize("seed", sim_seeds(3))
def test_no_false_suspicion_under_mild_faults(seed: int) -> None:
    """Lost frames break connections; heartbeats reconnect. Nobody alive is ever marked down,
    yet a crash is still found within the bound."""
    faults = FaultConfig(drop_rate=0.01, latency_mean=0.005, latency_max=0.1)

    async def main(sim: Simulation) -> None:
        nodes = await start_three(sim)
        for _ in range(int(60 / 0.1)):  # one virtual minute, checked every 100 ms
            await asyncio.sleep(0.1)
            for o in HOSTS:
                for h in HOSTS:
                    assert nodes.state(o, h) == "up", f"{o} suspects {h} at {sim.loop.time()}"
        assert sim.trace.count("drop") > 0  # the faults really happened
        await nodes.crash("n2")
        waited = await wait_until(lambda: nodes.all_see(["n1", "n3"], "n2", "down"), BOUND + 1)
        assert waited <= BOUND + 0.1  # + worst one-way latency of the last heartbeat
        sim.cluster.check()

    run_simulation(main, seed, faults)


@pytest.mark.parametrize("seed", sim_seeds(3))
def test_restart_while_seed_is_down_rejoins_through_a_known_member(seed: int) -> None:
    async def main(sim: Simulation) -> None:
        nodes = await start_three(sim)
        await nodes.crash("n1")  # n2 and n3 joined through it
        await nodes.crash("n2")
        await nodes.restart("n2")  # its seed is dead: it must use its member list
        await wait_until(lambda: nodes.m("n2").joined.is_set(), 5)
        await wait_until(lambda: nodes.all_see(["n2", "n3"], "n2", "up"), 2 * HB + 1)
        await wait_until(lambda: nodes.all_see(["n2", "n3"], "n3", "up"), 2 * HB + 1)
        await wait_until(lambda: nodes.all_see(["n2", "n3"], "n1", "down"), BOUND + 1)
        await nodes.restart("n1")  # the founder comes back without any seed
        await wait_until(lambda: all(nodes.all_see(HOSTS, h, "up") for h in HOSTS), 2 * HB + 1)
        sim.cluster.check()

    run_simulation(main, seed)


@pytest.mark.parametrize("seed", sim_seeds(3))
def test_partition_and_heal(seed: int) -> None:
    async def main(sim: Simulation) -> None:
        nodes = await start_three(sim)
        sim.cluster.partition(["n3"])
        waited = await wait_until(
            lambda: (
                nodes.all_see(["n1", "n2"], "n3", "down")
                and nodes.all_see(["n3"], "n1", "down")
                and nodes.all_see(["n3"], "n2", "down")
            ),
            BOUND + 1,
        )
        assert waited <= BOUND
        sim.cluster.heal()
        await wait_until(lambda: all(nodes.all_see(HOSTS, h, "up") for h in HOSTS), 3 * HB)
        sim.cluster.check()

    run_simulation(main, seed)


@pytest.mark.parametrize("seed", sim_seeds(3))
def test_concurrent_joins_through_different_seeds_converge(seed: int) -> None:
    """n3 joins through n2 while n2 itself is still joining through n1: the digest exchange on
    heartbeats must still give every node the same member list."""

    async def main(sim: Simulation) -> None:
        nodes = SimNodes(sim)
        nodes.add("n1")
        nodes.add("n2", seeds=["n1:7000"])
        nodes.add("n3", seeds=["n2:7000"])
        nodes.add("n4", seeds=["n1:7000"], services=["data"])  # not a manager
        # Seeded with a non-manager: it refuses the join and names the managers instead.
        nodes.add("n5", seeds=["n4:7000"])
        await sim.cluster.start()
        hosts = ("n1", "n2", "n3", "n4", "n5")

        def converged() -> bool:
            if len(nodes.live) < 5:
                return False
            digests = {nodes.m(h).digest for h in hosts}
            return len(digests) == 1 and len(nodes.m("n1").members) == 5

        await wait_until(converged, 10)
        await wait_until(
            lambda: all(nodes.all_see(("n1", "n2", "n3", "n5"), h, "up") for h in hosts), 5
        )
        # A non-manager sees the managers (through their acks) but cannot judge other
        # non-managers: nobody heartbeats them.
        assert nodes.state("n4", "n1") == "up" and nodes.state("n4", "n4") == "up"
        assert nodes.state("n4", "n5") == "up"  # a manager: n4 hears its acks
        assert nodes.m("n5").joined.is_set()
        sim.cluster.check()

    run_simulation(main, seed)


def test_same_seed_replays_exactly() -> None:
    """Membership adds no hidden nondeterminism: two runs of one seed give one trace.
    (Frame payloads are left out of the digest: auth nonces come from ``secrets``.)"""

    def once() -> str:
        async def main(sim: Simulation) -> None:
            nodes = await start_three(sim)
            await nodes.crash("n2")
            await wait_until(lambda: nodes.all_see(["n1", "n3"], "n2", "down"), BOUND + 1)
            await nodes.restart("n2")
            await wait_until(lambda: all(nodes.all_see(HOSTS, h, "up") for h in HOSTS), 5)

        sim = Simulation(7, FaultConfig(drop_rate=0.005, trace_payloads=False))
        sim.run(main)
        return sim.trace.digest

    assert once() == once()


def test_merge_is_order_independent() -> None:
    a1 = MemberInfo(member_id="a", name="a", address="h:1", services=("manager",))
    a2 = MemberInfo(member_id="a", name="a", address="h:9", services=("manager",), incarnation=2)
    b1 = MemberInfo(member_id="b", name="b", address="h:2", services=("data",))
    lists = [[a1], [a2, b1], [b1], [a1, b1]]
    results = set()
    for order in (lists, lists[::-1], [lists[2], lists[0], lists[3], lists[1]]):
        merged: dict[str, MemberInfo] = {}
        for lst in order:
            merged = merge_members(merged, lst)
        results.add(list_digest(merged.values()))
        assert merged["a"] == a2  # the higher incarnation wins
    assert len(results) == 1


@pytest.mark.parametrize("seed", sim_seeds(3))
def test_a_removed_member_stays_removed_across_gossip_and_its_restart(seed: int) -> None:
    """``Membership.remove`` (the end of an eject): the tombstone reaches every member and the
    removed node itself, and neither gossip nor the removed node restarting (its persisted
    list, its old entry) brings it back."""

    async def main(sim: Simulation) -> None:
        nodes = SimNodes(sim)
        nodes.add("n1")
        nodes.add("n2", seeds=["n1:7000"])
        nodes.add("n3", seeds=["n1:7000"])
        nodes.add("n4", seeds=["n1:7000"], services=["data"])
        await sim.cluster.start()
        managers = ["n1", "n2", "n3"]
        await wait_until(lambda: len(nodes.live) == 4 and nodes.all_see(managers, "n4", "up"), 10)
        tomb = nodes.m(sim.rng.choice(managers)).remove("n4")
        assert tomb.removed

        def settled() -> bool:
            lists = {h: [m.name for m in nodes.m(h).members] for h in managers}
            digests = {nodes.m(h).digest for h in [*managers, "n4"]}
            return (
                all(v == managers for v in lists.values())
                and nodes.m("n4").removed
                and len(digests) == 1
            )

        await wait_until(settled, 3 * HB + 1)
        assert all(nodes.state(h, "n4") is None for h in managers)  # not in any view
        await nodes.restart("n4")  # its disk keeps the tombstone: it does not come back
        assert nodes.m("n4").removed
        await asyncio.sleep(3 * HB)
        assert settled() and all(nodes.state(h, "n4") is None for h in managers)
        with pytest.raises(ShardexError) as e:
            nodes.m("n1").remove("n4")  # not a member any more
        assert e.value.details["node"] == "n4"
        sim.cluster.check()

    run_simulation(main, seed)
