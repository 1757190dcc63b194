"""A scan's entries on an indexer, from its slices' storage chunks to the blocks it sends.

Each slice yields its entries in the lists storage reads them in (``Slice.scan_chunks``);
an ordered scan merges them a chunk at a time (``core.sorted_runs.merge_chunks``), an
unordered one takes them one slice after the other, and ``limit`` cuts the result.
``EntryBlocks`` hands them out as blocks (cut by rows and bytes, ``take``) and knows when
nothing is left (``exhausted``, which may read one chunk ahead): whole lists move at each
step, not single entries (an indexer's per-entry iterator chain and ``heapq.merge`` cost
most of its CPU per row in a large scan).
"""

from __future__ import annotations

import bisect
import itertools
from collections.abc import Iterator, Sequence
from typing import Any, Final

from shardex.core.sorted_runs import limit_chunks, merge_chunks, next_chunk
from shardex.core.timestamp import Timestamp

__all__ = ["MAX_BLOCK_BYTES", "EntryBlocks", "open_entries"]

MAX_BLOCK_BYTES: Final = 1024 * 1024  # a block is cut here even below its row count


class EntryBlocks:
    """The entries of ``chunks`` (lists, not changed here), taken a block at a time."""

    def __init__(self, chunks: Iterator[list[bytes]]) -> None:
        self._chunks = chunks
        self._held: list[bytes] = []  # read from ``chunks``, not taken yet

    def take(self, n: int, max_bytes: int = MAX_BLOCK_BYTES) -> list[bytes]:
        """The next up to ``n`` entries, cut after the one that brings the block to
        ``max_bytes`` (empty: nothing left)."""
        parts = [self._held] if self._held else []
        have = len(self._held)
        while have < n:
            chunk = next_chunk(self._chunks)
            if chunk is None:
                break
            parts.append(chunk)
            have += len(chunk)
        if not parts:
            return []
        out = parts[0] if len(parts) == 1 else list(itertools.chain.from_iterable(parts))
        held: list[bytes] = []
        if len(out) > n:
            out, held = out[:n], out[n:]
        # Cut after the entry whose running size reaches ``max_bytes`` (C calls only).
        sizes = list(itertools.accumulate(map(len, out)))
        if sizes[-1] >= max_bytes:
            cut = bisect.bisect_left(sizes, max_bytes) + 1
            if cut < len(out):
                out, held = out[:cut], out[cut:] + held
        self._held = held
        return out

    def exhausted(self) -> bool:
        """Whether every entry was taken (reads the next chunk to know)."""
        if self._held:
            return False
        chunk = next_chunk(self._chunks)
        if chunk is None:
            return True
        self._held = chunk
        return False


def open_entries(
    slices: Sequence[Any],
    spans: list[Any] | None,
    read_ts: Timestamp | None,
    limit: int | None,
    ordered: bool,
    chunk_rows: int | None = None,
) -> EntryBlocks:
    """The slices' raw entries, merged in entry order when ``ordered``, cut at ``limit``.
    Each slice's iterators exist (its snapshot is pinned) on return; errors (rollback,
    SNAPSHOT_TOO_OLD) are raised here."""
    runs = [
        s.scan_chunks(spans, snapshot_ts=read_ts, limit=limit, chunk_rows=chunk_rows)
        for s in slices
    ]
    if len(runs) == 1:
        return EntryBlocks(runs[0])  # one slice: in entry order and cut at ``limit`` already
    merged = merge_chunks(runs) if ordered else itertools.chain.from_iterable(runs)
    return EntryBlocks(merged if limit is None else limit_chunks(merged, limit))
