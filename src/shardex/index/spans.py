"""A slice's reads of byte ranges (``shardex.core.spans``) from its column family or a
snapshot of it, in chunks, optionally limited and decoded into (key, docid)."""

from __future__ import annotations

import itertools
from collections.abc import Iterator, Sequence
from operator import itemgetter
from typing import Any

from shardex.core.keycodec import decode_entry
from shardex.core.spans import Range
from shardex.storage import ColumnFamily, StoreSnapshot

__all__ = ["scan_ranges"]

CHUNK_MAX = 512  # entries a limited scan reads per storage chunk at most (as unlimited ones)


def scan_ranges(
    cf: ColumnFamily,
    ranges: Sequence[Range],
    snap: StoreSnapshot | None,
    limit: int | None,
    reverse: bool,
    raw: bool,
    desc: Sequence[bool] | None,
    chunk_rows: int | None = None,
) -> Iterator[Any]:
    """Walk disjoint sorted ``ranges`` of an entries family (at ``snap`` or the tip), yielding
    raw entries or decoded ``(key values, docid)``; stops after ``limit``. ``chunk_rows``:
    entries read from storage at a time when the caller expects to stop after about that
    many without a hard limit (a SQL leaf's LIMIT, whose filter may drop entries).

    The RocksDB iterators are created *here*, before the first ``next()``: a scan pins its
    snapshot when it is asked for, so releasing that snapshot later (a newer stabilise) does
    not fail a scan that has not started consuming yet."""
    order = list(reversed(ranges)) if reverse else list(ranges)
    # A limited scan reads no RocksDB entry past its limit (a 100-row scan read a whole
    # 512-entry chunk, ~5x the entries it returned).
    expect = limit if limit is not None else chunk_rows
    chunk = {} if expect is None else {"chunk_size": max(1, min(expect, CHUNK_MAX))}
    iters = [cf.iterate(lo, hi, reverse=reverse, snapshot=snap, **chunk) for lo, hi in order]
    return _limited(iters, limit, raw, desc)


def _limited(
    iters: list[Iterator[tuple[bytes, bytes]]],
    limit: int | None,
    raw: bool,
    desc: Sequence[bool] | None,
) -> Iterator[Any]:
    if raw:
        # C iterators only: a scan's every entry passes through here (no generator frame
        # per entry), and ``islice`` pulls nothing past the limit.
        keys = map(itemgetter(0), itertools.chain.from_iterable(iters))
        return keys if limit is None else itertools.islice(keys, max(limit, 0))
    return _decoded(iters, limit, desc)


def _decoded(
    iters: list[Iterator[tuple[bytes, bytes]]],
    limit: int | None,
    desc: Sequence[bool] | None,
) -> Iterator[Any]:
    if limit is not None and limit <= 0:
        return
    n = 0
    for it in iters:
        for k, _ in it:
            yield decode_entry(k, desc)
            n += 1
            if limit is not None and n >= limit:
                return
