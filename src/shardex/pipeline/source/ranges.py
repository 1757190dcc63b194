"""Reading many small change ranges with one ``ReadRanges`` per owner node.

A change stream costs about 0.8 ms of the reader's CPU and 1.1 ms of the node's whatever it
carries, so a read of 10-100 changes per partition over 64 partitions (a maintenance batch,
its catch-up, a read-ahead piece) was mostly per-stream cost. ``read_small_ranges`` sends
each owner all its ranges in one request (``client/range_reads.py``), every owner at once,
and continues ranges the reply's caps cut from where they stopped, each owner at its own
pace. Measured in ``docs/decisions/0075-multi-range-change-reads.md``.

The rules are the stream reader's (``read._stream_range``), range by range:

* exactly (start, end]: the seqnos received are dense from the position, on the branch the
  end was observed on (else ROLLBACK, ``branch_changed``), and the range ends exactly at
  its end (a node whose history stops below says so per range: ROLLBACK);
* a range refused with NOT_MY_PARTITION (moved), or whose owner cannot be reached, resumes
  from the last seqno received after a topology refresh, with backoff, within
  ``resume_timeout`` from its first failure; the other ranges carry on;
* ROLLBACK keeps its details and gets the parseable tag (``tagged_rollback``); BAD_REQUEST
  names the partition;
* a backfill (answered ``use_stream``: a read from 0 of a partition whose early log was
  purged) is handed to ``stream_range``, the stream reader, from where it stands.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Awaitable, Callable, Coroutine, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

from shardex.api.records import Change
from shardex.client.range_reads import RangeChanges, RangeSpec, read_round
from shardex.client.routing import DataRouter, backoff
from shardex.errors import ErrorCode, ShardexError
from shardex.pipeline.source.checks import (
    RESUMABLE,
    Chunk,
    branch_changed,
    history_ends_below,
    tagged_rollback,
)
from shardex.pipeline.source.types import PartitionRange

__all__ = ["DEFAULT_REPLY_BYTES", "DEFAULT_REPLY_ITEMS", "read_small_ranges"]

DEFAULT_REPLY_ITEMS = 20_000  # changes per ReadRanges reply (the node's cap)
DEFAULT_REPLY_BYTES = 8 * 1024 * 1024  # bodies + docids per reply (the node's cap)

T = TypeVar("T")
Put = Callable[[Chunk], Awaitable[None]]
StreamRange = Callable[[PartitionRange], Awaitable[None]]


@dataclass(slots=True)
class _Range:
    """A range being read: its plan, the position reached and the branch it is on."""

    plan: PartitionRange
    pos: int
    uuid: int
    deadline: float | None = None  # set at the first failure: resume until then
    attempt: int = 0
    error: ShardexError | None = None  # the last resumable failure

    def spec(self) -> RangeSpec:
        return RangeSpec(self.plan.partition, self.pos, self.uuid, self.plan.end_seqno)


async def read_small_ranges(
    router: DataRouter,
    keyspace: str,
    ranges: Sequence[PartitionRange],
    put: Put,
    stream_range: StreamRange,
    *,
    resume_timeout: float,
    max_items: int = DEFAULT_REPLY_ITEMS,
    max_bytes: int = DEFAULT_REPLY_BYTES,
) -> None:
    """Every change of ``ranges`` handed to ``put`` as ``Chunk``s, in seqno order within a
    partition (see the module doc); returns when all are read, raises on the first range
    that cannot be."""
    pending = [_Range(r, r.start_seqno, r.start_uuid) for r in ranges if r.count > 0]
    streamed: list[PartitionRange] = []
    while pending:
        _, topo = await router.keyspace(keyspace)
        by_owner: dict[str | None, list[_Range]] = {}
        for s in pending:
            by_owner.setdefault(topo.assignment.get(s.plan.partition), []).append(s)
        outcomes = await _all_or_none(
            [_drain(router, keyspace, g, put, max_items, max_bytes) for g in by_owner.values()]
        )
        pending = []
        for retry, to_stream in outcomes:
            pending.extend(retry)
            streamed.extend(to_stream)
        if pending:
            await _before_resume(router, pending, resume_timeout)
    if streamed:
        await _all_or_none([stream_range(r) for r in streamed])


async def _all_or_none(coros: Sequence[Coroutine[Any, Any, T]]) -> list[T]:
    """``gather`` that cancels (and awaits) the others when one fails: no owner's read may
    keep handing chunks to a consumer that has already been told the read failed."""
    tasks = [asyncio.ensure_future(c) for c in coros]
    try:
        return list(await asyncio.gather(*tasks))
    finally:
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


async def _drain(
    router: DataRouter,
    keyspace: str,
    group: list[_Range],
    put: Put,
    max_items: int,
    max_bytes: int,
) -> tuple[list[_Range], list[PartitionRange]]:
    """Read ``group`` (ranges one owner held when planned) until each is complete or needs
    a resume elsewhere; answers (ranges to resume, ranges to stream)."""
    retry: list[_Range] = []
    to_stream: list[PartitionRange] = []
    while group:
        results = await read_round(
            router, keyspace, [s.spec() for s in group], max_items=max_items, max_bytes=max_bytes
        )
        left: list[_Range] = []
        for s, res in zip(group, results, strict=True):
            if res.error is not None:
                s.error = _failure(keyspace, s, res)  # raises unless resumable
                retry.append(s)
            elif res.use_stream:
                to_stream.append(
                    PartitionRange(
                        s.plan.partition, s.pos, s.uuid, s.plan.end_seqno, s.plan.end_uuid
                    )
                )
            else:
                chunk = _accept(keyspace, s, res)
                if chunk is not None:
                    await put(chunk)
                if s.pos < s.plan.end_seqno:
                    left.append(s)  # cut by the reply's caps: ask again from s.pos
                elif s.pos > s.plan.end_seqno:
                    raise _jumped(keyspace, s, s.pos)
        group = left
    return retry, to_stream


def _accept(keyspace: str, s: _Range, res: RangeChanges) -> Chunk | None:
    """Check one answer against the range's position and branch; advance it. The changes
    become the engine's ``Change``s (what the stream reader yields, so rows are the same)."""
    r = s.plan
    if not res.changes:
        if res.reached != s.pos:
            raise _jumped(keyspace, s, res.reached)
        return None
    if res.uuid != r.end_uuid and r.end_uuid != 0:
        raise branch_changed(keyspace, r, res.uuid)
    p = r.partition
    pos = s.pos
    changes: list[Change] = []
    for seqno, docid, op, cas, body, flags, expiry in res.changes:
        if seqno != pos + 1:
            raise _jumped(keyspace, s, seqno, at=pos)
        pos = seqno
        changes.append(Change(p, seqno, docid, op, cas, body, flags, expiry))
    if res.reached != pos:
        raise _jumped(keyspace, s, res.reached, at=pos)
    s.pos, s.uuid = pos, res.uuid
    return Chunk(p, res.uuid, changes)


def _failure(keyspace: str, s: _Range, res: RangeChanges) -> ShardexError:
    """The range's error if it is one to resume from (after a refresh); raises the others
    as the stream reader raises them."""
    assert res.error is not None
    exc = ShardexError.from_wire(res.error.code, res.error.message, res.error.details)
    r = s.plan
    if exc.code is ErrorCode.ROLLBACK:
        if "planned_end" in exc.details:  # the history ends below the end: same as a stream
            raise history_ends_below(keyspace, r, int(exc.details["rollback_seqno"]))
        raise tagged_rollback(keyspace, r, exc)
    if exc.code is ErrorCode.BAD_REQUEST:
        exc.details.setdefault("partition", r.partition)
        raise exc
    if exc.code not in RESUMABLE:
        raise exc
    return exc


async def _before_resume(router: DataRouter, pending: list[_Range], resume_timeout: float) -> None:
    """Fail the first range past its deadline; else back off and refresh the topology."""
    now = time.monotonic()
    for s in pending:
        s.deadline = now + resume_timeout if s.deadline is None else s.deadline
        if now >= s.deadline:
            assert s.error is not None
            s.error.details.update(partition=s.plan.partition, resumed_from=s.pos)
            raise s.error
    attempt = min(s.attempt for s in pending)
    await asyncio.sleep(backoff(min(attempt, 5)))
    for s in pending:
        s.attempt += 1
    with contextlib.suppress(ShardexError):
        await router.refresh()


def _jumped(keyspace: str, s: _Range, got: int, *, at: int | None = None) -> ShardexError:
    pos = s.pos if at is None else at
    return ShardexError(
        f"partition {s.plan.partition} of {keyspace!r}: range read jumped from seqno {pos} "
        f"to {got} (records would be skipped or doubled)",
        code=ErrorCode.INTERNAL,
        details={"partition": s.plan.partition, "pos": pos, "got": got},
    )
