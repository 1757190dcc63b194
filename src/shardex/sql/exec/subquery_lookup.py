"""An equality-correlated subquery over gathered documents looks its documents up by key.

A correlated subquery over a keyspace without USE KEYS runs, at each evaluation, over the
documents the initiator gathered for it (``subquery_inputs``), and a scan of all of them per
outer row made the statement quadratic: ``(SELECT COUNT(*) FROM orders o WHERE
o.customer_id = META(c).id)`` per customer read every gathered order per customer.

When its WHERE has a conjunct ``<inner> = <outer>``, ``<inner>`` reading only the FROM
alias (its document and META()) and ``<outer>`` only enclosing names, the documents are
put once in a table on ``<inner>``'s value (``join.key_bytes``: the equality the hash joins
use; a NULL or MISSING key equals nothing, as ``=`` says), and each evaluation runs over the
documents whose key equals ``<outer>``'s value on its outer row. WHERE is still applied whole
to them: the table only leaves out documents the conjunct refuses, so the result is the
scan's, rows in the same order.

The table is made once per set of gathered documents (one per fragment's parameters) and
subquery, and kept while that set is (by identity, bounded).
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import Any, Final

from shardex.core.expr import Expr, Identifier, walk
from shardex.errors import ShardexError
from shardex.sql.local_rows import compile_expr
from shardex.sql.operators.join import key_bytes
from shardex.sql.planner.joins import equi_keys
from shardex.sql.syntax.bind import META_KEY, BoundSelect
from shardex.sql.syntax.subquery import BoundSubquery

__all__ = ["lookup_key", "narrowed"]

TABLES_MAX: Final = 64
_lock = threading.Lock()
# (id(docs), id(sub)) -> (docs, sub, table): the objects kept alive so their ids stay theirs.
_tables: dict[tuple[int, int], tuple[Any, Any, dict[bytes, dict[str, Any]]]] = {}


def lookup_key(sub: BoundSelect) -> tuple[Expr, Expr] | None:
    """``(outer, inner)`` of the first usable equality of ``sub``'s WHERE (see the module
    doc), or None. Once per bound subquery."""
    cached = sub.__dict__.get("_lookup_key", _UNSET)
    if cached is _UNSET:
        cached = _lookup_key(sub)
        object.__setattr__(sub, "_lookup_key", cached)  # a cache, not state
    return cached  # type: ignore[no-any-return]


_UNSET: Final = object()


def _lookup_key(sub: BoundSelect) -> tuple[Expr, Expr] | None:
    ref = sub.from_
    if ref is None or ref.source is not None or ref.use_keys is not None or sub.joins:
        return None
    if sub.where is None or sub.alias is None:
        return None
    # Names the subquery binds itself: an <outer> side reading one is no outer value.
    own = {sub.alias, META_KEY, *(n for n, _ in sub.lets), *(u[0] for u in sub.unnests)}
    for outer, inner in equi_keys(sub.where, sub.alias, META_KEY):
        names = {n.name for n in walk(outer) if isinstance(n, Identifier)}
        if names & own or any(isinstance(n, BoundSubquery) for n in walk(outer)):
            continue
        return outer, inner
    return None


def narrowed(
    sub: BoundSelect, docs: dict[str, Any], outer: dict[str, Any], params: Any
) -> dict[str, Any]:
    """Of the gathered ``docs`` (docid -> document), those ``sub`` may keep on ``outer``:
    all of them without a lookup key, else those whose key equals the outer value."""
    key = lookup_key(sub)
    if key is None:
        return docs
    outer_expr, inner_expr = key
    try:
        kb = key_bytes([compile_expr(outer_expr)(outer, None, params)])
    except ShardexError:
        return docs  # WHERE over every document says whether it is an error here
    if kb is None:
        return {}
    return _table(sub, docs, inner_expr, params).get(kb, {})


def _table(
    sub: BoundSelect, docs: dict[str, Any], inner: Expr, params: Any
) -> dict[bytes, dict[str, Any]]:
    slot = (id(docs), id(sub))
    with _lock:
        hit = _tables.get(slot)
        if hit is not None and hit[0] is docs and hit[1] is sub:
            return hit[2]
    table: dict[bytes, dict[str, Any]] = {}
    for docid, doc, kb in _keyed(sub.alias, docs, inner, params):
        if kb is not None:
            table.setdefault(kb, {})[docid] = doc
    with _lock:
        if len(_tables) >= TABLES_MAX:
            _tables.clear()
        _tables[slot] = (docs, sub, table)
    return table


def _keyed(
    alias: str | None, docs: dict[str, Any], inner: Expr, params: Any
) -> Iterator[tuple[str, Any, bytes | None]]:
    f = compile_expr(inner)
    for docid, doc in docs.items():
        yield docid, doc, key_bytes([f({alias: doc, META_KEY: {"id": docid}}, None, params)])
