"""Hand-over operations of ``DataEngine``: everything a migration needs from the local engine.

A part of ``DataEngine`` (like ``DocumentOps``), built over the node's ``LocalPartitions``
(``partitions.py``); the engine exposes its methods. The protocol that drives these
(``docs/decisions/0030-partition-migration-protocol.md``) lives in ``migration_source.py``
and ``migration_target.py`` (node side) and ``shardex.manager.rebalance`` (the coordinator
master). The pieces:

* source: ``snapshot_partition`` (copy), ``freeze_partition`` (writes refused, retryable),
  ``release_if_high`` (the point of no return: persisted, conditional on the high seqno the
  target caught up to, atomically with the writers), ``unfreeze_partition`` (abort);
* target: ``begin_ingest`` (an SST written chunk by chunk, installed as ``pending``),
  ``apply_changes`` (catch-up), ``activate_partition``;
* durable markers in the default column family, because reconciliation must be able to tell
  "being received" and "moved away" from "never opened":

  - ``data/in/<ks>/<p>``: an incoming migration (``IncomingMarker``): reconcile neither opens
    the partition empty nor drops the partial copy while the migration is in flight;
  - ``data/floor/<ks>``: the newest topology ``seq_num`` this node acted on for the keyspace
    (raised when a moved-away partition is dropped): a stale manager state below it is not
    used to open partitions, so a dropped source never re-opens an empty copy;
  - ``data/fence``: the highest coordinator term that sent a migration command; commands of
    older terms are refused, so a deposed master cannot finish a migration the new one aborted.
"""

from __future__ import annotations

import contextlib
import os
import shutil
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path

import msgspec

import shardex.data.migration as migration
from shardex.api.errors import BadRequest, KeyspaceNotFound, not_my_partition
from shardex.api.migration import IncomingMarker
from shardex.api.records import (
    STATE_ACTIVE,
    STATE_PENDING,
    STATE_RELEASED,
    Change,
    FailoverEntry,
    PartitionInfo,
    SnapshotMarker,
)
from shardex.data.partitions import INGEST_DIR, LocalPartitions
from shardex.data.records import (
    PREFIX_CHANGE,
    PREFIX_CONSUMER,
    PREFIX_DOC,
    PartitionMeta,
    decode_doc,
    decode_int,
    encode,
    info_of,
    next_prefix,
)
from shardex.errors import ErrorCode, ShardexError, StorageError
from shardex.meta.partitioning import partition_cf_name
from shardex.storage import Batch, SstWriter

_IN_PREFIX = b"data/in/"
_FLOOR_PREFIX = b"data/floor/"
_FENCE_KEY = b"data/fence"
_ALLOWED = (PREFIX_CHANGE[0], PREFIX_DOC[0], PREFIX_CONSUMER[0])


_decode_marker = msgspec.msgpack.Decoder(IncomingMarker).decode

# (event, keyspace, partition); event is "left" (released here) or "arrived" (activated here)
HandoverListener = Callable[[str, str, int], None]


def _in_key(keyspace: str, partition: int) -> bytes:
    return _IN_PREFIX + f"{keyspace}/{partition}".encode()


def _upper(prefix: bytes) -> bytes:
    return prefix[:-1] + bytes([prefix[-1] + 1])


class IncomingCopy:
    """A partition being copied in: raw items go to one SST file chunk by chunk (the copy never
    has to fit in memory or in one frame); ``finish`` ingests it as a ``pending`` partition.

    Not thread-safe; call ``add``/``finish`` from one thread at a time (the executor does)."""

    def __init__(self, engine: HandoverOps, info: PartitionInfo, path: Path) -> None:
        self._engine = engine
        self.info = info
        self.path = path
        path.parent.mkdir(parents=True, exist_ok=True)
        self._writer: SstWriter | None = SstWriter(path)
        self.items = 0
        self.bytes = 0

    def add(self, items: Iterable[tuple[bytes, bytes]]) -> int:
        """Append items (strictly increasing keys, continuing the previous chunk)."""
        writer = self._writer
        if writer is None:
            raise BadRequest("incoming copy already finished or aborted")
        n = 0
        for key, value in items:
            if not key or key[0] not in _ALLOWED:
                raise BadRequest(
                    "a copy carries only change, document and checkpoint keys",
                    details={"key": key[:40].hex()},
                )
            writer.put(key, value)
            n += 1
            self.bytes += len(key) + len(value)
        self.items += n
        return n

    def finish(self) -> PartitionInfo:
        """Install the copy as a ``pending`` partition (replacing a pending leftover)."""
        writer, self._writer = self._writer, None
        if writer is None:
            raise BadRequest("incoming copy already finished or aborted")
        sst = None
        if writer.count:
            writer.finish()
            sst = self.path
        try:
            return self._engine.install_copy(self.info, sst)
        finally:
            with contextlib.suppress(FileNotFoundError):
                self.path.unlink()

    def abort(self) -> None:
        self._writer = None
        with contextlib.suppress(FileNotFoundError):
            self.path.unlink()


class HandoverOps:
    """The hand-over operations of ``DataEngine`` over ``local`` (module docstring)."""

    def __init__(self, local: LocalPartitions) -> None:
        self._local = local
        self._store = local.store
        self._handover_listeners: list[HandoverListener] = []

    # --- source side --------------------------------------------------------------------------

    def snapshot_partition(self, keyspace: str, partition: int) -> migration.PartitionSnapshot:
        """A consistent snapshot of the partition (documents in docid order, change log,
        checkpoints, and the high seqno / uuid / failover log at that point)."""
        return migration.PartitionSnapshot(self._store, self._local.serving(keyspace, partition))

    def freeze_partition(self, keyspace: str, partition: int) -> PartitionInfo:
        """Pause writes for a hand-over; returns the info whose ``high_seqno`` is final while
        frozen. Writers get NOT_MY_PARTITION with ``retryable: True`` (never blocked: a
        blocked writer would hold an RPC worker for an unbounded time). Not persisted: a
        restart ends an unfinished hand-over with the partition active here."""
        part = self._local.held(keyspace, partition)
        with part.lock:
            part.check_serving(write=False)
            part.frozen = True
            return info_of(part.meta, frozen=True)

    def unfreeze_partition(self, keyspace: str, partition: int) -> None:
        part = self._local.held(keyspace, partition)
        with part.lock:
            part.frozen = False

    def release_partition(self, keyspace: str, partition: int) -> PartitionInfo:
        """Hand-over done: from now on (persisted, so across restarts too) every operation on
        the partition answers NOT_MY_PARTITION until it is dropped."""
        part = self._local.held(keyspace, partition)
        part.set_state(STATE_RELEASED)
        self._announce("left", keyspace, partition)
        return info_of(part.meta)

    def release_if_high(self, keyspace: str, partition: int, high_seqno: int) -> PartitionInfo:
        """Release only if the partition is active here with exactly ``high_seqno``: checked
        and persisted under the partition lock, which every writer takes, so no write can
        slip in between the check and the release. This is what makes "the target holds
        everything up to ``high_seqno``" imply "the target holds every acknowledged write"."""
        part = self._local.held(keyspace, partition)
        with part.lock:
            meta = part.meta
            if meta.state != STATE_ACTIVE or meta.high_seqno != high_seqno:
                raise ShardexError(
                    f"partition {partition} of {keyspace!r} is {meta.state} at seqno "
                    f"{meta.high_seqno}, not active at {high_seqno}: not released",
                    code=ErrorCode.STALE_TOPOLOGY,
                    details={
                        "keyspace": keyspace,
                        "partition": partition,
                        "state": meta.state,
                        "high_seqno": meta.high_seqno,
                        "expected": high_seqno,
                    },
                )
            new = meta.copy()
            new.state = STATE_RELEASED
            part.commit(self._store.batch(), new, sync=True)
            part.frozen = False
        part.fail_waiters(not_my_partition(keyspace, partition, STATE_RELEASED))
        self._announce("left", keyspace, partition)
        return info_of(part.meta)

    # --- target side --------------------------------------------------------------------------

    def activate_partition(self, keyspace: str, partition: int) -> PartitionInfo:
        """Make a copied-in (pending) partition serve: the target side of a hand-over. Also
        forgets the partition's incoming marker (same batch would be nicer; the marker is only
        advisory once the partition is active)."""
        part = self._local.held(keyspace, partition)
        if part.meta.state != STATE_PENDING:
            raise BadRequest(
                f"partition {partition} is {part.meta.state}, only a pending one is activated",
                details={"partition": partition, "state": part.meta.state},
            )
        part.set_state(STATE_ACTIVE)
        self.clear_incoming(keyspace, partition)
        self._announce("arrived", keyspace, partition)
        return info_of(part.meta)

    def ingest_partition(
        self,
        keyspace: str,
        partition: int,
        info: PartitionInfo,
        items: Iterable[tuple[bytes, bytes]],
        *,
        activate: bool = False,
    ) -> PartitionInfo:
        """Install a copy (``PartitionSnapshot.info`` and ``raw_items()``) keeping its seqnos,
        uuid, failover log and CAS clock, so it continues the same history. The copy is
        ``pending`` (only ``apply_changes``) unless ``activate``. A pending leftover of a
        failed attempt is replaced; a partition in any other state is refused."""
        meta = self._copy_meta(keyspace, partition, info, activate)
        with self._local.lock:
            self._replace_pending(keyspace, partition)
            return info_of(self._local.install(meta, items).meta)

    def begin_ingest(self, keyspace: str, partition: int, info: PartitionInfo) -> IncomingCopy:
        """Start a chunked copy of ``info``'s partition (see ``IncomingCopy``)."""
        self._copy_meta(keyspace, partition, info, False)  # validates before any file exists
        if not self._store.on_disk:
            raise StorageError(
                "a chunked copy is built as an SST file, which a memory store cannot take",
                details={"keyspace": keyspace, "partition": partition},
            )
        name = f"{partition_cf_name(keyspace, partition)}-{os.getpid()}-{id(info):x}.sst"
        return IncomingCopy(self, info, self._store.path / INGEST_DIR / name)

    def install_copy(self, info: PartitionInfo, sst: Path | None) -> PartitionInfo:
        """Install a finished chunked copy (``IncomingCopy.finish``)."""
        meta = self._copy_meta(info.keyspace, info.partition, info, False)
        with self._local.lock:
            self._replace_pending(info.keyspace, info.partition)
            return info_of(self._local.install(meta, (), sst).meta)

    def _copy_meta(
        self, keyspace: str, partition: int, info: PartitionInfo, activate: bool
    ) -> PartitionMeta:
        ks = self._local.keyspace(keyspace)
        self._local.check_partition_number(ks, partition)
        migration.check_info(info, keyspace, partition, ks.num_partitions)
        return PartitionMeta(
            keyspace=keyspace,
            partition=partition,
            num_partitions=ks.num_partitions,
            high_seqno=info.high_seqno,
            failover_log=list(info.failover_log),
            purge_seqno=info.purge_seqno,
            max_cas=info.max_cas,
            doc_count=info.doc_count,
            state=STATE_ACTIVE if activate else STATE_PENDING,
        )

    def _replace_pending(self, keyspace: str, partition: int) -> None:
        """Drop a pending or released leftover of an earlier attempt; refuse an active one."""
        old = self._local.parts.get((keyspace, partition))
        if old is None:
            return
        if old.meta.state == STATE_ACTIVE:
            raise BadRequest(
                f"partition {partition} of {keyspace!r} is already active here",
                details={"keyspace": keyspace, "partition": partition},
            )
        self._local.drop(keyspace, partition)

    def apply_changes(
        self,
        keyspace: str,
        partition: int,
        changes: Iterable[Change | SnapshotMarker],
        *,
        failover_log: list[FailoverEntry] | None = None,
    ) -> int:
        """Catch a pending copy up from the source's stream; returns the new high seqno."""
        return migration.apply_changes(self._local.held(keyspace, partition), changes, failover_log)

    def local_partitions(self, keyspace: str) -> list[PartitionInfo]:
        """Every partition of ``keyspace`` held here, in any state (admin and tests)."""
        self._local.keyspace(keyspace)
        with self._local.lock:
            parts = [(p, part) for (ks, p), part in self._local.parts.items() if ks == keyspace]
        return [info_of(part.meta, frozen=part.frozen) for _p, part in sorted(parts)]

    def partition_state(self, keyspace: str, partition: int) -> str:
        """active / pending / released, or "absent" (also for an unknown keyspace)."""
        try:
            self._local.keyspace(keyspace)
        except KeyspaceNotFound:
            return "absent"
        part = self._local.parts.get((keyspace, partition))
        return "absent" if part is None else part.meta.state

    # --- paginated scans: hand-over events and a partition's documents -----------------------

    def add_handover_listener(self, fn: HandoverListener) -> None:
        """Call ``fn(event, keyspace, partition)`` after every hand-over step that changes
        what this node serves, once it is persisted: "left" (released, the point of no
        return) and "arrived" (activated). Runs in the thread that made the change; the
        paginated scans' migration manager (``shardex.scan.elastic_adapters_data``)."""
        self._handover_listeners = [*self._handover_listeners, fn]

    def _announce(self, event: str, keyspace: str, partition: int) -> None:
        for fn in self._handover_listeners:
            fn(event, keyspace, partition)

    def iter_docids(
        self, keyspace: str, partition: int, start: bytes = b"", stop: bytes | None = None
    ) -> Iterator[str]:
        """Docids of the live documents of a partition held here *in any state* with
        ``start <= utf-8 docid < stop``, in that (code point) order. A released partition is
        still read: a paginated scan whose base topology has it here keeps reading it until
        its migration manager says it left (its contents are final once released)."""
        part = self._local.held(keyspace, partition)
        upper = next_prefix(PREFIX_DOC) if stop is None else PREFIX_DOC + stop
        for key, raw in part.cf.iterate(PREFIX_DOC + start, upper):
            if not decode_doc(raw).deleted:
                yield key[1:].decode("utf-8")

    # --- durable markers -------------------------------------------------------------------------

    def set_incoming(self, marker: IncomingMarker) -> None:
        key = _in_key(marker.keyspace, marker.partition)
        self._store.column_family().put(key, encode(marker), sync=True)

    def clear_incoming(self, keyspace: str, partition: int) -> None:
        self._store.column_family().delete(_in_key(keyspace, partition), sync=True)

    def incoming(self) -> dict[tuple[str, int], IncomingMarker]:
        out = {}
        cf = self._store.column_family()
        for _key, raw in cf.iterate(_IN_PREFIX, _upper(_IN_PREFIX)):
            m = _decode_marker(raw)
            out[(m.keyspace, m.partition)] = m
        return out

    def topology_floor(self, keyspace: str) -> int:
        raw = self._store.column_family().get(_FLOOR_PREFIX + keyspace.encode())
        return 0 if raw is None else decode_int(raw)

    def raise_topology_floor(self, keyspace: str, seq_num: int) -> None:
        if seq_num > self.topology_floor(keyspace):
            cf = self._store.column_family()
            cf.put(_FLOOR_PREFIX + keyspace.encode(), encode(seq_num), sync=True)

    def migration_fence(self) -> int:
        raw = self._store.column_family().get(_FENCE_KEY)
        return 0 if raw is None else decode_int(raw)

    def check_fence(self, epoch: int) -> None:
        """Refuse a migration command from a coordinator term older than one already seen;
        remember a newer term (persisted before the command runs)."""
        with self._local.lock:
            fence = self.migration_fence()
            if epoch < fence:
                raise ShardexError(
                    f"migration command from master term {epoch}, but term {fence} has "
                    "already spoken: the sender was deposed",
                    code=ErrorCode.NODE_UNAVAILABLE,
                    details={"reason": "deposed", "epoch": epoch, "fence": fence},
                )
            if epoch > fence:
                self._store.column_family().put(_FENCE_KEY, encode(epoch), sync=True)

    def delete_markers(self, batch: Batch, keyspace: str) -> None:
        """Add the deletion of ``keyspace``'s markers to ``batch`` (keyspace drop)."""
        cf = self._store.column_family()
        prefix = _IN_PREFIX + keyspace.encode() + b"/"
        for key, _raw in cf.iterate(prefix, _upper(prefix)):
            batch.delete(cf, key)
        batch.delete(cf, _FLOOR_PREFIX + keyspace.encode())

    def clean_ingest_dir(self) -> None:
        """SST files of copies that were in progress when the process died are garbage.
        A memory store has no files: its ``path`` is a name, not a directory to clean."""
        if self._store.on_disk:
            shutil.rmtree(self._store.path / INGEST_DIR, ignore_errors=True)
