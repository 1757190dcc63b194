"""The RPC layer under faults: one scenario (``rpc_scenario``), run over real TCP and simulated."""

from __future__ import annotations

import asyncio

import pytest
from rpc_scenario import SECRET, Params, run_sim, run_tcp, sim_faults

from shardex.net.messages import Ping
from shardex.net.rpc import ConnectionPool, RpcServer
from shardex.sim import FaultConfig, Simulation, assert_deterministic, many_seeds, sim_seeds

MODES = [pytest.param("tcp", seed, id=f"tcp-{seed}") for seed in (0, 1)] + [
    pytest.param("sim", seed, id=f"sim-{seed}") for seed in sim_seeds(12)
]


@pytest.mark.parametrize(("mode", "seed"), MODES)
def test_acknowledged_requests_apply_exactly_once(mode: str, seed: int) -> None:
    """Retries after timeouts, drops, partitions and crashes never apply a request twice, and
    every request is eventually acknowledged with the server's own answer (the checker runs
    inside the scenario)."""
    history = run_tcp(seed) if mode == "tcp" else run_sim(seed)[0]
    assert len(history.acked) == len(history.issued) == 36


def test_the_simulated_faults_really_happen() -> None:
    """Guard against a harness that passes because nothing goes wrong."""
    totals = {"drop": 0, "hold": 0, "reset": 0, "crash": 0, "retries": 0}
    for seed in range(12):
        history, sim = run_sim(seed)
        for kind in ("drop", "hold", "reset", "crash"):
            totals[kind] += sim.trace.count(kind)
        totals["retries"] += history.failures
    assert all(count > 0 for count in totals.values()), totals


def test_the_checker_catches_a_server_without_deduplication() -> None:
    """The same scenario with the dedup table switched off: some seed must apply a retried
    request twice, and the checker must say so (a harness that cannot fail proves nothing)."""
    caught = []
    for seed in range(12):
        try:
            run_sim(seed, Params(dedup=False))
        except AssertionError as e:
            caught.append((seed, str(e)))
    assert caught, "no seed exposed the missing deduplication"
    assert all("applied twice" in message for _, message in caught), caught


def test_the_rpc_scenario_replays_in_process() -> None:
    async def main(sim: Simulation) -> None:
        from rpc_scenario import run_scenario, sim_disturb

        await run_scenario(sim.cluster, sim.rng, sim_disturb, Params())

    assert_deterministic(main, 5, sim_faults, runs=3)


def test_graceful_rpc_server_stop_replays() -> None:
    async def main(sim: Simulation) -> None:
        server = RpcServer(sim.network.transport("s1"), SECRET, name="s1")
        await server.start("s1:7000")
        pools = [
            ConnectionPool(sim.network.transport(f"c{i}"), SECRET, name=f"c{i}") for i in range(8)
        ]
        for pool in pools:
            await pool.request("s1:7000", Ping(), 1.0)
        await server.stop()
        await asyncio.sleep(1)

    assert_deterministic(main, 3, lambda: FaultConfig(trace_payloads=False), runs=3)


@pytest.mark.slow
@pytest.mark.timeout(0)  # the seed count is the caller's choice (SHARDEX_SIM_SEEDS)
def test_exactly_once_many_seeds() -> None:
    """``SHARDEX_SIM_SEEDS=N`` (and ``SHARDEX_SIM_SEED_BASE``) to explore more seeds."""
    for seed in many_seeds(300):
        run_sim(seed)
