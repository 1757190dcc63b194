"""Retry a request to an index's slices against a fresh index topology.

An index partition that moved (``manager/index_rebalance.py``) is refused by its old indexer
with a retryable STALE_TOPOLOGY, or INDEX_NOT_FOUND once that indexer dropped its slice. A
node's cached coordinator state may still name the old owner, so whoever addresses slices
by topology (the scan coordinator's ``ScanSlices``, the paging proxy's ``WaitStability``)
re-reads the topology from the master and tries again on the newer one: one rule for both.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from typing import Final, TypeVar

from shardex.core.topology import Topology
from shardex.errors import ErrorCode, ShardexError
from shardex.meta.index_state import IndexRecord

__all__ = ["MOVED", "RETRY_PAUSE", "on_fresh_topology"]

log = logging.getLogger(__name__)

T = TypeVar("T")

MOVED: Final = frozenset({ErrorCode.STALE_TOPOLOGY, ErrorCode.INDEX_NOT_FOUND})
RETRY_PAUSE: Final = 0.05  # doubled per attempt, while the switch is being committed


async def on_fresh_topology(
    rec: IndexRecord,
    topo: Topology,
    attempt: Callable[[Topology], Awaitable[T]],
    resolve_fresh: Callable[[], Awaitable[tuple[IndexRecord, Topology]]],
    *,
    attempts: int,
) -> T:
    """``attempt(topo)``; on STALE_TOPOLOGY / INDEX_NOT_FOUND, ``resolve_fresh()`` (the
    index and its latest topology from the master) and ``attempt`` again on it, at most
    ``attempts`` times in all. Anything else, the index dropped and re-created (another
    id), or INDEX_NOT_FOUND with no newer topology (the index itself is gone) is raised.
    A STALE_TOPOLOGY with no newer topology yet means the switch is being committed: wait
    a moment and retry."""
    for n in range(attempts):
        try:
            return await attempt(topo)
        except ShardexError as exc:
            if exc.code not in MOVED or n + 1 == attempts:
                raise
            now, newer = await resolve_fresh()
            if now.id != rec.id:
                raise
            if newer.seq_num <= topo.seq_num:
                if exc.code is not ErrorCode.STALE_TOPOLOGY:
                    raise
                await asyncio.sleep(RETRY_PAUSE * 2**n)
            topo = newer
            log.info("slices of %s: %s; retrying on topology %d", rec.id, exc, topo.seq_num)
    raise AssertionError("unreachable")  # the last attempt returns or raises
