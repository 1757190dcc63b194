"""The proxy side of paginated scans under elasticity: one page per call, stateless.

``PageCoordinator.page`` is the elastic-scan algorithm's proxy (section B, "The proxy"). Everything
a page needs to continue travels in the continuation key, so any query node can serve the next page
and a retried page request is harmless. The first page pins the *base topology* (the newest
published one); later pages read it back from the topology history by number.

Unordered scans walk SHARDS = the base topology's nodes (sorted) followed by the virtual
scans in the order they were found, one shard at a time, exactly as the algorithm does. Ordered
scans (beyond the specification) are in ``paging_ordered``: they merge every shard on every page.
"""

from __future__ import annotations

from dataclasses import dataclass

from shardex.core.topology import Topology
from shardex.errors import ErrorCode, ShardexError
from shardex.scan.continuation import (
    Continuation,
    ContinuationCodec,
    Cursor,
    bad_continuation,
    scan_digest,
)
from shardex.scan.elastic_node import TopologyLookup
from shardex.scan.paging_ordered import ShardCall, ordered_page
from shardex.scan.paging_wire import PageRow, ShardBatch

__all__ = ["MAX_PAGE_SIZE", "Page", "PageCoordinator", "ShardCall"]

MAX_PAGE_SIZE = 100_000


@dataclass
class Page:
    rows: list[PageRow]
    continuation: str | None  # None: the scan is complete


class PageCoordinator:
    """Serves pages of one kind of scan (index or primary) over a shard-call function."""

    def __init__(
        self, topologies: TopologyLookup, call: ShardCall, codec: ContinuationCodec
    ) -> None:
        self._topologies = topologies
        self._call = call
        self._codec = codec
        # The continuation of the page in progress (checkers and tests read it; the
        # coordinator keeps no state between pages).
        self.inflight: Continuation | None = None

    async def page(
        self, scan: bytes, page_size: int, continuation: str | None = None, *, ordered: bool
    ) -> Page:
        """One page of at most ``page_size`` rows of the scan ``scan`` (its spec's bytes)."""
        check_page_size(page_size)
        digest = scan_digest(scan + (b"/ordered" if ordered else b"/unordered"))
        if continuation is None:
            ck = Continuation(ordered=ordered, scan_digest=digest)
        else:
            ck = self._codec.decode(continuation, expect_digest=digest)
        rows, nxt = await self.page_state(scan, page_size, ck)
        return Page(rows=rows, continuation=None if nxt is None else self._codec.encode(nxt))

    async def page_state(
        self, scan: bytes, page_size: int, ck: Continuation, *, first_base: int | None = None
    ) -> tuple[list[PageRow], Continuation | None]:
        """The page after state ``ck`` (decoded); the next state, None at the end.
        ``first_base``: the base topology a first page pins instead of the newest (a pinned
        index scan's: the one whose owners leased its snapshot)."""
        base = self._base_topology(ck, first_base)
        self.inflight = ck
        try:
            if ck.ordered:
                return await ordered_page(self._call, scan, page_size, ck, base)
            return await self._unordered_page(scan, page_size, ck, base)
        finally:
            self.inflight = None

    def _base_topology(self, ck: Continuation, first_base: int | None = None) -> Topology:
        if ck.base_topo < 0:  # the very first page: pin the newest topology as the base
            latest = self._topologies.latest
            if first_base is not None:
                latest = self._topologies.get(first_base)
            if latest is None:
                raise ShardexError("no topology has been published", code=ErrorCode.INTERNAL)
            ck.base_topo = latest.seq_num
            if ck.ordered:
                ck.cursors = [Cursor() for _ in latest.nodes()]
            return latest
        base = self._topologies.get(ck.base_topo)
        validate_against(ck, base)
        return base

    async def _unordered_page(
        self, scan: bytes, page_size: int, ck: Continuation, base: Topology
    ) -> tuple[list[PageRow], Continuation | None]:
        shards = base.nodes()
        rows: list[PageRow] = []
        while True:
            total = len(shards) + len(ck.vsm)  # SHARDS grows as virtual scans are found
            if ck.shard_idx >= total:
                return rows, None
            if ck.shard_idx < len(shards):
                target, ck.vs_pid = shards[ck.shard_idx], -1
            else:
                vs = ck.vsm[ck.shard_idx - len(shards)]
                target, ck.vs_pid = vs.shard, vs.pid
            req = ShardBatch(
                scan=scan,
                base_topo=ck.base_topo,
                shard=target,
                shard_idx=ck.shard_idx,
                vs_pid=ck.vs_pid,
                resume=ck.resume,
                vsm=ck.vsm,
                limit=page_size - len(rows),
            )
            res = await self._call(target, req)
            rows.extend(res.rows)
            ck.vsm = res.vsm
            ck.resume = res.resume
            if not res.exhausted:  # reachedBatchLimit: the page is full (or must be retried)
                return rows, ck
            ck.shard_idx += 1
            if ck.shard_idx >= len(shards) + len(ck.vsm):
                return rows, None
            # A virtual scan starts where its source shard was when the move was seen.
            nxt = ck.shard_idx - len(shards)
            ck.resume = ck.vsm[nxt].resume if nxt >= 0 else None
            ck.vs_pid = ck.vsm[nxt].pid if nxt >= 0 else -1
            if len(rows) >= page_size:
                return rows, ck


def check_page_size(page_size: object) -> None:
    if not isinstance(page_size, int) or isinstance(page_size, bool) or page_size <= 0:
        raise ShardexError(
            f"page_size must be a positive integer, got {page_size!r}",
            code=ErrorCode.BAD_REQUEST,
            details={"page_size": repr(page_size), "hint": f"1 to {MAX_PAGE_SIZE}"},
        )
    if page_size > MAX_PAGE_SIZE:
        raise ShardexError(
            f"page_size {page_size} is over the limit {MAX_PAGE_SIZE}",
            code=ErrorCode.BAD_REQUEST,
            details={"page_size": page_size, "hint": f"1 to {MAX_PAGE_SIZE}"},
        )


def validate_against(ck: Continuation, base: Topology) -> None:
    """Structural checks of a decoded key against its base topology (defence in depth: the
    HMAC already rules out client edits; this catches a server-side bug or skew)."""
    nbase = len(base.nodes())
    if not 0 <= ck.shard_idx <= nbase + len(ck.vsm):
        raise bad_continuation("shard index out of range", None, shard_idx=ck.shard_idx)
    seen: set[int] = set()
    for vs in ck.vsm:
        if vs.pid not in base.assignment or vs.pid in seen:
            raise bad_continuation("virtual scan of an unknown partition", None, pid=vs.pid)
        seen.add(vs.pid)
    in_virtual = not ck.ordered and nbase <= ck.shard_idx < nbase + len(ck.vsm)
    if in_virtual and ck.vs_pid != ck.vsm[ck.shard_idx - nbase].pid:
        raise bad_continuation("virtual-scan partition does not match", None)
    if ck.ordered and len(ck.cursors) != nbase:
        raise bad_continuation("cursor count does not match the base topology", None)
