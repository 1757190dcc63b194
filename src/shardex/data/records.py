"""On-disk records and the values the engine hands back.

Everything persisted is a msgspec Struct encoded as MessagePack; document bodies stay JSON
bytes inside them, so a body is never decoded on the write path or the stream path (the
projector decodes each document once, as the pipeline notes ask).

Keys inside one partition's column family (the family *is* the partition, see
``docs/decisions/0005-column-family-per-partition.md``), one byte of prefix each, chosen so
their byte order is also a useful
order for ``SstWriter`` when a partition is copied:

* ``c`` + seqno (8-byte big-endian)  -> ``ChangeRecord``   the change log, in seqno order
* ``d`` + docid (UTF-8)              -> ``DocRecord``      current version or tombstone
* ``k`` + consumer name (UTF-8)      -> seqno (msgpack)    consumer checkpoints (retention)
* ``m``                              -> ``PartitionMeta``  high seqno, uuid, failover log, ...
"""

from __future__ import annotations

import os
from typing import Literal

import msgspec

from shardex.api.records import (
    OP_DELETE,
    STATE_ACTIVE,
    Change,
    FailoverEntry,
    KeyspaceInfo,
    PartitionInfo,
)

PREFIX_CHANGE = b"c"
PREFIX_DOC = b"d"
PREFIX_CONSUMER = b"k"
META_KEY = b"m"

Op = Literal["upsert", "delete"]

PartitionStateName = Literal["active", "pending", "released"]


def change_key(seqno: int) -> bytes:
    return PREFIX_CHANGE + seqno.to_bytes(8, "big")


def seqno_of_change_key(key: bytes) -> int:
    return int.from_bytes(key[1:9], "big")


def doc_key(docid: str) -> bytes:
    return PREFIX_DOC + docid.encode("utf-8")


def consumer_key(name: str) -> bytes:
    return PREFIX_CONSUMER + name.encode("utf-8")


def next_prefix(prefix: bytes) -> bytes:
    """The smallest key above every key starting with the one-byte ``prefix``."""
    return bytes([prefix[0] + 1])


def new_uuid() -> int:
    """A random non-zero 63-bit partition uuid (fits a signed 64-bit: Spark longs, msgpack)."""
    while True:
        u = int.from_bytes(os.urandom(8), "big") >> 1
        if u:
            return u


class DocRecord(msgspec.Struct, array_like=True, frozen=True):
    """A document's current version. ``deleted`` marks a tombstone (body empty) kept with its
    seqno until purged, so a deletion is visible to streams backfilled from documents.
    ``expiry``: absolute epoch seconds after which the document is expired, 0 for never
    (``api/expiry.py``); ``flags`` carries ``FLAG_EXPIRED`` on a tombstone made by expiry.
    Both trail with defaults, so records written before them decode unchanged."""

    cas: int
    seqno: int
    deleted: bool
    body: bytes
    flags: int = 0
    expiry: int = 0


class ChangeRecord(msgspec.Struct, array_like=True, frozen=True):
    """One mutation in the change log; a delete carries an empty body (tombstone). An
    expiration is a delete with ``FLAG_EXPIRED`` in ``flags``; an upsert carries the
    document's ``expiry`` (absolute epoch seconds, 0 for never), so copies keep it."""

    docid: str
    op: str
    cas: int
    body: bytes
    flags: int = 0
    expiry: int = 0


class PartitionMeta(msgspec.Struct, kw_only=True):
    """Per-partition state written in the same batch as every mutation.

    ``failover_log`` is newest first: ``failover_log[0].uuid`` is the current uuid.
    ``max_cas`` lets the CAS clock continue monotonically after a restart or a move.
    """

    keyspace: str
    partition: int
    num_partitions: int
    high_seqno: int = 0
    failover_log: list[FailoverEntry] = msgspec.field(default_factory=list)
    purge_seqno: int = 0
    max_cas: int = 0
    doc_count: int = 0
    state: str = STATE_ACTIVE

    @property
    def uuid(self) -> int:
        return self.failover_log[0].uuid

    def copy(self) -> PartitionMeta:
        return msgspec.structs.replace(self, failover_log=list(self.failover_log))


_enc = msgspec.msgpack.Encoder()
encode = _enc.encode
decode_doc = msgspec.msgpack.Decoder(DocRecord).decode
decode_change = msgspec.msgpack.Decoder(ChangeRecord).decode
decode_meta = msgspec.msgpack.Decoder(PartitionMeta).decode
decode_keyspace = msgspec.msgpack.Decoder(KeyspaceInfo).decode
decode_int = msgspec.msgpack.Decoder(int).decode


def info_of(meta: PartitionMeta, *, frozen: bool = False) -> PartitionInfo:
    return PartitionInfo(
        keyspace=meta.keyspace,
        partition=meta.partition,
        num_partitions=meta.num_partitions,
        high_seqno=meta.high_seqno,
        uuid=meta.uuid,
        failover_log=list(meta.failover_log),
        purge_seqno=meta.purge_seqno,
        max_cas=meta.max_cas,
        doc_count=meta.doc_count,
        state=meta.state,
        frozen=frozen,
    )


def change_from_record(partition: int, seqno: int, rec: ChangeRecord) -> Change:
    return Change(
        partition=partition,
        seqno=seqno,
        docid=rec.docid,
        op=rec.op,
        cas=rec.cas,
        body=None if rec.op == OP_DELETE else rec.body,
        flags=rec.flags,
        expiry=rec.expiry,
    )
