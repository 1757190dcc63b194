"""Scan spans over encoded keys, and their byte ranges over encoded entries.

A span bounds the *key* part of entries (``entry = key + 02 + docid``) with encoded keys
from ``shardex.core.keycodec.encode_key``. A bound may encode fewer parts than the index has
(a prefix); comparisons are then on the leading parts, which is what a planner means by
``k1 > 5`` on a two-part index. Because part encodings are self-delimiting, "the leading parts
of an entry equal bound ``b``" is exactly "the entry starts with ``b``", so:

* inclusive low ``b``  -> entries ``>= b``
* exclusive low ``b``  -> entries ``>= successor(b)`` (skips every entry starting with ``b``)
* inclusive high ``b`` -> entries ``< successor(b)``
* exclusive high ``b`` -> entries ``< b``

``None`` is an open end. Spans are normalised into sorted, disjoint byte ranges, so
overlapping spans never return an entry twice.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import NamedTuple

from shardex.core.keycodec import successor

Range = tuple[bytes | None, bytes | None]  # [lower, upper), None = open


class Span(NamedTuple):
    low: bytes | None = None
    high: bytes | None = None
    low_inclusive: bool = True
    high_inclusive: bool = True


def _lower(s: Span) -> bytes | None:
    if not s.low:
        return None
    return s.low if s.low_inclusive else successor(s.low)


def _upper(s: Span) -> bytes | None:
    if not s.high:
        return None
    return successor(s.high) if s.high_inclusive else s.high


def spans_to_ranges(spans: Iterable[Span] | None) -> list[Range]:
    """Sorted, disjoint ``[lower, upper)`` byte ranges covering the union of ``spans``.

    No spans (``None``) means the whole slice; an empty list means nothing.
    """
    if spans is None:
        return [(None, None)]
    ranges: list[Range] = []
    for s in spans:
        lo, hi = _lower(s), _upper(s)
        if lo is not None and hi is not None and lo >= hi:
            continue  # empty span
        ranges.append((lo, hi))
    ranges.sort(key=lambda r: b"" if r[0] is None else r[0])
    merged: list[Range] = []
    for lo, hi in ranges:
        if merged:
            plo, phi = merged[-1]
            if phi is None or (lo is not None and lo <= phi) or lo is None:
                # overlaps or touches the previous range: extend it
                new_hi = None if phi is None or hi is None else max(phi, hi)
                merged[-1] = (plo, new_hi)
                continue
        merged.append((lo, hi))
    return merged


def in_ranges(entry: bytes, ranges: Sequence[Range]) -> bool:
    """Whether ``entry`` falls in one of ``ranges`` (the oracle's reference for scans)."""
    return any((lo is None or entry >= lo) and (hi is None or entry < hi) for lo, hi in ranges)


def clip_ranges(ranges: Sequence[Range], after: bytes | None) -> list[Range]:
    """``ranges`` restricted to the entries strictly after the entry ``after`` (None:
    unchanged): what is left of a scan that returned every entry up to ``after``.

    Entries are unique byte strings (key + docid) read in byte order, DESC parts included
    (their encoding is inverted, not their order), so "after" is a byte comparison: the
    entries greater than ``after`` are exactly those ``>= after + 00``. Two entries with the
    same key differ in their docid, so a shared key still resumes at the right document."""
    if after is None:
        return list(ranges)
    floor = after + b"\x00"
    out: list[Range] = []
    for lo, hi in ranges:
        if hi is not None and hi <= floor:
            continue  # read to its end already
        out.append((floor if lo is None or lo < floor else lo, hi))
    return out


def ranges_as_spans(ranges: Sequence[Range]) -> list[Span]:
    """Byte ranges as spans with exactly those bounds (inclusive low, exclusive high)."""
    return [Span(lo, hi, True, False) for lo, hi in ranges]


def spans_after(spans: Sequence[Span] | None, after: bytes) -> list[Span]:
    """``spans`` (None: everything) narrowed to the entries strictly after ``after``
    (``clip_ranges``). An empty list means nothing is left (unlike None, which
    ``spans_to_ranges`` reads as everything)."""
    return ranges_as_spans(clip_ranges(spans_to_ranges(spans), after))
