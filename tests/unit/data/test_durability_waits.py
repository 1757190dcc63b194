"""``DurabilityWaits``: a durable write resolves when a majority of its chain holds it, is
ambiguous after the timeout, and a write that stops waiting (timed out, cancelled) leaves
nothing pending that reads would wait on."""

from __future__ import annotations

import asyncio

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
