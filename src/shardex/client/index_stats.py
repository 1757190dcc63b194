"""What the indexers say about an index: its published stability TS and entry count.

``list_indexes`` reads the index records from the coordinator state, then asks every indexer
node of the listed indexes for its slices (``ListSlices``, in parallel, with a short timeout):

* ``stability_ts``: per data partition, the minimum seqno over the stability TSs the
  timekeeper published to the index's slices (``None`` while any slice has none);
* ``items_count``: the sum of the slices' entry counts.

When a node does not answer (down, slow) or lacks a slice of the topology, the index's own
record is used instead (``stability_ts`` / ``items_count`` as ``MarkIndexActive`` left them);
``stats_source`` says which (``"indexers"`` or ``"state"``).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Iterable, Mapping
from typing import Any, Final, Protocol

from shardex.api.index import ListSlices, SliceInfo, SliceList
from shardex.core.topology import Topology
from shardex.errors import ShardexError
from shardex.meta.index_state import INIT, LIVE_STATES, IndexRecord

__all__ = [
    "STATS_TIMEOUT",
    "IndexStats",
    "gather_slices",
    "has_slices",
    "index_stats",
    "seqnos",
    "wanted_slices",
]

STATS_TIMEOUT: Final = 2.0  # a status read: a silent indexer must not hold it up

IndexStats = tuple[dict[int, int] | None, int]  # (stability seqnos, items)


class _Router(Protocol):
    pool: Any

    async def address(self, node: str) -> str: ...


def has_slices(rec: IndexRecord) -> bool:
    """Whether the indexers hold the index's slices (INIT: maybe not yet; DELETED: going)."""
    return rec.state in LIVE_STATES and rec.state != INIT


def wanted_slices(listed: Iterable[tuple[IndexRecord, Topology | None]]) -> dict[str, set[str]]:
    """Indexer node -> the ids of the listed indexes whose slices it holds (what
    ``gather_slices`` asks for)."""
    wanted: dict[str, set[str]] = {}
    for rec, topo in listed:
        if topo is not None and has_slices(rec):
            for node in topo.assignment.values():
                wanted.setdefault(node, set()).add(rec.id)
    return wanted


async def gather_slices(
    router: _Router, wanted: Mapping[str, Iterable[str]], timeout: float = STATS_TIMEOUT
) -> dict[str, list[SliceInfo]]:
    """Node -> its slices of the wanted indexes (``wanted``: node -> index ids), asked in
    parallel; a node that fails or does not answer within ``timeout`` is left out."""

    async def one(node: str, index_ids: set[str]) -> list[SliceInfo] | None:
        # One index: ask for it alone; several: one unfiltered request, filtered here.
        msg = ListSlices(index_id=next(iter(index_ids))) if len(index_ids) == 1 else ListSlices()
        with contextlib.suppress(ShardexError, TimeoutError):
            async with asyncio.timeout(timeout):
                conn = await router.pool.get(await router.address(node), timeout)
                reply = await conn.request(msg, timeout, expect=SliceList)
            return [s for s in reply.slices if s.index_id in index_ids]
        return None

    nodes = sorted(wanted)
    results = await asyncio.gather(*(one(n, set(wanted[n])) for n in nodes))
    return {n: r for n, r in zip(nodes, results, strict=True) if r is not None}


def index_stats(
    index_id: str, topo: Topology | None, slices: Mapping[str, list[SliceInfo]]
) -> IndexStats | None:
    """The index's stability seqnos and item count from its slices, or None unless every
    partition of ``topo`` answered (see the module docstring)."""
    if topo is None or not topo.assignment:
        return None
    items = 0
    stabilities: list[dict[int, tuple[int, int]] | None] = []
    for p, node in sorted(topo.assignment.items()):
        found = next(
            (s for s in slices.get(node, ()) if s.index_id == index_id and s.partition == p),
            None,
        )
        if found is None:
            return None
        items += found.items_count
        stabilities.append(found.stability)
    if any(s is None for s in stabilities):
        return None, items
    partitions = sorted({p for s in stabilities if s is not None for p in s})
    low = {
        p: min(s[p][0] if p in s else 0 for s in stabilities if s is not None) for p in partitions
    }
    return low, items


def seqnos(wire: Mapping[int, tuple[int, int]] | None) -> dict[int, int] | None:
    """A wire TS as partition -> seqno."""
    return None if wire is None else {int(p): int(v[0]) for p, v in sorted(wire.items())}
