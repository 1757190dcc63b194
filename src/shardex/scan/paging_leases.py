"""Snapshot leases of pinned paginated scans (``index/snapshots.py`` keeps the snapshots).

A request_plus / at_plus paged scan reads one stability TS on every page. Each indexer keeps
only its last K snapshots, so under steady writes a scan of hundreds of pages would lose its
TS. The proxy therefore (``paging_store_proxy``):

* on the first page, once the TS is pinned, leases it on every slice of the index
  (``LeaseSnapshots`` mode ``lease``, a random lease id kept in the HMAC-covered context);
* on every later page renews the lease on the indexers of the scan's base topology (mode
  ``renew``, in parallel with the page's batches; an indexer not read on this page must keep
  the snapshot too), so a scan idle for longer than ``LEASE_TTL`` loses its snapshot and
  ends with SNAPSHOT_TOO_OLD as without leases. The base topology's owners are where every
  page reads (a pinned scan does not follow moves, ``elastic_adapters_index``): a slice
  that moved away is kept at its source while leased;
* releases it when the continuation ends (mode ``release``, best effort).

The first lease fails the first page (STALE_TOPOLOGY for a moved slice, retried on a fresh
topology; SNAPSHOT_TOO_OLD when the TS is gone or the slice holds the most leased snapshots
it may). A renewal that finds the snapshot gone fails its page with SNAPSHOT_TOO_OLD naming
the slice, before any row of that page reaches the client: the scan could not go on at its
TS. A renewal that fails in transit (timeout, lost connection, node unavailable) is tried
once more, then fails the page with that error: the page may be retried with the same
continuation, and the lease may still hold.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Final

from shardex.api.scan import WireTs
from shardex.core.timestamp import Timestamp
from shardex.core.topology import Topology
from shardex.errors import ErrorCode, ShardexError
from shardex.net.messages import Message
from shardex.scan.elastic_adapters_index import snapshot_gone

if TYPE_CHECKING:
    from shardex.index.service import IndexService

__all__ = [
    "LEASE",
    "LEASE_TTL",
    "RELEASE",
    "RENEW",
    "LeaseSnapshots",
    "SnapshotsLeased",
    "copy_placement",
    "lease_on_nodes",
    "serve_lease",
    "spare_copies",
]

log = logging.getLogger(__name__)

LEASE_TTL: Final = 60.0
LEASE: Final = "lease"
RENEW: Final = "renew"
RELEASE: Final = "release"
MODES: Final = (LEASE, RENEW, RELEASE)
RENEW_ATTEMPTS: Final = 2  # a renewal that failed in transit is tried once more
# Failures that say nothing about the snapshot: the request or its answer was lost.
TRANSIENT: Final = frozenset(
    {ErrorCode.TIMEOUT, ErrorCode.CONNECTION_CLOSED, ErrorCode.NODE_UNAVAILABLE}
)


class LeaseSnapshots(Message, tag="scan.LeaseSnapshots"):
    """Lease, renew or release the snapshot at ``ts`` of this node's ``partitions`` of
    ``index_id`` for a paginated scan (module docstring)."""

    index_id: str
    partitions: list[int]
    lease_id: str
    mode: str = LEASE
    ts: WireTs | None = None  # release needs none
    ttl: float = LEASE_TTL


class SnapshotsLeased(Message, tag="scan.SnapshotsLeased"):
    node: str
    leased: list[int]  # partitions whose slice now holds (or released) the lease


async def serve_lease(index: IndexService, node: str, msg: LeaseSnapshots) -> SnapshotsLeased:
    """The indexer's side: every slice under its lock, off the event loop."""
    if msg.mode not in MODES:
        raise ShardexError(
            f"lease mode must be one of {', '.join(MODES)}, got {msg.mode!r}",
            code=ErrorCode.BAD_REQUEST,
            details={"value": msg.mode},
        )
    if msg.mode != RELEASE and msg.ts is None:
        raise ShardexError(
            f"a snapshot {msg.mode} needs the TS", code=ErrorCode.BAD_REQUEST, details={}
        )
    ts = None if msg.ts is None else Timestamp.from_wire(msg.ts)
    engine = index.engine

    def one(p: int) -> None:
        try:
            sl = engine.slice(msg.index_id, p)  # INDEX_NOT_FOUND
        except ShardexError as exc:
            moved = index.slice_moves.moved_to(msg.index_id, p)
            if msg.mode != RENEW or exc.code is not ErrorCode.INDEX_NOT_FOUND or ts is None:
                raise
            # Renewing a slice that is gone: the snapshot went with it.
            raise snapshot_gone(msg.index_id, p, node, moved, ts) from None
        if msg.mode == RELEASE:
            sl.release_lease(msg.lease_id)
            return
        if msg.mode == LEASE:  # a new scan: refuse a slice handed over (retryable)
            index.slice_moves.check_serving(msg.index_id, p)
        assert ts is not None
        try:
            sl.lease_snapshot(ts, msg.lease_id, msg.ttl)  # SNAPSHOT_TOO_OLD once gone
        except ShardexError as exc:
            if exc.code is not ErrorCode.SNAPSHOT_TOO_OLD:
                raise
            where = {"index": msg.index_id, "partition": p, "node": node}
            hint = exc.details.get("hint") or "restart the scan (continuation=None)"
            raise ShardexError(
                exc.message, code=exc.code, details={**exc.details, **where, "hint": hint}
            ) from None

    def run() -> list[int]:
        done = []
        for p in sorted(set(msg.partitions)):
            try:
                one(p)
            except ShardexError:
                if msg.mode != RELEASE:
                    raise
                continue  # release: best effort per slice
            done.append(p)
        return done

    leased = await index.host.run(run)
    if msg.mode == RELEASE:
        index.slice_moves.lease_released(msg.index_id, leased)
    return SnapshotsLeased(node=node, leased=leased)


Ask = Callable[[str, LeaseSnapshots], Awaitable[SnapshotsLeased]]


def copy_placement(topo: Topology) -> dict[str, list[int]]:
    """Node -> the index partitions it holds a copy of (primary or replica) in ``topo``."""
    return {n: topo.copies_of(n) for n in sorted(topo.copy_nodes())}


def spare_copies(topo: Topology, needed: dict[str, list[int]] | None = None) -> frozenset[str]:
    """The nodes of ``topo`` a pinned page can do without (``lease_on_nodes``'s ``spare``):
    with ``needed`` (the copies the first page read), every other node; without, the nodes
    whose every partition has another copy (a shard whose node is gone is read from those,
    ``paging_copies``)."""
    if needed is not None:
        return frozenset(topo.copy_nodes()) - set(needed)
    return frozenset(
        n for n in topo.copy_nodes() if all(len(topo.chain(p)) > 1 for p in topo.copies_of(n))
    )


async def lease_on_nodes(
    ask: Ask,
    by_node: dict[str, list[int]],
    index_id: str,
    lease_id: str,
    mode: str,
    ts: WireTs | None,
    spare: frozenset[str] = frozenset(),
) -> None:
    """``mode`` on every node in parallel. ``lease`` and ``renew`` raise the first failure
    (a renewal that failed in transit is tried once more first); ``release`` only logs, and
    so do the nodes in ``spare`` (copies of a replicated index the page does not need:
    another copy of each of their partitions stands in if they are gone)."""

    async def one(node: str, parts: list[int]) -> None:
        msg = LeaseSnapshots(
            index_id=index_id, partitions=parts, lease_id=lease_id, mode=mode, ts=ts
        )
        for attempt in range(RENEW_ATTEMPTS if mode == RENEW else 1):
            try:
                await ask(node, msg)
                return
            except ShardexError as exc:
                if mode == RELEASE or node in spare:
                    log.info("snapshot lease %s (%s) on %s: %s", lease_id, mode, node, exc)
                    return
                if mode == LEASE or exc.code not in TRANSIENT or attempt + 1 >= RENEW_ATTEMPTS:
                    raise
                log.info("snapshot lease %s: renewal on %s failed (%s); once more", lease_id,
                         node, exc)  # fmt: skip

    await asyncio.gather(*(one(n, ps) for n, ps in by_node.items()))
