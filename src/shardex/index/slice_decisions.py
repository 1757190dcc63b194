"""A slice's stabilise decisions, taken when key versions arrive instead of at the stabilise.

Why: a maintenance batch's rows mostly reach an indexer ahead of their round (the pipeline's
deliver-ahead), yet the round paid for them all: per docid a back-index read, the decision
against it, then the write batch. The round is on the stream's critical path (the next batch
waits for it), the early delivery is not. So each slice keeps, per docid with queued
versions, the decision for its newest queued version against the back row read from
storage (``Decided``), kept up to date as versions are queued (by the indexer right after it
acknowledged an early delivery, ``Slice.decide_pending``, else by the stabilise), and the
write batch's sorted operations for them (``Prepared``, built and sorted there too); a
stabilise that takes the whole queue only hands those lists to its write batch. A newer
version of a docid decided before replaces its decision, whose operations cannot be taken
back out of the lists: the prepared lists are dropped and that stabilise gathers the
decisions instead (``Decided.write``).

The rules (``decide``) are the stabilise's, in one place for both paths: a back row with an
equal or higher seqno wins (older never overwrites newer); an unchanged key writes nothing;
a removal of a docid the slice does not hold writes nothing; otherwise the old entry is
deleted, the new one put and the back row updated (a removal leaves a tombstone and a
tombstone-log key).

Exact because the decision for a docid depends on two things only, both kept current:

* the back row in storage, which changes only by a commit of this slice (a stabilise, a
  load, a reset, a purge): the slice forgets its decisions (``Slice._reset_decided``) at
  each of them, and a stabilise that applies them takes the whole queue, so nothing decided
  outlives the state it was decided against;
* the docid's newest queued version: deciding replaces the decision for a newer version (a
  docid's versions share one data partition, so seqnos order them) and keeps it for an
  older one; every queued version is decided or pending, and a stabilise decides the
  pending ones first; versions leave the queue only by a commit or a drop, after which the
  slice decides the remaining queue again from storage.

A stabilise whose TS leaves some queued version behind (a cut inside the queue) cannot use
decisions made for the newest versions: it decides from storage as before. Rows that come
with their stabilise into an empty queue are left to it (``Slice.enqueue``, ``ahead``).
``docs/decisions/0055-decided-on-arrival.md``.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from operator import itemgetter
from typing import NamedTuple

from shardex.index.keyversion import UPSERT, KeyVersion, unpack_entries
from shardex.index.records import pack_back_head, tombstone_log_key
from shardex.storage import Batch, ColumnFamily

__all__ = [
    "NOTHING",
    "STALE",
    "UNCHANGED",
    "WRITE",
    "Decided",
    "Outcome",
    "Prepared",
    "decide",
    "write",
]

# What a stabilise does for one docid (``Outcome.kind``).
WRITE = 0  # entry/back-row/tombstone-log operations below
UNCHANGED = 1  # an Upsert of the entry the slice already holds
STALE = 2  # the back row is as new or newer: older never overwrites newer
NOTHING = 3  # a removal of a docid the slice does not hold (or already a tombstone)


class Outcome(NamedTuple):
    """One docid's decision: the operations it adds to the stabilise's batch. ``decide``
    builds them as tuple displays in this field order rather than through the constructor
    (one per decided docid once the prepared lists were dropped, ``Decided.outcomes``; the
    constructor costs about five times as much), and ``Prepared.extend`` unpacks them by
    position: the fields name the positions."""

    kind: int  # WRITE, UNCHANGED, STALE or NOTHING; the fields below matter for WRITE only
    back_key: bytes  # the docid's UTF-8 bytes: its back-index key
    back_value: bytes | None  # the new back row (partition, seqno, entry or b"" if removed)
    entry_delete: bytes | None  # the entry the slice holds for the docid, to delete
    entry_put: bytes | None  # the docid's new entry (None: a removal)
    tombstone_log: bytes | None  # the tombstone-log key of a removal (``purge_tombstones``)
    live_delta: int  # change in the slice's count of live entries: +1, 0 or -1


_DOCID = itemgetter(4)

_UNCHANGED: Outcome = (UNCHANGED, b"", None, None, None, None, 0)
_STALE: Outcome = (STALE, b"", None, None, None, None, 0)
_NOTHING: Outcome = (NOTHING, b"", None, None, None, None, 0)


def decide(row: KeyVersion, key: bytes, raw: bytes | None) -> Outcome:
    """The stabilise's rule for ``row`` (a docid's newest version up to the TS) against its
    back row ``raw`` (None: never held) in storage; ``key`` is the docid's UTF-8 bytes."""
    _, _, kind, entry, docid, part, s = row
    old = b""
    if raw is not None:
        # decode_back inlined (hot): partition (2 bytes), seqno (8), entry
        if int.from_bytes(raw[2:10], "big") >= s:
            return _STALE
        old = raw[10:]
    if kind == UPSERT:
        if old == entry:
            return _UNCHANGED
        if old:
            return (WRITE, key, pack_back_head(part, s) + entry, old, entry, None, 0)
        return (WRITE, key, pack_back_head(part, s) + entry, None, entry, None, 1)
    if old:  # UpsertDeletion or Delete of an entry this slice holds
        tlog = tombstone_log_key(part, s, docid)
        return (WRITE, key, pack_back_head(part, s), old, None, tlog, -1)
    return _NOTHING


class Prepared:
    """The write batch's operations for a set of decisions, per family, kept sorted
    (RocksDB's memtable takes a sorted batch about ten times faster than a random one; keys
    never repeat: one decision per docid, and an entry embeds its docid). Built as decisions
    are taken (``Decided.add`` on the indexer's I/O thread after an early delivery's reply,
    ``seal`` sorting there too), so a stabilise of the whole queue only hands the lists to
    the batch: the gathering loop and the sorts leave the round's critical path."""

    __slots__ = (
        "back_keys",
        "back_sorted",
        "back_values",
        "entry_deletes",
        "entry_puts",
        "live_delta",
        "sealed",
        "stale",
        "tombstone_puts",
        "unchanged",
    )

    def __init__(self) -> None:
        self.entry_deletes: list[bytes] = []
        self.entry_puts: list[bytes] = []
        self.tombstone_puts: list[bytes] = []
        # Back rows as two parallel lists (what ``put_many`` takes); ``back_sorted``: the keys
        # are in ascending order already (rows decided in docid order), so ``seal`` need not
        # sort them.
        self.back_keys: list[bytes] = []
        self.back_values: list[bytes] = []
        self.back_sorted = True
        self.live_delta = self.unchanged = self.stale = 0
        self.sealed = True

    def extend(self, outcomes: Iterable[Outcome]) -> None:
        """Add the operations of ``outcomes`` (each for a docid not added before, in any
        order)."""
        entry_deletes, entry_puts, tombstone_puts = (
            self.entry_deletes,
            self.entry_puts,
            self.tombstone_puts,
        )
        back_keys, back_values = self.back_keys, self.back_values
        delta = unchanged = stale = 0
        for kind, back_key, back_value, entry_delete, entry_put, tombstone_log, d in outcomes:
            if kind == WRITE:
                if entry_delete is not None:
                    entry_deletes.append(entry_delete)
                if entry_put is not None:
                    entry_puts.append(entry_put)
                if tombstone_log is not None:
                    tombstone_puts.append(tombstone_log)
                back_keys.append(back_key)
                back_values.append(back_value)  # type: ignore[arg-type]
                delta += d
            elif kind == UNCHANGED:
                unchanged += 1
            elif kind == STALE:
                stale += 1
        self.live_delta += delta
        self.unchanged += unchanged
        self.stale += stale
        self.sealed = False
        self.back_sorted = False

    def decide_sorted(
        self, rows: Sequence[KeyVersion], keys: Sequence[bytes], raws: Sequence[bytes | None]
    ) -> None:
        """``extend(map(decide, rows, keys, raws))`` in one loop, for rows of distinct
        docids in ascending docid order (``keys`` their UTF-8 bytes, ``raws`` their back
        rows): no ``Outcome`` tuple per docid, and the back rows come out sorted, so
        ``seal`` only sorts the entries and the tombstone log. The rule is ``decide``'s,
        inlined because this loop is the stabilise's per-docid cost;
        ``test_index_decide_sorted.py`` checks both give the same lists on random rows."""
        back_keys = self.back_keys
        if keys and back_keys and keys[0] <= back_keys[-1]:
            self.back_sorted = False  # a second run of docids: ``seal`` merges
        # Bound once: four appends per docid are most of this loop's calls.
        delete_entry, put_entry = self.entry_deletes.append, self.entry_puts.append
        put_tombstone = self.tombstone_puts.append
        put_back_key, put_back_value = back_keys.append, self.back_values.append
        head, from_bytes = pack_back_head, int.from_bytes
        delta = unchanged = stale = 0
        for row, key, raw in zip(rows, keys, raws, strict=True):
            _, _, kind, entry, docid, part, s = row
            old = b""
            if raw is not None:
                if from_bytes(raw[2:10], "big") >= s:
                    stale += 1
                    continue
                old = raw[10:]
            if kind == UPSERT:
                if old == entry:
                    unchanged += 1
                    continue
                if old:
                    delete_entry(old)
                else:
                    delta += 1
                put_entry(entry)
                put_back_key(key)
                put_back_value(head(part, s) + entry)
            elif old:  # UpsertDeletion or Delete of an entry this slice holds
                delete_entry(old)
                put_tombstone(tombstone_log_key(part, s, docid))
                put_back_key(key)
                put_back_value(head(part, s))
                delta -= 1
        self.live_delta += delta
        self.unchanged += unchanged
        self.stale += stale
        self.sealed = False

    def seal(self) -> None:
        """Sort each family's operations (sorted runs merge in linear time: sealing after
        every early delivery costs little more than once)."""
        if self.sealed:
            return
        self.entry_deletes.sort()
        self.entry_puts.sort()
        self.tombstone_puts.sort()
        if not self.back_sorted:
            # keys never repeat (one decision per docid): the values are never compared
            backs = sorted(zip(self.back_keys, self.back_values, strict=True))
            self.back_keys = [k for k, _ in backs]
            self.back_values = [v for _, v in backs]
            self.back_sorted = True
        self.sealed = True

    def write(
        self,
        batch: Batch,
        entries: ColumnFamily,
        back: ColumnFamily,
        meta: ColumnFamily,
        *,
        packed: bool = False,
    ) -> tuple[int, int, int, int]:
        """Add the operations to ``batch``; returns (writes, change in live entries,
        unchanged, stale). ``packed``: an array index's slice, whose entry values hold each
        document's entries packed (``keyversion.pack_entries``): unpacked here, the one
        place they reach the entries family. An element kept by an update is deleted and
        put back in the same batch (deletes go first), so it stays."""
        self.seal()
        deletes, puts = self.entry_deletes, self.entry_puts
        delta = self.live_delta
        if packed:
            # Counted in entries, not documents: every delete removes a held entry and every
            # put adds one (an element kept is both).
            deletes = sorted([e for p in deletes for e in unpack_entries(p)])
            puts = sorted([e for p in puts for e in unpack_entries(p)])
            delta = len(puts) - len(deletes)
        batch.delete_many(entries, deletes)
        batch.put_many(entries, puts)
        batch.put_many(back, self.back_keys, self.back_values)
        batch.put_many(meta, self.tombstone_puts)
        writes = len(deletes) + len(puts) + len(self.back_keys) + len(self.tombstone_puts)
        return writes, delta, self.unchanged, self.stale


def write(
    outcomes: Iterable[Outcome],
    batch: Batch,
    entries: ColumnFamily,
    back: ColumnFamily,
    meta: ColumnFamily,
    *,
    packed: bool = False,
) -> tuple[int, int, int, int]:
    """Add the decisions (one per docid) to ``batch``, each family's keys sorted
    (``Prepared``). Returns (writes, change in live entries, unchanged, stale)."""
    prepared = Prepared()
    prepared.extend(outcomes)
    return prepared.write(batch, entries, back, meta, packed=packed)


class Decided:
    """The slice's decisions for every docid with queued versions (module docstring): the
    newest queued version per docid (``rows``) and the write batch's operations for exactly
    those decisions (``prepared``), built as they are taken (``Prepared.decide_sorted``: no
    ``Outcome`` per docid, no back row kept). ``prepared`` is None once a docid's decision
    was replaced (a newer version of a docid decided before: its old operations cannot be
    taken out of the lists). From then on ``outcomes`` holds each docid's ``Outcome`` and
    ``raws`` each docid's back row (both filled at the replacement, the back rows read from
    storage again: storage is what they were decided against, since any commit resets the
    decisions), and ``write`` gathers the outcomes as before."""

    __slots__ = ("outcomes", "prepared", "raws", "rows")

    def __init__(self) -> None:
        self.rows: dict[str, KeyVersion] = {}
        self.raws: dict[str, bytes | None] = {}  # filled once ``prepared`` is None
        self.outcomes: dict[str, Outcome] = {}  # filled once ``prepared`` is None
        self.prepared: Prepared | None = Prepared()

    def __len__(self) -> int:
        return len(self.rows)

    def add(self, rows: Sequence[KeyVersion], back: ColumnFamily, *, ordered: bool) -> None:
        """Fold newly queued versions in. ``ordered``: within each data partition ``rows``
        come in ascending seqno order, so a docid's last row is its newest. A docid decided
        before is decided again only for a newer version; new docids' back rows are read in
        one ``get_many``, in docid order (str order of docids is UTF-8 byte order). Per
        version this is a handful of C-level passes (the first call after a commit adopts its
        dict of newest versions as ``rows``): the indexer's I/O thread spends most of its
        time here."""
        newest: dict[str, KeyVersion]
        if ordered:
            newest = dict(zip(map(_DOCID, rows), rows, strict=True))
        else:
            newest = {}
            for row in rows:
                cur = newest.get(row[4])
                if cur is None or row[6] > cur[6]:
                    newest[row[4]] = row
        known = self.rows
        if known:
            for docid in known.keys() & newest.keys():
                row = newest.pop(docid)
                if row[6] > known[docid][6]:
                    if self.prepared is not None:
                        self._unprepare(back)  # the replaced decision's operations are in it
                    known[docid] = row
                    self.outcomes[docid] = decide(row, docid.encode("utf-8"), self.raws[docid])
            if not newest:
                return
            known.update(newest)
        else:
            self.rows = newest
        docids = sorted(newest)
        keys = list(map(str.encode, docids))
        fresh = list(map(newest.__getitem__, docids))
        raws = back.get_many(keys)
        if self.prepared is not None:
            self.prepared.decide_sorted(fresh, keys, raws)
        else:
            self.raws.update(zip(docids, raws, strict=True))
            self.outcomes.update(zip(docids, map(decide, fresh, keys, raws), strict=True))

    def _unprepare(self, back: ColumnFamily) -> None:
        """Drop the prepared lists and keep an ``Outcome`` and the back row per docid
        instead: the back rows read again (unchanged since they were decided against: any
        commit resets the decisions) and every docid decided again from its kept row (the
        same decisions, ``decide`` being the rule ``decide_sorted`` inlines)."""
        docids = sorted(self.rows)
        keys = list(map(str.encode, docids))
        raws = back.get_many(keys)
        rows = self.rows
        self.raws = dict(zip(docids, raws, strict=True))
        self.outcomes = {
            d: decide(rows[d], k, raw) for d, k, raw in zip(docids, keys, raws, strict=True)
        }
        self.prepared = None

    def seal(self) -> None:
        """Sort the prepared operations now (off the stabilise's path)."""
        if self.prepared is not None:
            self.prepared.seal()

    def write(
        self,
        batch: Batch,
        entries: ColumnFamily,
        back: ColumnFamily,
        meta: ColumnFamily,
        *,
        packed: bool = False,
    ) -> tuple[int, int, int, int]:
        """Add every decision to ``batch`` (the stabilise of the whole queue): the prepared
        operations, else gathered from the decisions. Returns (writes, change in live
        entries, unchanged, stale)."""
        if self.prepared is not None:
            return self.prepared.write(batch, entries, back, meta, packed=packed)
        return write(self.outcomes.values(), batch, entries, back, meta, packed=packed)
