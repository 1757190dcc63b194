"""Pages of a pinned paginated scan read from other copies when a shard's indexer fails.

A request_plus / at_plus paged scan reads one stability TS on every page, from the
indexers of its base topology (``paging_store_proxy``). With index replicas (decision 0085)
every copy of a partition in the topology holds every published TS, and the first page
leases the pinned snapshot on every copy (``paging_leases``: on the copies it read,
required; on the others, best effort). So when a batch's shard does not answer (its node
died: NODE_UNAVAILABLE, a closed connection, a timeout), the proxy reads that shard's
partitions from their other copies instead (``read_from_copies``):

* each partition from its first copy on a node that has not failed this page
  (``failover.placement``), one ``ShardBatch`` per node naming the partitions it stands in
  for (``stand_in``), with the batch's resume key and limit;
* the node reads just those partitions of its own copies at the pinned snapshot, after the
  resume key, in key order (``read_stand_in``): a pinned scan follows no moves, so the
  elastic algorithm's migration checks have nothing to do there;
* the answers are merged in key order and cut at the limit, which is exactly the batch the
  shard would have answered: the same entries after the same resume key at the same TS.

A tip scan (no pinned TS) never reads another copy: its tip is another state. A copy that no
longer holds the snapshot answers SNAPSHOT_TOO_OLD, which ends the page as before; no copy
left, and the shard's own error ends it.
"""

from __future__ import annotations

import asyncio
import heapq
import logging
from collections.abc import Awaitable, Callable

import msgspec

from shardex.core.topology import Topology
from shardex.errors import ErrorCode, ShardexError
from shardex.scan.elastic_node import ShardStore
from shardex.scan.failover import FAILOVER, failed_node, placement
from shardex.scan.paging_store_spec import PagedScanSpec
from shardex.scan.paging_wire import PageRow, ShardBatch, ShardBatchResult

__all__ = ["check_stand_in", "fails_over", "merge_answers", "read_from_copies", "read_stand_in"]

log = logging.getLogger(__name__)

CallOnce = Callable[[str, ShardBatch], Awaitable[ShardBatchResult]]


def check_stand_in(req: ShardBatch, base: Topology, node: str, pinned: bool) -> list[int]:
    """The partitions ``node`` reads for a stand-in batch, checked: a pinned scan's base
    shard batch, each partition one of the shard's in ``base`` with a copy on ``node``."""
    if not pinned or req.vs_pid >= 0:
        raise ShardexError(
            "only a pinned scan's base shard batch is read from other copies",
            code=ErrorCode.BAD_REQUEST,
            details={"shard": req.shard, "vs_pid": req.vs_pid},
        )
    mine = set(base.partitions_of(req.shard))
    wrong = [p for p in req.stand_in if p not in mine or node not in base.chain(p)]
    if wrong:
        raise ShardexError(
            f"node {node} holds no copy of partition(s) {wrong} of shard {req.shard} in "
            f"topology {base.seq_num}",
            code=ErrorCode.STALE_TOPOLOGY,
            details={"shard": req.shard, "node": node, "partitions": wrong},
        )
    return sorted(req.stand_in)


def read_stand_in(store: ShardStore, req: ShardBatch, partitions: list[int]) -> ShardBatchResult:
    """The entries of ``partitions`` after ``req.resume`` from this node's copies, as the
    shard's own batch returns them (in key order, at most ``req.limit``)."""
    wanted = frozenset(partitions)
    rows: list[PageRow] = []
    for key, pid, value in store.entries_after(req.resume, wanted):
        if pid not in wanted:
            continue
        rows.append(PageRow(key=key, partition=pid, value=value))
        if len(rows) >= req.limit:
            return ShardBatchResult(rows=rows, resume=key, vsm=req.vsm, exhausted=False)
    return ShardBatchResult(rows=rows, resume=None, vsm=req.vsm, exhausted=True)


def merge_answers(req: ShardBatch, answers: list[ShardBatchResult]) -> ShardBatchResult:
    """The stand-ins' answers as the shard's one batch: in key order, cut at the limit.
    Each answer holds its first ``limit`` entries, so the first ``limit`` of all of them
    are among those; the batch is exhausted only when every answer was and none was cut."""
    merged = list(heapq.merge(*(a.rows for a in answers), key=lambda r: r.key))
    rows = merged[: req.limit]
    if all(a.exhausted for a in answers) and len(merged) <= req.limit:
        return ShardBatchResult(rows=rows, resume=None, vsm=req.vsm, exhausted=True)
    resume = rows[-1].key if rows else req.resume
    return ShardBatchResult(rows=rows, resume=resume, vsm=req.vsm, exhausted=False)


async def read_from_copies(
    call: CallOnce,
    index_id: str,
    base: Topology,
    req: ShardBatch,
    error: ShardexError,
) -> ShardBatchResult:
    """``req``'s batch, whose shard failed with ``error``, from the other copies of its
    partitions (module docstring); ``error`` again when no copy is left."""
    avoid = {req.shard}
    parts = base.partitions_of(req.shard)
    while True:
        try:
            by_node = placement(index_id, base, parts, avoid)
        except ShardexError as none:
            raise error from none
        log.info(
            "paged scan of %s: shard %s failed (%s); its partitions read on %s",
            index_id,
            req.shard,
            error.code.name,
            sorted(by_node),
        )

        async def one(node: str, ps: list[int]) -> ShardBatchResult:
            try:
                return await call(node, msgspec.structs.replace(req, stand_in=ps))
            except ShardexError as exc:
                if exc.code in FAILOVER:
                    exc.details.setdefault("indexer", node)
                raise

        try:
            answers = await asyncio.gather(*(one(n, ps) for n, ps in by_node.items()))
        except ShardexError as exc:
            node = failed_node(exc)
            if node is None or node in avoid:
                raise
            avoid.add(node)
            continue
        return merge_answers(req, list(answers))


def fails_over(exc: ShardexError, spec: PagedScanSpec) -> bool:
    """Whether a batch that failed with ``exc`` may be read from other copies: its node
    failed, and the scan reads an index at a pinned TS."""
    return exc.code in FAILOVER and not spec.primary and spec.snapshot is not None
