"""The replicated coordinator under the simulator: 3 manager nodes running the real Node
(RPC server + membership + coordinator) on a simulated network in virtual time.

The test op ``AppendItem`` adds one ``KeyspaceMeta`` whose name is ``<item>@<cas>``, so a
double apply is visible as two entries for one item. Targeted scenarios follow the DDL flow's
failure notes; ``test_random_faults`` streams ops through random crashes (master and
replicas), restarts, partitions and drops, and ends with ``check_coordinator``.
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import Callable
from dataclasses import dataclass, field

import msgspec
import pytest
from manager_cluster import FT, HB, HOSTS, ManagerCluster, version, wait_until

from shardex.errors import ErrorCode, ShardexError
from shardex.manager.coordinator import OpContext, StateReply, StateRequest
from shardex.meta.state import KeyspaceMeta, StateContext, state_digest
from shardex.net.messages import Message
from shardex.sim import (
    ClusterNode,
    FaultConfig,
    NodeMain,
    Simulation,
    many_seeds,
    run_simulation,
    sim_seeds,
)
from shardex.testing.checkers_coordinator import Version, check_coordinator


class AppendItem(Message, tag="coordtest.AppendItem"):
    item: str
    request_id: str | None = None


class ItemAppended(Message, tag="coordtest.ItemAppended"):
    item: str
    key: str
    cas: int
    uuid: str


def items_of(state: StateContext) -> dict[str, list[str]]:
    """item -> every key the state holds for it (more than one = applied twice)."""
    out: dict[str, list[str]] = {}
    for key in state.keyspaces:
        out.setdefault(key.rsplit("@", 1)[0], []).append(key)
    return out


async def append_item(msg: AppendItem, ctx: OpContext) -> ItemAppended:
    state = ctx.state
    key = f"{msg.item}@{state.cas + 1}"
    meta = KeyspaceMeta(name=key, num_partitions=1, uuid=ctx.new_id(), created_cas=state.cas + 1)
    new = msgspec.structs.replace(state, keyspaces={**state.keyspaces, key: meta})
    reply = ItemAppended(item=msg.item, key=key, cas=state.cas + 1, uuid=meta.uuid)
    committed = await ctx.commit(new, reply=reply)
    return msgspec.structs.replace(reply, cas=committed.cas)


@dataclass
class Records:
    commits: list[tuple[str, Version]] = field(default_factory=list)
    applies: dict[str, list[Version]] = field(default_factory=dict)
    recoveries: list[tuple[str, int, float]] = field(default_factory=list)  # host, epoch, time
    ops_run: list[tuple[str, int, float]] = field(default_factory=list)


class Cluster(ManagerCluster):
    """The three managers with the test op registered and every apply and commit recorded."""

    def __init__(self, sim: Simulation, hosts: tuple[str, ...] = HOSTS) -> None:
        super().__init__(sim, hosts)
        self.rec = Records()
        self.add_hosts(self._main)

    def _main(self, host: str, seeds: tuple[str, ...]) -> NodeMain:
        rec = self.rec

        async def main(node: ClusterNode) -> None:
            n, coord = self.manager_node(node, host, seeds, ("manager",))
            loop = asyncio.get_running_loop()

            async def op(msg: AppendItem, ctx: OpContext) -> ItemAppended:
                rec.ops_run.append((host, ctx.epoch, loop.time()))
                return await append_item(msg, ctx)

            async def recovery(ctx: OpContext) -> None:
                rec.recoveries.append((host, ctx.epoch, loop.time()))

            coord.register_op(AppendItem, op)
            coord.register_recovery(recovery)
            applies = rec.applies.setdefault(host, [])
            coord.on_change(lambda s: applies.append(version(s)))
            coord.on_commit(lambda s: rec.commits.append((host, version(s))))
            await self.serve(host, node, n)

        return main

    async def op(
        self, host: str, item: str, request_id: str | None = None, timeout: float = 30.0
    ) -> ItemAppended:
        msg = AppendItem(item=item, request_id=request_id)
        return await self.client.request(f"{host}:7000", msg, timeout, expect=ItemAppended)

    async def read(self, host: str, **kw: object) -> StateReply:
        msg = StateRequest(**kw)  # type: ignore[arg-type]
        return await self.client.request(f"{host}:7000", msg, 30.0, expect=StateReply)

    def check(self, acked: dict[str, str], issued: list[str] | None = None) -> StateContext:
        final = self.coord(self.hosts[0]).state
        final_ops = {
            item: keys for item, keys in items_of(final).items() if not item.startswith("_")
        }
        check_coordinator(
            commits=self.rec.commits,
            applies=self.rec.applies,
            finals={h: version(self.coord(h).state) for h in self.hosts},
            acked=acked,
            final_ops=final_ops,
            issued=issued,
        )
        self.sim.cluster.check()
        return final


@pytest.mark.parametrize("seed", sim_seeds(3))
def test_ops_forwarded_replicated_and_deduplicated(seed: int) -> None:
    async def main(sim: Simulation) -> None:
        c = Cluster(sim)
        await c.start()
        master = c.master()
        assert master == "n1"  # nobody had a term: the smallest name
        acked: dict[str, str] = {}
        for i, host in enumerate(["n3", "n2", "n1", "n3"]):  # through replicas and master
            reply = await c.op(host, f"i{i}", request_id=f"r{i}")
            acked[f"i{i}"] = reply.key
        # Synchronous replication: every replica already holds the acknowledged state.
        states = {version(c.coord(h).state) for h in HOSTS}
        assert len(states) == 1
        cas = c.coord("n1").state.cas
        # A retried request id returns the stored reply and changes nothing.
        again = await c.op("n2", "i1", request_id="r1")
        assert again.key == acked["i1"] and c.coord("n1").state.cas == cas
        # Reads from any node; a subset of sections; a fresh read through the master.
        reply = await c.read("n3", sections=["keyspaces"])
        assert reply.node == "n3" and reply.master == "n1" and not reply.is_master
        assert reply.state.cas == cas and not reply.state.applied_requests
        assert sorted(items_of(reply.state)) == ["i0", "i1", "i2", "i3"]
        fresh = await c.read("n2", fresh=True)
        assert fresh.node == "n1" and fresh.is_master and fresh.state.cas == cas
        with pytest.raises(ShardexError) as err:
            await c.read("n2", sections=["nope"])
        assert err.value.code is ErrorCode.BAD_REQUEST
        c.check(acked)

    run_simulation(main, seed)


@pytest.mark.parametrize("seed", sim_seeds(3))
def test_master_crash_failover_recovery_and_rejoin(seed: int) -> None:
    async def main(sim: Simulation) -> None:
        c = Cluster(sim)
        await c.start()
        acked = {"a": (await c.op("n2", "a", "ra")).key}
        await c.crash("n1")
        crashed_at = sim.loop.time() if sim.loop else 0.0
        # The op waits out the failover on n3 and runs on the new master.
        reply = await c.op("n3", "b", "rb")
        acked["b"] = reply.key
        assert c.master() == "n2"
        took = sim.loop.time() - crashed_at if sim.loop else 0.0
        assert took <= FT + 2 * HB + 3.0, f"failover took {took:.2f}s"
        # Recovery hooks ran on n2 for its term before any op ran there.
        epoch = c.coord("n2").epoch
        rec_time = [t for h, e, t in c.rec.recoveries if h == "n2" and e == epoch]
        op_times = [t for h, e, t in c.rec.ops_run if h == "n2" and e == epoch]
        assert rec_time and op_times and rec_time[0] <= min(op_times)
        # The old master rejoins, takes the new state, and does not take mastership back.
        await c.restart("n1")
        await wait_until(c.converged, 10)
        assert c.master() == "n2"
        acked["c"] = (await c.op("n1", "c", "rc")).key
        await wait_until(c.converged, 5)
        c.check(acked)

    run_simulation(main, seed)


@pytest.mark.parametrize("seed", sim_seeds(3))
def test_rack_failure_no_failover_then_resync(seed: int) -> None:
    """The DDL flow's second note. Master and a replica holding the newest state die together:
    the survivor alone is a minority and must not take over (no automatic failover with more
    than one node down), so ops fail with a clear error instead of running on a stale state.
    When one of the lost nodes returns, the new master continues from the newest state and
    the rest resynchronise."""

    async def main(sim: Simulation) -> None:
        c = Cluster(sim)
        await c.start()
        acked = {"a": (await c.op("n1", "a", "ra")).key}
        sim.cluster.partition(["n3"])  # n3 misses the next change
        await wait_until(lambda: "n3" not in c.coord("n1")._group.up_voters(), FT + 2)
        acked["b"] = (await c.op("n1", "b", "rb")).key  # held by n1 and n2 only
        assert items_of(c.coord("n3").state).keys() == {"a"}
        await c.crash("n1")
        await c.crash("n2")
        sim.cluster.heal()
        with pytest.raises(ShardexError) as err:
            await c.op("n3", "x", "rx")
        assert err.value.code is ErrorCode.NODE_UNAVAILABLE
        assert err.value.details["reason"] == "no_master"
        assert not c.coord("n3").is_master
        await c.restart("n2")
        await wait_until(lambda: c.master() == "n2", FT + 5)
        assert items_of(c.coord("n2").state).keys() == {"a", "b"}
        await wait_until(lambda: version(c.coord("n3").state) == version(c.coord("n2").state), 5)
        await c.restart("n1")
        await wait_until(c.converged, 10)
        c.check(acked, issued=["a", "b", "x"])

    run_simulation(main, seed)


@pytest.mark.parametrize("seed", sim_seeds(3))
def test_isolated_master_fails_commit_and_divergent_change_is_replaced(seed: int) -> None:
    """An isolated master persists a change it cannot replicate: the commit fails (outcome
    unknown), the majority side elects n2 and commits other changes at the same cas; when
    the partition heals n1 holds an older term's state at that cas, refuses the new master's
    state, and the master commits above it so n1 converges without its lost change."""

    async def main(sim: Simulation) -> None:
        c = Cluster(sim)
        await c.start()
        acked = {"a": (await c.op("n1", "a", "ra")).key}
        base = c.coord("n1").state.cas
        sim.cluster.partition(["n2", "n3"])  # the client stays with n1
        with pytest.raises(ShardexError) as err:
            await c.op("n1", "lost")  # no request id: not retried
        assert err.value.details["reason"] == "commit_failed"
        lost = c.coord("n1").state
        assert lost.cas == base + 1 and "lost" in items_of(lost)
        await wait_until(lambda: c.coord("n2").is_master, FT + 5)
        promoted = c.coord("n2").state
        assert promoted.cas == lost.cas and promoted.epoch > lost.epoch  # same cas, other term
        sim.cluster.heal()  # n1 returns before anything else is committed
        await wait_until(c.converged, 10)
        settled = c.coord("n1").state
        assert settled.cas > lost.cas and "lost" not in items_of(settled)
        acked["b"] = (await c.op("n2", "b", "rb")).key
        await wait_until(c.converged, 10)
        final = c.check(acked, issued=["a", "b", "lost"])
        assert "lost" not in items_of(final)

    run_simulation(main, seed)


@pytest.mark.parametrize("seed", sim_seeds(2))
def test_single_manager_is_its_own_majority(seed: int) -> None:
    async def main(sim: Simulation) -> None:
        c = Cluster(sim, hosts=("solo",))
        await sim.cluster.start()
        await wait_until(lambda: "solo" in c.live and c.coord("solo").is_master, 5)
        acked = {"a": (await c.op("solo", "a", "ra")).key}
        await c.crash("solo")
        await c.restart("solo")
        await wait_until(lambda: c.coord("solo").is_master, 5)
        assert "a" in items_of(c.coord("solo").state)  # persisted
        c.check(acked)

    run_simulation(main, seed)


# --- random faults ---------------------------------------------------------------------


@dataclass
class Workload:
    clients: int = 2
    ops_per_client: int = 12
    fault_time: float = 40.0  # virtual seconds of faults
    give_up_after: float = 300.0


async def run_client(
    c: Cluster, rng: random.Random, cid: int, w: Workload, acked: dict[str, str], issued: list[str]
) -> None:
    loop = asyncio.get_running_loop()
    for i in range(w.ops_per_client):
        item = f"c{cid}-{i}"
        issued.append(item)
        start = loop.time()
        while True:
            host = rng.choice(HOSTS)
            try:
                reply = await c.op(host, item, request_id=f"req-{item}", timeout=20.0)
            except ShardexError:
                if loop.time() - start > w.give_up_after:
                    raise AssertionError(f"op {item} never acknowledged") from None
                await asyncio.sleep(rng.uniform(0.1, 1.0))
                continue
            acked[item] = reply.key
            break
        # Spread the stream over the whole fault window.
        await asyncio.sleep(rng.uniform(0.0, 2 * w.fault_time / w.ops_per_client))


async def disturb(c: Cluster, rng: random.Random, w: Workload) -> None:
    loop = asyncio.get_running_loop()
    sim = c.sim
    end = loop.time() + w.fault_time
    down: list[str] = []
    partitioned = False
    while loop.time() < end:
        await asyncio.sleep(rng.uniform(0.3, 3.0))
        roll = rng.random()
        up = [h for h in HOSTS if h not in down]
        if roll < 0.3 and len(down) < 2:
            master = c.master()
            victim = master if master and rng.random() < 0.6 else rng.choice(up)
            down.append(victim)
            await c.crash(victim, power_off=rng.random() < 0.3)
        elif roll < 0.55 and down:
            await c.restart(down.pop(rng.randrange(len(down))))
        elif roll < 0.7 and not partitioned:
            sim.cluster.partition([rng.choice(HOSTS)])
            partitioned = True
        elif roll < 0.85 and partitioned:
            sim.cluster.heal()
            partitioned = False
        else:
            sim.network.break_connections(rng.choice(HOSTS))
    sim.cluster.heal()
    for host in down:
        await c.restart(host)


def random_scenario(w: Workload) -> Callable[[Simulation], object]:
    async def main(sim: Simulation) -> dict[str, object]:
        c = Cluster(sim)
        await c.start()
        acked: dict[str, str] = {}
        issued: list[str] = []
        clients = [
            asyncio.get_running_loop().create_task(
                run_client(c, sim.fork_rng(f"client{i}"), i, w, acked, issued)
            )
            for i in range(w.clients)
        ]
        await disturb(c, sim.fork_rng("faults"), w)
        await asyncio.gather(*clients)
        await wait_until(c.converged, 30)
        await asyncio.sleep(2.0)  # let stragglers land, then look again
        await wait_until(c.converged, 30)
        final = c.check(acked, issued)
        assert len(acked) == w.clients * w.ops_per_client
        return {"digest": state_digest(final), "commits": len(c.rec.commits)}

    return main


@pytest.mark.parametrize("seed", sim_seeds(6))
def test_random_faults(seed: int) -> None:
    faults = FaultConfig(drop_rate=0.002, latency_mean=0.002, latency_max=0.05)
    result = run_simulation(random_scenario(Workload()), seed, faults)
    assert result["commits"]


@pytest.mark.slow
@pytest.mark.parametrize("seed", many_seeds(200))
def test_random_faults_many_seeds(seed: int) -> None:
    faults = FaultConfig(drop_rate=0.003, latency_mean=0.003, latency_max=0.1)
    run_simulation(random_scenario(Workload(ops_per_client=20, fault_time=80.0)), seed, faults)


def test_same_seed_replays_exactly() -> None:
    def once() -> tuple[str, object]:
        sim = Simulation(11, FaultConfig(drop_rate=0.002, trace_payloads=False))
        result = sim.run(random_scenario(Workload(ops_per_client=6, fault_time=20.0)))
        return sim.trace.digest, result

    assert once() == once()
