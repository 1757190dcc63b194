"""Scan spans: byte ranges over entries agree with comparing the leading key parts."""

from __future__ import annotations

from itertools import pairwise

from hypothesis import given, settings
from hypothesis import strategies as st

from shardex.core.keycodec import encode_entry, encode_key
from shardex.core.spans import Span, in_ranges, spans_to_ranges

DESC = [False, True]
part = st.one_of(st.none(), st.integers(-3, 3), st.sampled_from(["a", "b", ""]))
key = st.lists(part, min_size=2, max_size=2)
bound = st.one_of(st.none(), st.lists(part, min_size=1, max_size=2))
span = st.tuples(bound, bound, st.booleans(), st.booleans())


def reference(values: list, s: tuple) -> bool:
    """Planner semantics: compare the entry's leading parts with each bound's parts."""
    low, high, low_inc, high_inc = s
    if low is not None:
        k = encode_key(values[: len(low)], DESC)
        b = encode_key(low, DESC)
        if not (k >= b if low_inc else k > b):
            return False
    if high is not None:
        k = encode_key(values[: len(high)], DESC)
        b = encode_key(high, DESC)
        if not (k <= b if high_inc else k < b):
            return False
    return True


def to_span(s: tuple) -> Span:
    low, high, low_inc, high_inc = s
    enc = [None if b is None else encode_key(b, DESC) for b in (low, high)]
    return Span(enc[0], enc[1], low_inc, high_inc)


@settings(max_examples=150, deadline=None)
@given(st.lists(key, min_size=1, max_size=12), st.lists(span, max_size=3))
def test_ranges_match_leading_part_comparison(keys: list, spans: list) -> None:
    ranges = spans_to_ranges([to_span(s) for s in spans])
    for i, values in enumerate(keys):
        entry = encode_entry(values, f"d{i}", DESC)
        assert in_ranges(entry, ranges) == any(reference(values, s) for s in spans)
    # normalised: sorted and disjoint
    for (_, hi), (lo, _) in pairwise(ranges):
        assert hi is not None and lo is not None and hi < lo


def test_no_spans_means_everything() -> None:
    assert spans_to_ranges(None) == [(None, None)]
    assert spans_to_ranges([]) == []


class _Family:
    """An entries family recording the storage chunk size each iterator asks for."""

    def __init__(self, keys: list[bytes]) -> None:
        self.keys = keys
        self.chunks: list[int | None] = []

    def iterate_keys(self, lo, hi, *, reverse, snapshot, chunk_size):  # type: ignore[no-untyped-def]
        self.chunks.append(chunk_size)
        return (self.keys[i : i + chunk_size] for i in range(0, len(self.keys), chunk_size))


def test_a_chunk_hint_sizes_storage_reads_without_cutting_the_scan() -> None:
    from shardex.index.spans import CHUNK_MAX, scan_ranges

    keys = [encode_entry([i], f"d{i}", [False]) for i in range(40)]
    everything = [(None, None)]
    cf = _Family(keys)
    assert list(scan_ranges(cf, everything, None, None, False, True, None, 20)) == keys
    assert cf.chunks == [20]  # read 20 at a time, every entry still returned
    list(scan_ranges(cf, everything, None, 5, False, True, None, 20))
    list(scan_ranges(cf, everything, None, None, False, True, None, 10_000))
    list(scan_ranges(cf, everything, None, None, False, True, None))
    assert cf.chunks[1:] == [5, CHUNK_MAX, CHUNK_MAX]  # a hard limit wins; capped; the default
