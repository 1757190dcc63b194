"""Document edits for UPDATE ... SET / UNSET: apply a path assignment to a copy of a
document. Paths are the static ones the parser accepts (``a``, ``a.b``, ``a[0].c``)."""

from __future__ import annotations

import copy
from typing import Any

from shardex.core.expr import MISSING, Expr, Field, Identifier, Index, Literal

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
