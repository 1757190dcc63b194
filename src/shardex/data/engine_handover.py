"""The hand-over operations of ``DataEngine`` (``handover.HandoverOps``: snapshots, freezes,
copies in and out, incoming markers, topology floors and the migration fence), exposed as the
engine's own so callers keep one object per node. Kept apart from the engine's lifecycle,
catalog and document operations only to keep each file to one reading.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from pathlib import Path

import shardex.data.migration as migration
from shardex.api.migration import IncomingMarker
from shardex.api.records import Change, FailoverEntry, PartitionInfo, SnapshotMarker
from shardex.data.handover import HandoverListener, HandoverOps, IncomingCopy


class HandoverFacade:
    """The engine's hand-over methods, each one call into its ``HandoverOps``."""

    _handover: HandoverOps

    def snapshot_partition(self, keyspace: str, partition: int) -> migration.PartitionSnapshot:
        """``HandoverOps.snapshot_partition``."""
        return self._handover.snapshot_partition(keyspace, partition)

    def freeze_partition(self, keyspace: str, partition: int) -> PartitionInfo:
        """``HandoverOps.freeze_partition``."""
        return self._handover.freeze_partition(keyspace, partition)

    def unfreeze_partition(self, keyspace: str, partition: int) -> None:
        """``HandoverOps.unfreeze_partition``."""
        self._handover.unfreeze_partition(keyspace, partition)

    def release_partition(self, keyspace: str, partition: int) -> PartitionInfo:
        """``HandoverOps.release_partition``."""
        return self._handover.release_partition(keyspace, partition)

    def release_if_high(self, keyspace: str, partition: int, high_seqno: int) -> PartitionInfo:
        """``HandoverOps.release_if_high``."""
        return self._handover.release_if_high(keyspace, partition, high_seqno)

    def activate_partition(self, keyspace: str, partition: int) -> PartitionInfo:
        """``HandoverOps.activate_partition``."""
        return self._handover.activate_partition(keyspace, partition)

    def ingest_partition(
        self,
        keyspace: str,
        partition: int,
        info: PartitionInfo,
        items: Iterable[tuple[bytes, bytes]],
        *,
        activate: bool = False,
    ) -> PartitionInfo:
        """``HandoverOps.ingest_partition``."""
        return self._handover.ingest_partition(keyspace, partition, info, items, activate=activate)

    def begin_ingest(self, keyspace: str, partition: int, info: PartitionInfo) -> IncomingCopy:
        """``HandoverOps.begin_ingest``."""
        return self._handover.begin_ingest(keyspace, partition, info)

    def install_copy(self, info: PartitionInfo, sst: Path | None) -> PartitionInfo:
        """``HandoverOps.install_copy``."""
        return self._handover.install_copy(info, sst)

    def apply_changes(
        self,
        keyspace: str,
        partition: int,
        changes: Iterable[Change | SnapshotMarker],
        *,
        failover_log: list[FailoverEntry] | None = None,
    ) -> int:
        """``HandoverOps.apply_changes``."""
        return self._handover.apply_changes(keyspace, partition, changes, failover_log=failover_log)

    def local_partitions(self, keyspace: str) -> list[PartitionInfo]:
        """``HandoverOps.local_partitions``."""
        return self._handover.local_partitions(keyspace)

    def partition_state(self, keyspace: str, partition: int) -> str:
        """``HandoverOps.partition_state``."""
        return self._handover.partition_state(keyspace, partition)

    def add_handover_listener(self, fn: HandoverListener) -> None:
        """``HandoverOps.add_handover_listener``."""
        self._handover.add_handover_listener(fn)

    def iter_docids(
        self, keyspace: str, partition: int, start: bytes = b"", stop: bytes | None = None
    ) -> Iterator[str]:
        """``HandoverOps.iter_docids``."""
        return self._handover.iter_docids(keyspace, partition, start, stop)

    def set_incoming(self, marker: IncomingMarker) -> None:
        """``HandoverOps.set_incoming``."""
        self._handover.set_incoming(marker)

    def clear_incoming(self, keyspace: str, partition: int) -> None:
        """``HandoverOps.clear_incoming``."""
        self._handover.clear_incoming(keyspace, partition)

    def incoming(self) -> dict[tuple[str, int], IncomingMarker]:
        """``HandoverOps.incoming``."""
        return self._handover.incoming()

    def topology_floor(self, keyspace: str) -> int:
        """``HandoverOps.topology_floor``."""
        return self._handover.topology_floor(keyspace)

    def raise_topology_floor(self, keyspace: str, seq_num: int) -> None:
        """``HandoverOps.raise_topology_floor``."""
        self._handover.raise_topology_floor(keyspace, seq_num)

    def migration_fence(self) -> int:
        """``HandoverOps.migration_fence``."""
        return self._handover.migration_fence()

    def check_fence(self, epoch: int) -> None:
        """``HandoverOps.check_fence``."""
        self._handover.check_fence(epoch)
