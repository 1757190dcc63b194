"""One set of tests for both stores (RocksDB and the simulator's memory store), so the two
keep one contract (``shardex.storage.interface``); the memory store's crash model last."""

from __future__ import annotations

import random
import threading
from collections.abc import Callable
from pathlib import Path

import pytest

from shardex.errors import StorageError
from shardex.storage import Store
from shardex.storage.interface import KeyValueStore
from shardex.storage.memory import MemoryDisk, MemoryStore

Opener = Callable[[], KeyValueStore]


@pytest.fixture(params=["rocks", "memory"])
def opener(request: pytest.FixtureRequest, tmp_path: Path) -> Opener:
    """Opens the same database again each call (a restart of the process)."""
    if request.param == "rocks":
        return lambda: Store(tmp_path / "db")
    disk = MemoryDisk()
    return lambda: MemoryStore(disk)


@pytest.fixture
def store(opener: Opener) -> KeyValueStore:
    s = opener()
    yield s
    s.close()


def _fill(store: KeyValueStore, name: str, keys: list[bytes]) -> None:
    cf = store.column_family(name)
    batch = store.batch()
    for k in keys:
        batch.put(cf, k, b"v" + k)
    store.write(batch)


KEYS = [b"", b"\x00", b"a", b"a\x00", b"ab", b"b", b"\x7f", b"\x80", b"\xff", b"\xff\xff"]


def test_iterates_in_unsigned_byte_order_bounded_both_ways(store: KeyValueStore) -> None:
    shuffled = list(KEYS)
    random.Random(3).shuffle(shuffled)
    _fill(store, "cf", shuffled)
    cf = store.column_family("cf")
    assert [k for k, _ in cf.iterate()] == sorted(KEYS)
    assert [k for k, _ in cf.iterate(reverse=True)] == sorted(KEYS, reverse=True)
    assert [k for k, _ in cf.iterate(b"a", b"b")] == [b"a", b"a\x00", b"ab"]
    assert [k for k, _ in cf.iterate(b"a", b"b", reverse=True)] == [b"ab", b"a\x00", b"a"]
    assert [k for k, _ in cf.iterate(upper=b"a")] == [b"", b"\x00"]
    top = [b"\xff\xff", b"\xff", b"\x80"]
    assert [k for k, _ in cf.iterate(lower=b"\x80", reverse=True)] == top
    assert list(cf.iterate(b"c", b"c")) == []
    # small chunks re-seek from the last key: nothing is skipped or repeated
    assert [k for k, _ in cf.iterate(b"\x00", chunk_size=2)] == sorted(KEYS)[1:]
    assert [k for k, _ in cf.iterate(reverse=True, chunk_size=3)] == sorted(KEYS, reverse=True)
    assert dict(cf.iterate(b"ab", b"b\x00")) == {b"ab": b"vab", b"b": b"vb"}


def test_iterate_keys_walks_iterate_in_chunks(store: KeyValueStore) -> None:
    """Every bound pair (absent keys too), both directions, chunk sizes 1 to past the end:
    the chunks hold exactly ``iterate``'s keys, in order, each full but the last."""
    _fill(store, "cf", KEYS)
    cf = store.column_family("cf")
    bounds = [None, b"", b"\x00", b"a\x00", b"aa", b"b", b"\xff", b"\xff\xff", b"\xff\xff\xff"]
    for lower in bounds:
        for upper in bounds:
            for reverse in (False, True):
                want = [k for k, _ in cf.iterate(lower, upper, reverse=reverse)]
                for size in (1, 2, 3, len(KEYS), 100):
                    chunks = list(cf.iterate_keys(lower, upper, reverse=reverse, chunk_size=size))
                    assert [k for c in chunks for k in c] == want, (lower, upper, reverse, size)
                    assert all(len(c) == size for c in chunks[:-1])
                    assert all(0 < len(c) <= size for c in chunks)


def test_iterate_keys_at_a_snapshot_and_at_creation(store: KeyValueStore) -> None:
    _fill(store, "cf", [b"a", b"b", b"c"])
    cf = store.column_family("cf")
    snap = store.snapshot(["cf"])
    tip = cf.iterate_keys(chunk_size=1)
    cf.put(b"bb", b"new")
    cf.delete(b"c")
    assert list(cf.iterate_keys(snapshot=snap)) == [[b"a", b"b", b"c"]]
    assert list(snap.iterate_keys("cf", b"b", reverse=True)) == [[b"c", b"b"]]
    assert list(tip) == [[b"a"], [b"b"], [b"c"]]  # the state when it was asked for
    assert list(cf.iterate_keys()) == [[b"a", b"b", b"bb"]]
    snap.release()
    with pytest.raises(StorageError):
        list(snap.iterate_keys("cf"))


def test_point_reads_puts_deletes(store: KeyValueStore) -> None:
    cf = store.column_family("cf")
    cf.put(b"k1", b"one")
    cf.put(b"k2", b"two", sync=True)
    cf.put(b"k1", b"uno")
    cf.delete(b"k2")
    cf.delete(b"never")  # deleting an absent key is no error
    assert cf.get(b"k1") == b"uno"
    assert cf.get(b"k2") is None
    assert cf.get_tip(b"k1") == b"uno"
    assert cf.get_many([b"k2", b"k1", b"zz"]) == [None, b"uno", None]


def test_batch_spans_families_and_counts(store: KeyValueStore) -> None:
    a, b = store.column_family("a"), store.column_family("b")
    a.put(b"gone", b"x")
    batch = store.batch()
    batch.put(a, b"1", b"a1")
    batch.rocks_put(b"2", b"b2", b.handle)
    batch.put_many(b, [b"3", b"4"], [b"b3", b"b4"])
    batch.put_many(a, [b"5"])
    batch.delete(a, b"gone")
    batch.delete_many(b, [b"4"])
    assert batch.count == 7
    assert batch.size_bytes > 0
    assert a.get(b"1") is None  # nothing applies before the write
    store.write(batch, sync=True)
    assert dict(a.iterate()) == {b"1": b"a1", b"5": b""}
    assert dict(b.iterate()) == {b"2": b"b2", b"3": b"b3"}
    with pytest.raises(StorageError):
        store.batch().put_many(a, [b"x", b"y"], [b"1"])
    store.write(store.batch())  # an empty batch is a no-op


def test_delete_range(store: KeyValueStore) -> None:
    _fill(store, "cf", KEYS)
    cf = store.column_family("cf")
    batch = store.batch()
    batch.delete_range(cf, b"a", b"b")
    store.write(batch)
    left = [b"", b"\x00", b"b", b"\x7f", b"\x80", b"\xff", b"\xff\xff"]
    assert [k for k, _ in cf.iterate()] == left


def test_snapshot_sees_one_state_across_families(store: KeyValueStore) -> None:
    a, b = store.column_family("a"), store.column_family("b")
    batch = store.batch()
    batch.put(a, b"k", b"a-old")
    batch.put(b, b"k", b"b-old")
    store.write(batch)
    snap = store.snapshot(["a", "b"])
    batch = store.batch()
    batch.put(a, b"k", b"a-new")
    batch.put(b, b"j", b"b-new")
    batch.delete(b, b"k")
    store.write(batch)
    assert snap.get("a", b"k") == b"a-old"
    assert a.get(b"k", snapshot=snap) == b"a-old"
    assert list(snap.iterate("b")) == [(b"k", b"b-old")]
    assert list(b.iterate(snapshot=snap, reverse=True)) == [(b"k", b"b-old")]
    assert a.get(b"k") == b"a-new"
    with pytest.raises(StorageError):
        snap.get("c", b"k")  # not in the snapshot
    snap.release()
    with pytest.raises(StorageError):
        list(snap.iterate("a"))


def test_iterator_reads_the_state_of_its_creation(store: KeyValueStore) -> None:
    _fill(store, "cf", [b"a", b"b", b"c"])
    cf = store.column_family("cf")
    it = cf.iterate()
    assert next(it) == (b"a", b"va")
    cf.put(b"bb", b"new")
    cf.delete(b"c")
    assert [k for k, _ in it] == [b"b", b"c"]


def test_column_families_create_drop_and_reopen(opener: Opener) -> None:
    s = opener()
    assert s.column_families() == ["default"]
    s.column_family("x").put(b"k", b"v", sync=True)
    s.column_family("y").put(b"k", b"w")  # unsynced: survives a process restart
    s.column_family().put(b"d", b"1")
    assert s.column_families() == ["default", "x", "y"]
    assert s.has_column_family("x")
    with pytest.raises(StorageError):
        s.column_family("nope", create=False)
    with pytest.raises(StorageError):
        s.drop_column_family("default")
    s.drop_column_family("x")
    s.drop_column_family("x")  # idempotent
    assert not s.has_column_family("x")
    s.close()
    with pytest.raises(StorageError):
        s.write(_one_put(s))
    s = opener()
    try:
        assert s.column_families() == ["default", "y"]
        assert s.column_family("y").get(b"k") == b"w"
        assert s.column_family().get(b"d") == b"1"
        assert s.column_family("x").get(b"k") is None  # dropped stays dropped
    finally:
        s.close()


def _one_put(s: KeyValueStore) -> object:
    batch = s.batch()
    batch.put(s.column_family("default", create=False), b"k", b"v")
    return batch


def test_concurrent_writers_and_snapshots_never_tear(store: KeyValueStore) -> None:
    """Every batch writes the same counter to two families: a snapshot sees them equal."""
    a, b = store.column_family("a"), store.column_family("b")
    stop = threading.Event()

    def writer() -> None:
        i = 0
        while not stop.is_set():
            batch = store.batch()
            v = str(i).encode()
            batch.put(a, b"n", v)
            batch.put(b, b"n", v)
            store.write(batch)
            i += 1

    t = threading.Thread(target=writer)
    t.start()
    try:
        for _ in range(200):
            snap = store.snapshot(["a", "b"])
            assert snap.get("a", b"n") == snap.get("b", b"n")
            snap.release()
    finally:
        stop.set()
        t.join()


# --- the memory store's crash model (the simulated disk) ------------------------------------


def test_power_off_keeps_what_was_synced() -> None:
    disk = MemoryDisk()
    s = MemoryStore(disk)
    cf = s.column_family("cf")
    cf.put(b"a", b"1")
    cf.put(b"b", b"2", sync=True)  # syncs a too: the WAL is one sequence
    cf.put(b"c", b"3")
    cf.put(b"d", b"4")
    assert disk.crash(power_off=True) == 2
    with pytest.raises(StorageError):
        cf.put(b"e", b"5")  # the crashed process cannot write any more
    s = MemoryStore(disk)
    assert dict(s.column_family("cf").iterate()) == {b"a": b"1", b"b": b"2"}


def test_process_crash_keeps_every_write() -> None:
    disk = MemoryDisk()
    s = MemoryStore(disk)
    s.column_family("cf").put(b"a", b"1")
    assert disk.crash() == 0
    assert MemoryStore(disk).column_family("cf").get(b"a") == b"1"


def test_power_off_keeps_a_prefix_of_whole_batches() -> None:
    """A seeded power-off keeps the first n unsynced batches, each whole."""
    for seed in range(20):
        disk = MemoryDisk()
        s = MemoryStore(disk)
        a, b = s.column_family("a"), s.column_family("b")
        for i in range(5):
            batch = s.batch()
            batch.put(a, bytes([i]), b"x")
            batch.put(b, bytes([i]), b"y")
            s.write(batch)
        lost = disk.crash(power_off=True, rng=random.Random(seed))
        s = MemoryStore(disk)
        kept = [k for k, _ in s.column_family("a").iterate()]
        assert kept == [bytes([i]) for i in range(5 - lost)]
        assert kept == [k for k, _ in s.column_family("b").iterate()]


def test_memory_store_refuses_sst_ingestion() -> None:
    with pytest.raises(StorageError):
        MemoryStore().column_family("cf").ingest(["/nowhere.sst"])


def test_storage_bytes_grow_with_what_a_column_family_holds(store: KeyValueStore) -> None:
    cf = store.column_family("sized")
    other = store.column_family("other")
    before = sum(cf.storage_bytes())
    batch = store.batch()
    for i in range(200):
        batch.put(cf, b"k%04d" % i, b"v" * 500)
    store.write(batch)
    store.flush()
    assert sum(cf.storage_bytes()) > before
    assert sum(other.storage_bytes()) < sum(cf.storage_bytes())  # per column family
