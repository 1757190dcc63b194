"""The virtual-time loop: time jumps to the next timer, stalls and forbidden I/O are loud."""

from __future__ import annotations

import asyncio
import time

import pytest

from shardex.sim import (
    SimLoop,
    SimulationError,
    SimulationStalled,
    SimulationTimeLimit,
    run_on_sim_loop,
)


def test_an_hour_of_heartbeats_takes_virtual_time_only() -> None:
    beats: list[float] = []

    async def main() -> float:
        loop = asyncio.get_running_loop()
        assert isinstance(loop, SimLoop)

        async def heartbeat() -> None:
            while True:
                await asyncio.sleep(1.0)
                beats.append(loop.time())

        task = asyncio.create_task(heartbeat())
        await asyncio.sleep(3600.5)
        task.cancel()
        return loop.time()

    wall = time.perf_counter()
    end = run_on_sim_loop(main)
    assert time.perf_counter() - wall < 2.0
    assert end == 3600.5
    assert len(beats) == 3600
    assert beats[:3] == [1.0, 2.0, 3.0]  # timers fire exactly when due


def test_wait_for_and_timeout_use_virtual_time() -> None:
    async def main() -> list[float]:
        loop = asyncio.get_running_loop()
        marks = []
        with pytest.raises(TimeoutError):
            await asyncio.wait_for(asyncio.sleep(100), 2.5)
        marks.append(loop.time())
        with pytest.raises(TimeoutError):
            async with asyncio.timeout(0.5):
                await asyncio.Event().wait()
        marks.append(loop.time())
        fired = loop.create_future()
        loop.call_later(10, fired.set_result, None)
        await fired
        marks.append(loop.time())
        return marks

    assert run_on_sim_loop(main) == [2.5, 3.0, 13.0]


def test_start_time_is_configurable() -> None:
    async def main() -> float:
        await asyncio.sleep(1)
        return asyncio.get_running_loop().time()

    assert run_on_sim_loop(main, start_time=1000.0) == 1001.0


def test_stall_is_reported_with_the_waiting_tasks() -> None:
    async def waits_forever() -> None:
        await asyncio.Event().wait()

    async def main() -> None:
        task = asyncio.create_task(waits_forever())
        await asyncio.get_running_loop().create_future()
        task.cancel()

    with pytest.raises(SimulationStalled, match="nothing is ready") as info:
        run_on_sim_loop(main)
    assert "waits_forever" in str(info.value)


def test_virtual_time_limit_stops_a_run_that_never_ends() -> None:
    async def main() -> None:
        while True:
            await asyncio.sleep(60)

    with pytest.raises(SimulationTimeLimit, match="virtual time limit"):
        run_on_sim_loop(main, max_time=3600)


def test_step_limit_stops_a_livelock() -> None:
    async def main() -> None:
        while True:
            await asyncio.sleep(0)

    with pytest.raises(SimulationTimeLimit, match="loop steps"):
        run_on_sim_loop(main, max_steps=10_000)


@pytest.mark.parametrize(
    "action",
    [
        pytest.param(lambda: asyncio.to_thread(time.sleep, 0), id="to_thread"),
        pytest.param(lambda: asyncio.open_connection("127.0.0.1", 1), id="open_connection"),
        pytest.param(lambda: asyncio.start_server(lambda r, w: None, "127.0.0.1", 0), id="server"),
        pytest.param(
            lambda: asyncio.get_running_loop().getaddrinfo("localhost", 80), id="getaddrinfo"
        ),
        pytest.param(lambda: asyncio.create_subprocess_exec("true"), id="subprocess"),
    ],
)
def test_real_io_and_threads_are_forbidden(action) -> None:  # type: ignore[no-untyped-def]
    async def main() -> None:
        await action()

    with pytest.raises(SimulationError, match="not allowed inside a simulation"):
        run_on_sim_loop(main)


def test_a_failing_callback_fails_the_simulation() -> None:
    def broken() -> None:
        raise ValueError("bug in a callback")

    async def main() -> None:
        asyncio.get_running_loop().call_later(1, broken)
        await asyncio.sleep(5)

    with pytest.raises(SimulationError, match="callback failed") as info:
        run_on_sim_loop(main)
    assert isinstance(info.value.__cause__, ValueError)


def test_leftover_tasks_are_cancelled_in_creation_order() -> None:
    order: list[int] = []

    async def lingering(i: int) -> None:
        try:
            await asyncio.Event().wait()
        finally:
            order.append(i)

    async def main() -> None:
        tasks = [asyncio.create_task(lingering(i)) for i in range(5)]
        await asyncio.sleep(0)
        assert not any(t.done() for t in tasks)

    run_on_sim_loop(main)
    assert order == [0, 1, 2, 3, 4]


def test_refuses_to_nest_in_a_running_loop() -> None:
    async def outer() -> None:
        async def inner() -> None:
            pass

        with pytest.raises(SimulationError, match="inside a running event loop"):
            run_on_sim_loop(inner)

    asyncio.run(outer())
