"""An index partition moving between indexers, the indexers' side (``IndexService.slice_moves``).

Target T (the coordinator master drives; ``manager/index_rebalance.py``):

1. ``PrepareIncomingSlice``: create the slice and put it in ``loading`` with an empty T0, so
   every key version the pipeline delivers to it is queued and none applied (a stabilise
   reports it, the timekeeper does not count it);
2. the master commits ``routing``: the pipeline routes the partition to S and T; the first
   stabilise round that names this slice as routed (``StabiliseSlices.moving``) proves that
   every key version above that round's TS E1 reaches T (``note_routed``);
3. ``CopySliceIn``: pull S's slice in chunks (``ReadSliceCopy``) from one snapshot taken at
   S's applied TS T1, which must cover E1, and load it like an initial build's load session
   (``load_chunk`` / ``load_finish`` at T1): queued versions <= T1 are dropped, the ones
   above stay queued and are applied by the next stabilise;
4. ``IndexPartitionSwitched`` (after the master committed the new index topology): T's
   paginated scans learn the partition arrived.

The master re-sends ``IndexPartitionSwitched`` until each end acknowledges (or is declared
down); both ends take it idempotently. An end that still missed it (the master failed over,
or it restarted) learns the switch from the committed state at its next reconciliation
(``switched_in_state``: the source from a held slice an earlier index topology gave to it and
the latest gives to another node, the target from its copy's move being ``done``), within a
reconcile interval rather than the orphan grace.

Source S: serves ``ReadSliceCopy`` from a snapshot of the slice's back index (each live back
row names its entry, so the entries are rebuilt from it: half the bytes); on
``IndexPartitionSwitched`` it stops opening scans on the slice (STALE_TOPOLOGY, retryable:
the scan coordinator re-reads the topology), tells its paginated scans the partition left,
and drops the slice after the grace period (scans already open finish on their snapshots)
once no snapshot lease holds it: a pinned paginated scan reads its leased snapshot here to
its end (``scan/elastic_adapters_index.py``), as the new owner's copy starts at T1.

Why T is exact at every stabilise after the load: its storage is S's state at T1 (S was
exact at its applied TS), every key version with seqno above E1 <= T1 was delivered to T
(routed to both since before E1's batch started), and the enqueue floor T1 drops the rest.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
import uuid
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any, Protocol

from shardex.api.slice_copy import (
    AbortIncomingSlice,
    CopySliceIn,
    IncomingSliceReady,
    IndexPartitionSwitched,
    PrepareIncomingSlice,
    ReadSliceCopy,
    SliceCopied,
    SliceCopyChunk,
    SliceMoveDone,
)
from shardex.core.timestamp import Timestamp
from shardex.core.topology import Topology
from shardex.errors import ErrorCode, ShardexError
from shardex.index.engine_host import EngineHost
from shardex.index.keyversion import UPSERT, KeyVersion
from shardex.index.records import STATE_ACTIVE, STATE_LOADING, cf_names, decode_back
from shardex.meta.index_rebalance_state import DONE
from shardex.meta.state import StateContext
from shardex.net import Connection, ConnectionPool, RpcServer
from shardex.storage import StoreSnapshot

__all__ = ["SWITCH_DROP_GRACE", "ScanMigrations", "SliceMoves", "back_rows_to_key_versions"]

log = logging.getLogger(__name__)

CHUNK_TIMEOUT = 30.0
COPY_SESSION_IDLE = 120.0  # a source releases a copy snapshot nobody asked for this long
NOT_READY_RETRY_FOR = 30.0  # the source has not applied E1 yet: it will within a round
LEASE_RECHECK = 0.5  # after the last lease's expiry: a renewal may have moved it
# A switched source keeps its slice this long (in-flight scans finish on their snapshots);
# the master sends it in ``IndexPartitionSwitched.grace``.
SWITCH_DROP_GRACE = 10.0

SliceKey = tuple[str, int]


@dataclass
class _Incoming:
    migration_id: str
    routed: Timestamp | None = None  # E1: the first dual-routed stabilise seen here
    event: asyncio.Event = field(default_factory=asyncio.Event)


@dataclass
class _CopySession:
    ts: Timestamp
    snapshot: StoreSnapshot
    cf: str
    used: float


def back_rows_to_key_versions(
    index_id: str, partition: int, rows: list[tuple[bytes, bytes]]
) -> list[KeyVersion]:
    """The UPSERT key versions a load session takes, from copied back-index rows (docid ->
    data partition, seqno, entry); tombstones carry no entry and are not copied (the
    enqueue floor at T1 is what rejects older re-deliveries)."""
    out: list[KeyVersion] = []
    for key, value in rows:
        back = decode_back(value)
        if back.entry:
            out.append(
                (index_id, partition, UPSERT, back.entry, key.decode("utf-8"), back.partition,
                 back.seqno)
            )  # fmt: skip
    return out


class ScanMigrations(Protocol):
    """What index partition moves tell paginated scans (``scan.elastic_adapters_index``'s
    ``IndexScanMigrations``, built by the node and passed in: the indexer does not depend on
    the scan package)."""

    def partition_left(self, index_id: str, partition: int, to: str) -> None: ...

    def partition_arrived(self, index_id: str, partition: int) -> None: ...

    def topology_published(self, index_id: str, seq_num: int) -> None: ...


class SliceMoves:
    """Routes and memory of index-partition moves on one indexer node: the engine through
    ``host``, ``pool`` to pull a copy from its source, ``scan_migrations`` told of arrivals
    and departures."""

    def __init__(
        self, host: EngineHost, pool: ConnectionPool, scan_migrations: ScanMigrations
    ) -> None:
        self.host = host
        self._pool = pool
        self.scan_migrations = scan_migrations
        self._incoming: dict[SliceKey, _Incoming] = {}
        self._copies: dict[str, _CopySession] = {}
        self._retired: dict[SliceKey, str] = {}  # slices handed over: key -> new owner
        self._released: dict[SliceKey, asyncio.Event] = {}  # retired slices kept for leases
        self._tasks: set[asyncio.Task[None]] = set()

    @property
    def node(self) -> str:
        return self.host.name

    def install(self, server: RpcServer) -> None:
        server.route(PrepareIncomingSlice, self.on_prepare)
        server.route(CopySliceIn, self.on_copy_in)
        server.route(ReadSliceCopy, self.on_read_copy)
        server.route(AbortIncomingSlice, self.on_abort)
        server.route(IndexPartitionSwitched, self.on_switched)

    async def stop(self) -> None:
        for t in list(self._tasks):
            t.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        for s in self._copies.values():
            s.snapshot.release()
        self._copies.clear()

    def busy_slices(self) -> set[SliceKey]:
        """Slices a move on this node is using: incoming copies, and handed-over slices
        whose drop timer runs (reconciliation must not drop them as orphans)."""
        return set(self._incoming) | set(self._retired)

    def _notify(self, index_id: str) -> None:
        self.host.notify((index_id,))

    def check_serving(self, index_id: str, partition: int) -> None:
        """Refuse a new scan of a slice this node handed over (the caller's topology is
        stale): retryable, the scan coordinator re-reads the topology."""
        owner = self._retired.get((index_id, partition))
        if owner is not None:
            raise ShardexError(
                f"index partition {partition} of {index_id} moved from {self.node} to {owner}",
                code=ErrorCode.STALE_TOPOLOGY,
                details={
                    "index": index_id,
                    "partition": partition,
                    "node": self.node,
                    "owner": owner,
                    "retryable": True,
                    "hint": "re-read the index topology and retry",
                },
            )

    # --- target ------------------------------------------------------------------------------

    async def on_prepare(self, msg: PrepareIncomingSlice, conn: Connection) -> IncomingSliceReady:
        engine: Any = self.host.engine
        key = (msg.definition.id, msg.partition)

        def prepare(leftover: bool) -> None:
            if leftover:
                # The master prepares a copy only on a node its committed topology gives no
                # copy of the partition: a slice here is a copy the topology dropped while
                # this node was away (not yet dropped as an orphan), never one scans read.
                engine.drop_slice(key[0], key[1])
                log.info("slice %s/%d: a left-over copy dropped for move %s",
                         key[0], key[1], msg.migration_id)  # fmt: skip
            sl = engine.create_slice(msg.definition, msg.partition)
            if sl.state not in (STATE_LOADING, "created"):
                raise ShardexError(
                    f"slice {key[0]}/{key[1]} is {sl.state} on {self.node}: it cannot "
                    "receive a copy",
                    code=ErrorCode.BAD_REQUEST,
                    details={"index": key[0], "partition": key[1], "state": sl.state},
                )
            sl.begin_load(Timestamp(), restart=True)  # queue everything, apply nothing

        async with self.host.lock:
            inc = self._incoming.get(key)
            if inc is None or inc.migration_id != msg.migration_id:
                held = self._holds(key)
                # A handed-over slice in its drop grace still serves leased paginated scans:
                # it goes when they are done, and a later rebalance plans the move again.
                if held and key in self._retired:
                    raise ShardexError(
                        f"slice {key[0]}/{key[1]} left {self.node} moments ago and is still "
                        "read by scans",
                        code=ErrorCode.BAD_REQUEST,
                        details={"index": key[0], "partition": key[1], "node": self.node,
                                 "hint": "run the rebalance again in a minute"},
                    )  # fmt: skip
                await self.host.run(prepare, held)
                self._incoming[key] = _Incoming(msg.migration_id)
            self._retired.pop(key, None)
        log.info("slice %s/%d: incoming (move %s)", key[0], key[1], msg.migration_id)
        return IncomingSliceReady(node=self.node, incarnation=self.host.incarnation)

    def _holds(self, key: SliceKey) -> bool:
        """A slice of ``key`` is here in a state no copy can be loaded into."""
        engine: Any = self.host.engine
        try:
            sl = engine.slice(key[0], key[1])
        except ShardexError:
            return False
        return sl.state not in (STATE_LOADING, "created")

    def note_routed(self, moving: dict[str, list[int]], ts: Timestamp) -> None:
        """A stabilise round at ``ts`` whose batch was routed to these incoming slices too
        succeeded here (``IndexDelivery.on_stabilise``)."""
        for index_id, parts in moving.items():
            for p in parts:
                inc = self._incoming.get((index_id, p))
                if inc is not None and inc.routed is None:
                    inc.routed = ts
                    inc.event.set()

    async def on_copy_in(self, msg: CopySliceIn, conn: Connection) -> SliceCopied:
        key = (msg.index_id, msg.partition)
        inc = self._incoming.get(key)
        if msg.incarnation != self.host.incarnation or inc is None:
            raise ShardexError(
                f"{self.node} has no incoming slice {key[0]}/{key[1]} for move "
                f"{msg.migration_id} (restarted since it was prepared?)",
                code=ErrorCode.STALE_DELIVERY,
                details={"index": key[0], "partition": key[1], "node": self.node},
            )
        try:
            await asyncio.wait_for(inc.event.wait(), msg.routed_timeout)
        except TimeoutError:
            raise ShardexError(
                f"no stabilise round routed slice {key[0]}/{key[1]} to {self.node} within "
                f"{msg.routed_timeout:.0f} s",
                code=ErrorCode.TIMEOUT,
                details={"index": key[0], "partition": key[1], "hint": "is the pipeline up?"},
            ) from None
        assert inc.routed is not None
        started = time.monotonic()
        ts, items, size = await self._pull(msg, inc.routed)
        engine: Any = self.host.engine
        count = await self.host.run(engine.load_finish, key[0], key[1], ts)
        self._notify(key[0])
        seconds = time.monotonic() - started
        log.info(
            "slice %s/%d copied from %s at %r: %d entries, %d bytes, %.2f s",
            key[0], key[1], msg.source, ts, count, size, seconds,
        )  # fmt: skip
        return SliceCopied(
            node=self.node, ts=dict(ts.to_wire()), items=items, bytes=size, seconds=seconds
        )

    async def _pull(self, msg: CopySliceIn, not_before: Timestamp) -> tuple[Timestamp, int, int]:
        """Every chunk from the source, each handed to the slice's load session."""
        engine: Any = self.host.engine
        copy_id = f"{msg.migration_id}/{uuid.uuid4().hex}"
        after: bytes | None = None
        items = size = 0
        deadline = time.monotonic() + NOT_READY_RETRY_FOR
        pause = 0.05
        while True:
            request = ReadSliceCopy(
                copy_id=copy_id,
                index_id=msg.index_id,
                partition=msg.partition,
                not_before=dict(not_before.to_wire()),
                after=after,
            )
            try:
                chunk = await self._pool.request(
                    msg.source_address, request, CHUNK_TIMEOUT, expect=SliceCopyChunk
                )
            except ShardexError as exc:
                # The source has not applied E1 yet (its round is acknowledged in parallel
                # with ours): it will within one stabilise.
                if exc.code is not ErrorCode.INDEX_NOT_READY or after is not None:
                    raise
                if time.monotonic() > deadline:
                    raise
                await asyncio.sleep(pause)
                pause = min(1.0, pause * 2)
                continue
            ts = Timestamp.from_wire(chunk.ts)
            rows = back_rows_to_key_versions(msg.index_id, msg.partition, chunk.rows)
            size += sum(len(k) + len(v) for k, v in chunk.rows)
            items += len(rows)
            await self.host.run(engine.load_chunk, msg.index_id, msg.partition, ts, rows)
            if chunk.done:
                return ts, items, size
            after = chunk.rows[-1][0] if chunk.rows else after

    async def on_abort(self, msg: AbortIncomingSlice, conn: Connection) -> SliceMoveDone:
        key = (msg.index_id, msg.partition)
        inc = self._incoming.get(key)
        if inc is not None and inc.migration_id != msg.migration_id:
            return SliceMoveDone(node=self.node)  # a later move of the same slice
        self._incoming.pop(key, None)
        dropped = await self._drop(key)
        return SliceMoveDone(node=self.node, dropped=dropped)

    async def _drop(self, key: SliceKey) -> bool:
        engine: Any = self.host.engine
        async with self.host.lock:
            dropped: bool = await self.host.run(engine.drop_slice, key[0], key[1])
        self._notify(key[0])
        if dropped:
            log.info("slice %s/%d dropped (moved away or move aborted)", key[0], key[1])
        return dropped

    # --- source ------------------------------------------------------------------------------

    def _open_copy(self, msg: ReadSliceCopy) -> _CopySession:
        """Under the slice lock: the applied TS and a snapshot of the back index agree."""
        engine: Any = self.host.engine
        sl = engine.slice(msg.index_id, msg.partition)  # INDEX_NOT_FOUND
        want = Timestamp.from_wire(msg.not_before)
        with sl.lock:
            applied = sl.applied_ts()
            if sl.state != STATE_ACTIVE or not applied.covers(want):
                raise ShardexError(
                    f"slice {msg.index_id}/{msg.partition} on {self.node} is {sl.state} at "
                    f"{applied!r}, the copy needs {want!r}",
                    code=ErrorCode.INDEX_NOT_READY,
                    details={"index": msg.index_id, "partition": msg.partition, "retryable": True},
                )
            cf = cf_names(msg.index_id, msg.partition)[1]
            snap = sl.store.snapshot([cf])
        return _CopySession(applied, snap, cf, time.monotonic())

    def _read_chunk(self, session: _CopySession, after: bytes | None, max_bytes: int) -> tuple[
        list[tuple[bytes, bytes]], bool
    ]:  # fmt: skip
        lower = None if after is None else after + b"\x00"
        rows: list[tuple[bytes, bytes]] = []
        size = 0
        for k, v in session.snapshot.iterate(session.cf, lower):
            rows.append((k, v))
            size += len(k) + len(v)
            if size >= max_bytes:
                return rows, False
        return rows, True

    async def on_read_copy(self, msg: ReadSliceCopy, conn: Connection) -> SliceCopyChunk:
        self._expire_copies()
        session = self._copies.get(msg.copy_id)
        if session is None:
            if msg.after is not None:
                raise ShardexError(
                    f"copy {msg.copy_id} is not open on {self.node} (expired or restarted)",
                    code=ErrorCode.BAD_REQUEST,
                    details={"copy_id": msg.copy_id, "hint": "restart the copy"},
                )
            session = await self.host.run(self._open_copy, msg)
            self._copies[msg.copy_id] = session
        session.used = time.monotonic()
        max_bytes = max(64 * 1024, min(msg.max_bytes, 3 * 1024 * 1024))
        if self.host.inline_io:
            rows, done = self._read_chunk(session, msg.after, max_bytes)
        else:
            rows, done = await asyncio.to_thread(self._read_chunk, session, msg.after, max_bytes)
        if done:
            self._copies.pop(msg.copy_id, None)
            session.snapshot.release()
        return SliceCopyChunk(ts=dict(session.ts.to_wire()), rows=rows, done=done)

    def _expire_copies(self) -> None:
        now = time.monotonic()
        for cid in [c for c, s in self._copies.items() if now - s.used > COPY_SESSION_IDLE]:
            self._copies.pop(cid).snapshot.release()

    # --- both ends ---------------------------------------------------------------------------

    async def on_switched(self, msg: IndexPartitionSwitched, conn: Connection) -> SliceMoveDone:
        """Idempotent: the master re-sends it until acknowledged, and reconciliation may have
        learnt the switch from the state first (``switched_in_state``)."""
        key = (msg.index_id, msg.partition)
        migrations = self.scan_migrations
        inc = self._incoming.get(key)
        if inc is not None and inc.migration_id != msg.migration_id:
            return SliceMoveDone(node=self.node)  # a later move of the slice is under way here
        if self.node == msg.target:
            self._incoming.pop(key, None)
            migrations.partition_arrived(msg.index_id, msg.partition)
        elif self.node == msg.source:
            self._retire(key, msg.target, msg.grace)
        migrations.topology_published(msg.index_id, msg.topology_seq)
        return SliceMoveDone(node=self.node)

    def _retire(self, key: SliceKey, owner: str, grace: float) -> bool:
        """The slice was switched to ``owner``: refuse new scans of it, tell the paginated
        scans it left, drop it after ``grace`` (and its leases). False if already retired."""
        if key in self._retired:
            return False
        self._retired[key] = owner
        self.scan_migrations.partition_left(key[0], key[1], owner)
        self._notify(key[0])  # scans waiting on this slice re-check and retry
        task = asyncio.get_running_loop().create_task(self._drop_later(key, grace))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return True

    def awaiting_switch(self) -> bool:
        """An incoming copy is here: reconciliation reads the committed state to learn its
        switch if the message does not come (``switched_in_state``)."""
        return bool(self._incoming)

    def switched_in_state(self, state: StateContext, orphans: Iterable[SliceKey]) -> list[SliceKey]:
        """Learn from the master's committed ``state`` the switches whose
        ``IndexPartitionSwitched`` did not arrive (lost, the master failed over, or this node
        restarted). Source side: of ``orphans`` (held slices the latest index topology gives
        to another node, no move coming here: ``orphans.plan_orphans``), those an earlier
        topology of the index gave to this node were switched away from here; retire them
        as the message would have. Target side: an incoming copy whose own move is ``done``
        and whose partition the latest topology gives to this node has arrived.
        Returns the slices switched now, either way."""
        out: list[SliceKey] = []
        moves = state.rebalance.index_moves if state.rebalance is not None else []
        done = {m.migration_id for m in moves if m.status == DONE and m.target == self.node}
        for key, inc in list(self._incoming.items()):
            history = state.index_topologies.get(key[0]) or []
            # This copy's own move is done (not an older state from before it started).
            if inc.migration_id in done and history and self._in_chain(history[-1], key[1]):
                del self._incoming[key]
                self.scan_migrations.partition_arrived(key[0], key[1])
                self.scan_migrations.topology_published(key[0], history[-1].seq_num)
                log.info("slice %s/%d: arrived (move %s, learnt from the state)",
                         key[0], key[1], inc.migration_id)  # fmt: skip
                out.append(key)
        for key in orphans:
            if key in self._retired or key in self._incoming:
                continue
            history = state.index_topologies.get(key[0]) or []
            if len(history) < 2 or not any(self._in_chain(t, key[1]) for t in history[:-1]):
                continue  # never served here (an aborted copy): the orphan drop's business
            owner = history[-1].assignment.get(key[1], "")
            if self._retire(key, owner, SWITCH_DROP_GRACE):
                self.scan_migrations.topology_published(key[0], history[-1].seq_num)
                log.info(
                    "slice %s/%d: switched to %s (learnt from the state, topology %d)",
                    key[0], key[1], owner, history[-1].seq_num,
                )  # fmt: skip
                out.append(key)
        return out

    def _in_chain(self, topology: Topology, partition: int) -> bool:
        """``topology`` gives a copy of ``partition`` (primary or replica) to this node."""
        return partition in topology.assignment and self.node in topology.chain(partition)

    async def _drop_later(self, key: SliceKey, grace: float) -> None:
        await asyncio.sleep(max(0.0, grace))  # in-flight scans on the slice finish
        # Pinned paginated scans read their leased snapshot here, where it was taken (the
        # new owner's copy starts at the move's T1): keep the slice until the last lease is
        # released or expires. No new lease is granted on a retired slice (``check_serving``)
        # and a lease lives at most LEASE_TTL past its last renewal, so this ends.
        while (expiry := await self._lease_expiry(key)) is not None:
            released = self._released[key] = asyncio.Event()
            with contextlib.suppress(TimeoutError):
                wait = max(expiry - time.monotonic(), 0.0) + LEASE_RECHECK
                await asyncio.wait_for(released.wait(), wait)
        self._released.pop(key, None)
        if self._retired.get(key) is not None:
            await self._drop(key)  # ``_retired`` keeps the new owner (``moved_to``)

    def lease_released(self, index_id: str, partitions: Iterable[int]) -> None:
        """A scan released its lease on these slices: a handed-over one may go now."""
        for p in partitions:
            ev = self._released.get((index_id, p))
            if ev is not None:
                ev.set()

    async def _lease_expiry(self, key: SliceKey) -> float | None:
        engine: Any = self.host.engine
        try:
            sl = engine.slice(key[0], key[1])
        except ShardexError:  # dropped meanwhile (the index was)
            return None
        expiry: float | None = await self.host.run(sl.lease_expiry)
        return expiry

    def moved_to(self, index_id: str, partition: int) -> str | None:
        """The node a slice handed over from here went to (also after its drop), None if
        it did not move away."""
        return self._retired.get((index_id, partition))
