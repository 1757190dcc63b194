"""``merge_heads``: a small scan's slice replies combined in one sort give exactly what the
streaming k-way merge gives (entries in byte order, each once), and in arrival order when
the scan is unordered."""

from __future__ import annotations

import asyncio
import random

import pytest

from shardex.scan.merge import merge_heads, merge_ordered
from tests.unit.scan.test_scan_merge import Source, collect, split


@pytest.mark.parametrize("seed", range(30))
def test_one_sort_equals_the_k_way_merge(seed: int) -> None:
    rng = random.Random(seed)
    heads, every = split(rng, rng.randrange(1, 6), rng.randrange(0, 300))
    streamed = asyncio.run(collect(merge_ordered([Source(h, 1000) for h in heads])))
    assert merge_heads([list(h) for h in heads], ordered=True) == every
    assert [e for b in streamed for e in b] == every


def test_unordered_heads_come_one_after_the_other() -> None:
    heads = [[b"c", b"d"], [b"a"], [], [b"b"]]
    assert merge_heads(heads, ordered=False) == [b"c", b"d", b"a", b"b"]
    assert merge_heads([[b"z", b"y"]], ordered=True) == [b"z", b"y"]  # one head: as read
