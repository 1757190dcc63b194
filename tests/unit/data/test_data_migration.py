"""Partition hand-over: snapshot + ingest + catch-up keep seqnos, uuid and failover log, the
target continues the same history; frozen and released partitions answer as documented."""

from __future__ import annotations

import asyncio

import pytest

from shardex.api.records import Change, MutationResult, SnapshotMarker
from shardex.data.engine import DataEngine
from shardex.errors import ErrorCode, ShardexError
from shardex.meta.partitioning import partition_of


@pytest.fixture
def pair(tmp_path):
    src = DataEngine(tmp_path / "src")
    dst = DataEngine(tmp_path / "dst")
    for eng in (src, dst):
        eng.create_keyspace("one", 1)
    src.create_partition("one", 0)
    yield src, dst
    src.close()
    dst.close()


def log(eng: DataEngine, from_seqno: int = 0) -> list[Change]:
    return [c for c in eng.stream("one", 0, from_seqno, 0) if isinstance(c, Change)]


def test_snapshot_is_consistent_and_in_docid_order(pair):
    src, _ = pair
    for i in (3, 1, 2):
        src.upsert("one", f"doc{i}", {"i": i})
    src.delete("one", "doc2")
    with src.snapshot_partition("one", 0) as snap:
        src.upsert("one", "doc0", {"late": True})  # after the snapshot: not in it
        assert snap.high_seqno == 4 and snap.uuid == src.partition_info("one", 0).uuid
        assert [d for d, _ in snap.documents()] == ["doc1", "doc3"]
        assert [d for d, _ in snap.documents(include_deleted=True)] == ["doc1", "doc2", "doc3"]
        assert [c.seqno for c in snap.changes()] == [1, 2, 3, 4]
        assert [c.seqno for c in snap.changes(after=2)] == [3, 4]


def test_copy_preserves_history_and_target_continues(pair):
    src, dst = pair
    for i in range(50):
        src.upsert("one", f"d{i}", {"i": i})
    src.delete("one", "d7")
    src.new_branch("one", 0)
    src.set_consumer_checkpoint("pipeline", "one", 0, 20)
    first = src.upsert("one", "d1", {"i": "x"})
    with src.snapshot_partition("one", 0) as snap:
        info = dst.ingest_partition("one", 0, snap.info, snap.raw_items())
    assert info.state == "pending"
    # Writes continue at the source during the copy; the target catches up from its stream.
    for i in range(50, 60):
        src.upsert("one", f"d{i}", {"i": i})
    src.delete("one", "d8")
    mine = dst.partition_info("one", 0)
    dst.apply_changes("one", 0, src.stream("one", 0, mine.high_seqno, mine.uuid))
    # Re-sending an overlapping run is harmless.
    assert dst.apply_changes("one", 0, src.stream("one", 0, 40, mine.uuid)) == 63

    # Hand-over: freeze, final catch-up, release, activate.
    frozen = src.freeze_partition("one", 0)
    with pytest.raises(ShardexError) as err:
        src.upsert("one", "d1", {})
    assert err.value.code is ErrorCode.NOT_MY_PARTITION
    assert err.value.details["retryable"] is True and err.value.details["state"] == "frozen"
    assert src.get("one", "d1").doc == {"i": "x"}  # reads continue while frozen
    dst.apply_changes(
        "one", 0, src.stream("one", 0, dst.partition_info("one", 0).high_seqno, mine.uuid)
    )
    src_log = log(src)
    src.release_partition("one", 0)
    dst.activate_partition("one", 0)

    s, d = frozen, dst.partition_info("one", 0)
    assert (d.high_seqno, d.uuid, d.failover_log, d.purge_seqno, d.doc_count) == (
        s.high_seqno,
        s.uuid,
        s.failover_log,
        s.purge_seqno,
        s.doc_count,
    )
    assert d.max_cas == s.max_cas and d.uuid == first.uuid
    assert len(d.failover_log) == 2
    assert dst.consumer_checkpoints("one", 0) == {"pipeline": 20}
    # Same documents, same change log (seqnos, cas, tombstones), byte for byte.
    assert dst.get("one", "d1") == ({"i": "x"}, first.cas, first.seqno)
    assert log(dst) == src_log and len(src_log) == 63
    with pytest.raises(ShardexError):
        dst.get("one", "d7")
    # The source no longer serves anything.
    for call in (
        lambda: src.get("one", "d1"),
        lambda: src.upsert("one", "d1", {}),
        lambda: src.stream("one", 0, 0, 0),
        lambda: src.snapshot_partition("one", 0),
    ):
        with pytest.raises(ShardexError) as err:
            call()
        assert err.value.code is ErrorCode.NOT_MY_PARTITION
        assert err.value.details["partition"] == 0 and err.value.details["state"] == "released"
    assert list(src.high_seqnos("one")) == []

    # The target continues the same history: next seqno, later CAS, old offsets still valid.
    r = dst.upsert("one", "d1", {"i": "after"})
    assert r.seqno == s.high_seqno + 1 and r.uuid == s.uuid and r.cas > s.max_cas
    assert [c.seqno for c in dst.stream("one", 0, 60, first.uuid) if isinstance(c, Change)] == [
        61,
        62,
        63,
        64,
    ]
    src.drop_partition("one", 0)
    assert src.partitions("one") == []


def test_copied_log_is_identical(pair):
    src, dst = pair
    for i in range(30):
        src.upsert("one", f"d{i % 7}", {"i": i})
        if i % 6 == 5:
            src.delete("one", f"d{i % 7}")
    with src.snapshot_partition("one", 0) as snap:
        dst.ingest_partition("one", 0, snap.info, snap.raw_items(), activate=True)
    assert log(dst) == log(src)
    for i in range(7):
        try:
            assert dst.get("one", f"d{i}") == src.get("one", f"d{i}")
        except ShardexError as exc:
            assert exc.code is ErrorCode.DOC_NOT_FOUND


def test_released_state_survives_restart_and_frozen_does_not(tmp_path):
    with DataEngine(tmp_path / "db") as eng:
        eng.create_keyspace("two", 2)
        eng.create_partition("two", 0)
        eng.create_partition("two", 1)
        eng.freeze_partition("two", 0)
        eng.release_partition("two", 1)
    with DataEngine(tmp_path / "db") as eng:
        d0 = next(f"k{i}" for i in range(99) if partition_of(f"k{i}", 2) == 0)
        d1 = next(f"k{i}" for i in range(99) if partition_of(f"k{i}", 2) == 1)
        assert isinstance(eng.upsert("two", d0, {}), MutationResult)  # hand-over abandoned
        with pytest.raises(ShardexError) as err:
            eng.upsert("two", d1, {})
        assert err.value.details["state"] == "released"
        eng.freeze_partition("two", 0)
        eng.unfreeze_partition("two", 0)
        assert eng.upsert("two", d0, {}).seqno == 2


def test_ingest_refusals_and_retry(pair, tmp_path):
    src, dst = pair
    src.upsert("one", "a", {})
    with src.snapshot_partition("one", 0) as snap:
        items = list(snap.raw_items())
        info = snap.info
    # A failed half-copy (bad key) leaves nothing behind; a retry then succeeds.
    with pytest.raises(ShardexError) as err:
        dst.ingest_partition("one", 0, info, [*items, (b"m", b"x")])
    assert err.value.code is ErrorCode.BAD_REQUEST
    assert dst.partitions("one") == []
    dst.ingest_partition("one", 0, info, items)
    dst.ingest_partition("one", 0, info, items)  # replacing a pending copy is allowed
    dst.activate_partition("one", 0)
    with pytest.raises(ShardexError):
        dst.ingest_partition("one", 0, info, items)  # an active one is not replaced
    # Catch-up only on pending partitions, and never with a gap.
    with pytest.raises(ShardexError) as err:
        dst.apply_changes("one", 0, [])
    assert "pending" in err.value.message
    other = DataEngine(tmp_path / "other")
    other.create_keyspace("one", 1)
    other.ingest_partition("one", 0, info, items)
    gap = Change(partition=0, seqno=5, docid="z", op="upsert", cas=1, body=b"{}")
    with pytest.raises(ShardexError) as err:
        other.apply_changes("one", 0, [SnapshotMarker(0, 2, 5, info.uuid), gap])
    assert err.value.details == {"expected": 2, "got": 5}
    assert other.partition_info("one", 0).high_seqno == 1
    other.close()
    # Snapshot from another keyspace shape is refused.
    eng = DataEngine(tmp_path / "shape")
    eng.create_keyspace("one", 2)
    with pytest.raises(ShardexError) as err:
        eng.ingest_partition("one", 0, info, items)
    assert err.value.code is ErrorCode.BAD_REQUEST
    eng.close()


def test_half_created_partition_is_dropped_on_open(tmp_path):
    eng = DataEngine(tmp_path / "db")
    eng.create_keyspace("one", 1)
    eng._store.column_family("p/one/0").put(b"d" + b"x", b"junk", sync=True)  # no meta
    eng.close()
    with DataEngine(tmp_path / "db") as eng:
        assert eng.partitions("one") == []
        assert "p/one/0" not in eng._store.column_families()
        eng.create_partition("one", 0)


def test_batch_spanning_a_frozen_partition_writes_the_others(tmp_path):
    with DataEngine(tmp_path / "db") as eng:
        eng.create_keyspace("four", 4)
        for p in range(4):
            eng.create_partition("four", p)
        eng.freeze_partition("four", 2)
        items = [(f"d{i}", {"i": i}) for i in range(40)]
        results = eng.upsert_many("four", items)
        for (docid, _), r in zip(items, results, strict=True):
            if partition_of(docid, 4) == 2:
                assert r.code is ErrorCode.NOT_MY_PARTITION and r.details["retryable"]
            else:
                assert isinstance(r, MutationResult)
        assert eng.partition_info("four", 2).high_seqno == 0
        eng.unfreeze_partition("four", 2)
        retry = [
            it for it, r in zip(items, results, strict=True) if not isinstance(r, MutationResult)
        ]
        assert all(isinstance(r, MutationResult) for r in eng.upsert_many("four", retry))


async def test_drop_ends_a_waiting_follower(pair):
    src, _ = pair

    async def consume():
        async for _ in src.follow("one", 0, 0, 0):
            pass

    task = asyncio.create_task(consume())
    await asyncio.sleep(0.05)
    src.drop_partition("one", 0)
    with pytest.raises(ShardexError) as err:
        await asyncio.wait_for(task, 5)
    assert err.value.code is ErrorCode.NOT_MY_PARTITION
    with pytest.raises(ShardexError) as err:
        src.upsert("one", "a", {})
    assert err.value.details["state"] == "absent"
