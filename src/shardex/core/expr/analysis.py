"""Static questions about an expression: which document paths it reads, whether it is
constant or deterministic. The SQL planner uses ``referenced_paths`` to decide whether an
index covers a query; the compiler uses ``is_constant`` to fold constants."""

from __future__ import annotations

from .ast import Expr, Field, FunctionCall, Identifier, Index, Literal, Meta, Param, walk
from .functions import FUNCTIONS

PathStep = str | int
Path = tuple[PathStep, ...]


def static_path(expr: Expr) -> Path | None:
    """The document path ``expr`` denotes if it is a plain path (``a.b[0].c``), else None.

    Steps are field names (str) and constant array positions (int). A constant string index
    (``a["b"]``) is a field step, as it reads the same value as ``a.b``.
    """
    if isinstance(expr, Identifier):
        return (expr.name,)
    if isinstance(expr, Field):
        base = static_path(expr.base)
        return None if base is None else (*base, expr.name)
    if isinstance(expr, Index):
        base = static_path(expr.base)
        step = _constant_step(expr.index)
        return None if base is None or step is None else (*base, step)
    return None


def _constant_step(index: Expr) -> PathStep | None:
    if not isinstance(index, Literal):
        return None
    v = index.value
    if type(v) is str:
        return v
    if type(v) is int:
        return v
    if type(v) is float and v.is_integer():
        return int(v)
    return None


def referenced_paths(expr: Expr) -> frozenset[Path]:
    """Every document path the expression reads, each as a tuple of steps.

    ``LOWER(a.b) || c[0]`` reads {("a", "b"), ("c", 0)}. A dynamic index reads the whole
    array: ``a[$i]`` reads {("a",)}. META() and parameters are not document paths and are
    not reported.
    """
    out: set[Path] = set()
    _collect(expr, out)
    return frozenset(out)


def _collect(expr: Expr, out: set[Path]) -> None:
    path = static_path(expr)
    if path is not None:
        out.add(path)
        return
    if isinstance(expr, Index):
        base = static_path(expr.base)
        if base is not None:
            out.add(base)
            _collect(expr.index, out)
            return
    for child in expr.children():
        _collect(child, out)


def is_deterministic(expr: Expr) -> bool:
    """Same inputs, same result: true unless a non-deterministic function is called (all
    built-ins are deterministic today; index key expressions must be)."""
    for node in walk(expr):
        if isinstance(node, FunctionCall):
            spec = FUNCTIONS.get(node.name)
            if spec is None or not spec.deterministic:
                return False
    return True


def is_constant(expr: Expr) -> bool:
    """Depends on nothing but itself: no document path, META(), parameter, unknown node
    type or non-deterministic function."""
    from .evaluator import _DISPATCH  # late import: evaluator imports nothing from here

    for node in walk(expr):
        if isinstance(node, Identifier | Meta | Param) or type(node) not in _DISPATCH:
            return False
        if isinstance(node, FunctionCall):
            spec = FUNCTIONS.get(node.name)
            if spec is None or not spec.deterministic:
                return False
    return True
