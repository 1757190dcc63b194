"""UNNEST: one scope row per element of an array beside the row it came from.

``FROM ks AS a UNNEST a.arr AS x`` turns each document row ``{a: doc}`` into the rows
``{a: doc, x: element}``, one per element of ``a.arr``; several UNNESTs chain (each reads
the rows the previous one made). A value that is no array (MISSING, NULL, an object, ...)
or an empty array gives no row, except for ``LEFT UNNEST``, which keeps the row once with
``x`` MISSING (absent from the scope row). It is per row, so it distributes like a filter:
each leaf unnests the documents it reads.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

Row = dict[str, Any]


@dataclass(frozen=True, slots=True)
class UnnestSpec:
    alias: str
    array: Callable[[Row], Any]  # the array to unnest, evaluated over the row
    outer: bool = False  # LEFT UNNEST


def unnest(rows: Iterable[Row], specs: Sequence[UnnestSpec]) -> Iterator[Row]:
    """``rows`` with every UNNEST of ``specs`` applied in order."""
    out: Iterable[Row] = rows
    for spec in specs:
        out = _unnest_one(out, spec)
    return iter(out)


def _unnest_one(rows: Iterable[Row], spec: UnnestSpec) -> Iterator[Row]:
    alias, array, outer = spec.alias, spec.array, spec.outer
    for row in rows:
        value = array(row)
        if type(value) is list and value:
            for item in value:
                yield {**row, alias: item}
        elif outer:
            yield row
