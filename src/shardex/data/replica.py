"""Replica copies on a data node: create, feed, read and promote them.

A part of ``DataEngine`` (``engine.replicas``), over the node's ``LocalPartitions``. The
replication protocol is ``docs/decisions/0082-replicas-and-durability.md``; this module is its
storage side, synchronous and run in the I/O executor:

* a replica copy is a partition in state ``replica``: it answers no client read or write
  (NOT_MY_PARTITION), only replica reads, ``apply_runs`` from its active and promotion;
* a copy made empty (a new keyspace, or a replica added later) starts at seqno 0 on a
  placeholder branch (uuid 0): seqno 0 lies on every history, so the first run adopts the
  active's failover log;
* ``apply_runs`` writes the runs of one ``ReplicaApply`` in one batch (one fsync when asked),
  keeping seqnos and CAS values; a run whose history does not continue the copy's is refused
  as ``diverged`` (the copy is rolled back to its branch point, ``replica_rollback.py``, or
  started again empty), a gap as ``behind`` (the active resends from the copy's high seqno);
* ``promote`` makes a replica copy active on a new branch: a new uuid starting at its high
  seqno, what every consumer then sees as a ROLLBACK to that point.
"""

from __future__ import annotations

from collections.abc import Sequence

import msgspec

import shardex.data.replica_rollback as replica_rollback
from shardex.api.data import ChangeTuple
from shardex.api.errors import BadRequest, not_my_partition
from shardex.api.records import (
    MAX_FAILOVER_ENTRIES,
    OP_DELETE,
    STATE_ACTIVE,
    STATE_PENDING,
    STATE_REPLICA,
    FailoverEntry,
    PartitionInfo,
)
from shardex.api.replication import ReplicaAck, ReplicaRun
from shardex.data.engine_io import WouldBlock
from shardex.data.migration import stage_tuples
from shardex.data.partition import Partition, commit_many, lock_now
from shardex.data.partitions import LocalPartitions
from shardex.data.records import (
    PartitionMeta,
    change_key,
    decode_change,
    decode_doc,
    doc_key,
    info_of,
    seqno_of_change_key,
)
from shardex.meta.partitioning import partition_of
from shardex.storage.interface import BatchLike

_FAILED_OVER_KEY = b"data/failed-over"  # default family: the cas that failed this node over
PLACEHOLDER_UUID = 0  # the branch of an empty copy that has not heard from its active yet
# Ack states besides the partition states: what the active reads from an ack.
ACK_ABSENT = "absent"  # no copy here (yet)
ACK_DIVERGED = "diverged"  # the copy's history is not a prefix of the active's: roll it back
ACK_BEHIND = "behind"  # the run started above the copy's high seqno: resend from it
ACK_BUILDING = "building"  # being rebuilt from the active's snapshot


def continues(uuid: int, high: int, active_log: Sequence[FailoverEntry], active_uuid: int) -> bool:
    """Whether a copy at ``high`` on branch ``uuid`` is a prefix of the history described by
    ``active_log`` (newest first): its branch is in the log and the copy does not reach past
    the seqno where the next branch began."""
    if high == 0 or uuid == active_uuid:
        return True
    for i, entry in enumerate(active_log):
        if entry.uuid == uuid:
            return i > 0 and high <= active_log[i - 1].seqno
    return False


def ack_of(part: Partition, state: str | None = None) -> ReplicaAck:
    meta = part.meta
    return ReplicaAck(
        meta.partition, meta.high_seqno, part.persisted_seqno, meta.uuid, state or meta.state
    )


class ReplicaOps:
    """The replica operations of ``DataEngine`` (module docstring)."""

    def __init__(self, local: LocalPartitions) -> None:
        self._local = local

    def failed_over_mark(self) -> int | None:
        """The cas of the failover this node learnt of and has not recovered from (kept on
        disk: a restarted node still knows its copies are stale)."""
        raw = self._local.store.column_family().get(_FAILED_OVER_KEY)
        return None if raw is None else int(raw)

    def set_failed_over_mark(self, cas: int | None) -> None:
        cf = self._local.store.column_family()
        if cas is None:
            cf.delete(_FAILED_OVER_KEY, sync=True)
        else:
            cf.put(_FAILED_OVER_KEY, str(cas).encode(), sync=True)

    def active_part(self, keyspace: str, partition: int) -> Partition | None:
        """The partition if this node holds it as the active copy (the sender's source)."""
        part = self._local.parts.get((keyspace, partition))
        return part if part is not None and part.meta.state == STATE_ACTIVE else None

    def create_empty(self, keyspace: str, partition: int) -> PartitionInfo:
        """An empty replica copy (placeholder branch); idempotent."""
        ks = self._local.keyspace(keyspace)
        self._local.check_partition_number(ks, partition)
        with self._local.lock:
            old = self._local.parts.get((keyspace, partition))
            if old is not None:
                return info_of(old.meta)
            meta = PartitionMeta(
                keyspace=keyspace,
                partition=partition,
                num_partitions=ks.num_partitions,
                failover_log=[FailoverEntry(PLACEHOLDER_UUID, 0)],
                state=STATE_REPLICA,
            )
            return info_of(self._local.install(meta, items=()).meta)

    def acks(self, keyspace: str, partitions: Sequence[int]) -> list[ReplicaAck]:
        """Where this node's copies of ``partitions`` stand (absent ones included)."""
        out = []
        for p in partitions:
            part = self._local.parts.get((keyspace, p))
            out.append(ReplicaAck(p, 0, 0, 0, ACK_ABSENT) if part is None else ack_of(part))
        return out

    def apply_runs(
        self, keyspace: str, runs: Sequence[ReplicaRun], *, sync: bool, inline: bool = False
    ) -> list[ReplicaAck]:
        """Apply every acceptable run in one atomic batch (module docstring); one ack per run.

        Locks are taken in partition order: a node's replica copies are written by one
        applier per active node, and two appliers never share a partition (one active each),
        but the order keeps that from mattering. ``inline`` (on the event loop, unsynced):
        ``WouldBlock``, nothing written, where the apply would wait (``lock_now``, a write
        stall)."""
        parts: list[tuple[ReplicaRun, Partition | None]] = [
            (run, self._local.parts.get((keyspace, run.partition))) for run in runs
        ]
        held = sorted({id(p): p for _r, p in parts if p is not None}.values(), key=_number)
        if inline:
            lock_now(held)
        else:
            for p in held:
                p.lock.acquire()
        try:
            batch = self._local.store.batch()
            staged: list[tuple[Partition, PartitionMeta]] = []
            outcome: dict[int, str] = {}
            for run, part in parts:
                if part is None:
                    outcome[run.partition] = ACK_ABSENT
                    continue
                state = _stage_run(part, run, batch)
                if isinstance(state, PartitionMeta):
                    staged.append((part, state))
                else:
                    outcome[run.partition] = state
            if inline and staged:
                try:  # a write stall refused at once: nothing written, the pool waits
                    commit_many(self._local.store, batch, staged, sync=False, no_stall=True)
                except Exception as exc:
                    raise WouldBlock(f"the store refused an unstalled write: {exc}") from exc
            elif staged or sync:
                # A staged meta equal to the old one changes nothing but costs nothing either.
                commit_many(self._local.store, batch, staged, sync=sync)
            acks = []
            for run, part in parts:
                if part is None:
                    acks.append(ReplicaAck(run.partition, 0, 0, 0, ACK_ABSENT))
                else:
                    acks.append(ack_of(part, outcome.get(run.partition)))
            return acks
        finally:
            for p in reversed(held):
                p.lock.release()

    def promote(self, keyspace: str, partition: int) -> FailoverEntry:
        """Make the replica copy active on a new branch; an active copy answers its current
        branch (idempotent: the master and reconcile may both ask)."""
        part = self._local.held(keyspace, partition)
        with part.lock:
            meta = part.meta.copy()
            if meta.state == STATE_ACTIVE:
                return meta.failover_log[0]
            if meta.state != STATE_REPLICA:
                raise BadRequest(
                    f"partition {partition} of {keyspace!r} is {meta.state}: only a replica "
                    "copy is promoted",
                    details={"keyspace": keyspace, "partition": partition, "state": meta.state},
                )
            entry = FailoverEntry(part.uuids(), meta.high_seqno)
            log = [e for e in meta.failover_log if e.uuid != PLACEHOLDER_UUID]
            meta.failover_log = [entry, *log][:MAX_FAILOVER_ENTRIES]
            meta.state = STATE_ACTIVE
            part.commit(self._local.store.batch(), meta, sync=True)
            return entry

    def adopt_pending(self, keyspace: str, partition: int) -> PartitionInfo:
        """A snapshot copy just installed (``pending``) becomes this node's replica copy."""
        part = self._local.held(keyspace, partition)
        with part.lock:
            if part.meta.state == STATE_PENDING:
                meta = part.meta.copy()
                meta.state = STATE_REPLICA
                part.commit(self._local.store.batch(), meta, sync=True)
        return info_of(part.meta)

    def demote(self, keyspace: str, partition: int) -> PartitionInfo:
        """Make a local active copy a replica (its node is now in the partition's chain as a
        replica): it stops serving at once; its history is checked by the active's next run."""
        part = self._local.held(keyspace, partition)
        with part.lock:
            if part.meta.state != STATE_REPLICA:
                meta = part.meta.copy()
                meta.state = STATE_REPLICA
                part.commit(self._local.store.batch(), meta, sync=True)
        part.fail_waiters(not_my_partition(keyspace, partition, STATE_REPLICA))
        return info_of(part.meta)

    def rollback_plan(
        self, keyspace: str, partition: int, active_log: Sequence[FailoverEntry]
    ) -> replica_rollback.RollbackPlan | None:
        """How to roll the replica copy back to where it meets ``active_log`` (None: start
        it again empty, ``restart_empty``)."""
        part = self._local.held(keyspace, partition)
        with part.lock:
            if part.meta.state != STATE_REPLICA:
                return None
            return replica_rollback.plan(part, active_log)

    def rollback(
        self,
        keyspace: str,
        partition: int,
        plan: replica_rollback.RollbackPlan,
        records: Sequence[bytes | None],
    ) -> bool:
        """``replica_rollback.apply`` on the replica copy (False: it moved meanwhile)."""
        part = self._local.held(keyspace, partition)
        if part.meta.state != STATE_REPLICA:
            return False
        return replica_rollback.apply(part, plan, records)

    def restart_empty(self, keyspace: str, partition: int) -> None:
        """Drop the replica copy and make it again empty (fed from seqno 0 or rebuilt)."""
        with self._local.lock:  # an RLock: create_empty takes it again
            part = self._local.parts.get((keyspace, partition))
            if part is None or part.meta.state != STATE_REPLICA:
                return
            self._local.drop(keyspace, partition)
            self.create_empty(keyspace, partition)

    def doc_records(
        self, keyspace: str, partition: int, docids: Sequence[str]
    ) -> list[bytes | None]:
        """The active copy's current records (encoded, tombstones included) of ``docids``:
        what a diverged replica rolls back to."""
        part = self.active_part(keyspace, partition)
        if part is None:
            state = self._local.held(keyspace, partition).meta.state
            raise not_my_partition(keyspace, partition, state)
        return part.cf.get_many([doc_key(d) for d in docids])

    def get_raw(self, keyspace: str, docid: str) -> tuple[bytes, int, int, int] | None:
        """A replica read: (body, cas, seqno, expiry) from whatever copy is here, active or replica
        (None: absent, deleted or expired at this node's clock). Possibly stale: a replica
        lags its active."""
        ks = self._local.keyspace(keyspace)
        p = partition_of(docid, ks.num_partitions)
        part = self._local.held(keyspace, p)
        if part.meta.state not in (STATE_ACTIVE, STATE_REPLICA):
            raise not_my_partition(keyspace, p, part.meta.state)
        raw = part.cf.get(doc_key(docid))
        if raw is None:
            return None
        rec = decode_doc(raw)
        if rec.deleted or (rec.expiry and rec.expiry * 1_000_000_000 <= self._local.clock_ns()):
            return None
        return rec.body, rec.cas, rec.seqno, rec.expiry


def _number(part: Partition) -> int:
    return part.meta.partition


def _stage_run(part: Partition, run: ReplicaRun, batch: BatchLike) -> PartitionMeta | str:
    """Stage one run on ``part`` (its lock held): the new meta, or the ack state refusing it."""
    meta = part.meta
    if meta.state != STATE_REPLICA:
        return meta.state
    log = run.failover_log
    if log is not None:
        log = [
            e if isinstance(e, FailoverEntry) else msgspec.convert(e, FailoverEntry) for e in log
        ]
    if meta.uuid != run.uuid:
        if log is None:
            return ACK_BEHIND  # the active resends with its log once it sees our uuid
        if not continues(meta.uuid, meta.high_seqno, log, run.uuid):
            return ACK_DIVERGED
    if run.after > meta.high_seqno:
        return ACK_BEHIND
    new = meta.copy()
    if log is not None and (meta.uuid != run.uuid or new.failover_log != log):
        new.failover_log = list(log[:MAX_FAILOVER_ENTRIES])
    # The active reads contiguous ranges, so a gap can only be at the start; checked before
    # anything is staged (a refused run must leave nothing in the shared batch).
    fresh = [c for c in run.changes if c[0] > meta.high_seqno]
    if fresh and (
        fresh[0][0] != meta.high_seqno + 1 or fresh[-1][0] - fresh[0][0] != len(fresh) - 1
    ):
        return ACK_BEHIND
    lives = run.live_before
    if lives is not None:  # aligned with ``changes``, of which ``fresh`` is the tail
        lives = lives[len(lives) - len(fresh) :] if len(lives) == len(run.changes) else None
    stage_tuples(part, new, batch, fresh, lives)
    return new


def read_run(
    part: Partition, after: int, upper: int, max_items: int, max_bytes: int
) -> list[ChangeTuple]:
    """The change records of ``part`` in (``after``, ``upper``], at most ``max_items`` and
    about ``max_bytes``, as wire tuples: what one ``ReplicaRun`` carries. The caller has
    checked ``after`` is at or above the purge seqno (else the records are gone)."""
    out: list[ChangeTuple] = []
    size = 0
    for key, raw in part.cf.iterate(change_key(after + 1), change_key(upper + 1)):
        rec = decode_change(raw)
        body = None if rec.op == OP_DELETE else rec.body
        out.append(
            (seqno_of_change_key(key), rec.docid, rec.op, rec.cas, body, rec.flags, rec.expiry)
        )
        size += len(rec.docid) + len(rec.body)
        if len(out) >= max_items or size >= max_bytes:
            break
    return out
