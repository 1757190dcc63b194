"""A scan's slice streams failing over between copies of an index partition.

An index with replicas keeps every partition on several indexers (decision 0085), and every
copy in the topology holds every published stability TS. So a slice stream that dies after
rows went out (its indexer killed, its connection closed) can be continued on another copy:

* *where to read* (``placement``): each partition's first copy - primary, then replicas in
  topology order - on a node that has not failed this scan;
* *from where*: each stream is read in entry order (an indexer merges its local slices; the
  coordinator asks for that even for an unordered scan of a replicated index), so every
  entry of the stream's partitions up to the last one handed on has been read, and none
  after it. The rest is the same spans narrowed to start strictly after that entry
  (``core.spans.spans_after``) at the same TS, with what is left of the stream's limit;
* *in its place* (``Resumable``): the stream the merge reads from swaps its source for the
  new one (or an ordered merge of several, when the partitions' other copies are on
  different nodes), and the merge goes on as if nothing happened: no entry twice, none
  missing.

A copy that no longer holds the TS (SNAPSHOT_TOO_OLD), or no copy left, ends the scan with
the stream's original error. Reading the tips (no TS) never fails over mid-stream: another
copy's tip is another state of the index, and entries could then repeat or go missing.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Awaitable
from typing import Final, Protocol

from shardex.api.scan_streams import LocalStream, Source, cancel_all
from shardex.core.topology import Topology
from shardex.errors import ErrorCode, ShardexError
from shardex.scan.merge import merge_ordered

__all__ = [
    "FAILOVER",
    "MergedSource",
    "Reopen",
    "Resumable",
    "failed_node",
    "placement",
]

log = logging.getLogger(__name__)

# Failures of an indexer node (not of its slices) that another copy of its partitions can
# stand in for.
FAILOVER: Final = frozenset(
    {ErrorCode.NODE_UNAVAILABLE, ErrorCode.CONNECTION_CLOSED, ErrorCode.TIMEOUT}
)


def placement(
    index: str,
    topo: Topology,
    partitions: list[int],
    avoid: set[str] | frozenset[str] = frozenset(),
) -> dict[str, list[int]]:
    """Indexer node -> the index partitions it serves in ``topo``: each partition's first
    copy (its primary, then its replicas in order) on a node not in ``avoid``."""
    by_node: dict[str, list[int]] = {}
    for p in partitions:
        if p not in topo.assignment:
            raise ShardexError(
                f"index partition {p} of {index!r} has no indexer in topology {topo.seq_num}",
                code=ErrorCode.INDEX_NOT_READY,
                details={"index": index, "partition": p},
            )
        node = next((n for n in topo.chain(p) if n not in avoid), None)
        if node is None:
            raise ShardexError(
                f"every copy of index partition {p} of {index!r} failed this scan",
                code=ErrorCode.NODE_UNAVAILABLE,
                details={"index": index, "partition": p, "copies": topo.chain(p)},
            )
        by_node.setdefault(node, []).append(p)
    return by_node


def failed_node(exc: ShardexError) -> str | None:
    """The indexer whose failure ``exc`` is, when another copy may stand in for it."""
    node = exc.details.get("indexer")
    return node if exc.code in FAILOVER and isinstance(node, str) else None


class Reopen(Protocol):
    """Opens ``partitions`` again on other copies than ``failed``'s (and any other node
    that failed this scan), at the scan's TS, after the entry ``after`` (None: from the
    start), at most ``limit`` entries (None: all): (node, its partitions, its stream) per
    node opened; [] when nothing is left to read."""

    def __call__(
        self, failed: str, partitions: list[int], after: bytes | None, limit: int | None
    ) -> Awaitable[list[tuple[str, list[int], Source]]]: ...


class Resumable:
    """One indexer's stream of a scan, which another copy takes over if the indexer fails.

    Until ``arm`` it only passes its source through (a scan that cannot fail over: the
    tips, or no replicas). Once armed, a FAILOVER error of its source is handled here:
    the source is replaced by the streams ``reopen`` opens after the last entry handed on,
    each itself a ``Resumable`` (armed alike) so a second failure is handled the same way."""

    __slots__ = ("_limit", "_reopen", "block_rows", "last", "node", "partitions", "sent", "source")

    def __init__(self, node: str, partitions: list[int], source: Source, limit: int | None) -> None:
        self.node = node
        self.partitions = partitions
        self.source = source
        self._limit = limit  # the stream's own request limit (None: all)
        self._reopen: Reopen | None = None
        self.block_rows = 1000
        self.last: bytes | None = None  # the last entry handed on
        self.sent = 0

    def arm(self, reopen: Reopen, block_rows: int) -> None:
        self._reopen = reopen
        self.block_rows = block_rows

    @property
    def complete(self) -> bool:
        return self.source.complete

    def take_head(self) -> list[bytes]:
        return self.source.take_head()

    def ready(self) -> bool:
        return self.source.ready()

    async def next_block(self) -> list[bytes] | None:
        limit = self._limit
        if limit is not None and self.sent >= limit:
            return None  # the copies that took over each had the whole rest as their limit
        while True:
            try:
                block = await self.source.next_block()
            except ShardexError as exc:
                if self._reopen is None or exc.code not in FAILOVER:
                    raise
                await self._take_over(exc, self._reopen)
                continue
            if block:
                if limit is not None and self.sent + len(block) > limit:
                    block = block[: limit - self.sent]
                self.last = block[-1]
                self.sent += len(block)
            return block

    async def _take_over(self, exc: ShardexError, reopen: Reopen) -> None:
        self._reopen = None  # the new streams fail over themselves
        with contextlib.suppress(Exception):
            await self.source.cancel()
        left = None if self._limit is None else self._limit - self.sent
        try:
            opened = await reopen(self.node, self.partitions, self.last, left)
        except ShardexError as again:
            log.info("scan stream from %s failed (%s); no copy took over: %s", self.node,
                     exc.code.name, again)  # fmt: skip
            raise exc from again
        log.info(
            "scan stream from %s failed (%s) after %d entries; continued on %s",
            self.node,
            exc.code.name,
            self.sent,
            ", ".join(n for n, _, _ in opened) or "nothing (all read)",
        )
        children: list[Source] = []
        for node, parts, src in opened:
            child = src if isinstance(src, Resumable) else Resumable(node, parts, src, left)
            child.arm(reopen, self.block_rows)
            children.append(child)
        if not children:  # the stream had read all its limit allowed, or every range
            self.source = LocalStream([], None)
        elif len(children) == 1:
            self.source = children[0]
        else:
            self.source = MergedSource(children, self.block_rows)

    async def cancel(self) -> None:
        await self.source.cancel()


class MergedSource:
    """Several streams read as one, in entry order (``merge.merge_ordered``): the copies
    that took over one indexer's partitions."""

    def __init__(self, sources: list[Source], block_rows: int) -> None:
        self._sources = sources
        self._blocks = merge_ordered(sources, block_rows)

    @property
    def complete(self) -> bool:
        return False

    def take_head(self) -> list[bytes]:
        raise AssertionError("a merged stream is never complete at its head")

    def ready(self) -> bool:
        return False

    async def next_block(self) -> list[bytes] | None:
        try:
            return await anext(self._blocks)
        except StopAsyncIteration:
            return None

    async def cancel(self) -> None:
        await self._blocks.aclose()
        await cancel_all(self._sources)
