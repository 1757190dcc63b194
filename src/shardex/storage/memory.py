"""An in-memory store with RocksDB's semantics, and a disk that a simulated crash can hit.

The simulator runs the real data and index engines on simulated nodes (one thread, virtual
time, no file I/O). Their store is a ``MemoryStore``: column families of sorted keys, atomic
multi-family batches, snapshots, bounded iteration both ways, as ``rocks.Store`` (the
contract is in ``interface.py``; ``tests/unit/storage/test_storage_stores.py`` runs one set of tests
against both).

What survives a crash is modelled as TigerBeetle and FoundationDB simulate a disk: a
``MemoryDisk`` belongs to the simulated node (it lives in ``ClusterNode.disk``) and outlives
every ``MemoryStore`` opened on it. It holds the *synced* state, plus the batches written
since the last sync in write order (RocksDB's WAL tail). ``crash(power_off=False)`` is a
process crash: the operating system still has the WAL, so every written batch survives.
``crash(power_off=True)`` is a machine crash: only a prefix of the unsynced tail survives
(whole batches: a WAL record is atomic), chosen by the caller's seeded RNG, none without
one. Either way the store that was open is dead: a later write through it raises, so a
crashed node's leftover code cannot reach the disk. Creating or dropping a column family is
durable at once (RocksDB syncs its MANIFEST).
"""

from __future__ import annotations

import bisect
import os
import random
import threading
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path

from shardex.errors import StorageError

__all__ = ["MemoryBatch", "MemoryColumnFamily", "MemoryDisk", "MemorySnapshot", "MemoryStore"]

DEFAULT_CF = "default"
_CHUNK = 512

# A batch's operations: ("put", cf, key, value), ("del", cf, key, b""), ("range", cf, lo, hi)
_Op = tuple[str, str, bytes, bytes]


class _Family:
    """One column family's contents: a dict and its keys kept sorted."""

    __slots__ = ("data", "keys")

    def __init__(self, data: dict[bytes, bytes] | None = None) -> None:
        self.data: dict[bytes, bytes] = dict(data or {})
        self.keys: list[bytes] = sorted(self.data)

    def copy(self) -> _Family:
        out = _Family.__new__(_Family)
        out.data = dict(self.data)
        out.keys = list(self.keys)
        return out

    def put(self, key: bytes, value: bytes) -> None:
        if key not in self.data:
            bisect.insort(self.keys, key)
        self.data[key] = value

    def delete(self, key: bytes) -> None:
        if self.data.pop(key, None) is not None:
            del self.keys[bisect.bisect_left(self.keys, key)]

    def delete_range(self, lower: bytes, upper: bytes) -> None:
        lo = bisect.bisect_left(self.keys, lower)
        hi = bisect.bisect_left(self.keys, upper)
        for k in self.keys[lo:hi]:
            del self.data[k]
        del self.keys[lo:hi]

    def range(
        self, lower: bytes | None, upper: bytes | None, reverse: bool
    ) -> list[tuple[bytes, bytes]]:
        """The pairs in ``[lower, upper)``, copied now: a reader sees this state however
        the family changes while it iterates (as a RocksDB iterator's implicit snapshot)."""
        data = self.data
        return [(k, data[k]) for k in self.range_keys(lower, upper, reverse)]

    def range_keys(self, lower: bytes | None, upper: bytes | None, reverse: bool) -> list[bytes]:
        """The keys in ``[lower, upper)``, copied now (as ``range``)."""
        lo = 0 if lower is None else bisect.bisect_left(self.keys, lower)
        hi = len(self.keys) if upper is None else bisect.bisect_left(self.keys, upper)
        keys = self.keys[lo:hi]
        if reverse:
            keys.reverse()
        return keys


def _chunks(keys: list[bytes], size: int) -> Iterator[list[bytes]]:
    """``keys`` in lists of ``size`` (``rocks._key_chunks``'s shape)."""
    size = max(1, size)
    return (keys[i : i + size] for i in range(0, len(keys), size))


def _apply(families: dict[str, _Family], ops: Iterable[_Op]) -> None:
    for kind, cf, a, b in ops:
        fam = families.get(cf)
        if fam is None:
            continue  # the family was dropped after the batch was written
        if kind == "put":
            fam.put(a, b)
        elif kind == "del":
            fam.delete(a)
        else:
            fam.delete_range(a, b)


class MemoryDisk:
    """The durable side of a simulated node's store (module docstring)."""

    def __init__(self) -> None:
        self.synced: dict[str, _Family] = {DEFAULT_CF: _Family()}
        self.unsynced: list[list[_Op]] = []  # batches since the last sync, in write order
        self.generation = 0  # bumped by every crash: the store opened before is dead
        self.syncs = 0  # how many writes synced (tests assert on durability work)

    def _log(self, ops: list[_Op], sync: bool) -> None:
        self.unsynced.append(ops)
        if sync:
            self._sync()

    def _sync(self) -> None:
        for ops in self.unsynced:
            _apply(self.synced, ops)
        self.unsynced.clear()
        self.syncs += 1

    def crash(self, *, power_off: bool = False, rng: random.Random | None = None) -> int:
        """Kill the open store. A process crash keeps every written batch; a power-off
        keeps the synced state and a prefix of the unsynced batches (``rng`` picks its
        length; none without one). Returns how many batches were lost."""
        self.generation += 1
        if not power_off:
            self._sync()
            return 0
        keep = rng.randint(0, len(self.unsynced)) if rng is not None else 0
        lost = len(self.unsynced) - keep
        del self.unsynced[keep:]
        self._sync()
        return lost


class MemorySnapshot:
    """A point-in-time copy of some column families (``rocks.StoreSnapshot``'s contract)."""

    def __init__(self, parts: dict[str, _Family]) -> None:
        self._parts = parts

    def _part(self, cf_name: str) -> _Family:
        try:
            return self._parts[cf_name]
        except KeyError:
            raise StorageError(
                f"column family {cf_name!r} is not in this snapshot",
                details={"column_family": cf_name, "hint": "released, or created after it"},
            ) from None

    def get(self, cf_name: str, key: bytes) -> bytes | None:
        return self._part(cf_name).data.get(key)

    def iterate(
        self,
        cf_name: str,
        lower: bytes | None = None,
        upper: bytes | None = None,
        *,
        reverse: bool = False,
        chunk_size: int = _CHUNK,
    ) -> Iterator[tuple[bytes, bytes]]:
        return iter(self._part(cf_name).range(lower, upper, reverse))

    def iterate_keys(
        self,
        cf_name: str,
        lower: bytes | None = None,
        upper: bytes | None = None,
        *,
        reverse: bool = False,
        chunk_size: int = _CHUNK,
    ) -> Iterator[list[bytes]]:
        return _chunks(self._part(cf_name).range_keys(lower, upper, reverse), chunk_size)

    def release(self) -> None:
        self._parts.clear()


class MemoryColumnFamily:
    """One named keyspace inside a ``MemoryStore``."""

    def __init__(self, store: MemoryStore, name: str) -> None:
        self._store = store
        self.name = name
        self.handle: object = self  # what ``MemoryBatch.rocks_put`` is given
        self.get_tip: Callable[[bytes], bytes | None] = self._tip_get

    def _family(self) -> _Family:
        return self._store._family(self.name)

    def _tip_get(self, key: bytes) -> bytes | None:
        return self._family().data.get(key)

    def get(self, key: bytes, snapshot: MemorySnapshot | None = None) -> bytes | None:
        if snapshot is not None:
            return snapshot.get(self.name, key)
        return self._family().data.get(key)

    def get_many(self, keys: list[bytes]) -> list[bytes | None]:
        data = self._family().data
        return [data.get(k) for k in keys]

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
        snapshot: MemorySnapshot | None = None,
        chunk_size: int = _CHUNK,
    ) -> Iterator[tuple[bytes, bytes]]:
        if snapshot is not None:
            return snapshot.iterate(self.name, lower, upper, reverse=reverse)
        with self._store._lock:
            return iter(self._family().range(lower, upper, reverse))

    def iterate_keys(
        self,
        lower: bytes | None = None,
        upper: bytes | None = None,
        *,
        reverse: bool = False,
        snapshot: MemorySnapshot | None = None,
        chunk_size: int = _CHUNK,
    ) -> Iterator[list[bytes]]:
        if snapshot is not None:
            return snapshot.iterate_keys(
                self.name, lower, upper, reverse=reverse, chunk_size=chunk_size
            )
        with self._store._lock:
            return _chunks(self._family().range_keys(lower, upper, reverse), chunk_size)

    def storage_bytes(self) -> tuple[int, int]:
        """(0: no files, the keys' and values' bytes held)."""
        with self._store._lock:
            return 0, sum(len(k) + len(v) for k, v in self._family().data.items())

    def ingest(self, sst_paths: Iterable[str | os.PathLike[str]], *, move: bool = True) -> None:
        raise StorageError(
            "the memory store takes no SST files",
            details={"column_family": self.name, "hint": "write the rows in batches"},
        )


class MemoryBatch:
    """An atomic group of puts and deletes over column families of one ``MemoryStore``."""

    def __init__(self) -> None:
        self.ops: list[_Op] = []
        self._bytes = 0
        self.rocks_put: Callable[[bytes, bytes, object], None] = self._put_handle

    def _put_handle(self, key: bytes, value: bytes, handle: object) -> None:
        assert isinstance(handle, MemoryColumnFamily)
        self.put(handle, key, value)

    @property
    def count(self) -> int:
        return len(self.ops)

    @property
    def size_bytes(self) -> int:
        return self._bytes

    def put(self, cf: MemoryColumnFamily, key: bytes, value: bytes) -> None:
        self.ops.append(("put", cf.name, bytes(key), bytes(value)))
        self._bytes += len(key) + len(value)

    def delete(self, cf: MemoryColumnFamily, key: bytes) -> None:
        self.ops.append(("del", cf.name, bytes(key), b""))
        self._bytes += len(key)

    def put_many(
        self, cf: MemoryColumnFamily, keys: list[bytes], values: list[bytes] | None = None
    ) -> None:
        if values is None:
            for k in keys:
                self.put(cf, k, b"")
            return
        if len(values) != len(keys):
            raise StorageError(
                f"put_many got {len(keys)} keys but {len(values)} values",
                details={"column_family": cf.name, "hint": "pass one value per key"},
            )
        for k, v in zip(keys, values, strict=True):
            self.put(cf, k, v)

    def delete_many(self, cf: MemoryColumnFamily, keys: list[bytes]) -> None:
        for k in keys:
            self.delete(cf, k)

    def delete_range(self, cf: MemoryColumnFamily, lower: bytes, upper: bytes) -> None:
        self.ops.append(("range", cf.name, bytes(lower), bytes(upper)))
        self._bytes += len(lower) + len(upper)


class MemoryStore:
    """A store of named column families over a ``MemoryDisk`` (a new disk when none is
    given). Opening reads the disk's state: what a restarted node finds."""

    on_disk = False  # ``path`` is a name only: no file is ever created or removed for it

    def __init__(self, disk: MemoryDisk | None = None, path: str | Path = "memory") -> None:
        self.path = Path(path)
        self.disk = disk if disk is not None else MemoryDisk()
        self._generation = self.disk.generation
        self._lock = threading.Lock()  # writes vs snapshots (tests may use threads)
        # The live state: the synced state with the unsynced tail applied.
        self._families = {n: f.copy() for n, f in self.disk.synced.items()}
        for ops in self.disk.unsynced:
            _apply(self._families, ops)
        self._cfs = {n: MemoryColumnFamily(self, n) for n in self._families}
        self._closed = False

    def _family(self, name: str) -> _Family:
        fam = self._families.get(name)
        if fam is None:
            raise StorageError(f"no column family {name!r}", details={"column_family": name})
        return fam

    def _check_open(self) -> None:
        if self._closed:
            raise StorageError(f"store {self.path} is closed")
        if self._generation != self.disk.generation:
            raise StorageError(
                f"store {self.path} died in a crash", details={"hint": "open it again"}
            )

    # column families -------------------------------------------------------------------
    def column_families(self) -> list[str]:
        return sorted(self._cfs)

    def has_column_family(self, name: str) -> bool:
        return name in self._cfs

    def column_family(self, name: str = DEFAULT_CF, *, create: bool = True) -> MemoryColumnFamily:
        cf = self._cfs.get(name)
        if cf is not None:
            return cf
        if not create:
            raise StorageError(f"no column family {name!r}", details={"column_family": name})
        with self._lock:
            self._check_open()
            if name not in self._cfs:
                self._families[name] = _Family()
                self.disk.synced.setdefault(name, _Family())
                self._cfs[name] = MemoryColumnFamily(self, name)
        return self._cfs[name]

    def drop_column_family(self, name: str) -> None:
        if name == DEFAULT_CF:
            raise StorageError("the default column family cannot be dropped")
        with self._lock:
            self._check_open()
            if self._cfs.pop(name, None) is not None:
                del self._families[name]
                self.disk.synced.pop(name, None)
                for ops in self.disk.unsynced:
                    ops[:] = [op for op in ops if op[1] != name]

    # writes ----------------------------------------------------------------------------
    def batch(self) -> MemoryBatch:
        return MemoryBatch()

    def write(self, batch: MemoryBatch, *, sync: bool = False, no_stall: bool = False) -> None:
        """Apply ``batch`` atomically; ``sync=True`` makes it (and all before it) durable.
        ``no_stall``: accepted for the interface (a memory store never stalls)."""
        if not batch.ops:
            return
        with self._lock:
            self._check_open()
            for _, cf, _, _ in batch.ops:
                self._family(cf)  # a dropped family fails the batch before any of it applies
            ops = list(batch.ops)
            _apply(self._families, ops)
            self.disk._log(ops, sync)

    # reads -----------------------------------------------------------------------------
    def snapshot(self, cf_names: Iterable[str] | None = None) -> MemorySnapshot:
        names = list(cf_names) if cf_names is not None else list(self._cfs)
        with self._lock:
            self._check_open()
            return MemorySnapshot({n: self._family(n).copy() for n in names})

    def flush(self) -> None:
        """RocksDB's flush writes the memtables to synced files: everything is durable."""
        with self._lock:
            self._check_open()
            self.disk._sync()

    def close(self) -> None:
        self._closed = True
        self._cfs.clear()

    def __enter__(self) -> MemoryStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
