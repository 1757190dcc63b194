"""The initiator's side of a query's rows: the bounded channel the root fragment writes into
and the ``QueryResult`` the caller iterates.

The channel holds at most ``capacity`` batches, so a slow caller stops the root fragment,
which stops granting credits, which stops every sender: backpressure reaches the leaves.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa

from shardex.api.query_ids import QueryId
from shardex.errors import ShardexError

__all__ = ["QueryMetrics", "QueryResult", "ResultChannel"]


class ResultChannel:
    """Batches from the root fragment to the caller; ends with ``finish`` or ``fail``."""

    def __init__(self, capacity: int) -> None:
        self._capacity = max(1, capacity)
        self._queue: deque[pa.RecordBatch] = deque()
        self._changed = asyncio.Event()
        self.finished = False
        self.error: ShardexError | None = None

    @property
    def done(self) -> bool:
        return self.finished or self.error is not None

    async def put(self, batch: pa.RecordBatch) -> None:
        while len(self._queue) >= self._capacity and not self.done:
            self._changed.clear()
            await self._changed.wait()
        if not self.done:
            self._queue.append(batch)
            self._changed.set()

    def finish(self) -> None:
        if not self.done:
            self.finished = True
            self._changed.set()

    def fail(self, error: ShardexError) -> bool:
        """End with ``error``; False (and no effect) if the rows were complete already."""
        if self.done:
            return False
        self.error = error
        self._queue.clear()  # the caller gets the error, not a truncated result
        self._changed.set()
        return True

    async def get(self) -> pa.RecordBatch | None:
        """The next batch, None at the end; raises the query's error."""
        while True:
            if self._queue:
                batch = self._queue.popleft()
                self._changed.set()  # room for the root fragment again
                return batch
            if self.error is not None:
                raise self.error
            if self.finished:
                return None
            self._changed.clear()
            await self._changed.wait()


@dataclass
class QueryMetrics:
    started: float
    elapsed: float | None = None  # seconds (loop clock) once the rows are exhausted
    batches: int = 0
    rows: int = 0
    bytes: int = 0  # Arrow buffer bytes of the result batches
    extra: dict[str, Any] = field(default_factory=dict)


class QueryResult:
    """What ``QueryService.execute`` returns: ``async for batch in result`` (Arrow batches)
    or ``async for row in result.rows()`` (dicts). Raises the query's error (a cancel, a
    timeout, a fragment's failure). ``aclose()`` before the end cancels the query."""

    def __init__(
        self,
        query_id: QueryId,
        channel: ResultChannel,
        close: Callable[[], Awaitable[None]],
    ) -> None:
        self.query_id = query_id
        self._channel = channel
        self._close = close
        loop = asyncio.get_running_loop()
        self._clock = loop.time
        self.metrics = QueryMetrics(started=loop.time())

    def __aiter__(self) -> AsyncIterator[pa.RecordBatch]:
        return self._batches()

    async def _batches(self) -> AsyncIterator[pa.RecordBatch]:
        while True:
            batch = await self._channel.get()
            if batch is None:
                self.metrics.elapsed = self._clock() - self.metrics.started
                return
            self.metrics.batches += 1
            self.metrics.rows += batch.num_rows
            self.metrics.bytes += batch.nbytes
            yield batch

    async def rows(self) -> AsyncIterator[dict[str, Any]]:
        async for batch in self:
            for row in batch.to_pylist():
                yield row

    async def all_rows(self) -> list[dict[str, Any]]:
        return [row async for row in self.rows()]

    async def aclose(self) -> None:
        """Stop early: cancels the query everywhere (nothing if it has completed)."""
        if not self._channel.done:
            await self._close()
