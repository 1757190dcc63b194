"""``DataEngine``: everything a data node does with its partitions on its own disk.

One engine per node, over one ``Store`` in the node's data directory. It holds a local catalog
of keyspaces (name -> num_partitions, so it can route a docid to its partition) and the
partitions this node has been told to own; placement is the manager's business. No
networking here: RPC handlers and the client are wired onto these methods later, and every
method is synchronous and thread-safe except the ``async`` waiting ones.

Threading model: a mutation validates its input without any lock, then takes its partition's
lock for check + seqno + one atomic RocksDB batch (+ WAL fsync for "persist"). RPC handlers
should run mutations in a thread pool so an fsync never blocks the event loop; streams and
waits can run on the loop.

Parts: the catalog and the partition map (``partitions.LocalPartitions``) are shared by the
document operations (``documents.DocumentOps``) and the hand-over operations
(``handover.HandoverOps``); the engine builds them over one store, keeps lifecycle, catalog,
streams and retention itself and exposes the parts' operations as its own (the hand-over
ones through ``engine_handover.HandoverFacade``).
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Callable, Iterable, Iterator
from pathlib import Path
from typing import Any

import msgspec

import shardex.data.expiry as expiry_ops
import shardex.data.streams as streams
from shardex.api.errors import BadRequest, KeyspaceExists
from shardex.api.records import (
    STATE_ACTIVE,
    Change,
    FailoverEntry,
    KeyspaceInfo,
    MutationResult,
    PartitionInfo,
    SnapshotMarker,
)
from shardex.api.validation import (
    DEFAULT_MAX_DOC_BYTES,
    Durability,
    check_docid,
    check_seqno,
)
from shardex.core.timestamp import Timestamp
from shardex.data.documents import DocumentOps, GetResult, OnExpired, RawGetResult
from shardex.data.engine_handover import HandoverFacade
from shardex.data.handover import HandoverOps
from shardex.data.partitions import LocalPartitions
from shardex.data.records import (
    META_KEY,
    PartitionMeta,
    consumer_key,
    decode_keyspace,
    decode_meta,
    encode,
    info_of,
    new_uuid,
)
from shardex.data.recovery import DirtyMarks, current_boot_id
from shardex.data.replica import ReplicaOps
from shardex.errors import ShardexError
from shardex.meta.partitioning import (
    DEFAULT_NUM_PARTITIONS,
    check_keyspace_name,
    check_num_partitions,
    parse_partition_cf_name,
    partition_of,
)
from shardex.storage import Store
from shardex.storage.interface import KeyValueStore, OpenStore

DEFAULT_RETENTION_SEQNOS = 100_000
_KS_PREFIX = b"data/ks/"


class DataEngine(HandoverFacade):
    """The local storage engine of the data service (see module docstring)."""

    def __init__(
        self,
        store: KeyValueStore | str | Path,
        *,
        max_doc_bytes: int = DEFAULT_MAX_DOC_BYTES,
        retention_seqnos: int = DEFAULT_RETENTION_SEQNOS,
        boot_id: str | None = None,
        open_store: OpenStore = Store,
        clock_ns: Callable[[], int] | None = None,
        uuids: Callable[[], int] | None = None,
    ) -> None:
        # A path is opened with ``open_store`` (RocksDB, or the simulator's memory store)
        # and closed with the engine; a store passed in stays the caller's.
        # ``boot_id``, ``clock_ns`` (CAS values) and ``uuids`` (new histories) are what the
        # engine reads of its machine: the simulator passes simulated ones. The defaults are
        # looked up here, not at import, so a test may patch them.
        self._owns_store = isinstance(store, str | Path)
        self._clock_ns = time.time_ns if clock_ns is None else clock_ns
        self._uuids = new_uuid if uuids is None else uuids
        self._store = open_store(Path(store)) if isinstance(store, str | Path) else store
        self.retention_seqnos = retention_seqnos
        self._marks = DirtyMarks(self._store, current_boot_id() if boot_id is None else boot_id)
        self._local = LocalPartitions(
            self._store, self._marks, clock_ns=self._clock_ns, uuids=self._uuids
        )
        # The catalog, the partition map and their lock live in ``self._local``, shared with
        # the parts; named here for the engine's own methods.
        self._lock = self._local.lock
        self._keyspaces = self._local.keyspaces
        self._parts = self._local.parts
        self._documents = DocumentOps(self._local, max_doc_bytes=max_doc_bytes)
        self._handover = HandoverOps(self._local)
        self.replicas = ReplicaOps(self._local)  # replica copies (``replica.py``)
        self._load()

    @property
    def max_doc_bytes(self) -> int:
        return self._documents.max_doc_bytes

    # lifecycle ---------------------------------------------------------------------------
    def _load(self) -> None:
        self._handover.clean_ingest_dir()
        upper = _KS_PREFIX[:-1] + bytes([_KS_PREFIX[-1] + 1])
        for _key, raw in self._store.column_family().iterate(_KS_PREFIX, upper):
            ks = decode_keyspace(raw)
            self._keyspaces[ks.name] = ks
        for name in self._store.column_families():
            parsed = parse_partition_cf_name(name)
            if parsed is None:
                continue
            cf = self._store.column_family(name, create=False)
            raw = cf.get(META_KEY)
            if parsed[0] not in self._keyspaces or raw is None:
                # A keyspace drop or partition creation/ingest that crashed half-way: the
                # catalog entry / meta is written last (first on drop), so this is garbage.
                self._store.drop_column_family(name)
                continue
            part = self._local.partition(cf, decode_meta(raw))
            self._marks.attach(part)
            self._parts[parsed] = part
        self._marks.recover({p.cf.name: p for p in self._parts.values()})

    def sync(self, *, keep_busy_marks: bool = False) -> None:
        """Fsync the WAL: every "memory" write so far becomes power-loss safe (and its
        partition's dirty mark is cleared; ``keep_busy_marks``: not for partitions written
        unsynced since the last sync, the periodic form, ``recovery.py``). Cheap to call
        periodically."""
        self._marks.clear(list(self._parts.values()), keep_busy=keep_busy_marks)

    @property
    def has_unsynced(self) -> bool:
        """Some partition has "memory" writes not yet covered by a WAL fsync."""
        return any(p.dirty for p in list(self._parts.values()))

    def close(self) -> None:
        with self._lock:
            if self._local.closed:
                return
            self.sync()
            self._local.closed = True
            closed = ShardexError("data engine closed")
            for part in self._parts.values():
                part.fail_waiters(closed)
            # Column-family handles keep RocksDB's directory lock alive: drop ours (also from
            # partitions something may still reference, e.g. a traceback) so the directory can
            # be reopened in this process, as in-process restarts and tests do.
            for part in self._parts.values():
                part.detach()
            self._parts.clear()
            self._marks.detach()
            if self._owns_store:
                self._store.close()

    def __enter__(self) -> DataEngine:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # keyspace catalog --------------------------------------------------------------------
    def create_keyspace(
        self,
        name: str,
        num_partitions: int = DEFAULT_NUM_PARTITIONS,
        *,
        exist_ok: bool = False,
        uuid: str = "",
        created_cas: int = 0,
        max_ttl: int | None = None,
    ) -> KeyspaceInfo:
        """Record a keyspace locally (no partitions yet: the node is told which it owns).
        ``exist_ok`` makes it idempotent when the partition count and ``uuid`` match (and
        takes the ``max_ttl`` given, the cluster's value; None keeps the one recorded, 0
        for a new keyspace: a migration's target does not know it)."""
        check_keyspace_name(name)
        check_num_partitions(num_partitions)
        with self._lock:
            old = self._keyspaces.get(name)
            if old is not None:
                if exist_ok and old.num_partitions == num_partitions and old.uuid == uuid:
                    if max_ttl is not None and old.max_ttl != max_ttl:
                        old = msgspec.structs.replace(old, max_ttl=max_ttl)
                        self._store.column_family().put(
                            _KS_PREFIX + name.encode(), encode(old), sync=True
                        )
                        self._keyspaces[name] = old
                    return old
                raise KeyspaceExists(
                    f"keyspace {name!r} already exists with {old.num_partitions} partitions",
                    details={
                        "keyspace": name,
                        "num_partitions": old.num_partitions,
                        "uuid": old.uuid,
                    },
                )
            ks = KeyspaceInfo(name, num_partitions, uuid, created_cas, max_ttl or 0)
            self._store.column_family().put(_KS_PREFIX + name.encode(), encode(ks), sync=True)
            self._keyspaces[name] = ks
            return ks

    def drop_keyspace(self, name: str) -> None:
        """Forget the keyspace and drop every local partition of it. The catalog entry goes
        first so a crash half-way leaves orphan families that the next open drops."""
        with self._lock:
            self.keyspace(name)
            batch = self._store.batch()
            batch.delete(self._store.column_family(), _KS_PREFIX + name.encode())
            self._handover.delete_markers(batch, name)
            self._store.write(batch, sync=True)
            del self._keyspaces[name]
            for ks, p in [k for k in self._parts if k[0] == name]:
                self._local.drop(ks, p)

    def keyspace(self, name: str) -> KeyspaceInfo:
        return self._local.keyspace(name)

    def keyspaces(self) -> list[KeyspaceInfo]:
        return sorted(self._keyspaces.values(), key=lambda k: k.name)

    def partition_for(self, keyspace: str, docid: str) -> int:
        return partition_of(check_docid(docid), self.keyspace(keyspace).num_partitions)

    # partitions ----------------------------------------------------------------------------
    def create_partition(
        self, keyspace: str, partition: int, *, exist_ok: bool = False
    ) -> PartitionInfo:
        """Start an empty partition here: a fresh uuid whose history begins at seqno 0."""
        ks = self.keyspace(keyspace)
        self._local.check_partition_number(ks, partition)
        with self._lock:
            old = self._parts.get((keyspace, partition))
            if old is not None:
                if exist_ok:
                    return info_of(old.meta, frozen=old.frozen)
                raise BadRequest(
                    f"partition {partition} of {keyspace!r} already exists here",
                    details={"keyspace": keyspace, "partition": partition},
                )
            meta = PartitionMeta(
                keyspace=keyspace,
                partition=partition,
                num_partitions=ks.num_partitions,
                failover_log=[FailoverEntry(self._uuids(), 0)],
            )
            part = self._local.install(meta, items=())
            return info_of(part.meta)

    def drop_partition(self, keyspace: str, partition: int) -> None:
        """Delete the partition's data here (one column-family drop). Waiting followers get
        NOT_MY_PARTITION. Dropping a partition this node does not hold is a no-op."""
        with self._lock:
            self._local.drop(keyspace, partition)

    def partitions(self, keyspace: str) -> list[int]:
        """Partitions of ``keyspace`` held here, in any state."""
        self.keyspace(keyspace)
        return sorted(p for ks, p in self._parts if ks == keyspace)

    def partition_info(self, keyspace: str, partition: int) -> PartitionInfo:
        part = self._local.held(keyspace, partition)
        return info_of(part.meta, frozen=part.frozen)

    def partition_storage_bytes(self, keyspace: str, partition: int) -> tuple[int, int]:
        """(SST file bytes, memtable bytes) of the partition's column family (its documents,
        change log and meta): RocksDB's counts, read from memory; (0, 0) once detached."""
        part = self._local.held(keyspace, partition)
        try:
            cf = part.cf
        except AttributeError:  # the store is closing (``Partition.detach``)
            return 0, 0
        return cf.storage_bytes()

    def new_branch(self, keyspace: str, partition: int) -> FailoverEntry:
        """Start a new history branch (new uuid at the current high seqno): for restores and
        failovers, when consumers may hold history this copy does not have."""
        return self._local.held(keyspace, partition).new_branch()

    # streams ------------------------------------------------------------------------------
    def stream(
        self,
        keyspace: str,
        partition: int,
        from_seqno: int,
        uuid: int,
        end_seqno: int | None = None,
        *,
        wire: bool = False,
    ) -> Iterator[SnapshotMarker | Change] | Iterator[streams.WireItem]:
        """Every change after ``from_seqno`` up to ``end_seqno`` or the current high seqno
        (whichever is lower), in seqno order, after one ``SnapshotMarker``. Raises ROLLBACK
        (``details["rollback_seqno"]``) before yielding if (uuid, from_seqno) is not in this
        partition's history. Close the iterator (or exhaust it) to release its snapshot.
        ``wire``: each change as its ``StreamBatch`` tuple (the stream server's form: no
        ``Change`` struct built per change only to be taken apart)."""
        part = self._local.serving(keyspace, partition)
        return streams.open_stream(part, from_seqno, uuid, end_seqno, wire=wire)

    async def wait_for_seqno(
        self, keyspace: str, partition: int, seqno: int, timeout: float | None = None
    ) -> int:
        """Wait until the partition's high seqno exceeds ``seqno``; returns the high seqno
        (after ``timeout`` it may still be <= ``seqno``: compare)."""
        return await streams.wait_for_seqno(
            self._local.serving(keyspace, partition), seqno, timeout
        )

    def follow(
        self,
        keyspace: str,
        partition: int,
        from_seqno: int,
        uuid: int,
        end_seqno: int | None = None,
    ) -> AsyncIterator[SnapshotMarker | Change]:
        """``stream`` that continues live: an async generator that never ends unless
        ``end_seqno`` is reached or the partition goes away (NOT_MY_PARTITION)."""
        return streams.follow(self._local.serving, keyspace, partition, from_seqno, uuid, end_seqno)

    # retention ------------------------------------------------------------------------------
    def set_consumer_checkpoint(self, name: str, keyspace: str, partition: int, seqno: int) -> None:
        self.set_consumer_checkpoints(name, keyspace, {partition: seqno})

    def set_consumer_checkpoints(self, name: str, keyspace: str, seqnos: dict[int, int]) -> None:
        """Record that consumer ``name`` has durably consumed each partition up to its seqno,
        so retention keeps change records above it. One unsynced batch for all partitions:
        losing it only makes retention keep more."""
        if not isinstance(name, str) or not name:
            raise BadRequest("consumer name must be a non-empty string", details={"name": name})
        batch = self._store.batch()
        for p, seqno in seqnos.items():
            check_seqno("seqno", seqno)
            batch.put(self._local.held(keyspace, p).cf, consumer_key(name), encode(seqno))
        self._store.write(batch, sync=False)

    def remove_consumer(self, name: str, keyspace: str | None = None) -> None:
        batch = self._store.batch()
        for (ks, _p), part in list(self._parts.items()):
            if keyspace is None or ks == keyspace:
                batch.delete(part.cf, consumer_key(name))
        self._store.write(batch, sync=False)

    def consumer_checkpoints(self, keyspace: str, partition: int) -> dict[str, int]:
        return self._local.held(keyspace, partition).consumers()

    def purge(self) -> dict[tuple[str, int], int]:
        """Apply the retention rule to every active partition; returns change records purged
        per partition. Rule: a change record (and the tombstone it created, if still current)
        is purged once it is more than ``retention_seqnos`` below the high seqno AND at or below
        every registered consumer's checkpoint on that partition. Run it periodically."""
        out: dict[tuple[str, int], int] = {}
        for key, part in list(self._parts.items()):
            if part.meta.state != STATE_ACTIVE:
                continue
            target = part.meta.high_seqno - self.retention_seqnos
            checkpoints = part.consumers()
            if checkpoints:
                target = min(target, *checkpoints.values())
            if target > part.meta.purge_seqno:
                out[key] = part.purge_to(target)
        return out

    # documents (``documents.DocumentOps``) ------------------------------------------------
    def insert(
        self,
        keyspace: str,
        docid: str,
        doc: object,
        *,
        durability: Durability = "persist",
        expiry: int = 0,
    ) -> MutationResult:
        """``DocumentOps.insert``."""
        return self._documents.insert(keyspace, docid, doc, durability=durability, expiry=expiry)

    def upsert(
        self,
        keyspace: str,
        docid: str,
        doc: object,
        *,
        cas: int | None = None,
        durability: Durability = "persist",
        expiry: int = 0,
    ) -> MutationResult:
        """``DocumentOps.upsert``."""
        return self._documents.upsert(
            keyspace, docid, doc, cas=cas, durability=durability, expiry=expiry
        )

    def replace(
        self,
        keyspace: str,
        docid: str,
        doc: object,
        *,
        cas: int | None = None,
        durability: Durability = "persist",
        expiry: int = 0,
    ) -> MutationResult:
        """``DocumentOps.replace``."""
        return self._documents.replace(
            keyspace, docid, doc, cas=cas, durability=durability, expiry=expiry
        )

    def delete(
        self,
        keyspace: str,
        docid: str,
        *,
        cas: int | None = None,
        durability: Durability = "persist",
    ) -> MutationResult:
        """``DocumentOps.delete``."""
        return self._documents.delete(keyspace, docid, cas=cas, durability=durability)

    def upsert_many(
        self,
        keyspace: str,
        items: Iterable[tuple[str, object]],
        *,
        durability: Durability = "persist",
    ) -> list[MutationResult | ShardexError]:
        """``DocumentOps.upsert_many``."""
        return self._documents.upsert_many(keyspace, items, durability=durability)

    def mutate_many(
        self,
        keyspace: str,
        ops: Iterable[tuple[Any, ...]],
        *,
        durability: Durability = "persist",
        inline: bool = False,
    ) -> list[MutationResult | ShardexError]:
        """``DocumentOps.mutate_many``."""
        return self._documents.mutate_many(keyspace, ops, durability=durability, inline=inline)

    def touch(
        self,
        keyspace: str,
        docid: str,
        expiry: int,
        *,
        cas: int | None = None,
        durability: Durability = "persist",
    ) -> MutationResult:
        """``DocumentOps.touch``."""
        return self._documents.touch(keyspace, docid, expiry, cas=cas, durability=durability)

    # expiry (``expiry.py``; the service's pager calls these on active copies) -------------
    def set_on_expired(self, hook: OnExpired) -> None:
        """``hook(keyspace, partition, docid, cas)`` is told of each expired document a read
        finds (the pager deletes it)."""
        self._documents.on_expired = hook

    def active_partitions(self) -> list[tuple[str, int]]:
        """(keyspace, partition) of every active copy here, sorted."""
        return sorted(k for k, p in list(self._parts.items()) if p.meta.state == STATE_ACTIVE)

    def find_expired(
        self, keyspace: str, partition: int, after: bytes | None, limit: int
    ) -> tuple[list[tuple[str, int]], bytes | None, int]:
        """``expiry.find_expired`` on an active copy, at the engine's clock."""
        part = self._local.serving(keyspace, partition)
        return expiry_ops.find_expired(part, after, limit, self._clock_ns())

    def expire(self, keyspace: str, partition: int, items: list[tuple[str, int]]) -> int:
        """``expiry.expire`` (synced) on an active copy; NOT_MY_PARTITION once it is not."""
        return expiry_ops.expire(self._local.held(keyspace, partition), items, sync=True)

    def get(self, keyspace: str, docid: str) -> GetResult:
        """``DocumentOps.get``."""
        return self._documents.get(keyspace, docid)

    def get_raw(self, keyspace: str, docid: str) -> RawGetResult:
        """``DocumentOps.get_raw``."""
        return self._documents.get_raw(keyspace, docid)

    def high_seqnos(self, keyspace: str) -> Timestamp:
        """``DocumentOps.high_seqnos``."""
        return self._documents.high_seqnos(keyspace)

    def partition_seqnos(
        self, keyspace: str, partitions: Iterable[int]
    ) -> dict[int, tuple[int, int]]:
        """``DocumentOps.partition_seqnos``."""
        return self._documents.partition_seqnos(keyspace, partitions)
