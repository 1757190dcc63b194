"""What the binding modules build on: the error of a statement that parses but cannot run,
and generic rewriting of expression trees (``bind.py`` re-exports both)."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

from shardex.core.expr import Expr
from shardex.errors import ErrorCode, ShardexError

from .ast import Binding

__all__ = ["SqlSemanticError", "map_children"]


class SqlSemanticError(ShardexError):
    """A statement that parses but cannot run (bad grouping, unknown alias, ...)."""

    default_code = ErrorCode.BAD_REQUEST


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
