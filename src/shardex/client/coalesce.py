"""Client-side coalescing of batched writes: one ``MutateMany`` in flight per node.

Why: a data node pays a large fixed cost per request (~500k instructions: the RPC layer, the
hop to its I/O pool, one commit and its fsync, measured in
``docs/decisions/0049-data-node-write-path-cpu.md``), whatever the request carries. A client
whose threads write concurrently (the
pipeline bench's paced writers: two threads per process, each sending ~25 documents every
20 ms, split over the nodes) sent one small request per call and node. Here, per (node,
keyspace, durability and its timeout), at most one request is in flight from this client;
calls arriving meanwhile wait and go together in the next one, whole and in arrival order.
The node would have queued them behind its running commit anyway (its group commit), so the
wait costs about what the extra request saved, and the node sees fewer, larger requests.

Outcomes are per op, aligned with each caller's ops; a whole-request failure (connection
lost, node refused the batch) is given to every op of that request, with the same
``unsent`` / ``outcome`` details a single caller got before.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING

from shardex.api.data import MutateMany, MutateManyReply, OpItem
from shardex.api.records import MutationResult
from shardex.errors import ErrorCode, ShardexError

if TYPE_CHECKING:
    from shardex.client.routing import DataRouter

Result = MutationResult | ShardexError
# (node, keyspace, durability, durability timeout or None, ops) -> an outcome per op
Send = Callable[[str, str, str, float | None, list[OpItem]], Awaitable[list[Result]]]
Lane = tuple[str, str, str, float | None]  # the four first arguments of a ``Send``

MAX_MERGED_OPS = 1000  # ops per merged request (a larger call still goes alone)


class _Lane:
    """Waiting calls of one ``Lane`` and whether a request is out."""

    __slots__ = ("busy", "waiting")

    def __init__(self) -> None:
        self.busy = False
        self.waiting: list[tuple[list[OpItem], asyncio.Future[list[Result]]]] = []


class WriteCoalescer:
    """Lives on the client's loop (one per ``DataRouter``)."""

    def __init__(self, send: Send) -> None:
        self._send = send
        self._lanes: dict[Lane, _Lane] = {}
        self._tasks: set[asyncio.Task[None]] = set()
        self.requests = 0  # counters for tests and benchmarks
        self.calls = 0

    async def submit(
        self,
        node: str,
        keyspace: str,
        durability: str,
        ops: list[OpItem],
        durability_timeout: float | None = None,
    ) -> list[Result]:
        """Write ``ops`` to ``node`` (alone or merged with other waiting calls); returns one
        outcome per op, in order."""
        key = (node, keyspace, durability, durability_timeout)
        lane = self._lanes.get(key)
        if lane is None:
            lane = self._lanes[key] = _Lane()
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[list[Result]] = loop.create_future()
        lane.waiting.append((ops, fut))
        self.calls += 1
        if not lane.busy:
            lane.busy = True
            # A task of its own, not the caller's coroutine: a caller that is cancelled
            # must not strand the other callers merged into its request.
            task = loop.create_task(self._drain(key, lane))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)
        return await fut

    async def close(self) -> None:
        for t in list(self._tasks):
            t.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)

    async def _drain(self, key: Lane, lane: _Lane) -> None:
        group: list[tuple[list[OpItem], asyncio.Future[list[Result]]]] = []
        try:
            while lane.waiting:
                n = total = 0
                while n < len(lane.waiting) and (
                    n == 0 or total + len(lane.waiting[n][0]) <= MAX_MERGED_OPS
                ):
                    total += len(lane.waiting[n][0])
                    n += 1
                group, lane.waiting = lane.waiting[:n], lane.waiting[n:]
                ops = group[0][0] if n == 1 else [op for o, _ in group for op in o]
                self.requests += 1
                try:
                    out = await self._send(*key, ops)
                except Exception as exc:  # every op gets an outcome, whatever went wrong
                    err = exc if isinstance(exc, ShardexError) else ShardexError(repr(exc))
                    out = [err] * len(ops)
                start = 0
                for o, fut in group:
                    if not fut.done():  # its caller may have been cancelled
                        fut.set_result(out[start : start + len(o)])
                    start += len(o)
                group = []
        finally:
            lane.busy = False
            # Cancelled (the client is closing): the request out may or may not have been
            # applied; the calls still waiting were never sent.
            unknown = ShardexError("client closing: the write's outcome is unknown")
            unknown.details["outcome"] = "unknown: the request may have been applied"
            unsent = ShardexError("client closing: the write was not sent")
            unsent.details["unsent"] = True
            for err, calls in ((unknown, group), (unsent, lane.waiting)):
                for o, fut in calls:
                    with contextlib.suppress(asyncio.InvalidStateError):
                        fut.set_result([err] * len(o))
            lane.waiting = []


async def send_mutate_many(
    router: DataRouter,
    node: str,
    keyspace: str,
    durability: str,
    durability_timeout: float | None,
    ops: list[OpItem],
) -> list[Result]:
    """One ``MutateMany`` to ``node``; an outcome per op (a whole-request failure repeated)."""
    try:
        conn = await router.pool.get(await router.address(node), router.request_timeout)
    except ShardexError as exc:
        exc.details.setdefault("unsent", True)
        return [exc] * len(ops)
    msg = MutateMany(
        keyspace=keyspace, ops=ops, durability=durability, durability_timeout=durability_timeout
    )
    timeout = router.write_timeout(durability_timeout) or router.request_timeout
    try:
        reply = await conn.request(msg, timeout, expect=MutateManyReply)
    except ShardexError as exc:
        if exc.code is not ErrorCode.NOT_MY_PARTITION:  # else the whole batch was refused
            exc.details.setdefault("outcome", "unknown: the request may have been applied")
        return [exc] * len(ops)
    out: list[Result | None] = list(reply.results)
    for item in reply.errors:
        e = item.error
        out[item.index] = ShardexError.from_wire(e.code, e.message, e.details)
    return out  # type: ignore[return-value]  # every None had its error
