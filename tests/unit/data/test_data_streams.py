"""Change streams: order, tombstones, snapshot markers, end seqno, live follow, rollback,
new branches (explicit and after a possibly lossy recovery)."""

from __future__ import annotations

import asyncio
import threading

import pytest

from shardex.api.records import Change, FailoverEntry, SnapshotMarker
from shardex.data.engine import DataEngine
from shardex.data.records import PartitionMeta
from shardex.data.streams import rollback_seqno
from shardex.errors import ErrorCode, ShardexError


@pytest.fixture
def engine(tmp_path):
    eng = DataEngine(tmp_path / "db")
    eng.create_keyspace("one", 1)
    eng.create_partition("one", 0)
    yield eng
    eng.close()


def changes(items) -> list[Change]:
    return [i for i in items if isinstance(i, Change)]


def rollback_of(call) -> int:
    with pytest.raises(ShardexError) as err:
        call()
    assert err.value.code is ErrorCode.ROLLBACK
    return err.value.details["rollback_seqno"]


def test_stream_order_tombstones_and_markers(engine):
    engine.upsert("one", "a", {"v": 1})
    engine.upsert("one", "b", {"v": 2})
    engine.upsert("one", "a", {"v": 3})
    engine.delete("one", "b")
    uuid = engine.partition_info("one", 0).uuid
    items = list(engine.stream("one", 0, 0, uuid))
    assert items[0] == SnapshotMarker(0, 1, 4, uuid)
    got = [(c.seqno, c.docid, c.op, c.doc()) for c in changes(items)]
    assert got == [
        (1, "a", "upsert", {"v": 1}),
        (2, "b", "upsert", {"v": 2}),
        (3, "a", "upsert", {"v": 3}),
        (4, "b", "delete", None),
    ]
    assert changes(items)[3].deleted and changes(items)[3].body is None
    # From the middle, and with an end seqno.
    assert [c.seqno for c in changes(engine.stream("one", 0, 2, uuid))] == [3, 4]
    part = list(engine.stream("one", 0, 1, uuid, end_seqno=3))
    assert part[0] == SnapshotMarker(0, 2, 3, uuid)
    assert [c.seqno for c in changes(part)] == [2, 3]
    # Up to date: nothing to send, not even a marker. End beyond high: stops at high.
    assert list(engine.stream("one", 0, 4, uuid)) == []
    assert [c.seqno for c in changes(engine.stream("one", 0, 3, uuid, end_seqno=99))] == [4]
    with pytest.raises(ShardexError) as err:
        engine.stream("one", 0, 3, uuid, end_seqno=2)
    assert err.value.code is ErrorCode.BAD_REQUEST


def test_stream_reads_one_snapshot_despite_concurrent_writes(engine):
    for i in range(600):  # more than one iterator chunk
        engine.upsert("one", f"d{i}", {"i": i}, durability="memory")
    it = engine.stream("one", 0, 0, 0)
    marker = next(it)
    assert marker.end == 600
    for i in range(600, 700):
        engine.upsert("one", f"d{i}", {"i": i}, durability="memory")
    assert [c.seqno for c in changes(it)] == list(range(1, 601))


def test_rollback_rules():
    meta = PartitionMeta(
        keyspace="k",
        partition=0,
        num_partitions=1,
        high_seqno=100,
        purge_seqno=10,
        failover_log=[FailoverEntry(3, 80), FailoverEntry(2, 50), FailoverEntry(1, 0)],
    )
    assert rollback_seqno(meta, 0, 999) is None  # nothing to lose
    assert rollback_seqno(meta, 90, 3) is None  # current branch
    assert rollback_seqno(meta, 100, 3) is None
    assert rollback_seqno(meta, 101, 3) == 100  # saw more than we have
    assert rollback_seqno(meta, 80, 2) is None  # old branch, at its end
    assert rollback_seqno(meta, 85, 2) == 80  # beyond where branch 2 ended
    assert rollback_seqno(meta, 60, 1) == 50
    assert rollback_seqno(meta, 40, 1) is None
    assert rollback_seqno(meta, 40, 42) == 0  # unknown uuid
    assert rollback_seqno(meta, 5, 3) == 0  # below the purge seqno
    meta.purge_seqno = 70
    assert rollback_seqno(meta, 75, 1) == 0  # branch point 50 is purged: from scratch


def test_rollback_against_new_branch(engine, tmp_path):
    for i in range(5):
        engine.upsert("one", f"d{i}", {})
    old = engine.partition_info("one", 0).uuid
    entry = engine.new_branch("one", 0)
    assert entry.seqno == 5 and entry.uuid != old
    info = engine.partition_info("one", 0)
    assert info.uuid == entry.uuid
    assert info.failover_log == [entry, FailoverEntry(old, 0)]
    engine.upsert("one", "d5", {})
    # A consumer at 3 or 5 on the old branch continues (its history is ours) ...
    assert [c.seqno for c in changes(engine.stream("one", 0, 3, old))] == [4, 5, 6]
    assert next(engine.stream("one", 0, 5, old)).uuid == entry.uuid
    # ... one that claims to have seen 6 on the old branch diverged after 5.
    assert rollback_of(lambda: engine.stream("one", 0, 6, old)) == 5
    assert rollback_of(lambda: engine.stream("one", 0, 2, 12345)) == 0
    assert rollback_of(lambda: engine.stream("one", 0, 7, entry.uuid)) == 6
    # The failover log survives a reopen.
    engine.close()
    with DataEngine(tmp_path / "db") as again:
        assert again.partition_info("one", 0).failover_log == [entry, FailoverEntry(old, 0)]
        assert rollback_of(lambda: again.stream("one", 0, 6, old)) == 5


def test_branch_after_reboot_with_unsynced_writes(tmp_path):
    def crash(eng: DataEngine) -> None:
        """Die without a clean close: no final fsync, dirty marks stay."""
        eng._store.close()
        eng._parts.clear()

    eng = DataEngine(tmp_path / "db", boot_id="boot-A")
    eng.create_keyspace("one", 1)
    eng.create_partition("one", 0)
    eng.upsert("one", "a", {})
    uuid0 = eng.partition_info("one", 0).uuid
    eng.upsert("one", "b", {}, durability="memory")
    crash(eng)
    del eng
    # Same boot: only the process died, the kernel kept the WAL: same history.
    eng = DataEngine(tmp_path / "db", boot_id="boot-A")
    assert eng.partition_info("one", 0).uuid == uuid0
    assert eng.get("one", "b").seqno == 2
    eng.upsert("one", "c", {}, durability="memory")
    crash(eng)
    del eng
    # Another boot: unsynced writes may be gone, so a new branch starts at what survived.
    eng = DataEngine(tmp_path / "db", boot_id="boot-B")
    info = eng.partition_info("one", 0)
    assert info.uuid != uuid0
    assert info.failover_log[1:] == [FailoverEntry(uuid0, 0)]
    assert info.failover_log[0].seqno == info.high_seqno == 3
    # A persist write clears the mark; a clean close after memory writes syncs and clears.
    eng.upsert("one", "d", {}, durability="memory")
    eng.upsert("one", "e", {})
    crash(eng)
    del eng
    eng = DataEngine(tmp_path / "db", boot_id="boot-C")
    after = eng.partition_info("one", 0)
    assert (after.uuid, after.high_seqno) == (info.uuid, 5)
    eng.upsert("one", "f", {}, durability="memory")
    eng.close()
    with DataEngine(tmp_path / "db", boot_id="boot-D") as eng:
        assert eng.partition_info("one", 0).uuid == info.uuid
        assert eng.get("one", "f").seqno == 6


def test_the_periodic_sync_keeps_a_busy_partitions_mark(tmp_path):
    """Under steady unsynced writes the periodic sync leaves the dirty mark (no mark fsync
    per partition per second); an idle interval removes it. A kept mark costs a reboot only
    a branch at the synced high seqno, which rolls no consumer back."""
    eng = DataEngine(tmp_path / "db", boot_id="boot-A")
    eng.create_keyspace("one", 1)
    eng.create_partition("one", 0)
    part = eng._parts[("one", 0)]
    marks: list[int] = []
    real = part.before_unsynced
    part.before_unsynced = lambda p: (marks.append(1), real(p))[1]
    eng.upsert("one", "a", {}, durability="memory")
    eng.sync(keep_busy_marks=True)  # written since the last sync: the mark stays
    assert part.dirty and part.persisted_seqno == 1
    eng.upsert("one", "b", {}, durability="memory")
    assert marks == [1]  # no second mark (and its fsync)
    eng.sync(keep_busy_marks=True)
    eng.sync(keep_busy_marks=True)  # an idle interval: removed
    assert not part.dirty and part.persisted_seqno == 2
    eng.upsert("one", "c", {}, durability="memory")
    assert marks == [1, 1]
    eng.sync()  # the plain form removes every mark
    assert not part.dirty
    eng.close()


async def test_wait_for_seqno_and_follow_live(engine):
    uuid = engine.partition_info("one", 0).uuid
    engine.upsert("one", "a", {"v": 0})
    assert await engine.wait_for_seqno("one", 0, 0, timeout=1) == 1
    assert await engine.wait_for_seqno("one", 0, 1, timeout=0.05) == 1  # timed out

    def write_later() -> None:
        for i in range(1, 6):
            engine.upsert("one", f"d{i}", {"v": i})

    got: list[Change] = []
    markers: list[SnapshotMarker] = []

    async def consume() -> None:
        async for item in engine.follow("one", 0, 0, uuid):
            if isinstance(item, SnapshotMarker):
                markers.append(item)
            else:
                got.append(item)
                if item.seqno == 6:
                    return

    task = asyncio.create_task(consume())
    await asyncio.sleep(0.05)
    thread = threading.Thread(target=write_later)
    thread.start()
    await asyncio.wait_for(task, 5)
    thread.join()
    assert [c.seqno for c in got] == [1, 2, 3, 4, 5, 6]
    assert markers[0].start == 1
    assert all(m.uuid == uuid for m in markers)
    # Every marker run is contiguous with the previous one.
    assert [m.start for m in markers[1:]] == [m.end + 1 for m in markers[:-1]]


async def test_follow_with_end_seqno_stops(engine):
    async def collect():
        return [
            c.seqno
            async for c in engine.follow("one", 0, 0, 0, end_seqno=3)
            if isinstance(c, Change)
        ]

    task = asyncio.create_task(collect())
    for i in range(5):
        await asyncio.sleep(0.01)
        await asyncio.to_thread(engine.upsert, "one", f"d{i}", {})
    assert await asyncio.wait_for(task, 5) == [1, 2, 3]


async def test_follow_ends_with_not_my_partition_when_released(engine):
    engine.upsert("one", "a", {})

    async def consume():
        async for _ in engine.follow("one", 0, 0, 0):
            pass

    task = asyncio.create_task(consume())
    await asyncio.sleep(0.05)
    await asyncio.to_thread(engine.release_partition, "one", 0)
    with pytest.raises(ShardexError) as err:
        await asyncio.wait_for(task, 5)
    assert err.value.code is ErrorCode.NOT_MY_PARTITION
    assert err.value.details["state"] == "released"
