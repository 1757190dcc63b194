"""``SET path = value FOR v IN array [WHEN cond] END``: an UPDATE (or MERGE) assignment
applied to each element of an array of the document (N1QL's "update for"). ``path`` starts
with the variable (``v.qty``, or ``v`` itself to replace the element); ``value`` and
``cond`` see the variable and the document. The node stands for the assigned value in the
statement's SET list; ``operators.mutate.apply_edits`` gives it its meaning."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from shardex.core.expr import Expr, format_identifier
from shardex.core.expr.ast import PREC_ATOM

__all__ = ["ForSet"]


@dataclass(frozen=True, slots=True)
class ForSet(Expr):
    value: Expr
    var: str
    source: Expr
    when: Expr | None = None
    precedence: ClassVar[int] = PREC_ATOM

    def children(self) -> tuple[Expr, ...]:
        out = [self.value, self.source]
        if self.when is not None:
            out.append(self.when)
        return tuple(out)

    def to_text(self) -> str:
        when = "" if self.when is None else f" WHEN {self.when.to_text()}"
        return (
            f"{self.value.to_text()} FOR {format_identifier(self.var)} IN "
            f"{self.source.to_text()}{when} END"
        )
