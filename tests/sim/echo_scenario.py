"""Echo traffic under drops, a partition and a crash: the replay tests' reference scenario.

A helper module rather than a test module so a replay in a fresh interpreter imports only
shardex and this file.
"""

from __future__ import annotations

import asyncio
import contextlib

from shardex.errors import ConnectionClosed, NodeUnavailable
from shardex.net.transport import Comm
from shardex.sim import ClusterNode, FaultConfig, Simulation


async def echo(comm: Comm) -> None:
    with contextlib.suppress(ConnectionClosed):
        while True:
            await comm.write(b"echo:" + await comm.read())


async def server(node: ClusterNode) -> None:
    await node.transport.listen(node.listen_address, echo)
    node.serving(node.listen_address)
    await asyncio.Event().wait()


async def chatter(sim: Simulation) -> None:
    """Echo traffic from three clients to two servers under drops, a partition and a crash."""
    rng = sim.rng
    cluster = sim.cluster
    for host in ("s1", "s2"):
        cluster.add(host, server)

    async def client(node: ClusterNode) -> None:
        comm: Comm | None = None
        for i in range(15):
            await asyncio.sleep(rng.uniform(0, 0.2))
            try:
                if comm is None or comm.closed:
                    comm = await node.transport.connect(f"{rng.choice(['s1', 's2'])}:7000", 1.0)
                await comm.write(b"%s-%d" % (node.host.encode(), i) * rng.randint(1, 20))
                await asyncio.wait_for(comm.read(), 1.0)
            except (ConnectionClosed, NodeUnavailable, TimeoutError):
                comm = None

    for host in ("c1", "c2", "c3"):
        cluster.add(host, client)
    await cluster.start()
    await asyncio.sleep(0.5)
    cluster.partition(["s1"], ["c1", "c2"])
    await asyncio.sleep(rng.uniform(0.5, 1.5))
    cluster.heal()
    await cluster.crash("s2")
    await asyncio.sleep(0.3)
    await cluster.restart("s2")
    for host in ("c1", "c2", "c3"):
        await cluster[host].wait()


def chatter_trace(seed: int) -> Simulation:
    sim = Simulation(seed, FaultConfig(drop_rate=0.05))
    sim.run(chatter)
    return sim
