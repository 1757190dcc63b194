"""Window functions, bound: what a ``WindowCall`` becomes once its expressions read the rows
it is evaluated over (the document scope after WHERE, or a grouped query's group scope after
HAVING). The binder (``bind.py``) takes each call out of the projection and ORDER BY, puts a
reference to ``window_name(i)`` in its place and binds its parts; the window operator
(``operators/window.py``) sets that name on every row before the projection runs.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass

from shardex.core.expr import Expr, Identifier, walk

from .ast import FRAMELESS, Frame, OrderTerm, SelectStmt, WindowCall
from .binding_base import SqlSemanticError, map_children

__all__ = ["BoundWindow", "bind_windows", "extract_windows", "window_name"]


def window_name(i: int) -> str:
    """The scope name of the ``i``-th window value (NUL first: no user name collides)."""
    return f"\x00win{i}"


@dataclass(frozen=True)
class BoundWindow:
    name: str  # the scope name its value is set under
    function: str  # a WINDOW_FUNCTIONS name or an aggregate's
    args: tuple[Expr, ...]
    partition: tuple[Expr, ...]
    order: tuple[tuple[Expr, OrderTerm], ...]
    frame: Frame | None
    distinct: bool = False
    star: bool = False  # COUNT(*)
    ignore_nulls: bool = False
    from_last: bool = False
    call: WindowCall | None = None  # as written (EXPLAIN)

    def expressions(self) -> list[Expr]:
        out = [*self.args, *self.partition, *(e for e, _ in self.order)]
        if self.frame is not None:
            out += [b.offset for b in (self.frame.start, self.frame.end) if b.offset]
        return out


def extract_windows(stmt: SelectStmt) -> tuple[SelectStmt, list[WindowCall]]:
    """``stmt`` with each window call of its projection and ORDER BY replaced by a reference
    to ``window_name(i)`` (one per distinct call), and the calls; refused anywhere else."""
    clauses = [("LET", e) for _, e in stmt.let] + [("GROUP BY", e) for e in stmt.group_by]
    clauses += [("LETTING", e) for _, e in stmt.letting] + [
        ("UNNEST", u.expr) for u in stmt.unnests
    ]
    clauses += [(c, e) for c, e in (("WHERE", stmt.where), ("HAVING", stmt.having)) if e]
    for clause, e in clauses:
        for n in walk(e):
            if isinstance(n, WindowCall):
                raise SqlSemanticError(
                    f"window function {n.to_text()} is not allowed in {clause}",
                    details={
                        "expression": n.to_text(),
                        "hint": "use it in the projection or "
                        "ORDER BY (a subquery or WITH can filter on it)",
                    },
                )
    calls: list[WindowCall] = []
    defs = dict(stmt.windows)

    def sub(node: Expr) -> Expr:
        if isinstance(node, WindowCall):
            node = _named(node, defs, ())
            for part in node.children():
                if any(isinstance(n, WindowCall) for n in walk(part)):
                    raise SqlSemanticError(
                        f"window functions cannot be nested: {node.to_text()}",
                        details={"expression": node.to_text()},
                    )
            if node not in calls:
                calls.append(node)
            return Identifier(window_name(calls.index(node)))
        return map_children(node, sub)

    terms = tuple(
        t if t.expr is None else dataclasses.replace(t, expr=sub(t.expr)) for t in stmt.terms
    )
    order_by = tuple(dataclasses.replace(o, expr=sub(o.expr)) for o in stmt.order_by)
    if not calls:
        return stmt, []
    return dataclasses.replace(stmt, terms=terms, order_by=order_by), calls


def _named(call: WindowCall, defs: dict[str, WindowCall], seen: tuple[str, ...]) -> WindowCall:
    """``call`` with the window it names (WINDOW clause) taken in: its PARTITION BY, its
    ORDER BY unless ``call`` has one (not both), and its frame unless ``call`` has one."""
    name = call.ref
    if name is None:
        return call
    if name in seen:
        raise SqlSemanticError(
            f"window {name!r} is defined through itself",
            details={"window": name, "hint": "a window may name only another one"},
        )
    base = defs.get(name)
    if base is None:
        raise SqlSemanticError(
            f"window {name!r} is not defined",
            details={"window": name, "hint": f"add WINDOW {name} AS (...) before ORDER BY"},
        )
    base = _named(base, defs, (*seen, name))
    if call.partition:
        raise SqlSemanticError(
            f"OVER ({name} PARTITION BY ...): a window that names {name!r} takes its "
            "PARTITION BY from it",
            details={"window": name, "hint": f"put PARTITION BY in WINDOW {name} AS (...)"},
        )
    if call.order and base.order:
        raise SqlSemanticError(
            f"window {name!r} has an ORDER BY already",
            details={"window": name, "hint": f"order in WINDOW {name} AS (...) or here"},
        )
    order = call.order or base.order
    frame = call.frame if call.frame is not None else base.frame
    if call.name in FRAMELESS:
        frame = None  # they read the partition's order, whatever frame the window has
    if frame is not None and frame.unit in ("RANGE", "GROUPS") and not order:
        raise SqlSemanticError(
            f"a {frame.unit} frame needs ORDER BY in the window ({call.to_text()})",
            details={"window": name, "hint": "order the window"},
        )
    return dataclasses.replace(call, partition=base.partition, order=order, frame=frame, ref=None)


def bind_windows(calls: list[WindowCall], bind: Callable[[Expr], Expr]) -> tuple[BoundWindow, ...]:
    """Each call's arguments, PARTITION BY and ORDER BY bound over the rows it reads."""
    out = []
    for i, c in enumerate(calls):
        out.append(
            BoundWindow(
                window_name(i),
                c.name,
                tuple(bind(a) for a in c.args),
                tuple(bind(p) for p in c.partition),
                tuple((bind(o.expr), o) for o in c.order),
                c.frame,
                distinct=c.distinct,
                star=c.star,
                ignore_nulls=c.ignore_nulls,
                from_last=c.from_last,
                call=c,
            )
        )
    return tuple(out)
