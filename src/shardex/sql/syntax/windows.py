"""Window functions, bound: what a ``WindowCall`` becomes once its expressions read the rows
it is evaluated over (the document scope after WHERE, or a grouped query's group scope after
HAVING). The binder (``bind.py``) takes each call out of the projection and ORDER BY, puts a
reference to ``window_name(i)`` in its place and binds its parts; the window operator
(``operators/window.py``) sets that name on every row before the projection runs.
"""

from __future__ import annotations

from dataclasses import dataclass

from shardex.core.expr import Expr

from .ast import Frame, OrderTerm, WindowCall

__all__ = ["BoundWindow", "window_name"]


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
