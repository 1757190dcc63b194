"""Merging slice streams at the scan coordinator: k-way merge, interleave, offset/limit."""

from __future__ import annotations

import asyncio
import random

import pytest

from shardex.errors import ErrorCode, ShardexError
from shardex.scan.merge import interleave, merge_ordered, pushdown_limit, window


class Source:
    """Blocks of a sorted list; counts fetches; can fail after some blocks."""

    def __init__(self, entries: list[bytes], block: int, fail_after: int | None = None) -> None:
        self.blocks = [entries[i : i + block] for i in range(0, len(entries), block)]
        self.fetched = 0
        self.fail_after = fail_after

    async def next_block(self) -> list[bytes] | None:
        await asyncio.sleep(0)  # a network hop: let the other sources run
        if self.fail_after is not None and self.fetched >= self.fail_after:
            raise ShardexError("slice died", code=ErrorCode.CONNECTION_CLOSED)
        if self.fetched >= len(self.blocks):
            return None
        self.fetched += 1
        return self.blocks[self.fetched - 1]


async def collect(gen) -> list[list[bytes]]:  # type: ignore[no-untyped-def]
    return [b async for b in gen]


def split(rng: random.Random, n_sources: int, n: int) -> tuple[list[list[bytes]], list[bytes]]:
    every = sorted({rng.randbytes(rng.randrange(1, 6)) for _ in range(n)})
    parts: list[list[bytes]] = [[] for _ in range(n_sources)]
    for e in every:
        parts[rng.randrange(n_sources)].append(e)
    return parts, every


@pytest.mark.parametrize("seed", range(20))
def test_merge_ordered_equals_sorted_union_with_offset_and_limit(seed: int) -> None:
    rng = random.Random(seed)
    parts, every = split(rng, rng.randrange(1, 6), rng.randrange(0, 300))
    offset = rng.randrange(0, 50)
    limit = rng.choice([None, 0, 1, rng.randrange(1, 100)])
    cap = pushdown_limit(offset, limit)
    # Each slice delivers at most offset + limit (the push-down), as an indexer does.
    sources = [Source(p[:cap] if cap is not None else p, rng.randrange(1, 9)) for p in parts]

    async def go() -> list[bytes]:
        blocks = await collect(window(merge_ordered(sources, block_rows=7), offset, limit))
        assert all(0 < len(b) <= 7 for b in blocks)
        return [e for b in blocks for e in b]

    got = asyncio.run(go())
    end = None if limit is None else offset + limit
    assert got == every[offset:end]


def test_merge_streams_a_partial_block_before_waiting_on_a_slow_source() -> None:
    fast = Source([b"a", b"c"], 2)
    slow_waiting = asyncio.Event()
    release = asyncio.Event()

    class Slow:
        n = 0

        async def next_block(self) -> list[bytes] | None:
            self.n += 1
            if self.n == 1:
                return [b"b"]
            slow_waiting.set()
            await release.wait()
            return None

    async def go() -> list[bytes]:
        gen = merge_ordered([fast, Slow()], block_rows=100)
        first = await anext(gen)
        assert first == [b"a", b"b"]  # handed over before the slow source is asked again
        rest = asyncio.ensure_future(anext(gen))
        await slow_waiting.wait()
        assert not rest.done()  # "c" waits: it may only follow once the slow slice is done
        release.set()
        return first + await rest

    assert asyncio.run(go()) == [b"a", b"b", b"c"]


def test_window_stops_pulling_once_the_limit_is_reached() -> None:
    src = Source([bytes([i]) for i in range(100)], 10)

    async def go() -> list[bytes]:
        return [e for b in await collect(window(merge_ordered([src], 10), 5, 12)) for e in b]

    assert asyncio.run(go()) == [bytes([i]) for i in range(5, 17)]
    assert src.fetched == 2  # 17 entries needed: two blocks of ten, not all ten blocks


@pytest.mark.parametrize("seed", range(10))
def test_interleave_delivers_every_block_once(seed: int) -> None:
    rng = random.Random(seed)
    parts, every = split(rng, 4, 200)
    sources = [Source(p, rng.randrange(1, 5)) for p in parts]
    blocks = asyncio.run(collect(interleave(sources)))
    assert sorted(e for b in blocks for e in b) == every
    # Bounded: larger blocks pass in pieces, every entry still once.
    sources = [Source(p, rng.randrange(1, 9)) for p in parts]
    blocks = asyncio.run(collect(interleave(sources, 3)))
    assert sorted(e for b in blocks for e in b) == every
    assert all(0 < len(b) <= 3 for b in blocks)


def test_a_failing_source_fails_the_merge_and_the_interleave() -> None:
    for make in (lambda s: merge_ordered(s, 4), interleave):
        sources = [Source([b"a", b"b", b"c"], 1), Source([b"d", b"e"], 1, fail_after=1)]
        with pytest.raises(ShardexError) as info:
            asyncio.run(collect(make(sources)))
        assert info.value.code is ErrorCode.CONNECTION_CLOSED
