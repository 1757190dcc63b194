"""Waiting for a slice's stability without blocking the event loop.

``StabilityWatch`` wakes the scans waiting on an index whenever something that can change
the answer happens on this indexer: a stabilise (new snapshots), a published stability TS,
a rollback, a drop (``IndexDelivery`` calls ``notify``). Waiters re-check their condition on
every wake-up, so a notification never needs to say what changed, and one that arrives
between a check and the wait is not lost (the waiter takes the event *before* checking).

``stable_ts`` is the condition the scan flow's step 12 needs, computed from the slices
themselves: the newest TS at which every slice read has a snapshot. A published stability TS
is such a TS on every node (each slice snapshotted it before the timekeeper published it),
and a stabilised but not yet published one is a consistent cut of the local slices too,
which is all a scan of them needs; reading the slices' own snapshots also keeps serving after
an indexer restart, when the in-memory published TS is gone until the next micro-batch.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

from shardex.core.timestamp import Timestamp
from shardex.errors import ErrorCode, ShardexError

__all__ = ["StabilityWatch", "behind_details", "common_snapshot_ts", "scan_timeout"]

T = TypeVar("T")


CHECK_FLOOR = 1.0  # seconds a single check may always take


class StabilityWatch:
    """Per index id, an event replaced at every notification."""

    def __init__(self) -> None:
        self._events: dict[str, asyncio.Event] = {}

    def notify(self, index_id: str) -> None:
        ev = self._events.pop(index_id, None)
        if ev is not None:
            ev.set()

    def notify_all(self) -> None:
        for index_id in list(self._events):
            self.notify(index_id)

    async def wait(self, index_id: str, check: Callable[[], Any], timeout: float) -> Any:
        """``await check()`` until it returns something other than None, re-checking at
        every notification for ``index_id``; None once ``timeout`` seconds have passed."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + max(0.0, timeout)
        while True:
            ev = self._events.get(index_id)
            if ev is None:
                ev = self._events[index_id] = asyncio.Event()
            # The check itself is bounded too: off the loop it can queue behind a slice lock
            # (a stabilise's fsync, a slice drop), and an unbounded check made the scan
            # outlive its own timeout. It gets at least CHECK_FLOOR seconds, so a scan with
            # no wait (timeout 0) still looks once.
            try:
                result = await asyncio.wait_for(check(), max(deadline - loop.time(), CHECK_FLOOR))
            except TimeoutError:
                return None
            if result is not None:
                return result
            remaining = deadline - loop.time()
            if remaining <= 0:
                return None
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(ev.wait(), remaining)


def common_snapshot_ts(slices: Sequence[Any]) -> Timestamp | None:
    """The newest TS at which every slice of ``slices`` keeps a snapshot (thread-safe; call
    it off the event loop: each slice's lock may be held by a stabilise's fsync)."""
    if len(slices) == 1:  # the common single-slice read: its newest snapshot
        own = slices[0].snapshot_timestamps()
        return own[-1] if own else None
    rings = [s.snapshot_timestamps() for s in slices]
    if all(rings):
        # The common case: one stabilise round made every slice's newest snapshot, so the
        # newest TSs are equal - one comparison per slice instead of hashing and
        # intersecting every ring (each comparison of two 64-partition TSs is ~5 us).
        newest = rings[0][-1]
        if all(r[-1] is newest or r[-1] == newest for r in rings[1:]):
            return newest
    common: set[Timestamp] | None = None
    order: list[Timestamp] = []
    for tss in rings:
        if not order:
            order = tss
        common = set(tss) if common is None else common & set(tss)
    for t in reversed(order):
        if common and t in common:
            return t
    return None


def behind_details(have: Timestamp | None, wanted: Timestamp) -> dict[str, list[int]]:
    """Per data partition the slices lag in: ``{"p": [wanted seqno, held seqno]}`` (a held
    entry on another history branch counts as 0)."""
    out: dict[str, list[int]] = {}
    held = have if have is not None else Timestamp()
    for p, e in wanted.items():
        mine = held.get(p)
        got = mine.seqno if mine is not None and mine.uuid == e.uuid else 0
        if e.seqno > 0 and got < e.seqno:
            out[str(p)] = [e.seqno, got]
    return out


def scan_timeout(
    index_id: str, node: str, have: Timestamp | None, wanted: Timestamp, timeout: float
) -> ShardexError:
    behind = behind_details(have, wanted)
    total = sum(w - h for w, h in behind.values())
    shown = dict(list(behind.items())[:32])
    return ShardexError(
        f"index {index_id} on {node} did not reach the scan's timestamp within {timeout}s: "
        f"{total} mutation(s) behind in {len(behind)} partition(s) "
        + ", ".join(f"p{p} wants {w} has {h}" for p, (w, h) in list(behind.items())[:5]),
        code=ErrorCode.SCAN_TIMEOUT,
        details={
            "index": index_id,
            "node": node,
            "timeout": timeout,
            "behind": shown,
            "mutations_behind": total,
            "partitions_behind": len(behind),
            "have": None if have is None else have.to_json(),
            "hint": "is the index pipeline running? (shardex pipeline / cluster status)",
        },
    )
