"""Copying a partition: consistent snapshots out, SST ingestion and catch-up in.

The protocol these pieces serve (driven by the rebalance orchestrator, not here):

1. target: nothing; source: ``snapshot_partition`` -> ship ``info`` and ``raw_items()``;
2. target: ``ingest_partition(info, items)``: the partition exists in state ``pending`` with the
   source's seqnos, uuid, failover log, purge seqno and CAS clock -- the same history;
3. target pulls ``stream(from=its high, uuid=its uuid)`` from the source and ``apply_changes``
   (idempotent: seqnos at or below its high are skipped, gaps are refused) until close;
4. source: ``freeze_partition`` (writers get a retryable NOT_MY_PARTITION), final catch-up to
   the frozen high seqno; source: ``release_partition`` (persisted: a restarted source never
   serves it again); publish the topology; target: ``activate_partition``; source:
   ``drop_partition``.
   Any failure before the release: ``unfreeze_partition`` at the source and drop the pending
   copy at the target; the partition never stopped being the source's.

Why raw key/value pairs for the copy: the partition's column family *is* the partition, so
the copy is its byte-ordered contents (minus the meta, which is rebuilt from ``info`` with the
state changed), written with ``SstWriter`` into one SST and ingested: no per-key write path,
no re-encoding, and the byte order needed by the SST writer is the order the source yields.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path

import msgspec

from shardex.api.data import ChangeTuple
from shardex.api.errors import BadRequest
from shardex.api.records import (
    MAX_FAILOVER_ENTRIES,
    OP_DELETE,
    OP_UPSERT,
    STATE_PENDING,
    Change,
    FailoverEntry,
    PartitionInfo,
    SnapshotMarker,
)
from shardex.data.partition import Partition
from shardex.data.records import (
    META_KEY,
    PREFIX_CHANGE,
    PREFIX_CONSUMER,
    PREFIX_DOC,
    DocRecord,
    PartitionMeta,
    change_from_record,
    change_key,
    decode_change,
    decode_doc,
    decode_int,
    decode_meta,
    encode,
    info_of,
    next_prefix,
    seqno_of_change_key,
)
from shardex.errors import StorageError
from shardex.storage import ColumnFamily, SstWriter, Store, StoreSnapshot
from shardex.storage.interface import BatchLike

_ALLOWED_PREFIXES = (PREFIX_CHANGE[0], PREFIX_DOC[0], PREFIX_CONSUMER[0])


class PartitionSnapshot:
    """A consistent, read-only view of one partition (documents, change log, checkpoints and
    the meta at that point). Use as a context manager; ``close`` releases the RocksDB snapshot
    (holding it pins old versions on disk)."""

    def __init__(self, store: Store, part: Partition) -> None:
        self._cf = part.cf.name
        self._snap: StoreSnapshot = store.snapshot([self._cf])
        raw = self._snap.get(self._cf, META_KEY)
        assert raw is not None, "partition without meta"
        self.info: PartitionInfo = info_of(decode_meta(raw))

    @property
    def high_seqno(self) -> int:
        return self.info.high_seqno

    @property
    def uuid(self) -> int:
        return self.info.uuid

    def documents(self, *, include_deleted: bool = False) -> Iterator[tuple[str, DocRecord]]:
        """(docid, record) in docid order (UTF-8 byte order = code point order). Initial
        index builds read live documents; a copy needs tombstones too (``raw_items``)."""
        for key, raw in self._snap.iterate(self._cf, PREFIX_DOC, next_prefix(PREFIX_DOC)):
            rec = decode_doc(raw)
            if include_deleted or not rec.deleted:
                yield key[1:].decode("utf-8"), rec

    def changes(self, after: int = 0) -> Iterator[Change]:
        """Change records with seqno > ``after`` (and > the purge seqno), in seqno order."""
        lo = change_key(max(after, self.info.purge_seqno) + 1)
        hi = change_key(self.info.high_seqno + 1)
        for key, raw in self._snap.iterate(self._cf, lo, hi):
            yield change_from_record(
                self.info.partition, seqno_of_change_key(key), decode_change(raw)
            )

    def consumers(self) -> dict[str, int]:
        hi = next_prefix(PREFIX_CONSUMER)
        return {
            k[1:].decode("utf-8"): decode_int(v)
            for k, v in self._snap.iterate(self._cf, PREFIX_CONSUMER, hi)
        }

    def raw_items(self) -> Iterator[tuple[bytes, bytes]]:
        """Every stored pair except the meta, in byte order: what ``ingest_partition`` takes."""
        for key, value in self._snap.iterate(self._cf):
            if key != META_KEY:
                yield key, value

    def close(self) -> None:
        self._snap.release()

    def __enter__(self) -> PartitionSnapshot:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def check_info(info: PartitionInfo, keyspace: str, partition: int, num_partitions: int) -> None:
    if (info.keyspace, info.partition) != (keyspace, partition):
        raise BadRequest(
            f"snapshot is of {info.keyspace!r}/{info.partition}, not {keyspace!r}/{partition}",
            details={"keyspace": keyspace, "partition": partition},
        )
    if info.num_partitions != num_partitions:
        raise BadRequest(
            f"snapshot has {info.num_partitions} partitions, keyspace {keyspace!r} here has "
            f"{num_partitions}",
            details={"snapshot": info.num_partitions, "local": num_partitions},
        )
    if not info.failover_log or info.failover_log[0].uuid != info.uuid:
        raise BadRequest("snapshot info has an inconsistent failover log", details={})


def write_sst(cf: ColumnFamily, items: Iterable[tuple[bytes, bytes]], tmp_dir: Path) -> int:
    """Write ``items`` (strictly increasing keys, no meta) to one SST and ingest it into the
    empty family ``cf``. Returns how many pairs were loaded."""
    tmp_dir.mkdir(parents=True, exist_ok=True)
    path = tmp_dir / f"ingest-{os.getpid()}-{id(cf):x}.sst"
    writer = SstWriter(path)
    try:
        for key, value in items:
            if not key or key[0] not in _ALLOWED_PREFIXES:
                raise _not_ingestible(key)
            writer.put(key, value)
        if writer.count == 0:
            return 0
        writer.finish()
        cf.ingest([path], move=True)
        return writer.count
    finally:
        if path.exists():
            path.unlink()


def write_batch(store: Store, cf: ColumnFamily, items: Iterable[tuple[bytes, bytes]]) -> int:
    """``write_sst`` for a store without files (the simulator's memory store): the same keys
    (same checks) as one unsynced batch; the partition's meta, written next with a sync,
    makes it durable. Returns how many pairs were loaded."""
    batch = store.batch()
    last: bytes | None = None
    for key, value in items:
        if not key or key[0] not in _ALLOWED_PREFIXES:
            raise _not_ingestible(key)
        if last is not None and key <= last:  # an SST's rule, kept so both stores agree
            raise StorageError(
                "SST keys must be strictly increasing",
                details={"key": key.hex(), "previous": last.hex()},
            )
        batch.put(cf, key, value)
        last = key
    store.write(batch, sync=False)
    return batch.count


def _not_ingestible(key: bytes) -> BadRequest:
    return BadRequest(
        "ingest accepts only change, document and checkpoint keys",
        details={"key": key[:40].hex()},
    )


def apply_changes(
    part: Partition,
    changes: Iterable[Change | SnapshotMarker],
    failover_log: list[FailoverEntry] | None,
) -> int:
    """Install catch-up changes streamed from the source on a ``pending`` copy, keeping their
    seqnos and CAS values. Seqnos at or below the local high are skipped (a re-sent run is
    harmless), a gap is refused; everything is one synced batch, so a refusal changes nothing.
    ``failover_log`` (the source's, if it branched meanwhile) must extend the local one."""
    with part.lock:
        meta = part.meta.copy()
        if meta.state != STATE_PENDING:
            raise BadRequest(
                f"apply_changes needs a pending partition, {meta.partition} is {meta.state}",
                details={"partition": meta.partition, "state": meta.state},
            )
        batch = part.store.batch()
        stage_changes(part, meta, batch, changes)
        if failover_log is not None:
            meta.failover_log = _extend_log(meta.failover_log, failover_log, meta.high_seqno)
        if meta != part.meta:
            part.commit(batch, meta, sync=True)
        return meta.high_seqno


def stage_changes(
    part: Partition,
    meta: PartitionMeta,
    batch: BatchLike,
    changes: Iterable[Change | SnapshotMarker],
) -> None:
    """Add ``changes`` (another copy's, in seqno order) to ``batch`` with their seqnos and CAS
    values, advancing ``meta`` (the caller's copy, committed with the batch); snapshot markers
    are skipped, a change of another partition refused (BAD_REQUEST). ``stage_tuples`` does
    the rest."""
    runs: list[ChangeTuple] = []
    for ch in changes:
        if isinstance(ch, SnapshotMarker):
            continue
        if ch.partition != meta.partition:
            raise BadRequest(
                f"change for partition {ch.partition} sent to {meta.partition}",
                details={"partition": meta.partition, "change_partition": ch.partition},
            )
        runs.append((ch.seqno, ch.docid, ch.op, ch.cas, ch.body, ch.flags, ch.expiry))
    stage_tuples(part, meta, batch, runs)


def stage_tuples(
    part: Partition,
    meta: PartitionMeta,
    batch: BatchLike,
    changes: Sequence[ChangeTuple],
    live_before: Sequence[bool] | None = None,
) -> None:
    """Add ``changes`` (wire tuples of another copy's change records, in seqno order) to
    ``batch`` with their seqnos and CAS values, advancing ``meta`` (the caller's copy,
    committed with the batch). Seqnos at or below ``meta.high_seqno`` are skipped, a gap is
    refused (BAD_REQUEST, ``meta`` unchanged, and the caller drops the batch). Caller holds
    ``part.lock``. ``live_before`` (one per change, from an active that knew it) says
    whether each change's document was live before it, which is all ``doc_count`` needs:
    without it the current document is read.

    A replica runs this for every change its active sends, so it is written like the
    active's ``Partition.stage``: the records encoded as tuples in their structs' field
    order (the same bytes, ``test_data_write_format.py``), rocksdict's bound get and put,
    the meta's counters in locals."""
    high, max_cas, doc_count = meta.high_seqno, meta.max_cas, meta.doc_count
    cf = part.cf
    get = cf.get_tip
    put = batch.rocks_put
    handle = cf.handle
    seen: dict[str, bool] = {}  # docid -> live in the version staged here
    for i, (seqno, docid, op, cas, body, flags, expiry) in enumerate(changes):
        if seqno <= high:
            continue
        if seqno != high + 1:
            raise BadRequest(
                f"gap in catch-up: expected seqno {high + 1}, got {seqno}",
                details={"expected": high + 1, "got": seqno},
            )
        deleting = op == OP_DELETE
        if deleting or body is None:
            body = b""
        key = PREFIX_DOC + docid.encode("utf-8")
        was_live = seen.get(docid) if live_before is None else live_before[i]
        if was_live is None:
            raw = get(key)
            was_live = raw is not None and not decode_doc(raw).deleted
        put(key, encode((cas, seqno, deleting, body, flags, expiry)), handle)
        change = PREFIX_CHANGE + seqno.to_bytes(8, "big")
        put(
            change,
            encode((docid, OP_DELETE if deleting else OP_UPSERT, cas, body, flags, expiry)),
            handle,
        )
        doc_count += (not deleting) - was_live
        high = seqno
        if cas > max_cas:
            max_cas = cas
        seen[docid] = not deleting
    meta.high_seqno, meta.max_cas, meta.doc_count = high, max_cas, doc_count


def _extend_log(
    mine: list[FailoverEntry], theirs: list[FailoverEntry], high: int
) -> list[FailoverEntry]:
    theirs = [
        e if isinstance(e, FailoverEntry) else msgspec.convert(e, FailoverEntry) for e in theirs
    ]
    current = mine[0]
    if current not in theirs or any(e.seqno > high for e in theirs):
        raise BadRequest(
            "failover log does not extend this partition's history",
            details={"local_uuid": current.uuid, "high_seqno": high},
        )
    return theirs[:MAX_FAILOVER_ENTRIES]
