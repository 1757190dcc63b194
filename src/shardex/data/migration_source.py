"""Source side of a partition migration on a data node.

Serves the target's pulls (copy sessions over one RocksDB snapshot, change reads for the
catch-up) and the master's hand-over commands (freeze, release, resolve, drop). The rules that
make a hand-over safe are enforced here, on the node that holds the only serving copy:

* a freeze has a **lease**: a master that dies mid-hand-over cannot leave writes paused for
  longer than ``lease`` seconds;
* a release needs the live freeze of the same migration and the same high seqno, and is
  checked and persisted under the partition lock (``release_if_high``): nothing can have been
  written after the high seqno the target caught up to;
* ``ResolveOutgoing`` settles a migration whose outcome the master does not know: if the
  partition is still active here the migration is **fenced** (unfrozen, and any later freeze
  or release with its id refused), so the answer "active" is final and the master may drop
  the target's copy; "released" is final too, and the master rolls forward;
* every command carries the master's term; ``check_fence`` refuses older terms (a deposed
  master that still runs its migration task).
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import dataclasses
import itertools
import logging
from collections.abc import Awaitable, Callable, Iterator
from typing import Any

from shardex.api.data import ChangeTuple
from shardex.api.migration import (
    MAX_CHUNK_BYTES,
    CopyChunk,
    CopyChunkReply,
    CopyClose,
    CopyOpen,
    CopyOpened,
    DropOutgoing,
    FreezeOutgoing,
    FreezeReply,
    Outcome,
    ReadChanges,
    ReadChangesReply,
    ReleaseOutgoing,
    ResolveOutgoing,
)
from shardex.api.records import STATE_ACTIVE, STATE_RELEASED, Change
from shardex.data.engine import DataEngine
from shardex.data.migration import PartitionSnapshot
from shardex.errors import ErrorCode, ShardexError
from shardex.net import Connection

log = logging.getLogger(__name__)

RunInExecutor = Callable[..., Awaitable[Any]]
MAX_SESSIONS = 32
MAX_READ_ITEMS = 5000
MAX_READ_BYTES = 4 * 1024 * 1024
MAX_LEASE = 60.0
_ABORTED_KEPT = 1000


@dataclasses.dataclass
class _Session:
    snapshot: PartitionSnapshot
    items: Iterator[tuple[bytes, bytes]]
    conn: Connection
    lock: asyncio.Lock = dataclasses.field(default_factory=asyncio.Lock)
    done: bool = False


@dataclasses.dataclass
class _Freeze:
    migration_id: str
    high_seqno: int
    timer: asyncio.TimerHandle


def _stale(message: str, **details: Any) -> ShardexError:
    return ShardexError(message, code=ErrorCode.STALE_TOPOLOGY, details=details)


def take_bytes(items: Iterator[tuple[bytes, bytes]], max_bytes: int) -> tuple[list, bool]:
    """Up to ``max_bytes`` of items (at least one); ``done`` once the iterator is exhausted."""
    out: list[tuple[bytes, bytes]] = []
    size = 0
    for key, value in items:
        out.append((key, value))
        size += len(key) + len(value)
        if size >= max_bytes:
            return out, False
    return out, True


def read_changes(engine: DataEngine, msg: ReadChanges) -> tuple[list[ChangeTuple], int, list[Any]]:
    """Change records after ``msg.after`` (to ``msg.until``), bounded; runs in a thread."""
    run = engine.stream(msg.keyspace, msg.partition, msg.after, msg.uuid, msg.until)
    out: list[ChangeTuple] = []
    size = 0
    limit = max(1, min(msg.max_items, MAX_READ_ITEMS))
    try:
        for item in run:
            if not isinstance(item, Change):
                continue
            out.append(
                (item.seqno, item.docid, item.op, item.cas, item.body, item.flags, item.expiry)
            )
            size += len(item.docid) + (len(item.body) if item.body else 0)
            if len(out) >= limit or size >= MAX_READ_BYTES:
                break
    finally:
        run.close()
    info = engine.partition_info(msg.keyspace, msg.partition)
    return out, info.high_seqno, list(info.failover_log)


class MigrationSource:
    """Copy sessions, change reads and the source's hand-over commands (module docstring)."""

    def __init__(self, engine: Callable[[], DataEngine], run: RunInExecutor) -> None:
        self._engine = engine
        self._run = run
        self._ids = itertools.count(1)
        self._sessions: dict[int, _Session] = {}
        self._watched: set[Connection] = set()
        self._freezes: dict[tuple[str, int], _Freeze] = {}
        self._aborted: collections.OrderedDict[str, None] = collections.OrderedDict()

    def routes(self) -> dict[type, Callable[[Any, Connection], Awaitable[Any]]]:
        return {
            CopyOpen: self.on_copy_open,
            CopyChunk: self.on_copy_chunk,
            CopyClose: self.on_copy_close,
            ReadChanges: self.on_read_changes,
            FreezeOutgoing: self.on_freeze,
            ReleaseOutgoing: self.on_release,
            ResolveOutgoing: self.on_resolve,
            DropOutgoing: self.on_drop,
        }

    async def close(self) -> None:
        for key in list(self._freezes):
            self._freezes.pop(key).timer.cancel()
        for sid in list(self._sessions):
            await self._close_session(sid)

    # --- copy sessions ---------------------------------------------------------------------

    async def on_copy_open(self, msg: CopyOpen, conn: Connection) -> CopyOpened:
        if len(self._sessions) >= MAX_SESSIONS:
            raise ShardexError(
                f"too many copy sessions open ({MAX_SESSIONS})",
                code=ErrorCode.NODE_UNAVAILABLE,
                details={"sessions": len(self._sessions)},
            )
        snap = await self._run(self._engine().snapshot_partition, msg.keyspace, msg.partition)
        sid = next(self._ids)
        self._sessions[sid] = _Session(snap, snap.raw_items(), conn)
        if conn not in self._watched:
            self._watched.add(conn)
            conn.add_close_callback(self._on_conn_closed)
        log.info(
            "migration %s: copying %s/%d out (high seqno %d, %d docs)",
            msg.migration_id,
            msg.keyspace,
            msg.partition,
            snap.info.high_seqno,
            snap.info.doc_count,
        )
        return CopyOpened(session=sid, info=snap.info)

    async def on_copy_chunk(self, msg: CopyChunk, conn: Connection) -> CopyChunkReply:
        session = self._sessions.get(msg.session)
        if session is None or session.conn is not conn:
            raise ShardexError(
                f"copy session {msg.session} is not open on this connection",
                code=ErrorCode.BAD_REQUEST,
                details={"session": msg.session},
            )
        async with session.lock:
            if session.done:
                return CopyChunkReply(items=[], done=True)
            limit = max(1, min(msg.max_bytes, MAX_CHUNK_BYTES))
            items, done = await self._run(take_bytes, session.items, limit)
            session.done = done
        return CopyChunkReply(items=items, done=done)

    async def on_copy_close(self, msg: CopyClose, conn: Connection) -> None:
        session = self._sessions.get(msg.session)
        if session is not None and session.conn is conn:
            await self._close_session(msg.session)

    async def _close_session(self, sid: int) -> None:
        session = self._sessions.pop(sid, None)
        if session is None:
            return
        async with session.lock:  # never release the snapshot under a running read
            session.snapshot.close()

    def _on_conn_closed(self, conn: Connection) -> None:
        self._watched.discard(conn)
        for sid in [s for s, v in self._sessions.items() if v.conn is conn]:
            asyncio.get_running_loop().create_task(self._close_session(sid))

    async def on_read_changes(self, msg: ReadChanges, conn: Connection) -> ReadChangesReply:
        changes, high, flog = await self._run(read_changes, self._engine(), msg)
        return ReadChangesReply(changes=changes, high_seqno=high, failover_log=flog)

    # --- hand-over commands ---------------------------------------------------------------------

    async def _fence(self, epoch: int) -> DataEngine:
        engine = self._engine()
        await self._run(engine.check_fence, epoch)
        return engine

    async def on_freeze(self, msg: FreezeOutgoing, conn: Connection) -> FreezeReply:
        engine = await self._fence(msg.epoch)
        if msg.migration_id in self._aborted:
            raise _stale(
                f"migration {msg.migration_id} was aborted here",
                migration_id=msg.migration_id,
            )
        key = (msg.keyspace, msg.partition)
        info = await self._run(engine.freeze_partition, msg.keyspace, msg.partition)
        old = self._freezes.pop(key, None)
        if old is not None:
            old.timer.cancel()
        lease = max(0.1, min(msg.lease, MAX_LEASE))
        timer = asyncio.get_running_loop().call_later(lease, self._expire, key, msg.migration_id)
        self._freezes[key] = _Freeze(msg.migration_id, info.high_seqno, timer)
        return FreezeReply(high_seqno=info.high_seqno, uuid=info.uuid)

    def _expire(self, key: tuple[str, int], migration_id: str) -> None:
        fr = self._freezes.get(key)
        if fr is None or fr.migration_id != migration_id:
            return
        del self._freezes[key]
        log.warning(
            "migration %s: freeze of %s/%d expired without a release: writes resume here",
            migration_id,
            *key,
        )
        with contextlib.suppress(ShardexError):
            self._engine().unfreeze_partition(*key)

    async def on_release(self, msg: ReleaseOutgoing, conn: Connection) -> Outcome:
        engine = await self._fence(msg.epoch)
        key = (msg.keyspace, msg.partition)
        fr = self._freezes.get(key)
        if fr is None or fr.migration_id != msg.migration_id:
            if engine.partition_state(*key) == STATE_RELEASED and (
                msg.migration_id not in self._aborted
            ):
                return Outcome(state=STATE_RELEASED, high_seqno=msg.high_seqno)  # a retry
            raise _stale(
                f"partition {msg.partition} of {msg.keyspace!r} is not frozen by migration "
                f"{msg.migration_id} (lease expired, aborted, or node restarted): not released",
                migration_id=msg.migration_id,
            )
        if fr.high_seqno != msg.high_seqno:
            raise _stale(
                f"frozen at seqno {fr.high_seqno}, not {msg.high_seqno}: not released",
                frozen=fr.high_seqno,
                expected=msg.high_seqno,
            )
        info = await self._run(engine.release_if_high, *key, msg.high_seqno)
        fr.timer.cancel()
        self._freezes.pop(key, None)
        log.info(
            "migration %s: released %s/%d at seqno %d",
            msg.migration_id,
            msg.keyspace,
            msg.partition,
            info.high_seqno,
        )
        return Outcome(state=info.state, high_seqno=info.high_seqno)

    async def on_resolve(self, msg: ResolveOutgoing, conn: Connection) -> Outcome:
        engine = await self._fence(msg.epoch)
        key = (msg.keyspace, msg.partition)
        state = engine.partition_state(*key)
        high = 0
        if state != "absent":
            high = engine.partition_info(*key).high_seqno
        if state == STATE_ACTIVE:
            self._aborted[msg.migration_id] = None
            while len(self._aborted) > _ABORTED_KEPT:
                self._aborted.popitem(last=False)
            fr = self._freezes.get(key)
            if fr is not None and fr.migration_id == msg.migration_id:
                fr.timer.cancel()
                del self._freezes[key]
                await self._run(engine.unfreeze_partition, *key)
                log.info("migration %s: aborted, %s/%d serves here again", msg.migration_id, *key)
        return Outcome(state=state, high_seqno=high)

    async def on_drop(self, msg: DropOutgoing, conn: Connection) -> Outcome:
        engine = await self._fence(msg.epoch)
        key = (msg.keyspace, msg.partition)
        state = engine.partition_state(*key)
        if state == STATE_ACTIVE:
            raise _stale(
                f"partition {msg.partition} of {msg.keyspace!r} is active here: not dropped",
                migration_id=msg.migration_id,
            )
        if state != STATE_RELEASED:
            return Outcome(state=state)  # absent already; never drop someone's pending copy
        await self._run(engine.raise_topology_floor, msg.keyspace, msg.topology_seq)
        await self._run(engine.drop_partition, *key)
        log.info("migration %s: dropped %s/%d (moved away)", msg.migration_id, *key)
        return Outcome(state="absent")
