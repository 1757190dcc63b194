"""The projector's column-at-a-time fast path for the common index shapes.

Most index definitions use keys that are plain field paths (``email``, ``address.city``) or
``META().id``, and WHERE clauses that compare one such path with a constant
(``status = 'active'``). For an index set made only of those, a batch is projected a column
at a time instead of a document at a time:

1. each body is decoded by msgspec into a generated Struct holding only the top-level fields
   the expressions reference (the others are skipped inside the decoder, never built);
2. every expression becomes a column of values (a path is read off the Struct, then down
   nested objects with the general path reader), every WHERE a column of truth values (the
   same comparator functions the expression compiler uses), every key part a column of
   encodings (the key codec's ``encode_value``);
3. entries and key-version tuples are assembled with comprehensions, one list per index,
   interleaved into the general path's order (per change, per index).

Exactness: the output (rows, error counts, samples, document count) equals the general
path's for every batch (``tests/unit/pipeline/test_projector_fast.py`` checks it with hypothesis on
random documents of odd shapes). A row the fast path cannot handle exactly (a body that is
not a JSON object or not JSON at all, a value the codec rejects, an entry over the size
limit) is handed to the general path on its own, in its place. Which index sets qualify is
decided once per ``Projector`` (:func:`build_fast_path`); anything else stays on the general
path.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from itertools import chain
from operator import attrgetter
from typing import TYPE_CHECKING, Any, Final
from zlib import crc32

import msgspec

from shardex.core.expr import Field, Identifier, Literal, Meta, parse_expression
from shardex.core.expr.analysis import static_path
from shardex.core.expr.ast import BinaryOp
from shardex.core.expr.ops import COMPARATORS, truth
from shardex.core.expr.paths import compile_path
from shardex.core.keycodec import encode_value
from shardex.core.keycodec_values import _SMALL, INVERT, STR_TERM, TAG_DOCID, TAG_STR
from shardex.core.values import MISSING
from shardex.index.keyversion import (
    BROADCAST,
    DELETE,
    MAX_ENTRY_BYTES,
    UPSERT,
    UPSERT_DELETION,
    KeyVersion,
)

if TYPE_CHECKING:
    from shardex.pipeline.project.projector import _Plan

__all__ = ["FastPath", "build_fast_path"]

OP_DELETE: Final = "delete"  # projector.OP_DELETE (not imported: that module imports this)
MAX_FIELDS: Final = 64  # top-level fields in the generated Struct; more: general path
_B_DOCID: Final = bytes((TAG_DOCID,))
_B_STR: Final = bytes((TAG_STR,))
_MIRROR: Final = {"=": "=", "!=": "!=", "<": ">", "<=": ">=", ">": "<", ">=": "<="}


@dataclass(frozen=True, slots=True)
class _Path:
    """A plain path: the Struct field of its first step, the reader of the rest."""

    field: int  # index into the Struct's fields; -1: META().id
    rest: Callable[..., Any] | None  # None: the path is one step


@dataclass(frozen=True, slots=True)
class _Compare:
    """``path <op> constant`` (a constant on the left is mirrored), or a bare path (op "")."""

    path: _Path
    op: str
    const: Any


def _docid_expr(expr: Any) -> bool:
    return isinstance(expr, Field) and expr.name == "id" and isinstance(expr.base, Meta)


class _Lowering:
    """Expression texts -> column programs; ``None`` for any shape the fast path lacks."""

    def __init__(self) -> None:
        self.fields: dict[str, int] = {}

    def path(self, expr: Any) -> _Path | None:
        if _docid_expr(expr):
            if expr.base.keyspace is not None:
                return None  # META(ks).id: leave the keyspace check to the evaluator
            return _Path(-1, None)
        steps = static_path(expr)
        if steps is None or not all(type(s) is str for s in steps):
            return None
        if not isinstance(expr, (Identifier, Field)) or steps[0] == "":
            return None
        i = self.fields.setdefault(steps[0], len(self.fields))
        return _Path(i, compile_path(steps[1:]) if len(steps) > 1 else None)

    def slot(self, text: str, where: bool) -> _Path | _Compare | None:
        expr = parse_expression(text)
        if not where:
            return self.path(expr)
        if isinstance(expr, BinaryOp) and expr.op in COMPARATORS:
            left, right, op = expr.left, expr.right, expr.op
            if isinstance(left, Literal) and not isinstance(right, Literal):
                left, right, op = right, left, _MIRROR[op]
            if not isinstance(right, Literal):
                return None
            p = self.path(left)
            return None if p is None else _Compare(p, op, right.value)
        p = self.path(expr)
        return None if p is None else _Compare(p, "", None)


def build_fast_path(
    plans: Sequence[_Plan], texts: Sequence[str], where_slots: frozenset[int]
) -> FastPath | None:
    """The fast path for this index set, or None when some expression is not a plain path
    (keys, partition keys) or a path compared with a constant (WHERE)."""
    low = _Lowering()
    programs: list[_Path | _Compare] = []
    for s, text in enumerate(texts):
        try:
            prog = low.slot(text, s in where_slots)
        except Exception:  # an expression the parser reads differently: not ours to judge
            return None
        if prog is None:
            return None
        programs.append(prog)
    if len(low.fields) > MAX_FIELDS:
        return None
    # A WHERE text that is also a key (``WHERE verified`` with a key ``verified``) shares
    # its slot: as a key it needs the value, so only a bare path may be shared.
    valued = {s for pl in plans for s, _ in pl.key_slots} | {
        s for pl in plans for s in pl.part_slots
    }
    for s in valued:
        prog = programs[s]
        if isinstance(prog, _Compare) and prog.op:
            return None
    return FastPath(plans, programs, list(low.fields))


class FastPath:
    """Column programs of one index set; :meth:`project` runs a batch through them."""

    def __init__(
        self, plans: Sequence[_Plan], programs: Sequence[_Path | _Compare], fields: list[str]
    ) -> None:
        self.plans = tuple(plans)
        self.programs = tuple(programs)
        names = [f"f{i}" for i in range(len(fields))]
        struct = msgspec.defstruct(
            "ProjectedFields",
            [(n, Any, MISSING) for n in names],
            rename=dict(zip(names, fields, strict=True)),
        )
        self._decode = msgspec.json.Decoder(struct).decode
        self._getters = tuple(attrgetter(n) for n in names)

    def project(
        self,
        docids: list[str],
        parts: list[int],
        seqnos: list[int],
        ops: list[str],
        bodies: list[bytes | None],
        slow: Callable[[int], None],
        append_rows: Callable[[list[KeyVersion]], None],
    ) -> None:
        """Key versions of the batch's changes, in the general path's order, through
        ``append_rows``; ``slow(i)`` projects change ``i`` on the general path (in place)."""
        n = len(docids)
        decode = self._decode
        fallback = bytearray(n)  # 1: the general path projects this change
        deleted = bytearray(n)
        recs: list[Any]
        try:  # the common batch: upserts of JSON objects only, one comprehension
            if OP_DELETE in ops:
                raise ValueError("a deletion")
            recs = [decode(b) for b in bodies]  # type: ignore[arg-type]
        except (msgspec.DecodeError, msgspec.ValidationError, TypeError, ValueError):
            recs = [None] * n
            for i in range(n):
                body = bodies[i]
                if body is None or ops[i] == OP_DELETE:
                    deleted[i] = 1
                    continue
                try:
                    recs[i] = decode(body)
                except (msgspec.DecodeError, msgspec.ValidationError):
                    fallback[i] = 1  # not JSON, or not an object: the general path says so
            # Deletions and fallbacks get an empty record: MISSING everywhere, never used.
            empty = _EmptyRecord()
            recs = [empty if r is None else r for r in recs]
        values = [self._values(p, recs, docids) for p in self.programs]
        encoded: list[list[bytes] | None] = [None] * len(values)
        # The docid's string body serves the entry suffix and the owner hash of removals.
        bodies_of_ids = [
            d.encode("utf-8", "surrogatepass").replace(b"\x00", b"\x00\xff") + STR_TERM
            for d in docids
        ]  # ``keycodec_values.str_body`` of each, inlined: a call per docid cost as much
        suffixes = [_B_DOCID + b for b in bodies_of_ids]
        owners: dict[int, list[int]] = {}
        per_index: list[list[KeyVersion]] = []
        for pl in self.plans:
            for s, _desc in pl.key_slots:
                if encoded[s] is None:
                    encoded[s] = _encode_column(values[s], fallback)
            key_cols = [
                [e.translate(INVERT) for e in encoded[s]] if desc else encoded[s]  # type: ignore[union-attr]
                for s, desc in pl.key_slots
            ]
            if len(key_cols) == 1:
                joined = [a + b for a, b in zip(key_cols[0], suffixes, strict=True)]
            else:
                joined = [b"".join(t) for t in zip(*key_cols, suffixes, strict=True)]
            lead = values[pl.key_slots[0][0]]
            if pl.where_slot >= 0:
                keep = _truth_column(self.programs[pl.where_slot], values[pl.where_slot])
                entries: list[bytes | None] = [
                    e if k and v is not MISSING else None
                    for e, k, v in zip(joined, keep, lead, strict=True)
                ]
            else:
                entries = [
                    e if v is not MISSING else None for e, v in zip(joined, lead, strict=True)
                ]
            if any(deleted) or any(fallback):
                entries = [
                    None if x or f else e
                    for e, x, f in zip(entries, deleted, fallback, strict=True)
                ]
            if max(map(len, joined), default=0) > MAX_ENTRY_BYTES:
                for i, e in enumerate(entries):
                    if e is not None and len(e) > MAX_ENTRY_BYTES:
                        fallback[i] = 1  # the general path reports KeyTooLarge
                        entries[i] = None
            owner = self._owners(pl, bodies_of_ids, owners)
            if pl.moving:
                for s in pl.part_slots:
                    if encoded[s] is None:
                        encoded[s] = _encode_column(values[s], fallback)
                pcols = [encoded[s] for s in pl.part_slots]
                dests: list[int] = [
                    crc32(b"".join(t)) % pl.num_partition
                    for t in zip(*pcols, strict=True)  # type: ignore[call-overload]
                ]
            else:
                dests = owner
            iid = pl.index_id
            per_index.append(
                [
                    (iid, d, UPSERT, e, docid, p, q)
                    if e is not None
                    else (iid, o, DELETE if x else UPSERT_DELETION, b"", docid, p, q)
                    for e, d, o, x, docid, p, q in zip(
                        entries, dests, owner, deleted, docids, parts, seqnos, strict=True
                    )
                ]
            )
        if not any(fallback):
            if len(per_index) == 1:
                append_rows(per_index[0])
            else:
                append_rows(list(chain.from_iterable(zip(*per_index, strict=True))))
            return
        start = 0
        for i in range(n + 1):
            if i == n or fallback[i]:
                if i > start:
                    cols = [r[start:i] for r in per_index]
                    append_rows(list(chain.from_iterable(zip(*cols, strict=True))))
                if i < n:
                    slow(i)
                start = i + 1

    def _values(self, prog: _Path | _Compare, recs: list[Any], docids: list[str]) -> list[Any]:
        path = prog.path if isinstance(prog, _Compare) else prog
        if path.field < 0:
            return docids
        top = list(map(self._getters[path.field], recs))
        rest = path.rest
        if rest is None:
            return top
        # ``rest`` reads like the general path's ``d[k0][k1]``: only a dict has fields.
        return [rest(v) if type(v) is dict else MISSING for v in top]

    @staticmethod
    def _owners(pl: _Plan, id_bodies: list[bytes], memo: dict[int, list[int]]) -> list[int]:
        """The slice of each change's removals (``projector._owner``), as a column; the
        docids are given as their string bodies (the docid's key encoding minus its tag)."""
        if pl.moving:
            return [BROADCAST] * len(id_bodies)
        if not pl.docid_partitioned:
            return [0] * len(id_bodies)
        col = memo.get(pl.num_partition)
        if col is None:
            k = pl.num_partition
            col = memo[k] = [crc32(_B_STR + b) % k for b in id_bodies]
        return col


class _EmptyRecord:
    """Stands in for a deleted or fallback change's record: every field MISSING."""

    def __getattr__(self, name: str) -> Any:
        return MISSING


def _truth_column(prog: _Path | _Compare, vals: list[Any]) -> list[bool]:
    """N1QL truth of the WHERE per change, with the comparators the compiler uses."""
    assert isinstance(prog, _Compare)
    op, c = prog.op, prog.const
    if op == "":
        return [truth(v) for v in vals]
    if op == "=" and type(c) is str:
        # ops.equals: a str equals a str constant by value; any other type is FALSE, MISSING
        # or NULL, all of which are not true.
        return [type(v) is str and v == c for v in vals]
    cmp = COMPARATORS[op]
    return [truth(cmp(v, c)) for v in vals]


def _encode_column(vals: list[Any], fallback: bytearray) -> list[bytes]:
    """``encode_value`` of each value; a value the codec rejects marks its change for the
    general path (which evaluates lazily and reports the error only where it applies).
    Strings and small ints, most key values, skip the codec's type dispatch (the same bytes:
    ``_encode_str`` and the ``_SMALL`` table)."""
    small = _SMALL
    try:
        return [
            _B_STR + v.encode("utf-8", "surrogatepass").replace(b"\x00", b"\x00\xff") + STR_TERM
            if type(v) is str
            else (small[v] if type(v) is int and v in small else encode_value(v))
            for v in vals
        ]
    except Exception:
        pass
    out: list[bytes] = []
    for i, v in enumerate(vals):
        try:
            out.append(encode_value(v))
        except Exception:
            fallback[i] = 1
            out.append(b"")
    return out
