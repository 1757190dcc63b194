"""INTERSECT / EXCEPT [ALL] within a budget (decisions 0124, 0139).

The right side's values are a set of identities (``basic.value_identity``) the left rows
are tested against, in left order. While the set fits the budget that is all. Past it, the
set and the rest of the right side are written to ``FANOUT`` partition files by a hash of
the identity (``spill_groups.part_of``), and every left row, with its input position, to
the same partition of a second set of files; each partition pair is then tested on its own
(a right set per partition, the left rows streamed), recursively with a new hash per level
when a partition's set still does not fit, up to ``MAX_LEVEL`` levels. The rows kept are
put back in left order by an external sort on their position: the list the in-memory test
gives. With spilling off, QUERY_MEMORY_LIMIT names the operator.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

from shardex.sql.exec.memory import Budget, Reservation
from shardex.sql.exec.rows import decode_row, encode_row
from shardex.sql.exec.spill import RunReader, RunWriter, external_sort
from shardex.sql.exec.spill_groups import FANOUT, MAX_LEVEL, SET_ENTRY, part_of, position_key
from shardex.sql.operators import value_identity

__all__ = ["OPERATOR", "spilling_membership"]

OPERATOR = "INTERSECT/EXCEPT"
# (position in the left side, row) of a left row kept.
Kept = tuple[int, Any]


def spilling_membership(
    left: Iterable[Any], right: Iterable[Any], keep_members: bool, budget: Budget
) -> Iterator[Any]:
    """The left rows whose value ``right`` has (``keep_members``) or lacks, in left order,
    within ``budget`` (``operators.setops.membership``'s result)."""
    res = budget.reserve(OPERATOR)
    found: set[bytes] = set()
    parts: list[RunWriter] | None = None
    for value in right:
        ident = value_identity(value)
        if parts is not None:
            parts[part_of(ident, 0)].write(ident, b"")
        elif ident not in found:
            found.add(ident)
            if not res.grow(SET_ENTRY + len(ident)):
                parts = _spill_set(found, budget, res, 0)
                found = set()
    if parts is None:
        if not (keep_members and not found):  # N1QL's INTERSECT reads no left row then
            for value in left:
                if (value_identity(value) in found) is keep_members:
                    yield value
        res.release()
        return
    lefts = _writers(budget, "left", 0)
    for i, value in enumerate(left):
        ident = value_identity(value)
        lefts[part_of(ident, 0)].write(ident, encode_row([i, value]))
    kept = _partitions(parts, lefts, keep_members, budget, res, 1)
    by_position = ((position_key(i), row) for i, row in kept)
    for _, row in external_sort(by_position, budget, operator=OPERATOR):
        yield row


def _writers(budget: Budget, kind: str, level: int) -> list[RunWriter]:
    return [RunWriter(budget.query.new_file(f"{kind}{level}")) for _ in range(FANOUT)]


def _spill_set(found: set[bytes], budget: Budget, res: Reservation, level: int) -> list[RunWriter]:
    """The identities held, written to new partition files at ``level``; the set's bytes
    given back (the caller drops it)."""
    if not budget.spill:
        raise res.over(why="the right side's values are held to test against, spilling is off")
    if level >= MAX_LEVEL:
        raise res.over(why=f"a partition is still larger after {MAX_LEVEL} levels")
    parts = _writers(budget, "right", level)
    for ident in found:
        parts[part_of(ident, level)].write(ident, b"")
    res.release()
    return parts


def _partitions(
    rights: list[RunWriter],
    lefts: list[RunWriter],
    keep_members: bool,
    budget: Budget,
    res: Reservation,
    level: int,
) -> Iterator[Kept]:
    """The left rows kept, partition pair by partition pair (in no particular order)."""
    for w in (*rights, *lefts):
        w.close()
    for r, left in zip(rights, lefts, strict=True):
        if not left.count:  # no left row to test: the right partition is not read
            _remove(r.path, left.path)
            continue
        yield from _pair(r.path, left.path, keep_members, budget, res, level)


def _pair(
    right: Path, left: Path, keep_members: bool, budget: Budget, res: Reservation, level: int
) -> Iterator[Kept]:
    found: set[bytes] = set()
    deeper: list[RunWriter] | None = None
    for ident, _ in RunReader(right):
        if deeper is not None:
            deeper[part_of(ident, level)].write(ident, b"")
        elif ident not in found:
            found.add(ident)
            if not res.grow(SET_ENTRY + len(ident)):
                deeper = _spill_set(found, budget, res, level)
                found = set()
    if deeper is not None:
        lefts = _writers(budget, "left", level)
        for ident, cell in RunReader(left):
            lefts[part_of(ident, level)].write(ident, cell)
        yield from _partitions(deeper, lefts, keep_members, budget, res, level + 1)
        return
    for ident, cell in RunReader(left):
        if (ident in found) is keep_members:
            i, row = decode_row(cell)
            yield i, row
    res.release()


def _remove(*paths: Path) -> None:
    for p in paths:
        os.unlink(p)
