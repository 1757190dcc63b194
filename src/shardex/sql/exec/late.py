"""The root of a late-materialized ORDER BY ... LIMIT (decision 0111).

Each leaf sent its first ``top`` (offset + limit) rows as ``[sort key, docid]``, ranked on
the index entries alone. The root merges them as it merges sorted leaves (ties in input
order), takes the first ``top`` candidates, fetches their documents in one ``GetMany`` per
owning node, and keeps those a leaf that fetched them would have kept (still there, still
passing WHERE). A document deleted or changed since the index was read leaves a gap: the
next candidates fill it, fetched the same way. That is exact while the merge has not run
past the end of a leaf that sent all ``top`` rows it was allowed (it may hold more rows
that sort before the next candidate); and a document whose sort key moved has no known
place at all. Either way the root raises ``LATE_REFILL`` before any row has left, and the
initiator runs the statement again without late materialization at the same pinned TS
(``failover.failing_over``), so the result is always the plain path's.

The work is bounded by the planner's ``LATE_MAX_ROWS`` per leaf, so it runs on the event
loop, like the inline paths, without a thread or a memory account.
"""

from __future__ import annotations

import itertools
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Iterator
from typing import Any, Final

from shardex.errors import ErrorCode, ShardexError
from shardex.sql.exec.bridge import close_all
from shardex.sql.exec.fragment_rows import LateStale, late_checked, late_values
from shardex.sql.operators import merge_sorted
from shardex.sql.syntax.bind import BoundSelect

__all__ = ["LATE_REFILL", "late_refill", "late_root_values"]

LATE_REFILL: Final = "late_refill"  # details["reason"] of the error that asks for a re-run

Fetch = Callable[[str, list[str]], Awaitable[list[tuple[str, Any]]]]


class _Exhausted(Exception):
    """The merge needed the next row of a leaf that may hold more than it sent."""


def late_refill(what: str) -> ShardexError:
    return ShardexError(
        f"late materialization cannot fill its limit exactly ({what}); "
        "the statement runs again with the leaves fetching",
        code=ErrorCode.QUERY_STATE,
        details={"reason": LATE_REFILL, "hint": "retried by the initiator"},
    )


def _capped(rows: list[list[Any]], top: int) -> Iterator[tuple[bytes, str]]:
    """A leaf's candidates; past the last one, ``_Exhausted`` if the leaf sent ``top`` (it
    stopped there, and its next row may sort before any other leaf's)."""
    for key, docid in rows:
        yield bytes(key), docid
    if len(rows) >= top:
        raise _Exhausted


async def late_root_values(
    b: BoundSelect,
    params: Any,
    keyspace: str,
    fetch: Fetch,
    inputs: list[AsyncIterator[list[Any]]],
    decode: Callable[[Any], Any],
    limit: int,
    offset: int,
) -> list[Any]:
    """The result values, from the leaves' encoded ``[sort key, docid]`` rows (``inputs``,
    one per leaf, each closed here); ``late_refill`` when they cannot be exact."""
    top = offset + limit
    leaves: list[list[list[Any]]] = []
    try:
        for source in inputs:
            leaves.append([decode(cell) async for chunk in source for cell in chunk])
    finally:
        await close_all(inputs)
    merged: Iterable[tuple[bytes, str]] = merge_sorted(*(_capped(r, top) for r in leaves))
    kept: list[dict[str, Any]] = []
    try:
        while len(kept) < top:
            candidates = list(itertools.islice(merged, top - len(kept)))
            if not candidates:
                break
            docs = dict(await fetch(keyspace, [docid for _, docid in candidates]))
            kept += late_checked(b, params, candidates, docs)
    except _Exhausted:
        raise late_refill("a leaf's rows ran out after documents were gone") from None
    except LateStale as stale:
        raise late_refill(f"document {stale.args[0]!r} changed its sort key") from None
    return late_values(b, params, kept[offset:])
