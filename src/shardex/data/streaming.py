"""Change streams over the wire, node side: one task per open stream, credit flow control.

The engine's stream runs are synchronous generators over a RocksDB snapshot; they are drained
in chunks in the I/O executor so a large backfill never stalls the event loop. Between runs a
following stream awaits the partition's next commit (``DataEngine.wait_for_seqno``).

Back-pressure (``shardex.net.credit_stream``): the opener grants ``credit`` batches; each
``StreamBatch`` spends one and each ``StreamCredit`` returns some. With no credit the task
waits, holding at most one prepared batch, so a slow consumer costs this node O(credit x
batch) memory, never an unbounded queue. A stream ends with exactly one ``StreamEnd`` (error
or not), unless its connection closed (then there is nobody to tell) or the opener cancelled
it.
"""

from __future__ import annotations

import asyncio
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
from shardex.net.credit_stream import OutStream, OutStreams

log = logging.getLogger(__name__)

MAX_CREDIT = 64
MAX_BATCH_ITEMS = 5000
MAX_BATCH_BYTES = 4 * 1024 * 1024  # a batch is cut here even below max_items

RunInExecutor = Callable[..., Awaitable[Any]]
StreamItem = SnapshotMarker | Change | ChangeTuple
_Taken = tuple[list[StreamItem], bool]  # (items, the run is exhausted)


class _Stream(OutStream):
    def __init__(self, msg: OpenStream, conn: Connection) -> None:
        super().__init__(conn, msg.stream_id, msg.credit, MAX_CREDIT)
        self.msg = msg
        self.sent = msg.from_seqno  # the seqno sent up to (the node's metrics: its lag)


def _stream_end(stream: _Stream, error: ShardexError | None) -> StreamEnd:
    if error is None:
        return StreamEnd(stream_id=stream.stream_id)
    code, message, details = error.to_wire()
    return StreamEnd(stream_id=stream.stream_id, error=WireError(code, message, details))


def _duplicate(stream_id: int) -> ShardexError:
    return ShardexError(
        f"stream {stream_id} is already open on this connection",
        code=ErrorCode.BAD_REQUEST,
        details={"stream_id": stream_id},
    )


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
        self._streams: OutStreams[_Stream] = OutStreams(
            end=_stream_end, duplicate=_duplicate, enrich=enrich
        )
        self._running: dict[_Stream, None] = {}  # streams whose task runs, for ``positions``

    @property
    def open_streams(self) -> int:
        return self._streams.open_streams

    def positions(self) -> list[tuple[str, int, int]]:
        """(keyspace, partition, seqno sent up to) of each stream running now."""
        return [(s.msg.keyspace, s.msg.partition, s.sent) for s in list(self._running)]

    async def on_open(self, msg: OpenStream, conn: Connection) -> StreamOpened:
        self._streams.check_new(conn, msg.stream_id)
        try:
            # Checks (keyspace, ownership, ROLLBACK) happen here so the reply carries them.
            info = self._engine.partition_info(msg.keyspace, msg.partition)
            run, first = await self._run(
                _open_and_take, self._engine, msg, msg.from_seqno, msg.uuid, _max_items(msg)
            )
        except ShardexError as exc:
            raise self._enrich(exc) from None

        async def produce(stream: _Stream) -> None:
            self._running[stream] = None
            try:
                await self._pump(stream, run, first)
            except asyncio.CancelledError:
                close_quietly(run)
                raise
            finally:
                self._running.pop(stream, None)

        try:
            self._streams.start_stream(
                _Stream(msg, conn),
                produce,
                name=f"data-stream {msg.keyspace}/{msg.partition}",
                label=f"stream {msg.keyspace}/{msg.partition}",
            )
        except BaseException:  # the same id opened meanwhile: this run is nobody's
            close_quietly(run)
            raise
        return StreamOpened(stream_id=msg.stream_id, uuid=info.uuid, high_seqno=info.high_seqno)

    async def on_credit(self, msg: StreamCredit, conn: Connection) -> None:
        self._streams.grant(conn, msg.stream_id, msg.batches)

    async def on_cancel(self, msg: CancelStream, conn: Connection) -> None:
        self._streams.cancel(conn, msg.stream_id)

    async def close(self) -> None:
        await self._streams.close()

    # --- the stream task -------------------------------------------------------------------

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
                        await stream.send_message(batch)
                        if batch.changes:
                            stream.sent = batch.changes[-1][0]
            finally:
                close_quietly(run)
            pos = stream.sent = max(pos, run_end)
            if msg.end_seqno is not None and pos >= msg.end_seqno:
                return
            if not msg.follow:
                return
            # Wait for a commit past what we sent (raises NOT_MY_PARTITION if it goes away).
            await self._engine.wait_for_seqno(msg.keyspace, msg.partition, pos, None)
            run, taken = await self._run(_open_and_take, self._engine, msg, pos, uuid, max_items)


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
