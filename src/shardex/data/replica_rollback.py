"""Rolling a diverged replica copy back to its branch point, in place.

A copy diverges when its history runs past the point where its active's history branched
off: a node failed over and taken back with ``shardex recovery NODE --kind delta`` holds
writes the promoted replica never had. Dropping the copy and feeding it again from seqno 0
would work but copies the whole partition; Couchbase's delta recovery (and the failover
seed) roll the copy back to the branch point instead and stream only what follows. Here:

1. ``branch_point``: the newest branch both failover logs share, and the seqno where one of
   the two histories left it: every change up to there is common to both copies;
2. ``plan``: the documents this copy changed after that seqno, read from its own change log
   (a copy whose change log no longer reaches back to the branch point, or whose tail is
   larger than ``MAX_ROLLBACK_DOCS``, is started again empty instead);
3. the replica asks its active for those documents' current records (``FetchDocRecords``);
4. ``apply``: in one synced batch, the change log above the branch point goes, each of those
   documents takes the active's record when the active's version is at or below the branch
   point (it is the common version), and is removed otherwise (the active's newer version,
   or its absence, arrives with the stream that follows); the meta goes back to the branch
   point on the shared branch.

The active then streams from the branch point like for any replica behind it. Until that
stream has caught up, a document the active changed after the branch point is absent here,
which no reader sees: a replica copy answers only replica reads, documented as stale.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from shardex.api.records import FailoverEntry
from shardex.data.partition import Partition
from shardex.data.records import (
    DocRecord,
    change_key,
    decode_change,
    decode_doc,
    doc_key,
    encode,
)

# A larger diverged tail is cheaper to rebuild than to fetch document by document.
MAX_ROLLBACK_DOCS = 50_000


@dataclass(frozen=True, slots=True)
class RollbackPlan:
    """Roll the copy back to ``seqno`` on the branch ``log[0]`` (its own failover log from
    the shared entry on); ``docids``: the documents it changed after ``seqno``. ``high`` and
    ``uuid`` are the copy's at planning time: ``apply`` refuses a copy that moved since."""

    seqno: int
    log: list[FailoverEntry]
    docids: list[str]
    high: int
    uuid: int


def branch_point(
    copy_log: Sequence[FailoverEntry], copy_high: int, active_log: Sequence[FailoverEntry]
) -> tuple[int, int] | None:
    """(the seqno both histories share up to, the index in ``copy_log`` of the shared
    branch), or None when they share no branch. Logs are newest first; a branch lasts from
    its entry's seqno until the next newer entry's (or the copy's high seqno)."""
    where = {e.uuid: i for i, e in enumerate(active_log)}
    for j, entry in enumerate(copy_log):
        i = where.get(entry.uuid)
        if i is None:
            continue
        copy_end = copy_high if j == 0 else copy_log[j - 1].seqno
        active_end = None if i == 0 else active_log[i - 1].seqno
        end = copy_end if active_end is None else min(copy_end, active_end)
        return max(end, entry.seqno), j
    return None


def plan(part: Partition, active_log: Sequence[FailoverEntry]) -> RollbackPlan | None:
    """What rolling ``part`` back takes (module docstring), or None: start it again empty.
    Caller holds ``part.lock`` or accepts that ``apply`` may refuse a stale plan."""
    meta = part.meta
    found = branch_point(meta.failover_log, meta.high_seqno, active_log)
    if found is None:
        return None
    seqno, j = found
    if seqno == 0 or seqno < meta.purge_seqno:
        return None  # nothing kept, or the change log no longer says what changed after it
    docids: set[str] = set()
    for _key, raw in part.cf.iterate(change_key(seqno + 1), change_key(meta.high_seqno + 1)):
        docids.add(decode_change(raw).docid)
        if len(docids) > MAX_ROLLBACK_DOCS:
            return None
    return RollbackPlan(
        seqno=seqno,
        log=list(meta.failover_log[j:]),
        docids=sorted(docids),
        high=meta.high_seqno,
        uuid=meta.uuid,
    )


def apply(part: Partition, rollback: RollbackPlan, records: Sequence[bytes | None]) -> bool:
    """Roll ``part`` back (module docstring) with the active's ``records`` of
    ``rollback.docids`` (encoded ``DocRecord``s, None where it has none). False when the copy
    moved since the plan (nothing done: the next run finds it diverged again)."""
    if len(records) != len(rollback.docids):
        raise ValueError(f"{len(records)} records for {len(rollback.docids)} documents")
    with part.lock:
        meta = part.meta
        if meta.high_seqno != rollback.high or meta.uuid != rollback.uuid:
            return False
        new = meta.copy()
        batch = part.store.batch()
        for docid, raw in zip(rollback.docids, records, strict=True):
            cur = part.read_doc(docid)
            theirs: DocRecord | None = None if raw is None else decode_doc(raw)
            keep = theirs if theirs is not None and theirs.seqno <= rollback.seqno else None
            if keep is None:
                batch.delete(part.cf, doc_key(docid))
            else:
                batch.put(part.cf, doc_key(docid), encode(keep))
            live_before = cur is not None and not cur.deleted
            live_after = keep is not None and not keep.deleted
            new.doc_count += int(live_after) - int(live_before)
        batch.delete_range(part.cf, change_key(rollback.seqno + 1), change_key(meta.high_seqno + 1))
        new.high_seqno = rollback.seqno
        new.failover_log = list(rollback.log)
        part.commit(batch, new, sync=True)
        return True
