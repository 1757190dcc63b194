"""One index slice: stabilise, back index, initial build, snapshots, local scan; its queue of
key versions waiting for a stabilise is ``slice_queue.SliceQueue``.

Why it is correct, in short (in full: ``docs/decisions/0027-indexer-exactness.md``):

* **Idempotent delivery.** ``enqueue`` drops a key version whose seqno is at or below the
  applied seqno of its data partition (below T0 while a build loads) or whose (partition,
  seqno) is already queued: one mutation yields at most one key version per slice.
* **Exactly up to the TS.** ``stabilise(ts)`` takes exactly the queued versions with
  ``seqno <= ts[p]`` and decides each docid by its newest one against the back index (old
  entry removed, unchanged key writes nothing, removal of a docid not held does nothing, a
  back row with an equal or higher seqno wins).
* **Atomic.** Entries, back rows, tombstone log and the meta with the applied TS are one
  write batch: after a crash the applied TS on disk describes the entries on disk.
* **Snapshots** are taken under the slice lock right after the batch: the one labelled
  ``ts`` is the state at ``ts``.
* **Initial build** (``begin_load``, ``write_load``): ``loading`` at T0 on disk first, the
  sorted rows, then ``active`` at T0
  (``docs/decisions/0028-initial-builds-crashes-rollbacks.md``); a crash in between leaves
  ``loading``, which ``recover`` turns into ``needs_rebuild``.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

import msgspec

from shardex.core.spans import Span, spans_to_ranges
from shardex.core.timestamp import Timestamp
from shardex.errors import ErrorCode, ShardexError
from shardex.index.bulk import SortedLoad, sorted_load_rows, write_sorted
from shardex.index.keyversion import KeyVersion
from shardex.index.records import (
    META_KEY,
    STATE_ACTIVE,
    STATE_CREATED,
    STATE_LOADING,
    STATE_NEEDS_REBUILD,
    SliceMeta,
    cf_names,
    decode_back,
    encode_meta,
    parse_tombstone_log_key,
    tombstone_log_range,
)
from shardex.index.slice_decisions import Decided, Prepared
from shardex.index.slice_queue import Queued, SliceQueue, Taken
from shardex.index.snapshots import SnapshotRing
from shardex.index.spans import scan_chunks, scan_ranges
from shardex.storage import Batch, Store, StoreSnapshot

__all__ = ["DEFAULT_KEEP_SNAPSHOTS", "Slice", "SliceStats", "StabiliseAck"]

DEFAULT_KEEP_SNAPSHOTS = 5
# States whose storage a stabilise applies to (and against which decisions are taken).
_DECIDING = (STATE_ACTIVE, STATE_CREATED)
_ALL = (b"", b"\xff\xff")  # every key of a slice family (docids are UTF-8: never FF)


@dataclass(frozen=True, slots=True)
class StabiliseAck:
    """A slice's answer to ``stabilise(ts)``. ``already``: the TS was reached before (no work);
    ``applied``: key versions taken from the queue; ``writes``: entry/back-index/tombstone-log
    operations written (0 when every key was unchanged)."""

    index_id: str
    partition: int
    ts: Timestamp
    applied: int
    writes: int
    already: bool


@dataclass(slots=True)
class SliceStats:
    enqueued: int = 0
    dropped: int = 0  # already applied or already queued (re-delivery)
    applied: int = 0
    writes: int = 0
    unchanged: int = 0
    stale: int = 0  # older than the back row: never overwrites newer


@dataclass(slots=True)
class _Pending:
    ack: StabiliseAck
    meta: SliceMeta | None = None  # None: nothing to commit
    taken: Taken = field(default_factory=list)
    applied: Timestamp | None = None  # ``meta.applied`` as a TS (with ``meta``)


def _err(code: ErrorCode, msg: str, **details: Any) -> ShardexError:
    return ShardexError(msg, code=code, details=details)


class Slice:
    """Storage and queue of one index partition on this node. Thread-safe (one lock)."""

    def __init__(self, store: Store, meta: SliceMeta, *, keep_snapshots: int) -> None:
        self.store = store
        self.definition = meta.definition
        self.index_id = meta.definition.id
        self.partition = meta.partition
        self.desc = tuple(k.desc for k in meta.definition.keys)
        # An array index: each back row and key version holds a document's entries packed.
        self.packed = meta.definition.array_pos >= 0
        e, b, m = cf_names(self.index_id, self.partition)
        self._entries = store.column_family(e)
        self._back = store.column_family(b)
        self._meta_cf = store.column_family(m)
        self._meta = meta
        self._applied = Timestamp.from_wire(meta.applied)
        self._queue = SliceQueue()
        # The stabilise's decisions for the queued versions, taken as they arrive
        # (``slice_decisions.py``); None while the slice is not stabilisable (loading, rollback).
        self._decided: Decided | None = Decided() if meta.state in _DECIDING else None
        # Rows queued ahead and not decided yet: ``decide_pending`` (the indexer calls it right
        # after acknowledging an early delivery) or the stabilise folds them in.
        self._undecided: list[Queued] = []
        self._undecided_ordered = True
        # What a commit took out of the queue and its decisions: freed by the next
        # ``decide_pending`` (the I/O thread after an early delivery's reply) or commit,
        # not inside the round (freeing a batch's rows and decisions was ~10% of it).
        self._retired: list[object] = []
        self._snapshots = SnapshotRing(keep_snapshots, f"{self.index_id}/{self.partition}")
        self.lock = threading.RLock()
        self.stats = SliceStats()

    # -- state ------------------------------------------------------------------------------
    @property
    def state(self) -> str:
        return self._meta.state

    @property
    def items_count(self) -> int:
        return self._meta.count

    def applied_ts(self) -> Timestamp:
        """The TS the slice's storage is at (what the pipeline resumes from after a crash)."""
        return self._applied

    def high_watermark(self) -> dict[int, int]:
        """Per data partition, the highest seqno received (queued or applied)."""
        with self.lock:
            out = {p: e.seqno for p, e in self._applied.items()}
            for p, s in self._queue.high.items():
                if s > out.get(p, 0):
                    out[p] = s
            return out

    def queued(self) -> int:
        return len(self._queue)

    def _write_meta(self, meta: SliceMeta, *, sync: bool = True) -> None:
        batch = self.store.batch()
        batch.put(self._meta_cf, META_KEY, encode_meta(meta))
        self.store.write(batch, sync=sync)
        self._meta = meta

    # -- queue ------------------------------------------------------------------------------
    def enqueue(self, rows: Iterable[KeyVersion], *, ahead: bool = True) -> int:
        """Queue this slice's key versions; returns how many were new. Re-delivered ones
        (seqno already applied, below the build's T0, or already queued) are dropped.
        ``ahead``: the rows arrive before their stabilise (an early delivery), so they are
        decided ahead (``slice_decisions.py``), by ``decide_pending``: the delivery's reply does not
        wait for it. Rows that come with their stabilise (``ahead=False``) into an empty
        queue are left to the stabilise: deciding them first costs more than the stabilise
        deciding them (measured), and nothing is gained."""
        with self.lock:
            state = self._meta.state
            if state == STATE_NEEDS_REBUILD:
                return 0  # the rebuild reloads everything
            floor_ts = self._applied
            if state == STATE_LOADING and self._meta.load_ts is not None:
                floor_ts = Timestamp.from_wire(self._meta.load_ts)
            added, dropped, ordered = self._queue.add(rows, floor_ts)
            new = len(added)
            decided = self._decided
            if added and decided is not None:
                if ahead or len(decided) or self._undecided:
                    # Decided after the reply (``decide_pending``), off the stabilise's path,
                    # or with queued rows decided so: the decisions cover the whole queue.
                    self._undecided.extend(added)
                    self._undecided_ordered = self._undecided_ordered and ordered
                else:
                    self._decided = None  # the stabilise decides; its commit resets this
            self.stats.enqueued += new
            self.stats.dropped += dropped
            return new

    def decide_pending(self) -> int:
        """Decide the rows queued ahead since the last call (``slice_decisions.py``); returns how
        many. The indexer runs it on its I/O thread right after acknowledging an early
        delivery: the sender (the driver's read-ahead, which the next batch waits for) does
        not wait for the decisions."""
        with self.lock:
            self._retired = []
            rows = self._undecided
            if not rows:
                return 0
            if self._decided is not None:
                self._decided.add(rows, self._back, ordered=self._undecided_ordered)
                self._decided.seal()  # the write batch's sorted lists, off the round's path
            self._undecided = []
            self._undecided_ordered = True
            return len(rows)

    def drop_queued_above(self, partition: int, seqno: int) -> int:
        """Forget the queued key versions of data partition ``partition`` above ``seqno``;
        returns how many. The pipeline's drop before a round (``pipeline/rounds/cleaned.py``):
        versions queued by a round the pipeline does not know of may belong to a branch the
        round's end is not on, and a re-delivery would be dropped as a duplicate of them, so
        the round clears them before delivering its rows."""
        with self.lock:
            gone = self._queue.drop_above(partition, seqno)
            if gone:
                self._reset_decided()  # a dropped version may be a docid's decided one
            return gone

    # -- stabilise --------------------------------------------------------------------------
    def stabilise(self, ts: Timestamp, *, sync: bool = True) -> StabiliseAck:
        """Apply the queue up to ``ts`` in one atomic batch, then snapshot at ``ts``."""
        with self.lock:
            batch = self.store.batch()
            pending = self.prepare(ts, batch)
            if pending.meta is not None:
                self.store.write(batch, sync=sync)
            self.commit(pending)
            return pending.ack

    def prepare(self, ts: Timestamp, batch: Batch) -> _Pending:
        """Add the work of ``stabilise(ts)`` to ``batch``; the caller holds ``self.lock``,
        writes the batch, then calls :meth:`commit`. Split so one batch (one fsync) can
        serve every slice of an index on this node."""
        state = self._meta.state
        if state == STATE_NEEDS_REBUILD:
            raise _err(ErrorCode.INDEX_IN_ROLLBACK, f"slice {self._name()} needs a rebuild")
        if state == STATE_LOADING:
            raise _err(ErrorCode.INDEX_NOT_READY, f"slice {self._name()} is still loading")
        applied = self._applied
        ahead, behind = applied.seqno_moves(ts)
        if not ahead and not behind and applied.diverged_from(ts):
            # The same seqnos on a new branch (a failover with no write since: the pipeline
            # checked the old point is in the new branch's history, ``pipeline/branches.py``):
            # nothing to apply, but the applied TS and a snapshot must name the new uuids, or
            # no scan at them (request_plus) and no publish of them ever sees this slice there.
            ahead = True
        if not ahead:
            # Reached before: acknowledged without work (a re-run micro-batch, a re-sent TS).
            return _Pending(StabiliseAck(self.index_id, self.partition, ts, 0, 0, True))
        if behind:
            raise _err(
                ErrorCode.BAD_REQUEST,
                f"stability TS for slice {self._name()} goes backwards in partitions {behind}",
                behind=behind[:20],
            )
        # The whole queue up to ts (no version left behind): the decisions taken as the
        # versions arrived are the stabilise's (``slice_decisions.py``); else decide from storage.
        if self._decided is not None and self._queue.covered_by(ts):
            self.decide_pending()  # rows queued since the last call (or with this stabilise)
            taken, n_taken = self._queue.take_all()
            writes, delta, unchanged, stale = self._decided.write(
                batch, self._entries, self._back, self._meta_cf, packed=self.packed
            )
        else:
            taken, n_taken, latest = self._queue.take(ts)
            writes, delta, unchanged, stale = self._apply(latest, batch)
        self.stats.unchanged += unchanged
        self.stats.stale += stale
        reached = applied.updated(ts)
        meta = SliceMeta(
            definition=self.definition,
            partition=self.partition,
            state=STATE_ACTIVE,
            applied=reached.to_wire(),
            count=self._meta.count + delta,
        )
        batch.put(self._meta_cf, META_KEY, encode_meta(meta))
        ack = StabiliseAck(self.index_id, self.partition, ts, n_taken, writes, False)
        return _Pending(ack, meta, taken, reached)

    def _apply(self, latest: dict[str, Queued], batch: Batch) -> tuple[int, int, int, int]:
        """Decide each docid's final state against the back index (``slice_decisions.decide``) and
        add the writes to ``batch``; returns (writes, change in live entries, unchanged,
        stale). Back rows are read in one ``get_many``, in docid order (str order of docids
        is UTF-8 byte order), and decided in that order straight into the batch's sorted
        lists (``Prepared.decide_sorted``)."""
        docids = sorted(latest)
        keys = [d.encode("utf-8") for d in docids]
        raws = self._back.get_many(keys)
        prepared = Prepared()
        prepared.decide_sorted(list(map(latest.__getitem__, docids)), keys, raws)
        return prepared.write(batch, self._entries, self._back, self._meta_cf, packed=self.packed)

    def commit(self, pending: _Pending) -> None:
        """After the batch is durable: drop the taken key versions, publish the applied TS,
        snapshot. Called under ``self.lock``."""
        ack = pending.ack
        if pending.meta is not None and pending.applied is not None:  # set together
            retired: list[object] = [self._decided, *self._queue.remove(pending.taken)]
            self._meta = pending.meta
            self._applied = pending.applied
            self._reset_decided()  # decided against the storage before this commit
            self._retired = retired  # the previous commit's are freed here
            self.stats.applied += ack.applied
            self.stats.writes += ack.writes
            self._take_snapshot(ack.ts)
        elif ack.ts == self._applied and not self._snapshots.has(ack.ts):
            self._take_snapshot(ack.ts)  # re-sent TS after a restart: make it scannable

    def _reset_decided(self) -> None:
        """Decide again, from storage as it is now, for every queued version: after a commit
        or anything else that changed the back index or took versions out of the queue
        (``slice_decisions.py``). None while the slice is not stabilisable. Called under the
        lock."""
        self._undecided = []
        self._undecided_ordered = True
        if self._meta.state not in _DECIDING:
            self._decided = None
            return
        decided = Decided()
        for rows, ordered in self._queue.runs():
            decided.add(rows, self._back, ordered=ordered)
        self._decided = decided

    # -- initial build ------------------------------------------------------------------------
    def begin_load(self, ts0: Timestamp, *, restart: bool = False) -> None:
        """Enter ``loading`` at T0 (durably): from now on key versions with seqno <= T0[p]
        are dropped at enqueue, later ones queue up until the load is done. Idempotent for
        the same T0. ``restart``: a slice ``loading`` (at another T0), ``needs_rebuild`` or
        ``active`` (the engine checked T0 is past it) is emptied first (a restarted build);
        queued versions above T0 are kept."""
        with self.lock:
            if self.state == STATE_LOADING and self._meta.load_ts == dict(ts0.to_wire()):
                return
            torn = self.state in (STATE_LOADING, STATE_NEEDS_REBUILD, STATE_ACTIVE)
            if self.state != STATE_CREATED and not (restart and torn):
                raise ShardexError(
                    f"slice {self._name()} is {self.state}: a load needs an empty slice",
                    code=ErrorCode.BAD_REQUEST,
                    details={"hint": "reset() it first"},
                )
            meta = SliceMeta(
                definition=self.definition,
                partition=self.partition,
                state=STATE_LOADING,
                load_ts=dict(ts0.to_wire()),
            )
            if torn:  # storage of a torn or older load, or of a lost history: start empty
                self._empty(meta)
            else:
                self._write_meta(meta)
            self._queue.drop_upto(ts0)
            self._reset_decided()  # loading: the stabilise waits for the load

    def bulk_load(
        self, rows: Iterable[KeyVersion], ts0: Timestamp, *, use_sst: bool | None = None
    ) -> str:
        """Initial build: load the UPSERT key versions of a snapshot at ``ts0`` (any order;
        sorted here), record ``ts0`` as applied, snapshot it. Returns ``"sst"``/``"batch"``."""
        return self.write_load(sorted_load_rows(rows), ts0, use_sst=use_sst)

    def write_load(self, load: SortedLoad, ts0: Timestamp, *, use_sst: bool | None = None) -> str:
        """``bulk_load`` of rows already sorted (a load session's ``sorted_load``).

        A crash before the final meta write leaves ``loading`` on disk, which ``recover``
        turns into ``needs_rebuild``: a torn load is never mistaken for a complete one."""
        with self.lock:
            self.begin_load(ts0)
            method, count = write_sorted(
                self.store, self._entries, self._back, load, use_sst=use_sst, packed=self.packed
            )
            meta = SliceMeta(
                definition=self.definition,
                partition=self.partition,
                state=STATE_ACTIVE,
                applied=dict(ts0.to_wire()),
                count=count,
            )
            self._write_meta(meta, sync=True)
            self._applied = ts0
            self._queue.drop_upto(ts0)
            self._reset_decided()  # what queued during the load, against the loaded rows
            self._take_snapshot(ts0)
            return method

    # -- snapshots and scans ------------------------------------------------------------------
    def _take_snapshot(self, ts: Timestamp) -> None:
        self._snapshots.add(ts, lambda: self.store.snapshot([self._entries.name]))

    def snapshot_timestamps(self) -> list[Timestamp]:
        """Kept snapshots, oldest first."""
        with self.lock:
            return self._snapshots.timestamps()

    def latest_snapshot_ts(self) -> Timestamp | None:
        with self.lock:
            return self._snapshots.latest()

    def lease_snapshot(self, ts: Timestamp, lease_id: str, ttl: float) -> float:
        """Keep the snapshot at ``ts`` for a paginated scan (``SnapshotRing.lease``)."""
        with self.lock:
            return self._snapshots.lease(ts, lease_id, ttl, self._applied)

    def release_lease(self, lease_id: str) -> bool:
        with self.lock:
            return self._snapshots.release_lease(lease_id)

    def lease_expiry(self) -> float | None:
        """When the last live snapshot lease ends (``time.monotonic``), None without one."""
        with self.lock:
            return self._snapshots.lease_expiry()

    def scan(
        self,
        spans: Iterable[Span] | None = None,
        *,
        snapshot_ts: Timestamp | None = None,
        limit: int | None = None,
        reverse: bool = False,
        raw: bool = False,
        chunk_rows: int | None = None,
    ) -> Iterator[Any]:
        """Entries in ``spans`` (None: all) as ``(key values, docid)`` (or raw entry bytes),
        at the snapshot taken at ``snapshot_ts`` or at the tip (None); ``chunk_rows``: read
        from storage that many at a time (``spans.scan_ranges``). Errors (rollback,
        SNAPSHOT_TOO_OLD, not reached) are raised here, not on first iteration."""
        with self.lock:
            snap = self._scan_snapshot(snapshot_ts)
            desc = self.desc if any(self.desc) else None
            return scan_ranges(
                self._entries, spans_to_ranges(spans), snap, limit, reverse, raw, desc, chunk_rows
            )

    def scan_chunks(
        self,
        spans: Iterable[Span] | None = None,
        *,
        snapshot_ts: Timestamp | None = None,
        limit: int | None = None,
        chunk_rows: int | None = None,
    ) -> Iterator[list[bytes]]:
        """``scan(raw=True)``'s entries in the lists storage reads them in (``spans.scan_chunks``):
        what the scan service merges and sends a block at a time."""
        with self.lock:
            snap = self._scan_snapshot(snapshot_ts)
            ranges = spans_to_ranges(spans)
            return scan_chunks(self._entries, ranges, snap, limit, False, chunk_rows)

    def _scan_snapshot(self, snapshot_ts: Timestamp | None) -> StoreSnapshot | None:
        """The snapshot a scan at ``snapshot_ts`` reads (None: the tip), or the error that
        refuses it (rollback, loading, SNAPSHOT_TOO_OLD, not reached). Under the lock."""
        if self._meta.state == STATE_NEEDS_REBUILD:
            raise _err(ErrorCode.INDEX_IN_ROLLBACK, f"slice {self._name()} is rolling back")
        if self._meta.state == STATE_LOADING:
            raise _err(ErrorCode.INDEX_NOT_READY, f"slice {self._name()} is loading")
        if snapshot_ts is None:
            return None
        return self._snapshots.at(snapshot_ts, self._applied)

    def entries(self, snapshot_ts: Timestamp | None = None) -> list[bytes]:
        """Every entry (raw bytes) at a snapshot or the tip: what the oracle checks."""
        return list(self.scan(snapshot_ts=snapshot_ts, raw=True))

    def back_rows(self) -> dict[str, tuple[int, int, bytes]]:
        """The back index at the tip: docid -> (partition, seqno, entry or b"")."""
        return {k.decode("utf-8"): tuple(decode_back(v)) for k, v in self._back.iterate()}

    # -- maintenance --------------------------------------------------------------------------
    def purge_tombstones(self, stable_ts: Timestamp) -> int:
        """Remove tombstones whose seqno is covered by ``stable_ts`` (a TS stable on every
        slice, so their removals can no longer be re-delivered). Returns how many."""
        with self.lock:
            batch = self.store.batch()
            purged = 0
            for p, e in stable_ts.items():
                lo, hi = tombstone_log_range(p, e.seqno)
                for k, _ in self._meta_cf.iterate(lo, hi):
                    _, seqno, docid = parse_tombstone_log_key(k)
                    batch.delete(self._meta_cf, k)
                    key = docid.encode("utf-8")
                    raw = self._back.get(key)
                    if raw is not None:
                        row = decode_back(raw)
                        if not row.entry and row.seqno == seqno:
                            batch.delete(self._back, key)
                            purged += 1
            self.store.write(batch)
            if purged:
                self._reset_decided()  # a decided docid's back row may be gone
            return purged

    def rollback_to(self, partition: int, seqno: int) -> bool:
        """Data partition ``partition`` rolled back to ``seqno`` (its history diverged after
        it). Queued key versions above it are discarded. If the slice already applied beyond
        it, entries from the lost history may be in storage: the slice is marked
        ``needs_rebuild`` (scans get INDEX_IN_ROLLBACK) and True is returned; the simplest
        correct recovery is ``reset`` and a new initial build."""
        with self.lock:
            if self._queue.holds(partition):
                self._queue.drop_above(partition, seqno)
                self._reset_decided()
            if self._applied.seqno(partition) <= seqno and self.state != STATE_LOADING:
                return False
            self._queue.clear()
            self._write_meta(msgspec.structs.replace(self._meta, state=STATE_NEEDS_REBUILD))
            self._reset_decided()
            return True

    def reset(self) -> None:
        """Empty the slice (entries, back index, meta, queue, snapshots): back to ``created``,
        ready for an initial build."""
        with self.lock:
            self._empty(SliceMeta(definition=self.definition, partition=self.partition))
            self._queue.clear()
            self._reset_decided()

    def _empty(self, meta: SliceMeta) -> None:
        """Delete entries, back index and meta, then write ``meta`` (one durable batch)."""
        batch = self.store.batch()
        for cf in (self._entries, self._back, self._meta_cf):
            batch.delete_range(cf, *_ALL)
        batch.put(self._meta_cf, META_KEY, encode_meta(meta))
        self.store.write(batch, sync=True)
        self._meta = meta
        self._applied = Timestamp()
        self._reset_decided()
        self._snapshots.release_all()

    def close(self) -> None:
        """Release snapshots and the column-family handles (they keep RocksDB open)."""
        with self.lock:
            self._snapshots.release_all()
            self._entries = self._back = self._meta_cf = None  # type: ignore[assignment]

    def recover(self) -> None:
        """After opening: a torn initial build needs a rebuild; an active slice gets a
        snapshot at its applied TS so a re-sent stabilise or scan at it works."""
        with self.lock:
            if self._meta.state == STATE_LOADING:
                self._write_meta(msgspec.structs.replace(self._meta, state=STATE_NEEDS_REBUILD))
            elif self._meta.state == STATE_ACTIVE and not self._snapshots:
                self._take_snapshot(self._applied)

    def _name(self) -> str:
        return f"{self.index_id}/{self.partition}"

    def __repr__(self) -> str:
        return f"Slice({self._name()}, {self.state}, applied={self._applied!r})"
