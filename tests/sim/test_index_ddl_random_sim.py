"""Index DDL under random faults: two clients stream CREATE / BUILD / DROP (each retried
under its request id) while nodes crash and restart, partitions come and go and frames are
lost; then ``check_coordinator`` and ``check_index_ddl`` (``test_index_ddl_sim.py`` has the
targeted scenarios). Seeds: a few by default, ``SHARDEX_SIM_SEEDS=n`` for more."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from index_ddl_harness import IndexCluster
from manager_cluster import HOSTS, wait_until

from shardex.api.index_ddl import BuildIndex, IndexesBuilding
from shardex.errors import ShardexError
from shardex.meta.index_definition import IndexKey
from shardex.sim import FaultConfig, Simulation, many_seeds, run_simulation

KEYS = [IndexKey(expr="age")]


async def ddl_client(
    c: IndexCluster, rng: Any, cid: int, ops: int, created: dict[str, str]
) -> list[str]:
    """CREATE / BUILD / DROP in a random order, each retried under its request id until it
    is answered; an allocation failure (an indexer died) just means "not created"."""
    loop = asyncio.get_running_loop()
    log: list[str] = []
    mine: list[str] = []
    for i in range(ops):
        roll = rng.random()
        rid = f"c{cid}-{i}"
        start = loop.time()
        while True:
            try:
                if roll < 0.55 or not mine:
                    name = f"ix{cid}_{i}"
                    kw: dict[str, Any] = {"keys": KEYS, "defer_build": rng.random() < 0.3}
                    n = rng.randint(1, 3)
                    if n > 1:
                        kw.update(partition_by=["META().id"], num_partition=n)
                    r = await c.create(name, rid, timeout=20.0, **kw)
                    created[name] = r.index.id
                    mine.append(name)
                    log.append(f"create {name}")
                elif roll < 0.75:
                    name = rng.choice(mine)
                    await c.request(
                        BuildIndex(keyspace="ks", names=[name], request_id=rid),
                        IndexesBuilding,
                        timeout=20.0,
                    )
                    log.append(f"build {name}")
                else:
                    name = mine.pop(rng.randrange(len(mine)))
                    await c.drop(name, rid)
                    created.pop(name, None)
                    log.append(f"drop {name}")
                break
            except ShardexError as exc:
                if exc.details.get("reason") in ("allocation_failed", "no_indexer"):
                    log.append(f"refused {exc.details['reason']}")
                    break
                if loop.time() - start > 300:
                    raise AssertionError(f"{rid} never answered: {exc}") from exc
                await asyncio.sleep(rng.uniform(0.2, 1.0))
        await asyncio.sleep(rng.uniform(0.0, 3.0))
    return log


async def disturb(c: IndexCluster, rng: Any, fault_time: float) -> None:
    loop = asyncio.get_running_loop()
    end = loop.time() + fault_time
    down: list[str] = []
    partitioned = False
    while loop.time() < end:
        await asyncio.sleep(rng.uniform(0.5, 3.0))
        roll = rng.random()
        up = [h for h in HOSTS if h not in down]
        if roll < 0.3 and not down:
            master = c.master()
            victim = master if master and rng.random() < 0.6 else rng.choice(up)
            down.append(victim)
            await c.crash(victim, power_off=rng.random() < 0.3)
        elif roll < 0.55 and down:
            await c.restart(down.pop())
        elif roll < 0.7 and not partitioned and not down:
            c.sim.cluster.partition([rng.choice(HOSTS)])
            partitioned = True
        elif roll < 0.85 and partitioned:
            c.sim.cluster.heal()
            partitioned = False
        else:
            c.sim.network.break_connections(rng.choice(HOSTS))
    c.sim.cluster.heal()
    for host in down:
        await c.restart(host)


def random_scenario(ops: int, fault_time: float) -> Any:
    async def main(sim: Simulation) -> dict[str, Any]:
        c = IndexCluster(sim)
        await c.start()
        created: dict[str, str] = {}
        loop = asyncio.get_running_loop()
        clients = [
            loop.create_task(ddl_client(c, sim.fork_rng(f"client{i}"), i, ops, created))
            for i in range(2)
        ]
        await disturb(c, sim.fork_rng("faults"), fault_time)
        logs = await asyncio.gather(*clients)
        await wait_until(c.settled, 60)
        final = c.check(created=created)
        assert {r.name for r in final.indexes.values()} == set(created)
        return {"logs": logs, "indexes": len(final.indexes)}

    return main


@pytest.mark.parametrize("seed", many_seeds(3))
def test_random_faults(seed: int) -> None:
    faults = FaultConfig(drop_rate=0.002, latency_mean=0.002, latency_max=0.05)
    result = run_simulation(random_scenario(8, 30.0), seed, faults)
    assert any(log for log in result["logs"])


@pytest.mark.slow
@pytest.mark.parametrize("seed", many_seeds(100))
def test_random_faults_many_seeds(seed: int) -> None:
    faults = FaultConfig(drop_rate=0.003, latency_mean=0.003, latency_max=0.1)
    run_simulation(random_scenario(14, 60.0), seed, faults)
