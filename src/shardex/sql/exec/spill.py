"""Spill files and the external merge sort (decision 0106).

A spill file is a sequence of records ``(key bytes, cell bytes)``, each a little-endian u32
pair of lengths then the two byte strings. ``cell`` is a row in the fragments' row encoding
(``rows.encode_row``: msgpack with MISSING, exact sum states and big integers); an empty cell
marks a key alone (a DISTINCT value already sent). Files live in the query's spill directory
(``memory.QueryMemory``) and are removed once read, or with the directory.

``external_sort``: ORDER BY. Pairs ``(sort key, value)`` are held encoded (the value as its
cell, so the size charged is exact and the buffer several times smaller than the values);
past the budget the buffer is sorted (stable) into a run file and emptied; at the end the
runs are merged k-way, ``FAN_IN`` at a time, earlier runs first among equal keys, so the
result is the stable sort of the whole input: the same as sorting it in memory. With a
``limit`` (top-N) the buffer is cut to the first ``limit`` pairs whenever it holds twice that,
and every run and merge keeps only its first ``limit``.
"""

from __future__ import annotations

import heapq
import os
import struct
from collections.abc import Iterable, Iterator
from operator import itemgetter
from pathlib import Path
from typing import Any, BinaryIO, Final

from shardex.sql.exec.memory import Budget, QueryMemory
from shardex.sql.exec.rows import decode_row, encode_row

__all__ = ["FAN_IN", "RunReader", "RunWriter", "external_sort", "pair_size"]

_LENGTHS: Final = struct.Struct("<II")
IO_BUFFER: Final = 64 * 1024  # per open spill file: not charged (FAN_IN of them at most)
FAN_IN: Final = 16
# A buffered pair: the tuple, its list slot and two bytes objects, beyond their contents.
PAIR_OVERHEAD: Final = 56 + 8 + 2 * 33
_key = itemgetter(0)


def pair_size(key: bytes, cell: bytes) -> int:
    return PAIR_OVERHEAD + len(key) + len(cell)


class RunWriter:
    def __init__(self, path: Path) -> None:
        self.path = path
        self._f: BinaryIO = open(path, "wb", buffering=IO_BUFFER)  # noqa: SIM115
        self.count = 0

    def write(self, key: bytes, cell: bytes) -> None:
        self._f.write(_LENGTHS.pack(len(key), len(cell)))
        self._f.write(key)
        self._f.write(cell)
        self.count += 1

    def close(self) -> None:
        self._f.close()


class RunReader:
    """The records of a spill file, in order; the file is removed once read through."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def __iter__(self) -> Iterator[tuple[bytes, bytes]]:
        size = _LENGTHS.size
        unpack = _LENGTHS.unpack
        with open(self.path, "rb", buffering=IO_BUFFER) as f:
            read = f.read
            while True:
                head = read(size)
                if not head:
                    break
                klen, clen = unpack(head)
                yield read(klen), read(clen)
        os.unlink(self.path)


def _write_run(query: QueryMemory, pairs: Iterable[tuple[bytes, bytes]]) -> Path:
    w = RunWriter(query.new_file("run"))
    try:
        for key, cell in pairs:
            w.write(key, cell)
    finally:
        w.close()
    return w.path


class _Sorter:
    def __init__(self, budget: Budget, operator: str, limit: int | None) -> None:
        self.budget = budget
        self.limit = limit
        self.buf: list[tuple[bytes, bytes]] = []
        self.runs: list[Path] = []
        self.res = budget.reserve(operator, spill=self.spill)

    def add(self, key: bytes, value: Any) -> None:
        cell = encode_row(value)
        self.buf.append((key, cell))
        limit = self.limit
        if limit is not None and len(self.buf) >= 2 * limit + 64:
            self._cut()
        if not self.res.grow(pair_size(key, cell)):
            if limit is not None and len(self.buf) > limit:
                self._cut()  # a top-N first drops what cannot be in its result
                if self.res.used <= self.res.granted:
                    return
            if not self.budget.spill:
                raise self.res.over()
            if pair_size(key, cell) > self.budget.quota:
                raise self.res.over(why="one row is larger than the budget")
            self.spill()  # even one row: what holds the budget may be upstream

    def _cut(self) -> None:
        assert self.limit is not None
        self.buf.sort(key=_key)
        dropped = self.buf[self.limit :]
        del self.buf[self.limit :]
        self.res.shrink(sum(pair_size(k, c) for k, c in dropped))

    def spill(self) -> None:
        """The buffer as a sorted run on disk; its bytes go back to the budget."""
        if not self.buf:
            return
        self.buf.sort(key=_key)
        if self.limit is not None:
            del self.buf[self.limit :]
        self.runs.append(_write_run(self.budget.query, self.buf))
        self.buf = []
        self.res.release()

    def result(self) -> Iterator[tuple[bytes, Any]]:
        if not self.runs:
            yield from self._from_memory()
            return
        self.res.spill = None  # from here on it hands out what it holds: nothing to write
        self.spill()  # the rest too: the merge then holds only its read buffers
        runs = self.runs
        query = self.budget.query
        while len(runs) > FAN_IN:
            # The earliest runs first, their merge in their place: ties keep input order.
            merged = _write_run(query, self._merged(runs[:FAN_IN]))
            runs = [merged, *runs[FAN_IN:]]
        for key, cell in self._merged(runs):
            yield key, decode_row(cell)

    def _from_memory(self) -> Iterator[tuple[bytes, Any]]:
        """The buffer sorted, handed out from memory, each pair let go as it goes: what
        the consumer builds from the rows (a window's partition, a table) is not charged
        on top of them. The consumer may hold rows that can go nowhere (a window
        partition) while this still holds the pairs not handed out: another operator's
        ``grow`` may then make it write those (sorted already) as a run, read back after."""
        self.buf.sort(key=_key)
        if self.limit is not None:
            self._cut()
        out, self.buf = self.buf, []
        handed = 0
        rest: Path | None = None

        def spill_rest() -> None:
            nonlocal rest
            if handed < len(out):
                rest = _write_run(self.budget.query, out[handed:])
                del out[handed:]
            self.res.release()

        self.res.spill = spill_rest
        while handed < len(out):
            key, cell = out[handed]
            out[handed] = None  # type: ignore[call-overload]
            handed += 1
            self.res.shrink(pair_size(key, cell))
            yield key, decode_row(cell)
        self.res.spill = None
        self.res.release()
        if rest is not None:
            for key, cell in RunReader(rest):
                yield key, decode_row(cell)

    def _merged(self, runs: list[Path]) -> Iterator[tuple[bytes, bytes]]:
        # heapq.merge breaks ties by input position: an earlier run's pair comes first.
        merged: Iterator[tuple[bytes, bytes]] = heapq.merge(
            *(iter(RunReader(p)) for p in runs), key=_key
        )
        if self.limit is not None:
            for i, pair in enumerate(merged):
                if i >= self.limit:
                    return
                yield pair
            return
        yield from merged


def external_sort(
    pairs: Iterable[tuple[bytes, Any]],
    budget: Budget,
    limit: int | None = None,
    operator: str = "ORDER BY",
) -> Iterator[tuple[bytes, Any]]:
    """``pairs`` sorted by key, stable, the first ``limit`` of them (None: all), within
    ``budget`` (spilling past it, or QUERY_MEMORY_LIMIT when the query may not spill)."""
    if limit == 0:
        return
    s = _Sorter(budget, operator, limit)
    for key, value in pairs:
        s.add(key, value)
    yield from s.result()
