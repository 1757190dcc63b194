"""Combining the streams of several slices: k-way merge, interleave, offset and limit.

Pure stream logic, no network: a *source* is anything with ``async next_block() -> list of
entries | None`` (None at its end), so the same code merges indexer streams at the scan
coordinator and fake sources in the unit tests.

* ``merge_ordered``: a k-way merge on the raw entry bytes (entries sort by (key, docid), see
  ``shardex.core.keycodec``), holding at most one block per source, a block at a time
  (``shardex.core.sorted_runs``). Each source must itself
  be in entry order (a slice is; an indexer merges its local slices before sending).
* ``merge_heads``: the same order for sources whose entries are all at hand (a small scan's
  replies), in one sort;
* ``interleave``: unordered, blocks in whatever order they arrive, one fetch in flight per
  source (so no source is drained faster than the output is consumed).
* ``window``: offset and limit over the combined stream. With offset ``o`` and limit ``l``
  every source needs to deliver at most ``o + l`` entries (``pushdown_limit``): entries past
  that in one source are preceded, in the combined order, by ``o + l`` of its own.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Sequence
from typing import Protocol

from shardex.core.sorted_runs import merge_through

__all__ = [
    "BlockSource",
    "interleave",
    "merge_heads",
    "merge_ordered",
    "pushdown_limit",
    "window",
]


class BlockSource(Protocol):
    async def next_block(self) -> list[bytes] | None: ...


def _would_wait(source: BlockSource) -> bool:
    """Whether ``next_block`` may wait on the network: True unless the source says it has
    its answer at hand (``ready()``, as ``InStream`` has)."""
    ready = getattr(source, "ready", None)
    return ready is None or not ready()


def pushdown_limit(offset: int, limit: int | None) -> int | None:
    """What each slice must deliver at most for ``offset``/``limit`` over all slices."""
    return None if limit is None else offset + limit


async def merge_ordered(
    sources: Sequence[BlockSource], block_rows: int = 1000
) -> AsyncIterator[list[bytes]]:
    """Blocks of at most ``block_rows`` of the sources' entries in byte order, merged a
    block at a time (``core.sorted_runs.merge_through``). A non-empty partial block is
    emitted before waiting on a source (not when its next block is already at hand), so
    rows flow while slow slices are still reading and small scans come out as one block."""

    async def refill(source: BlockSource) -> list[bytes] | None:
        """The source's next non-empty block (None at its end)."""
        while True:
            block = await source.next_block()
            if block is None or block:
                return block

    # The first blocks of all sources are fetched concurrently: the slowest slice's start
    # latency is paid once, not once per slice.
    firsts = await asyncio.gather(*(refill(s) for s in sources))
    live = [(s, b) for s, b in zip(sources, firsts, strict=True) if b is not None]
    srcs = [s for s, _ in live]
    blocks = [b for _, b in live]
    pos = [0] * len(blocks)
    out: list[bytes] = []
    while blocks:
        if len(blocks) == 1:
            out += blocks[0][pos[0] :]
            pos[0] = len(blocks[0])
        else:
            out += merge_through(blocks, pos)
        if len(out) >= block_rows:
            full = len(out) - len(out) % block_rows
            for k in range(0, full, block_rows):
                yield out[k : k + block_rows]
            out = out[full:]
        for i in reversed(range(len(blocks))):
            if pos[i] < len(blocks[i]):
                continue
            if out and _would_wait(srcs[i]):  # hand over what is merged so far
                yield out
                out = []
            block = await refill(srcs[i])
            if block is None:
                del srcs[i], blocks[i], pos[i]
            else:
                blocks[i], pos[i] = block, 0
    if out:
        yield out


def merge_heads(heads: list[list[bytes]], ordered: bool) -> list[bytes]:
    """The entries of complete slice streams (every entry at hand) combined: in entry order
    when ``ordered`` - each head is sorted and no entry is in two slices, so one C sort (a
    merge of runs for timsort) gives ``merge_ordered``'s order - else one after the other."""
    if len(heads) == 1:
        return heads[0]
    rows = [e for head in heads for e in head]
    if ordered:
        rows.sort()
    return rows


async def interleave(
    sources: Sequence[BlockSource], block_rows: int | None = None
) -> AsyncIterator[list[bytes]]:
    """Blocks from all sources as they arrive, one fetch in flight per source; a block of
    more than ``block_rows`` entries (None: no bound) is passed on in pieces of that many."""
    pending: dict[asyncio.Task[list[bytes] | None], int] = {}

    def fetch(i: int) -> None:
        task = asyncio.ensure_future(sources[i].next_block())
        pending[task] = i

    for i in range(len(sources)):
        fetch(i)
    try:
        while pending:
            done, _ = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
            for task in done:
                i = pending.pop(task)
                block = task.result()  # a source's error ends the whole scan
                if block is None:
                    continue
                fetch(i)
                if block_rows is None or len(block) <= block_rows:
                    if block:
                        yield block
                    continue
                for k in range(0, len(block), block_rows):
                    yield block[k : k + block_rows]
    finally:
        for task in pending:
            task.cancel()
        if pending:
            await asyncio.gather(*pending, return_exceptions=True)


async def window(
    blocks: AsyncIterator[list[bytes]], offset: int, limit: int | None
) -> AsyncIterator[list[bytes]]:
    """Skip ``offset`` entries, then pass at most ``limit`` (None: all). Stops pulling from
    ``blocks`` as soon as the limit is reached."""
    skip = offset
    left = limit
    if left is not None and left <= 0:
        return
    async for block in blocks:
        if skip:
            if skip >= len(block):
                skip -= len(block)
                continue
            block = block[skip:]
            skip = 0
        if left is not None:
            if len(block) >= left:
                yield block[:left]
                return
            left -= len(block)
        yield block
