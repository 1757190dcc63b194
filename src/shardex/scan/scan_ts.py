"""The TSs a scan's slices were read at, as the scan coordinator settles them.

Every indexer node answers ``ScanSlices`` with the stability TS it read (a 64-partition
timestamp is ~900 bytes on the wire; converting one into a ``Timestamp`` costs ~30 us and
comparing two ~5 us on this machine), and the coordinator's own slices hand over theirs
in-process. In the common case they all read one snapshot, so ``one_object_per_ts`` makes
equal TSs one object - the coordinator then compares by identity - and ``oldest_common``
picks the TS to pin when they differ.
"""

from __future__ import annotations

from typing import TypeVar

from shardex.core.timestamp import Timestamp
from shardex.scan.messages import WireTs

__all__ = ["oldest_common", "one_object_per_ts"]

N = TypeVar("N")
S = TypeVar("S")


def oldest_common(tss: list[Timestamp]) -> Timestamp:
    """The TS every other one covers (the oldest of one history); without one (diverged
    branches), the one with the fewest seqnos: its snapshot errors tell the caller."""
    for t in tss:
        if all(o.covers(t) for o in tss):
            return t
    return min(tss, key=lambda t: sum(e.seqno for e in t.values()))


def one_object_per_ts(
    opened: list[tuple[N, Timestamp | WireTs | None, S]],
) -> list[tuple[N, Timestamp | None, S]]:
    """``opened`` with every node's TS as a ``Timestamp``, equal TSs as one object: a wire
    TS equal to one already held (the local read's own, or an earlier node's) is that
    object. The nodes of a scan read one snapshot in the common case, so this converts
    none or one 64-partition TS (~30 us each) instead of one per node, and the caller
    compares them by identity."""
    held: list[tuple[WireTs, Timestamp]] = [
        (ts.to_wire(), ts) for _, ts, _ in opened if isinstance(ts, Timestamp)
    ]
    out: list[tuple[N, Timestamp | None, S]] = []
    for node, ts, src in opened:
        if ts is not None and not isinstance(ts, Timestamp):
            same = next((t for w, t in held if w == ts), None)
            if same is None:
                same = Timestamp.from_wire(ts)
                held.append((ts, same))
            ts = same
        out.append((node, ts, src))
    return out
