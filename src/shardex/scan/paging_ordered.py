"""Ordered (merging) paginated scans under elasticity: beyond the specification.

The elastic-scan algorithm scans shards one after another, which cannot return rows in key order. An
ordered scan keeps one *stream* per base shard and per virtual scan, each with its own cursor (the
key of the last row the scan returned from that stream). A page asks every unfinished stream for up
to ``page_size`` rows after its cursor, merges them by key and returns the first ``page_size`` rows
that are provably next: no unfinished stream may still hold a smaller key, so emission stops at the
smallest "last fetched key" of the streams that hit their limit.

Migrations follow the algorithm's rules per stream: a base stream's node adds partitions that
left it to the virtual-scan map, starting at that stream's cursor; a virtual stream found in
this page is fetched in the same page (before anything past its start is returned), so
merging stays exact. Why the result is exact: every row returned from a stream is the next
row of that stream after its cursor, and a partition's rows are read from exactly one stream
on each side of its cursor split (base stream up to the split, virtual stream after it).
"""

from __future__ import annotations

import heapq
from collections.abc import Awaitable, Callable

from shardex.core.topology import Topology
from shardex.scan.continuation import Continuation
from shardex.scan.paging_wire import PageRow, ShardBatch, ShardBatchResult

# (node, request) -> the node's answer: an RPC on a real node, a direct call in unit tests.
ShardCall = Callable[[str, ShardBatch], Awaitable[ShardBatchResult]]


async def ordered_page(
    call: ShardCall, scan: bytes, page_size: int, ck: Continuation, base: Topology
) -> tuple[list[PageRow], Continuation | None]:
    shards = base.nodes()
    nbase = len(shards)
    fetched: dict[int, ShardBatchResult] = {}
    i = 0
    # Streams are fetched one at a time so that a virtual scan found by one base stream is in
    # the map the next request carries; the map only grows, so the loop sees every stream.
    while i < nbase + len(ck.vsm):
        if i < nbase:
            cursor = ck.cursors[i]
            done, resume, target, vs_pid = cursor.done, cursor.resume, shards[i], -1
        else:
            vs = ck.vsm[i - nbase]
            done, resume, target, vs_pid = vs.done, vs.resume, vs.shard, vs.pid
        if not done:
            res = await call(
                target,
                ShardBatch(
                    scan=scan,
                    base_topo=ck.base_topo,
                    shard=target,
                    shard_idx=i,
                    vs_pid=vs_pid,
                    resume=resume,
                    vsm=ck.vsm,
                    limit=page_size,
                ),
            )
            # The node returns the map it was given (cursors untouched) plus new entries.
            ck.vsm = res.vsm
            fetched[i] = res
        i += 1

    bound, blocked = _emission_bound(ck, nbase, fetched)
    rows: list[PageRow] = []
    taken: dict[int, int] = {}  # stream -> rows returned from it
    last: dict[int, bytes] = {}
    if not blocked:
        merged = heapq.merge(
            *([(r.key, s, r) for r in res.rows] for s, res in sorted(fetched.items()))
        )
        for key, s, row in merged:
            if len(rows) >= page_size or (bound is not None and key > bound):
                break
            rows.append(row)
            taken[s] = taken.get(s, 0) + 1
            last[s] = key
    finished = True
    for s in range(nbase + len(ck.vsm)):
        state = ck.cursors[s] if s < nbase else ck.vsm[s - nbase]
        if s in fetched:
            res = fetched[s]
            if s in last:
                state.resume = last[s]
            if res.exhausted and taken.get(s, 0) == len(res.rows):
                state.done = True
        finished = finished and state.done
    return rows, None if finished else ck


def _emission_bound(
    ck: Continuation, nbase: int, fetched: dict[int, ShardBatchResult]
) -> tuple[bytes | None, bool]:
    """(largest key that may be returned, or None for no bound; True if nothing may be)."""
    bound: bytes | None = None
    for s, res in fetched.items():
        if res.exhausted:
            continue
        if res.rows:
            candidate = res.rows[-1].key
        else:  # the node asked for a retry: nothing past this stream's cursor is known
            cursor = ck.cursors[s].resume if s < nbase else ck.vsm[s - nbase].resume
            if cursor is None:
                return None, True
            candidate = cursor
        bound = candidate if bound is None or candidate < bound else bound
    return bound, False
