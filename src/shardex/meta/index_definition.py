"""Index definitions: what an index is, validated and in canonical form.

A definition is a plain ``msgspec`` struct because the DDL coordinator stores it in
its replicated StateContext and the Spark pipeline pickles it to executors. Expressions travel
as canonical *text* (``parse_expression(t).to_text()``), never as compiled closures (those do
not pickle): every process compiles a definition once and caches the result by id
(:func:`compile_definition`).

Rules chosen here (also in ``docs/decisions/0025-index-definitions-projector-router.md``):

* ``partition_by=None`` means **not partitioned**: one index partition (0), so
  ``num_partition`` must be 1. Partitioning by document id is explicit:
  ``partition_by=["META().id"]`` (``PARTITION BY HASH(META().id)``).
* The index partition of a document is ``crc32(encode_key(partition values)) % num_partition``:
  the data service's hash (``partition_of``) applied to the key codec's bytes, so equal values
  (``1`` and ``1.0``) land in the same slice. A MISSING partition value hashes like any other.
* A primary index (``is_primary``) has the single key ``META().id`` and no WHERE clause: it is
  stored exactly like a secondary index on ``META().id``, so scans and the planner need no
  special case.
* ``META()`` in an index expression exposes ``{"id": docid}`` only: the oracle must be able to
  evaluate a definition over plain documents, and a CAS would make every write a key change.
* Expressions must be deterministic and may not use query parameters (``$x``): they are
  evaluated by the pipeline, once, with no caller around to supply values.
* At most one key is an array key (``DISTINCT ARRAY v.x FOR v IN arr END``, see
  :mod:`shardex.meta.array_key`): the document then has one entry per element. Its compiled
  key function returns the list of element values (``CompiledIndex.array_pos`` says which).
"""

from __future__ import annotations

import re
import threading
import zlib
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import msgspec

from shardex.core.expr import (
    CompiledExpr,
    Expr,
    Field,
    Meta,
    Param,
    compile_expression,
    is_deterministic,
    parse_expression,
    walk,
)
from shardex.core.keycodec import encode_key
from shardex.errors import ErrorCode, ShardexError
from shardex.meta.array_key import array_key_of, compile_elements

__all__ = [
    "DOCID_EXPR",
    "MAX_INDEX_PARTITIONS",
    "MAX_INDEX_REPLICAS",
    "CompiledIndex",
    "IndexDefinition",
    "IndexKey",
    "check_num_replica",
    "compile_definition",
    "hash_partition",
    "index_partition_of",
    "make_definition",
    "partition_key_is_docid",
    "validate_definition",
]

DOCID_EXPR = "META().id"
MAX_INDEX_PARTITIONS = 1024
# Copies of each index partition beyond the first (Couchbase GSI's num_replica, same range).
MAX_INDEX_REPLICAS = 3
_ID_RE = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.\-]{0,99}")  # fullmatch: "$" passes "x\n"


class IndexKey(msgspec.Struct, frozen=True, kw_only=True):
    """One key part: canonical expression text and its sort direction."""

    expr: str
    desc: bool = False


class IndexDefinition(msgspec.Struct, frozen=True, kw_only=True):
    """What the DDL coordinator stores and the pipeline and indexers act on.

    ``id`` is unique for the life of the cluster (a dropped and re-created index gets a new
    one) and names the slices' column families, so it is kept to a safe alphabet.
    """

    id: str
    name: str
    keyspace: str
    keys: list[IndexKey] = msgspec.field(default_factory=list)
    where: str | None = None
    partition_by: list[str] | None = None
    num_partition: int = 1
    is_primary: bool = False

    @property
    def desc(self) -> list[bool]:
        return [k.desc for k in self.keys]

    @property
    def array_pos(self) -> int:
        """Position of the array key (one entry per element), or -1 when there is none."""
        for i, k in enumerate(self.keys):
            if array_key_of(k.expr) is not None:
                return i
        return -1


def _bad(message: str, **details: Any) -> ShardexError:
    return ShardexError(message, code=ErrorCode.BAD_REQUEST, details=details)


def _canonical(text: str, what: str) -> str:
    if not isinstance(text, str) or not text.strip():
        raise _bad(f"{what} must be a non-empty expression", value=repr(text))
    expr: Expr | None = array_key_of(text) if what == "key" else None
    if expr is None:
        expr = parse_expression(text)  # EXPRESSION_SYNTAX with line/column on error
    for node in walk(expr):
        if isinstance(node, Param):
            raise _bad(
                f"{what} {text!r} uses parameter ${node.name}",
                hint="index expressions are evaluated without parameters",
            )
    if not is_deterministic(expr):
        raise _bad(f"{what} {text!r} is not deterministic", hint="index keys must be")
    return expr.to_text()


def validate_definition(defn: IndexDefinition) -> IndexDefinition:
    """Check ``defn`` and return it in canonical form (expression texts re-printed).

    Raises ``ShardexError(BAD_REQUEST)`` or ``EXPRESSION_SYNTAX`` naming the bad part.
    """
    if not isinstance(defn.id, str) or not _ID_RE.fullmatch(defn.id):
        raise _bad(f"invalid index id {defn.id!r}", hint="1-100 of A-Z a-z 0-9 _ . -")
    if not defn.name or not defn.keyspace:
        raise _bad("an index needs a name and a keyspace", id=defn.id)
    keys = list(defn.keys)
    where = defn.where
    if defn.is_primary:
        if keys and [(_canonical(k.expr, "key"), k.desc) for k in keys] != [(DOCID_EXPR, False)]:
            raise _bad("a primary index has the single key META().id", id=defn.id)
        if where is not None:
            raise _bad("a primary index has no WHERE clause", id=defn.id)
        keys = [IndexKey(expr=DOCID_EXPR)]
    if not keys:
        raise _bad("an index needs at least one key expression", id=defn.id)
    keys = [IndexKey(expr=_canonical(k.expr, "key"), desc=bool(k.desc)) for k in keys]
    arrays = [k.expr for k in keys if array_key_of(k.expr) is not None]
    if len(arrays) > 1:
        raise _bad(
            "an index has at most one array key",
            keys=arrays,
            hint="index the other array in an index of its own",
        )
    if where is not None:
        where = _canonical(where, "WHERE clause")
    n = defn.num_partition
    if isinstance(n, bool) or not isinstance(n, int) or not 1 <= n <= MAX_INDEX_PARTITIONS:
        raise _bad(f"num_partition must be in 1..{MAX_INDEX_PARTITIONS}", value=repr(n))
    partition_by = defn.partition_by
    if partition_by is None:
        if n != 1:
            raise _bad(
                "an index without PARTITION BY has exactly one partition",
                num_partition=n,
                hint='use partition_by=["META().id"] to partition by document id',
            )
    else:
        if not partition_by:
            raise _bad("PARTITION BY needs at least one expression", id=defn.id)
        partition_by = [_canonical(t, "partition key") for t in partition_by]
    return msgspec.structs.replace(defn, keys=keys, where=where, partition_by=partition_by)


def make_definition(
    *,
    id: str,
    name: str,
    keyspace: str,
    keys: Sequence[str | tuple[str, bool] | IndexKey] = (),
    where: str | None = None,
    partition_by: Sequence[str] | None = None,
    num_partition: int = 1,
    is_primary: bool = False,
) -> IndexDefinition:
    """Build and validate a definition; keys as text, ``(text, desc)`` or ``IndexKey``."""
    parts: list[IndexKey] = []
    for k in keys:
        if isinstance(k, IndexKey):
            parts.append(k)
        elif isinstance(k, str):
            parts.append(IndexKey(expr=k))
        else:
            parts.append(IndexKey(expr=k[0], desc=bool(k[1])))
    return validate_definition(
        IndexDefinition(
            id=id,
            name=name,
            keyspace=keyspace,
            keys=parts,
            where=where,
            partition_by=list(partition_by) if partition_by is not None else None,
            num_partition=num_partition,
            is_primary=is_primary,
        )
    )


def _is_docid_expr(expr: Expr) -> bool:
    return isinstance(expr, Field) and expr.name == "id" and isinstance(expr.base, Meta)


def partition_key_is_docid(defn: IndexDefinition) -> bool:
    """True when an entry's slice follows from the docid alone (``HASH(META().id)``) or the
    index is unpartitioned: an update can then never move an entry to another slice, so the
    router sends every key version to one slice only."""
    if defn.partition_by is None:
        return True
    return len(defn.partition_by) == 1 and _is_docid_expr(parse_expression(defn.partition_by[0]))


def hash_partition(encoded_key: bytes, num_partition: int) -> int:
    """The index partition of an encoded partition key: same crc32 as the data service."""
    return zlib.crc32(encoded_key) % num_partition


@dataclass(frozen=True, slots=True)
class CompiledIndex:
    """A definition compiled for this process. ``partition_fns`` is empty when unpartitioned;
    ``docid_partitioned`` lets callers compute the slice of a deletion from its docid."""

    defn: IndexDefinition
    where_fn: CompiledExpr | None
    key_fns: tuple[CompiledExpr, ...]
    desc: tuple[bool, ...]
    partition_fns: tuple[CompiledExpr, ...]
    docid_partitioned: bool
    moving: bool  # the partition key can change on update: Upsert/UpsertDeletion broadcast
    array_pos: int = -1  # the array key's position: its key_fn returns the element values

    def partition_of_docid(self, docid: str) -> int:
        """Slice of a document when the partition key is the docid (or there is none)."""
        if not self.partition_fns:
            return 0
        return hash_partition(encode_key([docid]), self.defn.num_partition)


def _key_fn(text: str) -> CompiledExpr:
    array = array_key_of(text)
    return compile_expression(text) if array is None else compile_elements(array)  # type: ignore[return-value]


_cache: dict[str, CompiledIndex] = {}
_cache_lock = threading.Lock()


def compile_definition(defn: IndexDefinition) -> CompiledIndex:
    """Compile once per process and definition (cached by id; a changed definition under the
    same id is recompiled). The definition is assumed validated (canonical texts)."""
    hit = _cache.get(defn.id)
    if hit is not None and hit.defn == defn:
        return hit
    docid_part = partition_key_is_docid(defn)
    compiled = CompiledIndex(
        defn=defn,
        where_fn=compile_expression(defn.where) if defn.where is not None else None,
        key_fns=tuple(_key_fn(k.expr) for k in defn.keys),
        desc=tuple(k.desc for k in defn.keys),
        partition_fns=tuple(compile_expression(t) for t in defn.partition_by or ()),
        docid_partitioned=docid_part and defn.partition_by is not None,
        moving=not docid_part,
        array_pos=defn.array_pos,
    )
    with _cache_lock:
        _cache[defn.id] = compiled
    return compiled


def index_partition_of(defn: IndexDefinition, doc: Any, docid: str) -> int:
    """The index partition (slice) a document's entry belongs to. Raises on an evaluation
    error (the projector counts those per document)."""
    c = compile_definition(defn)
    if not c.partition_fns:
        return 0
    if c.docid_partitioned:
        return c.partition_of_docid(docid)
    meta = {"id": docid}
    values = [f(doc, meta) for f in c.partition_fns]
    return hash_partition(encode_key(values), defn.num_partition)


def check_num_replica(value: object) -> int:
    """``num_replica`` as given by a caller: an int in 0..MAX_INDEX_REPLICAS, else BAD_REQUEST."""
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    if (
        isinstance(value, bool)
        or not isinstance(value, int)
        or not 0 <= value <= MAX_INDEX_REPLICAS
    ):
        raise ShardexError(
            f"num_replica must be an integer in 0..{MAX_INDEX_REPLICAS}, got {value!r}",
            code=ErrorCode.BAD_REQUEST,
            details={
                "num_replica": repr(value),
                "max": MAX_INDEX_REPLICAS,
                "hint": "each replica is a full copy of every index partition on another "
                "indexer: at most one fewer than the indexers",
            },
        )
    return value
