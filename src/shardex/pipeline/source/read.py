"""Reading change-stream ranges into Arrow: the part of the Spark source that runs in workers.

``read_ranges(client, keyspace, ranges)`` (``read_ranges_for(endpoint, ranges)`` with the
process-wide client) reads every record of each ``PartitionRange`` (start, end] from
whichever node owns the partition now and yields ``pyarrow.RecordBatch``es in the source's
schema. It runs in a Spark Python worker on a pickled ``InputPartition`` (so it
needs nothing but what the range and the endpoint carry), or on the driver for the
driver-side reader; there is no pyspark import here, so it is usable and testable without a
SparkSession.

Why the pieces are as they are:

* One client per worker process (``client_for``): connecting costs an authenticated TCP
  handshake plus two state requests; Spark reuses Python workers across tasks, so a cached
  client makes every later micro-batch pay only for the stream opens.
* Small ranges (at most ``small_range`` changes, 2,000 by default) are read with one
  ``ReadRanges`` per owner node (``source/ranges.py``): a stream costs about 1 ms of CPU on
  each side whatever it carries, which made a read of 10-100 changes per partition mostly
  per-stream cost. Larger ranges, where a stream's credit window overlaps the node's reads
  with the reader's decoding, and snapshot reads keep one stream each, opened concurrently
  on the client's event loop (bounded by ``concurrency``).
* Exactly (start, end], never skipping or renumbering: the reader checks that the seqnos of
  a (non-backfill) run are dense and end at ``end_seqno``, and that the branch uuid is the one
  the range was planned on. A stream cut by a migration (NOT_MY_PARTITION) or a dead owner
  resumes from the last seqno received after a topology refresh, within ``resume_timeout``.
* ROLLBACK keeps its code and ``details`` (partition, rollback_seqno) and adds a
  machine-readable tag to the message (``rollback_error``), because a worker's exception
  reaches the Spark driver as text only.
* Snapshot mode (initial builds): the change log from seqno 0 to T0, last version per docid,
  tombstones dropped, emitted in seqno order. Correct, and the only way over today's wire;
  a document-snapshot RPC would make it faster (see
  ``docs/decisions/0033-spark-batch-reads-and-snapshot.md``).
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from collections.abc import AsyncIterator, Iterator, Sequence
from typing import Any

import pyarrow as pa

from shardex.api.records import OP_DELETE, Change, SnapshotMarker
from shardex.client import Client
from shardex.client.routing import DataRouter, backoff
from shardex.client.streams import RemoteStream
from shardex.errors import ErrorCode, ShardexError
from shardex.pipeline.source.checks import (
    RESUMABLE,
    Chunk,
    branch_changed,
    history_ends_below,
    tagged_rollback,
)
from shardex.pipeline.source.ranges import read_small_ranges
from shardex.pipeline.source.types import (
    ARROW_SCHEMA,
    SCHEMA_DDL,
    Endpoint,
    NodeAccess,
    PartitionRange,
    RollbackInfo,
    parse_rollback,
    rollback_error,
)

__all__ = [
    "ARROW_SCHEMA",
    "SCHEMA_DDL",
    "Chunk",
    "Endpoint",
    "NodeAccess",
    "PartitionRange",
    "RollbackInfo",
    "chunk_groups",
    "client_for",
    "iter_chunks",
    "parse_rollback",
    "read_ranges",
    "rollback_error",
]

DEFAULT_CONCURRENCY = 16  # streams open at once per task
DEFAULT_MAX_ITEMS = 2000  # items per stream batch on the wire
DEFAULT_CREDIT = 4  # stream batches in flight per stream
DEFAULT_BATCH_ROWS = 16_384  # rows per RecordBatch handed to Spark
DEFAULT_RESUME_TIMEOUT = 30.0  # how long a cut stream keeps trying to resume
# Ranges of at most this many changes are read with ReadRanges (one request per owner node)
# rather than a stream each: measured in docs/decisions/0075-multi-range-change-reads.md.
DEFAULT_SMALL_RANGE = 2000

# --- clients ------------------------------------------------------------------------------------

_clients: dict[NodeAccess, Client] = {}
_clients_lock = threading.Lock()


def client_for(endpoint: Endpoint) -> Client:
    """The process-wide client for ``endpoint``'s nodes (created on first use). It
    reconnects and refreshes its topology by itself, so it lives as long as the worker
    process."""
    access = endpoint.access
    with _clients_lock:
        client = _clients.get(access)
        if client is None or client.rpc.closed:
            client = access.connect("shardex-spark-source")
            _clients[access] = client
        return client


def close_clients() -> None:
    with _clients_lock:
        clients = list(_clients.values())
        _clients.clear()
    for c in clients:
        with contextlib.suppress(Exception):
            c.close()


def partition_owners(client: Client, keyspace: str) -> dict[int, str]:
    """partition -> owner node name from the client's cached topology (no round trip once
    cached). Only a planning hint: readers follow the partition wherever it is."""
    _, topology = client.rpc.run(client.rpc.router.keyspace(keyspace))
    return dict(topology.assignment)


# --- reading ------------------------------------------------------------------------------------


_DONE = object()


async def _stream_range(
    router: DataRouter,
    keyspace: str,
    r: PartitionRange,
    *,
    max_items: int,
    resume_timeout: float,
) -> AsyncIterator[tuple[int, list[Change]]]:
    """(uuid, changes) runs of exactly (start, end] of one partition, resuming cut streams."""
    pos, cur_uuid = r.start_seqno, r.start_uuid
    backfill = False
    deadline: float | None = None
    attempt = 0
    while pos < r.end_seqno:
        stream = RemoteStream(router, keyspace, r.partition)
        try:
            await stream.open(pos, cur_uuid, r.end_seqno, False, DEFAULT_CREDIT, max_items)
            while True:
                items = await stream.next_batch()
                if items is None:
                    break
                changes: list[Change] = []
                for item in items:
                    if isinstance(item, SnapshotMarker):
                        if item.uuid != r.end_uuid and r.end_uuid != 0:
                            raise branch_changed(keyspace, r, item.uuid)
                        cur_uuid, backfill = item.uuid, item.backfill
                        continue
                    if not backfill and item.seqno != pos + 1:
                        raise ShardexError(
                            f"partition {r.partition} of {keyspace!r}: stream jumped from "
                            f"seqno {pos} to {item.seqno} (records would be skipped)",
                            code=ErrorCode.INTERNAL,
                            details={"partition": r.partition, "pos": pos, "got": item.seqno},
                        )
                    pos = item.seqno
                    changes.append(item)
                if changes:
                    yield cur_uuid, changes
            if backfill:
                pos = r.end_seqno  # a backfill run is complete at its end by construction
            break
        except ShardexError as exc:
            if exc.code is ErrorCode.ROLLBACK:
                raise tagged_rollback(keyspace, r, exc) from None
            if exc.code is ErrorCode.BAD_REQUEST:
                exc.details.setdefault("partition", r.partition)
                raise
            if exc.code not in RESUMABLE or backfill:
                raise  # a cut backfill cannot resume: its seqnos are not a log position
            now = time.monotonic()
            deadline = now + resume_timeout if deadline is None else deadline
            if now >= deadline:
                exc.details.update(partition=r.partition, resumed_from=pos)
                raise
            await asyncio.sleep(backoff(min(attempt, 5)))
            attempt += 1
            with contextlib.suppress(ShardexError):
                await router.refresh()
        finally:
            await stream.cancel()
    if pos != r.end_seqno:
        raise history_ends_below(keyspace, r, pos)


async def _produce(
    router: DataRouter,
    keyspace: str,
    r: PartitionRange,
    out: _Outbox,
    sem: asyncio.Semaphore,
    *,
    snapshot: bool,
    max_items: int,
    resume_timeout: float,
) -> None:
    try:
        async with sem:
            runs = _stream_range(
                router, keyspace, r, max_items=max_items, resume_timeout=resume_timeout
            )
            if not snapshot:
                async for uuid, changes in runs:
                    await out.put(Chunk(r.partition, uuid, changes))
            else:
                await out.put(await _snapshot_of(keyspace, r, runs))
        out.finish(None)
    except asyncio.CancelledError:
        raise
    except BaseException as exc:
        out.finish(exc)


class _Outbox:
    """Chunks from many producers to one consumer. Data puts wait for a free slot (bounded
    memory); completions and errors never wait, so the consumer always learns of them."""

    def __init__(self, slots: int) -> None:
        self._queue: asyncio.Queue[Any] = asyncio.Queue()
        self._slots = asyncio.Semaphore(slots)

    async def put(self, chunk: Chunk) -> None:
        await self._slots.acquire()
        self._queue.put_nowait(chunk)

    def finish(self, error: BaseException | None) -> None:
        self._queue.put_nowait(_DONE if error is None else error)

    async def get(self) -> Any:
        item = await self._queue.get()
        if isinstance(item, Chunk):
            self._slots.release()
        return item


async def _snapshot_of(
    keyspace: str, r: PartitionRange, runs: AsyncIterator[tuple[int, list[Change]]]
) -> Chunk:
    latest: dict[str, Change] = {}
    try:
        async for _uuid, changes in runs:  # the uuid is checked to be r.end_uuid
            for ch in changes:
                latest[ch.docid] = ch  # seqno order: the last one is the version at T0
    except ShardexError as exc:
        if exc.code is ErrorCode.BAD_REQUEST and "purge_seqno" in exc.details:
            raise ShardexError(
                f"partition {r.partition} of {keyspace!r} has purged its history below "
                f"seqno {exc.details['purge_seqno']} and moved past the snapshot's seqno "
                f"{r.end_seqno}: the documents as of that timestamp cannot be read any more",
                code=ErrorCode.SNAPSHOT_TOO_OLD,
                details={**exc.details, "hint": "take a new snapshot timestamp and retry"},
            ) from None
        raise
    live = sorted((c for c in latest.values() if c.op != OP_DELETE), key=lambda c: c.seqno)
    return Chunk(r.partition, r.end_uuid, live)


async def _produce_small(
    router: DataRouter,
    keyspace: str,
    ranges: Sequence[PartitionRange],
    out: _Outbox,
    *,
    max_items: int,
    resume_timeout: float,
) -> None:
    """``ranges`` read with one ``ReadRanges`` per owner (``ranges.py``); a backfill it
    meets is streamed."""

    async def stream_range(r: PartitionRange) -> None:
        runs = _stream_range(
            router, keyspace, r, max_items=max_items, resume_timeout=resume_timeout
        )
        async for uuid, changes in runs:
            await out.put(Chunk(r.partition, uuid, changes))

    try:
        await read_small_ranges(
            router, keyspace, ranges, out.put, stream_range, resume_timeout=resume_timeout
        )
        out.finish(None)
    except asyncio.CancelledError:
        raise
    except BaseException as exc:
        out.finish(exc)


async def iter_chunks(
    client: Client,
    keyspace: str,
    ranges: Sequence[PartitionRange],
    *,
    snapshot: bool,
    concurrency: int,
    max_items: int,
    resume_timeout: float,
    small_range: int = DEFAULT_SMALL_RANGE,
) -> AsyncIterator[Chunk]:
    """Every change of ``ranges`` as ``Chunk``s (in seqno order within a partition).
    Outside snapshot mode, ranges of at most ``small_range`` changes are read with one
    ``ReadRanges`` per owner node (one task for all of them), the others with a stream each
    (``concurrency`` at once); ``small_range=0`` streams every range."""
    router = client.rpc.router
    out = _Outbox(2 * concurrency)
    sem = asyncio.Semaphore(concurrency)
    kw: dict[str, Any] = {
        "snapshot": snapshot,
        "max_items": max_items,
        "resume_timeout": resume_timeout,
    }
    todo = [r for r in ranges if r.end_seqno > r.start_seqno]
    small = [] if snapshot else [r for r in todo if r.count <= small_range]
    tasks = [
        asyncio.create_task(_produce(router, keyspace, r, out, sem, **kw))
        for r in todo
        if snapshot or r.count > small_range
    ]
    if small:
        tasks.append(
            asyncio.create_task(
                _produce_small(
                    router,
                    keyspace,
                    small,
                    out,
                    max_items=max_items,
                    resume_timeout=resume_timeout,
                )
            )
        )
    pending = len(tasks)
    try:
        while pending:
            item = await out.get()
            if item is _DONE:
                pending -= 1
            elif isinstance(item, BaseException):
                raise item
            else:
                yield item
    finally:
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


def to_record_batch(chunks: Sequence[Chunk]) -> pa.RecordBatch:
    """Columns straight from the change structs: no per-row dicts or tuples."""
    docid: list[str] = []
    part: list[int] = []
    seqno: list[int] = []
    uuid: list[int] = []
    cas: list[int] = []
    deleted: list[bool] = []
    body: list[bytes | None] = []
    for ch in chunks:
        n = len(ch.changes)
        part.extend([ch.partition] * n)
        uuid.extend([ch.uuid] * n)
        for c in ch.changes:
            docid.append(c.docid)
            seqno.append(c.seqno)
            cas.append(c.cas)
            deleted.append(c.op == OP_DELETE)
            body.append(c.body)
    return pa.RecordBatch.from_arrays(
        [
            pa.array(docid, pa.string()),
            pa.array(part, pa.int32()),
            pa.array(seqno, pa.int64()),
            pa.array(uuid, pa.int64()),
            pa.array(cas, pa.int64()),
            pa.array(deleted, pa.bool_()),
            pa.array(body, pa.binary()),
        ],
        schema=ARROW_SCHEMA,
    )


def chunks_to_batches(
    chunks: Sequence[Chunk], batch_rows: int = DEFAULT_BATCH_ROWS
) -> list[pa.RecordBatch]:
    """Chunks as RecordBatches of about ``batch_rows`` rows (never splitting a chunk)."""
    out: list[pa.RecordBatch] = []
    group: list[Chunk] = []
    rows = 0
    for ch in chunks:
        group.append(ch)
        rows += len(ch.changes)
        if rows >= batch_rows:
            out.append(to_record_batch(group))
            group, rows = [], 0
    if group:
        out.append(to_record_batch(group))
    return out


def read_ranges(
    client: Client,
    keyspace: str,
    ranges: Sequence[PartitionRange],
    *,
    snapshot: bool = False,
    concurrency: int = DEFAULT_CONCURRENCY,
    max_items: int = DEFAULT_MAX_ITEMS,
    batch_rows: int = DEFAULT_BATCH_ROWS,
    resume_timeout: float = DEFAULT_RESUME_TIMEOUT,
    small_range: int = DEFAULT_SMALL_RANGE,
) -> Iterator[pa.RecordBatch]:
    """RecordBatches (about ``batch_rows`` rows each) of every record in ``ranges``; within
    a partition in seqno order. Closing the iterator early cancels the open streams."""
    groups = chunk_groups(
        client,
        keyspace,
        ranges,
        batch_rows,
        snapshot=snapshot,
        concurrency=concurrency,
        max_items=max_items,
        resume_timeout=resume_timeout,
        small_range=small_range,
    )
    for group in groups:
        yield to_record_batch(group)


def chunk_groups(
    client: Client,
    keyspace: str,
    ranges: Sequence[PartitionRange],
    group_rows: int,
    *,
    snapshot: bool = False,
    concurrency: int = DEFAULT_CONCURRENCY,
    max_items: int = DEFAULT_MAX_ITEMS,
    resume_timeout: float = DEFAULT_RESUME_TIMEOUT,
    small_range: int = DEFAULT_SMALL_RANGE,
) -> Iterator[list[Chunk]]:
    """``iter_chunks`` on the client's loop, gathered into lists of at least ``group_rows``
    changes (the last may hold fewer; none is empty). Closing early cancels the reads."""
    agen = iter_chunks(
        client,
        keyspace,
        ranges,
        snapshot=snapshot,
        concurrency=concurrency,
        max_items=max_items,
        resume_timeout=resume_timeout,
        small_range=small_range,
    )
    finished = False
    try:
        while not finished:
            # A whole group per trip to the client's loop, not a chunk per trip: a read of
            # many small ranges arrives as dozens of chunks at once (one per partition).
            group, rows, finished = client.rpc.run(_next_group(agen, group_rows))
            if rows:
                yield group
    finally:
        if not finished:
            with contextlib.suppress(Exception):
                client.rpc.run(agen.aclose())


async def _next_group(agen: AsyncIterator[Chunk], group_rows: int) -> tuple[list[Chunk], int, bool]:
    """Chunks until they hold ``group_rows`` changes or the reads end: (chunks, changes,
    the reads ended)."""
    group: list[Chunk] = []
    rows = 0
    while rows < group_rows:
        try:
            chunk = await agen.__anext__()
        except StopAsyncIteration:
            return group, rows, True
        group.append(chunk)
        rows += len(chunk.changes)
    return group, rows, False


def read_ranges_for(
    endpoint: Endpoint, ranges: Sequence[PartitionRange], **kw: Any
) -> Iterator[pa.RecordBatch]:
    """``read_ranges`` with the process-wide client of ``endpoint`` (what Spark tasks call)."""
    return read_ranges(client_for(endpoint), endpoint.keyspace, ranges, **kw)
