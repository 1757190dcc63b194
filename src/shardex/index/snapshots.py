"""The ring of a slice's last K snapshots, each labelled with its stability TS, and the
leases that keep older ones for paginated scans.

Kept apart from the slice because its rules are the scan-request flow's: a scan at a TS gets the
snapshot with exactly that TS; one the slice has passed and released is ``SNAPSHOT_TOO_OLD``,
one it has not reached is ``INDEX_NOT_READY`` (the scan service decides whether to wait).

Leases: a paginated scan that pins one stability TS over many pages leases that snapshot
(lease id + TTL, renewed by its pages, released when it ends). A snapshot older than the
newest K is kept while a live lease names it; at most ``max_leased`` such snapshots per
slice (a lease that would add one more is SNAPSHOT_TOO_OLD with a hint), so leases bound the
RocksDB versions held back. An expired lease keeps nothing: its snapshot goes at the next
trim and reads of it answer SNAPSHOT_TOO_OLD as without leases. Time comes from ``clock``
(injectable for tests). Not thread-safe by itself: the owning slice's lock guards it.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Final

from shardex.core.timestamp import Timestamp
from shardex.errors import ErrorCode, ShardexError
from shardex.storage import StoreSnapshot

__all__ = ["MAX_LEASED", "SnapshotRing"]

MAX_LEASED: Final = 8  # snapshots beyond the newest K that leases may keep, per slice


class SnapshotRing:
    def __init__(
        self,
        keep: int,
        name: str,
        *,
        max_leased: int = MAX_LEASED,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.keep = max(1, keep)
        self.name = name
        self.max_leased = max(0, max_leased)
        self._clock = clock
        self._ring: list[tuple[Timestamp, StoreSnapshot]] = []  # oldest first
        self._leases: dict[str, tuple[Timestamp, float]] = {}  # lease id -> (TS, expiry)

    def add(self, ts: Timestamp, take: Callable[[], StoreSnapshot]) -> None:
        """Take a snapshot labelled ``ts``; release the oldest beyond ``keep`` that no live
        lease holds."""
        self._ring.append((ts, take()))
        self._trim()

    def _trim(self) -> None:
        if not self._leases and len(self._ring) <= self.keep:
            return  # nothing to expire or release: every scan's ``at`` comes through here
        now = self._clock()
        for lease_id in [i for i, (_, exp) in self._leases.items() if exp <= now]:
            del self._leases[lease_id]
        leased = {t for t, _ in self._leases.values()}
        cut = len(self._ring) - self.keep
        kept: list[tuple[Timestamp, StoreSnapshot]] = []
        for i, (t, snap) in enumerate(self._ring):
            if i < cut and t not in leased:
                snap.release()
            else:
                kept.append((t, snap))
        self._ring = kept

    def has(self, ts: Timestamp) -> bool:
        return any(t == ts for t, _ in self._ring)

    def timestamps(self) -> list[Timestamp]:
        """Kept TSs, oldest first."""
        return [t for t, _ in self._ring]

    def latest(self) -> Timestamp | None:
        return self._ring[-1][0] if self._ring else None

    def __len__(self) -> int:
        return len(self._ring)

    def at(self, ts: Timestamp, applied: Timestamp) -> StoreSnapshot:
        """The snapshot labelled ``ts``; ``applied`` (the slice's applied TS) tells a passed
        TS (SNAPSHOT_TOO_OLD) from one not reached yet (INDEX_NOT_READY)."""
        self._trim()  # an expired lease's snapshot is gone
        for t, snap in reversed(self._ring):
            if t == ts:
                return snap
        if all(e.seqno <= applied.seqno(p) for p, e in ts.items()):
            raise ShardexError(
                f"slice {self.name} no longer has a snapshot at {ts!r}",
                code=ErrorCode.SNAPSHOT_TOO_OLD,
                details={"oldest": repr(self._ring[0][0]) if self._ring else None},
            )
        raise ShardexError(
            f"slice {self.name} has not reached {ts!r}",
            code=ErrorCode.INDEX_NOT_READY,
            details={"hint": "wait for the stability timestamp"},
        )

    # -- leases --------------------------------------------------------------------------------
    def lease(self, ts: Timestamp, lease_id: str, ttl: float, applied: Timestamp) -> float:
        """Lease (or renew) the snapshot at ``ts`` for ``ttl`` seconds under ``lease_id``;
        returns the expiry. SNAPSHOT_TOO_OLD when it is gone (an expired lease included) or
        when keeping it would exceed ``max_leased``; INDEX_NOT_READY when not reached."""
        if ttl <= 0:
            raise ShardexError(
                f"a snapshot lease needs a positive TTL, got {ttl!r}",
                code=ErrorCode.BAD_REQUEST,
                details={"ttl": ttl, "lease": lease_id},
            )
        self.at(ts, applied)  # trims, then: gone / not reached
        leased = {t for t, _ in self._leases.values()}
        # Every distinct leased TS counts, also one among the newest K: it stays once newer
        # snapshots push it out.
        if ts not in leased and len(leased) >= self.max_leased:
            raise ShardexError(
                f"slice {self.name} already keeps {len(leased)} leased snapshot(s), the "
                f"most it may; not leasing {ts!r}",
                code=ErrorCode.SNAPSHOT_TOO_OLD,
                details={
                    "lease": lease_id,
                    "max_leased": self.max_leased,
                    "hint": "too many pinned paginated scans at different TSs: restart the "
                    "scan later, or page with consistency not_bounded",
                },
            )
        expiry = self._clock() + ttl
        self._leases[lease_id] = (ts, expiry)
        return expiry

    def release_lease(self, lease_id: str) -> bool:
        """End a lease (unknown ids are fine: expired or never here); True if it was held."""
        held = self._leases.pop(lease_id, None) is not None
        self._trim()
        return held

    def leases(self) -> dict[str, tuple[Timestamp, float]]:
        return dict(self._leases)

    def lease_expiry(self) -> float | None:
        """When the last live lease expires (``clock`` time), None when none is live: a
        slice that moved away is kept until then (``slice_copy``)."""
        self._trim()
        return max((exp for _, exp in self._leases.values()), default=None)

    def release_all(self) -> None:
        for _, snap in self._ring:
            snap.release()
        self._ring = []
        self._leases.clear()
