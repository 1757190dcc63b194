"""``DurabilityWaits``: a durable write resolves when a majority of its chain holds it, is
ambiguous after the timeout, and a write that stops waiting (timed out, cancelled) leaves
nothing pending that reads would wait on."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import pytest

from shardex.api.records import STATE_REPLICA
from shardex.api.replication import ReplicaAck
from shardex.data.durability import DurabilityWaits
from shardex.errors import ErrorCode, ShardexError

KEY = ("ks", 3)
UUID = 77


def waits(timeout: float = 5.0) -> DurabilityWaits:
    w = DurabilityWaits(timeout)
    w.set_chain(KEY, 2, ["r1"])  # active + one replica: a majority is both
    return w


async def test_a_write_resolves_when_the_replica_acks_it() -> None:
    w = waits()
    task = asyncio.create_task(w.wait(KEY, 5, UUID, persist=False, docid="d"))
    await asyncio.sleep(0)
    assert w.pending(KEY, "d") and not task.done()
    w.record(KEY, "r1", ReplicaAck(3, 4, 4, UUID, STATE_REPLICA))  # not far enough
    await asyncio.sleep(0)
    assert not task.done()
    w.record(KEY, "r1", ReplicaAck(3, 5, 0, UUID, STATE_REPLICA))
    await task
    assert not w.has_pending()


async def test_persist_waits_for_the_replicas_fsync() -> None:
    w = waits()
    task = asyncio.create_task(w.wait(KEY, 5, UUID, persist=True, docid="d"))
    w.record(KEY, "r1", ReplicaAck(3, 9, 4, UUID, STATE_REPLICA))
    await asyncio.sleep(0)
    assert not task.done() and w.needs_persist(KEY, "r1")
    w.record(KEY, "r1", ReplicaAck(3, 9, 9, UUID, STATE_REPLICA))
    await task


async def test_an_ack_on_another_branch_counts_for_nothing() -> None:
    w = waits(timeout=0.05)
    w.record(KEY, "r1", ReplicaAck(3, 9, 9, UUID + 1, STATE_REPLICA))
    with pytest.raises(ShardexError) as err:
        await w.wait(KEY, 5, UUID, persist=False, docid="d")
    assert err.value.code is ErrorCode.DURABILITY_AMBIGUOUS
    assert err.value.details["seqno"] == 5 and err.value.details["docid"] == "d"
    assert not w.has_pending() and not w.needs_persist(KEY, "r1")


async def test_a_cancelled_writer_leaves_nothing_pending() -> None:
    w = waits()
    task = asyncio.create_task(w.wait(KEY, 5, UUID, persist=True, docid="d"))
    await asyncio.sleep(0)
    assert w.has_pending() and w.needs_persist(KEY, "r1")
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert not w.has_pending() and not w.needs_persist(KEY, "r1")


async def test_losing_the_active_makes_every_wait_fail_with_its_error() -> None:
    w = waits()
    task = asyncio.create_task(w.wait(KEY, 5, UUID, persist=False, docid="d"))
    await asyncio.sleep(0)
    gone = ShardexError("moved", code=ErrorCode.DURABILITY_AMBIGUOUS)
    w.forget(KEY, gone)
    with pytest.raises(ShardexError) as err:
        await task
    assert err.value is gone
    assert not w.has_pending()


async def test_a_chain_of_one_copy_holds_at_once() -> None:
    w = DurabilityWaits()
    w.set_chain(KEY, 1, [])
    await asyncio.wait_for(w.wait(KEY, 5, UUID, persist=True, docid="d"), 1.0)
    assert not w.has_pending()


async def test_a_write_waits_its_own_timeout_and_the_error_names_it() -> None:
    w = waits(timeout=60.0)  # the node's default: far longer than the write's own
    with pytest.raises(ShardexError) as err:
        await w.wait(KEY, 5, UUID, persist=False, docid="d", timeout=0.05)
    assert err.value.code is ErrorCode.DURABILITY_AMBIGUOUS
    assert err.value.details["durability_timeout"] == 0.05
    assert "within 0.05 s" in err.value.message
    assert not w.has_pending()


async def test_without_its_own_timeout_a_write_waits_the_nodes() -> None:
    w = waits(timeout=0.05)
    with pytest.raises(ShardexError) as err:
        await w.wait(KEY, 5, UUID, persist=False, docid="d")
    assert err.value.details["durability_timeout"] == 0.05


def _recorder() -> tuple[list[BaseException | None], Callable[[BaseException | None], None]]:
    calls: list[BaseException | None] = []
    return calls, calls.append


async def test_a_callback_wait_is_called_once_when_the_replica_acks() -> None:
    w = waits()
    calls, then = _recorder()
    waiter = w.start_wait(KEY, 5, UUID, persist=False, docid="d", then=then)
    assert waiter is not None and w.pending(KEY, "d") and calls == []
    w.record(KEY, "r1", ReplicaAck(3, 4, 4, UUID, STATE_REPLICA))  # not far enough
    assert calls == []
    w.record(KEY, "r1", ReplicaAck(3, 5, 0, UUID, STATE_REPLICA))
    w.record(KEY, "r1", ReplicaAck(3, 6, 0, UUID, STATE_REPLICA))  # called once only
    assert calls == [None] and not w.has_pending()
    assert waiter.timer is None  # its timeout will not fire


async def test_a_callback_wait_that_times_out_is_ambiguous_and_leaves_nothing_pending() -> None:
    w = waits(timeout=0.05)
    calls, then = _recorder()
    w.start_wait(KEY, 5, UUID, persist=True, docid="d", then=then)
    reader = asyncio.create_task(w.wait_readable(KEY, "d"))
    await asyncio.wait_for(reader, 10)  # woken by the timeout, nothing left to wait for
    assert len(calls) == 1 and isinstance(calls[0], ShardexError)
    assert calls[0].code is ErrorCode.DURABILITY_AMBIGUOUS and calls[0].details["seqno"] == 5
    assert not w.has_pending() and not w.needs_persist(KEY, "r1")
    w.record(KEY, "r1", ReplicaAck(3, 9, 9, UUID, STATE_REPLICA))  # too late: no second call
    assert len(calls) == 1


async def test_losing_the_active_calls_a_callback_wait_with_its_error() -> None:
    w = waits()
    calls, then = _recorder()
    waiter = w.start_wait(KEY, 5, UUID, persist=False, docid="d", then=then)
    gone = ShardexError("moved", code=ErrorCode.DURABILITY_AMBIGUOUS)
    w.forget(KEY, gone)
    assert calls == [gone] and not w.has_pending()
    assert waiter is not None and waiter.future.cancelled()  # its readers wake


async def test_a_callback_wait_a_majority_already_holds_is_not_started() -> None:
    w = DurabilityWaits(5.0)
    w.set_chain(KEY, 1, [])  # no replica: the active alone is a majority
    calls, then = _recorder()
    assert w.start_wait(KEY, 5, UUID, persist=False, docid="d", then=then) is None
    assert calls == [] and not w.has_pending()
