"""The admission gate: at most ``cap`` slots held, ``queue`` waiters served first come first
served, QUERY_OVERLOADED past the queue or the wait, and every slot given back however its
holder ends."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import pytest

from shardex.errors import ErrorCode, ShardexError
from shardex.runtime.admission import AdmissionGate, Slot, default_cap

NEVER = 3600.0  # a wait that never runs out within a test: only a release ends it


def gate(cap: int = 1, queue: int = 2) -> AdmissionGate:
    return AdmissionGate("statements", cap, queue, cap_key="max_run", queue_key="max_wait")


async def until(cond: Callable[[], bool]) -> None:
    """Let the loop run until ``cond()`` (each waiter needs a few rounds to enqueue)."""
    for _ in range(1000):
        if cond():
            return
        await asyncio.sleep(0)
    raise AssertionError("condition never held")


async def test_slots_up_to_the_cap_are_granted_at_once() -> None:
    g = gate(cap=2)
    a, b = await g.enter(NEVER), await g.enter(NEVER)
    assert g.running == 2 and g.try_enter() is None
    a.release()
    assert g.running == 1
    b.release()
    assert g.running == 0


async def test_waiters_are_served_in_arrival_order() -> None:
    g = gate(cap=1, queue=3)
    first = await g.enter(NEVER)
    order: list[int] = []

    async def wait(i: int) -> None:
        slot = await g.enter(NEVER)
        order.append(i)
        slot.release()

    tasks = []
    for i in range(3):
        tasks.append(asyncio.create_task(wait(i)))
        await until(lambda n=i + 1: g.queued == n)
    # A newcomer while others wait is not let past them, even with no slot taken yet.
    assert g.try_enter() is None
    first.release()
    await asyncio.gather(*tasks)
    assert order == [0, 1, 2] and g.running == 0 and g.queued == 0


async def test_a_full_queue_refuses_at_once_naming_the_limits() -> None:
    g = gate(cap=1, queue=1)
    held = await g.enter(NEVER)
    waiter = asyncio.create_task(g.enter(NEVER))
    await until(lambda: g.queued == 1)
    with pytest.raises(ShardexError) as info:
        await g.enter(NEVER)
    e = info.value
    assert e.code is ErrorCode.QUERY_OVERLOADED
    assert "1 statements running and 1 queued" in e.message
    assert e.details["cap"] == 1 and e.details["queue"] == 1
    assert "max_run" in e.details["hint"] and "max_wait" in e.details["hint"]
    held.release()
    (await waiter).release()
    assert g.running == 0 and g.rejected == 1


async def test_a_wait_that_runs_out_is_overloaded_and_leaves_no_trace() -> None:
    g = gate(cap=1, queue=1)
    held = await g.enter(NEVER)
    with pytest.raises(ShardexError) as info:
        await g.enter(0.01)  # nothing releases: the wait must run out
    assert info.value.code is ErrorCode.QUERY_OVERLOADED
    assert "within 0.01 s" in info.value.message
    assert g.queued == 0
    held.release()
    assert g.running == 0
    (await g.enter(NEVER)).release()  # the gate is whole again


async def test_a_cancelled_waiter_gives_its_place_up() -> None:
    g = gate(cap=1, queue=1)
    held = await g.enter(NEVER)
    waiter = asyncio.create_task(g.enter(NEVER))
    await until(lambda: g.queued == 1)
    waiter.cancel()
    with pytest.raises(asyncio.CancelledError):
        await waiter
    assert g.queued == 0
    held.release()
    assert g.running == 0


async def test_a_slot_handed_to_a_waiter_cancelled_meanwhile_passes_on() -> None:
    g = gate(cap=1, queue=2)
    held = await g.enter(NEVER)
    first = asyncio.create_task(g.enter(NEVER))
    await until(lambda: g.queued == 1)
    second = asyncio.create_task(g.enter(NEVER))
    await until(lambda: g.queued == 2)
    held.release()  # the slot goes to ``first``'s future ...
    first.cancel()  # ... which is cancelled before it runs again
    with pytest.raises(asyncio.CancelledError):
        await first
    slot = await second
    assert g.running == 1
    slot.release()
    assert g.running == 0


async def test_release_is_idempotent() -> None:
    g = gate(cap=2)
    a = await g.enter(NEVER)
    b = await g.enter(NEVER)
    for _ in range(3):
        a.release()
    assert g.running == 1 and not a.held and b.held
    b.release()
    assert g.running == 0


async def test_many_failing_and_cancelled_holders_leave_the_cap_whole() -> None:
    g = gate(cap=2, queue=50)
    holding: set[int] = set()

    async def holder(i: int) -> None:
        slot = await g.enter(NEVER)
        holding.add(i)
        try:
            await asyncio.sleep(0)
            if i % 2:
                raise ValueError(i)
            await asyncio.Event().wait()  # only a cancel ends it
        finally:
            holding.discard(i)
            slot.release()

    tasks = [asyncio.create_task(holder(i)) for i in range(40)]
    # Failing holders pass their slots on until two never-ending ones hold both.
    await until(lambda: len(holding) == 2 and all(i % 2 == 0 for i in holding))
    assert any(t.done() for t in tasks) and g.queued > 0
    for t in tasks:  # the holders and the waiters alike
        t.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
    assert g.running == 0 and g.queued == 0
    slots: list[Slot] = [await g.enter(NEVER) for _ in range(2)]
    assert g.try_enter() is None
    for s in slots:
        s.release()


def test_bad_limits_and_the_default_cap() -> None:
    with pytest.raises(ValueError):
        gate(cap=0)
    with pytest.raises(ValueError):
        gate(queue=-1)
    assert default_cap() >= 4
