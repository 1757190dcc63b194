"""What the services use of a store, as typing protocols.

Two stores implement it: ``rocks.Store`` (RocksDB, what every node runs) and
``memory.MemoryStore`` (sorted dicts, what the simulator runs: a simulated node's disk is a
``MemoryDisk`` that keeps what was synced across a simulated crash). The data and index
engines are written against these protocols and open their store through one seam (an
``OpenStore`` factory, RocksDB by default), so the same engine code runs on either.

The contract both stores keep (``tests/unit/storage/test_storage_stores.py`` runs the same tests
against both):

* keys and values are ``bytes``; a column family iterates in unsigned byte order, bounded
  ``[lower, upper)`` and either way, as pairs or as lists of keys (``iterate_keys``);
* a ``Batch`` spans column families and is applied atomically by ``write``; ``sync=True``
  makes it (and every write before it) survive a machine crash, ``sync=False`` only a
  process crash;
* a snapshot sees one state of the column families it names: never half a batch, never a
  later write, until ``release``;
* creating or dropping a column family is durable when it returns.

``SstWriter`` / ``ColumnFamily.ingest`` (bulk loads from files) are RocksDB's only: the
memory store refuses them, so the simulator runs no initial builds or data moves by file.
``on_disk`` tells an engine which kind it holds, so it never creates or cleans files beside a
memory store.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Protocol

__all__ = ["BatchLike", "ColumnFamilyLike", "KeyValueStore", "OpenStore", "SnapshotLike"]


class SnapshotLike(Protocol):
    """A point-in-time view over some column families of one store."""

    def get(self, cf_name: str, key: bytes) -> bytes | None: ...

    def iterate(
        self,
        cf_name: str,
        lower: bytes | None = None,
        upper: bytes | None = None,
        *,
        reverse: bool = False,
        chunk_size: int = ...,
    ) -> Iterator[tuple[bytes, bytes]]: ...

    def iterate_keys(
        self,
        cf_name: str,
        lower: bytes | None = None,
        upper: bytes | None = None,
        *,
        reverse: bool = False,
        chunk_size: int = ...,
    ) -> Iterator[list[bytes]]: ...

    def release(self) -> None: ...


class ColumnFamilyLike(Protocol):
    """One named keyspace of a store. ``handle`` and ``get_tip`` are the write path's
    shortcuts (``data/partition.py``): ``Batch.rocks_put(key, value, cf.handle)`` and a
    point read at the tip without the wrapper's call."""

    name: str
    handle: object
    get_tip: Callable[[bytes], bytes | None]

    def get(self, key: bytes, snapshot: SnapshotLike | None = None) -> bytes | None: ...

    def get_many(self, keys: list[bytes]) -> list[bytes | None]: ...

    def put(self, key: bytes, value: bytes, *, sync: bool = False) -> None: ...

    def delete(self, key: bytes, *, sync: bool = False) -> None: ...

    def iterate(
        self,
        lower: bytes | None = None,
        upper: bytes | None = None,
        *,
        reverse: bool = False,
        snapshot: SnapshotLike | None = None,
        chunk_size: int = ...,
    ) -> Iterator[tuple[bytes, bytes]]: ...

    def iterate_keys(
        self,
        lower: bytes | None = None,
        upper: bytes | None = None,
        *,
        reverse: bool = False,
        snapshot: SnapshotLike | None = None,
        chunk_size: int = ...,
    ) -> Iterator[list[bytes]]:
        """The keys ``iterate`` walks, in lists of at most ``chunk_size``."""
        ...

    def ingest(self, sst_paths: Iterable[str | os.PathLike[str]], *, move: bool = True) -> None: ...

    def storage_bytes(self) -> tuple[int, int]: ...


class BatchLike(Protocol):
    """An atomic group of puts and deletes over any column families of one store."""

    rocks_put: Callable[[bytes, bytes, object], None]

    @property
    def count(self) -> int: ...

    @property
    def size_bytes(self) -> int: ...

    def put(self, cf: ColumnFamilyLike, key: bytes, value: bytes) -> None: ...

    def delete(self, cf: ColumnFamilyLike, key: bytes) -> None: ...

    def put_many(
        self, cf: ColumnFamilyLike, keys: list[bytes], values: list[bytes] | None = None
    ) -> None: ...

    def delete_many(self, cf: ColumnFamilyLike, keys: list[bytes]) -> None: ...

    def delete_range(self, cf: ColumnFamilyLike, lower: bytes, upper: bytes) -> None: ...


class KeyValueStore(Protocol):
    """A database of named column families (``rocks.Store``, ``memory.MemoryStore``)."""

    path: Path
    # The store lives in files under ``path``, so side files (SSTs to ingest) may go beside
    # it. False for the memory store: ``path`` is only a name and nothing may touch the
    # filesystem there (the simulator runs many nodes in one working directory).
    on_disk: bool

    def column_families(self) -> list[str]: ...

    def has_column_family(self, name: str) -> bool: ...

    def column_family(self, name: str = ..., *, create: bool = True) -> ColumnFamilyLike: ...

    def drop_column_family(self, name: str) -> None: ...

    def batch(self) -> BatchLike: ...

    def write(self, batch: BatchLike, *, sync: bool = False, no_stall: bool = False) -> None: ...

    def snapshot(self, cf_names: Iterable[str] | None = None) -> SnapshotLike: ...

    def flush(self) -> None: ...

    def close(self) -> None: ...


# Opens the store of an engine at a path: ``rocks.Store`` unless a caller passes another.
OpenStore = Callable[[Path], KeyValueStore]
