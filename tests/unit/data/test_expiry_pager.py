"""The expiry pager over a real engine on a virtual clock: a tick reads at most its budget
and the next continues where it stopped (partition after partition, wrapping), deletions
wake the replica senders, reads' reports are deleted at once, and a node that does not
serve the keyspace deletes nothing."""

from __future__ import annotations

import asyncio

import pytest

from shardex.data.engine import DataEngine
from shardex.data.engine_io import EngineIO
from shardex.data.expiry_pager import ExpiryPager
from shardex.errors import ErrorCode, ShardexError

T0 = 1_800_000_000
NP = 3


class Clock:
    now = float(T0)

    def ns(self) -> int:
        return int(self.now * 1_000_000_000)


class Gate:
    def __init__(self) -> None:
        self.serving = True

    def serves_now(self, keyspace: str) -> bool:
        if not self.serving:
            raise ShardexError("cut off", code=ErrorCode.NODE_UNAVAILABLE)
        return True


class Woken:
    def __init__(self) -> None:
        self.partitions: list[tuple[str, int]] = []

    def wake(self, keyspace: str, partition: int) -> None:
        self.partitions.append((keyspace, partition))


@pytest.fixture
def world(tmp_path):
    clock = Clock()
    eng = DataEngine(tmp_path / "db", clock_ns=clock.ns)
    eng.create_keyspace("ks", NP)
    for p in range(NP):
        eng.create_partition("ks", p)
    gate, woken = Gate(), Woken()
    pager = ExpiryPager(
        engine=lambda: eng,
        io=EngineIO("n1", 1, inline=True),
        replication=woken,  # type: ignore[arg-type]  # what the pager calls of it
        gate=gate,  # type: ignore[arg-type]
        walk_limit=7,
    )
    yield eng, clock, gate, woken, pager
    eng.close()


def _live(eng: DataEngine) -> int:
    return sum(eng.partition_info("ks", p).doc_count for p in range(NP))


def test_ticks_are_bounded_and_continue_where_the_last_stopped(world) -> None:
    eng, clock, _, woken, pager = world
    for i in range(40):
        eng.upsert("ks", f"d{i}", {"i": i}, expiry=5 if i % 2 else 0)
    clock.now = T0 + 6
    deleted, ticks = 0, 0
    while deleted < 20:
        n = asyncio.run(pager.tick())
        assert n <= 7  # at most the budget's records read, so at most that many deleted
        deleted += n
        ticks += 1
        assert ticks <= 12, "the walk does not cover every document"
    assert ticks >= 40 // 7  # bounded: one tick could not have read them all
    assert deleted == pager.expired == 20 and _live(eng) == 20
    assert {p for _, p in woken.partitions} == set(range(NP))
    for _ in range(10):  # further passes find nothing more
        assert asyncio.run(pager.tick()) == 0


def test_reported_reads_are_deleted_and_a_cut_off_node_deletes_nothing(world) -> None:
    eng, clock, gate, _, pager = world
    eng.set_on_expired(pager.on_expired)
    eng.upsert("ks", "a", {}, expiry=5)
    eng.upsert("ks", "b", {}, expiry=5)
    clock.now = T0 + 6
    for d in ("a", "b"):
        with pytest.raises(ShardexError):
            eng.get("ks", d)
    gate.serving = False
    assert asyncio.run(pager.expire_accessed()) == 0
    assert asyncio.run(pager.tick()) == 0
    assert _live(eng) == 2
    gate.serving = True
    with pytest.raises(ShardexError):
        eng.get("ks", "a")  # reported again
    assert asyncio.run(pager.expire_accessed()) == 1
    assert _live(eng) == 1
