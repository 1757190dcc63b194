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
of INTERSECT / EXCEPT is read whole first (a set of identities); the left side streams.
``dedupe`` is the DISTINCT to use and ``members`` the INTERSECT / EXCEPT test (budgeted,
spilling ones in the distributed plan: ``exec/spill_sets.py``).
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any

from .basic import distinct, value_identity

__all__ = ["Members", "combine", "membership", "set_operation"]

Dedupe = Callable[[Iterable[Any]], Iterator[Any]]
# (left, right, keep_members) -> the left rows whose value the right side has (keep_members)
# or lacks, in left order.
Members = Callable[[Iterable[Any], Iterable[Any], bool], Iterator[Any]]


def set_operation(
    op: str,
    all_: bool,
    left: Iterable[Any],
    right: Iterable[Any],
    *,
    dedupe: Dedupe | None = None,
    members: Members | None = None,
) -> Iterator[Any]:
    """``left op [ALL] right`` (``op``: UNION, INTERSECT or EXCEPT)."""
    dedupe = distinct if dedupe is None else dedupe
    members = membership if members is None else members
    if op == "UNION":
        both = itertools.chain(left, right)
        return iter(both) if all_ else dedupe(both)
    if op not in ("INTERSECT", "EXCEPT"):
        raise ValueError(f"not a set operator: {op!r}")
    out = members(left, right, op == "INTERSECT")
    return out if all_ else dedupe(out)


def membership(left: Iterable[Any], right: Iterable[Any], keep_members: bool) -> Iterator[Any]:
    """The left rows whose value ``right`` has (``keep_members``) or lacks, in left order."""
    found = {value_identity(value) for value in right}
    if keep_members and not found:
        return  # N1QL's INTERSECT reads no left row when the right side is empty
    for value in left:
        if (value_identity(value) in found) is keep_members:
            yield value


def combine(
    ops: Sequence[tuple[str, bool]],
    branches: Sequence[Callable[[], Iterable[Any]]],
    *,
    dedupe: Dedupe | None = None,
    members: Members | None = None,
) -> Iterator[Any]:
    """The branches' values joined by ``ops`` left to right (``ops[i]`` between the result
    so far and branch ``i + 1``). Each branch is a callable run when its values are first
    needed, so a branch is read once, in order."""
    if len(branches) != len(ops) + 1:
        raise ValueError(f"{len(branches)} branches for {len(ops)} set operators")
    out: Iterable[Any] = _lazy(branches[0])
    for (op, all_), branch in zip(ops, branches[1:], strict=True):
        out = set_operation(op, all_, out, _lazy(branch), dedupe=dedupe, members=members)
    return iter(out)


def _lazy(branch: Callable[[], Iterable[Any]]) -> Iterator[Any]:
    yield from branch()
