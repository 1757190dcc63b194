"""Exactly-once requests through the RPC layer, written once, run over real TCP and simulated.

Clients send ``Apply`` requests (add ``amount`` to a counter ``key``) to two servers through a
``ConnectionPool``, each with a timeout, retrying the same request id after any failure until it
is acknowledged. Servers deduplicate by request id in their "disk" (state that survives a
crash) and answer a retry with the cached response. A ``disturb`` coroutine injects the faults
of the mode: partitions, drops and crashes in simulation, a server stop/restart over TCP.
The checker then proves every acknowledged request was applied exactly once and answered with
what the server produced.
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from shardex.errors import ConnectionClosed, NodeUnavailable, RequestTimeout
from shardex.net.messages import Message
from shardex.net.rpc import ConnectionPool, RpcServer
from shardex.sim import ClusterNode, FaultConfig, SimCluster, Simulation, TcpCluster
from shardex.testing.checkers import check_exactly_once

SECRET = "sim-test-secret"
SERVERS = ("s1", "s2")
CLIENTS = ("c1", "c2", "c3")
KEYS = ("a", "b", "c")


class Apply(Message, tag="simtest.Apply"):
    request: str
    key: str
    amount: int


class Applied(Message, tag="simtest.Applied"):
    server: str
    request: str
    position: int
    value: int


@dataclass
class Params:
    workers: int = 2  # concurrent request streams per client (multiplexed on one connection)
    requests: int = 6  # per worker
    request_timeout: float = 1.0
    connect_timeout: float = 0.5
    backoff: float = 0.05
    think: float = 0.3  # max pause between a worker's requests, so faults hit live traffic
    give_up_after: float = 600.0  # a client still failing by then is a liveness bug
    dedup: bool = True  # False: the bug the checker must catch


@dataclass
class History:
    issued: dict[str, str] = field(default_factory=dict)  # request id -> server
    acked: dict[str, Applied] = field(default_factory=dict)
    attempts: int = 0
    failures: int = 0


def server_main(dedup: bool) -> Callable[[ClusterNode], Awaitable[None]]:
    async def main(node: ClusterNode) -> None:
        # "Disk": survives crash and restart. Applying and recording happen in one step with no
        # await in between, i.e. durable before the ack.
        log: list[tuple[str, Applied]] = node.disk.setdefault("log", [])
        done: dict[str, Applied] = node.disk.setdefault("done", {})
        counters: dict[str, int] = node.disk.setdefault("counters", {})

        async def on_apply(msg: Apply, conn: Any) -> Applied:
            if dedup and msg.request in done:
                return done[msg.request]
            counters[msg.key] = counters.get(msg.key, 0) + msg.amount
            reply = Applied(
                server=node.host, request=msg.request, position=len(log), value=counters[msg.key]
            )
            log.append((msg.request, reply))
            done[msg.request] = reply
            return reply

        server = RpcServer(node.transport, SECRET, name=node.host)
        server.route(Apply, on_apply)
        node.serving(await server.start(node.listen_address))
        try:
            await asyncio.Event().wait()
        finally:
            await server.stop()

    return main


def client_main(
    plan: list[list[tuple[str, str, int]]],
    addresses: dict[str, str],
    history: History,
    params: Params,
    rng: random.Random,
) -> Callable[[ClusterNode], Awaitable[None]]:
    async def worker(
        node: ClusterNode, pool: ConnectionPool, w: int, steps: list[tuple[str, str, int]]
    ) -> None:
        loop = asyncio.get_running_loop()
        for i, (server, key, amount) in enumerate(steps):
            await asyncio.sleep(params.think * rng.random())
            rid = f"{node.host}/{w}/{i}"
            history.issued[rid] = server
            msg = Apply(request=rid, key=key, amount=amount)
            deadline = loop.time() + params.give_up_after
            while loop.time() < deadline:
                history.attempts += 1
                try:
                    reply = await pool.request(
                        addresses[server], msg, params.request_timeout, expect=Applied
                    )
                except (RequestTimeout, ConnectionClosed, NodeUnavailable):
                    history.failures += 1
                    await asyncio.sleep(params.backoff * (0.5 + rng.random()))
                    continue
                history.acked[rid] = reply
                break

    async def main(node: ClusterNode) -> None:
        pool = ConnectionPool(
            node.transport, SECRET, name=node.host, connect_timeout=params.connect_timeout
        )
        try:
            await asyncio.gather(*(worker(node, pool, w, s) for w, s in enumerate(plan)))
        finally:
            await pool.close()

    return main


Disturb = Callable[[Any, random.Random], Awaitable[None]]


async def run_scenario(
    cluster: SimCluster | TcpCluster, rng: random.Random, disturb: Disturb, params: Params
) -> History:
    """The scenario proper: identical in both modes."""
    history = History()
    for host in SERVERS:
        cluster.add(host, server_main(params.dedup))
    await cluster.start(*SERVERS)
    addresses = {host: await cluster[host].wait_serving() for host in SERVERS}
    for host in CLIENTS:
        plan = [
            [
                (rng.choice(SERVERS), rng.choice(KEYS), rng.randint(1, 9))
                for _ in range(params.requests)
            ]
            for _ in range(params.workers)
        ]
        cluster.add(host, client_main(plan, addresses, history, params, rng))
    await cluster.start(*CLIENTS)
    faults = asyncio.get_running_loop().create_task(disturb(cluster, rng))
    for host in CLIENTS:
        await cluster[host].wait()
    await faults
    cluster.check()
    check_exactly_once(
        history.acked,
        {host: cluster[host].disk.get("log", []) for host in SERVERS},
        issued=history.issued,
        require_all_acked=True,
    )
    await cluster.stop_all()
    return history


# ---- the faults of each mode ----------------------------------------------------------------


def sim_faults() -> FaultConfig:
    # A fresh one per run: FaultConfig is mutable (a scenario may change it mid-run). Frame
    # digests stay out of the trace because the RPC handshake's nonces come from
    # secrets.token_bytes, which RpcServer/connect do not let us replace yet.
    return FaultConfig(drop_rate=0.02, partition_reset_after=1.5, trace_payloads=False)


async def sim_disturb(cluster: SimCluster, rng: random.Random) -> None:
    """A partition between a server and some clients, then a server crash and restart."""
    await asyncio.sleep(rng.uniform(0.0, 0.1))
    victim = rng.choice(SERVERS)
    cluster.partition([victim], rng.sample(CLIENTS, rng.randint(1, len(CLIENTS))))
    await asyncio.sleep(rng.uniform(0.2, 3.0))
    cluster.heal()
    await asyncio.sleep(rng.uniform(0.0, 0.2))
    victim = rng.choice(SERVERS)
    await cluster.crash(victim, power_off=rng.random() < 0.5)
    await asyncio.sleep(rng.uniform(0.1, 2.0))
    await cluster.restart(victim)


async def tcp_disturb(cluster: TcpCluster, rng: random.Random) -> None:
    """Stop one server (listener and connections) for a moment and start it again."""
    await asyncio.sleep(0.02)
    victim = rng.choice(SERVERS)
    await cluster.crash(victim)
    await asyncio.sleep(0.1)
    await cluster.restart(victim)


def run_sim(seed: int, params: Params | None = None) -> tuple[History, Simulation]:
    sim = Simulation(seed, sim_faults())

    async def main(sim: Simulation) -> History:
        return await run_scenario(sim.cluster, sim.rng, sim_disturb, params or Params())

    return sim.run(main), sim


def run_tcp(seed: int, params: Params | None = None) -> History:
    # Real time is real here: short pauses keep the run well under a second.
    params = params or Params(think=0.02)

    async def main() -> History:
        return await run_scenario(TcpCluster(), random.Random(seed), tcp_disturb, params)

    return asyncio.run(main())


if __name__ == "__main__":
    # Used by the cross-process replay test: print the trace digest of one seed.
    import sys

    _, sim = run_sim(int(sys.argv[1]))
    print(sim.trace.digest)
