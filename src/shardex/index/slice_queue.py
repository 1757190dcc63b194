"""A slice's queue: the key versions delivered to it and not applied yet, per data partition.

``Slice`` (``slice.py``) keeps one and decides and writes what it takes out; the queue only
keeps what waits. It has no lock of its own: every call is made under the slice's lock.

* **Idempotent delivery.** ``add`` drops a key version whose seqno is at or below its data
  partition's floor (the applied seqno, or T0 while a build loads) or that is queued already:
  one mutation yields at most one key version per slice.
* ``high``: per data partition, the highest seqno queued (its high-water mark).
* ``unordered``: the data partitions whose queue was not filled in ascending seqno order (a
  re-delivery or a late frame): taking from them compares seqnos per docid. Every other
  queue is in seqno order, so its newest version per docid is simply the last one.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from operator import itemgetter

from shardex.core.timestamp import Timestamp
from shardex.index.keyversion import KeyVersion

__all__ = ["Queued", "SliceQueue", "Taken"]

# A queued key version is the router's row itself (kept, not copied into a new tuple):
# (index_id, index_partition, kind, entry, docid, partition, seqno).
Queued = KeyVersion
# What a stabilise took: per data partition, the seqnos taken (None: the whole queue).
Taken = list[tuple[int, list[int] | None]]
_DOCID = itemgetter(4)


class SliceQueue:
    """Queued key versions of one slice: data partition -> seqno -> version."""

    __slots__ = ("by_partition", "high", "unordered")

    def __init__(self) -> None:
        self.by_partition: dict[int, dict[int, Queued]] = {}
        self.high: dict[int, int] = {}
        self.unordered: set[int] = set()

    def __len__(self) -> int:
        return sum(len(q) for q in self.by_partition.values())

    def add(
        self, rows: Iterable[KeyVersion], floor_ts: Timestamp
    ) -> tuple[list[Queued], int, bool]:
        """Queue the versions of ``rows`` above ``floor_ts`` and not queued yet. Returns (the
        versions queued, how many were dropped, whether every one queued came above its
        partition's high-water mark)."""
        queue, hwm, unordered = self.by_partition, self.high, self.unordered
        floors: dict[int, int] = {}
        dropped = 0
        # Rows usually come in runs of one data partition (a batch is read partition by
        # partition and the router keeps the order): the partition's queue, floor and
        # high-water mark are looked up once per run, not once per row.
        cur = -1
        q: dict[int, Queued] = {}
        floor = top = 0
        added: list[Queued] = []
        ordered = True  # every queued row above its partition's high-water mark
        for row in rows:
            part, seqno = row[5], row[6]
            if part != cur:
                if cur >= 0:
                    hwm[cur] = top
                cur = part
                got = queue.get(part)
                if got is None:
                    got = queue[part] = {}
                q = got
                floor = floors.get(part, -1)
                if floor < 0:
                    floor = floors[part] = floor_ts.seqno(part)
                top = hwm.get(part, 0)
            if seqno <= floor or seqno in q:
                dropped += 1
                continue
            q[seqno] = row
            added.append(row)
            if seqno > top:
                top = seqno
            else:
                unordered.add(part)
                ordered = False
        if cur >= 0:
            hwm[cur] = top
        return added, dropped, ordered

    def holds(self, partition: int) -> bool:
        """Whether versions of data partition ``partition`` are queued."""
        return bool(self.by_partition.get(partition))

    def drop_above(self, partition: int, seqno: int) -> int:
        """Forget the versions of data partition ``partition`` above ``seqno``; returns how
        many."""
        q = self.by_partition.get(partition)
        if not q:
            return 0
        gone = [s for s in q if s > seqno]
        for s in gone:
            del q[s]
        # What is left is a prefix of what was there: still ordered if it was.
        self.high[partition] = max(q, default=0)
        return len(gone)

    def drop_upto(self, ts: Timestamp) -> None:
        """Forget the versions ``ts`` covers (a build loaded them)."""
        for part, q in self.by_partition.items():
            lim = ts.seqno(part)
            for s in [s for s in q if s <= lim]:
                del q[s]

    def clear(self) -> None:
        self.by_partition.clear()
        self.high.clear()
        self.unordered.clear()

    def runs(self) -> Iterator[tuple[list[Queued], bool]]:
        """Each data partition's queued versions, with whether they are in seqno order."""
        unordered = self.unordered
        for part, q in self.by_partition.items():
            if q:
                yield list(q.values()), part not in unordered

    def covered_by(self, ts: Timestamp) -> bool:
        """Whether ``ts`` covers every queued version (a stabilise takes the whole queue)."""
        hwm = self.high
        return all(
            p in ts and hwm.get(p, 0) <= ts[p].seqno for p, q in self.by_partition.items() if q
        )

    def take_all(self) -> tuple[Taken, int]:
        """The whole queue, for ``remove``, and how many versions it holds."""
        taken: Taken = [(p, None) for p, q in self.by_partition.items() if q]
        return taken, sum(len(q) for q in self.by_partition.values())

    def take(self, ts: Timestamp) -> tuple[Taken, int, dict[str, Queued]]:
        """The queued versions with ``seqno <= ts[p]``: (what ``remove`` drops at the
        commit, how many, docid -> its newest version)."""
        latest: dict[str, Queued] = {}  # docid -> its newest version up to ts
        taken: Taken = []
        n_taken = 0
        for part, q in self.by_partition.items():
            lim = ts[part].seqno if part in ts else 0
            if not q or lim == 0:
                continue
            ordered = part not in self.unordered
            rows: Iterable[Queued]
            if self.high.get(part, 0) <= lim:
                rows = q.values()
                taken.append((part, None))
                n_taken += len(q)
            else:
                seqnos: list[int] = []
                if ordered:  # the versions up to lim are a prefix of the queue
                    for s in q:
                        if s > lim:
                            break
                        seqnos.append(s)
                else:
                    seqnos = [s for s in q if s <= lim]
                rows = [q[s] for s in seqnos]
                taken.append((part, seqnos))
                n_taken += len(seqnos)
            # A docid lives in one data partition, so partitions never compete for it.
            if ordered:  # ascending seqnos: the last version of a docid is its newest
                latest.update(zip(map(_DOCID, rows), rows, strict=True))
            else:
                for row in rows:
                    cur = latest.get(row[4])
                    if cur is None or row[6] > cur[6]:
                        latest[row[4]] = row
        return taken, n_taken, latest

    def remove(self, taken: Taken) -> list[object]:
        """Drop what a committed stabilise took; returns the partitions' queues emptied
        whole, for the caller to free off its critical path."""
        retired: list[object] = []
        for part, seqnos in taken:
            if seqnos is None:
                retired.append(self.by_partition.pop(part, None))
                self.unordered.discard(part)
            else:
                q = self.by_partition[part]
                for s in seqnos:
                    del q[s]
        return retired
