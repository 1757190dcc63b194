"""Read-ahead: the next micro-batch's changes, read and projected while Spark commits this one.

When a batch has been read and projected on the driver, the changes after its end are
already in the change log (written while the batch ran). ``ReadAhead.start`` reads them up to
the current high seqnos (capped like a batch, ``limit_offsets``) and projects them on a
thread, while the batch's round runs and Spark writes its commit log, asks for the next
offsets and logs them. The next batch ``take``s what falls inside its own range and reads
only the rest.

Why it is exact: a batch (S, E] needs, per partition p, the key versions of the records
(S[p], E[p]] on the branch E[p].uuid, projected with the batch's definitions. The read-ahead
holds the records (S[p], A[p]] on branch A[p].uuid, projected with the definitions it was
started with. ``take`` uses them only if S is the batch's start, the definitions are the
same, and for partition p only if A[p].uuid == E[p].uuid (the same branch: the same
records); it keeps the rows with seqno <= min(A[p], E[p]) and returns that TS as ``covered``,
so the batch reads (covered, E] itself. Anything else (views changed, a rollback or failover
changed a uuid, no read-ahead) falls back to reading the whole range.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from shardex.core.timestamp import SeqnoEntry, Timestamp
from shardex.index.definition import IndexDefinition
from shardex.index.keyversion import KeyVersion
from shardex.pipeline.gcpause import gc_paused
from shardex.pipeline.source_plan import limit_offsets

__all__ = ["ReadAhead"]

log = logging.getLogger(__name__)

Reader = Callable[[Sequence[IndexDefinition], Timestamp, Timestamp], list[KeyVersion]]


@dataclass
class _Ahead:
    defs: tuple[IndexDefinition, ...]
    start: Timestamp
    end: Timestamp
    rows: list[KeyVersion]


class ReadAhead:
    """At most one read-ahead at a time; ``take`` consumes it. Not thread-safe beyond that
    (the maintenance job calls both under its batch lock)."""

    def __init__(self, read: Reader, latest: Callable[[], Timestamp], max_changes: int) -> None:
        self._read = read
        self._latest = latest
        self.max_changes = max_changes
        self._thread: threading.Thread | None = None
        self._ahead: _Ahead | None = None
        self.hits = 0  # batches that took rows from a read-ahead
        self.misses = 0  # batches that found none usable

    def start(self, defs: Sequence[IndexDefinition], start: Timestamp) -> None:
        """Read and project (start, high seqnos now] for ``defs`` on a daemon thread."""
        self.discard()
        frozen = tuple(defs)

        def run() -> None:
            try:
                end = _not_below(self._latest(), start)
                if self.max_changes > 0:
                    end = limit_offsets(start, end, self.max_changes)
                if end == start:
                    return
                with gc_paused():
                    rows = self._read(frozen, start, end)
                self._ahead = _Ahead(frozen, start, end, rows)
            except Exception as exc:  # a read-ahead is an optimisation: the batch reads itself
                log.debug("read-ahead from %r failed: %s", start, exc)

        self._thread = threading.Thread(target=run, name="read-ahead", daemon=True)
        self._thread.start()

    def take(
        self, defs: Sequence[IndexDefinition], start: Timestamp, end: Timestamp
    ) -> tuple[list[KeyVersion], Timestamp] | None:
        """The read-ahead's key versions inside (start, end] and the TS they cover (the
        batch reads (covered, end] itself); None when none is usable."""
        self._join()
        ahead, self._ahead = self._ahead, None
        if ahead is None or ahead.start != start or ahead.defs != tuple(defs):
            self.misses += 1
            return None
        covered: dict[int, SeqnoEntry] = {}
        upto: dict[int, int] = {}
        for p, e in end.items():
            a = ahead.end.get(p)
            s = start.get(p, SeqnoEntry(0, 0))
            if a is not None and a.uuid == e.uuid and a.seqno > s.seqno:
                top = min(a.seqno, e.seqno)
                covered[p] = SeqnoEntry(top, e.uuid)
                upto[p] = top
            else:
                covered[p] = s  # this partition is read in full by the batch
        rows = [r for r in ahead.rows if r[6] <= upto.get(r[5], -1)]
        self.hits += 1
        return rows, Timestamp(covered)

    def discard(self) -> None:
        self._join()
        self._ahead = None

    def _join(self) -> None:
        thread, self._thread = self._thread, None
        if thread is not None:
            thread.join()


def _not_below(ts: Timestamp, start: Timestamp) -> Timestamp:
    """``ts`` with every partition at least at ``start`` (a partition whose high seqno is
    behind the stream is not read ahead: the batch finds out what happened to it)."""
    out = dict(ts.items())
    for p, s in start.items():
        e = out.get(p)
        if e is None or e.seqno < s.seqno:
            out[p] = s
    return Timestamp(out)
