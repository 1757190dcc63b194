"""Change streams over the wire, node side: one task per open stream, credit flow control.

The engine's stream runs are synchronous generators over a RocksDB snapshot; they are drained
in chunks in the I/O executor so a large backfill never stalls the event loop. Between runs a
following stream awaits the partition's next commit (``DataEngine.wait_for_seqno``).

Back-pressure: the opener grants ``credit`` batches; each ``StreamBatch`` spends one and each
``StreamCredit`` returns some. With no credit the task waits, holding at most one prepared
batch, so a slow consumer costs this node O(credit x batch) memory, never an unbounded
queue. A stream ends with exactly one ``StreamEnd`` (error or not), unless its connection
closed (then there is nobody to tell) or the opener cancelled it.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
from collections.abc import Awaitable, Callable, Iterator
from typing import Any

from shardex.api.data import (
    CancelStream,
    ChangeTuple,
    OpenStream,
    StreamBatch,
    StreamCredit,
    StreamEnd,
    StreamOpened,
)
from shardex.api.errors import WireError
from shardex.api.records import Change, SnapshotMarker
from shardex.data.engine import DataEngine
from shardex.errors import ErrorCode, ShardexError
from shardex.net import Connection

log = logging.getLogger(__name__)

MAX_CREDIT = 64
MAX_BATCH_ITEMS = 5000
MAX_BATCH_BYTES = 4 * 1024 * 1024  # a batch is cut here even below max_items

RunInExecutor = Callable[..., Awaitable[Any]]
StreamItem = SnapshotMarker | Change | ChangeTuple
_Taken = tuple[list[StreamItem], bool]  # (items, the run is exhausted)


class _Stream:
    def __init__(self, msg: OpenStream, conn: Connection) -> None:
        self.msg = msg
        self.conn = conn
        self.credit = max(1, min(msg.credit, MAX_CREDIT))
        self.credit_changed = asyncio.Event()
        self.task: asyncio.Task[None] | None = None


def _take(gen: Iterator[StreamItem], n: int, max_bytes: int) -> _Taken:
    """Up to ``n`` items (fewer once ``max_bytes`` of bodies are collected) and whether the
    run is exhausted (fewer than ``n`` came without the byte cut: asking again would only
    cost another trip to the executor to learn it); runs in a thread."""
    out, exhausted, _size = take_sized(gen, n, max_bytes)
    return out, exhausted


def take_sized(gen: Iterator[StreamItem], n: int, max_bytes: int) -> tuple[list[Any], bool, int]:
    """``_take`` plus the bytes counted (bodies and docids of wire tuples): a multi-range
    read (``range_reads.py``) spends one reply's byte budget over many runs."""
    out: list[StreamItem] = []
    size = 0
    for item in itertools.islice(gen, n):
        out.append(item)
        if type(item) is tuple and item[4] is not None:  # (seqno, docid, op, cas, body, ..)
            size += len(item[4]) + len(item[1])
            if size >= max_bytes:
                return out, False, size
    return out, len(out) < n, size


def _open_and_take(
    engine: DataEngine, msg: OpenStream, pos: int, uuid: int, max_items: int
) -> tuple[Iterator[StreamItem], _Taken]:
    """Open a run at (pos, uuid) and take its first batch in the same executor call: a
    bounded read (the driver's micro-batches: ~100 changes per partition) is then served
    with one executor trip instead of three (open, take, take again to see the end)."""
    run = engine.stream(msg.keyspace, msg.partition, pos, uuid, msg.end_seqno, wire=True)
    try:
        return run, _take(run, max_items, MAX_BATCH_BYTES)
    except BaseException:
        close_quietly(run)
        raise


class StreamServer:
    """Open streams of one data node, by (connection, stream id)."""

    def __init__(
        self,
        engine: DataEngine,
        run: RunInExecutor,
        enrich: Callable[[ShardexError], ShardexError],
    ) -> None:
        self._engine = engine
        self._run = run
        self._enrich = enrich  # adds owner hints to NOT_MY_PARTITION errors
        self._streams: dict[tuple[Connection, int], _Stream] = {}
        self._watched: dict[Connection, None] = {}  # connections with our close callback

    @property
    def open_streams(self) -> int:
        return len(self._streams)

    async def on_open(self, msg: OpenStream, conn: Connection) -> StreamOpened:
        key = (conn, msg.stream_id)
        if key in self._streams:
            raise ShardexError(
                f"stream {msg.stream_id} is already open on this connection",
                code=ErrorCode.BAD_REQUEST,
                details={"stream_id": msg.stream_id},
            )
        try:
            # Checks (keyspace, ownership, ROLLBACK) happen here so the reply carries them.
            info = self._engine.partition_info(msg.keyspace, msg.partition)
            run, first = await self._run(
                _open_and_take, self._engine, msg, msg.from_seqno, msg.uuid, _max_items(msg)
            )
        except ShardexError as exc:
            raise self._enrich(exc) from None
        stream = _Stream(msg, conn)
        self._streams[key] = stream
        if conn not in self._watched:
            self._watched[conn] = None
            conn.add_close_callback(self._on_conn_closed)
        stream.task = asyncio.get_running_loop().create_task(
            self._serve(stream, run, first), name=f"data-stream {msg.keyspace}/{msg.partition}"
        )
        return StreamOpened(stream_id=msg.stream_id, uuid=info.uuid, high_seqno=info.high_seqno)

    async def on_credit(self, msg: StreamCredit, conn: Connection) -> None:
        stream = self._streams.get((conn, msg.stream_id))
        if stream is not None and msg.batches > 0:
            stream.credit = min(stream.credit + msg.batches, MAX_CREDIT)
            stream.credit_changed.set()

    async def on_cancel(self, msg: CancelStream, conn: Connection) -> None:
        stream = self._streams.pop((conn, msg.stream_id), None)
        if stream is not None and stream.task is not None:
            stream.task.cancel()

    async def close(self) -> None:
        tasks = [s.task for s in self._streams.values() if s.task is not None]
        self._streams.clear()
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    def _on_conn_closed(self, conn: Connection) -> None:
        self._watched.pop(conn, None)
        for key in [k for k in self._streams if k[0] is conn]:
            stream = self._streams.pop(key)
            if stream.task is not None:
                stream.task.cancel()

    # --- the stream task -------------------------------------------------------------------

    async def _serve(self, stream: _Stream, first_run: Iterator[StreamItem], first: _Taken) -> None:
        msg = stream.msg
        error: ShardexError | None = None
        try:
            await self._pump(stream, first_run, first)
        except asyncio.CancelledError:
            close_quietly(first_run)
            raise
        except ShardexError as exc:
            error = self._enrich(exc)
        except Exception as exc:
            log.exception("stream %s/%s failed", msg.keyspace, msg.partition)
            error = ShardexError(f"{type(exc).__name__}: {exc}", code=ErrorCode.INTERNAL)
        self._streams.pop((stream.conn, msg.stream_id), None)
        end = StreamEnd(stream_id=msg.stream_id)
        if error is not None:
            code, message, details = error.to_wire()
            end = StreamEnd(stream_id=msg.stream_id, error=WireError(code, message, details))
        with contextlib.suppress(ShardexError):  # a closed connection: nobody is listening
            await stream.conn.send(end)

    async def _pump(self, stream: _Stream, run: Iterator[StreamItem], first: _Taken) -> None:
        """Send ``run`` (whose first batch is ``first``), then, when following, every later
        run; returns at ``end_seqno`` or, not following, at the run's end."""
        msg = stream.msg
        max_items = _max_items(msg)
        pos, uuid = msg.from_seqno, msg.uuid
        taken: _Taken | None = first
        while True:
            run_end = pos  # a run covers up to its marker's end (a backfill skips seqnos)
            try:
                exhausted = False
                while not exhausted:
                    if taken is None:
                        taken = await self._run(_take, run, max_items, MAX_BATCH_BYTES)
                    items, exhausted = taken
                    taken = None
                    if not items:
                        break
                    for batch in _batches(msg.stream_id, items):
                        if batch.marker is not None:
                            uuid, run_end = batch.marker[2], batch.marker[1]
                        await self._send(stream, batch)
            finally:
                close_quietly(run)
            pos = max(pos, run_end)
            if msg.end_seqno is not None and pos >= msg.end_seqno:
                return
            if not msg.follow:
                return
            # Wait for a commit past what we sent (raises NOT_MY_PARTITION if it goes away).
            await self._engine.wait_for_seqno(msg.keyspace, msg.partition, pos, None)
            run, taken = await self._run(_open_and_take, self._engine, msg, pos, uuid, max_items)

    async def _send(self, stream: _Stream, batch: StreamBatch) -> None:
        while stream.credit <= 0:
            stream.credit_changed.clear()
            await stream.credit_changed.wait()
        stream.credit -= 1
        await stream.conn.send(batch)


def _max_items(msg: OpenStream) -> int:
    return max(1, min(msg.max_items, MAX_BATCH_ITEMS))


def _batches(stream_id: int, items: list[StreamItem]) -> Iterator[StreamBatch]:
    """Split ``items`` at snapshot markers: each batch starts with at most one marker.
    Changes come as ``StreamBatch`` tuples (``DataEngine.stream(..., wire=True)``) or
    ``Change``s."""
    marker: tuple[int, int, int, bool] | None = None
    changes: list[ChangeTuple] = []
    for item in items:
        if type(item) is tuple:
            changes.append(item)
        elif isinstance(item, SnapshotMarker):
            if marker is not None or changes:
                yield StreamBatch(stream_id=stream_id, marker=marker, changes=changes)
            marker = (item.start, item.end, item.uuid, item.backfill)
            changes = []
        else:
            changes.append(
                (item.seqno, item.docid, item.op, item.cas, item.body, item.flags, item.expiry)
            )
    if marker is not None or changes:
        yield StreamBatch(stream_id=stream_id, marker=marker, changes=changes)


def close_quietly(run: Iterator[Any]) -> None:
    """Close a run's generator (releasing its snapshot), logging instead of raising."""
    close = getattr(run, "close", None)
    if close is not None:
        try:
            close()
        except Exception:  # a generator closed while another thread runs it: released later
            log.debug("closing a stream run failed", exc_info=True)
