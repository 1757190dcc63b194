"""The indexer's local engine: every slice this node hosts, in one RocksDB store.

The node's index service (wire layer, later) is a thin shell over this class:

* ``create_slice`` / ``drop_index`` when the DDL coordinator allocates or drops slices;
* ``enqueue(rows)`` with the router's batch for this node (each row names its slice);
* ``stabilize(index_id, ts)`` from the timekeeper: every local slice of the index applies
  up to ``ts`` in **one** atomic batch (one WAL fsync for the node, not one per slice), then
  each snapshots; the acks go back to the timekeeper;
* ``scan`` for the scan service; ``applied_ts`` for the pipeline to resume from after a crash;
* ``bulk_load`` for initial builds; ``rollback_to`` / ``reset`` for rollbacks;
  ``purge_tombstones`` once a TS is stable everywhere.
"""

from __future__ import annotations

import os
import threading
from collections import defaultdict
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any

from shardex.core.timestamp import SeqnoEntry, Timestamp
from shardex.errors import ErrorCode, ShardexError
from shardex.index.definition import IndexDefinition, validate_definition
from shardex.index.keyversion import KeyVersion
from shardex.index.records import (
    META_KEY,
    SliceMeta,
    cf_names,
    decode_meta,
    encode_meta,
    parse_cf_name,
)
from shardex.index.slice import DEFAULT_KEEP_SNAPSHOTS, Slice, StabilizeAck
from shardex.index.spans import Span
from shardex.storage import Store

__all__ = ["EnqueueResult", "IndexerEngine"]

_NOTHING = SeqnoEntry(0, 0)


@dataclass(slots=True)
class EnqueueResult:
    """``unknown`` rows name a slice this node does not host (an index dropped meanwhile,
    or a stale topology); ``dropped`` were re-deliveries."""

    accepted: int = 0
    dropped: int = 0
    unknown: int = 0


class IndexerEngine:
    """All slices of one indexer node. Thread-safe."""

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        keep_snapshots: int = DEFAULT_KEEP_SNAPSHOTS,
        sync: bool = True,
    ) -> None:
        self.store = Store(path)
        self.keep_snapshots = keep_snapshots
        self.sync = sync
        self._lock = threading.Lock()
        self._slices: dict[tuple[str, int], Slice] = {}
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
        """Drop every local slice of an index (its column families); returns how many."""
        with self._lock:
            keys = [k for k in self._slices if k[0] == index_id]
            for k in keys:
                sl = self._slices.pop(k)
                sl.close()
                for name in cf_names(*k):
                    self.store.drop_column_family(name)
            return len(keys)

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
    def enqueue(self, rows: Iterable[KeyVersion]) -> EnqueueResult:
        """Queue the router's rows for this node into their slices (duplicates dropped)."""
        groups: dict[tuple[str, int], list[KeyVersion]] = defaultdict(list)
        for row in rows:
            groups[(row[0], row[1])].append(row)
        res = EnqueueResult()
        for key, group in groups.items():
            sl = self._slices.get(key)
            if sl is None:
                res.unknown += len(group)
                continue
            n = sl.enqueue(group)
            res.accepted += n
            res.dropped += len(group) - n
        return res

    def stabilize(
        self, index_id: str, ts: Timestamp, *, partitions: Iterable[int] | None = None
    ) -> list[StabilizeAck]:
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
        for s in slices:  # (index, partition) order: no lock-order inversion
            s.lock.acquire()
        try:
            batch = self.store.batch()
            pending = [s.prepare(ts, batch) for s in slices]
            if any(p.meta is not None for p in pending):
                self.store.write(batch, sync=self.sync)
            for s, p in zip(slices, pending, strict=True):
                s.commit(p)
            return [p.ack for p in pending]
        finally:
            for s in reversed(slices):
                s.lock.release()

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
        self.store.close()

    def __enter__(self) -> IndexerEngine:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
