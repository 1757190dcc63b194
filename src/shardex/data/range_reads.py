"""Multi-range change reads, node side: ``ReadRanges`` answered in one reply.

A change stream costs each side about a millisecond of CPU whatever it carries (open request
and reply, a batch, a credit, the end, a task on both sides), so a micro-batch read of 10-100
changes per partition over 64 partitions was mostly per-stream cost. ``ReadRanges`` carries
every range one owner serves and answers all of them at once, read in ONE call into the I/O
pool: each range is an ``open_stream`` run (the same failover-log check, snapshot and wire
tuples as a stream's) drained with the stream server's take logic under one budget of
items and bytes for the whole reply.

Errors are per range (NOT_MY_PARTITION for a partition that moved, ROLLBACK with the same
details a stream open gives, ROLLBACK too for a range ending above the partition's high
seqno: its end is not in this history), so one moved partition does not fail the others. A
backfill run (from 0 on a partition whose early log was purged) is not a log position a
partial answer could continue from: such a range is answered ``use_stream``. Malformed
requests (ranges out of the keyspace, from above end, a partition twice, too many ranges,
caps below 1) fail whole with BAD_REQUEST before anything is read.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from typing import Any

from shardex.api.data import RangeChanges, RangeSpec, ReadRanges, ReadRangesReply
from shardex.api.errors import (
    BadRequest,
    KeyspaceNotFound,
    RollbackRequired,
    WireError,
    not_my_partition,
)
from shardex.api.records import SnapshotMarker
from shardex.data.engine import DataEngine
from shardex.data.streaming import close_quietly, take_sized
from shardex.errors import ShardexError
from shardex.net import Connection

MAX_RANGES = 4096  # ranges per request (a keyspace's partitions on one node, with room)
MAX_REPLY_ITEMS = 20_000  # changes per reply, all ranges together
MAX_REPLY_BYTES = 8 * 1024 * 1024  # bodies + docids per reply (one range may pass it by one)

RunInExecutor = Callable[..., Awaitable[Any]]


class RangeReadServer:
    """Answers ``ReadRanges`` for one data node."""

    def __init__(
        self,
        engine: DataEngine,
        run: RunInExecutor,
        enrich: Callable[[ShardexError], ShardexError],
        num_partitions: Callable[[str], int | None],
    ) -> None:
        self._engine = engine
        self._run = run
        self._enrich = enrich  # adds owner hints to NOT_MY_PARTITION errors
        self._num_partitions = num_partitions  # from the cluster state: None if no keyspace

    async def on_read(self, msg: ReadRanges, conn: Connection) -> ReadRangesReply:
        max_items, max_bytes = _check(msg)
        try:
            local = self._engine.keyspace(msg.keyspace).num_partitions
        except KeyspaceNotFound:
            # A node holding none of an existing keyspace must say NOT_MY_PARTITION.
            total = self._num_partitions(msg.keyspace)
            if total is None:
                raise
            _check_partitions(msg.ranges, total)
            return ReadRangesReply(
                results=[
                    self._failed(r, not_my_partition(msg.keyspace, r.partition, "absent"))
                    for r in msg.ranges
                ]
            )
        _check_partitions(msg.ranges, local)
        results = await self._run(
            read_ranges, self._engine, msg.keyspace, msg.ranges, max_items, max_bytes
        )
        return ReadRangesReply(
            results=[
                self._failed(r, res) if isinstance(res, ShardexError) else res
                for r, res in zip(msg.ranges, results, strict=True)
            ]
        )

    def _failed(self, r: RangeSpec, exc: ShardexError) -> RangeChanges:
        code, message, details = self._enrich(exc).to_wire()
        return RangeChanges(
            partition=r.partition,
            uuid=r.uuid,
            reached=r.from_seqno,
            error=WireError(code, message, details),
        )


def _check(msg: ReadRanges) -> tuple[int, int]:
    """The reply's caps; BAD_REQUEST for a request that cannot be meant as sent."""
    if len(msg.ranges) > MAX_RANGES:
        raise BadRequest(
            f"ReadRanges carries {len(msg.ranges)} ranges, more than {MAX_RANGES}",
            details={"value": len(msg.ranges), "hint": f"split into <= {MAX_RANGES}"},
        )
    for name, value in (("max_items", msg.max_items), ("max_bytes", msg.max_bytes)):
        if value < 1:
            raise BadRequest(f"{name} must be at least 1, got {value}", details={name: value})
    seen: set[int] = set()
    for i, r in enumerate(msg.ranges):
        if r.from_seqno < 0 or r.end_seqno < r.from_seqno or r.uuid < 0:
            raise BadRequest(
                f"range {i} (partition {r.partition}) is not 0 <= from_seqno <= end_seqno "
                f"with a uuid >= 0: from {r.from_seqno}, end {r.end_seqno}, uuid {r.uuid}",
                details={"range": i, "partition": r.partition},
            )
        if r.partition in seen:
            raise BadRequest(
                f"partition {r.partition} is listed twice",
                details={"range": i, "partition": r.partition},
            )
        seen.add(r.partition)
    return min(msg.max_items, MAX_REPLY_ITEMS), min(msg.max_bytes, MAX_REPLY_BYTES)


def _check_partitions(ranges: Sequence[RangeSpec], num_partitions: int) -> None:
    for i, r in enumerate(ranges):
        if not 0 <= r.partition < num_partitions:
            raise BadRequest(
                f"range {i}: partition {r.partition} is outside 0..{num_partitions - 1}",
                details={"range": i, "partition": r.partition},
            )


def read_ranges(
    engine: DataEngine,
    keyspace: str,
    ranges: Sequence[RangeSpec],
    max_items: int,
    max_bytes: int,
) -> list[RangeChanges | ShardexError]:
    """Every range's answer (or its error), in order, sharing ``max_items`` and
    ``max_bytes``; runs in the I/O pool. Ranges after the budget is spent come back with
    nothing read (``reached`` = their start), so the reader asks again for them."""
    out: list[RangeChanges | ShardexError] = []
    items_left, bytes_left = max_items, max_bytes
    for r in ranges:
        if r.end_seqno > r.from_seqno and (items_left <= 0 or bytes_left <= 0):
            out.append(RangeChanges(partition=r.partition, uuid=r.uuid, reached=r.from_seqno))
            continue
        res, size = _one_range(engine, keyspace, r, items_left, bytes_left)
        if isinstance(res, RangeChanges):
            items_left -= len(res.changes)
            bytes_left -= size
        out.append(res)
    return out


def _one_range(
    engine: DataEngine, keyspace: str, r: RangeSpec, max_items: int, max_bytes: int
) -> tuple[RangeChanges | ShardexError, int]:
    try:
        run = engine.stream(keyspace, r.partition, r.from_seqno, r.uuid, r.end_seqno, wire=True)
    except ShardexError as exc:
        return exc, 0
    try:
        marker = next(run, None)
        if marker is None:  # an empty run: the history ends at or below from_seqno
            if r.end_seqno > r.from_seqno:
                return _ends_below(keyspace, r, r.from_seqno, r.uuid), 0
            return RangeChanges(partition=r.partition, uuid=r.uuid, reached=r.end_seqno), 0
        assert isinstance(marker, SnapshotMarker)
        if marker.backfill:
            return RangeChanges(
                partition=r.partition, uuid=marker.uuid, reached=r.from_seqno, use_stream=True
            ), 0
        if marker.end < r.end_seqno:  # the run is clamped at the high seqno
            return _ends_below(keyspace, r, marker.end, marker.uuid), 0
        changes, _exhausted, size = take_sized(run, max_items, max_bytes)
    finally:
        close_quietly(run)
    reached = changes[-1][0] if changes else r.from_seqno
    return RangeChanges(
        partition=r.partition, uuid=marker.uuid, reached=reached, changes=changes
    ), size


def _ends_below(keyspace: str, r: RangeSpec, high: int, uuid: int) -> ShardexError:
    """The partition's history on this branch stops before the range's end: acknowledged
    writes are missing (a failover to a copy without them), so the consumer rolls back to
    where the history ends (what a stream reader concludes when its stream stops short)."""
    return RollbackRequired(
        f"partition {r.partition} of {keyspace!r} ends at seqno {high}, below the requested "
        f"end {r.end_seqno}",
        details={
            "keyspace": keyspace,
            "partition": r.partition,
            "rollback_seqno": high,
            "uuid": uuid,
            "high_seqno": high,
            "planned_end": r.end_seqno,
        },
    )
