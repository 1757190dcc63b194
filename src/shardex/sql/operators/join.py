"""JOIN and NEST: each row of the left side (the FROM term and the terms before the join)
with the inner keyspace's documents it matches.

Inner documents arrive as *pieces*, ``{alias: document, meta_name: {"id": docid}}``, which
a match merges into the left row (the joined scope row reads ``alias`` and ``META(alias)``).
A JOIN gives one row per match; a NEST one row per left row, ``alias`` bound to the array
of the matching documents. Without a match INNER drops the row, LEFT keeps it: a JOIN with
``alias`` MISSING, a NEST with ``alias`` ``[]`` (N1QL's rules). A RIGHT JOIN keeps every
inner document, with the left side's names MISSING where nothing matched.

Methods (chosen by ``planner.joins``): ``keys`` fetches the documents each row names (ON
KEYS), a batch of rows per fetch; ``index_nl`` asks the inner side for the documents whose
join key is among a batch of rows' values (an index probe), then matches them as ``hash``
does; ``hash`` builds a table of one side on the equi-join key (the inner side, or the left
rows for ``USE HASH(PROBE)``) and streams the other; ``nl`` tries every inner document for
every row. Every method re-checks the whole ON condition on each candidate pair: the key
only narrows the candidates, so the methods agree row for row.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from shardex.core.expr.ops import truth
from shardex.core.values import MISSING

from .sort import SortSpec, encode_sort_key

Row = dict[str, Any]
Fn = Callable[[Row], Any]
# ids -> {id: (document, META())} of those that exist (a lookup join's fetch)
Fetch = Callable[[list[str]], dict[str, tuple[Any, dict[str, Any]]]]
# join key values -> the inner pieces whose key is among them (an index probe)
Probe = Callable[[list[Any]], list[Row]]

BATCH_ROWS = 256  # left rows per fetch or probe
_KEY_SPEC = [SortSpec(False, None)]


@dataclass(frozen=True)
class JoinSpec:
    alias: str
    meta_name: str
    kind: str  # inner | left | right
    nest: bool
    on: Fn | None = None  # the ON condition over the joined row (ANSI and index joins)
    keys: Fn | None = None  # ON KEYS over the left row (lookup joins)
    outer_key: Fn | None = None  # the equi-join key over the left row (a list of values)
    inner_key: Fn | None = None  # ... and over an inner piece
    build_inner: bool = True  # hash: the table holds the inner side (USE HASH(PROBE): not)


def piece(spec: JoinSpec, docid: str, doc: Any, meta: dict[str, Any] | None = None) -> Row:
    """An inner document as the joined row reads it; ``meta``: its META() when the reader
    fetched more than the id (``cas``, ``expiration``)."""
    return {spec.alias: doc, spec.meta_name: {"id": docid} if meta is None else meta}


def key_bytes(values: list[Any]) -> bytes | None:
    """The equality key of a join key's values; None when one is NULL or MISSING (equal to
    nothing, as ``=`` says)."""
    if any(v is None or v is MISSING for v in values):
        return None
    return encode_sort_key([values], _KEY_SPEC)


def _emit(row: Row, matches: list[Row], spec: JoinSpec) -> Iterator[Row]:
    if spec.nest:
        if matches:
            yield {**row, spec.alias: [m[spec.alias] for m in matches]}
        elif spec.kind == "left":
            yield {**row, spec.alias: []}
        return
    for m in matches:
        yield {**row, **m}
    if not matches and spec.kind == "left":
        yield row


def _matching(row: Row, candidates: Iterable[Row], on: Fn | None) -> list[Row]:
    if on is None:
        return list(candidates)
    return [p for p in candidates if truth(on({**row, **p}))]


def _batches(rows: Iterable[Row], n: int) -> Iterator[list[Row]]:
    batch: list[Row] = []
    for row in rows:
        batch.append(row)
        if len(batch) >= n:
            yield batch
            batch = []
    if batch:
        yield batch


def lookup_keys(value: Any) -> list[str]:
    """The document ids an ON KEYS value names: a string, or the strings of an array
    (repeats kept: each names a match, as N1QL joins them)."""
    if isinstance(value, str):
        return [value]
    if isinstance(value, list):
        return [k for k in value if isinstance(k, str)]
    return []


def lookup_join(
    rows: Iterable[Row], spec: JoinSpec, fetch: Fetch, batch: int = BATCH_ROWS
) -> Iterator[Row]:
    """ON KEYS: each row with the documents its keys name, one fetch per batch of rows."""
    assert spec.keys is not None
    for chunk in _batches(rows, batch):
        named = [lookup_keys(spec.keys(row)) for row in chunk]
        wanted = list(dict.fromkeys(k for ks in named for k in ks))
        docs = fetch(wanted) if wanted else {}
        for row, ks in zip(chunk, named, strict=True):
            matches = [piece(spec, k, *docs[k]) for k in ks if k in docs]
            yield from _emit(row, matches, spec)


def _table(pieces: Iterable[Row], key: Fn) -> dict[bytes, list[Row]]:
    table: dict[bytes, list[Row]] = {}
    for p in pieces:
        k = key_bytes(key(p))
        if k is not None:
            table.setdefault(k, []).append(p)
    return table


def hash_join(rows: Iterable[Row], spec: JoinSpec, inner: Iterable[Row]) -> Iterator[Row]:
    """An equi-join: a table of one side on the key, the other side streamed."""
    assert spec.outer_key is not None and spec.inner_key is not None
    if not spec.build_inner:
        yield from _probe_outer_table(list(rows), spec, inner)
        return
    table = _table(inner, spec.inner_key)
    for row in rows:
        k = key_bytes(spec.outer_key(row))
        candidates = table.get(k, ()) if k is not None else ()
        yield from _emit(row, _matching(row, candidates, spec.on), spec)


def _probe_outer_table(rows: list[Row], spec: JoinSpec, inner: Iterable[Row]) -> Iterator[Row]:
    """USE HASH(PROBE) on the inner keyspace: the table holds the left rows and the inner
    documents probe it; rows come out in left order once every inner document was read."""
    assert spec.outer_key is not None and spec.inner_key is not None
    table: dict[bytes, list[int]] = {}
    for i, row in enumerate(rows):
        k = key_bytes(spec.outer_key(row))
        if k is not None:
            table.setdefault(k, []).append(i)
    matches: list[list[Row]] = [[] for _ in rows]
    for p in inner:
        k = key_bytes(spec.inner_key(p))
        for i in table.get(k, ()) if k is not None else ():
            if spec.on is None or truth(spec.on({**rows[i], **p})):
                matches[i].append(p)
    for row, found in zip(rows, matches, strict=True):
        yield from _emit(row, found, spec)


def index_join(
    rows: Iterable[Row], spec: JoinSpec, probe: Probe, batch: int = BATCH_ROWS
) -> Iterator[Row]:
    """A nested loop through an index of the inner side: per batch of rows, one probe for
    the documents whose key is among the batch's key values, matched as ``hash_join``."""
    assert spec.outer_key is not None and spec.inner_key is not None
    for chunk in _batches(rows, batch):
        values: dict[bytes, Any] = {}  # the probed (first) key's distinct values
        for row in chunk:
            vs = spec.outer_key(row)
            first = key_bytes(vs[:1])
            if first is not None and key_bytes(vs) is not None:
                values.setdefault(first, vs[0])
        table = _table(probe(list(values.values())), spec.inner_key) if values else {}
        for row in chunk:
            k = key_bytes(spec.outer_key(row))
            candidates = table.get(k, ()) if k is not None else ()
            yield from _emit(row, _matching(row, candidates, spec.on), spec)


def nl_join(rows: Iterable[Row], spec: JoinSpec, inner: Sequence[Row]) -> Iterator[Row]:
    """Every inner document tried against every row (no equi-join key, or USE NL without
    an index)."""
    for row in rows:
        yield from _emit(row, _matching(row, inner, spec.on), spec)


def right_join(
    left: Iterable[Row], spec: JoinSpec, inner: Iterable[Row], outer: Row | None = None
) -> Iterator[Row]:
    """RIGHT JOIN: every inner document once per matching left row, or alone (the left
    side's names MISSING) when none matches; in inner order. ``outer``: the names of a
    subquery's enclosing row, which an unmatched document keeps (only the left's are gone)."""
    rows = list(left)
    table = None
    if spec.outer_key is not None and spec.inner_key is not None:
        table = _table(rows, spec.outer_key)
    for p in inner:
        if table is None:
            candidates: Iterable[Row] = rows
        else:
            k = key_bytes(spec.inner_key(p))
            candidates = table.get(k, ()) if k is not None else ()
        found = [r for r in candidates if spec.on is None or truth(spec.on({**r, **p}))]
        if not found:
            yield {**outer, **p} if outer else p
        for r in found:
            yield {**r, **p}
