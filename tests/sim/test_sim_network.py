"""SimTransport semantics over a tiny framed echo protocol: order, reorder, drops, partitions,
crashes, restarts, frame limits."""

from __future__ import annotations

import asyncio
import contextlib

import pytest

from shardex.errors import ConnectionClosed, FrameTooLarge, NodeUnavailable
from shardex.net.transport import Comm
from shardex.sim import (
    ClusterNode,
    FaultConfig,
    SimNetwork,
    Simulation,
    SimulationError,
    run_simulation,
)

ECHO = "s1:7000"


async def echo_handler(comm: Comm) -> None:
    with contextlib.suppress(ConnectionClosed):
        while True:
            frame = await comm.read()
            await comm.write(b"echo:" + frame)


async def start_echo(sim: Simulation, host: str = "s1", port: int = 7000) -> None:
    await sim.network.transport(host).listen(f"{host}:{port}", echo_handler)


def test_frames_on_one_comm_stay_in_order_under_random_latency() -> None:
    async def main(sim: Simulation) -> list[bytes]:
        await start_echo(sim)
        comm = await sim.network.transport("c1").connect(ECHO, 1.0)
        for i in range(200):
            await comm.write(b"%d" % i)
        return [await comm.read() for _ in range(200)]

    config = FaultConfig(latency_min=0.0, latency_mean=0.01, latency_max=1.0)
    assert run_simulation(main, 3, config) == [b"echo:%d" % i for i in range(200)]


def test_frames_on_different_comms_interleave() -> None:
    """A frame written later on another comm may arrive first: reorder across connections."""

    async def main(sim: Simulation) -> list[bytes]:
        arrivals: list[bytes] = []

        async def record(comm: Comm) -> None:
            with contextlib.suppress(ConnectionClosed):
                while True:
                    arrivals.append(await comm.read())

        await sim.network.transport("s1").listen(ECHO, record)
        client = sim.network.transport("c1")
        a = await client.connect(ECHO, 1.0)
        b = await client.connect(ECHO, 1.0)
        await a.write(b"a")
        await b.write(b"b")
        await asyncio.sleep(1)
        return arrivals

    orders = {tuple(run_simulation(main, seed)) for seed in range(20)}
    assert orders == {(b"a", b"b"), (b"b", b"a")}


def test_a_dropped_frame_resets_both_ends() -> None:
    async def main(sim: Simulation) -> tuple[str, str]:
        results: dict[str, str] = {}

        async def server(comm: Comm) -> None:
            try:
                await comm.read()
            except ConnectionClosed as e:
                results["server"] = e.code.value

        await sim.network.transport("s1").listen(ECHO, server)
        comm = await sim.network.transport("c1").connect(ECHO, 1.0)
        sim.config.drop_rate = 1.0
        await comm.write(b"lost")
        with pytest.raises(ConnectionClosed):
            await comm.read()
        with pytest.raises(ConnectionClosed):
            await comm.write(b"more")
        await asyncio.sleep(0)
        return results["server"], sim.trace.events[-1].kind

    assert run_simulation(main, 1) == ("CONNECTION_CLOSED", "reset")


def test_partition_holds_frames_until_heal_then_delivers_in_order() -> None:
    async def main(sim: Simulation) -> list[bytes]:
        await start_echo(sim)
        comm = await sim.network.transport("c1").connect(ECHO, 1.0)
        sim.network.partition(["c1"], ["s1"])
        for i in range(3):
            await comm.write(b"%d" % i)
        with pytest.raises(TimeoutError):
            await asyncio.wait_for(comm.read(), 60)
        sim.network.heal()
        return [await comm.read() for _ in range(3)]

    assert run_simulation(main, 1) == [b"echo:0", b"echo:1", b"echo:2"]


def test_partition_resets_held_comms_after_the_configured_timeout() -> None:
    async def main(sim: Simulation) -> float:
        await start_echo(sim)
        comm = await sim.network.transport("c1").connect(ECHO, 1.0)
        start = sim.loop.time() if sim.loop else 0.0
        sim.network.isolate("s1")
        await comm.write(b"x")
        with pytest.raises(ConnectionClosed):
            await comm.read()
        return asyncio.get_running_loop().time() - start

    elapsed = run_simulation(main, 1, FaultConfig(partition_reset_after=5.0))
    assert 5.0 <= elapsed < 5.1


def test_connect_across_a_partition_times_out_or_waits_for_heal() -> None:
    async def main(sim: Simulation) -> bytes:
        await start_echo(sim)
        client = sim.network.transport("c1")
        sim.network.partition(["c1"])
        with pytest.raises(NodeUnavailable, match="timed out"):
            await client.connect(ECHO, 2.0)
        asyncio.get_running_loop().call_later(1.0, sim.network.heal)
        comm = await client.connect(ECHO, 5.0)  # SYN retransmitted after the heal
        await comm.write(b"hi")
        return await comm.read()

    assert run_simulation(main, 1) == b"echo:hi"


def test_connect_to_a_missing_listener_is_refused() -> None:
    async def main(sim: Simulation) -> None:
        with pytest.raises(NodeUnavailable, match="refused"):
            await sim.network.transport("c1").connect("s9:7000", 1.0)
        await start_echo(sim)
        sim.config.connect_fail_rate = 1.0
        with pytest.raises(NodeUnavailable, match="refused"):
            await sim.network.transport("c1").connect(ECHO, 1.0)

    run_simulation(main, 1)


def test_crash_cancels_the_hosts_tasks_and_restart_serves_again() -> None:
    events: list[str] = []

    async def node_main(node: ClusterNode) -> None:
        async def background() -> None:
            try:
                await asyncio.Event().wait()
            except asyncio.CancelledError:
                events.append(f"background#{node.incarnation} cancelled")
                raise

        child = asyncio.create_task(background())  # a child task: still belongs to the node
        await node.transport.listen(node.listen_address, echo_handler)
        node.serving(node.listen_address)
        node.disk["starts"] = node.disk.get("starts", 0) + 1
        await child

    async def main(sim: Simulation) -> tuple[list[str], int]:
        cluster = sim.cluster
        cluster.add("s1", node_main)
        await cluster.start()
        address = await cluster["s1"].wait_serving()
        client = sim.network.transport("c1")
        comm = await client.connect(address, 1.0)
        await cluster.crash("s1")
        assert sim.loop is not None and sim.loop.host_tasks("s1") == []
        with pytest.raises(ConnectionClosed):
            await comm.read()
        with pytest.raises(NodeUnavailable, match="refused"):
            await client.connect(address, 1.0)
        await cluster.restart("s1")
        await cluster["s1"].wait_serving()
        comm = await client.connect(address, 1.0)
        await comm.write(b"back")
        assert await comm.read() == b"echo:back"
        return list(events), cluster["s1"].disk["starts"]

    assert run_simulation(main, 1) == (["background#1 cancelled"], 2)


def test_power_off_is_silent_until_the_host_returns() -> None:
    async def main(sim: Simulation) -> None:
        await start_echo(sim)
        client = sim.network.transport("c1")
        comm = await client.connect(ECHO, 1.0)
        sim.network.crash("s1", power_off=True)
        await comm.write(b"into the void")  # no RST comes back: the write "succeeds"
        with pytest.raises(TimeoutError):
            await asyncio.wait_for(comm.read(), 30)
        with pytest.raises(NodeUnavailable, match="timed out"):
            await client.connect(ECHO, 3.0)  # an unanswered SYN
        sim.network.restart("s1")
        await comm.write(b"hello?")  # the rebooted kernel answers with RST
        with pytest.raises(ConnectionClosed):
            await comm.read()
        assert sim.trace.count("lost") == 1

    run_simulation(main, 1)


def test_graceful_close_delivers_buffered_frames_then_eof() -> None:
    async def main(sim: Simulation) -> list[bytes]:
        got: list[bytes] = []
        done = asyncio.Event()

        async def reader(comm: Comm) -> None:
            try:
                while True:
                    got.append(await comm.read())
            except ConnectionClosed:
                got.append(b"<eof>")
                done.set()

        await sim.network.transport("s1").listen(ECHO, reader)
        comm = await sim.network.transport("c1").connect(ECHO, 1.0)
        await comm.write(b"1")
        await comm.write(b"2")
        await comm.close()
        assert comm.closed
        with pytest.raises(ConnectionClosed):
            await comm.write(b"3")
        await done.wait()
        return got

    assert run_simulation(main, 1) == [b"1", b"2", b"<eof>"]


def test_max_frame_is_enforced_on_both_sides() -> None:
    async def main(sim: Simulation) -> None:
        errors: list[str] = []

        async def small_reader(comm: Comm) -> None:
            try:
                await comm.read()
            except FrameTooLarge as e:
                errors.append(e.code.value)
            with pytest.raises(ConnectionClosed):
                await comm.read()

        await sim.network.transport("s1", max_frame=100).listen(ECHO, small_reader)
        client = sim.network.transport("c1", max_frame=1000)
        comm = await client.connect(ECHO, 1.0)
        with pytest.raises(FrameTooLarge):
            await comm.write(b"x" * 1001)  # over our own limit: refused locally, nothing sent
        await comm.write(b"x" * 500)  # over the receiver's limit: it cuts us off
        with pytest.raises(ConnectionClosed):
            await comm.read()
        assert errors == ["FRAME_TOO_LARGE"]

    run_simulation(main, 1)


def test_listen_errors_and_port_zero() -> None:
    async def main(sim: Simulation) -> None:
        transport = sim.network.transport("s1")
        first = await transport.listen("s1:0", echo_handler)
        second = await transport.listen("0.0.0.0:0", echo_handler)
        assert first.address != second.address
        assert first.address.startswith("s1:")
        with pytest.raises(NodeUnavailable, match="in use"):
            await transport.listen(first.address, echo_handler)
        with pytest.raises(NodeUnavailable, match="not an address"):
            await transport.listen("s2:7000", echo_handler)
        await first.stop()
        await transport.listen(first.address, echo_handler)

    run_simulation(main, 1)


def test_a_full_send_buffer_makes_the_writer_wait() -> None:
    async def main(sim: Simulation) -> float:
        async def slow_reader(comm: Comm) -> None:
            await asyncio.Event().wait()

        await sim.network.transport("s1").listen(ECHO, slow_reader)
        comm = await sim.network.transport("c1").connect(ECHO, 1.0)
        start = asyncio.get_running_loop().time()
        for _ in range(10):
            await comm.write(b"x" * 100)
        return asyncio.get_running_loop().time() - start

    # Delivery drains the pipe (the receiver's inbox is separate), so the writer is paced by
    # latency instead of filling memory.
    assert run_simulation(main, 1, FaultConfig(send_buffer=150)) > 0
    assert run_simulation(main, 1) == 0


def test_break_connections_is_an_explicit_drop() -> None:
    async def main(sim: Simulation) -> int:
        await start_echo(sim)
        comm = await sim.network.transport("c1").connect(ECHO, 1.0)
        broken = sim.network.break_connections("c1", "s1")
        with pytest.raises(ConnectionClosed):
            await comm.read()
        return broken

    assert run_simulation(main, 1) == 1


def test_sim_network_refuses_a_real_loop() -> None:
    async def main() -> None:
        net = SimNetwork(1)
        with pytest.raises(SimulationError, match="SimLoop"):
            await net.transport("c1").connect("s1:7000", 1.0)

    asyncio.run(main())
