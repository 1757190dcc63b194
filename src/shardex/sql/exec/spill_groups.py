"""GROUP BY and DISTINCT within a budget (decision 0106).

* ``partial_groups``: the PARTIAL aggregate of a leaf (and of a ``local`` root). Past the
  budget it hands its groups on and starts again: partial states merge exactly at FINAL, so
  a flush costs only more rows downstream, never a different result, and needs no disk.
* ``final_groups``: the FINAL aggregate. Past the budget the table is written to ``FANOUT``
  partition files by a hash of the group identity, emptied, and filled again (a flush each
  time it is full); at the end every partition is aggregated on its own, recursively (a new
  hash per level) when one still does not fit, up to ``MAX_LEVEL`` levels. Partial states
  merge exactly and each group's records are read in the order they were written, so every
  group's aggregates (ARRAY_AGG's element order included) equal the in-memory ones. Each
  group carries the position of its first partial; once spilled, the groups are put back in
  that order by an external sort on it: the in-memory order (first seen first), so an ORDER
  BY's ties come out alike too.
* ``distinct``: DISTINCT. Past the budget the values already sent are written as markers to
  the partition files, the rest of the input after them with its position; each partition
  then sends the first row of each value it has no marker of, and those rows are put back in
  input order (an external sort on the position): the in-memory result, order included.

A single group whose state alone is over the budget (an ARRAY_AGG, MEDIAN or DISTINCT
aggregate of a huge group) cannot be split: QUERY_MEMORY_LIMIT.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Generator, Iterable, Iterator, Sequence
from typing import Any, Final

from shardex.sql.exec.memory import Budget, Reservation, value_size
from shardex.sql.exec.rows import decode_row, encode_row, pack_state
from shardex.sql.exec.spill import RunReader, RunWriter, external_sort
from shardex.sql.operators import AggSpec, value_identity
from shardex.sql.operators.aggregate import (
    accumulate,
    finalize_state,
    init_state,
    merge_state,
)

__all__ = [
    "FANOUT",
    "MAX_LEVEL",
    "SET_ENTRY",
    "distinct",
    "final_groups",
    "part_of",
    "partial_groups",
    "position_key",
]

FANOUT: Final = 16  # ``part_of`` takes 4 bits of the hash per level
MAX_LEVEL: Final = 6  # FANOUT ** 6 partitions deep: only a single huge group gets this far
# A table entry beyond its key and states: the dict slot, the (kv, states) tuple, the list
# of states, the identity bytes object.
GROUP_OVERHEAD: Final = 100 + 56 + 56 + 33
STATE_SLOT: Final = 8
INIT_STATE: Final = 64  # a new state before any value (an int, an empty list or dict, ...)
SET_ENTRY: Final = 30 + 33  # a set slot at its load factor, and the bytes object
DICT_ENTRY: Final = 48 + 33  # a DISTINCT state's entry and its identity bytes

PartialGroup = tuple[tuple[Any, ...], tuple[Any, ...]]


def part_of(ident: bytes, level: int) -> int:
    """The partition of ``ident`` at ``level``: four other bits of its hash per level (a
    tuple's hash of ``(level, ident)`` does not split a partition: its low bits repeat)."""
    return (hash(ident) >> (4 * level)) & (FANOUT - 1)


def _ident(kv: Sequence[Any]) -> bytes:
    return b"".join(value_identity(v) for v in kv)


def _grows(spec: AggSpec) -> bool:
    """States that grow with their input (the others are fixed-size)."""
    return spec.distinct or spec.kind in ("ARRAY_AGG", "MEDIAN")


def _state_size(spec: AggSpec, state: Any) -> int:
    if spec.distinct:
        return value_size({}) + sum(DICT_ENTRY + len(k) + value_size(v) for k, v in state.items())
    return value_size(state)


def _added(spec: AggSpec, state: Any, before: int) -> int:
    """Bytes a growing state took on since it had ``before`` entries (a row adds one, a run
    of ``n`` equal rows ``n`` equal ones to an ARRAY_AGG, one to a DISTINCT state)."""
    grown = len(state) - before
    if grown == 0:
        return 0
    if spec.distinct:
        k, v = next(reversed(state.items()))
        return DICT_ENTRY + len(k) + value_size(v)
    return grown * (STATE_SLOT + value_size(state[-1]))


def partial_groups(
    rows: Iterable[Any],
    keys: Sequence[Callable[[Any], Any]],
    aggs: Sequence[AggSpec],
    budget: Budget,
    *,
    weighted: bool = False,
) -> Iterator[PartialGroup]:
    """PARTIAL phase within ``budget``: ``(key values, states)`` per group, a group again
    after each flush. MIN/MAX are charged their first value only (a later, longer one is
    not counted: one value per aggregate per group). ``weighted``: ``rows`` are ``(row,
    n)`` pairs, a run of ``n`` equal rows each (``fragment_rows.runs``)."""
    res = budget.reserve("GROUP BY")
    growing = [(i, a) for i, a in enumerate(aggs) if _grows(a)]
    # An entry: [key values, states, bytes charged for it].
    table: dict[bytes, list[Any]] = {}
    new_group = GROUP_OVERHEAD + (STATE_SLOT + INIT_STATE) * len(aggs)
    pairs: Iterable[tuple[Any, int]] = rows if weighted else ((r, 1) for r in rows)
    for row, n in pairs:
        kv = tuple(k(row) for k in keys)
        ident = _ident(kv)
        g = table.get(ident)
        size = 0
        if g is None:
            size = new_group + len(ident) + value_size(kv)
            g = table[ident] = [kv, [init_state(a) for a in aggs], 0]
        states = g[1]
        before = [len(states[i]) for i, _ in growing]
        for i, a in enumerate(aggs):
            states[i] = accumulate(a, states[i], row, n)
        for (i, a), had in zip(growing, before, strict=True):
            size += _added(a, states[i], had)
        if size:
            g[2] += size
            if not res.grow(size):
                yield from _handed_on(table, res)
                table = {}
    yield from _handed_on(table, res)


def _drained(table: dict[bytes, list[Any]], res: Reservation, size_at: int) -> Iterator[Any]:
    """The table's entries in order, the table emptied: each entry is let go as it goes
    downstream and its bytes given back, so the next operator's copy is not held twice
    (the list of references left is 8 bytes a group, not charged)."""
    entries = list(table.values())
    table.clear()
    for i, entry in enumerate(entries):
        entries[i] = None
        res.shrink(entry[size_at])
        yield entry
    res.release()


def _handed_on(table: dict[bytes, list[Any]], res: Reservation) -> Iterator[PartialGroup]:
    """The table's groups, going downstream."""
    for kv, states, _ in _drained(table, res, 2):
        yield kv, tuple(states)


class _Table:
    """One level of the FINAL aggregate: a table in memory, flushed to partitions. An entry
    is ``[key values, states, position of its first partial, bytes charged for it]``."""

    def __init__(self, aggs: Sequence[AggSpec], budget: Budget, res: Reservation, level: int):
        self.aggs = aggs
        self.budget = budget
        self.res = res
        self.level = level
        self.table: dict[bytes, list[Any]] = {}
        self.parts: list[RunWriter] | None = None

    def add(self, kv: Any, states: Sequence[Any], seq: int, ident: bytes | None = None) -> None:
        if ident is None:
            ident = _ident(kv)
        g = self.table.get(ident)
        aggs = self.aggs
        if g is None:
            size = GROUP_OVERHEAD + len(ident) + value_size(kv)
            size += sum(STATE_SLOT + _state_size(a, s) for a, s in zip(aggs, states, strict=True))
            self.table[ident] = [kv, list(states), seq, size]
        else:
            merged = g[1]
            size = 0
            for i, a in enumerate(aggs):
                if _grows(a):  # over-counts DISTINCT values both sides hold
                    size += _state_size(a, states[i])
                merged[i] = merge_state(a, merged[i], states[i])
            g[3] += size
        if not self.res.grow(size):
            self.flush()

    def flush(self) -> None:
        res, budget = self.res, self.budget
        if not budget.spill:
            raise res.over()
        if len(self.table) == 1 and res.used > budget.quota:
            raise res.over(
                why="one group's aggregate state (ARRAY_AGG, MEDIAN, DISTINCT) is larger"
            )
        if self.level >= MAX_LEVEL:
            raise res.over(why=f"a partition is still larger after {MAX_LEVEL} levels")
        if self.parts is None:
            q = budget.query
            self.parts = [RunWriter(q.new_file(f"group{self.level}")) for _ in range(FANOUT)]
        parts, level = self.parts, self.level
        for ident, (kv, states, seq, _) in self.table.items():
            cell = encode_row([list(kv), [pack_state(s) for s in states], seq])
            parts[part_of(ident, level)].write(ident, cell)
        self.table = {}
        res.release()

    def groups(self) -> Iterator[list[Any]]:
        """Every group, merged: from memory, or partition by partition."""
        if self.parts is None:
            yield from _drained(self.table, self.res, 3)
            return
        self.flush()
        for w in self.parts:
            w.close()
        for w in self.parts:
            if not w.count:
                os.unlink(w.path)
                continue
            sub = _Table(self.aggs, self.budget, self.res, self.level + 1)
            for ident, cell in RunReader(w.path):
                kv, states, seq = decode_row(cell)
                sub.add(kv, states, seq, ident)
            yield from sub.groups()


def position_key(seq: int) -> bytes:
    return seq.to_bytes(8, "big")


def final_groups(
    partials: Iterable[PartialGroup],
    aggs: Sequence[AggSpec],
    budget: Budget,
    *,
    global_group: bool = False,
) -> Iterator[tuple[tuple[Any, ...], tuple[Any, ...]]]:
    """FINAL phase within ``budget``: ``aggregate.final_aggregate``'s results, in its order."""
    t = _Table(aggs, budget, budget.reserve("GROUP BY"), 0)
    for seq, (kv, states) in enumerate(partials):
        t.add(kv, states, seq)
    spilled = t.parts is not None
    done = (
        (tuple(kv), tuple(finalize_state(a, s) for a, s in zip(aggs, states, strict=True)), seq)
        for kv, states, seq, _ in t.groups()
    )
    empty = True
    if not spilled:
        for kv, values, _ in done:
            empty = False
            yield kv, values
    else:
        by_first = ((position_key(seq), [kv, values]) for kv, values, seq in done)
        for _, (kv, values) in external_sort(by_first, budget, operator="GROUP BY"):
            empty = False
            yield tuple(kv), tuple(values)
    if global_group and empty:
        yield (), tuple(finalize_state(a, init_state(a)) for a in aggs)


# (identity, row, its position) read from the input; from a partition file (identity,
# _ENCODED, the cell [position, row]) or, for a value already sent, (identity, _MARK, b"").
# Sentinels: a row may itself be None (SELECT RAW of a NULL).
_ENCODED, _MARK = object(), object()
_Item = tuple[bytes, Any, Any]
Parts = list[RunWriter] | None


def distinct(
    rows: Iterable[Any],
    budget: Budget,
    value_of: Callable[[Any], Any] | None = None,
    operator: str = "DISTINCT",
) -> Iterator[Any]:
    """The first row of every distinct value (``value_of(row)``, default the row itself), in
    input order, within ``budget``."""
    res = budget.reserve(operator)

    def items() -> Iterator[_Item]:
        for seq, row in enumerate(rows):
            yield value_identity(row if value_of is None else value_of(row)), row, seq

    parts = yield from _distinct_pass(items(), budget, res, 0)
    if parts is None:
        return
    later = ((position_key(seq), row) for seq, row in _partitions(parts, budget, res, 1))
    for _, row in external_sort(later, budget, operator=operator):
        yield row


def _partitions(parts: list[RunWriter], budget: Budget, res: Reservation, level: int) -> Any:
    """``(position, row)`` of the rows the partitions send (in no particular order)."""
    for w in parts:
        w.close()
    for w in parts:
        if not w.count:
            os.unlink(w.path)
            continue
        records = ((i, _ENCODED if c else _MARK, c) for i, c in RunReader(w.path))
        deeper = yield from _distinct_pass(records, budget, res, level)
        if deeper is not None:
            yield from _partitions(deeper, budget, res, level + 1)


def _distinct_pass(
    items: Iterator[_Item], budget: Budget, res: Reservation, level: int
) -> Generator[Any, None, Parts]:
    """Sends the first row of each value not seen (at level 0 the rows, deeper the decoded
    ``[position, row]``) until the budget is spent, then writes the rest to partitions;
    returns them (None: all sent)."""
    seen: set[bytes] = set()  # values sent or marked, and (after a spill) values written
    parts: Parts = None
    for ident, row, extra in items:
        if ident in seen:
            continue
        seen.add(ident)
        if row is _MARK:
            if parts is not None:
                parts[part_of(ident, level)].write(ident, b"")
        elif parts is None:
            yield decode_row(extra) if row is _ENCODED else row
        else:
            cell = extra if row is _ENCODED else encode_row([extra, row])
            parts[part_of(ident, level)].write(ident, cell)
        if not res.grow(SET_ENTRY + len(ident)):
            if not budget.spill:
                raise res.over()
            if level >= MAX_LEVEL:
                raise res.over(why=f"a partition is still larger after {MAX_LEVEL} levels")
            if parts is None:
                q = budget.query
                parts = [RunWriter(q.new_file(f"distinct{level}")) for _ in range(FANOUT)]
                for sent in seen:
                    parts[part_of(sent, level)].write(sent, b"")
            seen = set()
            res.release()
    res.release()
    return parts
