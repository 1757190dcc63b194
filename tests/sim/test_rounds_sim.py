"""The pipeline's stability rounds under crashes: the driver runs ``RoundMachine`` against
real indexers and the real timekeeper (``rounds_harness.py``) while writes arrive and the
indexers and the driver crash and restart (kill -9 or power-off); after every stability TS
the timekeeper publishes, the oracle checks every published index at it. A failing seed
replays exactly (``SHARDEX_SIM_SEED=N``)."""

from __future__ import annotations

import asyncio

import pytest
from rounds_harness import DRIVER, INDEXERS, TIMEKEEPER, Params, World

from shardex.sim import FaultConfig, Simulation, assert_deterministic, run_simulation, sim_seeds
from shardex.testing.index import random_workload


def scenario(params: Params):  # type: ignore[no-untyped-def]
    async def main(sim: Simulation) -> World:
        world = World(sim, params, sim.fork_rng("rounds"))
        world.add_nodes()
        await sim.cluster.start(*INDEXERS, TIMEKEEPER, DRIVER)
        loop = asyncio.get_running_loop()
        writer = loop.create_task(world.writer())
        if params.chaos:
            await world.chaos(until=loop.time() + 20.0)
        await writer
        await world.caught_up(timeout=120.0)
        # Publishing is best effort (a publish on a connection a crash broke is lost): two
        # more rounds after the faults, the first clearing such connections, and the second
        # reaches every (restarted) indexer.
        for _ in range(2):
            random_workload(world.ks, world.rng, 5)
            await world.caught_up(timeout=120.0)
        await world.check_told()
        sim.cluster.check()
        return world

    return main


@pytest.mark.parametrize("seed", sim_seeds(6))
def test_rounds_under_crashes_match_the_oracle(seed: int) -> None:
    world = run_simulation(scenario(Params()), seed, FaultConfig())
    assert world.crashes, "the scenario crashed nothing"
    assert len(world.published) >= 2, f"too few stability TSs checked: {world.published}"
    assert world.published[-1] == world.ks.ts()


def test_rounds_without_faults_publish_every_round() -> None:
    world = run_simulation(scenario(Params(chaos=False)), 11, FaultConfig())
    assert not world.failed
    assert len(world.published) >= 5


def test_a_seed_replays_exactly() -> None:
    assert_deterministic(scenario(Params(writes=10)), 3, FaultConfig)


@pytest.mark.parametrize("seed", sim_seeds(4))
def test_rounds_with_replicas_under_crashes_match_the_oracle(seed: int) -> None:
    """Index replicas: rounds go on without an indexer that does not answer when every
    partition it holds has another copy; its copies leave the topology before the TS is
    published; every copy left in the topology equals its primary at every published TS."""
    world = run_simulation(scenario(Params(num_replica=2)), seed, FaultConfig())
    assert world.crashes, "the scenario crashed nothing"
    assert world.published[-1] == world.ks.ts()
    for index_id, topos in world.state.index_topologies.items():
        for t in topos[1:]:
            # A topology change only ever takes copies out: every partition keeps one.
            assert sorted(t.assignment) == sorted(topos[0].assignment), index_id
            for p in t.assignment:
                assert set(t.chain(p)) < set(topos[0].chain(p)) or t.chain(p) == topos[0].chain(p)


def killed_scenario(params: Params, victim: str):  # type: ignore[no-untyped-def]
    """Writes run; ``victim`` is killed (kill -9) after 1 s and stays down until the driver
    has caught up twice more (or gave up after 30 s), then comes back."""

    async def main(sim: Simulation) -> tuple[World, float, float]:
        world = World(sim, params, sim.fork_rng("rounds"))
        world.add_nodes()
        await sim.cluster.start(*INDEXERS, TIMEKEEPER, DRIVER)
        loop = asyncio.get_running_loop()
        writer = loop.create_task(world.writer())
        await asyncio.sleep(1.0)
        await sim.cluster.crash(victim)
        killed = loop.time()
        if params.num_replica:
            await writer
            await world.caught_up(timeout=60.0)  # with the victim down
        else:
            await asyncio.sleep(10.0)
        back = loop.time()
        await sim.cluster.restart(victim)
        await writer
        for _ in range(2):
            random_workload(world.ks, world.rng, 5)
            await world.caught_up(timeout=120.0)
        await world.check_told()
        return world, killed, back

    return main


def test_a_dead_indexer_does_not_stop_indexes_with_another_copy() -> None:
    world, killed, back = run_simulation(
        killed_scenario(Params(chaos=False, num_replica=1), "i2"), 5, FaultConfig()
    )
    held = {i for i, t in world.state.index_topologies.items() if "i2" in t[0].copy_nodes()}
    assert held, "the victim held no copy: the scenario tests nothing"
    # Every index was published while the victim was down, its copies taken out first.
    down = [ids for when, _ts, ids in world.publications if killed < when < back]
    every = {d.id for d in world.definitions}
    assert down and set(down[-1]) == every, down[-1:]
    assert world.missed_rounds > 0
    assert {i for i, _p, n in world.coordinator.dropped if n == "i2"} == held
    for topos in world.state.index_topologies.values():
        assert "i2" not in topos[-1].copy_nodes()  # never re-added (no rebalance here)
    assert world.published[-1] == world.ks.ts()


def test_a_dead_indexer_without_replicas_stops_only_its_indexes() -> None:
    world, killed, back = run_simulation(
        killed_scenario(Params(chaos=False, writes=20), "i2"), 5, FaultConfig()
    )
    on_victim = {i for i, t in world.state.index_topologies.items() if "i2" in t[-1].nodes()}
    elsewhere = {d.id for d in world.definitions} - on_victim
    assert on_victim and elsewhere, "the scenario needs indexes on and off the victim"
    down = [set(ids) for when, _ts, ids in world.publications if killed + 2.5 < when < back]
    assert down, "nothing was published while the victim was down"
    assert all(ids == elsewhere for ids in down), down
    assert not world.coordinator.dropped  # no copy to fall back on: nothing dropped
    assert world.published[-1] == world.ks.ts()
