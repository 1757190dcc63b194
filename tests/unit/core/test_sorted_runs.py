"""``core.sorted_runs``: merging sorted runs of entries a block at a time gives the sorted
union, whatever the runs' chunking, and leaves the lists it is handed unchanged."""

from __future__ import annotations

import random

from hypothesis import given, settings
from hypothesis import strategies as st

from shardex.core.sorted_runs import merge_chunks, merge_through


def _chunked(run: list[bytes], rnd: random.Random) -> list[list[bytes]]:
    """``run`` cut into lists of random sizes, empty ones among them."""
    out: list[list[bytes]] = []
    i = 0
    while i < len(run):
        n = rnd.randint(0, 5)
        out.append(run[i : i + n])
        i += n
    if rnd.random() < 0.3:
        out.insert(rnd.randint(0, len(out)), [])
    return out


@settings(max_examples=300, deadline=None)
@given(
    entries=st.sets(st.binary(max_size=4), max_size=60),
    n_runs=st.integers(1, 5),
    rnd=st.randoms(use_true_random=False),
)
def test_merged_chunks_are_the_sorted_union(entries: set[bytes], n_runs: int, rnd) -> None:
    runs: list[list[bytes]] = [[] for _ in range(n_runs)]
    for e in entries:
        runs[rnd.randrange(n_runs)].append(e)
    chunked = [_chunked(sorted(r), rnd) for r in runs]
    frozen = [[list(c) for c in run] for run in chunked]
    merged = list(merge_chunks(iter(run) for run in chunked))
    assert [e for chunk in merged for e in chunk] == sorted(entries)
    assert all(merged)  # no empty list comes out
    assert chunked == frozen


def test_merge_through_takes_up_to_the_least_last_entry() -> None:
    a, b, c = [b"a", b"d", b"g"], [b"b", b"c", b"e", b"h"], [b"f"]
    pos = [0, 1, 0]
    assert merge_through([a, b, c], pos) == [b"a", b"c", b"d", b"e", b"f"]
    assert pos == [2, 3, 1]  # c is used up; a and b keep what is greater than f
    assert merge_through([a, b], pos[:2]) == [b"g"]
