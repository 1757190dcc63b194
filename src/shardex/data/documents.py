"""Document operations of ``DataEngine``: CRUD with CAS, batched mutations, high seqnos.

A part of ``DataEngine``, which builds it over the node's ``LocalPartitions`` (the catalog
and partition lookup, ``partitions.py``) and exposes its methods. Validation happens here,
before any lock, so a rejected request cannot have changed anything; the partition then
applies the checked ops under its lock (``partition.py``).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from operator import itemgetter
from typing import Any, NamedTuple
from zlib import crc32

import msgspec

from shardex.api.errors import BadRequest, DocNotFound
from shardex.api.expiry import check_wire_expiry, resolve_expiry
from shardex.api.records import STATE_ACTIVE, MutationResult
from shardex.api.validation import (
    MAX_DOCID_BYTES,
    Durability,
    check_cas,
    check_docid,
    check_durability,
    encode_document,
)
from shardex.core.timestamp import Timestamp
from shardex.data.engine_io import WouldBlock
from shardex.data.partition import Partition, PreparedOp, commit_many, lock_now
from shardex.data.partitions import LocalPartitions
from shardex.data.records import PartitionMeta
from shardex.errors import ErrorCode, ShardexError
from shardex.meta.partitioning import partition_of

BATCH_MAX_OPS = 5_000  # ops per atomic batch in *_many: bounds lock hold time and memory
BATCH_MAX_BYTES = 8 * 1024 * 1024
_KINDS = frozenset(("insert", "upsert", "replace", "delete", "touch"))
# Called with (keyspace, partition, docid, cas) when a read finds a document expired: the
# service's expiry pager deletes it soon (a read never writes).
OnExpired = Callable[[str, int, str, int], None]


class GetResult(NamedTuple):
    doc: dict[str, Any]
    cas: int
    seqno: int


class RawGetResult(NamedTuple):
    body: bytes  # the stored JSON text, for callers that forward it without decoding
    cas: int
    seqno: int
    expiry: int = 0  # absolute epoch seconds, 0 for never


class DocumentOps:
    """The document operations of ``DataEngine`` over ``local``; documents bigger than
    ``max_doc_bytes`` (encoded) are refused.

    Every mutation takes ``durability``: ``"persist"`` (default) fsyncs the WAL before it
    returns, so the write survives a power loss; ``"memory"`` returns once the write is in
    RocksDB and the WAL's OS buffers: it survives a crash of this process but NOT a power loss
    or kernel crash (after which the partition starts a new branch, see ``recovery.py``).
    """

    def __init__(self, local: LocalPartitions, *, max_doc_bytes: int) -> None:
        self._local = local
        self.max_doc_bytes = max_doc_bytes
        self.on_expired: OnExpired = _ignore_expired

    def insert(
        self,
        keyspace: str,
        docid: str,
        doc: object,
        *,
        durability: Durability = "persist",
        expiry: int = 0,
    ) -> MutationResult:
        """Create ``docid``; DOC_EXISTS if it exists (a tombstone or an expired document
        does not count). ``expiry``: wire form (``api/expiry.py``), as every write's."""
        return self._mutate("insert", keyspace, docid, doc, None, durability, expiry)

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
        """Create or overwrite. With ``cas`` it behaves as ``replace`` (must exist, match)."""
        return self._mutate("upsert", keyspace, docid, doc, cas, durability, expiry)

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
        """Overwrite an existing document; DOC_NOT_FOUND if absent, CAS_MISMATCH if ``cas``
        is given and differs from the document's."""
        return self._mutate("replace", keyspace, docid, doc, cas, durability, expiry)

    def delete(
        self,
        keyspace: str,
        docid: str,
        *,
        cas: int | None = None,
        durability: Durability = "persist",
    ) -> MutationResult:
        """Replace the document by a tombstone (kept, with its seqno, until purged)."""
        return self._mutate("delete", keyspace, docid, None, cas, durability)

    def touch(
        self,
        keyspace: str,
        docid: str,
        expiry: int,
        *,
        cas: int | None = None,
        durability: Durability = "persist",
    ) -> MutationResult:
        """Set an existing document's expiry (wire form, ``api/expiry.py``) without changing
        its body: a new version (seqno, CAS); DOC_NOT_FOUND if absent or expired."""
        return self._mutate("touch", keyspace, docid, None, cas, durability, expiry)

    def _prepare(self, kind: str, docid: object, doc: object, cas: object) -> PreparedOp:
        docid = check_docid(docid)
        cas = check_cas(cas)
        if kind == "insert" and cas is not None:
            raise BadRequest("insert takes no cas", details={"docid": docid})
        bodiless = kind == "delete" or kind == "touch"
        body = b"" if bodiless else encode_document(doc, self.max_doc_bytes, docid)
        return PreparedOp(kind, docid, body, cas)

    def _mutate(
        self,
        kind: str,
        keyspace: str,
        docid: object,
        doc: object,
        cas: object,
        durability: str,
        expiry: int = 0,
    ) -> MutationResult:
        sync = check_durability(durability)
        ks = self._local.keyspace(keyspace)
        op = self._prepare(kind, docid, doc, cas)
        if expiry or ks.max_ttl:
            _set_expiry(op, expiry, ks.max_ttl, self._local.clock_ns() / 1e9)
        part = self._local.held(keyspace, partition_of(op.docid, ks.num_partitions))
        result = part.apply([op], sync=sync)[0]
        if isinstance(result, ShardexError):
            raise result
        return result

    def upsert_many(
        self,
        keyspace: str,
        items: Iterable[tuple[str, object]],
        *,
        durability: Durability = "persist",
    ) -> list[MutationResult | ShardexError]:
        """Upsert ``(docid, doc)`` pairs: one atomic batch (one fsync) per ``BATCH_MAX_OPS``
        ops or ``BATCH_MAX_BYTES``, whatever partitions they fall in; each partition's ops get
        consecutive seqnos in input order. Results align with the input; a bad item gets its
        error (and changes nothing) while the others are written, as a bulk load wants."""
        return self.mutate_many(
            keyspace, (("upsert", d, doc, None) for d, doc in items), durability=durability
        )

    def mutate_many(
        self,
        keyspace: str,
        ops: Iterable[tuple[Any, ...]],
        *,
        durability: Durability = "persist",
        inline: bool = False,
    ) -> list[MutationResult | ShardexError]:
        """Batched ``(kind, docid, doc, cas)`` or ``(kind, docid, doc, cas, expiry)``
        mutations, kind in insert/upsert/replace/delete/touch (a touch has no doc). Within a
        partition they apply in input order. ``expiry`` is the wire form (``api/expiry.py``),
        resolved here against the node's clock and the keyspace's ``max_ttl``; a write
        without one gets the keyspace's default (none, or ``max_ttl``).

        Every write of the node passes here (group commit, ``GroupCommitter``), so the per-op
        checks are inlined for the usual op (a str docid that encodes within the limit, no
        CAS) and its UTF-8 bytes are encoded once, for the length check and the partition
        hash both; any other op takes ``_prepare``, whose checks and errors are the same.

        ``inline``: the caller is the event loop (group commit's small unsynced groups), so
        nothing may wait: ``WouldBlock`` before anything is written if the call would fsync
        (a synced level, or a partition's first unsynced write since its last fsync, whose
        dirty mark is fsynced), take more than one batch, or wait for a partition lock."""
        sync = check_durability(durability)
        ks = self._local.keyspace(keyspace)
        nparts = ks.num_partitions
        max_ttl = ks.max_ttl
        now_s = 0.0  # the node's clock, read at the first op with an expiry
        max_bytes = self.max_doc_bytes
        results: list[MutationResult | ShardexError | None] = []
        # The chunk being filled: per partition, its ops and their places in ``results``, in
        # input order (grouped here, so ``_apply_chunk`` takes them as they are).
        chunk: dict[int, tuple[list[int], list[PreparedOp]]] = {}
        chunks = [chunk]
        n = size = 0
        for i, item in enumerate(ops):
            results.append(None)
            if len(item) == 4:
                kind, docid, doc, cas = item
                expiry = 0
            else:
                kind, docid, doc, cas, expiry = item
            try:
                if kind not in _KINDS:
                    raise BadRequest(f"unknown mutation {kind!r}", details={"kind": repr(kind)})
                raw = _docid_bytes(docid) if cas is None else None
                if raw is None or kind == "touch":
                    op = self._prepare(kind, docid, doc, cas)
                    raw = op.docid.encode("utf-8")
                else:
                    body = b"" if kind == "delete" else encode_document(doc, max_bytes, docid)
                    op = PreparedOp(kind, docid, body, None)
                if expiry or max_ttl:
                    now_s = now_s or self._local.clock_ns() / 1e9  # once per call
                    _set_expiry(op, expiry, max_ttl, now_s)
            except ShardexError as exc:
                results[i] = exc
                continue
            except Exception as exc:  # a check that broke on this op's input: its error only
                results[i] = BadRequest(
                    f"mutation could not be checked: {type(exc).__name__}: {exc}",
                    details={"docid": repr(docid)[:100]},
                )
                continue
            p = crc32(raw) % nparts  # partition_of's hash, on the bytes already encoded
            got = chunk.get(p)
            if got is None:
                chunk[p] = ([i], [op])
            else:
                got[0].append(i)
                got[1].append(op)
            n += 1
            size += len(op.body)
            if n >= BATCH_MAX_OPS or size >= BATCH_MAX_BYTES:
                chunk, n, size = {}, 0, 0
                chunks.append(chunk)
        # Every op checked before any is written (a bad op changes nothing, nor does an
        # ``ops`` iterable that fails half-way).
        if inline and (sync or len(chunks) > 1):
            raise WouldBlock("an fsync or more than one batch")
        written = False
        for c in chunks:
            if not c:
                continue
            try:
                self._apply_chunk(keyspace, c, results, sync, inline)
            except Exception as exc:
                if not written:
                    raise  # nothing written: the caller may fail or retry the whole call
                # Earlier chunks are committed and keep their results; this and the later
                # ones fail per op (not attempted, so a partition's ops stay in order). Never
                # raising once something is written keeps a retry by the caller (the group
                # committer) from writing an op twice.
                err = ShardexError(
                    f"mutation failed: {type(exc).__name__}: {exc}",
                    code=ErrorCode.STORAGE_ERROR,
                    details={"keyspace": keyspace},
                )
                results[:] = [err if r is None else r for r in results]
                break
            written = True
        return results  # type: ignore[return-value]  # every slot filled above

    def _apply_chunk(
        self,
        keyspace: str,
        chunk: dict[int, tuple[list[int], list[PreparedOp]]],
        results: list[MutationResult | ShardexError | None],
        sync: bool,
        inline: bool = False,
    ) -> None:
        """One atomic batch (one fsync) for a chunk spanning any number of partitions. The
        partitions' locks are taken in column-family-name order; every other lock holder takes
        one partition lock only (or the same order), so this cannot deadlock.

        A group of writes spreads over many partitions (16 ops over ~14 of 64), so the work
        here is per op in effect: each step is one loop (no per-partition ``zip`` or list
        built twice), measured in ``docs/decisions/0072-data-node-cpu-per-write.md``."""
        parts: list[tuple[str, Partition, tuple[list[int], list[PreparedOp]]]] = []
        # The partition numbers come from the hash, in range; a partition held by an open
        # engine is one dict look-up, anything else goes through ``held`` for its error.
        local = self._local
        held = {} if local.closed else local.parts
        for p, entry in chunk.items():
            part = held.get((keyspace, p))
            if part is None:
                try:
                    part = local.held(keyspace, p)
                except ShardexError as exc:
                    for i in entry[0]:
                        results[i] = exc
                    continue
            parts.append((part.cf.name, part, entry))
        parts.sort(key=_cf_name)
        locks = [t[1].lock for t in parts]
        if inline:
            lock_now([t[1] for t in parts])
        else:
            for lock in locks:
                lock.acquire()
        try:
            batch = local.store.batch()
            staged: list[tuple[Partition, PartitionMeta]] = []
            # Every staged op's place in ``results`` and its outcome, in two flat lists.
            where: list[int] = []
            outcomes: list[MutationResult | ShardexError] = []
            for _, part, (idx, ops) in parts:
                if part.meta.state != STATE_ACTIVE or part.frozen:  # check_serving's test
                    try:
                        part.check_serving(write=True)
                    except ShardexError as exc:
                        where += idx
                        outcomes += [exc] * len(idx)
                        continue
                meta, out = part.stage(ops, batch)
                where += idx
                outcomes += out
                if meta is not None:
                    staged.append((part, meta))
            if staged:
                if inline:
                    try:  # a write stall refused at once: nothing written, the pool waits
                        commit_many(local.store, batch, staged, sync=False, no_stall=True)
                    except Exception as exc:
                        raise WouldBlock(f"the store refused an unstalled write: {exc}") from exc
                else:
                    commit_many(local.store, batch, staged, sync=sync)
            # Only now: a failed write raises and acknowledges nothing.
            for i, r in zip(where, outcomes, strict=True):
                results[i] = r
        finally:
            for lock in locks:
                lock.release()

    def get(self, keyspace: str, docid: str) -> GetResult:
        """(document, cas, seqno); DOC_NOT_FOUND for a missing or deleted document."""
        raw = self.get_raw(keyspace, docid)
        return GetResult(msgspec.json.decode(raw.body), raw.cas, raw.seqno)

    def get_raw(self, keyspace: str, docid: str) -> RawGetResult:
        """The stored version; DOC_NOT_FOUND when absent, deleted or expired (an expired
        one is handed to ``on_expired``, which deletes it: a read never writes)."""
        docid = check_docid(docid)
        ks = self._local.keyspace(keyspace)
        p = partition_of(docid, ks.num_partitions)
        rec = self._local.serving(keyspace, p).read_doc(docid)
        expiry = 0 if rec is None or rec.deleted else rec.expiry
        if expiry and expiry * 1_000_000_000 <= self._local.clock_ns():
            self.on_expired(keyspace, p, docid, rec.cas)  # type: ignore[union-attr]
            rec = None
        if rec is None or rec.deleted:
            raise DocNotFound(
                f"document {docid!r} not found", details={"docid": docid, "partition": p}
            )
        return RawGetResult(rec.body, rec.cas, rec.seqno, rec.expiry)

    def high_seqnos(self, keyspace: str) -> Timestamp:
        """(high seqno, uuid) of every partition of ``keyspace`` this node serves."""
        self._local.keyspace(keyspace)
        entries = {}
        for (ks, p), part in list(self._local.parts.items()):
            meta = part.meta
            if ks == keyspace and meta.state == STATE_ACTIVE:
                entries[p] = (meta.high_seqno, meta.uuid)
        # Wire form, checked in C: every request_plus scan reads this on each data node.
        return Timestamp.from_wire(entries)

    def partition_seqnos(
        self, keyspace: str, partitions: Iterable[int]
    ) -> dict[int, tuple[int, int]]:
        """(high seqno, uuid) of those of ``partitions`` this node serves (active), in wire
        form. Every request_plus scan reads it on each data node (a ``HighSeqnos``, a
        ``ScanSlices.seqnos_of``, its coordinator's own node), so it looks up only the
        partitions asked for and builds no ``Timestamp``: the values are this node's own
        partition metadata, already ints."""
        self._local.keyspace(keyspace)  # KEYSPACE_NOT_FOUND as ``high_seqnos``
        parts = self._local.parts
        entries: dict[int, tuple[int, int]] = {}
        for p in partitions:
            part = parts.get((keyspace, p))  # one lookup: safe beside a writer thread
            if part is not None:
                meta = part.meta
                if meta.state == STATE_ACTIVE:
                    entries[p] = (meta.high_seqno, meta.failover_log[0].uuid)
        return entries


def _set_expiry(op: PreparedOp, expiry: object, max_ttl: int, now_s: float) -> None:
    """``op``'s expiry to store, from the write's wire ``expiry`` and the keyspace's
    ``max_ttl`` at ``now_s`` (a delete stores none)."""
    if op.kind != "delete":
        op.expiry = resolve_expiry(check_wire_expiry(expiry), now_s, max_ttl)


def _ignore_expired(keyspace: str, partition: int, docid: str, cas: int) -> None:
    """``on_expired`` of an engine outside a data service: nothing deletes on access (the
    document is still never returned)."""


_cf_name = itemgetter(0)  # the lock order of ``_apply_chunk``'s partitions


def _docid_bytes(docid: object) -> bytes | None:
    """The UTF-8 bytes of a docid that passes ``check_docid``, else None (the caller then
    runs ``check_docid`` for its error)."""
    if type(docid) is not str or not docid:
        return None
    try:
        raw = docid.encode("utf-8")
    except UnicodeEncodeError:
        return None
    return raw if len(raw) <= MAX_DOCID_BYTES else None
