"""Push-mode reading for the driver-side stream reader: one live change stream per partition.

The partitioned reader pays, per micro-batch, one high-seqno round trip in ``latestOffset``
and one stream open per partition with records (about 1 ms each on the 2-core machine: 60 ms
for a 100-row batch spread over 60 partitions), and Spark polls ``latestOffset`` 40-60 times
a second when idle. Here the driver instead keeps a ``follow`` stream open on every partition
(the data node pushes each change as it commits, with credit flow control), so:

* the latest offset is simply how far the streams have delivered: no round trip at all;
* a micro-batch's records are already in memory when Spark asks for them.

Exactly-once bookkeeping: ``handed`` is the position up to which records were given to Spark;
Spark's next ``read(start)`` must start there. Any other start (a restarted query, a re-planned
batch) restarts that partition's stream from ``start``, dropping what was buffered, so a
position is never skipped or doubled. Seqnos are checked to be dense, as in ``read.py``.
A cut stream (migration, dead owner) resumes from the last seqno received. A ROLLBACK is kept
and raised from the next ``take``. A backfill (a stream from 0 on a partition whose early
history was purged) is refused: its positions are not offsets until its end, so start such a
keyspace from a snapshot's timestamp instead.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from dataclasses import dataclass, field

from shardex.api.records import Change, SnapshotMarker
from shardex.client import Client
from shardex.client.routing import backoff
from shardex.client.streams import RemoteStream
from shardex.core.timestamp import SeqnoEntry, Timestamp
from shardex.errors import ErrorCode, ShardexError
from shardex.pipeline.source.plan import limit_offsets
from shardex.pipeline.source.read import (
    DEFAULT_MAX_ITEMS,
    DEFAULT_RESUME_TIMEOUT,
    RESUMABLE,
    Chunk,
    rollback_error,
)

FOLLOW_CREDIT = 8  # stream batches buffered per partition before the node waits
# A burst of writes over many partitions reaches the driver as many stream batches within a
# millisecond or two; taking the first of them alone would split it over two micro-batches
# (doubling its latency). So a take waits until the streams have been quiet this long...
DEFAULT_QUIET = 0.003
# ...but never longer than this after the first new record was seen.
DEFAULT_LINGER = 0.025


@dataclass
class _Partition:
    number: int
    handed: SeqnoEntry  # given to Spark up to here
    received: SeqnoEntry  # delivered by the stream up to here
    buffer: list[tuple[int, Change]] = field(default_factory=list)  # (uuid, change)
    task: asyncio.Task[None] | None = None
    generation: int = 0  # bumped on restart: a stale task's late items are ignored


class FollowSet:
    """Live streams of every partition of a keyspace, read on the client's event loop and
    taken from synchronously by the driver reader."""

    def __init__(
        self,
        client: Client,
        keyspace: str,
        *,
        max_items: int = DEFAULT_MAX_ITEMS,
        resume_timeout: float = DEFAULT_RESUME_TIMEOUT,
    ) -> None:
        self._client = client
        self.keyspace = keyspace
        self._max_items = max_items
        self._resume_timeout = resume_timeout
        self._lock = threading.Lock()
        self._parts: dict[int, _Partition] = {}
        self._error: ShardexError | None = None
        self._dirty = False  # something was delivered since the last take (the idle fast path)
        self._last_delivery = 0.0  # monotonic time of the latest stream batch
        self.restarts = 0  # streams (re)opened from a given position (tests and stats)
        self.resumes = 0  # streams re-opened after a cut (migration, dead owner)

    # --- driver side (sync) ---------------------------------------------------------------------

    def sync_to(self, start: Timestamp) -> None:
        """Make every partition's next record the one after ``start``."""
        restart: list[_Partition] = []
        with self._lock:
            for p, entry in start.items():
                part = self._parts.get(p)
                if part is None:
                    part = self._parts[p] = _Partition(p, entry, entry)
                    restart.append(part)
                elif part.handed != entry:
                    part.handed = part.received = entry
                    part.buffer.clear()
                    part.generation += 1
                    restart.append(part)
        for part in restart:
            self.restarts += 1
            self._client.rpc.run(self._start(part))

    def idle(self) -> bool:
        """Nothing new since the last ``take`` (and no error to raise): the caller may skip
        parsing its offsets at all."""
        return not self._dirty and self._error is None

    def settle(self, quiet: float = DEFAULT_QUIET, linger: float = DEFAULT_LINGER) -> None:
        """Wait (briefly) until no stream has delivered for ``quiet`` seconds, at most
        ``linger`` seconds: lets a burst that is still arriving join the same batch."""
        give_up = time.monotonic() + linger
        while True:
            now = time.monotonic()
            wait = self._last_delivery + quiet - now
            if wait <= 0 or now >= give_up:
                return
            time.sleep(min(wait, give_up - now))

    def take(self, max_rows: int | None = None) -> tuple[list[Chunk], Timestamp]:
        """Buffered records after the handed positions (at most ``max_rows``, shared
        fairly), and the new handed positions. Raises a stream's stored error first."""
        with self._lock:
            if self._error is not None:
                raise self._error
            if not self._dirty:
                # Idle: Spark polls this dozens of times a second; answer without work.
                return [], Timestamp({p: x.handed for p, x in self._parts.items()})
            self._dirty = False
            handed = Timestamp({p: x.handed for p, x in self._parts.items()})
            received = Timestamp({p: x.received for p, x in self._parts.items()})
            end = received if max_rows is None else limit_offsets(handed, received, max_rows)
            chunks: list[Chunk] = []
            for p, part in self._parts.items():
                stop = end[p].seqno
                if stop == part.handed.seqno:
                    part.handed = end[p]  # a uuid-only move
                    continue
                n = 0
                for uuid, ch in part.buffer:
                    if ch.seqno > stop:
                        break
                    if chunks and chunks[-1].partition == p and chunks[-1].uuid == uuid:
                        chunks[-1].changes.append(ch)
                    else:
                        chunks.append(Chunk(p, uuid, [ch]))
                    n += 1
                del part.buffer[:n]
                part.handed = end[p]
                if part.buffer:
                    self._dirty = True  # cut by max_rows: more to take
            return chunks, end

    def close(self) -> None:
        async def cancel_all() -> None:
            tasks = [x.task for x in self._parts.values() if x.task is not None]
            for t in tasks:
                t.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)

        with contextlib.suppress(Exception):
            self._client.rpc.run(cancel_all())

    # --- event-loop side --------------------------------------------------------------------------

    async def _start(self, part: _Partition) -> None:
        if part.task is not None:
            part.task.cancel()
            await asyncio.gather(part.task, return_exceptions=True)
        gen = part.generation
        part.task = asyncio.get_running_loop().create_task(
            self._follow(part, gen), name=f"follow {self.keyspace}/{part.number}"
        )

    async def _follow(self, part: _Partition, gen: int) -> None:
        router = self._client.rpc.router
        deadline: float | None = None
        attempt = 0
        while True:
            with self._lock:
                if part.generation != gen:
                    return
                pos = part.received
            stream = RemoteStream(router, self.keyspace, part.number)
            try:
                await stream.open(pos.seqno, pos.uuid, None, True, FOLLOW_CREDIT, self._max_items)
                while (items := await stream.next_batch()) is not None:
                    self._deliver(part, gen, items)
                    deadline, attempt = None, 0
            except asyncio.CancelledError:
                raise
            except ShardexError as exc:
                if exc.code not in RESUMABLE:
                    self._fail(part, gen, exc)
                    return
                now = time.monotonic()
                deadline = now + self._resume_timeout if deadline is None else deadline
                if now >= deadline:
                    self._fail(part, gen, exc)
                    return
            finally:
                await stream.cancel()
            # Ended or cut (a follow stream ends only on error): resume from what we have.
            await asyncio.sleep(backoff(min(attempt, 5)))
            attempt += 1
            self.resumes += 1
            with contextlib.suppress(ShardexError):
                await router.refresh()

    def _deliver(self, part: _Partition, gen: int, items: list[SnapshotMarker | Change]) -> None:
        with self._lock:
            if part.generation != gen:
                return
            seqno, uuid = part.received.seqno, part.received.uuid
            for item in items:
                if isinstance(item, SnapshotMarker):
                    if item.backfill:
                        raise ShardexError(
                            f"partition {part.number} of {self.keyspace!r} has purged the "
                            "history before its first retained seqno: a stream from 0 would "
                            "be a backfill, which the follow reader does not take",
                            code=ErrorCode.BAD_REQUEST,
                            details={
                                "partition": part.number,
                                "hint": "start from a snapshot timestamp",
                            },
                        )
                    uuid = item.uuid
                    continue
                if item.seqno != seqno + 1:
                    raise ShardexError(
                        f"partition {part.number} of {self.keyspace!r}: stream jumped from "
                        f"seqno {seqno} to {item.seqno}",
                        code=ErrorCode.INTERNAL,
                        details={"partition": part.number, "pos": seqno, "got": item.seqno},
                    )
                seqno = item.seqno
                part.buffer.append((uuid, item))
            part.received = SeqnoEntry(seqno, uuid)
            self._dirty = True
            self._last_delivery = time.monotonic()

    def _fail(self, part: _Partition, gen: int, exc: ShardexError) -> None:
        if exc.code is ErrorCode.ROLLBACK:
            rb = int(exc.details.get("rollback_seqno", 0))
            exc = rollback_error(
                self.keyspace,
                part.number,
                rb,
                f"partition {part.number} of {self.keyspace!r} cannot continue from seqno "
                f"{part.received.seqno} on uuid {part.received.uuid}: roll back to {rb}",
                uuid=exc.details.get("uuid"),
            )
        with self._lock:
            if self._error is None and part.generation == gen:
                self._error = exc
