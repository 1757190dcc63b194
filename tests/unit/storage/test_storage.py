"""The RocksDB wrapper: column families, atomic batches, snapshots, bounded iterators, SSTs."""

from __future__ import annotations

import itertools
import threading

import pytest

from shardex.errors import ErrorCode, StorageError
from shardex.storage import SstWriter, Store, rocks


def test_column_families_persist_across_reopen(tmp_path):
    with Store(tmp_path / "db") as store:
        store.column_family("slice-1").put(b"k", b"v", sync=True)
        store.column_family("slice-2").put(b"k", b"w")
    with Store(tmp_path / "db") as store:
        assert store.column_families() == ["default", "slice-1", "slice-2"]
        assert store.column_family("slice-1", create=False).get(b"k") == b"v"
        assert store.column_family("slice-2", create=False).get(b"k") == b"w"


def test_missing_column_family_without_create_is_an_error(tmp_path):
    with Store(tmp_path / "db") as store, pytest.raises(StorageError) as err:
        store.column_family("nope", create=False)
    assert err.value.code is ErrorCode.STORAGE_ERROR
    assert "nope" in err.value.message


def test_batch_is_atomic_across_column_families(tmp_path):
    with Store(tmp_path / "db") as store:
        a, b = store.column_family("a"), store.column_family("b")
        batch = store.batch()
        batch.put(a, b"1", b"x")
        batch.put(b, b"2", b"y")
        batch.delete(a, b"absent")
        snap_before = store.snapshot()
        store.write(batch, sync=True)
        assert a.get(b"1") == b"x" and b.get(b"2") == b"y"
        # The snapshot taken before the batch sees none of it, in either family.
        assert snap_before.get("a", b"1") is None
        assert snap_before.get("b", b"2") is None
        snap_after = store.snapshot()
        assert snap_after.get("a", b"1") == b"x" and snap_after.get("b", b"2") == b"y"


def test_bounded_iteration_forward_and_reverse(tmp_path):
    with Store(tmp_path / "db") as store:
        cf = store.column_family("s")
        batch = store.batch()
        for i in range(10):
            batch.put(cf, bytes([i]), str(i).encode())
        store.write(batch)
        assert [k for k, _ in cf.iterate(bytes([3]), bytes([6]))] == [b"\x03", b"\x04", b"\x05"]
        assert [k[0] for k, _ in cf.iterate(bytes([7]), None, reverse=True)] == [9, 8, 7]
        assert len(list(cf.iterate())) == 10


def test_snapshot_iteration_ignores_later_writes(tmp_path):
    with Store(tmp_path / "db") as store:
        cf = store.column_family("s")
        cf.put(b"a", b"1")
        snap = store.snapshot(["s"])
        cf.put(b"b", b"2")
        cf.delete(b"a")
        assert list(cf.iterate(snapshot=snap)) == [(b"a", b"1")]
        assert list(cf.iterate()) == [(b"b", b"2")]


def test_delete_range(tmp_path):
    with Store(tmp_path / "db") as store:
        cf = store.column_family("s")
        batch = store.batch()
        for i in range(5):
            batch.put(cf, bytes([i]), b"")
        batch.delete_range(cf, bytes([1]), bytes([4]))
        store.write(batch)
        assert [k for k, _ in cf.iterate()] == [b"\x00", b"\x04"]


def test_sst_ingestion(tmp_path):
    writer = SstWriter(tmp_path / "bulk.sst")
    for i in range(100):
        writer.put(i.to_bytes(2, "big"), b"v%d" % i)
    path = writer.finish()
    with Store(tmp_path / "db") as store:
        cf = store.column_family("s")
        cf.ingest([path])
        rows = list(cf.iterate())
        assert len(rows) == 100 and rows[42] == ((42).to_bytes(2, "big"), b"v42")


def test_sst_writer_rejects_unsorted_keys(tmp_path):
    writer = SstWriter(tmp_path / "bulk.sst")
    writer.put(b"b", b"")
    with pytest.raises(StorageError) as err:
        writer.put(b"a", b"")
    assert err.value.details["key"] == b"a".hex()


def test_closed_store_refuses_writes(tmp_path):
    store = Store(tmp_path / "db")
    cf = store.column_family("s")
    store.close()
    with pytest.raises(StorageError):
        cf.put(b"k", b"v")


def test_drop_column_family(tmp_path):
    with Store(tmp_path / "db") as store:
        store.column_family("s").put(b"k", b"v")
        store.drop_column_family("s")
        assert not store.has_column_family("s")
    with Store(tmp_path / "db") as store:
        assert store.column_families() == ["default"]


def test_snapshot_scans_span_chunks_and_interleave(tmp_path):
    """Two scans over one snapshot, advanced alternately across many chunks, each see exactly
    the snapshot's keys in order, even while the live data changes underneath."""
    with Store(tmp_path / "db") as store:
        cf = store.column_family("s")
        batch = store.batch()
        for i in range(2000):
            batch.put(cf, i.to_bytes(4, "big"), b"old")
        store.write(batch)
        snap = store.snapshot(["s"])
        batch = store.batch()
        batch.delete_range(cf, (0).to_bytes(4, "big"), (1000).to_bytes(4, "big"))
        batch.put(cf, (5000).to_bytes(4, "big"), b"new")
        store.write(batch)
        fwd = cf.iterate((10).to_bytes(4, "big"), (1990).to_bytes(4, "big"), snapshot=snap)
        rev = cf.iterate(
            (10).to_bytes(4, "big"), (1990).to_bytes(4, "big"), snapshot=snap, reverse=True
        )
        got_fwd, got_rev = [], []
        for a, b in zip(fwd, rev, strict=True):
            got_fwd.append(int.from_bytes(a[0], "big"))
            got_rev.append(int.from_bytes(b[0], "big"))
        assert got_fwd == list(range(10, 1990))
        assert got_rev == list(range(1989, 9, -1))
        # the key chunks of ``iterate_keys`` share the pinned iterator the same way
        lo, hi = (10).to_bytes(4, "big"), (1990).to_bytes(4, "big")
        fwd_keys = cf.iterate_keys(lo, hi, snapshot=snap, chunk_size=100)
        rev_keys = cf.iterate_keys(lo, hi, snapshot=snap, reverse=True, chunk_size=77)
        pairs = itertools.zip_longest(fwd_keys, rev_keys, fillvalue=[])
        got_fwd, got_rev = [], []
        for a, b in pairs:
            got_fwd += [int.from_bytes(k, "big") for k in a]
            got_rev += [int.from_bytes(k, "big") for k in b]
        assert got_fwd == list(range(10, 1990))
        assert got_rev == list(range(1989, 9, -1))
        assert cf.get((5).to_bytes(4, "big"), snapshot=snap) == b"old"
        assert cf.get((5).to_bytes(4, "big")) is None
        assert cf.get((5000).to_bytes(4, "big"), snapshot=snap) is None


def test_released_snapshot_is_refused(tmp_path):
    with Store(tmp_path / "db") as store:
        store.column_family("s")
        snap = store.snapshot(["s"])
        snap.release()
        with pytest.raises(StorageError) as err:
            list(snap.iterate("s"))
        assert err.value.details["column_family"] == "s"


def test_snapshot_never_sees_half_of_concurrent_batches(tmp_path):
    """Writers in threads each put the same counter into two families in one batch; every
    snapshot taken meanwhile must see equal values in both."""
    import threading

    with Store(tmp_path / "db") as store:
        a, b = store.column_family("a"), store.column_family("b")
        stop = threading.Event()

        def writer(tag: bytes) -> None:
            i = 0
            while not stop.is_set():
                batch = store.batch()
                batch.put(a, tag, str(i).encode())
                batch.put(b, tag, str(i).encode())
                store.write(batch)
                i += 1

        threads = [threading.Thread(target=writer, args=(t,)) for t in (b"x", b"y")]
        for t in threads:
            t.start()
        try:
            for _ in range(200):
                snap = store.snapshot(["a", "b"])
                for tag in (b"x", b"y"):
                    assert snap.get("a", tag) == snap.get("b", tag)
        finally:
            stop.set()
            for t in threads:
                t.join()


def test_the_commit_lock_makes_snapshots_and_writes_wait_for_each_other():
    """Writes share the lock, a snapshot takes it alone: each side is woken when the other
    lets go (the lock notifies only when someone waits)."""
    lock = rocks._SharedExclusiveLock()
    lock.acquire_shared()
    lock.acquire_shared()  # two writes in flight
    snapshot_in = threading.Event()

    def take_snapshot() -> None:
        lock.acquire_exclusive()
        snapshot_in.set()

    t = threading.Thread(target=take_snapshot)
    t.start()
    lock.release_shared()
    assert not snapshot_in.wait(0.05)  # one write still in flight
    lock.release_shared()
    assert snapshot_in.wait(10)
    t.join(10)
    write_in = threading.Event()

    def write() -> None:
        lock.acquire_shared()
        write_in.set()
        lock.release_shared()

    w = threading.Thread(target=write)
    w.start()
    assert not write_in.wait(0.05)  # the snapshot holds it
    lock.release_exclusive()
    assert write_in.wait(10)
    w.join(10)
    lock.acquire_exclusive()  # nothing left holding it
    lock.release_exclusive()
