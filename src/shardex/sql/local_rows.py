"""The reference engine's row helpers: what ``LocalEngine`` and the distributed fragments
share (LIMIT/OFFSET counts, per-row compiled expressions, LET bindings, the projection with
DISTINCT/ORDER BY/OFFSET/LIMIT, set operations over in-memory branches, INSERT ... SELECT's
rows as VALUES)."""

from __future__ import annotations

import dataclasses
import functools
import math
import sys
import threading
from collections import OrderedDict
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Final

from shardex.core.expr import MISSING, Expr, Literal, Param, compile_expression, evaluate, walk
from shardex.errors import ErrorCode, ShardexError
from shardex.sql.operators import (
    ProjectTerm,
    SortSpec,
    UnnestSpec,
    distinct,
    encode_sort_key,
    offset_limit,
    project,
    sort_pairs,
    strip_keys,
)
from shardex.sql.operators.setops import combine
from shardex.sql.syntax import InsertStmt
from shardex.sql.syntax.bind import META_KEY, BoundSelect, resolve
from shardex.sql.syntax.bound_select import sort_scope
from shardex.sql.syntax.setops import RESULT_NAME, BoundQuery, BoundSetOp, result_scope

Params = Sequence[Any] | Mapping[str, Any] | None


@dataclass
class QueryResult:
    rows: list[Any] = field(default_factory=list)
    mutation_count: int = 0


COMPILED_MAX: Final = 4096
_compiled_lock = threading.Lock()
_compiled_fns: OrderedDict[int, tuple[Expr, Any]] = OrderedDict()


def compile_expr(expr: Expr) -> Any:
    """``compile_expression(expr)``, once per expression object: a cached bound statement
    (``statements.py``) brings the same trees to every execution, and a correlated
    subquery's to every evaluation; compiling them was most of a point query's operator
    time. Keyed by identity, the tree kept alive beside its function so the id cannot be
    reused; an LRU bounds it; any thread may call it."""
    key = id(expr)
    with _compiled_lock:
        hit = _compiled_fns.get(key)
        if hit is not None:
            _compiled_fns.move_to_end(key)
            return hit[1]
    fn = compile_expression(expr)
    with _compiled_lock:
        _compiled_fns[key] = (expr, fn)
        if len(_compiled_fns) > COMPILED_MAX:
            _compiled_fns.popitem(last=False)
    return fn


def eval_count(expr: Expr | None, params: Params, what: str) -> int | None:
    """LIMIT / OFFSET: a constant number (parameters allowed); negative counts are 0."""
    if expr is None:
        return None
    v = evaluate(expr, {}, params=params)
    if isinstance(v, bool) or not isinstance(v, int | float) or v != v:
        raise ShardexError(
            f"{what} must be a number, got {v!r}",
            code=ErrorCode.BAD_REQUEST,
            details={"clause": what, "value": repr(v), "hint": f"write {what} 10"},
        )
    if isinstance(v, float) and not v.is_integer():
        hint = f"write {what} {int(v)}" if math.isfinite(v) else f"write {what} 10"
        raise ShardexError(
            f"{what} must be an integer, got {v!r}",
            code=ErrorCode.BAD_REQUEST,
            details={"clause": what, "value": repr(v), "hint": hint},
        )
    # Past 2**63 - 1 no result is that long: the same as that many (and it fits every
    # slice and wire message a count goes through).
    return min(max(int(v), 0), sys.maxsize)


def inserted_values(stmt: InsertStmt, rows: Iterable[Any], params: Params) -> InsertStmt:
    """INSERT/UPSERT ... SELECT as the VALUES statement it amounts to: each row's key and
    value (a bare name in KEY / VALUE is a field of the row, SELF the row; without VALUE the
    value is the row), evaluated now, so the writes are checked like any VALUES'."""
    key = row_fn(resolve(stmt.key, RESULT_NAME, frozenset()), params) if stmt.key else None
    value = None if stmt.value is None else resolve(stmt.value, RESULT_NAME, frozenset())
    value_fn = None if value is None else row_fn(value, params)
    pairs = []
    for row in rows:
        scope = result_scope(row)
        k = key(scope) if key is not None else MISSING
        v = row if value_fn is None else value_fn(scope)
        pairs.append((Literal(k), Literal(v)))
    return dataclasses.replace(stmt, values=tuple(pairs), select=None)


def set_op_rows(
    q: BoundSetOp, params: Params, run_branch: Callable[[BoundQuery], Iterable[Any]]
) -> Iterator[Any]:
    """``q``'s result values in memory, each branch's from ``run_branch`` (the reference, and
    a set operation in a subquery expression wherever that runs)."""
    limit = eval_count(q.limit, params, "LIMIT")
    offset = eval_count(q.offset, params, "OFFSET") or 0
    if limit == 0:
        return iter(())
    values = combine(q.ops, [functools.partial(run_branch, b) for b in q.branches])
    key = set_op_sort_key(q, params)
    if key is not None:
        top = None if limit is None else offset + limit
        values = strip_keys(sort_pairs(((key(v), v) for v in values), top))
    return offset_limit(values, offset, limit)


def set_op_sort_key(q: BoundSetOp, params: Params) -> Callable[[Any], bytes] | None:
    """The sort key of a result value under a set operation's ORDER BY (None: unordered)."""
    if not q.order:
        return None
    specs = [SortSpec(o.desc, o.nulls_first) for _, o in q.order]
    fns = [compile_expr(e) for e, _ in q.order]

    def key(value: Any) -> bytes:
        row = result_scope(value)
        return encode_sort_key([f(row, None, params) for f in fns], specs)

    return key


def bind_expr(expr: Expr, alias: str) -> Expr:
    return resolve(expr, alias, frozenset({alias, META_KEY}))


def unnest_specs(b: BoundSelect, params: Params) -> list[UnnestSpec]:
    """The UNNEST steps of ``b`` as operator specs (shared with the fragments)."""
    return [UnnestSpec(alias, row_fn(e, params), outer) for alias, e, outer in b.unnests]


def params_of(exprs: Iterable[Expr | None]) -> set[str]:
    """The names of the parameters ``exprs`` read (None entries skipped)."""
    return {n.name for e in exprs if e is not None for n in walk(e) if isinstance(n, Param)}


def row_fn(expr: Expr, params: Params) -> Any:
    f = compile_expr(expr)
    return lambda row: f(row, None, params)


def with_bindings(
    rows: Iterable[dict[str, Any]], bindings: tuple[tuple[str, Expr], ...], params: Params
) -> Iterable[dict[str, Any]]:
    if not bindings:
        return rows
    fns = [(name, compile_expr(e)) for name, e in bindings]

    def gen() -> Iterator[dict[str, Any]]:
        for row in rows:
            row = dict(row)
            for name, f in fns:
                row[name] = f(row, None, params)
            yield row

    return gen()


def finish_rows(
    b: BoundSelect, rows: Iterable[Any], params: Params, limit: int | None, offset: int
) -> Iterator[Any]:
    """Projection, DISTINCT, ORDER BY, OFFSET and LIMIT."""
    terms = [ProjectTerm(row_fn(t.expr, params), t.name, t.star) for t in b.terms]
    raw = terms[0].value if b.raw else None
    if not b.order:
        out: Iterable[Any] = project(rows, terms, raw=raw)
        if b.distinct:
            out = distinct(out)
        return offset_limit(out, offset, limit)
    specs = [SortSpec(o.desc, o.nulls_first) for _, o in b.order]
    order_fns = [compile_expr(e) for e, _ in b.order]
    aliases = b.order_aliases

    def sort_key(row: dict[str, Any], value: Any) -> bytes:
        row = sort_scope(row, value, aliases)
        return encode_sort_key([f(row, None, params) for f in order_fns], specs)

    pairs: Iterable[Any] = project(rows, terms, raw=raw, sort_key=sort_key)
    if b.distinct:
        pairs = distinct(pairs, value_of=lambda p: p[1])
    top = None if limit is None else offset + limit
    return offset_limit(strip_keys(sort_pairs(pairs, top)), offset, limit)
