"""Window functions in the distributed plan: at the root, over every row the leaves send
(scope rows after WHERE) or over the final groups, within the query's memory budget.

A window needs its whole partition at once and the partitions depend on every row, so the
root reads them all (``operators/window.py``); each row held is charged to the budget as
``value_size`` estimates it, and past the budget the query fails with QUERY_MEMORY_LIMIT
naming WINDOW (the rows cannot spill: a sorted run of a partition would still need the
partition's other rows to frame each one). Decision 0124.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Any

from shardex.sql.exec.memory import Budget, value_size
from shardex.sql.operators.window import window, window_specs
from shardex.sql.syntax.bind import BoundSelect

__all__ = ["windowed"]


def windowed(b: BoundSelect, rows: Iterable[Any], params: Any, budget: Budget) -> Iterator[Any]:
    """``rows`` with ``b``'s window values set (``rows`` unchanged without windows)."""
    if not b.windows:
        return iter(rows)
    held = budget.reserve("WINDOW")

    def hold(row: Any) -> None:
        if not held.grow(value_size(row)):
            raise held.over(why="a window's rows are held whole")

    return window(rows, window_specs(b, params), hold)
