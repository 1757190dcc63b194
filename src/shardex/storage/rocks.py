"""RocksDB through rocksdict, in raw-bytes mode.

Why a wrapper at all: rocksdict exposes RocksDB faithfully but leaves three things to the
caller that every shardex service needs the same way:

* column families opened by name and kept open (a slice or a data partition is one);
* atomic multi-column-family write batches with an explicit durability choice (``sync=True``
  syncs the WAL before returning: what the data service's acknowledged writes rely on);
* snapshots that are consistent *across* column families. A rocksdict ``Snapshot`` is bound
  to one column family; taking several while a writer commits a batch between them would tear.
  Every write through a ``Store`` and every multi-family snapshot hold one lock, so a
  ``StoreSnapshot`` never sees half a batch.

Keys and values are ``bytes`` throughout; encoding is the caller's (the key codec, msgspec).
"""

from __future__ import annotations

import itertools
import operator
import os
import threading
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from functools import partial
from itertools import repeat
from pathlib import Path

from rocksdict import (
    BlockBasedOptions,
    IngestExternalFileOptions,
    Options,
    Rdict,
    RdictIter,
    ReadOptions,
    Snapshot,
    WriteBatch,
    WriteOptions,
)
from rocksdict import SstFileWriter as _RocksSstWriter

from shardex.errors import StorageError

DEFAULT_CF = "default"


def _options(*, bloom: bool = True) -> Options:
    opts = Options(raw_mode=True)
    opts.create_if_missing(True)
    opts.create_missing_column_families(True)
    if not bloom:
        return opts
    # A bloom filter per SST (10 bits/key, ~1% false positives): a point read of a key that
    # is absent (a new docid's back row in every stabilise, a new document) skips the files
    # that cannot hold it instead of searching each one's index. RocksDB's default table has
    # none. Measured: 30k gets over 500k keys in SSTs, half absent, 2.3-2.9 vs 3.4-4.2 us.
    table = BlockBasedOptions()
    table.set_bloom_filter(10, False)
    opts.set_block_based_table_factory(table)
    return opts


_CHUNK = 512


def _write_options(sync: bool, no_stall: bool = False) -> WriteOptions:
    wo = WriteOptions()
    wo.sync = sync
    wo.no_slowdown = no_stall
    return wo


# Built once, read by every write (rocksdict copies them into RocksDB's own per call).
_SYNC = _write_options(True)
_NO_SYNC = _write_options(False)
_NO_SYNC_NO_STALL = _write_options(False, no_stall=True)


def _scan_chunks(
    it: RdictIter,
    lock: threading.Lock | None,
    lower: bytes | None,
    upper: bytes | None,
    reverse: bool,
    chunk_size: int = _CHUNK,
) -> Iterator[tuple[bytes, bytes]]:
    """Walk ``[lower, upper)`` of a RocksDB iterator in byte order (or reversed).

    Bounds are applied here rather than through rocksdict's ReadOptions because rocksdict
    0.3.29 encodes iterator bounds without raw mode (the lower bound is silently ignored).
    The iterator may be shared (a snapshot's pinned iterator): each chunk re-seeks from the
    last key returned while holding ``lock``, so concurrent scans over one snapshot never
    interleave inside a chunk. ``chunk_size``: entries per chunk; a caller that will stop
    after ``n`` entries (a scan's limit) passes ``n`` so no entry past it is read.
    """
    size = max(1, chunk_size)
    last: bytes | None = None
    while True:
        chunk: list[tuple[bytes, bytes]] = []
        with lock if lock is not None else _NO_LOCK:
            if not reverse:
                if last is not None:
                    it.seek(last)
                    if it.valid() and it.key() == last:
                        it.next()
                elif lower is not None:
                    it.seek(lower)
                else:
                    it.seek_to_first()
                while it.valid() and len(chunk) < size:
                    k = it.key()
                    if upper is not None and k >= upper:
                        break
                    chunk.append((k, it.value()))
                    it.next()
            else:
                start = last if last is not None else upper
                if start is not None:
                    it.seek_for_prev(start)
                    # seek_for_prev lands on start itself when present; start is exclusive.
                    if it.valid() and it.key() == start:
                        it.prev()
                else:
                    it.seek_to_last()
                while it.valid() and len(chunk) < size:
                    k = it.key()
                    if lower is not None and k < lower:
                        break
                    chunk.append((k, it.value()))
                    it.prev()
        yield from chunk
        if len(chunk) < size:
            return
        last = chunk[-1][0]


def _key_chunks(
    it: RdictIter,
    lock: threading.Lock | None,
    lower: bytes | None,
    upper: bytes | None,
    reverse: bool,
    chunk_size: int = _CHUNK,
) -> Iterator[list[bytes]]:
    """The keys of ``[lower, upper)`` (or reversed) in lists of ``chunk_size`` (the last
    shorter; none when empty): ``_scan_chunks``'s walk, re-seeking and locking per chunk
    alike, for a caller that needs no values (an index's entries are all key).

    A chunk is read by C iterators only: ``zip`` calls the step (``next``/``prev``) and then
    ``key`` for each entry, and ``takewhile`` stops at the first key that is None (the end:
    rocksdict's ``key`` of an exhausted iterator) or out of bounds, before the next step is
    pulled (a step on an exhausted rocksdict iterator crashes the process). That is two
    rocksdict calls per entry and no bytecode, against four calls, a tuple and the loop's
    bytecode in ``_scan_chunks``.
    """
    size = max(1, chunk_size)
    step = it.prev if reverse else it.next
    key = it.key
    # Whether a key is still inside the range on the far side of the walk.
    inside = (
        (None if lower is None else partial(operator.le, lower))
        if reverse
        else (None if upper is None else partial(operator.gt, upper))
    )
    no_args = itertools.repeat(())
    last: bytes | None = None
    while True:
        with lock if lock is not None else _NO_LOCK:
            if last is not None:
                if reverse:
                    it.seek_for_prev(last)
                else:
                    it.seek(last)
                if key() == last:  # None (exhausted) never equals a key
                    step()
            elif reverse:
                if upper is not None:
                    it.seek_for_prev(upper)
                    # seek_for_prev lands on upper itself when present; upper is exclusive.
                    if key() == upper:
                        step()
                else:
                    it.seek_to_last()
            elif lower is not None:
                it.seek(lower)
            else:
                it.seek_to_first()
            first = key()
            if first is None or (inside is not None and not inside(first)):
                return
            # (None, key) per entry: the step, then the key it lands on (both never end).
            steps, keys_at = itertools.starmap(step, no_args), itertools.starmap(key, no_args)
            pairs = zip(steps, keys_at, strict=True)
            keys = map(operator.itemgetter(1), pairs)
            keys = itertools.takewhile(partial(operator.is_not, None), keys)
            if inside is not None:
                keys = itertools.takewhile(inside, keys)
            chunk = [first]
            chunk += itertools.islice(keys, size - 1)
        yield chunk
        if len(chunk) < size:
            return
        last = chunk[-1]


class _NoLock:
    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: object) -> None:
        return None


_NO_LOCK = _NoLock()


def _drain(calls: Iterator[object]) -> None:
    """Run every call of a ``map`` (results dropped) without a Python-level loop."""
    deque(calls, maxlen=0)


class ColumnFamily:
    """One named keyspace inside a ``Store`` (for example one index slice)."""

    def __init__(self, store: Store, name: str, rdict: Rdict) -> None:
        self._store = store
        self.name = name
        self._rdict = rdict
        # rocksdict's handle, an attribute (not a property): read per put on the write path
        self.handle: object = store._db.get_column_family_handle(name)
        # ``get(key)`` at the tip without the wrapper's call: rocksdict's own bound method,
        # for the write path's per-op read of the current document (``Partition.stage``).
        self.get_tip: Callable[[bytes], bytes | None] = rdict.get

    def get(self, key: bytes, snapshot: StoreSnapshot | None = None) -> bytes | None:
        if snapshot is not None:
            return snapshot.get(self.name, key)
        return self._rdict.get(key)

    def get_many(self, keys: list[bytes]) -> list[bytes | None]:
        """Point reads of many keys at the tip (a stabilise reads the back row of every
        docid it decides). One rocksdict ``get`` per key in a comprehension: rocksdict
        0.3.29's list form (``MultiGet``) measured 2-2.5x slower per key (1.2-2.2 us vs
        2.9-3.8 us, 30k keys of a column family, ``/tmp`` bench in
        ``bench/diagnostics/indexer_profile.py``); ``map`` rather than a comprehension:
        the loop over the keys runs in C."""
        return list(map(self._rdict.get, keys))

    def put(self, key: bytes, value: bytes, *, sync: bool = False) -> None:
        batch = self._store.batch()
        batch.put(self, key, value)
        self._store.write(batch, sync=sync)

    def delete(self, key: bytes, *, sync: bool = False) -> None:
        batch = self._store.batch()
        batch.delete(self, key)
        self._store.write(batch, sync=sync)

    def iterate(
        self,
        lower: bytes | None = None,
        upper: bytes | None = None,
        *,
        reverse: bool = False,
        snapshot: StoreSnapshot | None = None,
        chunk_size: int = _CHUNK,
    ) -> Iterator[tuple[bytes, bytes]]:
        """(key, value) pairs with ``lower <= key < upper`` in byte order (or reversed),
        read ``chunk_size`` at a time (see ``_scan_chunks``)."""
        if snapshot is not None:
            return snapshot.iterate(self.name, lower, upper, reverse=reverse, chunk_size=chunk_size)
        # A fresh RocksDB iterator reads an implicit snapshot taken at its creation, so even
        # a scan without an explicit snapshot sees one consistent state.
        it = self._rdict.iter(ReadOptions())
        return _scan_chunks(it, None, lower, upper, reverse, chunk_size)

    def iterate_keys(
        self,
        lower: bytes | None = None,
        upper: bytes | None = None,
        *,
        reverse: bool = False,
        snapshot: StoreSnapshot | None = None,
        chunk_size: int = _CHUNK,
    ) -> Iterator[list[bytes]]:
        """The keys of ``iterate`` in lists of ``chunk_size`` (see ``_key_chunks``)."""
        if snapshot is not None:
            return snapshot.iterate_keys(
                self.name, lower, upper, reverse=reverse, chunk_size=chunk_size
            )
        return _key_chunks(self._rdict.iter(ReadOptions()), None, lower, upper, reverse, chunk_size)

    def storage_bytes(self) -> tuple[int, int]:
        """(bytes of the live SST files, bytes the memtables hold): RocksDB's own counts,
        from memory, about a microsecond each (the node's metrics read them per scrape).
        A memtable's count is its arena's, allocated in blocks: a few KiB written show as
        up to a MiB until flushed."""
        prop = self._rdict.property_int_value
        return (
            prop("rocksdb.live-sst-files-size") or 0,
            prop("rocksdb.cur-size-all-mem-tables") or 0,
        )

    def ingest(self, sst_paths: Iterable[str | os.PathLike[str]], *, move: bool = True) -> None:
        """Bulk-load SST files written by ``SstWriter`` (sorted, non-overlapping with each
        other). ``move`` hands the files to RocksDB instead of copying them."""
        paths = [str(p) for p in sst_paths]
        if not paths:
            return
        opts = IngestExternalFileOptions()
        opts.set_move_files(move)
        try:
            self._rdict.ingest_external_file(paths, opts)
        except Exception as exc:  # rocksdict raises plain Exception subclasses
            raise StorageError(
                f"SST ingestion into {self.name!r} failed: {exc}",
                details={"column_family": self.name, "files": paths},
            ) from exc


class Batch:
    """An atomic group of puts and deletes over any column families of one store."""

    def __init__(self) -> None:
        self._wb = WriteBatch(raw_mode=True)
        # rocksdict's own ``put(key, value, cf.handle)``, bound once: the write path's per-op
        # puts (``Partition.stage``, ``commit_many``) skip a wrapper call each. Safe to use
        # beside the wrapper methods: ``count`` is the batch's own record count.
        self.rocks_put: Callable[[bytes, bytes, object], None] = self._wb.put
        self._written: int | None = None  # the count once written (rocksdict consumes it)

    @property
    def count(self) -> int:
        """Records in the batch (puts, deletes, range deletes)."""
        return len(self._wb) if self._written is None else self._written

    def put(self, cf: ColumnFamily, key: bytes, value: bytes) -> None:
        self._wb.put(key, value, cf.handle)

    def delete(self, cf: ColumnFamily, key: bytes) -> None:
        self._wb.delete(key, cf.handle)

    # The *_many forms add a whole list with one wrapper call: per key they cost only
    # rocksdict's own ``put``/``delete`` (the per-call wrapper was most of a stabilise's
    # batch-building time), called by ``map`` so the loop itself runs in C.
    def put_many(
        self, cf: ColumnFamily, keys: list[bytes], values: list[bytes] | None = None
    ) -> None:
        """Put ``keys[i] -> values[i]`` (``b""`` for every key when ``values`` is None)."""
        h = cf.handle
        if values is None:
            _drain(map(self._wb.put, keys, repeat(b""), repeat(h)))
        else:
            if len(values) != len(keys):
                raise StorageError(
                    f"put_many got {len(keys)} keys but {len(values)} values",
                    details={"column_family": cf.name, "hint": "pass one value per key"},
                )
            _drain(map(self._wb.put, keys, values, repeat(h)))

    def delete_many(self, cf: ColumnFamily, keys: list[bytes]) -> None:
        _drain(map(self._wb.delete, keys, repeat(cf.handle)))

    def delete_range(self, cf: ColumnFamily, lower: bytes, upper: bytes) -> None:
        """Delete every key in [lower, upper)."""
        self._wb.delete_range(lower, upper, cf.handle)

    @property
    def size_bytes(self) -> int:
        return int(self._wb.size_in_bytes())


class StoreSnapshot:
    """A point-in-time view over column families of a store.

    rocksdict 0.3.29 drops the snapshot when it builds an iterator over a ``Snapshot`` (its
    ``Snapshot.iter`` converts the read options twice and loses ``set_snapshot``), so range
    reads here use a RocksDB iterator created at snapshot time instead: a RocksDB iterator
    reads an implicit snapshot fixed at its creation, however often it is re-seeked. Point
    reads use rocksdict's ``Snapshot``, whose ``get`` does honour the snapshot.
    """

    def __init__(self, parts: dict[str, tuple[Snapshot, RdictIter]]) -> None:
        self._parts = parts
        self._locks = {name: threading.Lock() for name in parts}

    def _part(self, cf_name: str) -> tuple[Snapshot, RdictIter]:
        try:
            return self._parts[cf_name]
        except KeyError:
            raise StorageError(
                f"column family {cf_name!r} is not in this snapshot",
                details={"column_family": cf_name, "hint": "released, or created after it"},
            ) from None

    def get(self, cf_name: str, key: bytes) -> bytes | None:
        snap, _ = self._part(cf_name)
        try:
            return snap[key]
        except KeyError:
            return None
        except Exception as exc:  # rocksdict raises a bare Exception("key not found")
            if "not found" in str(exc):
                return None
            raise

    def iterate(
        self,
        cf_name: str,
        lower: bytes | None = None,
        upper: bytes | None = None,
        *,
        reverse: bool = False,
        chunk_size: int = _CHUNK,
    ) -> Iterator[tuple[bytes, bytes]]:
        _, it = self._part(cf_name)
        return _scan_chunks(it, self._locks[cf_name], lower, upper, reverse, chunk_size)

    def iterate_keys(
        self,
        cf_name: str,
        lower: bytes | None = None,
        upper: bytes | None = None,
        *,
        reverse: bool = False,
        chunk_size: int = _CHUNK,
    ) -> Iterator[list[bytes]]:
        _, it = self._part(cf_name)
        return _key_chunks(it, self._locks[cf_name], lower, upper, reverse, chunk_size)

    def release(self) -> None:
        """Drop the pinned iterators and snapshots so RocksDB can reclaim old versions."""
        self._parts.clear()


class _SharedExclusiveLock:
    """Many writers at once, or one snapshot-taker alone.

    Writers share the lock so RocksDB can group-commit their WAL syncs (an exclusive lock
    would serialise every fsync); taking a multi-family snapshot excludes writers so it never
    sees half a batch. Writer-preferring is unnecessary: snapshots are short and rare.
    """

    def __init__(self) -> None:
        # Taken as the plain lock (a C context manager; the Condition's is Python code, and
        # every write takes this twice), and notified only when some thread waits.
        self._lock = threading.Lock()
        self._cond = threading.Condition(self._lock)
        self._shared = 0
        self._exclusive = False
        self._waiting = 0

    def _wait(self) -> None:
        self._waiting += 1
        try:
            self._cond.wait()
        finally:
            self._waiting -= 1

    def acquire_shared(self) -> None:
        with self._lock:
            while self._exclusive:
                self._wait()
            self._shared += 1

    def release_shared(self) -> None:
        with self._lock:
            self._shared -= 1
            if self._shared == 0 and self._waiting:
                self._cond.notify_all()

    def acquire_exclusive(self) -> None:
        with self._lock:
            while self._exclusive or self._shared:
                self._wait()
            self._exclusive = True

    def release_exclusive(self) -> None:
        with self._lock:
            self._exclusive = False
            if self._waiting:
                self._cond.notify_all()


class Store:
    """One RocksDB database directory with named column families."""

    on_disk = True  # files under ``path`` (``interface.KeyValueStore``)

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)
        self.path.mkdir(parents=True, exist_ok=True)
        self._lock = threading.Lock()  # column-family registry and close
        self._commit = _SharedExclusiveLock()  # writes (shared) vs snapshots (exclusive)
        opts = _options()
        try:
            existing = Rdict.list_cf(str(self.path), _options())
        except Exception:
            existing = [DEFAULT_CF]  # a new database has only the default family
        cfs = {name: _options() for name in existing if name != DEFAULT_CF}
        try:
            self._db = Rdict(str(self.path), opts, column_families=cfs or None)
        except Exception as exc:
            raise StorageError(
                f"cannot open RocksDB at {self.path}: {exc}",
                details={"path": str(self.path), "hint": "is another process using it?"},
            ) from exc
        self._cfs: dict[str, ColumnFamily] = {}
        self._cfs[DEFAULT_CF] = ColumnFamily(self, DEFAULT_CF, self._db)
        for name in cfs:
            self._cfs[name] = ColumnFamily(self, name, self._db.get_column_family(name))
        self._closed = False

    # column families -----------------------------------------------------------------
    def column_families(self) -> list[str]:
        return sorted(self._cfs)

    def has_column_family(self, name: str) -> bool:
        return name in self._cfs

    def column_family(self, name: str = DEFAULT_CF, *, create: bool = True) -> ColumnFamily:
        cf = self._cfs.get(name)
        if cf is not None:
            return cf
        if not create:
            raise StorageError(f"no column family {name!r}", details={"column_family": name})
        with self._lock:
            if name not in self._cfs:
                rd = self._db.create_column_family(name, _options())
                self._cfs[name] = ColumnFamily(self, name, rd)
        return self._cfs[name]

    def drop_column_family(self, name: str) -> None:
        if name == DEFAULT_CF:
            raise StorageError("the default column family cannot be dropped")
        with self._lock:
            if self._cfs.pop(name, None) is not None:
                self._db.drop_column_family(name)

    # writes ----------------------------------------------------------------------------
    def batch(self) -> Batch:
        return Batch()

    def write(self, batch: Batch, *, sync: bool = False, no_stall: bool = False) -> None:
        """Apply ``batch`` atomically. ``sync=True`` fsyncs the WAL before returning, so the
        batch survives a machine crash; ``sync=False`` survives a process crash only.
        ``no_stall`` (unsynced writes only): fail at once, writing nothing, where RocksDB
        would slow the write down or stop it (a write stall): for a caller that must not
        wait, an event loop."""
        if sync and no_stall:
            raise ValueError("a synced write always waits for its fsync")
        count = batch.count
        if count == 0:
            return
        self._commit.acquire_shared()
        try:
            self._check_open()
            self._db.write(
                batch._wb, _SYNC if sync else _NO_SYNC_NO_STALL if no_stall else _NO_SYNC
            )
            batch._written = count
        finally:
            self._commit.release_shared()

    # reads -------------------------------------------------------------------------------
    def snapshot(self, cf_names: Iterable[str] | None = None) -> StoreSnapshot:
        """A consistent view of the named column families (all open ones by default)."""
        names = list(cf_names) if cf_names is not None else list(self._cfs)
        self._commit.acquire_exclusive()
        try:
            self._check_open()
            parts = {}
            for n in names:
                rd = self.column_family(n, create=False)._rdict
                parts[n] = (rd.snapshot(), rd.iter(ReadOptions()))
            return StoreSnapshot(parts)
        finally:
            self._commit.release_exclusive()

    def flush(self) -> None:
        self._db.flush()

    def close(self) -> None:
        with self._lock:
            if self._closed:
                return
            self._commit.acquire_exclusive()  # let in-flight writes finish first
            try:
                self._closed = True
                self._cfs.clear()
                self._db.close()
            finally:
                self._commit.release_exclusive()

    def _check_open(self) -> None:
        if self._closed:
            raise StorageError(f"store {self.path} is closed")

    def __enter__(self) -> Store:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class SstWriter:
    """Writes a sorted run of (key, value) into an SST file for ``ColumnFamily.ingest``.

    Keys must be added in strictly increasing byte order (RocksDB's rule for SST files);
    an out-of-order key raises ``StorageError`` naming it.
    """

    def __init__(self, path: str | os.PathLike[str], *, bloom: bool = True) -> None:
        self.path = str(path)
        # ``bloom=False`` for a file only ever range-scanned (an index slice's entries):
        # building the filter costs CPU per key and no read would use it.
        self._w = _RocksSstWriter(options=_options(bloom=bloom))
        self._w.open(self.path)
        self._last: bytes | None = None
        self.count = 0

    def put(self, key: bytes, value: bytes) -> None:
        if self._last is not None and key <= self._last:
            raise StorageError(
                "SST keys must be strictly increasing",
                details={"key": key.hex(), "previous": self._last.hex()},
            )
        self._w[key] = value
        self._last = key
        self.count += 1

    def put_many(self, keys: list[bytes], values: list[bytes] | None = None) -> None:
        """Add a sorted run (``b""`` values when ``values`` is None) in one call. The order
        is checked by RocksDB itself (its writer refuses a key not above the last), not per
        key in Python: that check was the wrapper's whole per-row cost in a bulk load."""
        if not keys:
            return
        if values is not None and len(values) != len(keys):
            raise StorageError(
                f"put_many got {len(keys)} keys but {len(values)} values",
                details={"path": self.path, "hint": "pass one value per key"},
            )
        if self._last is not None and keys[0] <= self._last:
            raise StorageError(
                "SST keys must be strictly increasing",
                details={"key": keys[0].hex(), "previous": self._last.hex()},
            )
        w = self._w
        try:
            if values is None:
                for k in keys:
                    w[k] = b""
            else:
                for k, v in zip(keys, values, strict=True):
                    w[k] = v
        except Exception as exc:  # rocksdict raises a bare Exception("Invalid argument: ...")
            raise StorageError(
                f"SST keys must be strictly increasing: {exc}",
                details={"path": self.path, "hint": "sort the keys and drop duplicates"},
            ) from exc
        self._last = keys[-1]
        self.count += len(keys)

    def finish(self) -> str:
        self._w.finish()
        return self.path
