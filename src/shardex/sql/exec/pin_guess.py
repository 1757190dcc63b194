"""request_plus at the TS this node pinned last, while the high-seqno round is out.

A request_plus statement whose leaves are not all on this node pins one TS before its
leaves start (``stability.py``: a round to the leaves' nodes, the high seqnos riding in it),
so two round trips pass before the first row. A keyspace the pipeline keeps up with and
nobody writes to has the same TS to pin statement after statement. So the node remembers,
per index, the TS its last statement pinned (``PinGuesses``) and starts the next request_plus
statement at it at once, with only the node's shared high-seqno round out
(``ClusterView.shared_high_seqnos``: seqnos read after the statement arrived), the first
chunk of rows held back. When the round answers and the guess covers it, the guess is a TS
the statement could have pinned: every leaf holds a snapshot at it (it was pinned, and
nothing was written since, so no newer round replaced it) and it holds every write
acknowledged before the statement arrived; the rows stand. When it does not, or a leaf
cannot read at it, the run is dropped unread and the statement pins as without a guess.

A keyspace under writes misses every guess (its seqnos moved), so after a miss the index is
not guessed for ``MISS_BACKOFF`` seconds: at most one wasted run per index per backoff.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections import OrderedDict
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Final

from shardex.api.scan import REQUEST_PLUS
from shardex.core.timestamp import Timestamp
from shardex.errors import ShardexError
from shardex.sql.exec.local_leaf import after_first, drop_unread
from shardex.sql.exec.plan import PhysicalPlan

__all__ = ["MISS_BACKOFF", "PinGuesses", "run_at_guess"]

MISS_BACKOFF: Final = 1.0  # seconds without guessing an index after a miss
GUESSES_MAX: Final = 1024  # indexes remembered (least recently pinned dropped first)

Chunks = AsyncIterator[list[bytes]]


class PinGuesses:
    """Per index id: the TS last pinned for a statement on this node, and until when it is
    not guessed (after a miss). Loop-only."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._pinned: OrderedDict[str, Timestamp] = OrderedDict()
        self._quiet_until: dict[str, float] = {}

    def guess(self, index_id: str) -> Timestamp | None:
        ts = self._pinned.get(index_id)
        if ts is None or self._clock() < self._quiet_until.get(index_id, 0.0):
            return None
        return ts

    def pinned(self, index_id: str, ts: Timestamp) -> None:
        self._pinned[index_id] = ts
        self._pinned.move_to_end(index_id)
        if len(self._pinned) > GUESSES_MAX:
            old, _ = self._pinned.popitem(last=False)
            self._quiet_until.pop(old, None)

    def missed(self, index_id: str) -> None:
        self._quiet_until[index_id] = self._clock() + MISS_BACKOFF

    async def try_run(
        self,
        plan: PhysicalPlan,
        level: str,
        tuning: dict[str, bool],
        seqnos: Callable[[str], Awaitable[Timestamp]],
        run: Callable[[Timestamp], Awaitable[Chunks]],
    ) -> Chunks | None:
        """``plan`` run by ``run(ts)`` at the TS last pinned for its index, when it is a
        request_plus plan with leaves (``pin_guess`` on) and that TS covers ``seqnos(its
        keyspace)`` read meanwhile; ``plan.guessed`` says so. None: pin as usual."""
        if level != REQUEST_PLUS or not tuning["pin_guess"] or not plan.leaves:
            return None
        if plan.record is None or plan.keyspace is None:
            return None
        index_id, keyspace = plan.record.id, plan.keyspace
        guess = self.guess(index_id)
        if guess is None:
            return None
        chunks = await run_at_guess(guess, lambda: seqnos(keyspace), lambda: run(guess))
        if chunks is None:
            self.missed(index_id)
            return None
        plan.guessed = guess
        return chunks


async def run_at_guess(
    guess: Timestamp,
    seqnos: Callable[[], Awaitable[Timestamp]],
    start: Callable[[], Awaitable[Chunks]],
) -> Chunks | None:
    """The statement's rows read at ``guess`` (``start()`` runs it there), when ``guess``
    covers ``seqnos()`` (the high seqnos read after the statement arrived, asked at once)
    and the run's first chunk is read; None when the guess is not one the statement may
    read at, the run dropped unread. Errors of ``seqnos`` are the caller's."""
    round_trip = asyncio.ensure_future(seqnos())
    try:
        chunks = await start()
    except ShardexError:  # e.g. a leaf's member known down: the plain path handles it
        await _cancelled(round_trip)
        return None
    except BaseException:
        await _cancelled(round_trip)
        raise
    first = asyncio.ensure_future(anext(chunks, None))
    try:
        wait_for = await round_trip
    except BaseException:
        await drop_unread(first, chunks)
        raise
    if not guess.covers(wait_for):
        await drop_unread(first, chunks)
        return None
    try:
        await first  # a leaf that no longer holds the guess's snapshot fails here
    except ShardexError:
        await drop_unread(first, chunks)
        return None
    return after_first(first, chunks)


async def _cancelled(task: asyncio.Future[Timestamp]) -> None:
    task.cancel()
    with contextlib.suppress(BaseException):
        await task
