"""Name binding for SELECT: turns a parsed statement into expressions that evaluate against
explicit scope rows, and checks what only makes sense with the whole statement in view.

Scopes (plain dicts, so rows stay JSON-like and cheap to ship between fragments):
- the document scope ``{alias: document, META_KEY: {"id": docid}, let vars...}``: FROM,
  LET, WHERE, GROUP BY keys and aggregate arguments;
- the group scope ``{group_key_name(i): value, aggregate_name(j): value, letting vars...}``
  of a grouped query: LETTING, HAVING, the projection and ORDER BY;
- ORDER BY additionally sees the projection's explicit aliases (``ORDER BY total`` where the
  projection has ``... AS total``), which take precedence over document fields.

A bare identifier that is not an alias, a LET/LETTING variable or a comprehension variable is
a field of the FROM alias (``firstName`` means ``customer.firstName``). In a grouped query
every reference outside aggregates must be (part of) a GROUP BY key, else it is an error.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from shardex.core.expr import Expr, Field, Identifier, Meta, Param, walk
from shardex.errors import ErrorCode, ShardexError

from .ast import (
    SELF_NAME,
    Aggregate,
    ArrayComprehension,
    Binding,
    CollectionPredicate,
    KeyspaceRef,
    OrderTerm,
    SelectStmt,
)

# Internal scope names start with NUL: no user identifier (even back-ticked) collides.
META_KEY = "\x00meta"


def group_key_name(i: int) -> str:
    return f"\x00gk{i}"


def aggregate_name(i: int) -> str:
    return f"\x00agg{i}"


class SqlSemanticError(ShardexError):
    """A statement that parses but cannot run (bad grouping, unknown alias, ...)."""

    default_code = ErrorCode.BAD_REQUEST


@dataclass(frozen=True)
class BoundTerm:
    """A projection term over the projection scope. ``star`` merges an object's fields."""

    name: str | None
    expr: Expr
    star: bool = False


@dataclass(frozen=True)
class BoundSelect:
    stmt: SelectStmt
    from_: KeyspaceRef | None
    alias: str | None
    lets: tuple[tuple[str, Expr], ...]
    where: Expr | None
    grouped: bool
    group_keys: tuple[Expr, ...]
    aggregates: tuple[Aggregate, ...]  # arguments bound over the document scope
    letting: tuple[tuple[str, Expr], ...]
    having: Expr | None
    terms: tuple[BoundTerm, ...]
    raw: bool
    distinct: bool
    order: tuple[tuple[Expr, OrderTerm], ...]
    order_aliases: tuple[str, ...]  # projection aliases ORDER BY reads
    limit: Expr | None
    offset: Expr | None

    def params(self) -> frozenset[str]:
        """Names of the parameters the statement uses ("1", "2", ... for positional); found
        once per bound statement (one serves every query of its text)."""
        found: frozenset[str] | None = self.__dict__.get("_params")
        if found is None:
            found = self._find_params()
            object.__setattr__(self, "_params", found)  # a cache, not state: frozen stays true
        return found

    def _find_params(self) -> frozenset[str]:
        s = self.stmt
        exprs: list[Expr] = [t.expr for t in s.terms if t.expr is not None]
        exprs += [e for _, e in s.let] + [e for _, e in s.letting] + list(s.group_by)
        exprs += [o.expr for o in s.order_by]
        exprs += [e for e in (s.where, s.having, s.limit, s.offset) if e is not None]
        if s.from_ is not None:
            exprs += [e for e in (s.from_.use_keys, s.from_.source) if e is not None]
        return frozenset(n.name for e in exprs for n in walk(e) if isinstance(n, Param))


# -- generic tree rewriting -------------------------------------------------------------------


def map_children(node: Expr, f: Callable[[Expr], Expr]) -> Expr:
    """``node`` with ``f`` applied to every direct child expression (a new node only when
    something changed)."""
    if not dataclasses.is_dataclass(node):
        return node
    changes: dict[str, Any] = {}
    for fld in dataclasses.fields(node):
        old = getattr(node, fld.name)
        new = _map_value(old, f)
        if new is not old:
            changes[fld.name] = new
    return dataclasses.replace(node, **changes) if changes else node


def _map_value(v: Any, f: Callable[[Expr], Expr]) -> Any:
    if isinstance(v, Expr):
        return f(v)
    if isinstance(v, Binding):
        src = f(v.source)
        return v if src is v.source else Binding(v.var, src, v.within)
    if isinstance(v, tuple):
        new = tuple(_map_value(x, f) for x in v)
        return v if all(a is b for a, b in zip(new, v, strict=True)) else new
    return v


def resolve(expr: Expr, alias: str | None, bound: frozenset[str]) -> Expr:
    """Bind identifiers (see the module doc) and META() to the document scope."""

    def f(node: Expr) -> Expr:
        return _resolve_node(node, alias, bound)

    return f(expr)


def _resolve_node(node: Expr, alias: str | None, bound: frozenset[str]) -> Expr:
    if isinstance(node, Identifier):
        if node.name == SELF_NAME and alias is not None:
            return Identifier(alias)
        if node.name in bound or alias is None:
            return node
        return Field(Identifier(alias), node.name)
    if isinstance(node, Meta):
        if node.keyspace is not None and node.keyspace != alias:
            raise SqlSemanticError(
                f"META({node.keyspace}) names no keyspace alias of this query",
                details={"alias": node.keyspace, "hint": f"use META({alias or ''})"},
            )
        return Identifier(META_KEY)
    if isinstance(node, CollectionPredicate | ArrayComprehension):
        # Each binding's source sees the variables bound before it; the body sees them all.
        inner = bound
        new_bindings = []
        for b in node.bindings:
            new_bindings.append(Binding(b.var, resolve(b.source, alias, inner), b.within))
            inner = inner | {b.var}
        if isinstance(node, CollectionPredicate):
            return CollectionPredicate(
                node.quantifier, tuple(new_bindings), resolve(node.satisfies, alias, inner)
            )
        when = None if node.when is None else resolve(node.when, alias, inner)
        return ArrayComprehension(
            resolve(node.mapping, alias, inner), tuple(new_bindings), when, node.first
        )
    return map_children(node, lambda c: _resolve_node(c, alias, bound))


def has_aggregate(expr: Expr) -> bool:
    return any(isinstance(n, Aggregate) for n in walk(expr))


# -- SELECT -----------------------------------------------------------------------------------


def implied_name(expr: Expr) -> str | None:
    """The result name a term gets without AS: the last field of a path, else None (SELF
    names no field: it is numbered like any other expression)."""
    if isinstance(expr, Identifier | Field) and expr.name != SELF_NAME:
        return expr.name
    return None


def bind_select(stmt: SelectStmt) -> BoundSelect:
    ref = stmt.from_
    alias = ref.as_name if ref is not None else None
    doc_bound = frozenset({alias, META_KEY} if alias else {META_KEY})

    lets: list[tuple[str, Expr]] = []
    for name, e in stmt.let:
        _no_aggregate(e, "LET")
        lets.append((name, resolve(e, alias, doc_bound)))
        doc_bound = doc_bound | {name}
    where = None
    if stmt.where is not None:
        _no_aggregate(stmt.where, "WHERE")
        where = resolve(stmt.where, alias, doc_bound)

    # Projection names.
    names: list[str | None] = []
    counter = 0
    for term in stmt.terms:
        if term.star:
            names.append(None)
            continue
        assert term.expr is not None
        name = term.alias or implied_name(term.expr)
        if name is None:
            counter += 1
            name = f"${counter}"
        names.append(name)
    seen: set[str] = set()
    for name in names:
        if name is None or stmt.raw:
            continue
        if name in seen:
            raise SqlSemanticError(
                f"duplicate result name {name!r} in the projection",
                details={"name": name, "hint": "give one of the terms another name with AS"},
            )
        seen.add(name)
    explicit = {t.alias for t in stmt.terms if t.alias is not None and not stmt.raw}

    uses_aggregates = any(
        has_aggregate(e)
        for e in [t.expr for t in stmt.terms if t.expr is not None]
        + [o.expr for o in stmt.order_by]
        + ([stmt.having] if stmt.having is not None else [])
        + [e for _, e in stmt.letting]
    )
    grouped = bool(stmt.group_by) or uses_aggregates

    order_exprs = [o.expr for o in stmt.order_by]
    order_bound = frozenset(explicit)
    grouping: _Grouping | None = None
    terms: list[BoundTerm] = []
    if grouped:
        grouping = _Grouping(stmt, alias, doc_bound)
        for term, name in zip(stmt.terms, names, strict=True):
            if term.expr is None:
                raise SqlSemanticError(
                    "SELECT * cannot be used with GROUP BY or aggregates",
                    details={"hint": "list the group keys and aggregates"},
                )
            terms.append(BoundTerm(name, grouping.bind(term.expr, "the projection"), term.star))
        order = tuple(
            (grouping.bind(e, "ORDER BY", extra=order_bound), o)
            for e, o in zip(order_exprs, stmt.order_by, strict=True)
        )
    else:
        for term, name in zip(stmt.terms, names, strict=True):
            if term.expr is None:
                if alias is not None:
                    terms.append(BoundTerm(alias, Identifier(alias)))
                continue
            terms.append(BoundTerm(name, resolve(term.expr, alias, doc_bound), term.star))
        order = tuple(
            (resolve(e, alias, doc_bound | order_bound), o)
            for e, o in zip(order_exprs, stmt.order_by, strict=True)
        )
    return BoundSelect(
        stmt=stmt,
        from_=ref,
        alias=alias,
        lets=tuple(lets),
        where=where,
        grouped=grouping is not None,
        group_keys=grouping.keys if grouping else (),
        aggregates=tuple(grouping.aggregates) if grouping else (),
        letting=grouping.letting if grouping else (),
        having=grouping.having if grouping else None,
        terms=tuple(terms),
        raw=stmt.raw,
        distinct=stmt.distinct,
        order=order,
        order_aliases=_aliases_used(order, order_bound),
        limit=stmt.limit,
        offset=stmt.offset,
    )


def _aliases_used(order: tuple[tuple[Expr, OrderTerm], ...], aliases: frozenset[str]) -> tuple:
    used = {
        n.name for e, _ in order for n in walk(e) if isinstance(n, Identifier) and n.name in aliases
    }
    return tuple(sorted(used))


def _no_aggregate(expr: Expr, clause: str) -> None:
    for n in walk(expr):
        if isinstance(n, Aggregate):
            raise SqlSemanticError(
                f"aggregate {n.to_text()} is not allowed in {clause}",
                details={"aggregate": n.to_text(), "hint": "use HAVING to filter groups"},
            )


class _Grouping:
    """Rewrites grouped-query expressions to read the group scope."""

    def __init__(self, stmt: SelectStmt, alias: str | None, doc_bound: frozenset[str]) -> None:
        self.alias = alias
        self.doc_bound = doc_bound
        keys = []
        for e in stmt.group_by:
            _no_aggregate(e, "GROUP BY")
            keys.append(resolve(e, alias, doc_bound))
        self.keys = tuple(keys)
        self.aggregates: list[Aggregate] = []
        self.group_bound: frozenset[str] = frozenset()
        letting = []
        for name, e in stmt.letting:
            letting.append((name, self.bind(e, "LETTING")))
            self.group_bound = self.group_bound | {name}
        self.letting = tuple(letting)
        self.having = None if stmt.having is None else self.bind(stmt.having, "HAVING")

    def bind(self, expr: Expr, clause: str, extra: frozenset[str] = frozenset()) -> Expr:
        # Names bound in the group scope (LETTING vars, ORDER BY's projection aliases) stay.
        keep = self.group_bound | extra
        resolved = resolve(expr, self.alias, self.doc_bound | keep)
        out = self._substitute(resolved)
        for n in walk(out):
            if isinstance(n, CollectionPredicate | ArrayComprehension):
                keep = keep | {b.var for b in n.bindings}
        for n in walk(out):
            if isinstance(n, Identifier) and n.name not in keep and not n.name.startswith("\x00"):
                raise SqlSemanticError(
                    f"{expr.to_text()} in {clause} is neither a GROUP BY key nor an aggregate",
                    details={"expression": expr.to_text(), "hint": "group by it or aggregate it"},
                )
            if isinstance(n, Identifier) and n.name == META_KEY:
                raise SqlSemanticError(
                    f"META() in {clause} of a grouped query is not a GROUP BY key",
                    details={"expression": expr.to_text(), "hint": "group by META().id"},
                )
        return out

    def _substitute(self, node: Expr) -> Expr:
        for i, k in enumerate(self.keys):
            if node == k:
                return Identifier(group_key_name(i))
        if isinstance(node, Aggregate):
            if node.arg is not None and has_aggregate(node.arg):
                raise SqlSemanticError(
                    f"aggregates cannot be nested: {node.to_text()}",
                    details={"expression": node.to_text()},
                )
            if node not in self.aggregates:
                self.aggregates.append(node)
            return Identifier(aggregate_name(self.aggregates.index(node)))
        return map_children(node, self._substitute)
