"""Read-ahead: the next micro-batch's changes, read and projected while Spark commits this one.

When a batch has been read and projected on the driver, the changes after its end are
already in the change log (written while the batch ran). ``ReadAhead.start`` reads them up to
the current high seqnos (capped like a batch, ``limit_offsets``) and projects them on a
thread, while the batch's round runs and Spark writes its commit log, asks for the next
offsets and logs them. The next batch ``take``s what falls inside its own range and reads
only the rest; what lies beyond its end is carried over to the next read-ahead (same
definitions, same branch).

Rolling (``rolling=True``, with stability rounds between batches, ``rounds/between.py``):
until the next batch ``take``s, the thread keeps reading from where it ended up to the new
high seqnos, a piece at a time (at least ``min_piece`` changes or ``piece_interval`` seconds
apart, at most ``max_piece`` changes, never past the batch cap), and hands what it holds to
``deliver`` as it goes, which starts a round (everything read so far, the stabilise at
its end, the publish) on a thread of its own while the next piece is read and drops the rows
of a round published for every index (``Ahead.start`` moves to its end).
With nothing new it looks less often (``next_pause``: at most once per piece interval), and
a batch that Spark starts meanwhile (its trigger saw the offsets move) ``wake``s it at once.

Why it is exact: a batch (S, E] needs, per partition p, the key versions of the records
(S[p], E[p]] on the branch E[p].uuid, projected with the batch's definitions. The read-ahead
holds the records (S[p], A[p]] on branch A[p].uuid (each piece's reader checks the records
are on its end's branch, and a piece never extends a partition whose rows are held onto
another uuid), projected with the definitions it was started with. ``take`` uses them only
if S is the batch's start, the definitions are the same, and for partition p only if
A[p].uuid == E[p].uuid (the same branch: the same records); it keeps the rows with seqno <=
min(A[p], E[p]) and returns that TS as ``covered``, so the batch reads (covered, E] itself.
Anything else (views changed, a rollback or failover changed a uuid, no read-ahead) falls
back to reading the whole range.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from shardex.core.gcpause import gc_paused
from shardex.core.timestamp import SeqnoEntry, Timestamp
from shardex.index.keyversion import KeyVersion
from shardex.meta.index_definition import IndexDefinition
from shardex.pipeline.source.plan import limit_offsets

__all__ = ["Ahead", "ReadAhead", "Taken", "next_pause"]

log = logging.getLogger(__name__)

Reader = Callable[[Sequence[IndexDefinition], Timestamp, Timestamp], list[KeyVersion]]
_ZERO = SeqnoEntry(0, 0)


@dataclass
class Ahead:
    """The key versions of (start, end] in read order (piece after piece)."""

    defs: tuple[IndexDefinition, ...]
    start: Timestamp
    end: Timestamp
    rows: list[KeyVersion]


@dataclass
class Taken:
    """What a batch (S, E] gets from the read-ahead: ``rows`` inside (S, ``covered``]."""

    rows: list[KeyVersion]
    covered: Timestamp


# deliver(ahead, stop, wait): hand on what was read (a round between batches), waiting at
# most ``wait`` seconds for what must come first; False once it gives up for this read-ahead.
Deliver = Callable[[Ahead, threading.Event, float], bool]


class ReadAhead:
    """At most one read-ahead at a time; ``take`` consumes it. Not thread-safe beyond that
    (the maintenance job calls ``start``, ``take`` and ``discard`` under its batch lock; the
    thread alone touches the ``Ahead`` until ``take`` has stopped it)."""

    def __init__(
        self,
        read: Reader,
        latest: Callable[[], Timestamp],
        max_changes: int,
        *,
        rolling: bool = False,
        pause: float = 0.05,
        max_pause: float = 0.4,
        min_piece: int = 500,
        piece_interval: float | None = None,
        max_piece: int = 0,
    ) -> None:
        self._read = read
        self._latest = latest
        self.max_changes = max_changes
        self.rolling = rolling
        self.pause = pause
        self.max_pause = max_pause
        self.min_piece = min_piece
        # Rolling: a piece smaller than ``min_piece`` is read too once this many seconds
        # passed since the last one (None: only ``min_piece`` decides). Each piece is a read
        # of every partition, so pieces stay this far apart at the least.
        self.piece_interval = piece_interval
        # Rolling: the most changes one piece reads (0: up to the cap on what is held). With
        # rounds between batches a round takes what was read while the last one ran, so
        # a backlog read in pieces of at most half the cap is read beside the rounds instead
        # of in turn with them (a piece of the whole cap leaves nothing to read until its
        # round ended: ``docs/decisions/0077-streamed-rounds-and-sustained-drain.md``).
        self.max_piece = max_piece
        self.on_end: Callable[[], None] | None = None  # called as the thread ends
        self._thread: threading.Thread | None = None
        self._stop = threading.Event()
        # Set by ``wake`` (and by a halt): an idle poll's pause ends at once.
        self._wake = threading.Event()
        self._ahead: Ahead | None = None
        self._carried: Ahead | None = None  # rows beyond the last batch's end
        self.hits = 0  # batches that took rows from a read-ahead
        self.misses = 0  # batches that found none usable
        self.pieces = 0  # pieces read
        self.piece_reads: list[tuple[int, float]] = []  # the last pieces' (changes, seconds)

    def start(
        self,
        defs: Sequence[IndexDefinition],
        start: Timestamp,
        deliver: Deliver | None = None,
    ) -> None:
        """Read and project (start, high seqnos now] for ``defs`` on a daemon thread (and
        keep rolling if configured), continuing what the last ``take`` carried over when it
        starts at ``start`` with the same definitions."""
        carried, self._carried = self._carried, None
        self.discard()
        frozen = tuple(defs)
        if carried is not None and carried.start == start and carried.defs == frozen:
            ahead = carried
        else:
            ahead = Ahead(frozen, start, start, [])
        self._ahead = ahead
        stop = self._stop = threading.Event()
        self._wake.clear()

        def run() -> None:
            try:
                self._read_on(ahead, stop, deliver)
            except Exception as exc:  # a read-ahead is an optimisation: the batch reads itself
                log.debug("read-ahead from %r failed: %s", ahead.end, exc)
            finally:
                if self.on_end is not None:
                    self.on_end()

        self._thread = threading.Thread(target=run, name="read-ahead", daemon=True)
        self._thread.start()

    def _read_on(self, ahead: Ahead, stop: threading.Event, deliver: Deliver | None) -> None:
        first = True
        pause = self.pause
        last_piece = time.monotonic()
        more = False  # the last piece was cut at ``max_piece``: a backlog, read on at once
        while not stop.is_set():
            if first or self.rolling:
                latest = target = _not_below(self._latest(), ahead.start)
                if self.max_changes > 0:
                    target = limit_offsets(ahead.start, target, self.max_changes)
                if self.rolling and self.max_piece > 0:
                    target = limit_offsets(ahead.end, target, self.max_piece)
                target = _same_branch(ahead, _not_below(target, ahead.end))
                n = _changes(ahead.end, target)
                due = self.piece_interval is not None and (
                    time.monotonic() - last_piece >= self.piece_interval
                )
                if n > 0 and (first or n >= self.min_piece or due):
                    t = time.perf_counter()
                    with gc_paused():
                        rows = self._read(ahead.defs, ahead.end, target)
                    ahead.rows.extend(rows)
                    ahead.end = target
                    self.pieces += 1
                    self.piece_reads.append((n, time.perf_counter() - t))
                    del self.piece_reads[:-200]
                    last_piece = time.monotonic()
                    pause = self.pause
                    more = self.max_piece > 0 and _changes(ahead.end, latest) > 0
                else:
                    more = False
                    since = time.monotonic() - last_piece
                    pause = next_pause(pause, self.max_pause, self.piece_interval, n, since)
                first = False
            # With more to read, a round in flight is not waited for (its successor starts
            # after the next piece); with nothing, ``deliver`` waits a little for it.
            hurry = more and self.rolling and not self._capped(ahead)
            if deliver is not None and not deliver(ahead, stop, 0.0 if hurry else self.pause):
                deliver = None  # it gave up (the round failed, an indexer restarted)
            reading = self.rolling and not self._capped(ahead)
            if not reading and (deliver is None or not ahead.rows):
                return
            # A batch saw new offsets (``wake``): the pause ends, the poll looks now.
            if reading and not hurry and self._wake.wait(pause):
                self._wake.clear()
                pause = self.pause

    def _capped(self, ahead: Ahead) -> bool:
        """The read-ahead holds as many changes as a batch may (no more is read)."""
        return self.max_changes > 0 and _changes(ahead.start, ahead.end) >= self.max_changes

    def take(
        self, defs: Sequence[IndexDefinition], start: Timestamp, end: Timestamp
    ) -> Taken | None:
        """The read-ahead's key versions inside (start, end] and the TS they cover (the
        batch reads (covered, end] itself); None when none is usable. Rows beyond ``end``
        on ``end``'s branch are kept for the next ``start`` at ``end``."""
        self._halt()
        ahead, self._ahead = self._ahead, None
        self._carried = None
        if ahead is None or ahead.start != start or ahead.defs != tuple(defs):
            self.misses += 1
            return None
        covered: dict[int, SeqnoEntry] = {}
        upto: dict[int, int] = {}
        for p, e in end.items():
            a = ahead.end.get(p)
            s = start.get(p, _ZERO)
            if a is not None and a.uuid == e.uuid and a.seqno > s.seqno:
                top = min(a.seqno, e.seqno)
                covered[p] = SeqnoEntry(top, e.uuid)
                upto[p] = top
            else:
                covered[p] = s  # this partition is read in full by the batch
        rows = [r for r in ahead.rows if r[6] <= upto.get(r[5], -1)]
        self._carried = _carry(ahead, end)
        self.hits += 1
        return Taken(rows, Timestamp(covered))

    def discard(self) -> None:
        self._halt()
        self._ahead = None
        self._carried = None

    def running(self) -> bool:
        """The thread is reading (or handing on what it read)."""
        thread = self._thread
        return thread is not None and thread.is_alive()

    def wake(self) -> None:
        """Poll the high seqnos now: Spark's trigger saw them move (a batch came), while
        this thread, idle, may be in a pause of up to ``max_pause``."""
        self._wake.set()

    def halt(self) -> None:
        """Stop the thread (waiting for what it is doing: a piece, or a stability round
        between batches) and keep what it read for ``take``."""
        self._halt()

    def _halt(self) -> None:
        self._stop.set()
        self._wake.set()
        thread, self._thread = self._thread, None
        if thread is not None:
            thread.join()


def next_pause(
    pause: float, max_pause: float, piece_interval: float | None, held: int, since: float
) -> float:
    """The pause before the next look at the high seqnos after one that read nothing:
    ``held`` changes are waiting for a piece, ``since`` seconds after the last one. Twice the
    last pause, at most ``max_pause``; with changes waiting, not past their piece's due; with
    none, no longer than a piece interval (an idle keyspace's first write is seen within one).
    Polling at once when a piece was overdue with nothing waiting, as it did, asked every
    10 ms on an idle keyspace: ~100 HighSeqnos a second per node (decision 0107)."""
    pause = min(max_pause, pause * 2)
    if piece_interval is None:
        return pause
    if held > 0:
        return min(pause, max(0.01, piece_interval - since))
    return min(pause, piece_interval)


def _carry(ahead: Ahead, end: Timestamp) -> Ahead | None:
    """What of ``ahead`` lies beyond ``end`` on ``end``'s branch, as a read-ahead starting at
    ``end``."""
    beyond: dict[int, int] = {}
    new_end: dict[int, SeqnoEntry] = {}
    for p, e in end.items():
        a = ahead.end.get(p)
        if a is not None and a.uuid == e.uuid and a.seqno > e.seqno:
            beyond[p] = e.seqno
            new_end[p] = a
        else:
            new_end[p] = e
    if not beyond:
        return None

    def keep(r: KeyVersion) -> bool:
        s = beyond.get(r[5])
        return s is not None and r[6] > s

    return Ahead(ahead.defs, end, Timestamp(new_end), [r for r in ahead.rows if keep(r)])


def _same_branch(ahead: Ahead, target: Timestamp) -> Timestamp:
    """``target`` with every partition whose held rows are on another uuid kept where it is
    (its rows stay on one branch; ``take`` compares that branch with the batch's)."""
    out: dict[int, SeqnoEntry] | None = None
    for p, t in target.items():
        a = ahead.end.get(p)
        if a is None or a.uuid == t.uuid or a.seqno <= ahead.start.seqno(p):
            continue
        if out is None:
            out = dict(target.items())
        out[p] = a
    return target if out is None else Timestamp(out)


def _changes(start: Timestamp, end: Timestamp) -> int:
    return sum(max(0, e.seqno - start.seqno(p)) for p, e in end.items())


def _not_below(ts: Timestamp, start: Timestamp) -> Timestamp:
    """``ts`` with every partition at least at ``start`` (a partition whose high seqno is
    behind the stream is not read ahead: the batch finds out what happened to it)."""
    out = dict(ts.items())
    for p, s in start.items():
        e = out.get(p)
        if e is None or e.seqno < s.seqno:
            out[p] = s
    return Timestamp(out)
