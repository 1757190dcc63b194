"""The USE KEYS documents of correlated subqueries, read for a batch of rows at once.

A subquery ``(SELECT ... FROM ks USE KEYS <expr> ...)`` evaluated on each row of a fragment
reads its documents through the fragment's ``Fetch`` (``subqueries.blocking_fetch``): one
read per row, each a wait for the event loop and a request to every node owning one of its
keys. Per customer of a region that is a round trip each: the query's time.

``batched_keys`` puts a stage in front of the operators that evaluate the subqueries: it
takes up to ``BATCH_ROWS`` rows (or ``BATCH_KEYS`` keys), evaluates each subquery's USE KEYS
expression on each row as the subquery would (``use_keys_of`` over ``outer_row``), reads
the distinct keys of the batch with one ``Fetch`` per keyspace, then passes the rows on.
The subqueries read through ``KeyedReads``, which answers a key of the current batch from
what was read (a key found absent too) and reads any other key as before: a USE KEYS
expression that reads a LET name or a row built downstream still reads its documents,
only not batched. So a subquery's result is the same either way; what changes is how many
reads carry its keys.

The documents of one batch are held until the next batch replaces them, as a scan block's
documents are held: bounded by the batch's row and key counts, not charged to the budget
(a subquery's result is, as before).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from typing import Any, Final

from shardex.core.expr import Expr, evaluate, walk
from shardex.errors import ShardexError
from shardex.sql.syntax.bind import BoundSelect
from shardex.sql.syntax.subquery import BoundSubquery, outer_row

__all__ = [
    "BATCH_KEYS",
    "BATCH_ROWS",
    "Fetch",
    "KeyedReads",
    "batched_keys",
    "keyed_subqueries",
    "use_keys_of",
]

# (keyspace, docids) -> (docid, document) of those that exist; synchronous.
Fetch = Callable[[str, list[str]], list[tuple[str, Any]]]

BATCH_ROWS: Final = 256  # rows whose keys one read carries, at most
BATCH_KEYS: Final = 4096  # keys one read carries, about (a row's keys are never split)
_ABSENT: Final = object()  # a key read for the batch that names no document


def use_keys_of(use_keys: Expr, outer: dict[str, Any], params: Any) -> list[str]:
    """The document keys a USE KEYS expression names on ``outer``: a string is one key,
    an array its strings; anything else names none."""
    keys = evaluate(use_keys, outer, params=params)
    if isinstance(keys, str):
        return [keys]
    if isinstance(keys, list):
        return [k for k in keys if isinstance(k, str)]
    return []


def keyed_subqueries(exprs: Iterable[Expr]) -> list[BoundSubquery]:
    """The subqueries in ``exprs`` (not nested ones) that are a SELECT reading a keyspace
    by USE KEYS whose expression holds no subquery of its own (evaluating it ahead would
    run that one twice)."""
    out = []
    for n in (n for e in exprs for n in walk(e)):
        if not isinstance(n, BoundSubquery) or not isinstance(n.bound, BoundSelect):
            continue
        ref = n.bound.from_
        if ref is None or ref.source is not None or ref.use_keys is None:
            continue
        if any(isinstance(m, BoundSubquery) for m in walk(ref.use_keys)):
            continue
        out.append(n)
    return out


class KeyedReads:
    """A ``Fetch`` that answers the keys of the current batch from what was read for it,
    and reads others with ``fetch``. ``reads``: the reads made through ``fetch``."""

    def __init__(self, fetch: Fetch) -> None:
        self.fetch = fetch
        self.reads = 0
        # keyspace -> docid -> document, or _ABSENT: read for this batch, no document.
        self.held: dict[str, dict[str, Any]] = {}

    def read_batch(self, keys: dict[str, dict[str, None]]) -> None:
        """Reads ``keys`` (keyspace -> ordered distinct keys), replacing the last batch."""
        held: dict[str, dict[str, Any]] = {}
        for keyspace, wanted in keys.items():
            docs: dict[str, Any] = dict.fromkeys(wanted, _ABSENT)
            if wanted:
                self.reads += 1
                docs.update(self.fetch(keyspace, list(wanted)))
            held[keyspace] = docs
        self.held = held

    def __call__(self, keyspace: str, docids: list[str]) -> list[tuple[str, Any]]:
        held = self.held.get(keyspace)
        if held is None or any(d not in held for d in docids):
            self.reads += 1
            return self.fetch(keyspace, docids)
        out = []
        for d in dict.fromkeys(docids):
            doc = held[d]
            if doc is not _ABSENT:
                out.append((d, doc))
        return out


def batched_keys(
    rows: Iterable[Any],
    subs: list[BoundSubquery],
    params: Any,
    reads: KeyedReads,
    batch_rows: int = BATCH_ROWS,
) -> Iterator[Any]:
    """``rows`` passed on a batch at a time, each batch's USE KEYS documents of ``subs``
    read first into ``reads`` (see the module doc)."""
    wants = [(s, s.bound.from_.name, s.bound.from_.use_keys) for s in subs]
    it = iter(rows)
    while True:
        batch: list[Any] = []
        keys: dict[str, dict[str, None]] = {}
        n_keys = 0
        for row in it:
            batch.append(row)
            for sub, keyspace, use_keys in wants:
                try:
                    found = use_keys_of(use_keys, outer_row(sub, row), params)
                except ShardexError:
                    continue  # raised again if the subquery runs on this row
                keys.setdefault(keyspace, {}).update(dict.fromkeys(found))
                n_keys += len(found)
            if len(batch) >= batch_rows or n_keys >= BATCH_KEYS:
                break
        if not batch:
            return
        reads.read_batch(keys)
        yield from batch
