"""A slice's reads of byte ranges (``shardex.core.spans``) from its column family or a
snapshot of it, in chunks, optionally limited and decoded into (key, docid)."""

from __future__ import annotations

import itertools
from collections.abc import Iterator, Sequence
from typing import Any

from shardex.core.keycodec import decode_entry
from shardex.core.sorted_runs import limit_chunks
from shardex.core.spans import Range
from shardex.storage import ColumnFamily, StoreSnapshot

__all__ = ["scan_chunks", "scan_ranges"]

CHUNK_MAX = 512  # entries a limited scan reads per storage chunk at most (as unlimited ones)


def scan_chunks(
    cf: ColumnFamily,
    ranges: Sequence[Range],
    snap: StoreSnapshot | None,
    limit: int | None,
    reverse: bool,
    chunk_rows: int | None = None,
) -> Iterator[list[bytes]]:
    """Walk disjoint sorted ``ranges`` of an entries family (at ``snap`` or the tip), yielding
    its raw entries in lists (storage's chunks, in entry order or reversed); stops after
    ``limit``. ``chunk_rows``: entries read from storage at a time when the caller expects
    to stop after about that many without a hard limit (a SQL leaf's LIMIT, whose filter
    may drop entries).

    The RocksDB iterators are created *here*, before the first ``next()``: a scan pins its
    snapshot when it is asked for, so releasing that snapshot later (a newer stabilise) does
    not fail a scan that has not started consuming yet."""
    order = list(reversed(ranges)) if reverse else list(ranges)
    # A limited scan reads no RocksDB entry past its limit (a 100-row scan read a whole
    # 512-entry chunk, ~5x the entries it returned).
    expect = limit if limit is not None else chunk_rows
    size = CHUNK_MAX if expect is None else max(1, min(expect, CHUNK_MAX))
    iters = [
        cf.iterate_keys(lo, hi, reverse=reverse, snapshot=snap, chunk_size=size) for lo, hi in order
    ]
    chunks = itertools.chain.from_iterable(iters)
    return chunks if limit is None else limit_chunks(chunks, limit)


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
    """``scan_chunks``'s entries one by one, raw or decoded into ``(key values, docid)``."""
    entries = itertools.chain.from_iterable(
        scan_chunks(cf, ranges, snap, limit, reverse, chunk_rows)
    )
    if raw:
        return entries
    return (decode_entry(k, desc) for k in entries)
