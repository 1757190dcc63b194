"""The index correctness oracle: one invariant, written once, used by every index test.

    At a stability timestamp T, an index's entries on all its slices together equal its
    definition evaluated over the documents as of T, and no document is in two slices.

Like the checkers in ``shardex.testing.checkers``: plain data in (entries per slice, documents),
``AssertionError`` with a readable diff out, so the same check ends a unit test, a simulated
run, a Spark test and a real-cluster test.

The oracle evaluates with the **interpreter** (``evaluate``), not the projector's compiled
closures and shared-slot loop, so a projector bug is not reproduced by the oracle. The rules
are the projector's (stated in ``shardex.pipeline.project.projector``): WHERE by N1QL truth, leading
MISSING key not indexed, non-leading MISSING kept, an evaluation error means "not indexed";
an array key gives one entry per distinct element value (none under a leading array key: not
indexed; none elsewhere: one entry with MISSING there), evaluated here element by element on
a copy of the document plus the variable.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Mapping
from typing import Any

import msgspec

from shardex.core.expr import evaluate, parse_expression
from shardex.core.expr.ops import truth
from shardex.core.keycodec import decode_entry, encode_entry, encode_key
from shardex.core.values import MISSING
from shardex.index.keyversion import MAX_ENTRY_BYTES, pack_entries, unpack_entries
from shardex.meta.array_key import ArrayIndexKey, array_key_of
from shardex.meta.index_definition import IndexDefinition, hash_partition, validate_definition

__all__ = [
    "check_back_index",
    "check_index",
    "evaluate_document",
    "expected_entries",
    "expected_errors",
]

_MAX_SHOWN = 15


class _Parsed:
    def __init__(self, defn: IndexDefinition) -> None:
        defn = validate_definition(defn)
        self.defn = defn
        self.where = parse_expression(defn.where) if defn.where is not None else None
        self.keys = [array_key_of(k.expr) or parse_expression(k.expr) for k in defn.keys]
        self.desc = [k.desc for k in defn.keys]
        self.parts = [parse_expression(t) for t in defn.partition_by or ()]
        self.array_pos = defn.array_pos


def _doc(value: Any) -> Any:
    return msgspec.json.decode(value) if isinstance(value, bytes | bytearray) else value


def _elements(key: ArrayIndexKey, doc: Any, meta: Any) -> list[Any]:
    items = evaluate(key.source, doc, meta=meta)
    out = []
    for item in items if isinstance(items, list) else ():
        scope = {**(doc if isinstance(doc, dict) else {}), key.var: item}
        if key.when is not None and not truth(evaluate(key.when, scope, meta=meta)):
            continue
        v = evaluate(key.mapping, scope, meta=meta)
        if v is not MISSING:
            out.append(v)
    return out


def _evaluate(p: _Parsed, docid: str, doc: Any) -> tuple[int, list[bytes]] | None:
    """(index partition, the document's entries) or None when it is not indexed."""
    meta = {"id": docid}
    if p.where is not None and not truth(evaluate(p.where, doc, meta=meta)):
        return None
    rows: list[list[Any]] = [[]]
    for i, k in enumerate(p.keys):
        if i == p.array_pos:
            assert isinstance(k, ArrayIndexKey)
            elements = _elements(k, doc, meta)
            if not elements and i == 0:
                return None
            rows = [[*r, v] for r in rows for v in elements or [MISSING]]
        else:
            v = evaluate(k, doc, meta=meta)
            if i == 0 and v is MISSING:
                return None
            rows = [[*r, v] for r in rows]
    entries = sorted({encode_entry(values, docid, p.desc) for values in rows})
    for entry in entries:
        if len(entry) > MAX_ENTRY_BYTES:
            raise ValueError(f"entry of {len(entry)} bytes is over the limit")  # not indexed
    if not p.parts:
        return 0, entries
    pvals = [evaluate(e, doc, meta=meta) for e in p.parts]
    return hash_partition(encode_key(pvals), p.defn.num_partition), entries


def evaluate_document(defn: IndexDefinition, docid: str, doc: Any) -> tuple[int, bytes] | None:
    """(index partition, entry) of one document, or None when it is not in the index: the
    ``UPSERT`` key version's slice and entry (an array index's entries packed, as its key
    versions carry them). Raises on an evaluation error (callers that want the rule use
    ``expected_entries``)."""
    p = _Parsed(defn)
    r = _evaluate(p, docid, _doc(doc))
    if r is None:
        return None
    part, entries = r
    return part, pack_entries(entries) if p.array_pos >= 0 else entries[0]


def expected_entries(defn: IndexDefinition, documents: Mapping[str, Any]) -> set[tuple[int, bytes]]:
    """What the index must hold over ``documents`` (docid -> JSON value or JSON bytes; a
    deleted document is simply absent): the set of (index partition, entry bytes)."""
    p = _Parsed(defn)
    out: set[tuple[int, bytes]] = set()
    for docid, doc in documents.items():
        try:
            r = _evaluate(p, docid, _doc(doc))
        except Exception:
            continue  # evaluation error: not indexed (and counted by the projector)
        if r is not None:
            out.update((r[0], e) for e in r[1])
    return out


def expected_errors(defn: IndexDefinition, documents: Mapping[str, Any]) -> set[str]:
    """Docids whose evaluation fails: what the projector must count as errors."""
    p = _Parsed(defn)
    bad: set[str] = set()
    for docid, doc in documents.items():
        try:
            _evaluate(p, docid, _doc(doc))
        except Exception:
            bad.add(docid)
    return bad


def _show(defn: IndexDefinition, items: Iterable[tuple[int, bytes]]) -> list[str]:
    lines = []
    for part, entry in sorted(items)[:_MAX_SHOWN]:
        try:
            key, docid = decode_entry(entry, defn.desc)
            lines.append(f"    slice {part}: docid={docid!r} key={key!r}")
        except Exception:
            lines.append(f"    slice {part}: undecodable entry {entry.hex()}")
    return lines


def check_index(
    defn: IndexDefinition,
    slices_entries_by_partition: Mapping[int, Iterable[bytes]],
    documents: Mapping[str, Any],
    *,
    context: str = "",
) -> None:
    """Assert the index invariant. ``slices_entries_by_partition``: index partition -> the
    raw entries that slice holds (at one stability TS); ``documents``: the documents as of
    that TS. Every slice of the index must be present (a missing slice's entries would be
    reported missing). Fails with: entries missing, entries extra (wrong key, stale, or a
    deleted document), documents in two slices or twice in one, entries in the wrong slice.
    """
    expected = expected_entries(defn, documents)
    actual: set[tuple[int, bytes]] = set()
    where: dict[str, list[tuple[int, bytes]]] = defaultdict(list)
    problems: list[str] = []
    for part, entries in slices_entries_by_partition.items():
        for entry in entries:
            if (part, entry) in actual:
                problems.append(f"  entry listed twice in slice {part}: {entry.hex()}")
                continue
            actual.add((part, entry))
            try:
                _, docid = decode_entry(entry, defn.desc)
            except Exception:
                docid = f"<undecodable {entry.hex()[:40]}>"
            where[docid].append((part, entry))
    # An array index holds a document once per element, all in one slice.
    many = defn.array_pos >= 0
    doubled = {
        d: locs
        for d, locs in where.items()
        if len(locs) > 1 and (not many or len({p for p, _ in locs}) > 1)
    }
    missing = expected - actual
    extra = actual - expected
    if not (missing or extra or doubled or problems):
        return
    head = f"index {defn.id} ({defn.name}) differs from its definition over the documents"
    lines = [head + (f" [{context}]" if context else "") + ":"]
    lines.append(
        f"  expected {len(expected)} entries, found {len(actual)} in "
        f"{len(slices_entries_by_partition)} slices"
    )
    if doubled:
        lines.append(f"  {len(doubled)} documents have more than one entry (two slices or twice):")
        for docid, locs in sorted(doubled.items())[:_MAX_SHOWN]:
            lines.append(f"    {docid!r} in slices {sorted(p for p, _ in locs)}")
    if missing:
        lines.append(f"  {len(missing)} missing (expected, not found):")
        lines.extend(_show(defn, missing))
    if extra:
        lines.append(f"  {len(extra)} extra (found, not expected):")
        lines.extend(_show(defn, extra))
    misplaced = {e for _, e in missing} & {e for _, e in extra}
    if misplaced:
        lines.append(f"  {len(misplaced)} of those are the right entry in the wrong slice")
    lines.extend(problems[:_MAX_SHOWN])
    raise AssertionError("\n".join(lines))


def check_back_index(
    entries: Iterable[bytes],
    back_rows: Mapping[str, tuple[int, int, bytes]],
    *,
    desc: Iterable[bool] | None = None,
    packed: bool = False,
    context: str = "",
) -> None:
    """A slice's back index agrees with its entries: every live back row (docid -> entry,
    or an array index's packed entries when ``packed``) names entries that exist under that
    docid, and every entry has its back row. Catches orphans that the index invariant alone
    would only see after a later update."""
    flags = list(desc) if desc is not None else None
    entry_set = set(entries)
    live = {docid: row[2] for docid, row in back_rows.items() if row[2]}
    problems = []
    pointed: set[bytes] = set()
    for docid, value in live.items():
        for entry in unpack_entries(value) if packed else (value,):
            pointed.add(entry)
            if entry not in entry_set:
                problems.append(f"  back row {docid!r} -> entry not in the slice")
            elif decode_entry(entry, flags)[1] != docid:
                problems.append(f"  back row {docid!r} -> an entry of another document")
    for entry in entry_set - pointed:
        problems.append(f"  entry of {decode_entry(entry, flags)[1]!r} has no back row")
    if problems:
        msg = f"back index disagrees with entries{f' [{context}]' if context else ''}:"
        raise AssertionError("\n".join([msg, *problems[:_MAX_SHOWN]]))
