"""The RPC layer over the simulated network: same code, virtual time, replayable."""

from __future__ import annotations

import asyncio

import pytest

from shardex.errors import AuthFailed, RequestTimeout
from shardex.net import Connection, ConnectionPool, Message, RpcServer, connect

sim = pytest.importorskip("shardex.sim")

pytestmark = pytest.mark.timeout(30)


class SimEcho(Message):
    text: str


class SimStall(Message):
    seconds: float


def scenario(seed: int) -> tuple[object, ...]:
    simulation = sim.Simulation(seed, sim.FaultConfig())

    async def main(s: sim.Simulation) -> tuple[object, ...]:
        loop = asyncio.get_running_loop()
        server = RpcServer(sim.SimTransport(s.network, "a"), "secret", name="a")

        @server.route(SimEcho)
        async def echo(msg: SimEcho, conn: Connection) -> Message:
            return SimEcho(text=msg.text + "!")

        @server.route(SimStall)
        async def stall(msg: SimStall, conn: Connection) -> Message:
            await asyncio.sleep(msg.seconds)
            return SimEcho(text="late")

        address = await server.start("a:7000")
        client_transport = sim.SimTransport(s.network, "b")
        pool = ConnectionPool(client_transport, "secret", name="b")
        replies = await asyncio.gather(
            *(pool.request(address, SimEcho(text=str(i)), 5) for i in range(10))
        )
        started = loop.time()
        with pytest.raises(RequestTimeout, match="SimStall to a@a:7000"):
            await pool.request(address, SimStall(seconds=3600), timeout=30)
        waited = loop.time() - started
        with pytest.raises(AuthFailed):
            await connect(client_transport, address, "wrong", name="intruder")
        after = await pool.request(address, SimEcho(text="after"), 5)
        await pool.close()
        await server.stop()
        return tuple(r.text for r in replies), waited, after  # type: ignore[attr-defined]

    return simulation.run(main)


def test_rpc_runs_on_virtual_time_and_replays_exactly() -> None:
    first = scenario(7)
    texts, waited, after = first
    assert texts == tuple(f"{i}!" for i in range(10))
    assert 30 <= waited < 31  # 30 virtual seconds, no real waiting
    assert after == SimEcho(text="after!")
    assert scenario(7) == first
