"""Key versions: what the projector emits and an indexer slice consumes.

A key version is a plain tuple, not an object, because millions of them flow per second
through the projector, the router and the wire (msgpack encodes a list of tuples directly,
and ``zip(*rows)`` turns rows into Arrow columns):

    (index_id, index_partition, kind, entry, docid, partition, seqno)

* ``index_partition``: the slice, or ``BROADCAST`` (-1) when the projector cannot know it
  (a deletion for an index whose partition key is not the docid); the router resolves -1.
* ``kind``: ``UPSERT`` (``entry`` is the encoded index entry ``key + 02 + docid``),
  ``UPSERT_DELETION`` (the document is not in this slice any more: not indexed, or moved),
  ``DELETE`` (the document was deleted), or ``ERROR`` (only in Arrow output with inline error
  reports: ``entry`` holds the UTF-8 message; never routed).
* ``partition``/``seqno``: the data partition and the mutation's seqno: the idempotence key.

For an index with an array key (one entry per element, ``shardex.meta.array_key``) the
``entry`` of an ``UPSERT`` is the document's whole set of entries packed by
:func:`pack_entries` (sorted, distinct, each behind its 2-byte length): a document's
entries then move, replace each other and roll back together like one entry, and the slice
unpacks them only where it writes its entries family.
"""

from __future__ import annotations

from typing import Final

import pyarrow as pa

__all__ = [
    "BROADCAST",
    "DELETE",
    "ERROR",
    "KEY_VERSION_DDL",
    "KEY_VERSION_SCHEMA",
    "KIND_NAMES",
    "MAX_ENTRY_BYTES",
    "MAX_PACKED_BYTES",
    "UPSERT",
    "UPSERT_DELETION",
    "KeyVersion",
    "from_arrow",
    "pack_entries",
    "to_arrow",
    "unpack_entries",
]

UPSERT: Final = 0
UPSERT_DELETION: Final = 1
DELETE: Final = 2
ERROR: Final = 3
KIND_NAMES: Final = {
    UPSERT: "Upsert",
    UPSERT_DELETION: "UpsertDeletion",
    DELETE: "Delete",
    ERROR: "Error",
}
BROADCAST: Final = -1
# An encoded entry (key + docid) above this is not indexed and counted as an evaluation error
# (Couchbase's default ``max_seckey_size``): one huge value must not bloat a slice or a frame.
MAX_ENTRY_BYTES: Final = 4608

KeyVersion = tuple[str, int, int, bytes, str, int, int]
# The packed entries of one document in an array index (many elements): past this it is an
# evaluation error, like one entry over ``MAX_ENTRY_BYTES``.
MAX_PACKED_BYTES: Final = 1 << 20


def pack_entries(entries: list[bytes]) -> bytes:
    """One document's entries of an array index as one value (sorted, distinct): equal
    sets pack to equal bytes, so an unchanged document is recognised as unchanged."""
    return b"".join(len(e).to_bytes(2, "big") + e for e in sorted(set(entries)))


def unpack_entries(packed: bytes) -> list[bytes]:
    """The entries :func:`pack_entries` packed, in ascending order."""
    out = []
    i, n = 0, len(packed)
    while i < n:
        size = int.from_bytes(packed[i : i + 2], "big")
        out.append(packed[i + 2 : i + 2 + size])
        i += 2 + size
    return out


KEY_VERSION_SCHEMA: Final = pa.schema(
    [
        ("index_id", pa.string()),
        ("index_partition", pa.int32()),
        ("kind", pa.int8()),
        ("entry", pa.binary()),
        ("docid", pa.string()),
        ("partition", pa.int32()),
        ("seqno", pa.int64()),
    ]
)

# The same schema as Spark DDL (what ``mapInArrow`` takes).
KEY_VERSION_DDL: Final = (
    "index_id string, index_partition int, kind tinyint, entry binary, docid string, "
    "partition int, seqno long"
)


def to_arrow(rows: list[KeyVersion]) -> pa.RecordBatch:
    """Rows to a RecordBatch with ``KEY_VERSION_SCHEMA`` (one column conversion each)."""
    if not rows:
        return pa.RecordBatch.from_arrays(
            [pa.array([], type=f.type) for f in KEY_VERSION_SCHEMA], schema=KEY_VERSION_SCHEMA
        )
    # One comprehension per column: ``zip(*rows)`` over a long list is far slower (it builds
    # an iterator per row).
    return pa.RecordBatch.from_arrays(
        [pa.array([r[i] for r in rows], type=f.type) for i, f in enumerate(KEY_VERSION_SCHEMA)],
        schema=KEY_VERSION_SCHEMA,
    )


def from_arrow(batch: pa.RecordBatch) -> list[KeyVersion]:
    """Inverse of :func:`to_arrow` (for the router when it runs on Arrow batches)."""
    cols = [batch.column(i).to_pylist() for i in range(7)]
    return list(zip(*cols, strict=True))
