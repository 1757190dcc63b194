"""What a bound SELECT is (``bind.bind_select`` makes one): its expressions over explicit
scope rows, the scope names of its group keys and aggregates, and its subqueries."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from shardex.core.expr import MISSING, Expr, Param, walk

from .ast import Aggregate, KeyspaceRef, OrderTerm, SelectStmt
from .join_syntax import BoundJoin
from .subquery import BoundSubquery
from .windows import BoundWindow

__all__ = [
    "BoundSelect",
    "BoundTerm",
    "aggregate_name",
    "group_key_name",
    "order_alias_name",
    "ordered_aliases",
    "sort_scope",
    "subqueries_of",
]

# Internal scope names start with NUL: no user identifier (even back-ticked) collides.
# META_KEY (ast.py) is the FROM term's META().


def group_key_name(i: int) -> str:
    return f"\x00gk{i}"


def aggregate_name(i: int) -> str:
    return f"\x00agg{i}"


def order_alias_name(alias: str) -> str:
    """The sort scope's name of projection alias ``alias`` in ORDER BY: never a document
    scope name, so an alias named like the FROM alias (``SELECT a AS t FROM t ORDER BY k``,
    ``k`` being ``t.k``) shadows nothing."""
    return f"\x00ord.{alias}"


def sort_scope(row: dict[str, Any], value: Any, aliases: tuple[str, ...]) -> dict[str, Any]:
    """The row ORDER BY is evaluated on: the document scope ``row`` plus the projection
    aliases it reads (``BoundSelect.order_aliases``) taken from the projected ``value``."""
    if not aliases:
        return row
    return {**row, **{order_alias_name(a): value.get(a, MISSING) for a in aliases}}


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
    # UNNEST terms, bound over the document scope: (alias, array expression, LEFT).
    unnests: tuple[tuple[str, Expr, bool], ...] = ()
    outer: frozenset[str] = frozenset()  # an enclosing query's names (a subquery's)
    joins: tuple[BoundJoin, ...] = ()  # JOIN / NEST terms, each after ``position`` UNNESTs
    # Window functions of the projection and ORDER BY, evaluated before the projection.
    windows: tuple[BoundWindow, ...] = ()

    @property
    def aliases(self) -> tuple[str, ...]:
        """The names the FROM clause binds in the document scope: its term, then its JOIN,
        NEST and UNNEST terms in the order written."""
        first = [] if self.alias is None else [self.alias]
        return tuple(first + ordered_aliases(list(self.unnests), list(self.joins)))

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
        exprs += [u.expr for u in s.unnests] + [e for w in self.windows for e in w.expressions()]
        exprs += [e for j in s.joins for e in (j.on_keys, j.on_key, j.on) if e is not None]
        found = {n.name for e in exprs for n in walk(e) if isinstance(n, Param)}
        for sub in subqueries_of(self):
            found |= sub.bound.params()
        return frozenset(found)

    def expressions(self) -> list[Expr]:
        """Every bound expression of the statement (not those inside its subqueries)."""
        out: list[Expr] = [e for _, e in self.lets] + [e for _, e, _ in self.unnests]
        out += [e for j in self.joins for e in j.expressions()]
        out += [e for e in (self.where, self.having) if e is not None]
        out += list(self.group_keys) + [a.arg for a in self.aggregates if a.arg is not None]
        out += [e for _, e in self.letting] + [t.expr for t in self.terms]
        out += [e for e, _ in self.order] + [e for w in self.windows for e in w.expressions()]
        ref = self.from_
        if ref is not None:
            out += [e for e in (ref.use_keys, ref.source) if e is not None]
        return out


def subqueries_of(b: BoundSelect) -> list[BoundSubquery]:
    """The subqueries directly in ``b``'s expressions (not those nested inside them)."""
    return [n for e in b.expressions() for n in walk(e) if isinstance(n, BoundSubquery)]


def ordered_aliases(unnests: list[tuple[str, Expr, bool]], joins: list[BoundJoin]) -> list[str]:
    out: list[str] = []
    for i in range(len(unnests) + 1):
        out += [j.alias for j in joins if j.position == i]
        if i < len(unnests):
            out.append(unnests[i][0])
    return out
