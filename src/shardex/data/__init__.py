"""Data service: partitions, seqnos, change log, change streams, retention, migration.

The local engine only (no networking): ``DataEngine`` over one RocksDB ``Store``. The layout
and rules are in ``docs/decisions.md`` ("Data service storage layout").
"""

from shardex.data.documents import GetResult, RawGetResult
from shardex.data.engine import DEFAULT_RETENTION_SEQNOS, DataEngine
from shardex.data.errors import (
    BadRequest,
    CasMismatch,
    DocExists,
    DocNotFound,
    DocTooLarge,
    KeyspaceExists,
    KeyspaceNotFound,
    NotMyPartition,
    RollbackRequired,
)
from shardex.data.migration import PartitionSnapshot
from shardex.data.partitioning import DEFAULT_NUM_PARTITIONS, partition_of
from shardex.data.records import (
    Change,
    DocRecord,
    FailoverEntry,
    KeyspaceInfo,
    MutationResult,
    PartitionInfo,
    SnapshotMarker,
)
from shardex.data.streams import rollback_seqno
from shardex.data.validation import DEFAULT_MAX_DOC_BYTES, MAX_DOCID_BYTES, Durability

__all__ = [
    "DEFAULT_MAX_DOC_BYTES",
    "DEFAULT_NUM_PARTITIONS",
    "DEFAULT_RETENTION_SEQNOS",
    "MAX_DOCID_BYTES",
    "BadRequest",
    "CasMismatch",
    "Change",
    "DataEngine",
    "DocExists",
    "DocNotFound",
    "DocRecord",
    "DocTooLarge",
    "Durability",
    "FailoverEntry",
    "GetResult",
    "KeyspaceExists",
    "KeyspaceInfo",
    "KeyspaceNotFound",
    "MutationResult",
    "NotMyPartition",
    "PartitionInfo",
    "PartitionSnapshot",
    "RawGetResult",
    "RollbackRequired",
    "SnapshotMarker",
    "partition_of",
    "rollback_seqno",
]
