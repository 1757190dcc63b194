"""Set operations over result values: UNION, INTERSECT and EXCEPT, each with or without ALL,
as N1QL runs them.

Values are equal when their key-codec encodings are (``basic.value_identity``: SQL++
equality, 1 and 1.0 one value, TRUE not 1), the identity DISTINCT uses. N1QL's semantics,
which differ from SQL's bag rules for INTERSECT ALL and EXCEPT ALL:

* ``UNION ALL``: the left rows, then the right rows; ``UNION``: that, without duplicates
  (a duplicate within one branch goes too);
* ``INTERSECT ALL``: every left row (duplicates kept) whose value the right side has;
* ``EXCEPT ALL``: every left row whose value the right side does not have;
* without ALL: the same, then without duplicates.

Several operators combine left to right with one precedence (``combine``). The right side
of INTERSECT / EXCEPT is read whole first (a set of identities, ``remember`` told of each
new one so a caller can charge its memory budget); the left side streams. ``dedupe`` is the
DISTINCT to use (a budgeted, spilling one in the distributed plan).
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any

from .basic import distinct, value_identity

__all__ = ["combine", "set_operation"]

Dedupe = Callable[[Iterable[Any]], Iterator[Any]]


def set_operation(
    op: str,
    all_: bool,
    left: Iterable[Any],
    right: Iterable[Any],
    *,
    dedupe: Dedupe = distinct,
    remember: Callable[[bytes], None] | None = None,
) -> Iterator[Any]:
    """``left op [ALL] right`` (``op``: UNION, INTERSECT or EXCEPT)."""
    if op == "UNION":
        both = itertools.chain(left, right)
        return iter(both) if all_ else dedupe(both)
    if op not in ("INTERSECT", "EXCEPT"):
        raise ValueError(f"not a set operator: {op!r}")
    out = _membership(left, right, op == "INTERSECT", remember)
    return out if all_ else dedupe(out)


def _membership(
    left: Iterable[Any],
    right: Iterable[Any],
    keep_members: bool,
    remember: Callable[[bytes], None] | None,
) -> Iterator[Any]:
    members: set[bytes] = set()
    for value in right:
        ident = value_identity(value)
        if ident not in members:
            members.add(ident)
            if remember is not None:
                remember(ident)
    if keep_members and not members:
        return  # N1QL's INTERSECT reads no left row when the right side is empty
    for value in left:
        if (value_identity(value) in members) is keep_members:
            yield value


def combine(
    ops: Sequence[tuple[str, bool]],
    branches: Sequence[Callable[[], Iterable[Any]]],
    *,
    dedupe: Dedupe = distinct,
    remember: Callable[[bytes], None] | None = None,
) -> Iterator[Any]:
    """The branches' values joined by ``ops`` left to right (``ops[i]`` between the result
    so far and branch ``i + 1``). Each branch is a callable run when its values are first
    needed, so a branch is read once, in order."""
    if len(branches) != len(ops) + 1:
        raise ValueError(f"{len(branches)} branches for {len(ops)} set operators")
    out: Iterable[Any] = _lazy(branches[0])
    for (op, all_), branch in zip(ops, branches[1:], strict=True):
        out = set_operation(op, all_, out, _lazy(branch), dedupe=dedupe, remember=remember)
    return iter(out)


def _lazy(branch: Callable[[], Iterable[Any]]) -> Iterator[Any]:
    yield from branch()
