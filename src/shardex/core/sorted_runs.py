"""Merging sorted runs of byte strings a block at a time: an indexer's local slices, the scan
coordinator's indexer streams.

A run arrives as sorted lists (chunks read from storage, blocks off the wire), each list
starting after the previous one ends. ``heapq``'s merges move one entry per step in bytecode
(a pop, a push, a tuple): about a quarter of a microsecond per entry, which a large scan pays
once per hop. Here the step is a block: every entry up to the least of the current blocks'
last entries can be emitted now, since every entry still unread in any run is greater, so
each source's part is cut by one bisection and the parts are merged by one C sort (timsort
finds the sorted parts and merges them). Each step uses up at least one block: the
one holding that least entry.
"""

from __future__ import annotations

from bisect import bisect_right
from collections.abc import Iterable, Iterator, Sequence

__all__ = ["limit_chunks", "merge_chunks", "merge_through", "next_chunk"]


def merge_through(blocks: Sequence[list[bytes]], pos: list[int]) -> list[bytes]:
    """The entries of ``blocks[i][pos[i]:]`` (each non-empty and sorted) up to the least of
    the blocks' last entries, in order; ``pos`` moves past them. Every block whose last
    entry is that least one is used up (``pos[i] == len(blocks[i])``) and is the caller's
    to refill; an entry not taken is greater than every entry taken."""
    bound = min([b[-1] for b in blocks])
    out: list[bytes] = []
    parts = 0
    for i, block in enumerate(blocks):
        start = pos[i]
        end = len(block) if block[-1] == bound else bisect_right(block, bound, start)
        if end > start:
            out += block[start:end] if start or end < len(block) else block
            parts += 1
            pos[i] = end
    if parts > 1:
        out.sort()
    return out


def next_chunk(chunks: Iterator[list[bytes]]) -> list[bytes] | None:
    """The next non-empty list of ``chunks`` (None at its end)."""
    for chunk in chunks:
        if chunk:
            return chunk
    return None


def merge_chunks(runs: Iterable[Iterator[list[bytes]]]) -> Iterator[list[bytes]]:
    """One sorted run of lists out of ``runs`` (each a sorted run of lists; no entry in two
    runs, or equal ones come out side by side). The lists yielded may be a run's own
    lists: the caller must not change them."""
    sources: list[Iterator[list[bytes]]] = []
    blocks: list[list[bytes]] = []
    for run in runs:
        first = next_chunk(run)
        if first is not None:
            sources.append(run)
            blocks.append(first)
    pos = [0] * len(blocks)
    while len(blocks) > 1:
        yield merge_through(blocks, pos)
        for i in reversed(range(len(blocks))):
            if pos[i] == len(blocks[i]):
                chunk = next_chunk(sources[i])
                if chunk is None:
                    del sources[i], blocks[i], pos[i]
                else:
                    blocks[i], pos[i] = chunk, 0
    if blocks:
        yield blocks[0][pos[0] :] if pos[0] else blocks[0]
        yield from filter(None, sources[0])


def limit_chunks(chunks: Iterator[list[bytes]], limit: int) -> Iterator[list[bytes]]:
    """``chunks`` cut after ``limit`` entries in all (none for ``limit <= 0``); nothing is
    pulled from ``chunks`` after the list that reaches the limit."""
    left = limit
    if left <= 0:
        return
    for chunk in chunks:
        if len(chunk) >= left:
            yield chunk[:left]
            return
        left -= len(chunk)
        yield chunk
