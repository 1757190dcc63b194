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
