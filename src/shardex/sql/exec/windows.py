"""Window functions in the distributed plan: at the root, over every row the leaves send
(scope rows after WHERE) or over the final groups, within the query's memory budget
(decisions 0124, 0139).

A window needs its whole partition at once and the partitions depend on every row, so the
root reads the rows (``operators/window.py``), each charged to the budget as ``value_size``
estimates it. Past the budget the rows spill, one pass per window function:

* every row goes to an external sort (``spill.external_sort``) on its partition identity,
  its ORDER BY key and its input position (a prefix-free partition identity keeps each
  partition's rows together; the position makes the order among peers the input's, as the
  in-memory stable sort has it);
* the sorted rows come back one partition at a time: only that partition is held (charged)
  while the function's value is set in its rows, which then go on, with their positions, to
  the next function's sort;
* after the last function an external sort on the position puts the rows back in input
  order: the list the in-memory path gives, not only the same rows.

A single partition larger than the budget cannot be split (its frames read its other rows):
QUERY_MEMORY_LIMIT, as with spilling off.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from typing import Any

from shardex.sql.exec.memory import Budget, Reservation, value_size
from shardex.sql.exec.spill import external_sort
from shardex.sql.operators.window import (
    WindowSpec,
    evaluate_partition,
    order_key,
    partition_key,
    window_specs,
    windowed_in_place,
)
from shardex.sql.syntax.bind import BoundSelect

__all__ = ["spilling_window", "windowed"]

OPERATOR = "WINDOW"
Row = dict[str, Any]
# (input position, row): what one pass hands the next.
Placed = tuple[int, Row]


def windowed(b: BoundSelect, rows: Iterable[Any], params: Any, budget: Budget) -> Iterator[Any]:
    """``rows`` with ``b``'s window values set (``rows`` unchanged without windows)."""
    if not b.windows:
        return iter(rows)
    return spilling_window(rows, window_specs(b, params), budget)


def spilling_window(
    rows: Iterable[Row], specs: Sequence[WindowSpec], budget: Budget
) -> Iterator[Row]:
    """``rows`` (in their order), each a new dict with every window's value set, within
    ``budget``: in memory while the rows fit, else by sorted passes on disk."""
    held = budget.reserve(OPERATOR)
    out: list[Row] = []
    it = iter(rows)
    for row in it:
        out.append(dict(row))
        if not held.grow(value_size(row)):
            if not budget.spill:
                raise held.over(why="a window's rows are held whole and spilling is off")
            yield from _spilled(out, it, specs, budget, held)
            return
    yield from windowed_in_place(out, specs)
    held.release()


def _spilled(
    held_rows: list[Row],
    rest: Iterator[Row],
    specs: Sequence[WindowSpec],
    budget: Budget,
    held: Reservation,
) -> Iterator[Row]:
    def placed() -> Iterator[Placed]:
        # The rows held so far go first, each given back to the budget as the sort takes
        # it, then the rest of the input, copied as the in-memory path copies.
        for i, row in enumerate(held_rows):
            held_rows[i] = None  # type: ignore[call-overload]
            held.shrink(value_size(row))
            yield i, row
        held.release()
        for i, row in enumerate(rest, len(held_rows)):
            yield i, dict(row)

    passed: Iterator[Placed] = placed()
    for spec in specs:
        passed = _one_pass(passed, spec, budget)
    by_position = ((_position(i), row) for i, row in passed)
    for _, row in external_sort(by_position, budget, operator=OPERATOR):
        yield row


def _position(i: int) -> bytes:
    return i.to_bytes(8, "big")


def _one_pass(rows: Iterator[Placed], spec: WindowSpec, budget: Budget) -> Iterator[Placed]:
    """``spec``'s value set in every row, partition by partition off a sorted spill."""

    def keyed() -> Iterator[tuple[bytes, list[Any]]]:
        for i, row in rows:
            part, order = partition_key(spec, row), order_key(spec, row)
            yield part + order + _position(i), [len(part), len(order), i, row]

    res = budget.reserve(OPERATOR, fixed=True)
    current: bytes | None = None
    part_rows: list[Row] = []
    positions: list[int] = []
    order_keys: list[bytes] = []

    def evaluated() -> Iterator[Placed]:
        evaluate_partition(spec, part_rows, order_keys)
        yield from zip(positions, part_rows, strict=True)
        part_rows.clear()
        positions.clear()
        order_keys.clear()
        res.release()

    for key, (plen, olen, i, row) in external_sort(keyed(), budget, operator=OPERATOR):
        part = key[:plen]
        if part != current:
            if current is not None:
                yield from evaluated()
            current = part
        part_rows.append(row)
        positions.append(i)
        order_keys.append(key[plen : plen + olen])
        if not res.grow(value_size(row)):
            raise res.over(why="one window partition alone is larger than the budget")
    if current is not None:
        yield from evaluated()
