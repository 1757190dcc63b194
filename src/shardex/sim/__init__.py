"""Deterministic simulation: shardex services on a simulated network in virtual time.

Services are written against ``shardex.net.transport`` and the running loop's clock, so the same
code runs over ``TcpTransport`` and over ``SimTransport``. A run is a pure function of its seed:
latencies, drops, refused connects, and every choice a scenario makes come from RNGs derived
from the seed, and time only moves when the loop has nothing left to do before its next timer.

    def test_thing(seed):
        async def main(sim: Simulation) -> None:
            sim.cluster.add("s1", server_main)
            await sim.cluster.start()
            ...
        run_simulation(main, seed, FaultConfig(drop_rate=0.01))
"""

from shardex.sim.cluster import ClusterNode, NodeMain, SimCluster, TcpCluster
from shardex.sim.comm import SimComm
from shardex.sim.loop import (
    SimLoop,
    SimulationError,
    SimulationStalled,
    SimulationTimeLimit,
    current_host,
    run_on_sim_loop,
)
from shardex.sim.network import FaultConfig, SimNetwork
from shardex.sim.runner import Simulation, assert_deterministic, run_simulation
from shardex.sim.testing import many_seeds, replay_hint, sim_seeds
from shardex.sim.trace import Trace, TraceEvent
from shardex.sim.transport import SimListener, SimTransport

__all__ = [
    "ClusterNode",
    "FaultConfig",
    "NodeMain",
    "SimCluster",
    "SimComm",
    "SimListener",
    "SimLoop",
    "SimNetwork",
    "SimTransport",
    "Simulation",
    "SimulationError",
    "SimulationStalled",
    "SimulationTimeLimit",
    "TcpCluster",
    "Trace",
    "TraceEvent",
    "assert_deterministic",
    "current_host",
    "many_seeds",
    "replay_hint",
    "run_on_sim_loop",
    "run_simulation",
    "sim_seeds",
]
