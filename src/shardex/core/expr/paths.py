"""Compiled document paths: the most frequent node in index key expressions.

``a.b.c`` becomes ``d["a"]["b"]["c"]`` inside one ``try``; paths with array positions use an
inlined loop with explicit type checks. Semantics are those of ``ops.get_field`` and
``ops.get_element`` (anything that is not there is MISSING).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import shardex.core.expr.ops as ops
from shardex.core.values import MISSING

CompiledExpr = Callable[..., Any]


def compile_path(steps: tuple[str | int, ...]) -> CompiledExpr:
    """A closure reading ``steps`` (field names and array positions) from the document."""
    if all(type(s) is str for s in steps):
        # Only dicts can be subscripted by a str without TypeError among JSON values, and
        # a KeyError means the field is absent: one try covers every way to be MISSING.
        if len(steps) == 1:
            (k0,) = steps

            def f1(d: Any, m: Any = None, p: Any = None) -> Any:
                try:
                    return d[k0]
                except (KeyError, TypeError):
                    return MISSING

            return f1
        if len(steps) == 2:
            k0, k1 = steps

            def f2(d: Any, m: Any = None, p: Any = None) -> Any:
                try:
                    return d[k0][k1]
                except (KeyError, TypeError):
                    return MISSING

            return f2
        if len(steps) == 3:
            k0, k1, k2 = steps

            def f3(d: Any, m: Any = None, p: Any = None) -> Any:
                try:
                    return d[k0][k1][k2]
                except (KeyError, TypeError):
                    return MISSING

            return f3

    # Mixed steps: a str indexes characters and a dict accepts any hashable key, so array
    # positions need explicit type checks. Inlined: this runs for a[0].b on every document.
    typed = tuple((type(s) is str, s) for s in steps)
    get_field, get_element = ops.get_field, ops.get_element

    def fn(d: Any, m: Any = None, p: Any = None) -> Any:
        v = d
        for is_field, key in typed:
            if is_field:
                if type(v) is dict:
                    v = v.get(key, MISSING)
                    if v is MISSING:
                        return MISSING
                else:
                    v = get_field(v, key)  # type: ignore[arg-type]
                    if v is MISSING:
                        return MISSING
            elif type(v) is list:
                try:
                    v = v[key]
                except IndexError:
                    return MISSING
            else:
                v = get_element(v, key)
                if v is MISSING:
                    return MISSING
        return v

    return fn
