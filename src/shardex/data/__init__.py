"""Data service: partitions, seqnos, change log, change streams, retention, migration.

The local engine is ``DataEngine`` over one RocksDB ``Store``; the node-side RPC service is
``shardex.data.service``. The layout and rules are in ``docs/decisions/``
(``0005-column-family-per-partition.md`` to ``0015-stream-credits.md``).

The names below are imported lazily (PEP 562): the client imports ``shardex.data.messages``
and ``partitioning``, and must not pay for loading RocksDB just because this package's
``__init__`` runs first.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
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

_LAZY = {
    "GetResult": "shardex.data.documents",
    "RawGetResult": "shardex.data.documents",
    "DEFAULT_RETENTION_SEQNOS": "shardex.data.engine",
    "DataEngine": "shardex.data.engine",
    "BadRequest": "shardex.data.errors",
    "CasMismatch": "shardex.data.errors",
    "DocExists": "shardex.data.errors",
    "DocNotFound": "shardex.data.errors",
    "DocTooLarge": "shardex.data.errors",
    "KeyspaceExists": "shardex.data.errors",
    "KeyspaceNotFound": "shardex.data.errors",
    "NotMyPartition": "shardex.data.errors",
    "RollbackRequired": "shardex.data.errors",
    "PartitionSnapshot": "shardex.data.migration",
    "DEFAULT_NUM_PARTITIONS": "shardex.data.partitioning",
    "partition_of": "shardex.data.partitioning",
    "Change": "shardex.data.records",
    "DocRecord": "shardex.data.records",
    "FailoverEntry": "shardex.data.records",
    "KeyspaceInfo": "shardex.data.records",
    "MutationResult": "shardex.data.records",
    "PartitionInfo": "shardex.data.records",
    "SnapshotMarker": "shardex.data.records",
    "rollback_seqno": "shardex.data.streams",
    "DEFAULT_MAX_DOC_BYTES": "shardex.data.validation",
    "MAX_DOCID_BYTES": "shardex.data.validation",
    "Durability": "shardex.data.validation",
}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'shardex.data' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


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
