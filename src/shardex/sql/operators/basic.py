"""Streaming row operators: scan, filter, project, distinct, offset/limit.

Every operator is a generator over an input iterator, so a fragment is a chain of them and
rows flow one at a time (nothing is materialised except by DISTINCT's seen-set). Rows are
opaque to scan/filter/limit; ``project`` turns a scope row (``{alias: document, ...}``) into
a result value, optionally paired with an encoded sort key (see ``sort.py``).
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from shardex.core.expr import MISSING, truth
from shardex.core.keycodec_values import encode_value

Row = Any
RowFn = Callable[[Row], Any]


def scan(source: Iterable[Row]) -> Iterator[Row]:
    """Rows from any iterable (an in-memory keyspace, an index scan, a received batch)."""
    yield from source


def filter_rows(rows: Iterable[Row], predicate: RowFn) -> Iterator[Row]:
    """Rows whose predicate is TRUE (SQL++ truth: MISSING, NULL, 0, "" and [] are not)."""
    for row in rows:
        if truth(predicate(row)):
            yield row


@dataclass(frozen=True, slots=True)
class ProjectTerm:
    """One projection term. ``name`` None with ``star``: merge ``value``'s fields (``expr.*``
    and ``*``); otherwise the value goes under ``name`` unless it is MISSING."""

    value: RowFn
    name: str | None = None
    star: bool = False


def project_row(row: Row, terms: Sequence[ProjectTerm]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for term in terms:
        v = term.value(row)
        if term.star:
            if type(v) is dict:
                out.update(v)
        elif v is not MISSING:
            out[term.name] = v  # type: ignore[index]
    return out


def project(
    rows: Iterable[Row],
    terms: Sequence[ProjectTerm] | None = None,
    *,
    raw: RowFn | None = None,
    sort_key: Callable[[Row, Any], bytes] | None = None,
) -> Iterator[Any]:
    """Result values: an object of ``terms`` or, with ``raw``, the bare value (rows whose raw
    value is MISSING produce nothing). With ``sort_key(row, value)`` each output is the pair
    ``(key bytes, value)`` the sort and merge operators order by."""
    for row in rows:
        if raw is not None:
            value = raw(row)
            if value is MISSING:
                continue
        else:
            value = project_row(row, terms or ())
        yield value if sort_key is None else (sort_key(row, value), value)


def value_identity(value: Any) -> bytes:
    """A hashable identity under SQL++ equality (1 and 1.0 are one value, TRUE is not 1):
    the order-preserving key encoding, where equal values encode identically."""
    return encode_value(value)


def distinct(rows: Iterable[Row], value_of: RowFn | None = None) -> Iterator[Row]:
    """The first row of every distinct value (``value_of(row)``, default the row itself)."""
    seen: set[bytes] = set()
    for row in rows:
        ident = value_identity(row if value_of is None else value_of(row))
        if ident not in seen:
            seen.add(ident)
            yield row


def offset_limit(rows: Iterable[Row], offset: int = 0, limit: int | None = None) -> Iterator[Row]:
    """Skip ``offset`` rows, then pass at most ``limit`` (None: all)."""
    stop = None if limit is None else offset + limit
    return itertools.islice(rows, offset, stop)


def strip_keys(pairs: Iterable[tuple[bytes, Any]]) -> Iterator[Any]:
    """Values of ``(sort key, value)`` pairs, once ordering is done."""
    for _key, value in pairs:
        yield value
