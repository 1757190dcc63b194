"""Batched writes: chunks of documents split by owner node, sent in parallel, pipelined.

The caller's thread validates and encodes a chunk (so a bad item fails alone, before any
network work) while earlier chunks are on the wire. Each chunk is split by the node owning
each item's partition; every node has one sender task that sends its sub-batches one at a
time, in chunk order, so two writes of one docid in the input apply in input order, while
different nodes work in parallel. Items a node refuses with NOT_MY_PARTITION are re-routed
with a refreshed topology (bounded, with backoff); items whose node could not be reached were
never sent and are retried the same way; items whose connection died in flight are reported
as failed (their outcome is unknown).
"""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any

from shardex.api.data import OpItem
from shardex.api.records import MutationResult
from shardex.client.routing import ROUTE_ATTEMPTS, DataRouter, backoff
from shardex.errors import ErrorCode, ShardexError
from shardex.meta.partitioning import partition_of

Result = MutationResult | ShardexError
_REROUTE = (ErrorCode.NOT_MY_PARTITION,)


class BulkWriteError(ShardexError):
    """Some items of a batched write failed; the others were written.

    ``results`` aligns with the input (a ``MutationResult`` or the item's ``ShardexError``);
    ``failures`` lists (index, docid, error) for the failed ones."""

    def __init__(self, results: list[Result], docids: list[str]) -> None:
        self.results = results
        self.failures = [
            (i, docids[i], r) for i, r in enumerate(results) if isinstance(r, ShardexError)
        ]
        shown = "; ".join(f"#{i} {d!r}: {e}" for i, d, e in self.failures[:5])
        more = len(self.failures) - 5
        super().__init__(
            f"{len(self.failures)} of {len(results)} item(s) failed: {shown}"
            + (f"; and {more} more" if more > 0 else ""),
            code=ErrorCode.PARTIAL_FAILURE,
            details={
                "failed": len(self.failures),
                "total": len(results),
                "codes": sorted({e.code.value for _, _, e in self.failures}),
            },
        )


class BulkWriter:
    """Async side of one batched write (lives on the client's loop)."""

    def __init__(
        self,
        router: DataRouter,
        keyspace: str,
        durability: str,
        durability_timeout: float | None = None,
    ) -> None:
        self._router = router
        self.keyspace = keyspace
        self.durability = durability
        self.durability_timeout = durability_timeout  # checked by the caller
        self._queues: dict[
            str, asyncio.Queue[tuple[list[tuple[int, OpItem]], asyncio.Future[Any]]]
        ] = {}
        self._senders: list[asyncio.Task[None]] = []
        self._num_partitions = 0
        self._assignment: dict[int, str] = {}

    async def start(self) -> None:
        meta, topo = await self._router.keyspace(self.keyspace)
        self._num_partitions, self._assignment = meta.num_partitions, dict(topo.assignment)

    async def close(self) -> None:
        for t in self._senders:
            t.cancel()
        await asyncio.gather(*self._senders, return_exceptions=True)

    async def write_chunk(self, ops: list[tuple[int, OpItem]]) -> dict[int, Result]:
        """Write ``(index, op)`` pairs; returns index -> result or error. Chunks written
        concurrently reach each node in call order (one sender task per node)."""
        return await self._write(ops, queued=True)

    async def write_only_chunk(self, ops: list[tuple[int, OpItem]]) -> dict[int, Result]:
        """``write_chunk`` for a call whose whole input is this one chunk: ``start``, the
        per-node requests and nothing to close, in one coroutine on the client's loop.

        Why: a paced writer sends small ``upsert_many`` calls (tens of documents); per call,
        the sender tasks and queues plus the separate start/write/close hops from the
        caller's thread cost more instructions than the documents themselves. With one
        chunk there is no later chunk to keep in order behind it, so the node requests go
        out directly (concurrently, one per node)."""
        await self.start()
        return await self._write(ops, queued=False)

    async def _write(self, ops: list[tuple[int, OpItem]], *, queued: bool) -> dict[int, Result]:
        results: dict[int, Result] = {}
        pending = ops
        for attempt in range(ROUTE_ATTEMPTS):
            groups = self._split(pending)
            if queued:
                # Split and enqueue before any await: chunks reach each node in call order.
                futures = [self._enqueue(node, group) for node, group in groups]
                for fut in futures:
                    results.update(await fut)
            elif len(groups) == 1:  # no task needed for a single node
                results.update(await self._send_safe(*groups[0]))
            else:
                for out in await asyncio.gather(*(self._send_safe(n, g) for n, g in groups)):
                    results.update(out)
            pending = [
                (i, op)
                for i, op in pending
                if isinstance(results.get(i), ShardexError) and _retryable(results[i])
            ]
            if not pending:
                break
            await asyncio.sleep(backoff(attempt))
            with contextlib.suppress(ShardexError):
                meta, topo = await self._router.keyspace(self.keyspace, refresh=True)
                self._num_partitions, self._assignment = meta.num_partitions, dict(topo.assignment)
        return results

    def _split(self, ops: list[tuple[int, OpItem]]) -> list[tuple[str, list[tuple[int, OpItem]]]]:
        groups: dict[str, list[tuple[int, OpItem]]] = {}
        for i, op in ops:
            node = self._assignment[partition_of(op.docid, self._num_partitions)]
            groups.setdefault(node, []).append((i, op))
        return sorted(groups.items())

    def _enqueue(self, node: str, group: list[tuple[int, OpItem]]) -> asyncio.Future[Any]:
        queue = self._queues.get(node)
        if queue is None:
            queue = self._queues[node] = asyncio.Queue()
            self._senders.append(asyncio.get_running_loop().create_task(self._sender(node, queue)))
        fut: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        queue.put_nowait((group, fut))
        return fut

    async def _sender(
        self,
        node: str,
        queue: asyncio.Queue[tuple[list[tuple[int, OpItem]], asyncio.Future[Any]]],
    ) -> None:
        while True:
            group, fut = await queue.get()
            out = await self._send_safe(node, group)
            if not fut.done():
                fut.set_result(out)

    async def _send_safe(self, node: str, group: list[tuple[int, OpItem]]) -> dict[int, Result]:
        try:
            return await self._send(node, group)
        except Exception as exc:  # every item gets an outcome, whatever went wrong
            err = exc if isinstance(exc, ShardexError) else ShardexError(repr(exc))
            return {i: err for i, _ in group}

    async def _send(self, node: str, group: list[tuple[int, OpItem]]) -> dict[int, Result]:
        # Through the client's coalescer: merged with other calls' writes to this node that
        # wait while a request is out (``coalesce.py``).
        outcomes = await self._router.writes.submit(
            node,
            self.keyspace,
            self.durability,
            [op for _, op in group],
            self.durability_timeout,
        )
        return {i: r for (i, _), r in zip(group, outcomes, strict=True)}


def _retryable(err: ShardexError) -> bool:
    return err.code in _REROUTE or bool(err.details.get("unsent"))
