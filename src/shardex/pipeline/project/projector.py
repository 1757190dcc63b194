"""Projector core: change records in, key versions out. Pure functions, no Spark, no network.

The Spark job calls :func:`project_arrow` from ``mapInArrow`` (or :func:`map_in_arrow_fn`),
and tests and small driver-side batches call :func:`project` directly. Both run the same
loop: decode each JSON body once (msgspec), evaluate every index of the keyspace in one pass
over the document (an expression text shared by several indexes, such as a common leading key
or a partition key that is also a key, is evaluated once per document), and encode entries
with the key codec. Index sets made of plain paths (and ``path op constant`` filters) take
the column-at-a-time path of :mod:`shardex.pipeline.project.columnar` instead, with identical
results; ``Projector(defs, fast=False)`` keeps the loop.

Rules (the SQL++/N1QL rules; stated again in
``docs/decisions/0025-index-definitions-projector-router.md``):

* WHERE: a document is in the index only if the WHERE clause's N1QL truth value is true
  (``ops.truth``: MISSING, NULL, false, 0, "", [] and {} are false).
* Leading key MISSING: the document is **not indexed** (N1QL: an index entry needs its
  leading key; ``WHERE k IS MISSING`` cannot use an index on ``k``). A MISSING non-leading
  key is kept and encoded as MISSING (it sorts first), as N1QL does.
* Key too large: an encoded entry over ``MAX_ENTRY_BYTES`` (4608) is an evaluation error.
* Evaluation error (an exception from an expression, a non-finite number in a key): the
  document is treated as not indexed for that index, the error is counted per index and a
  few samples are kept. Never raised: one bad document must not stop the pipeline.
* "Not indexed" always emits an ``UPSERT_DELETION`` so an entry from an older version of the
  document goes away; the back index turns it into nothing when there is none.
* A delete emits ``DELETE`` for every index.
* Array key (``DISTINCT ARRAY v.x FOR v IN arr END``): one entry per element value, all of a
  document's entries packed into the one ``UPSERT`` (``keyversion.pack_entries``); no
  elements with the array key leading: not indexed; no elements elsewhere: one entry with
  MISSING in the array part (``shardex.meta.array_key``).
* Slice of a key version: the hash of the partition key for ``UPSERT``; for
  ``UPSERT_DELETION`` and ``DELETE`` the owner when the partition key is the docid (or the
  index is unpartitioned), else ``BROADCAST`` (-1): the old value is unknown (the change
  stream carries the new document only), so the router sends them to every slice.

The row layout is documented in :mod:`shardex.index.keyversion`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, Final, NamedTuple
from zlib import crc32

import msgspec
import pyarrow as pa

from shardex.core.expr.ops import truth
from shardex.core.keycodec import encode_value
from shardex.core.keycodec_values import INVERT, TAG_DOCID, TAG_STR, str_body
from shardex.core.values import MISSING
from shardex.index.keyversion import (
    BROADCAST,
    DELETE,
    ERROR,
    MAX_ENTRY_BYTES,
    MAX_PACKED_BYTES,
    UPSERT,
    UPSERT_DELETION,
    KeyVersion,
    pack_entries,
    to_arrow,
)
from shardex.meta.index_definition import (
    IndexDefinition,
    compile_definition,
)
from shardex.pipeline.project.columnar import build_fast_path

__all__ = [
    "CHANGE_SCHEMA",
    "MAX_ENTRY_BYTES",
    "OP_DELETE",
    "OP_UPSERT",
    "ChangeRow",
    "EvalError",
    "KeyTooLarge",
    "ProjectResult",
    "Projector",
    "map_in_arrow_fn",
    "project",
    "project_arrow",
]

OP_UPSERT: Final = "upsert"
OP_DELETE: Final = "delete"
MAX_ERROR_SAMPLES: Final = 10


class KeyTooLarge(ValueError):
    """An index entry longer than ``MAX_ENTRY_BYTES``."""


ChangeRow = tuple[str, int, int, str, bytes | None]  # (docid, partition, seqno, op, body JSON)

CHANGE_SCHEMA: Final = pa.schema(
    [
        ("docid", pa.string()),
        ("partition", pa.int32()),
        ("seqno", pa.int64()),
        ("op", pa.string()),
        ("body", pa.binary()),  # null for a delete
    ]
)

_UNSET: Final = object()
_B_DOCID: Final = bytes((TAG_DOCID,))
_B_STR: Final = bytes((TAG_STR,))


class EvalError(NamedTuple):
    """One document whose evaluation failed for one index."""

    index_id: str
    docid: str
    partition: int
    seqno: int
    message: str


@dataclass(slots=True)
class ProjectResult:
    """Key versions of a batch plus its evaluation-error report.

    ``errors``: index id -> number of documents whose evaluation failed (absent when none);
    ``samples``: the first few failures for the operator (all of them when asked for).
    """

    rows: list[KeyVersion] = field(default_factory=list)
    errors: dict[str, int] = field(default_factory=dict)
    samples: list[EvalError] = field(default_factory=list)
    documents: int = 0

    def merge(self, other: ProjectResult) -> None:
        self.rows.extend(other.rows)
        for k, v in other.errors.items():
            self.errors[k] = self.errors.get(k, 0) + v
        room = MAX_ERROR_SAMPLES - len(self.samples)
        if room > 0:
            self.samples.extend(other.samples[:room])
        self.documents += other.documents


@dataclass(frozen=True, slots=True)
class _Plan:
    """One index, lowered to slot numbers in the projector's shared expression table."""

    index_id: str
    where_slot: int  # -1: no WHERE
    key_slots: tuple[tuple[int, bool], ...]  # (slot, desc)
    part_slots: tuple[int, ...]  # empty: unpartitioned or by docid
    num_partition: int
    docid_partitioned: bool
    moving: bool
    array_pos: int = -1  # the array key's position in key_slots (-1: none)


class Projector:
    """Compiled form of one keyspace's index set, reused for every batch.

    Expression texts are deduplicated across the indexes into one table of compiled
    functions (slots). Per document, each slot is evaluated at most once and encoded at most
    once, lazily: a text shared by two indexes (or a partition key that is also a key) costs
    one evaluation and one encoding, and keys of a filtered-out index are never evaluated.
    Entries are assembled from the encoded parts exactly as ``encode_entry`` lays them out
    (``key parts + 02 + docid``, DESC parts inverted); the oracle, which calls
    ``encode_entry``, checks the two agree.
    """

    def __init__(self, definitions: Sequence[IndexDefinition], *, fast: bool = True) -> None:
        self.definitions = tuple(definitions)
        texts: dict[str, int] = {}
        fns: list[Callable[..., Any]] = []

        def slot(text: str, fn: Callable[..., Any]) -> int:
            if text not in texts:
                texts[text] = len(fns)
                fns.append(fn)
            return texts[text]

        plans = []
        for d in self.definitions:
            c = compile_definition(d)
            where_slot = slot(d.where, c.where_fn) if d.where is not None and c.where_fn else -1
            key_slots = tuple(
                (slot(k.expr, f), k.desc) for k, f in zip(d.keys, c.key_fns, strict=True)
            )
            part_slots: tuple[int, ...] = ()
            if c.moving:
                part_slots = tuple(
                    slot(t, f) for t, f in zip(d.partition_by or (), c.partition_fns, strict=True)
                )
            plans.append(
                _Plan(
                    index_id=d.id,
                    where_slot=where_slot,
                    key_slots=key_slots,
                    part_slots=part_slots,
                    num_partition=d.num_partition,
                    docid_partitioned=c.docid_partitioned,
                    moving=c.moving,
                    array_pos=c.array_pos,
                )
            )
        self._plans = tuple(plans)
        self._fns = tuple(fns)
        wheres = frozenset(pl.where_slot for pl in self._plans if pl.where_slot >= 0)
        arrays = any(pl.array_pos >= 0 for pl in self._plans)
        self._fast = (
            build_fast_path(self._plans, list(texts), wheres) if fast and not arrays else None
        )

    @property
    def fast(self) -> bool:
        """Whether batches take the column-at-a-time path (``columnar.py``)."""
        return self._fast is not None

    def project(
        self, changes: Iterable[ChangeRow], *, sample_limit: int | None = MAX_ERROR_SAMPLES
    ) -> ProjectResult:
        """Key versions for ``changes``, one row per (change, index), in input order.

        ``sample_limit``: how many failures to keep in ``samples`` (None: all of them).
        """
        if self._fast is not None:
            cols = [list(c) for c in zip(*changes, strict=True)] or [[], [], [], [], []]
            return self.project_columns(*cols, sample_limit=sample_limit)
        res = ProjectResult()
        limit = sample_limit if sample_limit is not None else 1 << 62
        res.documents = self._project_into(res, changes, limit)
        return res

    def project_columns(
        self,
        docids: list[str],
        parts: list[int],
        seqnos: list[int],
        ops: list[str],
        bodies: list[bytes | None],
        *,
        sample_limit: int | None = MAX_ERROR_SAMPLES,
    ) -> ProjectResult:
        """:meth:`project` of changes given as columns (what an Arrow batch holds): the
        fast path when the index set has one, else the general loop."""
        res = ProjectResult()
        limit = sample_limit if sample_limit is not None else 1 << 62
        if self._fast is None:
            changes = zip(docids, parts, seqnos, ops, bodies, strict=True)
            res.documents = self._project_into(res, changes, limit)
            return res

        def slow(i: int) -> None:
            row = (docids[i], parts[i], seqnos[i], ops[i], bodies[i])
            self._project_into(res, (row,), limit)

        self._fast.project(docids, parts, seqnos, ops, bodies, slow, res.rows.extend)
        res.documents = len(docids)
        return res

    def _project_into(self, res: ProjectResult, changes: Iterable[ChangeRow], limit: int) -> int:
        """The general loop: appends to ``res``; returns the number of changes."""
        append = res.rows.append
        plans, fns = self._plans, self._fns
        nslots = len(fns)
        decode = msgspec.json.decode
        n = 0
        for docid, part, seqno, op, body in changes:
            n += 1
            memo: dict[int, int] = {}
            if op == OP_DELETE or body is None:
                for pl in plans:
                    dest = _owner(pl, docid, memo)
                    append((pl.index_id, dest, DELETE, b"", docid, part, seqno))
                continue
            try:
                doc = decode(body)
            except Exception as exc:  # not JSON: not indexed anywhere, counted per index
                for pl in plans:
                    _error(res, limit, pl.index_id, docid, part, seqno, exc)
                    dest = _owner(pl, docid, memo)
                    append((pl.index_id, dest, UPSERT_DELETION, b"", docid, part, seqno))
                continue
            meta = {"id": docid}
            vals: list[Any] = [_UNSET] * nslots
            enc: list[Any] = [None] * nslots
            suffix = b""
            for pl in plans:
                try:
                    s = pl.where_slot
                    if s >= 0:
                        w = vals[s]
                        if w is _UNSET:
                            w = vals[s] = fns[s](doc, meta)
                        if not truth(w):
                            dest = _owner(pl, docid, memo)
                            append((pl.index_id, dest, UPSERT_DELETION, b"", docid, part, seqno))
                            continue
                    if not suffix:
                        suffix = _B_DOCID + str_body(docid)
                    if pl.array_pos >= 0:
                        entry = _packed_entries(pl, vals, enc, fns, doc, meta, suffix)
                        if not entry:  # no elements under a leading array key
                            dest = _owner(pl, docid, memo)
                            append((pl.index_id, dest, UPSERT_DELETION, b"", docid, part, seqno))
                            continue
                    else:
                        s = pl.key_slots[0][0]
                        v = vals[s]
                        if v is _UNSET:
                            v = vals[s] = fns[s](doc, meta)
                        if v is MISSING:  # leading key MISSING: not indexed
                            dest = _owner(pl, docid, memo)
                            append((pl.index_id, dest, UPSERT_DELETION, b"", docid, part, seqno))
                            continue
                        parts = []
                        for s, desc in pl.key_slots:
                            e = enc[s]
                            if e is None:
                                v = vals[s]
                                if v is _UNSET:
                                    v = vals[s] = fns[s](doc, meta)
                                e = enc[s] = encode_value(v)
                            parts.append(e.translate(INVERT) if desc else e)
                        parts.append(suffix)
                        entry = _checked(b"".join(parts))
                    if pl.moving:
                        pparts = []
                        for s in pl.part_slots:
                            e = enc[s]
                            if e is None:
                                v = vals[s]
                                if v is _UNSET:
                                    v = vals[s] = fns[s](doc, meta)
                                e = enc[s] = encode_value(v)
                            pparts.append(e)
                        dest = crc32(b"".join(pparts)) % pl.num_partition
                    else:
                        dest = _owner(pl, docid, memo)
                    append((pl.index_id, dest, UPSERT, entry, docid, part, seqno))
                except Exception as exc:
                    _error(res, limit, pl.index_id, docid, part, seqno, exc)
                    dest = _owner(pl, docid, memo)
                    append((pl.index_id, dest, UPSERT_DELETION, b"", docid, part, seqno))
        return n


def _checked(entry: bytes) -> bytes:
    if len(entry) > MAX_ENTRY_BYTES:
        raise KeyTooLarge(
            f"index entry of {len(entry)} bytes exceeds the {MAX_ENTRY_BYTES}-byte limit"
        )
    return entry


def _packed_entries(
    pl: _Plan,
    vals: list[Any],
    enc: list[Any],
    fns: Sequence[Callable[..., Any]],
    doc: Any,
    meta: Any,
    suffix: bytes,
) -> bytes:
    """The packed entries of a document in an index with an array key: one per distinct
    element value; b"" when there is none under a leading array key (not indexed). The
    other key parts are encoded once and shared by every entry."""
    head: list[bytes] = []
    tail: list[bytes] = []
    elements: list[Any] = []
    desc_array = False
    for i, (s, desc) in enumerate(pl.key_slots):
        v = vals[s]
        if v is _UNSET:
            v = vals[s] = fns[s](doc, meta)
        if i == pl.array_pos:
            elements, desc_array = v, desc
            continue
        if i == 0 and v is MISSING:  # leading key MISSING: not indexed
            return b""
        e = enc[s]
        if e is None:
            e = enc[s] = encode_value(v)
        (head if i < pl.array_pos else tail).append(e.translate(INVERT) if desc else e)
    if not elements:
        if pl.array_pos == 0:
            return b""
        elements = [MISSING]
    before, after = b"".join(head), b"".join(tail) + suffix
    entries = []
    for v in elements:
        e = encode_value(v)
        entries.append(_checked(before + (e.translate(INVERT) if desc_array else e) + after))
    packed = pack_entries(entries)
    if len(packed) > MAX_PACKED_BYTES:
        raise KeyTooLarge(
            f"the document's {len(entries)} array index entries take {len(packed)} bytes, "
            f"over the {MAX_PACKED_BYTES}-byte limit"
        )
    return packed


def _owner(pl: _Plan, docid: str, memo: dict[int, int]) -> int:
    """The slice of a removal: known unless the partition key can move (then BROADCAST)."""
    if pl.moving:
        return BROADCAST
    if not pl.docid_partitioned:
        return 0
    p = memo.get(pl.num_partition)
    if p is None:
        # hash_partition(encode_key([docid])) without the generic encoder: a docid is a
        # string, whose key encoding is its tag and str_body (test_projector checks they agree).
        p = memo[pl.num_partition] = crc32(_B_STR + str_body(docid)) % pl.num_partition
    return p


def _error(
    res: ProjectResult,
    limit: int,
    index_id: str,
    docid: str,
    part: int,
    seqno: int,
    exc: BaseException,
) -> None:
    res.errors[index_id] = res.errors.get(index_id, 0) + 1
    if len(res.samples) < limit:
        msg = f"{type(exc).__name__}: {exc}"[:300]
        res.samples.append(EvalError(index_id, docid, part, seqno, msg))


_projectors: dict[tuple[str, ...], Projector] = {}


def _projector_for(definitions: Sequence[IndexDefinition]) -> Projector:
    # Keyed by index ids, checked by value (definitions hold lists, so they do not hash):
    # a changed index set gets a fresh projector. Bounded: index sets change rarely.
    key = tuple(d.id for d in definitions)
    pr = _projectors.get(key)
    if pr is not None and pr.definitions == tuple(definitions):
        return pr
    if len(_projectors) > 64:
        _projectors.clear()
    pr = _projectors[key] = Projector(definitions)
    return pr


def project(definitions: Sequence[IndexDefinition], changes: Iterable[ChangeRow]) -> ProjectResult:
    """Key versions of ``changes`` for every index in ``definitions`` (compiled once per
    process and index set). Which indexes to pass (BUILDING/ACTIVE) is the caller's call."""
    return _projector_for(definitions).project(changes)


def _columns_of(
    batch: pa.RecordBatch,
) -> tuple[list[str], list[int], list[int], list[str], list[bytes | None]]:
    """(docids, partitions, seqnos, ops, bodies) of a batch with ``CHANGE_SCHEMA``'s columns,
    or of the change source's batches (``deleted`` flag instead of ``op``; ``uuid`` and
    ``cas`` ignored)."""
    names = batch.schema.names
    col = batch.column
    if "op" not in names and "deleted" in names:
        ops = [OP_DELETE if d else OP_UPSERT for d in col(names.index("deleted")).to_pylist()]
    else:
        ops = col(names.index("op")).to_pylist()
    return (
        col(names.index("docid")).to_pylist(),
        col(names.index("partition")).to_pylist(),
        col(names.index("seqno")).to_pylist(),
        ops,
        col(names.index("body")).to_pylist(),
    )


def _changes_of(batch: pa.RecordBatch) -> Iterator[ChangeRow]:
    """Change rows of a batch (see :func:`_columns_of`)."""
    return zip(*_columns_of(batch), strict=True)  # type: ignore[return-value]


def project_arrow(
    definitions: Sequence[IndexDefinition],
    batch: pa.RecordBatch,
    *,
    error_rows: bool = False,
) -> tuple[pa.RecordBatch, ProjectResult]:
    """Project a RecordBatch with (at least) ``CHANGE_SCHEMA``'s columns.

    Returns the key versions as a ``KEY_VERSION_SCHEMA`` batch and the result (whose ``rows``
    are the same key versions as tuples). With ``error_rows`` every evaluation error also
    becomes an ``ERROR`` row (entry = UTF-8 message) so errors can be counted downstream of
    ``mapInArrow``, which has no other channel back to the driver.
    """
    limit = None if error_rows else MAX_ERROR_SAMPLES
    res = _projector_for(definitions).project_columns(*_columns_of(batch), sample_limit=limit)
    rows = res.rows
    if error_rows and res.samples:
        rows = rows + [
            (e.index_id, BROADCAST, ERROR, e.message.encode(), e.docid, e.partition, e.seqno)
            for e in res.samples
        ]
    return to_arrow(rows), res


def map_in_arrow_fn(
    definitions: Sequence[IndexDefinition], *, error_rows: bool = True
) -> Callable[[Iterator[pa.RecordBatch]], Iterator[pa.RecordBatch]]:
    """The function to hand to ``DataFrame.mapInArrow(fn, KEY_VERSION_SCHEMA)``.

    Only the definitions (plain msgspec structs, picklable) are captured; compilation happens
    on the executor at the first batch and is cached there for the task's process.
    """
    defs = tuple(definitions)

    def fn(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        for b in batches:
            out, _ = project_arrow(defs, b, error_rows=error_rows)
            yield out

    return fn
