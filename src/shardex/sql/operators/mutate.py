"""Document edits for UPDATE ... SET / UNSET (and MERGE's UPDATE): apply path assignments
to a copy of a document. Paths are the static ones the parser accepts (``a``, ``a.b``,
``a[0].c``). ``compile_edits`` / ``apply_edits`` are the one implementation both engines
use, ``SET ... FOR v IN arr [WHEN c] END`` (``syntax.update_for.ForSet``) included: every
value is evaluated against the document as it was before the statement."""

from __future__ import annotations

import copy
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from shardex.core.expr import (
    MISSING,
    Expr,
    Field,
    Identifier,
    Index,
    Literal,
    evaluate,
    static_path,
    truth,
)
from shardex.errors import ErrorCode, ShardexError
from shardex.sql.syntax.update_for import ForSet

PathStep = str | int


def path_steps(path: Expr, alias: str | None = None) -> list[PathStep]:
    """``a.b[0]`` -> ["a", "b", 0]; a leading ``alias.`` is dropped (``SET k.a = 1``)."""
    steps: list[PathStep] = []
    node = path
    while True:
        if isinstance(node, Field):
            steps.append(node.name)
            node = node.base
        elif isinstance(node, Index):
            assert isinstance(node.index, Literal)
            v = node.index.value
            steps.append(int(v) if isinstance(v, float) and v.is_integer() else v)
            node = node.base
        else:
            assert isinstance(node, Identifier)
            steps.append(node.name)
            break
    steps.reverse()
    if alias is not None and len(steps) > 1 and steps[0] == alias:
        steps = steps[1:]
    return steps


def set_path(doc: Any, steps: list[PathStep], value: Any) -> bool:
    """Assign in place, creating missing objects along the way; False if a step crosses a
    non-container or an out-of-range position (the document is left unchanged there).
    Assigning MISSING removes the field."""
    node = doc
    for i, step in enumerate(steps):
        last = i == len(steps) - 1
        if isinstance(step, str):
            if not isinstance(node, dict):
                return False
            if last:
                if value is MISSING:
                    node.pop(step, None)
                else:
                    node[step] = value
                return True
            if step not in node or not isinstance(node[step], dict | list):
                node[step] = {}
            node = node[step]
        else:
            if not isinstance(node, list) or not -len(node) <= step < len(node):
                return False
            if last:
                node[step] = None if value is MISSING else value
                return True
            node = node[step]
    return False


def _has(node: Any, step: PathStep) -> bool:
    if isinstance(step, str):
        return isinstance(node, dict) and step in node
    return isinstance(node, list) and -len(node) <= step < len(node)


def unset_path(doc: Any, steps: list[PathStep]) -> bool:
    """Remove the field or array element at ``steps``; False if it is not there."""
    node = doc
    for step in steps[:-1]:
        if not _has(node, step):
            return False
        node = node[step]
    if not _has(node, steps[-1]):
        return False
    del node[steps[-1]]
    return True


def updated_copy(doc: Any) -> Any:
    return copy.deepcopy(doc)


@dataclass(frozen=True, slots=True)
class _Assign:
    steps: list[PathStep]  # in the document, or in each element for a FOR assignment
    value: Expr
    each: ForSet | None = None  # SET ... FOR v IN array ... END
    array: list[PathStep] | None = None  # the array's path in the document


@dataclass(frozen=True, slots=True)
class Edits:
    """A statement's SET/UNSET, bound and with their paths as steps."""

    sets: tuple[_Assign, ...]
    unsets: tuple[list[PathStep], ...]


def compile_edits(
    sets: Sequence[tuple[Expr, Expr]],
    unsets: Sequence[Expr],
    alias: str,
    bind: Callable[[Expr], Expr],
) -> Edits:
    """``sets``/``unsets`` as parsed; ``bind`` resolves a value expression in the
    statement's scope. A FOR assignment's array must be a document path."""
    out: list[_Assign] = []
    for path, value in sets:
        if not isinstance(value, ForSet):
            out.append(_Assign(path_steps(path, alias), bind(value)))
            continue
        if static_path(value.source) is None:
            raise ShardexError(
                f"SET ... FOR {value.var} IN {value.source.to_text()}: the array must be a "
                "path in the document",
                code=ErrorCode.BAD_REQUEST,
                details={"array": value.source.to_text(), "hint": "FOR v IN items"},
            )
        array = path_steps(value.source, alias)
        steps = path_steps(path, value.var)
        bound = bind(value)
        assert isinstance(bound, ForSet)
        out.append(_Assign([] if steps == [value.var] else steps, bound.value, bound, array))
    return Edits(tuple(out), tuple(path_steps(p, alias) for p in unsets))


def get_path(doc: Any, steps: Sequence[PathStep]) -> Any:
    """The value at ``steps``, or MISSING."""
    node = doc
    for step in steps:
        if not _has(node, step):
            return MISSING
        node = node[step]
    return node


def apply_edits(edits: Edits, doc: Any, scope: dict[str, Any], params: Any) -> Any:
    """A copy of ``doc`` with the edits applied; ``scope`` is the statement's row (the
    document as it was, under its alias)."""
    new = updated_copy(doc)
    for a in edits.sets:
        if a.each is None:
            set_path(new, a.steps, evaluate(a.value, scope, params=params))
            continue
        assert a.array is not None
        items = get_path(new, a.array)
        before = get_path(doc, a.array)
        if not isinstance(items, list) or not isinstance(before, list):
            continue
        for i, element in enumerate(before):
            inner = {**scope, a.each.var: element}
            if a.each.when is not None and not truth(evaluate(a.each.when, inner, params=params)):
                continue
            v = evaluate(a.value, inner, params=params)
            if not a.steps:
                items[i] = None if v is MISSING else v
            else:
                set_path(items[i], a.steps, v)
    for steps in edits.unsets:
        unset_path(new, steps)
    return new
