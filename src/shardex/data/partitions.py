"""The partitions a data node holds on its store, and the keyspace catalog that routes to them.

``DataEngine`` (``engine.py``) builds one ``LocalPartitions`` and hands it to its parts: the
document operations (``documents.py``) and the hand-over operations (``handover.py``) find
their partition here, and the engine itself keeps the catalog, streams and retention on it.

``lock`` guards the catalog and the partition map, not the write path: a write takes its
partition's lock only (``partition.py``). A lookup of ``parts`` without it is one dict
access, safe beside a thread that changes the map.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable
from pathlib import Path

import shardex.data.migration as migration
from shardex.api.errors import BadRequest, KeyspaceNotFound, not_my_partition
from shardex.api.records import KeyspaceInfo
from shardex.data.partition import Partition
from shardex.data.records import META_KEY, PartitionMeta, encode, new_uuid
from shardex.data.recovery import DirtyMarks
from shardex.errors import ShardexError
from shardex.meta.partitioning import partition_cf_name
from shardex.storage import ColumnFamily, Store

__all__ = ["INGEST_DIR", "LocalPartitions"]

INGEST_DIR = "data-ingest"  # under the store's directory: SST files being built or ingested


class LocalPartitions:
    """The keyspaces this node knows (name -> ``KeyspaceInfo``) and the partitions it holds
    ((keyspace, partition) -> ``Partition``), over one ``Store``."""

    def __init__(
        self,
        store: Store,
        marks: DirtyMarks,
        *,
        clock_ns: Callable[[], int] = time.time_ns,
        uuids: Callable[[], int] = new_uuid,
    ) -> None:
        self.store = store
        self.marks = marks
        # The wall clock CAS values follow and the source of new branches' uuids: the
        # simulator passes its virtual clock and a seeded generator, so a run replays.
        self.clock_ns = clock_ns
        self.uuids = uuids
        self.lock = threading.RLock()  # catalog and partition map (not the write path)
        self.keyspaces: dict[str, KeyspaceInfo] = {}
        self.parts: dict[tuple[str, int], Partition] = {}
        self.closed = False

    def keyspace(self, name: str) -> KeyspaceInfo:
        ks = self.keyspaces.get(name)
        if ks is None:
            raise KeyspaceNotFound(f"keyspace {name!r} not found", details={"keyspace": name})
        return ks

    def check_partition_number(self, ks: KeyspaceInfo, partition: int) -> None:
        if not isinstance(partition, int) or not 0 <= partition < ks.num_partitions:
            raise BadRequest(
                f"partition {partition!r} is outside 0..{ks.num_partitions - 1}",
                details={"keyspace": ks.name, "partition": repr(partition)},
            )

    def held(self, keyspace: str, partition: int) -> Partition:
        """The partition, in any state; NOT_MY_PARTITION if this node does not hold it."""
        if self.closed:
            raise ShardexError("data engine is closed", details={"path": str(self.store.path)})
        self.check_partition_number(self.keyspace(keyspace), partition)
        part = self.parts.get((keyspace, partition))
        if part is None:
            raise not_my_partition(keyspace, partition, "absent")
        return part

    def serving(self, keyspace: str, partition: int) -> Partition:
        """The partition if it serves reads here (``Partition.check_serving``)."""
        part = self.held(keyspace, partition)
        part.check_serving(write=False)
        return part

    def install(
        self, meta: PartitionMeta, items: Iterable[tuple[bytes, bytes]], sst: Path | None = None
    ) -> Partition:
        """Create the family, load ``items`` (or the ready SST file ``sst``), then write the
        meta (last: its presence is what makes the partition exist after a crash)."""
        name = partition_cf_name(meta.keyspace, meta.partition)
        if self.store.has_column_family(name):  # leftover of a failed attempt
            self.store.drop_column_family(name)
        cf = self.store.column_family(name)
        try:
            if sst is not None:
                cf.ingest([sst], move=True)
            elif self.store.on_disk:
                migration.write_sst(cf, items, self.store.path / INGEST_DIR)
            else:  # a memory store takes no SST and must not make files: one batch
                migration.write_batch(self.store, cf, items)
            cf.put(META_KEY, encode(meta), sync=True)
        except BaseException:
            self.store.drop_column_family(name)
            raise
        part = self.partition(cf, meta)
        self.marks.attach(part)
        self.parts[(meta.keyspace, meta.partition)] = part
        return part

    def partition(self, cf: ColumnFamily, meta: PartitionMeta) -> Partition:
        """The ``Partition`` over ``cf`` (not registered: the caller does)."""
        return Partition(self.store, cf, meta, clock_ns=self.clock_ns, uuids=self.uuids)

    def drop(self, keyspace: str, partition: int) -> None:
        """Drop the partition's family; waiting followers get NOT_MY_PARTITION. A partition
        not held is a no-op. The caller holds ``lock``."""
        part = self.parts.pop((keyspace, partition), None)
        if part is None:
            return
        with part.lock:
            self.store.drop_column_family(part.cf.name)
            part.meta = part.meta.copy()
            part.meta.state = "absent"
        part.fail_waiters(not_my_partition(keyspace, partition, "absent"))
