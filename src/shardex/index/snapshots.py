"""The ring of a slice's last K snapshots, each labelled with its stability TS.

Kept apart from the slice because its rules are the scan-flow seed's: a scan at a TS gets the
snapshot with exactly that TS; one the slice has passed and released is ``SNAPSHOT_TOO_OLD``,
one it has not reached is ``INDEX_NOT_READY`` (the scan service decides whether to wait).
Not thread-safe by itself: the owning slice's lock guards it.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable

from shardex.core.timestamp import Timestamp
from shardex.errors import ErrorCode, ShardexError
from shardex.storage import StoreSnapshot

__all__ = ["SnapshotRing"]


class SnapshotRing:
    def __init__(self, keep: int, name: str) -> None:
        self.keep = max(1, keep)
        self.name = name
        self._ring: deque[tuple[Timestamp, StoreSnapshot]] = deque()

    def add(self, ts: Timestamp, take: Callable[[], StoreSnapshot]) -> None:
        """Take a snapshot labelled ``ts``; release the oldest beyond ``keep``."""
        self._ring.append((ts, take()))
        while len(self._ring) > self.keep:
            self._ring.popleft()[1].release()

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

    def release_all(self) -> None:
        while self._ring:
            self._ring.popleft()[1].release()
