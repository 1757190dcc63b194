"""Ordering: encoded sort keys, full sort, top-N, and the k-way merge of sorted inputs.

A sort key is bytes whose byte order is the ORDER BY order, built from the key codec
(``keycodec_values.encode_value``: SQL++ collation MISSING < NULL < FALSE < TRUE < numbers <
strings < arrays < objects, exact across int and float). Per ORDER BY term: one group byte
that places MISSING/NULL first or last (NULLS FIRST|LAST), then the value's encoding,
inverted for DESC. Value encodings are self-delimiting, so concatenating terms compares term
by term. Encoding once per row makes sort, top-N and merge plain byte comparisons, and the
same bytes order rows identically on every node of a distributed query.
"""

from __future__ import annotations

import heapq
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from operator import itemgetter
from typing import Any

from shardex.core.expr import MISSING
from shardex.core.keycodec_values import encode_value

_NULLS_FIRST, _VALUES, _NULLS_LAST = b"\x00", b"\x01", b"\x02"
_INVERT = bytes(255 - b for b in range(256))
_first = itemgetter(0)


@dataclass(frozen=True, slots=True)
class SortSpec:
    desc: bool = False
    nulls_first: bool | None = None  # None: ASC puts them first, DESC last (N1QL)

    @property
    def nulls_go_first(self) -> bool:
        return (not self.desc) if self.nulls_first is None else self.nulls_first


def encode_sort_key(values: Sequence[Any], specs: Sequence[SortSpec]) -> bytes:
    parts: list[bytes] = []
    for v, spec in zip(values, specs, strict=True):
        if v is MISSING or v is None:
            parts.append(_NULLS_FIRST if spec.nulls_go_first else _NULLS_LAST)
        else:
            parts.append(_VALUES)
        enc = encode_value(v)
        parts.append(enc.translate(_INVERT) if spec.desc else enc)
    return b"".join(parts)


def sort_pairs(
    pairs: Iterable[tuple[bytes, Any]], limit: int | None = None
) -> list[tuple[bytes, Any]]:
    """Sort ``(key, value)`` pairs by key, stable. With ``limit`` keep only the first
    ``limit`` (a bounded heap: memory O(limit), same result as a full sort then limit)."""
    if limit is not None:
        return heapq.nsmallest(limit, pairs, key=_first)
    return sorted(pairs, key=_first)


def merge_sorted(*inputs: Iterable[tuple[bytes, Any]]) -> Iterator[tuple[bytes, Any]]:
    """K-way merge of inputs each already sorted by key (what the root fragment does with
    the leaves' sorted streams); ties keep input order."""
    return heapq.merge(*inputs, key=_first)
