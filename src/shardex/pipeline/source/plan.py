"""Planning micro-batches of the change source: ranges, task grouping, read limits.

Pure functions of timestamps and the owner map, so the planning rules are tested without
Spark or a cluster. Seqnos are dense per partition (every mutation takes the next one and
the change log keeps them all above the purge seqno), so the number of records in
(start, end] is ``end - start`` and a row limit can be cut exactly.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from shardex.core.timestamp import SeqnoEntry, Timestamp
from shardex.pipeline.source.types import PartitionRange, rollback_error

_NOTHING = SeqnoEntry(0, 0)


def plan_ranges(keyspace: str, start: Timestamp, end: Timestamp) -> list[PartitionRange]:
    """One range per partition of ``end`` with records after ``start`` (a partition absent
    from ``start`` starts at 0). An end below its start cannot be read: ROLLBACK."""
    out: list[PartitionRange] = []
    for p, e in end.items():
        s = start.get(p, _NOTHING)
        if e.seqno < s.seqno:
            raise rollback_error(
                keyspace,
                p,
                e.seqno,
                f"partition {p} of {keyspace!r}: end seqno {e.seqno} is below start {s.seqno}",
            )
        if e.seqno > s.seqno:
            out.append(PartitionRange(p, s.seqno, s.uuid, e.seqno, e.uuid))
    return out


def group_ranges(
    ranges: Sequence[PartitionRange], owners: Mapping[int, str], tasks: str | int
) -> list[list[PartitionRange]]:
    """Ranges per Spark task. ``owner``: one task per owner node (its streams share one
    connection and open concurrently); ``partition``: one task each; N: at most N tasks
    balanced by record count (greedy, largest first)."""
    if not ranges:
        return []
    if tasks == "partition":
        return [[r] for r in ranges]
    if tasks == "owner":
        by_owner: dict[str, list[PartitionRange]] = {}
        for r in ranges:
            by_owner.setdefault(owners.get(r.partition, ""), []).append(r)
        return [by_owner[o] for o in sorted(by_owner)]
    n = max(1, min(int(tasks), len(ranges)))
    bins: list[list[PartitionRange]] = [[] for _ in range(n)]
    loads = [0] * n
    for r in sorted(ranges, key=lambda r: (-r.count, r.partition)):
        i = loads.index(min(loads))
        bins[i].append(r)
        loads[i] += r.count
    return [sorted(b, key=lambda r: r.partition) for b in bins if b]


def limit_offsets(start: Timestamp, end: Timestamp, max_rows: int) -> Timestamp:
    """``end`` cut so that at most ``max_rows`` records lie in (start, end], shared fairly
    (water-filling: small backlogs are taken whole, the rest split evenly), so one busy
    partition cannot starve the others."""
    backlog = {p: e.seqno - start.get(p, _NOTHING).seqno for p, e in end.items()}
    total = sum(n for n in backlog.values() if n > 0)
    if total <= max_rows:
        return end
    grant: dict[int, int] = {}
    budget = max_rows
    waiting = sorted((n, p) for p, n in backlog.items() if n > 0)
    while waiting:
        share = budget // len(waiting)
        n, p = waiting[0]
        if n <= share:
            grant[p] = n
            budget -= n
            waiting.pop(0)
            continue
        # Everyone left wants more than the fair share: give it, and the remainder one by
        # one in partition order (deterministic).
        extra = budget - share * len(waiting)
        for i, (_, q) in enumerate(sorted(waiting, key=lambda x: x[1])):
            grant[q] = share + (1 if i < extra else 0)
        break
    out: dict[int, SeqnoEntry] = {}
    for p, e in end.items():
        s = start.get(p, _NOTHING)
        g = grant.get(p, 0)
        if g >= backlog[p]:
            out[p] = e
        elif g == 0:
            out[p] = s if p in start else SeqnoEntry(0, 0)
        else:
            # Part of the backlog: the cut point is on the branch the end was observed on.
            out[p] = SeqnoEntry(s.seqno + g, e.uuid)
    return Timestamp(out)
