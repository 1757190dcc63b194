"""One partition on this node: its lock, its in-memory meta, and every write to it.

Why one lock per partition (not per engine): seqnos are per partition, so writers of
different partitions never need to wait for each other's seqno assignment; writers of the same
partition must, or two batches could commit seqnos out of order. The lock is held from reading
the current document (for CAS / exists checks) until the batch is in RocksDB and the in-memory
meta is updated, which is what makes the seqnos gap-free and strictly increasing and the
checks race-free. ``Store.write`` takes the store's own lock inside this one (never the other
way round), so there is no lock-order cycle.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

import msgspec
from msgspec.structs import replace as replace_struct

from shardex.api.data import ChangeTuple
from shardex.api.errors import CasMismatch, DocExists, DocNotFound, not_my_partition
from shardex.api.expiry import FLAG_EXPIRED
from shardex.api.records import (
    MAX_FAILOVER_ENTRIES,
    OP_DELETE,
    OP_UPSERT,
    STATE_ACTIVE,
    FailoverEntry,
    MutationResult,
)
from shardex.data.engine_io import WouldBlock
from shardex.data.records import (
    META_KEY,
    PREFIX_CHANGE,
    PREFIX_CONSUMER,
    PREFIX_DOC,
    DocRecord,
    PartitionMeta,
    change_key,
    decode_change,
    decode_doc,
    decode_int,
    doc_key,
    encode,
    new_uuid,
    next_prefix,
    seqno_of_change_key,
)
from shardex.errors import ShardexError
from shardex.storage import Batch, ColumnFamily, Store

PURGE_CHUNK = 10_000  # change records purged per batch, to bound how long the lock is held
# The newest changes an active copy keeps in memory for its replica senders (``recent``):
# at most this many, and about this many bytes of bodies.
RECENT_CHANGES = 32
RECENT_BYTES = 256 * 1024
Recent = tuple[ChangeTuple, bool]  # a change kept, and whether its document was live before


class PreparedOp(msgspec.Struct, gc=False):
    """A validated mutation: ``kind`` is insert / upsert / replace / delete / touch (the
    current body again, with a new ``expiry``) / expire (the expiry pager's deletion of an
    expired document whose CAS is still ``cas``). ``expiry``: the resolved absolute expiry
    to store (epoch seconds, 0 for never). A Struct, not a dataclass: built once per write,
    and a Struct's constructor runs no Python."""

    kind: str
    docid: str
    body: bytes
    cas: int | None
    expiry: int = 0


@dataclass(slots=True)
class _Waiter:
    seqno: int
    loop: asyncio.AbstractEventLoop
    future: asyncio.Future[int]


def _resolve(fut: asyncio.Future[int], value: int | BaseException) -> None:
    if fut.done():
        return
    if isinstance(value, BaseException):
        fut.set_exception(value)
    else:
        fut.set_result(value)


class Partition:
    """State and write path of one (keyspace, partition) column family."""

    def __init__(
        self,
        store: Store,
        cf: ColumnFamily,
        meta: PartitionMeta,
        *,
        clock_ns: Callable[[], int] = time.time_ns,
        uuids: Callable[[], int] = new_uuid,
    ) -> None:
        self.store = store
        self.cf = cf
        self.meta = meta  # replaced (never mutated) after each commit
        # The wall clock CAS values follow and the source of new branches' uuids: the
        # simulator passes its virtual clock and a seeded generator, so a run replays.
        self.clock_ns = clock_ns
        self.uuids = uuids
        self.lock = threading.Lock()
        self.frozen = False  # in memory only: a restart ends an unfinished hand-over
        self.dirty = False  # has unsynced ("memory") writes not yet covered by a WAL fsync
        # The high seqno the last WAL fsync covered: what this copy has persisted, which a
        # replica reports to its active (a ``persist_majority`` write waits on it).
        self.synced_high = meta.high_seqno
        # An unsynced write since the last periodic WAL sync: such a busy partition keeps
        # its dirty mark across that sync (``recovery.DirtyMarks.clear``).
        self.wrote_unsynced = False
        # Set by the engine (see recovery.py): called under ``lock`` before an unsynced write
        # to record a dirty mark durably, and on a synced write to add the mark's removal.
        self.before_unsynced: Callable[[Partition], None] = lambda _p: None
        self.clear_mark_into: Callable[[Partition, Batch], None] = lambda _p, _b: None
        self._waiters: list[_Waiter] = []
        self._wlock = threading.Lock()
        # The newest committed changes of this copy, while it is active and a replica sender
        # reads them (``keep_recent``, set by ``recent_changes``): what the sender would
        # otherwise read back from the change log right after they were written. A deque
        # the writer appends to (under ``lock``) and readers copy whole, with the branch it
        # is on and the bytes its bodies hold; replaced, never emptied, when it breaks.
        self.keep_recent = False
        self._recent: tuple[int, collections.deque[Recent]] = (0, collections.deque())
        self._recent_bytes = 0
        self._staged: tuple[PartitionMeta, list[Recent]] | None = None

    def detach(self) -> None:
        """The store is closing: drop the column-family handle (it pins the database)."""
        with self.lock:
            del self.cf

    @property
    def keyspace(self) -> str:
        return self.meta.keyspace

    @property
    def number(self) -> int:
        return self.meta.partition

    # serving state -----------------------------------------------------------------------
    def check_serving(self, *, write: bool) -> None:
        state = self.meta.state
        if state != STATE_ACTIVE:
            raise not_my_partition(self.keyspace, self.number, state)
        if write and self.frozen:
            raise not_my_partition(self.keyspace, self.number, "frozen", retry_after_ms=50)

    @property
    def persisted_seqno(self) -> int:
        """The highest seqno a machine crash cannot lose here."""
        return self.synced_high if self.dirty else self.meta.high_seqno

    def read_doc(self, docid: str) -> DocRecord | None:
        raw = self.cf.get(doc_key(docid))
        return None if raw is None else decode_doc(raw)

    # commit --------------------------------------------------------------------------------
    def commit(self, batch: Batch, meta: PartitionMeta, *, sync: bool) -> None:
        """Write ``batch`` plus ``meta`` atomically, then publish ``meta`` and wake waiters.
        Caller holds ``lock``. If the write fails nothing in memory changes."""
        commit_many(self.store, batch, [(self, meta)], sync=sync)

    def _publish(self, meta: PartitionMeta, sync: bool) -> None:
        """Make ``meta`` (just written) the partition's and wake the waiters it passes."""
        if sync:
            self.dirty = False
            self.wrote_unsynced = False
            self.synced_high = meta.high_seqno
        advanced = meta.high_seqno > self.meta.high_seqno
        staged, self._staged = self._staged, None
        if staged is not None and staged[0] is meta:
            self._remember(meta, staged[1])
        elif self._recent[1]:
            # Written by anything but ``stage`` (a replica's apply, a new branch, a state
            # change, a purge): what is kept may no longer be this copy's newest history.
            self._recent, self._recent_bytes = (0, collections.deque()), 0
        self.meta = meta
        if advanced and self._waiters:  # publish, then look (see ``add_waiter``)
            self.notify()

    def _remember(self, meta: PartitionMeta, changes: list[Recent]) -> None:
        """Add ``changes`` (just committed with ``meta``) to ``recent``, dropping the oldest
        past its bounds (the bodies' bytes: a docid is short). Caller holds ``lock``."""
        uuid = meta.failover_log[0].uuid
        kept_uuid, kept = self._recent
        if kept_uuid != uuid or (kept and kept[-1][0][0] + 1 != changes[0][0][0]):
            kept = collections.deque()
            self._recent, size = (uuid, kept), 0
        else:
            size = self._recent_bytes
        for c in changes:
            kept.append(c)
            if c[0][4] is not None:
                size += len(c[0][4])
        if len(kept) > RECENT_CHANGES or size > RECENT_BYTES:
            while kept and (len(kept) > RECENT_CHANGES or size > RECENT_BYTES):
                body = kept.popleft()[0][4]
                if body is not None:
                    size -= len(body)
        self._recent_bytes = size

    def recent_changes(
        self, after: int, upper: int, uuid: int
    ) -> tuple[list[ChangeTuple], list[bool]] | None:
        """The changes in (``after``, ``upper``] on branch ``uuid`` from memory, and for each
        whether its document was live before it; None when memory does not hold them all
        (read the change log). Any thread, without ``lock``: the writer only appends, and
        the copy is taken in one C call under the GIL."""
        self.keep_recent = True
        kept_uuid, kept = self._recent
        if kept_uuid != uuid or upper <= after:
            return None
        items = list(kept)
        if not items:
            return None
        first = items[0][0][0]
        if first > after + 1 or items[-1][0][0] < upper:
            return None
        items = items[after + 1 - first : upper + 1 - first]
        return [c for c, _ in items], [live for _, live in items]

    # mutations ----------------------------------------------------------------------------
    def apply(self, ops: list[PreparedOp], *, sync: bool) -> list[MutationResult | ShardexError]:
        """Apply ``ops`` in order as one atomic batch; each op that fails its check (exists,
        not found, CAS) is skipped with its error in the result and takes no seqno."""
        with self.lock:
            self.check_serving(write=True)
            batch = self.store.batch()
            meta, results = self.stage(ops, batch)
            if meta is not None:
                self.commit(batch, meta, sync=sync)
            return results

    def stage(
        self, ops: list[PreparedOp], batch: Batch
    ) -> tuple[PartitionMeta | None, list[MutationResult | ShardexError]]:
        """Check ``ops`` against the current documents, assign seqnos and CAS values, and add
        their records to ``batch``. Returns the meta to commit with it (None if no op passed
        its checks). Caller holds ``lock`` and has checked the partition serves writes.

        Every write of the node passes here, mostly one op per call (a group of 16 spreads
        over 64 partitions), so the per-op work is kept to what the format needs: the docid
        encoded once for the read and the put, the meta's counters in locals, no check call
        for an upsert without CAS (it has none), and the two records encoded as tuples in
        their structs' field order (``DocRecord`` / ``ChangeRecord`` are ``array_like`` with
        every field encoded, so the bytes are the same: ``test_data_write_format.py`` pins
        them) instead of building a Struct only to encode it."""
        meta = self.meta
        start = high = meta.high_seqno
        max_cas = meta.max_cas
        doc_count = meta.doc_count
        uuid = meta.failover_log[0].uuid
        number = meta.partition
        cf = self.cf
        # rocksdict's own bound get and put (no wrapper call per op, see ``storage/rocks.py``)
        get = cf.get_tip
        put = batch.rocks_put
        handle = cf.handle
        time_ns = self.clock_ns
        # Docids written earlier in this call: (live, cas, body, expiry) of the version just
        # staged.
        seen: dict[str, tuple[bool, int, bytes, int]] = {}
        results: list[MutationResult | ShardexError] = []
        recent: list[Recent] | None = [] if self.keep_recent else None
        # Keys built inline: ``doc_key(docid)``, ``change_key(high)``.
        for op in ops:
            docid = op.docid
            key = PREFIX_DOC + docid.encode("utf-8")
            got = seen.get(docid)
            if got is not None:
                live_before, cur_cas, cur_body, cur_expiry = got
            else:
                raw = get(key)
                if raw is None:
                    live_before, cur_cas, cur_body, cur_expiry = False, 0, b"", 0
                else:
                    cur = decode_doc(raw)
                    live_before, cur_cas = not cur.deleted, cur.cas
                    cur_body, cur_expiry = cur.body, cur.expiry
            kind = op.kind
            # An expired document not yet deleted is stored live (``doc_count``) but absent
            # to every check: an insert creates it anew, a replace or touch finds nothing.
            visible = live_before
            if cur_expiry and live_before and cur_expiry * 1_000_000_000 <= time_ns():
                visible = False
            if kind != "upsert" or op.cas is not None:
                err = self._check(op, visible, cur_cas, live_before and cur_expiry)
                if err is not None:
                    results.append(err)
                    continue
            high += 1
            cas = max_cas + 1
            now = time_ns()
            if now > cas:
                cas = now
            max_cas = cas
            body = op.body
            expiry = op.expiry
            flags = 0
            if kind == "touch":
                body = cur_body
            elif kind == "expire":
                flags = FLAG_EXPIRED
            live = kind != "delete" and kind != "expire"  # a delete stores a tombstone
            put(key, encode((cas, high, not live, body, flags, expiry)), handle)
            change = PREFIX_CHANGE + high.to_bytes(8, "big")
            op_name = OP_UPSERT if live else OP_DELETE
            put(change, encode((docid, op_name, cas, body, flags, expiry)), handle)
            if recent is not None:
                kept = (high, docid, op_name, cas, body if live else None, flags, expiry)
                recent.append((kept, live_before))
            doc_count += live - live_before
            seen[docid] = (live, cas, body, expiry)
            results.append(MutationResult(number, high, uuid, cas))
        if high == start:
            return None, results
        # A new meta sharing the failover log: a meta is replaced, never mutated, and a
        # branch assigns a new log (``new_branch``), so no copy of the list is needed.
        new = replace_struct(meta, high_seqno=high, max_cas=max_cas, doc_count=doc_count)
        # Kept for ``_publish``, which remembers them only if it is this meta that committed.
        self._staged = None if recent is None else (new, recent)
        return new, results

    def _check(self, op: PreparedOp, live: bool, cur_cas: int, expiry: int) -> ShardexError | None:
        """The op's error against the current version (``live``: stored and not expired,
        with CAS ``cur_cas``; ``expiry``: the stored version's, 0 when it has none or is a
        tombstone)."""
        where = {"docid": op.docid, "partition": self.number}
        if op.kind == "expire":
            # Only the version the pager saw expired: a write since then (a new CAS) or an
            # expiry extended by a touch keeps the document.
            if live or not expiry or op.cas != cur_cas:
                return DocNotFound(f"document {op.docid!r} is not expired", details=where)
            return None
        if op.kind == "insert":
            if live:
                return DocExists(f"document {op.docid!r} already exists", details=where)
            return None
        if op.kind == "upsert" and op.cas is None:
            return None
        if not live:
            return DocNotFound(f"document {op.docid!r} not found", details=where)
        if op.cas is not None and op.cas != cur_cas:
            return CasMismatch(
                f"CAS mismatch on {op.docid!r}: expected {op.cas}, document has {cur_cas}",
                details={**where, "expected": op.cas, "actual": cur_cas},
            )
        return None

    # history --------------------------------------------------------------------------------
    def new_branch(self) -> FailoverEntry:
        """Start a new history branch at the current high seqno (newest first in the log)."""
        with self.lock:
            meta = self.meta.copy()
            entry = FailoverEntry(self.uuids(), meta.high_seqno)
            meta.failover_log = [entry, *meta.failover_log][:MAX_FAILOVER_ENTRIES]
            self.commit(self.store.batch(), meta, sync=True)
            return entry

    def set_state(self, state: str) -> None:
        with self.lock:
            meta = self.meta.copy()
            meta.state = state
            self.commit(self.store.batch(), meta, sync=True)
            self.frozen = False
        if state != STATE_ACTIVE:
            self.fail_waiters(not_my_partition(self.keyspace, self.number, state))

    # retention ------------------------------------------------------------------------------
    def consumers(self) -> dict[str, int]:
        return {
            k[1:].decode("utf-8"): decode_int(v)
            for k, v in self.cf.iterate(PREFIX_CONSUMER, next_prefix(PREFIX_CONSUMER))
        }

    def purge_to(self, target: int) -> int:
        """Remove change records with seqno <= ``target`` and the tombstones they created (if
        still the document's current version), advancing ``purge_seqno``. Returns how many
        change records went. Unsynced: losing a purge only keeps records longer."""
        purged = 0
        while True:
            with self.lock:
                meta = self.meta.copy()
                start = meta.purge_seqno
                end = min(target, start + PURGE_CHUNK, meta.high_seqno)
                if end <= start:
                    return purged
                batch = self.store.batch()
                lo, hi = change_key(start + 1), change_key(end + 1)
                for key, raw in self.cf.iterate(lo, hi):
                    purged += 1
                    rec = decode_change(raw)
                    if rec.op != OP_DELETE:
                        continue
                    cur = self.read_doc(rec.docid)
                    if cur is not None and cur.deleted and cur.seqno == seqno_of_change_key(key):
                        batch.delete(self.cf, doc_key(rec.docid))
                batch.delete_range(self.cf, lo, hi)
                meta.purge_seqno = end
                self.commit(batch, meta, sync=False)

    # waiters (live streams) -------------------------------------------------------------------
    def add_waiter(self, seqno: int, loop: asyncio.AbstractEventLoop) -> asyncio.Future[int] | None:
        """A future resolved (on ``loop``) with the high seqno once it exceeds ``seqno``, or
        None if it already does. Checked under the waiter lock, which ``notify`` also takes
        after publishing the new meta when there are waiters, and checked again once the
        waiter is listed, so a commit can never slip between check and wait."""
        with self._wlock:
            self.check_serving(write=False)
            if self.meta.high_seqno > seqno:
                return None
            fut: asyncio.Future[int] = loop.create_future()
            waiter = _Waiter(seqno, loop, fut)
            self._waiters.append(waiter)
            # Checked again after the append: ``notify`` skips its lock when it sees no
            # waiters, so a commit published between the check above and the append would
            # otherwise go unnoticed (publish-then-look there, append-then-look here: one of
            # the two always sees the other, the GIL orders them).
            if self.meta.high_seqno > seqno:
                self._waiters.remove(waiter)
                return None
            return fut

    def remove_waiter(self, fut: asyncio.Future[int]) -> None:
        with self._wlock:
            self._waiters = [w for w in self._waiters if w.future is not fut]

    def notify(self) -> None:
        """Wake waiters whose seqno is now passed. Writers may be any thread, so results are
        delivered with ``call_soon_threadsafe`` on each waiter's own loop."""
        if not self._waiters:  # the usual commit: nobody waits (see ``add_waiter``)
            return
        with self._wlock:
            high = self.meta.high_seqno
            ready = [w for w in self._waiters if w.seqno < high]
            if not ready:
                return
            self._waiters = [w for w in self._waiters if w.seqno >= high]
        _deliver(ready, high)

    def fail_waiters(self, exc: BaseException) -> None:
        with self._wlock:
            ready, self._waiters = self._waiters, []
        _deliver(ready, exc)


def commit_many(
    store: Store,
    batch: Batch,
    staged: list[tuple[Partition, PartitionMeta]],
    *,
    sync: bool,
    no_stall: bool = False,
) -> None:
    """One atomic write (one fsync when ``sync``) of ``batch`` and the new meta of every
    staged partition, then publish each meta. Caller holds every staged partition's lock.

    Why across partitions: an fsync costs milliseconds here, so a client batch spread over
    64 partitions pays one instead of 64 (measured in
    docs/decisions/0007-batches-span-partitions.md)."""
    put = batch.rocks_put
    for part, meta in staged:
        put(META_KEY, encode(meta), part.cf.handle)
        if not sync:
            part.wrote_unsynced = True
            if not part.dirty:  # else its dirty mark is already durable
                part.before_unsynced(part)
        elif part.dirty:
            part.clear_mark_into(part, batch)
    store.write(batch, sync=sync, no_stall=no_stall)
    for part, meta in staged:
        part._publish(meta, sync)


def _deliver(waiters: Iterable[_Waiter], value: int | BaseException) -> None:
    for w in waiters:
        # A closed loop means nobody is listening any more.
        with contextlib.suppress(RuntimeError):
            w.loop.call_soon_threadsafe(_resolve, w.future, value)


def lock_now(parts: Sequence[Partition]) -> None:
    """For a write on the event loop: every partition's lock taken without waiting, and
    only when each one's next unsynced write needs no dirty mark (the mark is fsynced, see
    ``recovery.py``); else none is held and ``WouldBlock``. The caller releases them."""
    taken: list[threading.Lock] = []
    try:
        for part in parts:
            if not part.lock.acquire(blocking=False):
                raise WouldBlock("a partition lock is held")
            taken.append(part.lock)
        if not all(p.dirty for p in parts):
            raise WouldBlock("a dirty mark to fsync")
    except WouldBlock:
        for lock in reversed(taken):
            lock.release()
        raise
