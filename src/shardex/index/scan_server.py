"""The indexer's side of a scan (seed steps 11-13): find the slices, wait, read, stream.

``ScanSlices`` names local slices of one index. The handler checks them (INDEX_NOT_FOUND:
not here; INDEX_IN_ROLLBACK: a slice needs a rebuild; INDEX_NOT_READY: loading or never
built), picks what to read and answers ``SlicesOpened`` with it:

* ``snapshot_ts`` (scan or query stability with a TS chosen by the coordinator): the
  snapshot labelled with it, on every slice (SNAPSHOT_TOO_OLD once released);
* ``stability`` without a TS: wait until the slices share a snapshot covering ``wait_for``
  (``scan_wait.common_snapshot_ts``) and read it;
* otherwise the tips, after waiting likewise when ``wait_for`` is set (consistency without
  stability). The wait ends in SCAN_TIMEOUT naming, per data partition, wanted vs held.

Iterators are created before the reply (a scan pins its snapshots when it is asked for, so
a later stabilise releasing them cannot fail it), then a task streams blocks of raw entries
with credit flow control (``shardex.scan.streams``): the local slices merged in entry order
(``heapq.merge``) for ordered scans, one after the other otherwise, cut at ``limit``.
RocksDB is read in a small thread pool of its own, a block per hop, so neither the event
loop nor the pipeline's I/O thread waits behind a large scan.

``WaitStability`` is the first phase of a stable scan over several indexer nodes: the same
wait, answering the TS (the coordinator then pins the oldest answer for all).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import functools
import heapq
import itertools
from collections.abc import AsyncIterator, Callable, Iterator
from typing import TYPE_CHECKING, Any, Final, TypeVar

from shardex.core.timestamp import Timestamp
from shardex.errors import ErrorCode, ShardexError
from shardex.index.records import STATE_CREATED, STATE_LOADING, STATE_NEEDS_REBUILD
from shardex.index.scan_wait import StabilityWatch, common_snapshot_ts, scan_timeout
from shardex.net import Connection, RpcServer
from shardex.scan.messages import (
    ScanSlices,
    SlicesOpened,
    StabilityAt,
    WaitStability,
)
from shardex.scan.spans import from_wire_spans
from shardex.scan.streams import OutStream, OutStreams

if TYPE_CHECKING:
    from shardex.index.service import IndexService

__all__ = ["MAX_BLOCK_BYTES", "IndexScanServer", "take_block"]

T = TypeVar("T")

MAX_BLOCK_BYTES: Final = 1024 * 1024  # a block is cut here even below block_rows
MAX_BLOCK_ROWS: Final = 10_000
MAX_WAIT: Final = 600.0
SCAN_THREADS: Final = 2


def take_block(gen: Iterator[bytes], n: int, max_bytes: int = MAX_BLOCK_BYTES) -> list[bytes]:
    """Up to ``n`` entries of ``gen`` (fewer once ``max_bytes`` are collected)."""
    out: list[bytes] = []
    size = 0
    for entry in itertools.islice(gen, n):
        out.append(entry)
        size += len(entry)
        if size >= max_bytes:
            break
    return out


class IndexScanServer:
    """Scan routes of one indexer node, over its ``IndexService``."""

    def __init__(self, service: IndexService, streams: OutStreams) -> None:
        self.service = service
        self.streams = streams
        self.watch = StabilityWatch()
        self._executor: concurrent.futures.ThreadPoolExecutor | None = None

    @property
    def node(self) -> str:
        return self.service.name

    def install(self, server: RpcServer) -> None:
        server.route(ScanSlices, self.on_scan)
        server.route(WaitStability, self.on_wait)
        self.service.delivery.listeners.append(self.watch.notify)

    async def close(self) -> None:
        executor, self._executor = self._executor, None
        if executor is not None:
            await asyncio.to_thread(executor.shutdown, True)

    async def _run(self, fn: Callable[..., T], *args: Any) -> T:
        if self.service.inline_io:
            return fn(*args)
        if self._executor is None:
            self._executor = concurrent.futures.ThreadPoolExecutor(
                SCAN_THREADS, thread_name_prefix=f"index-scan-{self.node}"
            )
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._executor, functools.partial(fn, *args))

    # --- slices and their state ------------------------------------------------------------

    def _slices(self, index_id: str, partitions: list[int]) -> list[Any]:
        engine: Any = self.service.engine
        if not hasattr(engine, "scan"):
            raise ShardexError(
                f"the index engine of {self.node} cannot scan",
                code=ErrorCode.BAD_REQUEST,
                details={"node": self.node, "engine": type(engine).__name__},
            )
        if not partitions:
            raise ShardexError(
                "a slice scan needs at least one partition",
                code=ErrorCode.BAD_REQUEST,
                details={"index": index_id},
            )
        out = []
        for p in sorted(set(partitions)):
            s = engine.slice(index_id, p)  # INDEX_NOT_FOUND
            _check_state(s, self.node)
            self.service.slice_moves.check_serving(index_id, p)  # moved away: STALE_TOPOLOGY
            out.append(s)
        return out

    async def _stable_ts(
        self, index_id: str, partitions: list[int], wait_for: Timestamp | None, timeout: float
    ) -> Timestamp:
        """Wait until the slices share a snapshot covering ``wait_for``; return its TS."""
        last: list[Timestamp | None] = [None]

        def check() -> Timestamp | None:
            slices = self._slices(index_id, partitions)  # raises on drop / rollback
            ts = common_snapshot_ts(slices)
            last[0] = ts
            if ts is not None and (wait_for is None or ts.covers(wait_for)):
                return ts
            return None

        async def check_off_loop() -> Timestamp | None:
            return await self._run(check)

        timeout = min(max(timeout, 0.0), MAX_WAIT)
        ts = await self.watch.wait(index_id, check_off_loop, timeout)
        if ts is None:
            raise scan_timeout(index_id, self.node, last[0], wait_for or Timestamp(), timeout)
        result: Timestamp = ts
        return result

    # --- handlers ----------------------------------------------------------------------------

    async def on_wait(self, msg: WaitStability, conn: Connection) -> StabilityAt:
        wait_for = None if msg.wait_for is None else Timestamp.from_wire(msg.wait_for)
        ts = await self._stable_ts(msg.index_id, msg.partitions, wait_for, msg.timeout)
        return StabilityAt(node=self.node, ts=dict(ts.to_wire()))

    async def on_scan(self, msg: ScanSlices, conn: Connection) -> SlicesOpened:
        self.streams.check_new(conn, msg.scan_id)
        wait_for = None if msg.wait_for is None else Timestamp.from_wire(msg.wait_for)
        read_ts: Timestamp | None = None
        if msg.snapshot_ts is not None:
            read_ts = Timestamp.from_wire(msg.snapshot_ts)
        elif msg.stability or wait_for is not None:
            stable = await self._stable_ts(msg.index_id, msg.partitions, wait_for, msg.timeout)
            read_ts = stable if msg.stability else None
        spans = from_wire_spans(msg.spans)
        limit = msg.limit
        if limit is not None and limit < 0:
            raise ShardexError(
                f"limit must be >= 0, got {limit}", code=ErrorCode.BAD_REQUEST, details={}
            )

        def open_iterators() -> Iterator[bytes]:
            its = [
                s.scan(spans, snapshot_ts=read_ts, limit=limit, raw=True)
                for s in self._slices(msg.index_id, msg.partitions)
            ]
            merged = heapq.merge(*its) if msg.ordered else itertools.chain(*its)
            return itertools.islice(merged, limit) if limit is not None else merged

        gen = await self._run(open_iterators)  # SNAPSHOT_TOO_OLD etc. answer the request
        block_rows = max(1, min(msg.block_rows, MAX_BLOCK_ROWS))

        async def produce(stream: OutStream) -> None:
            while True:
                block = await self._run(take_block, gen, block_rows)
                if not block:
                    return
                await stream.send(block)

        self.streams.start(conn, msg.scan_id, msg.credit, produce)
        wire = None if read_ts is None else dict(read_ts.to_wire())
        return SlicesOpened(scan_id=msg.scan_id, node=self.node, ts=wire)

    async def read_local(
        self,
        index_id: str,
        partitions: list[int],
        spans: list[Any] | None,
        snapshot_ts: Timestamp | None,
        *,
        ordered: bool,
        limit: int | None = None,
        block_rows: int = 1000,
    ) -> AsyncIterator[list[bytes]]:
        """This node's slices of ``index_id`` read in-process (SQL leaf fragments): blocks
        of raw entries at ``snapshot_ts`` (None: the tips), merged in entry order when
        ``ordered``. Errors (SNAPSHOT_TOO_OLD, rollback) are raised before the first block."""

        def open_iterators() -> Iterator[bytes]:
            its = [
                s.scan(spans, snapshot_ts=snapshot_ts, limit=limit, raw=True)
                for s in self._slices(index_id, partitions)
            ]
            merged = heapq.merge(*its) if ordered else itertools.chain(*its)
            return itertools.islice(merged, limit) if limit is not None else merged

        gen = await self._run(open_iterators)
        while True:
            block = await self._run(take_block, gen, block_rows)
            if not block:
                return
            yield block


def _check_state(s: Any, node: str) -> None:
    state = getattr(s, "state", "")
    name = f"{s.index_id}/{s.partition}"
    if state == STATE_NEEDS_REBUILD:
        raise ShardexError(
            f"slice {name} on {node} is rolling back (it needs a rebuild)",
            code=ErrorCode.INDEX_IN_ROLLBACK,
            details={"index": s.index_id, "partition": s.partition, "node": node},
        )
    if state in (STATE_LOADING, STATE_CREATED):
        raise ShardexError(
            f"slice {name} on {node} is {state}: the index is not built yet",
            code=ErrorCode.INDEX_NOT_READY,
            details={"index": s.index_id, "partition": s.partition, "node": node, "state": state},
        )
