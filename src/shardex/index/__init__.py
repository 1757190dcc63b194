"""The indexer: index definitions, slices (mutation queue, stabilise, back index, snapshots,
local scan), the node's local engine, and the correctness oracle.

    from shardex.index import IndexerEngine, make_definition
"""

from shardex.core.spans import Span
from shardex.index.engine import EnqueueResult, IndexerEngine
from shardex.index.keyversion import (
    BROADCAST,
    DELETE,
    ERROR,
    UPSERT,
    UPSERT_DELETION,
    KeyVersion,
)
from shardex.index.records import (
    STATE_ACTIVE,
    STATE_CREATED,
    STATE_LOADING,
    STATE_NEEDS_REBUILD,
)
from shardex.index.slice import DEFAULT_KEEP_SNAPSHOTS, Slice, StabiliseAck
from shardex.meta.index_definition import (
    DOCID_EXPR,
    CompiledIndex,
    IndexDefinition,
    IndexKey,
    compile_definition,
    hash_partition,
    index_partition_of,
    make_definition,
    partition_key_is_docid,
    validate_definition,
)

__all__ = [
    "BROADCAST",
    "DEFAULT_KEEP_SNAPSHOTS",
    "DELETE",
    "DOCID_EXPR",
    "ERROR",
    "STATE_ACTIVE",
    "STATE_CREATED",
    "STATE_LOADING",
    "STATE_NEEDS_REBUILD",
    "UPSERT",
    "UPSERT_DELETION",
    "CompiledIndex",
    "EnqueueResult",
    "IndexDefinition",
    "IndexKey",
    "IndexerEngine",
    "KeyVersion",
    "Slice",
    "Span",
    "StabiliseAck",
    "compile_definition",
    "hash_partition",
    "index_partition_of",
    "make_definition",
    "partition_key_is_docid",
    "validate_definition",
]
