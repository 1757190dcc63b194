"""The indexer's side of a scan (scan-request flow steps 11-13): find the slices, wait, read,
stream.

``ScanSlices`` names local slices of one index. The handler checks them (INDEX_NOT_FOUND:
not here; INDEX_IN_ROLLBACK: a slice needs a rebuild; INDEX_NOT_READY: loading or never
built), picks what to read and answers ``SlicesOpened`` with it:

* ``snapshot_ts`` (scan or query stability with a TS chosen by the coordinator): the
  snapshot labelled with it, on every slice (SNAPSHOT_TOO_OLD once released);
* ``stability`` without a TS: wait until the slices share a snapshot covering ``wait_for``
  (``scan_wait.common_snapshot_ts``) and read it;
* otherwise the tips, after waiting likewise when ``wait_for`` is set (consistency without
  stability). The wait ends in SCAN_TIMEOUT naming, per data partition, wanted vs held.

A request_plus ``ScanSlices`` may name data partitions (``seqnos_of``) whose high seqnos this
node's data service serves: they are read first, on arrival, and returned in the reply.

Iterators are created before the reply (a scan pins its snapshots when it is asked for, so
a later stabilise releasing them cannot fail it): the local slices merged in entry order
for ordered scans, one after the other otherwise, cut at ``limit``, a storage chunk at a
time (``scan_blocks``). The
reply carries the first block (at most ``INLINE_ROWS``), read on the event loop, and says
``done`` when that is all: a small scan costs one request and one reply, no stream and no
thread hand-off. Anything after it streams in blocks with credit flow control
(``shardex.api.scan_streams``), each read in a small thread pool of the scanner's own, so neither
the event loop nor the pipeline's I/O thread waits behind a large scan. Opening (and the
stability check) runs on the loop only when no slice lock is held - a stabilise holds one
through its fsync - and in the pool otherwise. ``open_local`` is the same for the scan
coordinator of this very node, without the loopback connection.

``WaitStability`` answers the TS the same wait finds (SQL's stable scans pin the oldest
answer of all nodes).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import functools
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, Final, TypeAlias, TypeVar

import msgspec

from shardex.api.scan import (
    NO_TS,
    ScanSlices,
    SlicesOpened,
    StabilityAt,
    WaitStability,
)
from shardex.api.scan_streams import OutStream, OutStreams
from shardex.api.spans import from_wire_spans
from shardex.core.timestamp import Timestamp
from shardex.errors import ErrorCode, ShardexError
from shardex.index.engine_host import EngineHost
from shardex.index.records import STATE_CREATED, STATE_LOADING, STATE_NEEDS_REBUILD
from shardex.index.scan_blocks import EntryBlocks, open_entries
from shardex.index.scan_wait import StabilityWatch, common_snapshot_ts, scan_timeout
from shardex.net import Connection, RpcServer

__all__ = ["IndexScanServer"]

T = TypeVar("T")

MAX_BLOCK_ROWS: Final = 10_000
MAX_WAIT: Final = 600.0
SCAN_THREADS: Final = 2
# Entries read on the event loop for the reply: a RocksDB iterator yields ~1M entries/s, so
# this bounds the loop's stall to about a millisecond while a 100-row scan needs no thread
# hand-off and no stream at all (measured: each hand-off cost 1-3 ms under load).
INLINE_ROWS: Final = 1000
INLINE_BYTES: Final = 256 * 1024

# An opened scan: (the reply, the entries after its first block or None at the end, the
# block size, the TS read).
Opened: TypeAlias = tuple[SlicesOpened, EntryBlocks | None, int, Timestamp | None]


class IndexScanServer:
    """Scan routes of one indexer node, over its index engine (``host``, the index
    service's). ``check_serving``: ``SliceMoves.check_serving``, which refuses a slice this
    node handed over."""

    def __init__(
        self,
        host: EngineHost,
        streams: OutStreams,
        *,
        check_serving: Callable[[str, int], None],
    ) -> None:
        self.host = host
        self._check_serving = check_serving
        self.streams = streams
        self.watch = StabilityWatch()
        self._executor: concurrent.futures.ThreadPoolExecutor | None = None
        # This node's data service's high seqnos (set by the node when it runs one):
        # ``ScanSlices.seqnos_of`` is answered from it, as its ``HighSeqnos`` handler.
        self.local_seqnos: Callable[[str, list[int]], dict[int, tuple[int, int]]] | None = None

    @property
    def node(self) -> str:
        return self.host.name

    def install(self, server: RpcServer) -> None:
        # In the receive callback: a scan that needs no wait is answered there, no task;
        # one that must wait is finished in a task (``on_scan``).
        server.router.route_inline(ScanSlices, self.on_scan)
        server.route(WaitStability, self.on_wait)
        self.host.listeners.append(self.watch.notify)

    async def close(self) -> None:
        executor, self._executor = self._executor, None
        if executor is not None:
            await asyncio.to_thread(executor.shutdown, True)

    async def _run_unlocked(self, slices: list[Any], fn: Callable[[], T]) -> T:
        """``fn()`` (which takes the locks of ``slices``) on the event loop when none of them
        is held elsewhere, so it cannot block; else in the scan pool (a stabilise may hold
        one through its fsync). Saves the thread hand-off of the common case."""
        ran, result = self._try_inline(slices, fn)
        if ran:
            return result  # type: ignore[return-value]
        return await self._run(fn)

    def _try_inline(self, slices: list[Any], fn: Callable[[], T]) -> tuple[bool, T | None]:
        """(True, ``fn()``) run on the event loop if no lock of ``slices`` is held elsewhere
        (the locks are re-entrant: ``fn`` takes them again), else (False, None)."""
        if self.host.inline_io:
            return True, fn()
        taken: list[Any] = []
        try:
            for s in slices:
                if not s.lock.acquire(blocking=False):
                    return False, None
                taken.append(s)
            return True, fn()
        finally:
            for s in reversed(taken):
                s.lock.release()

    async def _run(self, fn: Callable[..., T], *args: Any) -> T:
        if self.host.inline_io:
            return fn(*args)
        if self._executor is None:
            self._executor = concurrent.futures.ThreadPoolExecutor(
                SCAN_THREADS, thread_name_prefix=f"index-scan-{self.node}"
            )
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._executor, functools.partial(fn, *args))

    # --- slices and their state ------------------------------------------------------------

    def _slices(self, index_id: str, partitions: list[int]) -> list[Any]:
        engine: Any = self.host.engine
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
            self._check_serving(index_id, p)  # moved away: STALE_TOPOLOGY
            out.append(s)
        return out

    def _covering_now(self, slices: list[Any], wait_for: Timestamp | None) -> Timestamp | None:
        """The slices' newest common snapshot TS if it covers ``wait_for`` and no slice lock
        is held elsewhere (checked on the loop), else None (``stable_ts`` waits)."""

        def check() -> Timestamp | None:
            ts = common_snapshot_ts(slices)
            return ts if ts is not None and (wait_for is None or ts.covers(wait_for)) else None

        return self._try_inline(slices, check)[1]

    async def stable_ts(
        self, index_id: str, partitions: list[int], wait_for: Timestamp | None, timeout: float
    ) -> Timestamp:
        """Wait until the slices share a snapshot covering ``wait_for``; return its TS."""
        last: list[Timestamp | None] = [None]

        def check(slices: list[Any] | None = None) -> Timestamp | None:
            if slices is None:
                slices = self._slices(index_id, partitions)  # raises on drop / rollback
            ts = common_snapshot_ts(slices)
            last[0] = ts
            if ts is not None and (wait_for is None or ts.covers(wait_for)):
                return ts
            return None

        # Most scans find the TS already there (the pipeline keeps up): one check on the
        # loop when no slice lock is held, without the watch's event and bounded task.
        slices = self._slices(index_id, partitions)
        _, found = self._try_inline(slices, lambda: check(slices))
        if found is not None:
            return found

        async def check_off_loop() -> Timestamp | None:
            return await self._run_unlocked(self._slices(index_id, partitions), check)

        timeout = min(max(timeout, 0.0), MAX_WAIT)
        ts = await self.watch.wait(index_id, check_off_loop, timeout)
        if ts is None:
            raise scan_timeout(index_id, self.node, last[0], wait_for or Timestamp(), timeout)
        result: Timestamp = ts
        return result

    # --- handlers ----------------------------------------------------------------------------

    async def on_wait(self, msg: WaitStability, conn: Connection) -> StabilityAt:
        seqnos = self.high_seqnos_here(msg.seqnos_keyspace, msg.seqnos_of)  # read on arrival
        wait_for = None if msg.wait_for is None else Timestamp.from_wire(msg.wait_for)
        ts = await self.stable_ts(msg.index_id, msg.partitions, wait_for, msg.timeout)
        return StabilityAt(node=self.node, ts=dict(ts.to_wire()), high_seqnos=seqnos)

    def on_scan(self, msg: ScanSlices, conn: Connection) -> SlicesOpened | Awaitable[SlicesOpened]:
        """``ScanSlices`` in the receive callback (``Router.route_inline``): answered at once
        when its slices open without waiting - the TS it reads is there and no slice lock is
        held elsewhere, the common case - else an awaitable that waits (the connection runs
        it in a task). Either way the same reply, stream and errors."""
        self.streams.check_new(conn, msg.scan_id)
        opened = self._open_now(msg)
        if opened is None:
            return self._scan_waiting(msg, conn)
        return self._started(msg, conn, opened)

    async def _scan_waiting(self, msg: ScanSlices, conn: Connection) -> SlicesOpened:
        return self._started(msg, conn, await self._open(msg))

    def _started(self, msg: ScanSlices, conn: Connection, opened: Opened) -> SlicesOpened:
        """The reply of an opened scan; the entries after its first block stream (credit
        flow control) from a task started here, before the reply is written."""
        reply, rest, block_rows, _ = opened
        if rest is not None:
            left: EntryBlocks = rest

            async def produce(stream: OutStream) -> None:
                async for block in self._blocks(left, block_rows):
                    await stream.send(block)

            self.streams.start(conn, msg.scan_id, msg.credit, produce)
        return reply

    async def open_local(
        self, msg: ScanSlices
    ) -> tuple[SlicesOpened, AsyncIterator[list[bytes]] | None, Timestamp | None]:
        """``ScanSlices`` from this node's own scan coordinator, without the loopback
        connection: the reply (without ``ts`` in wire form), the blocks after its entries
        (None: ``done``), pulled by the caller (its pace is the flow control), and the TS
        read (None: the tips) as the object the slices hold, not a copy."""
        opened, rest, block_rows, read_ts = await self._open(msg, wire_ts=False)
        return opened, None if rest is None else self._blocks(rest, block_rows), read_ts

    def _open_now(self, msg: ScanSlices, *, wire_ts: bool = True) -> Opened | None:
        """``_open`` when nothing has to wait: the TS to read is there (or none is wanted)
        and no slice lock is held elsewhere; None otherwise (``_open`` then starts over,
        reading the high seqnos again: still after the scan arrived)."""
        seqnos, wait_for, slices = self._arrival(msg)
        known, read_ts = self._ts_now(msg, slices, wait_for)
        if not known:
            return None
        ran, entries = self._try_inline(slices, self._opener(msg, slices, read_ts))
        if not ran:
            return None
        assert entries is not None
        return self._first_block(msg, entries, read_ts, seqnos, wire_ts)

    async def _open(self, msg: ScanSlices, *, wire_ts: bool = True) -> Opened:
        """Wait, pick the snapshot, open the slices and read the first block: (the reply,
        the entries after it or None at the end, the block size, the TS read)."""
        seqnos, wait_for, slices = self._arrival(msg)
        known, read_ts = self._ts_now(msg, slices, wait_for)
        if not known:
            # A wait looks the slices up again after it (a drop or rollback meanwhile).
            stable = await self.stable_ts(msg.index_id, msg.partitions, wait_for, msg.timeout)
            slices = self._slices(msg.index_id, msg.partitions)
            read_ts = stable if msg.stability else None
        # SNAPSHOT_TOO_OLD etc. answer the request. Opening only creates iterators; the first
        # block is read on the loop too (bounded), and a scan that ends within it is answered
        # by the reply alone: no stream, no thread hand-off.
        entries = await self._run_unlocked(slices, self._opener(msg, slices, read_ts))
        return self._first_block(msg, entries, read_ts, seqnos, wire_ts)

    def _ts_now(
        self, msg: ScanSlices, slices: list[Any], wait_for: Timestamp | None
    ) -> tuple[bool, Timestamp | None]:
        """(True, the TS to read - None: the tips) when it is known without waiting, else
        (False, None): the slices' snapshots do not cover ``wait_for`` yet, or a slice lock
        is held elsewhere."""
        if msg.snapshot_ts is not None:
            return True, Timestamp.from_wire(msg.snapshot_ts)
        if not msg.stability and wait_for is None:
            return True, None
        # The common case (the pipeline keeps up) is answered by the slices just looked up.
        stable = self._covering_now(slices, wait_for)
        if stable is None:
            return False, None
        return True, stable if msg.stability else None

    def _arrival(
        self, msg: ScanSlices
    ) -> tuple[dict[int, tuple[int, int]] | None, Timestamp | None, list[Any]]:
        """What a ``ScanSlices`` reads as it arrives: the high seqnos asked for, the TS to
        wait for, the slices (checked)."""
        # Read before anything else: the request arrived after the scan did at its
        # coordinator, so these cover every write acknowledged before the scan (scan-request
        # flow step 9).
        seqnos = self.high_seqnos_here(msg.seqnos_keyspace, msg.seqnos_of)
        wait_for = None if msg.wait_for is None else Timestamp.from_wire(msg.wait_for)
        if msg.limit is not None and msg.limit < 0:
            raise ShardexError(
                f"limit must be >= 0, got {msg.limit}", code=ErrorCode.BAD_REQUEST, details={}
            )
        return seqnos, wait_for, self._slices(msg.index_id, msg.partitions)

    def _opener(
        self, msg: ScanSlices, slices: list[Any], read_ts: Timestamp | None
    ) -> Callable[[], EntryBlocks]:
        spans = from_wire_spans(msg.spans)
        return functools.partial(open_entries, slices, spans, read_ts, msg.limit, msg.ordered)

    def _first_block(
        self,
        msg: ScanSlices,
        entries: EntryBlocks,
        read_ts: Timestamp | None,
        seqnos: dict[int, tuple[int, int]] | None,
        wire_ts: bool,
    ) -> Opened:
        block_rows = max(1, min(msg.block_rows, MAX_BLOCK_ROWS))
        first = entries.take(min(block_rows, INLINE_ROWS), INLINE_BYTES)
        rest = None if entries.exhausted() else entries
        # The snapshot's TS as its cached encoding (``Timestamp.packed``): the ring holds
        # one object per snapshot, so it is encoded once per stabilise, not per scan.
        wire = NO_TS if read_ts is None or not wire_ts else msgspec.Raw(read_ts.packed())
        opened = SlicesOpened(
            scan_id=msg.scan_id,
            node=self.node,
            ts=wire,
            entries=first,
            done=rest is None,
            high_seqnos=seqnos,
        )
        return opened, rest, block_rows, read_ts

    def high_seqnos_here(
        self, keyspace: str, partitions: list[int]
    ) -> dict[int, tuple[int, int]] | None:
        """The high seqnos of those of ``partitions`` this node's data service serves (None:
        none asked, no data service here, or it failed: the asker asks the owners itself)."""
        if not partitions or self.local_seqnos is None:
            return None
        try:
            return self.local_seqnos(keyspace, partitions)
        except ShardexError:  # e.g. the keyspace is not open here yet
            return None

    async def _blocks(self, entries: EntryBlocks, block_rows: int) -> AsyncIterator[list[bytes]]:
        """Blocks of ``entries``, each read in the scan pool (a block may take milliseconds)."""
        while True:
            block = await self._run(entries.take, block_rows)
            if not block:
                return
            yield block

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
        chunk_rows: int | None = None,
    ) -> AsyncIterator[list[bytes]]:
        """This node's slices of ``index_id`` read in-process (SQL leaf fragments): blocks
        of raw entries at ``snapshot_ts`` (None: the tips), merged in entry order when
        ``ordered``; each slice reads storage ``chunk_rows`` entries at a time (None: its
        default, 512), for a leaf that expects to stop after about that many. Errors
        (SNAPSHOT_TOO_OLD, rollback) are raised before the first block."""

        # As ``_open``: iterators opened on the loop unless a slice's lock is held elsewhere,
        # and the first block read there too (bounded), so a point query's leaf reads its
        # entry without a thread hand-off; later blocks are read in the scan pool.
        slices = self._slices(index_id, partitions)
        entries = await self._run_unlocked(
            slices,
            functools.partial(open_entries, slices, spans, snapshot_ts, limit, ordered, chunk_rows),
        )
        first = entries.take(min(block_rows, INLINE_ROWS), INLINE_BYTES)
        if first:
            yield first
        if not entries.exhausted():
            async for block in self._blocks(entries, block_rows):
                yield block

    def read_local_now(
        self,
        index_id: str,
        partitions: list[int],
        spans: list[Any] | None,
        snapshot_ts: Timestamp | None,
        most: int,
    ) -> list[bytes] | None:
        """Every raw entry ``read_local`` would yield (unordered), read in this call on the
        loop, when there are at most ``most`` (a point query's few) and no slice lock is
        held elsewhere; None otherwise, ``read_local`` then reads them. The storage read
        stops after ``most + 1`` entries. Errors as ``read_local``'s."""
        slices = self._slices(index_id, partitions)
        limit = most + 1
        opened, entries = self._try_inline(
            slices,
            functools.partial(open_entries, slices, spans, snapshot_ts, limit, False, limit),
        )
        if not opened or entries is None:
            return None
        block = entries.take(limit, INLINE_BYTES)
        if len(block) > most or not entries.exhausted():
            return None
        return block


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
