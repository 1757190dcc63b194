"""Change streams: rollback decisions, snapshot-bounded reads of the change log, live follow.

A stream run reads from one ``StoreSnapshot`` of the partition's column family, so the meta
(high seqno, uuid, purge seqno) it checks against and the records it yields are one consistent
state; a concurrent purge or write cannot tear it. Each run is announced by a
``SnapshotMarker``; ``follow`` strings runs together, sleeping on the partition's waiters
between them.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable, Generator
from typing import Any

from shardex.api.data import ChangeTuple
from shardex.api.errors import BadRequest, RollbackRequired, not_my_partition
from shardex.api.records import OP_DELETE, STATE_ACTIVE, Change, PartitionInfo, SnapshotMarker
from shardex.api.validation import check_seqno
from shardex.data.partition import Partition
from shardex.data.records import (
    META_KEY,
    PREFIX_DOC,
    PartitionMeta,
    change_from_record,
    change_key,
    decode_change,
    decode_doc,
    decode_meta,
    next_prefix,
    seqno_of_change_key,
)
from shardex.storage import StoreSnapshot

StreamItem = SnapshotMarker | Change
# ``wire=True`` runs: changes as ``StreamBatch`` tuples (what the stream server sends), so
# serving a change builds no ``Change`` struct only to take it apart again.
WireItem = SnapshotMarker | ChangeTuple

_YIELD_EVERY = 256  # follow() gives the event loop a turn this often while draining a run


def rollback_seqno(meta: PartitionMeta | PartitionInfo, from_seqno: int, uuid: int) -> int | None:
    """None if a consumer at (``uuid``, ``from_seqno``) can continue from this partition's
    history, else the seqno it must roll back to.

    Couchbase's rule over the failover log (newest first): find the consumer's uuid; that
    branch ended where the next newer branch started (or is still open at the high seqno). A
    consumer beyond the end of its branch saw history that is not ours: roll back to the branch
    point. An unknown uuid means no common history we can prove: roll back to 0. A consumer
    below the purge seqno may have missed purged deletions: roll back to 0. A consumer at 0
    has nothing to lose and is never rolled back.
    """
    if from_seqno == 0:
        return None
    if from_seqno < meta.purge_seqno:
        return 0
    log = meta.failover_log
    for i, entry in enumerate(log):
        if entry.uuid == uuid:
            branch_end = meta.high_seqno if i == 0 else log[i - 1].seqno
            if from_seqno <= branch_end:
                return None
            return branch_end if branch_end >= meta.purge_seqno else 0
    return 0


def open_stream(
    part: Partition, from_seqno: int, uuid: int, end_seqno: int | None, *, wire: bool = False
) -> Generator[Any, None, None]:
    """Check the request against one snapshot (raising before anything is yielded) and return
    the generator of the run. The snapshot is released when the generator ends or closes.
    Items are ``StreamItem``s, or ``WireItem``s with ``wire`` (same order, same content)."""
    check_seqno("from_seqno", from_seqno)
    if end_seqno is not None:
        check_seqno("end_seqno", end_seqno)
        if end_seqno < from_seqno:
            raise BadRequest(
                f"end_seqno {end_seqno} is below from_seqno {from_seqno}",
                details={"from_seqno": from_seqno, "end_seqno": end_seqno},
            )
    snap = part.store.snapshot([part.cf.name])
    try:
        raw = snap.get(part.cf.name, META_KEY)
        if raw is None:  # dropped between lookup and snapshot
            raise not_my_partition(part.keyspace, part.number, "absent")
        meta = decode_meta(raw)
        if meta.state != STATE_ACTIVE:
            raise not_my_partition(meta.keyspace, meta.partition, meta.state)
        rb = rollback_seqno(meta, from_seqno, uuid)
        if rb is not None:
            raise RollbackRequired(
                f"partition {meta.partition} cannot stream from seqno {from_seqno} on uuid "
                f"{uuid}: roll back to {rb}",
                details={
                    "keyspace": meta.keyspace,
                    "partition": meta.partition,
                    "rollback_seqno": rb,
                    "uuid": meta.uuid,
                    "high_seqno": meta.high_seqno,
                    "purge_seqno": meta.purge_seqno,
                },
            )
        end = meta.high_seqno if end_seqno is None else min(end_seqno, meta.high_seqno)
        if from_seqno == 0 and meta.purge_seqno > 0:
            if end < meta.high_seqno:
                raise BadRequest(
                    f"history below seqno {meta.purge_seqno} has been purged, so a stream from "
                    "0 is a backfill of the current documents and cannot stop at "
                    f"end_seqno {end_seqno}",
                    details={
                        "purge_seqno": meta.purge_seqno,
                        "high_seqno": meta.high_seqno,
                        "hint": "omit end_seqno, or use snapshot_partition",
                    },
                )
            return _backfill_run(snap, part.cf.name, meta, wire)
        return _log_run(snap, part.cf.name, meta, from_seqno, end, wire)
    except BaseException:
        snap.release()
        raise


def _log_run(
    snap: StoreSnapshot, cf: str, meta: PartitionMeta, from_seqno: int, end: int, wire: bool
) -> Generator[Any, None, None]:
    try:
        if end <= from_seqno:
            return
        yield SnapshotMarker(meta.partition, from_seqno + 1, end, meta.uuid)
        rows = snap.iterate(cf, change_key(from_seqno + 1), change_key(end + 1))
        if wire:
            for key, raw in rows:
                r = decode_change(raw)
                body = None if r.op == OP_DELETE else r.body
                yield (seqno_of_change_key(key), r.docid, r.op, r.cas, body, r.flags, r.expiry)
            return
        for key, raw in rows:
            yield change_from_record(meta.partition, seqno_of_change_key(key), decode_change(raw))
    finally:
        snap.release()


def _backfill_run(
    snap: StoreSnapshot, cf: str, meta: PartitionMeta, wire: bool
) -> Generator[Any, None, None]:
    """Every current document version (tombstones included) in seqno order: what a consumer
    starting from nothing needs once the early change log is purged (Couchbase's backfill)."""
    try:
        order = sorted(
            (decode_doc(raw).seqno, key)
            for key, raw in snap.iterate(cf, PREFIX_DOC, next_prefix(PREFIX_DOC))
        )
        if not order:
            return
        yield SnapshotMarker(meta.partition, 1, meta.high_seqno, meta.uuid, backfill=True)
        for seqno, key in order:
            raw = snap.get(cf, key)
            if raw is None:
                continue
            rec = decode_doc(raw)
            if wire:
                op = "delete" if rec.deleted else "upsert"
                body = None if rec.deleted else rec.body
                yield (seqno, key[1:].decode("utf-8"), op, rec.cas, body, rec.flags, rec.expiry)
                continue
            yield Change(
                partition=meta.partition,
                seqno=seqno,
                docid=key[1:].decode("utf-8"),
                op="delete" if rec.deleted else "upsert",
                cas=rec.cas,
                body=None if rec.deleted else rec.body,
                flags=rec.flags,
                expiry=rec.expiry,
            )
    finally:
        snap.release()


async def wait_for_seqno(part: Partition, seqno: int, timeout: float | None) -> int:
    """The partition's high seqno as soon as it exceeds ``seqno`` (or, after ``timeout``
    seconds, whatever it is: the caller compares). Raises NOT_MY_PARTITION if the partition is
    released or dropped meanwhile."""
    loop = asyncio.get_running_loop()
    fut = part.add_waiter(seqno, loop)
    if fut is None:
        return part.meta.high_seqno
    try:
        return await asyncio.wait_for(fut, timeout)
    except TimeoutError:
        return part.meta.high_seqno
    finally:
        part.remove_waiter(fut)


async def follow(
    part_of: Callable[[str, int], Partition],
    keyspace: str,
    partition: int,
    from_seqno: int,
    uuid: int,
    end_seqno: int | None = None,
) -> AsyncIterator[StreamItem]:
    """Runs of ``open_stream`` forever (or until ``end_seqno``), waiting for new commits in
    between. ``part_of(keyspace, partition)`` looks the partition up afresh for every run so a
    drop or release surfaces as NOT_MY_PARTITION. The uuid tracked is the one of the latest
    marker, so a ``new_branch`` mid-follow continues on the new branch (the consumer's position
    is at or below the branch point, so it is still in history)."""
    pos, cur_uuid = from_seqno, uuid
    while end_seqno is None or pos < end_seqno:
        part = part_of(keyspace, partition)
        run = open_stream(part, pos, cur_uuid, end_seqno)
        try:
            run_end = pos
            for n, item in enumerate(run, 1):
                if isinstance(item, SnapshotMarker):
                    cur_uuid, run_end = item.uuid, item.end
                yield item
                if n % _YIELD_EVERY == 0:
                    await asyncio.sleep(0)
            pos = max(pos, run_end)
        finally:
            run.close()
        if end_seqno is not None and pos >= end_seqno:
            return
        await wait_for_seqno(part, pos, None)
