"""The row pipelines of the SQL fragments, as plain synchronous generator chains over the
operators of ``shardex.sql.operators`` (the same ones ``LocalEngine`` runs, so a distributed
result equals the reference by construction of the parts).

Three shapes (``mode``), chosen by the physical planner:

* ``group``: leaves run LET, WHERE and the PARTIAL aggregate; the root merges partial
  states (FINAL), then LETTING, HAVING, projection, DISTINCT, ORDER BY, OFFSET, LIMIT;
* ``sort``: leaves project each row with its encoded sort key and sort locally (top-N when a
  limit is known), or, when the index order satisfies ORDER BY (``presorted``), pass rows on
  in scan order and stop at the limit; the root k-way merges the sorted streams, then
  DISTINCT, OFFSET, LIMIT;
* ``rows``: leaves project (DISTINCT locally, limit pushed down); the root concatenates,
  then DISTINCT, OFFSET, LIMIT;
* ``window`` (window functions, no GROUP BY): leaves send their scope rows after WHERE,
  each document cut to the paths the statement reads (``doc_paths``); the root computes
  the windows over all of them (``windows.py``), then projects, DISTINCT, ORDER BY,
  OFFSET, LIMIT. A grouped query's windows run at the root after HAVING.

``late`` (a ``sort`` whose index covers all but the projection, decision 0111): leaves rank
the index entries' rebuilt rows and send ``[sort key, docid]`` (``late_leaf_rows``); the
root merges them, fetches the documents of the rows it returns and checks each against
its entry (``late_checked``), then projects (``late.py``).

``local``: the root alone over scope rows it made itself (no FROM, an expression FROM, or
documents named by key), i.e. the whole statement in one place.

The blocking steps (PARTIAL and FINAL aggregates, sorts, DISTINCT) are the budgeted forms of
``spill.py`` and ``spill_groups.py``, built from the same operator parts: within the query's
memory ``Budget`` they equal the in-memory operators, past it they spill (decision 0106).
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterable, Iterator
from typing import Any, Final

from shardex.core.expr import Expr
from shardex.core.expr.ops import truth
from shardex.sql.exec.analyze import read_paths
from shardex.sql.exec.doc_paths import pruner
from shardex.sql.exec.memory import Budget
from shardex.sql.exec.rows import pack_state
from shardex.sql.exec.spill import external_sort
from shardex.sql.exec.spill_groups import distinct, final_groups, partial_groups
from shardex.sql.exec.subqueries import Fetch, with_subqueries
from shardex.sql.exec.subquery_keys import KeyedReads, batched_keys, keyed_subqueries
from shardex.sql.exec.windows import windowed
from shardex.sql.local_rows import compile_expr, unnest_specs
from shardex.sql.operators import (
    AggSpec,
    ProjectTerm,
    SortSpec,
    encode_sort_key,
    filter_rows,
    merge_sorted,
    offset_limit,
    project,
    strip_keys,
    unnest,
)
from shardex.sql.syntax.bind import META_KEY, BoundSelect, aggregate_name, group_key_name
from shardex.sql.syntax.bound_select import sort_scope
from shardex.sql.syntax.subquery import BoundSubquery

__all__ = [
    "MODES",
    "LateStale",
    "late_checked",
    "late_leaf_rows",
    "late_values",
    "leaf_rows",
    "mode_of",
    "root_rows",
]

MODES = ("group", "sort", "rows", "window")
Params = Any


def mode_of(b: BoundSelect) -> str:
    if b.grouped:
        return "group"
    if b.windows:
        return "window"
    return "sort" if b.order else "rows"


# Compiled once per expression object (a cached bound statement brings the same trees to
# every execution): the reference engine's cache, shared.
compiled = compile_expr


def _fn(expr: Expr, params: Params) -> Callable[[Any], Any]:
    f = compiled(expr)
    return lambda row: f(row, None, params)


def _with_bindings(
    rows: Iterable[dict[str, Any]], bindings: tuple[tuple[str, Expr], ...], params: Params
) -> Iterable[dict[str, Any]]:
    if not bindings:
        return rows
    fns = [(name, _fn(e, params)) for name, e in bindings]

    def gen() -> Iterator[dict[str, Any]]:
        for row in rows:
            row = dict(row)
            for name, f in fns:
                row[name] = f(row)
            yield row

    return gen()


def _filtered(
    b: BoundSelect,
    rows: Iterable[Any],
    params: Params,
    decided: bool = False,
    reads: KeyedReads | None = None,
) -> Iterable[Any]:
    """UNNEST (each leaf unnests the documents it read), LET, then WHERE (re-applied:
    spans are only a superset of the rows), unless ``decided``: the rows are a covering
    scan's whose spans decide WHERE (``planner.exact``). With ``reads``, the USE KEYS
    documents of the subqueries evaluated on these rows are read a batch of rows at a
    time (``subquery_keys``): before LET when LET or WHERE runs one, else after WHERE (no
    read for a row WHERE drops)."""
    if b.unnests and not b.joins:  # a join statement's rows are unnested already
        rows = unnest(rows, unnest_specs(b, params))
    subs, early = _keyed_stage(b)
    batched = reads is not None and bool(subs)
    if batched and early:
        assert reads is not None
        rows = batched_keys(rows, subs, params, reads)
    rows = _with_bindings(rows, b.lets, params)
    if b.where is not None and not decided:
        rows = filter_rows(rows, _fn(b.where, params))
    if batched and not early:
        assert reads is not None
        rows = batched_keys(rows, subs, params, reads)
    return rows


def _keyed_stage(b: BoundSelect) -> tuple[list[BoundSubquery], bool]:
    """The USE KEYS subqueries evaluated on ``_filtered``'s rows (LET, WHERE, and the
    projection and ORDER BY, or the group keys and aggregates, when they follow on the
    same rows: not a window query's, whose projection runs after its windows), and whether
    LET or WHERE runs one. Once per bound statement."""
    cached: tuple[list[BoundSubquery], bool] | None = b.__dict__.get("_keyed_stage")
    if cached is None:
        early_exprs = [e for _, e in b.lets] + ([b.where] if b.where is not None else [])
        late_exprs: list[Expr] = []
        if b.grouped:
            late_exprs += list(b.group_keys) + [a.arg for a in b.aggregates if a.arg is not None]
        elif not b.windows:
            late_exprs += [t.expr for t in b.terms if t.expr is not None]
            late_exprs += [e for e, _ in b.order]
        early = bool(keyed_subqueries(early_exprs))
        cached = (keyed_subqueries(early_exprs + late_exprs), early)
        object.__setattr__(b, "_keyed_stage", cached)  # a cache, not state
    return cached


def _window_pruner(b: BoundSelect) -> Callable[[Any], Any] | None:
    """What a window query's leaf keeps of each document it sends (``doc_paths``): the
    paths the statement reads, or None (all of it) when it reads whole documents or has
    joins (their aliases are other documents). Once per bound statement."""
    cached = b.__dict__.get("_window_pruner", _UNSET)
    if cached is _UNSET:
        paths = None if b.joins or b.alias is None else read_paths(b)
        cached = None if paths is None else pruner(paths)
        object.__setattr__(b, "_window_pruner", cached)  # a cache, not state
    return cached  # type: ignore[no-any-return]


_UNSET: Final = object()


def _keyed_reads(b: BoundSelect, fetch: Fetch | None) -> KeyedReads | None:
    """A batch-reading ``Fetch`` over ``fetch`` when ``b`` has USE KEYS subqueries."""
    return KeyedReads(fetch) if fetch is not None and _keyed_stage(b)[0] else None


def runs(rows: Iterable[Any], alias: str) -> Iterator[tuple[Any, int]]:
    """``(row, n)``: each row with the number of rows in a row it stands for. A covering
    scan gives consecutive entries of one key the same document object and, when the query
    never reads ``META()``, the same META object (``EntryDecoder.covered_rows``): such rows
    are equal, so a filter, a group key or an aggregate's argument is the same for all of
    them and is evaluated once per run (a GROUP BY over an index of a few thousand keys and
    a million entries evaluates a few thousand rows). Other rows are runs of one."""
    it = iter(rows)
    first = next(it, None)
    if first is None:
        return
    doc, meta, n = first.get(alias), first.get(META_KEY), 1
    for row in it:
        if row is first or (
            row.get(alias) is doc and row.get(META_KEY) is meta and doc is not None
        ):
            n += 1
            continue
        yield first, n
        first, doc, meta, n = row, row.get(alias), row.get(META_KEY), 1
    yield first, n


def _agg_specs(b: BoundSelect, params: Params) -> list[AggSpec]:
    return [
        AggSpec(a.name, None if a.arg is None else _fn(a.arg, params), a.distinct)
        for a in b.aggregates
    ]


def _terms(b: BoundSelect, params: Params) -> tuple[list[ProjectTerm], Any]:
    terms = [ProjectTerm(_fn(t.expr, params), t.name, t.star) for t in b.terms]
    return terms, (terms[0].value if b.raw else None)


def _sort_key(b: BoundSelect, params: Params) -> Callable[[Any, Any], bytes]:
    specs = [SortSpec(o.desc, o.nulls_first) for _, o in b.order]
    fns = [compiled(e) for e, _ in b.order]
    aliases = b.order_aliases

    def key(row: Any, value: Any) -> bytes:
        row = sort_scope(row, value, aliases)
        return encode_sort_key([f(row, None, params) for f in fns], specs)

    return key


# --- leaves -----------------------------------------------------------------------------------


def leaf_rows(
    b: BoundSelect,
    params: Params,
    mode: str,
    top: int | None,
    budget: Budget,
    scope_rows: Iterable[Any],
    *,
    presorted: bool = False,
    decided: bool = False,
    fetch: Fetch | None = None,
) -> Iterator[Any]:
    """``_leaf_rows``, its subqueries run with results charged to ``budget`` (USE KEYS
    subqueries reading their documents with ``fetch``)."""
    reads = _keyed_reads(b, fetch)
    rows = _leaf_rows(
        b, params, mode, top, budget, scope_rows, presorted=presorted, decided=decided,
        reads=reads,
    )  # fmt: skip
    return with_subqueries(b, rows, budget, fetch if reads is None else reads)


def _leaf_rows(
    b: BoundSelect,
    params: Params,
    mode: str,
    top: int | None,
    budget: Budget,
    scope_rows: Iterable[Any],
    *,
    presorted: bool = False,
    decided: bool = False,
    reads: KeyedReads | None = None,
) -> Iterator[Any]:
    """A leaf's output rows from its scope rows (see the module doc for each mode).
    ``presorted``: the scope rows come in ORDER BY order already (the index order satisfies
    it), so ``sort`` only tags each row with its key and stops after ``top`` rows.
    ``decided``: every scope row satisfies WHERE already (``_filtered``)."""
    if mode == "group":
        keys = [_fn(k, params) for k in b.group_keys]
        specs = _agg_specs(b, params)
        # New rows per row (LET, UNNEST, a join's matches share the left row's document
        # and META objects): no runs to find.
        if b.lets or b.unnests or b.joins:
            rows = _filtered(b, scope_rows, params, decided, reads)
            partials = partial_groups(rows, keys, specs, budget)
        else:
            kept = runs(scope_rows, b.alias)
            if b.where is not None and not decided:
                where = _fn(b.where, params)
                kept = ((row, n) for row, n in kept if truth(where(row)))
            partials = partial_groups(kept, keys, specs, budget, weighted=True)
        for kv, states in partials:
            yield [list(kv), [pack_state(s) for s in states]]
        return
    rows = _filtered(b, scope_rows, params, decided, reads)
    if mode == "window":  # the root needs every row of a partition: the scope rows go
        cut = _window_pruner(b)
        if cut is None:
            yield from rows
            return
        alias = b.alias
        for row in rows:
            doc = row.get(alias)
            if doc is not None:
                row = {**row, alias: cut(doc)}
            yield row
        return
    terms, raw = _terms(b, params)
    if mode == "sort":
        pairs: Iterable[Any] = project(rows, terms, raw=raw, sort_key=_sort_key(b, params))
        if presorted and not b.distinct:
            for key, value in itertools.islice(pairs, top):
                yield [key, value]
            return
        for key, value in external_sort(pairs, budget, None if b.distinct else top):
            yield [key, value]
        return
    values: Iterable[Any] = project(rows, terms, raw=raw)
    if b.distinct:
        values = distinct(values, budget)
    yield from itertools.islice(values, top) if top is not None and not b.distinct else values


def late_leaf_rows(
    b: BoundSelect,
    params: Params,
    top: int,
    budget: Budget,
    scope_rows: Iterable[Any],
    *,
    presorted: bool = False,
) -> Iterator[Any]:
    """``[sort key, docid]`` of a leaf's first ``top`` rows in ORDER BY order, ranked on
    scope rows rebuilt from the index entries (the planner checked that the index covers
    LET, WHERE and ORDER BY): the rows ``leaf_rows`` would send, keys and order alike,
    with the docid in place of the projection. Ties keep scan order, as there."""
    key = _sort_key(b, params)
    pairs = ((key(row, None), row[META_KEY]["id"]) for row in _filtered(b, scope_rows, params))
    ranked = itertools.islice(pairs, top) if presorted else external_sort(pairs, budget, top)
    for k, docid in ranked:
        yield [k, docid]


class LateStale(Exception):
    """A fetched document no longer sorts where its index entry did: its place among the
    other leaves' rows is unknown, so the late result cannot be made exact."""


def late_checked(
    b: BoundSelect,
    params: Params,
    candidates: list[tuple[bytes, str]],
    docs: dict[str, Any],
) -> list[dict[str, Any]]:
    """The scope rows of ``candidates`` (merged ``[sort key, docid]``, in order) whose
    documents (``docs``, fetched now) still exist and still pass LET and WHERE, as a leaf
    that fetched them would have kept them; ``LateStale`` when one's sort key moved."""
    key = _sort_key(b, params)
    where = None if b.where is None else _fn(b.where, params)
    kept = []
    for k, docid in candidates:
        doc = docs.get(docid)
        if doc is None:
            continue  # deleted since the index was read: read as absent, as a leaf would
        (row,) = _with_bindings([{b.alias: doc, META_KEY: {"id": docid}}], b.lets, params)
        if where is not None and not truth(where(row)):
            continue
        if key(row, None) != k:
            raise LateStale(docid)
        kept.append(row)
    return kept


def late_values(b: BoundSelect, params: Params, rows: Iterable[Any]) -> list[Any]:
    """The projection of rows a late root kept."""
    terms, raw = _terms(b, params)
    return list(project(rows, terms, raw=raw))


# --- the root ----------------------------------------------------------------------------------


def _group_rows(b: BoundSelect, groups: Iterable[Any], params: Params) -> Iterable[Any]:
    out: Iterable[Any] = (
        {
            **{group_key_name(i): v for i, v in enumerate(kv)},
            **{aggregate_name(j): v for j, v in enumerate(av)},
        }
        for kv, av in groups
    )
    out = _with_bindings(out, b.letting, params)
    if b.having is not None:
        out = filter_rows(out, _fn(b.having, params))
    return out


def finish(
    b: BoundSelect,
    rows: Iterable[Any],
    params: Params,
    limit: int | None,
    offset: int,
    budget: Budget,
) -> Iterator[Any]:
    """Projection, DISTINCT, ORDER BY, OFFSET and LIMIT over finished rows."""
    terms, raw = _terms(b, params)
    if not b.order:
        out: Iterable[Any] = project(rows, terms, raw=raw)
        if b.distinct:
            out = distinct(out, budget)
        return offset_limit(out, offset, limit)
    pairs: Iterable[Any] = project(rows, terms, raw=raw, sort_key=_sort_key(b, params))
    if b.distinct:
        pairs = distinct(pairs, budget, value_of=_value_of_pair)
    top = None if limit is None else offset + limit
    return offset_limit(strip_keys(external_sort(pairs, budget, top)), offset, limit)


def _value_of_pair(pair: Any) -> Any:
    return pair[1]


def _grouped(
    b: BoundSelect, partials: Iterable[Any], params: Params, budget: Budget
) -> Iterable[Any]:
    groups = final_groups(partials, _agg_specs(b, params), budget, global_group=not b.group_keys)
    return windowed(b, _group_rows(b, groups, params), params, budget)


def root_rows(
    b: BoundSelect,
    params: Params,
    mode: str,
    limit: int | None,
    offset: int,
    budget: Budget,
    inputs: list[Iterator[Any]],
    fetch: Fetch | None = None,
) -> Iterator[Any]:
    """The result values from the leaves' outputs (``inputs``, one per leaf), or from the
    scope rows of the only input in ``local`` mode; ``fetch`` as for ``leaf_rows``."""
    if limit == 0:
        return iter(())
    reads = _keyed_reads(b, fetch) if mode == "local" else None
    rows = _root_rows(b, params, mode, limit, offset, budget, inputs, reads)
    return with_subqueries(b, rows, budget, fetch if reads is None else reads)


def _root_rows(
    b: BoundSelect,
    params: Params,
    mode: str,
    limit: int | None,
    offset: int,
    budget: Budget,
    inputs: list[Iterator[Any]],
    reads: KeyedReads | None = None,
) -> Iterator[Any]:
    if mode == "local":
        rows = _filtered(b, inputs[0], params, reads=reads)
        if b.grouped:
            keys = [_fn(k, params) for k in b.group_keys]
            specs = _agg_specs(b, params)
            partials = partial_groups(rows, keys, specs, budget)
            rows = _grouped(b, partials, params, budget)
        else:
            rows = windowed(b, rows, params, budget)
        return finish(b, rows, params, limit, offset, budget)
    if mode == "window":
        rows = windowed(b, itertools.chain(*inputs), params, budget)
        return finish(b, rows, params, limit, offset, budget)
    if mode == "group":
        partials = itertools.chain(*inputs)
        return finish(b, _grouped(b, partials, params, budget), params, limit, offset, budget)
    if mode == "sort":
        merged: Iterable[Any] = merge_sorted(*(((bytes(k), v) for k, v in i) for i in inputs))
        if b.distinct:
            merged = distinct(merged, budget, value_of=_value_of_pair)
        return offset_limit(strip_keys(merged), offset, limit)
    values: Iterable[Any] = itertools.chain(*inputs)
    if b.distinct:
        values = distinct(values, budget)
    return offset_limit(values, offset, limit)
