"""The data service's records as clients see them: mutation results, changes and snapshot
markers of a change stream, partition and keyspace descriptions, failover log entries, and
the partition states and change ops they name. ``shardex.data.records`` holds the on-disk
layout around them."""

from __future__ import annotations

from typing import Any

import msgspec

OP_UPSERT = "upsert"


OP_DELETE = "delete"


STATE_ACTIVE = "active"  # serves reads, writes and streams


STATE_PENDING = "pending"  # being copied in by a migration: only ingest/apply_changes


STATE_RELEASED = "released"  # handed over: every operation answers NOT_MY_PARTITION


STATE_REPLICA = "replica"  # a replica copy: fed by the active's changes, replica reads only


MAX_FAILOVER_ENTRIES = 25  # as Couchbase: older branches fall off and mean "roll back to 0"


class FailoverEntry(msgspec.Struct, array_like=True, frozen=True):
    """A history branch: ``uuid`` started at ``seqno`` (the high seqno when it was created)."""

    uuid: int
    seqno: int


class MutationResult(msgspec.Struct, frozen=True):
    """What an acknowledged mutation returns: where it landed in the partition's history."""

    partition: int
    seqno: int
    uuid: int
    cas: int


class SnapshotMarker(msgspec.Struct, frozen=True):
    """Precedes a run of stream items read from one consistent snapshot: after the consumer
    has applied every item up to ``end`` it holds the partition's state as of ``end`` on
    branch ``uuid``. ``backfill`` runs come from the documents (latest version per docid,
    in seqno order, intermediate versions skipped) and are consistent only at ``end``."""

    partition: int
    start: int
    end: int
    uuid: int
    backfill: bool = False


class Change(msgspec.Struct, frozen=True):
    """One stream item: an upsert with its JSON body, or a deletion (``body is None``)."""

    partition: int
    seqno: int
    docid: str
    op: str
    cas: int
    body: bytes | None
    flags: int = 0
    expiry: int = 0

    @property
    def deleted(self) -> bool:
        return self.op == OP_DELETE

    def doc(self) -> dict[str, Any] | None:
        return None if self.body is None else msgspec.json.decode(self.body)


class PartitionInfo(msgspec.Struct, frozen=True, kw_only=True):
    """A read-only view of a partition's state, for admin calls and migrations."""

    keyspace: str
    partition: int
    num_partitions: int
    high_seqno: int
    uuid: int
    failover_log: list[FailoverEntry]
    purge_seqno: int
    max_cas: int
    doc_count: int
    state: str
    frozen: bool = False


class KeyspaceInfo(msgspec.Struct, frozen=True):
    """The local catalog entry. ``uuid`` and ``created_cas`` come from the manager's keyspace
    meta (empty/0 for keyspaces created locally): they tell a re-created keyspace of the same
    name from the one this node still holds, and a stale manager state from a newer one."""

    name: str
    num_partitions: int
    uuid: str = ""
    created_cas: int = 0
    max_ttl: int = 0  # seconds: the keyspace's default and largest document expiry (0: none)
