"""The indexer's local engine: every slice this node hosts, in one RocksDB store.

The node's index service (wire layer, later) is a thin shell over this class:

* ``create_slice`` / ``drop_index`` when the DDL coordinator allocates or drops slices;
* ``enqueue(rows)`` with the router's batch for this node (each row names its slice);
* ``stabilise(index_id, ts)`` from the timekeeper: every local slice of the index applies
  up to ``ts`` in **one** atomic batch (one WAL fsync for the node, not one per slice), then
  each snapshots; the acks go back to the timekeeper;
* ``scan`` for the scan service; ``applied_ts`` for the pipeline to resume from after a crash;
* ``stabilise_many(index_ids, ts)``: the same for several indexes in one batch (the
  timekeeper's round for a keyspace); slices that are loading or need a rebuild are reported,
  not stabilised;
* ``bulk_load`` for initial builds, or load sessions fed chunk by chunk over the wire
  (``load_chunk`` ... ``load_finish``, memory only: a restart loses them and the slice, left
  ``loading``, becomes ``needs_rebuild``); ``rollback_to`` / ``reset`` for rollbacks;
  ``purge_tombstones`` once a TS is stable everywhere.
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
from collections import defaultdict
from collections.abc import Collection, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from shardex.core.spans import Span
from shardex.core.timestamp import SeqnoEntry, Timestamp
from shardex.errors import ErrorCode, ShardexError
from shardex.index.keyversion import UPSERT, KeyVersion
from shardex.index.load_session import LoadSession
from shardex.index.records import (
    META_KEY,
    STATE_ACTIVE,
    STATE_CREATED,
    STATE_LOADING,
    SliceMeta,
    cf_names,
    decode_meta,
    encode_meta,
    parse_cf_name,
)
from shardex.index.slice import DEFAULT_KEEP_SNAPSHOTS, Slice, StabiliseAck
from shardex.meta.index_definition import IndexDefinition, validate_definition
from shardex.storage import Store
from shardex.storage.interface import OpenStore

log = logging.getLogger(__name__)

__all__ = [
    "STABILISABLE",
    "EnqueueResult",
    "IndexerEngine",
    "LoadColumns",
    "LoadSession",
    "SliceReport",
    "StabiliseManyResult",
]

_NOTHING = SeqnoEntry(0, 0)
# A columnar load chunk: (entries, docids, data partitions, seqnos), one value per row.
LoadColumns = tuple[Sequence[bytes], Sequence[str], Sequence[int], Sequence[int]]
STABILISABLE = frozenset({STATE_CREATED, STATE_ACTIVE})  # states a stabilise applies to


@dataclass(slots=True)
class EnqueueResult:
    """``unknown`` rows name a slice this node does not host (an index dropped meanwhile,
    or a stale topology); ``dropped`` were re-deliveries."""

    accepted: int = 0
    dropped: int = 0
    unknown: int = 0


@dataclass(frozen=True, slots=True)
class SliceReport:
    """A slice after ``stabilise_many``: ``ack`` is None when it was not stabilised (its
    ``state`` is loading or needs_rebuild)."""

    index_id: str
    partition: int
    state: str
    applied: Timestamp
    items_count: int
    ack: StabiliseAck | None


@dataclass(slots=True)
class StabiliseManyResult:
    slices: list[SliceReport] = field(default_factory=list)
    missing: list[str] = field(default_factory=list)  # index ids with no local slice


class IndexerEngine:
    """All slices of one indexer node. Thread-safe."""

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        keep_snapshots: int = DEFAULT_KEEP_SNAPSHOTS,
        sync: bool = True,
        open_store: OpenStore = Store,
    ) -> None:
        # ``open_store``: RocksDB, or the simulator's memory store on a node's simulated disk.
        self.store = open_store(Path(path))
        self.keep_snapshots = keep_snapshots
        self.sync = sync
        self._lock = threading.Lock()
        self._slices: dict[tuple[str, int], Slice] = {}
        self._load_lock = threading.Lock()
        self._loads: dict[tuple[str, int], LoadSession] = {}
        self._loaded: dict[tuple[str, int], Timestamp] = {}  # T0 of the last finished load
        for name in self.store.column_families():
            parsed = parse_cf_name(name)
            if parsed is None or parsed[2] != "m":
                continue
            raw = self.store.column_family(name).get(META_KEY)
            if raw is None:
                continue  # created but never initialised: recreated on create_slice
            meta = decode_meta(raw)
            sl = Slice(self.store, meta, keep_snapshots=keep_snapshots)
            sl.recover()
            self._slices[(meta.definition.id, meta.partition)] = sl

    # -- slices -----------------------------------------------------------------------------
    def create_slice(self, definition: IndexDefinition, partition: int) -> Slice:
        """Allocate a slice (idempotent for the same definition)."""
        definition = validate_definition(definition)
        if not 0 <= partition < definition.num_partition:
            raise ShardexError(
                f"index {definition.id} has no partition {partition}",
                code=ErrorCode.BAD_REQUEST,
                details={"partition": partition, "num_partition": definition.num_partition},
            )
        key = (definition.id, partition)
        with self._lock:
            sl = self._slices.get(key)
            if sl is not None:
                if sl.definition != definition:
                    raise ShardexError(
                        f"slice {definition.id}/{partition} exists with another definition",
                        code=ErrorCode.INDEX_EXISTS,
                        details={"index": definition.id},
                    )
                return sl
            meta = SliceMeta(definition=definition, partition=partition)
            _, _, m = cf_names(definition.id, partition)
            batch = self.store.batch()
            batch.put(self.store.column_family(m), META_KEY, encode_meta(meta))
            self.store.write(batch, sync=True)
            sl = Slice(self.store, meta, keep_snapshots=self.keep_snapshots)
            self._slices[key] = sl
            return sl

    def drop_index(self, index_id: str) -> int:
        """Drop every local slice of an index (its column families) and its load sessions;
        returns how many."""
        with self._lock, self._load_lock:
            keys = [k for k in self._slices if k[0] == index_id]
            for k in keys:
                self._loads.pop(k, None)
                self._loaded.pop(k, None)
                sl = self._slices.pop(k)
                sl.close()
                for name in cf_names(*k):
                    self.store.drop_column_family(name)
            return len(keys)

    def drop_slice(self, index_id: str, partition: int) -> bool:
        """Drop one local slice (an index partition that moved away, or a copy whose move
        was aborted) and its load session; False if it was not here."""
        key = (index_id, partition)
        with self._lock, self._load_lock:
            sl = self._slices.pop(key, None)
            if sl is None:
                return False
            self._loads.pop(key, None)
            self._loaded.pop(key, None)
            with sl.lock:
                sl.close()
            for name in cf_names(*key):
                self.store.drop_column_family(name)
            return True

    def slice(self, index_id: str, partition: int) -> Slice:
        sl = self._slices.get((index_id, partition))
        if sl is None:
            raise ShardexError(
                f"slice {index_id}/{partition} is not on this node",
                code=ErrorCode.INDEX_NOT_FOUND,
                details={"index": index_id, "partition": partition},
            )
        return sl

    def slices(self, index_id: str | None = None) -> list[Slice]:
        """Local slices (of one index), in (index id, partition) order."""
        return [s for k, s in sorted(self._slices.items()) if index_id is None or k[0] == index_id]

    # -- maintenance stream -----------------------------------------------------------------
    def enqueue(
        self, rows: Iterable[KeyVersion], *, keyspace: str | None = None, ahead: bool = True
    ) -> EnqueueResult:
        """Queue the router's rows for this node into their slices (duplicates dropped).
        With ``keyspace``, rows naming an index of another keyspace count as unknown.
        ``ahead``: the rows arrive before their stabilise (``Slice.enqueue``)."""
        groups: dict[tuple[str, int], list[KeyVersion]] = defaultdict(list)
        for row in rows:
            groups[(row[0], row[1])].append(row)
        res = EnqueueResult()
        for key, group in groups.items():
            sl = self._slices.get(key)
            if sl is None or (keyspace is not None and sl.definition.keyspace != keyspace):
                res.unknown += len(group)
                continue
            n = sl.enqueue(group, ahead=ahead)
            res.accepted += n
            res.dropped += len(group) - n
        return res

    def decide_pending(self) -> int:
        """Every slice decides the rows queued ahead since its last call (``slice_decisions.py``);
        returns how many."""
        return sum(s.decide_pending() for s in list(self._slices.values()))

    def stabilise(
        self, index_id: str, ts: Timestamp, *, partitions: Iterable[int] | None = None
    ) -> list[StabiliseAck]:
        """Apply every local slice of ``index_id`` (or the given partitions) up to ``ts`` in
        one atomic batch, then snapshot each at ``ts``. Slices that already reached ``ts``
        acknowledge without work."""
        slices = self.slices(index_id)
        if partitions is not None:
            wanted = set(partitions)
            slices = [s for s in slices if s.partition in wanted]
        if not slices:
            raise ShardexError(
                f"index {index_id} has no slice on this node",
                code=ErrorCode.INDEX_NOT_FOUND,
                details={"index": index_id},
            )
        with _locked(slices):
            return self._stabilise_locked(slices, ts)

    def stabilise_many(
        self,
        index_ids: Iterable[str],
        ts: Timestamp,
        partitions: Mapping[str, Collection[int]] | None = None,
    ) -> StabiliseManyResult:
        """Apply every local slice of every index in ``index_ids`` that is ``created`` or
        ``active`` up to ``ts`` in ONE atomic batch (one synced write for all of them), then
        snapshot each. Slices ``loading`` or ``needs_rebuild`` are reported, not touched; ids
        without a local slice (never here, or dropped meanwhile) are ``missing``. A slice
        refusing ``ts`` (it goes backwards) fails the whole call and nothing is written.
        ``partitions`` (index id -> partitions): only those slices of an index it lists are
        stabilised or reported; the others are left as they are (a slice the round's rows
        were not routed to must not take a snapshot labelled ``ts``)."""
        wanted = sorted(set(index_ids))
        slices = [s for i in wanted for s in self.slices(i)]
        if partitions is not None:
            slices = [s for s in slices if s.partition in partitions.get(s.index_id, ())]
        with _locked(slices):
            # Dropped between listing and locking: as if never here.
            live = [s for s in slices if self._slices.get((s.index_id, s.partition)) is s]
            todo = [s for s in live if s.state in STABILISABLE]
            acks = dict(zip(todo, self._stabilise_locked(todo, ts), strict=True))
            held = {s.index_id for s in live}
            return StabiliseManyResult(
                slices=[
                    SliceReport(
                        s.index_id, s.partition, s.state, s.applied_ts(), s.items_count, acks.get(s)
                    )
                    for s in live
                ],
                missing=[i for i in wanted if i not in held],
            )

    def _stabilise_locked(self, slices: list[Slice], ts: Timestamp) -> list[StabiliseAck]:
        """One batch for ``slices`` (locked by the caller), one write, then each commits."""
        batch = self.store.batch()
        pending = [s.prepare(ts, batch) for s in slices]
        if any(p.meta is not None for p in pending):
            self.store.write(batch, sync=self.sync)
        for s, p in zip(slices, pending, strict=True):
            s.commit(p)
        return [p.ack for p in pending]

    def applied_ts(self, index_id: str) -> dict[int, Timestamp]:
        """Applied TS per local slice of the index: the pipeline resumes from the minimum."""
        return {s.partition: s.applied_ts() for s in self.slices(index_id)}

    def min_applied_ts(self, index_id: str) -> Timestamp:
        """Per data partition, the lowest applied seqno over the local slices."""
        tss = list(self.applied_ts(index_id).values())
        out: dict[int, SeqnoEntry] = {}
        for p in {p for t in tss for p in t}:
            low = min((t.get(p, _NOTHING) for t in tss), key=lambda e: e.seqno)
            if low.seqno > 0:
                out[p] = low
        return Timestamp(out)

    def purge_tombstones(self, index_id: str, stable_ts: Timestamp) -> int:
        return sum(s.purge_tombstones(stable_ts) for s in self.slices(index_id))

    # -- builds and rollbacks ------------------------------------------------------------------
    def bulk_load(
        self,
        index_id: str,
        partition: int,
        rows: Iterable[KeyVersion],
        ts0: Timestamp,
        *,
        use_sst: bool | None = None,
    ) -> str:
        return self.slice(index_id, partition).bulk_load(rows, ts0, use_sst=use_sst)

    def load_session(self, index_id: str, partition: int) -> LoadSession | None:
        return self._loads.get((index_id, partition))

    def load_chunk(
        self,
        index_id: str,
        partition: int,
        ts0: Timestamp,
        rows: Iterable[KeyVersion],
        docs: int = 0,
        *,
        columns: LoadColumns | None = None,
    ) -> int:
        """Add an initial build's rows (UPSERTs of the snapshot at ``ts0``) to the slice's
        load session; returns the rows held (one per docid, so a repeated chunk adds
        nothing). ``columns``: more UPSERTs of this slice as parallel lists (entries,
        docids, partitions, seqnos), the wire's columnar form. The first chunk at ``ts0``
        opens the session (``_open``). A slice whose load at ``ts0`` already finished
        acknowledges without holding anything (a retried chunk) and returns its items
        count."""
        sl = self.slice(index_id, partition)
        if columns is not None:
            _check_columns(index_id, partition, columns)
        with self._load_lock, sl.lock:
            session = self._open(sl, ts0)
            if session is None:
                return sl.items_count
            ups: list[KeyVersion] = []
            for row in rows:
                if row[0] != index_id or row[1] != partition:
                    raise ShardexError(
                        f"a load chunk for slice {index_id}/{partition} holds a row of "
                        f"slice {row[0]}/{row[1]}",
                        code=ErrorCode.BAD_REQUEST,
                        details={"index": index_id, "partition": partition, "row": repr(row)},
                    )
                if row[2] == UPSERT:  # a snapshot has nothing to remove (sorted_load_rows)
                    ups.append(row)
            session.add_rows(ups)
            if columns is not None:
                session.add_columns(*columns)
            session.docs += docs
            session.chunks += 1
            return len(session.held)

    def load_begin(self, index_id: str, partition: int, ts0: Timestamp) -> str:
        """The build's driver starts an attempt at ``ts0``: the slice's load session at
        ``ts0`` is opened now, whatever the slice holds. Unlike a chunk's (which a worker of
        an abandoned attempt may still send), the driver's begin also restarts an ``active``
        slice, unless its applied TS covers ``ts0`` (a begin of an older attempt, or the
        attempt at ``ts0`` finished here): that slice finished an earlier attempt whose other
        slices did not, or it holds a history that is gone (its node was down when a rollback
        was handled). Returns the state the slice was in."""
        sl = self.slice(index_id, partition)
        with self._load_lock, sl.lock:
            before, applied = sl.state, sl.applied_ts()
            self._open(sl, ts0, begin=True)
            if before == STATE_ACTIVE and sl.state != STATE_ACTIVE:
                log.info("slice %s/%d active at %r restarts for a build at %r", index_id,
                         partition, applied, ts0)  # fmt: skip
            return before

    def load_finish(self, index_id: str, partition: int, ts0: Timestamp) -> int:
        """Write the session's rows (``bulk_load``: sorted, SST when large), record ``ts0``
        as applied; the slice becomes active and the session is dropped. Returns the
        slice's items count. Without a session the slice loads empty (it was sent no row).
        A finish of a load that already finished does nothing (a retry)."""
        sl = self.slice(index_id, partition)
        key = (index_id, partition)
        with self._load_lock, sl.lock:
            session = self._open(sl, ts0)
            if session is None:
                return sl.items_count
            sl.write_load(session.sorted_load(), ts0)
            self._loads.pop(key, None)
            self._loaded[key] = ts0
            return sl.items_count

    def _open(self, sl: Slice, ts0: Timestamp, *, begin: bool = False) -> LoadSession | None:
        """The load session at ``ts0`` of a slice (locked by the caller); None when the
        load at ``ts0`` already finished (the slice is active, its last load or its applied
        TS at ``ts0``). Opening one puts the slice in ``loading`` (durably). A load at
        another T0 than the held session's restarts (the slice is emptied, the old rows
        dropped), unless the held T0 covers the new one (a stale request of an abandoned
        build: refused). A ``needs_rebuild`` slice restarts too. An ``active`` slice
        refuses, but for the driver's ``begin`` at a T0 its applied TS does not cover; a
        session whose slice was rolled back meanwhile refuses."""
        key = (sl.index_id, sl.partition)
        session = self._loads.get(key)
        if session is not None and session.ts0 == ts0:
            if sl.state != STATE_LOADING:  # rollback_to during the load: its rows are void
                raise ShardexError(
                    f"slice {sl.index_id}/{sl.partition} was rolled back during its load at "
                    f"{ts0!r}",
                    code=ErrorCode.INDEX_IN_ROLLBACK,
                    details={
                        "index": sl.index_id,
                        "partition": sl.partition,
                        "state": sl.state,
                        "hint": "restart the build at a T0 of the new history",
                    },
                )
            return session
        if session is None and self._finished_at(sl, ts0):
            return None
        self._check_restart(sl, session, ts0, begin=begin)
        sl.begin_load(ts0, restart=True)
        self._loaded.pop(key, None)
        session = self._loads[key] = LoadSession(ts0)
        return session

    def _finished_at(self, sl: Slice, ts0: Timestamp) -> bool:
        if sl.state != STATE_ACTIVE:
            return False
        return self._loaded.get((sl.index_id, sl.partition)) == ts0 or sl.applied_ts() == ts0

    @staticmethod
    def _check_restart(
        sl: Slice, session: LoadSession | None, ts0: Timestamp, *, begin: bool
    ) -> None:
        name = f"{sl.index_id}/{sl.partition}"
        if session is not None and session.ts0.covers(ts0):
            raise ShardexError(
                f"load of slice {name} at {ts0!r} is older than the load in progress "
                f"at {session.ts0!r}",
                code=ErrorCode.BAD_REQUEST,
                details={
                    "index": sl.index_id,
                    "partition": sl.partition,
                    "ts0": ts0.to_json(),
                    "session_ts0": session.ts0.to_json(),
                    "hint": "a stale request of an abandoned build: drop it",
                },
            )
        if sl.state == STATE_ACTIVE and not (begin and not sl.applied_ts().covers(ts0)):
            raise ShardexError(
                f"slice {name} is active at {sl.applied_ts()!r}: it cannot load at {ts0!r}",
                code=ErrorCode.BAD_REQUEST,
                details={
                    "index": sl.index_id,
                    "partition": sl.partition,
                    "state": sl.state,
                    "applied": sl.applied_ts().to_json(),
                    "ts0": ts0.to_json(),
                    "hint": "a load chunk needs a created slice (or one loading or needing "
                    "a rebuild); only the build's LoadBegin restarts an active slice, and not "
                    "for a T0 its applied TS covers (a straggler of an older build)",
                },
            )

    def rollback_to(self, keyspace: str, partition: int, seqno: int) -> list[Slice]:
        """Data partition ``partition`` of ``keyspace`` rolled back to ``seqno``: returns the
        local slices that now need a rebuild (they answer INDEX_IN_ROLLBACK until reset and
        rebuilt)."""
        return [
            s
            for s in self.slices()
            if s.definition.keyspace == keyspace and s.rollback_to(partition, seqno)
        ]

    def reset(self, index_id: str, partition: int) -> None:
        self.slice(index_id, partition).reset()

    # -- scans ----------------------------------------------------------------------------------
    def scan(
        self,
        index_id: str,
        partition: int,
        spans: Iterable[Span] | None = None,
        *,
        snapshot_ts: Timestamp | None = None,
        limit: int | None = None,
        reverse: bool = False,
        raw: bool = False,
    ) -> Iterator[Any]:
        return self.slice(index_id, partition).scan(
            spans, snapshot_ts=snapshot_ts, limit=limit, reverse=reverse, raw=raw
        )

    def latest_snapshot_ts(self, index_id: str) -> Timestamp | None:
        """The newest TS at which every local slice of the index has a snapshot."""
        common: set[Timestamp] | None = None
        order: list[Timestamp] = []
        for s in self.slices(index_id):
            tss = s.snapshot_timestamps()
            order = tss
            common = set(tss) if common is None else common & set(tss)
        for t in reversed(order):
            if common and t in common:
                return t
        return None

    def entries(
        self, index_id: str, snapshot_ts: Timestamp | None = None
    ) -> dict[int, list[bytes]]:
        """Raw entries per local slice (what the oracle's ``check_index`` takes)."""
        return {s.partition: s.entries(snapshot_ts) for s in self.slices(index_id)}

    def close(self) -> None:
        with self._lock:
            for s in self._slices.values():
                s.close()
            self._slices.clear()
            self._loads.clear()
        self.store.close()

    def __enter__(self) -> IndexerEngine:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _check_columns(index_id: str, partition: int, columns: LoadColumns) -> None:
    entries, docids, parts, seqnos = columns
    n = len(docids)
    if not len(entries) == len(parts) == len(seqnos) == n:
        raise ShardexError(
            f"a load chunk for slice {index_id}/{partition} has columns of different lengths "
            f"(entries {len(entries)}, docids {n}, partitions {len(parts)}, seqnos "
            f"{len(seqnos)})",
            code=ErrorCode.BAD_REQUEST,
            details={"index": index_id, "partition": partition, "hint": "one value per row"},
        )


@contextlib.contextmanager
def _locked(slices: list[Slice]) -> Iterator[None]:
    """Hold the locks of ``slices``, taken in (index, partition) order: no lock-order
    inversion between concurrent stabilises."""
    ordered = sorted(slices, key=lambda s: (s.index_id, s.partition))
    taken: list[Slice] = []
    try:
        for s in ordered:
            s.lock.acquire()
            taken.append(s)
        yield
    finally:
        for s in reversed(taken):
            s.lock.release()
