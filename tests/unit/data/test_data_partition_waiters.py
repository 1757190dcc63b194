"""``Partition.notify`` skips its lock when nobody waits, so ``add_waiter`` looks at the high
seqno again once its waiter is listed: a commit published between its first check and the
append must not leave the waiter asleep."""

from __future__ import annotations

import asyncio

import pytest

from shardex.data.engine import DataEngine
from shardex.data.partition import Partition


@pytest.fixture
def part(tmp_path):
    eng = DataEngine(tmp_path / "db")
    eng.create_keyspace("ks", 1)
    eng.create_partition("ks", 0)
    yield eng._parts[("ks", 0)]
    eng.close()


def _commit_one(part: Partition) -> None:
    """What a writer does after its RocksDB write: publish the advanced meta, notify."""
    meta = part.meta.copy()
    meta.high_seqno += 1
    part._publish(meta, sync=False)


class _LoopCommittingInBetween:
    """A loop whose ``create_future`` (called by ``add_waiter`` after its first check and
    before the append) lets a writer's commit land, as another thread could."""

    def __init__(self, part: Partition, loop: asyncio.AbstractEventLoop) -> None:
        self.part = part
        self.loop = loop

    def create_future(self) -> asyncio.Future[int]:
        _commit_one(self.part)
        return self.loop.create_future()


def test_commit_between_check_and_append_is_seen(part):
    loop = asyncio.new_event_loop()
    try:
        racing = _LoopCommittingInBetween(part, loop)
        assert part.add_waiter(part.meta.high_seqno, racing) is None  # type: ignore[arg-type]
        assert part._waiters == []
    finally:
        loop.close()


def test_waiter_is_woken_by_a_later_commit(part):
    loop = asyncio.new_event_loop()
    try:
        fut = part.add_waiter(part.meta.high_seqno, loop)
        assert fut is not None and not fut.done()
        _commit_one(part)
        loop.run_until_complete(asyncio.wait_for(fut, 5))
        assert fut.result() == part.meta.high_seqno
        assert part._waiters == []
    finally:
        loop.close()
