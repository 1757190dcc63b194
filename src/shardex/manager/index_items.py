"""An index's entry count kept current in the coordinator state (``RecordIndexItems``).

``IndexRecord.items_count`` weighs an index's slices for placement and the index rebalance
(``meta/slice_weight.py``, decisions/0147). The build writes it (``IndexBuildProgress``,
``MarkIndexActive``); after that only the stability rounds see the index grow or shrink: the
timekeeper sums each round's acknowledged entries (``check_acks``, the
``StabilityAdvanced.items_count`` it answers), in its own memory. A plan made from one
master's memory would differ after a failover, so the count has to reach the replicated state,
but not every round (a few a second): ``ItemsRecorder`` asks the master to record an ACTIVE
index's count when it differs from the recorded one by more than ``ITEMS_DRIFT`` of it, and
for one index no more often than once per ``ITEMS_INTERVAL`` seconds. A smaller drift is
left: the weights are an estimate, and drift that adds up crosses the threshold.

The op (``IndexDDL.record_items``) commits only for an ACTIVE index whose count changed: while
BUILDING the build writes the count itself, and a request decided on a lagging replica of the
state is harmless.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from typing import Any, Final

from shardex.api.index_ddl import RecordIndexItems
from shardex.errors import ShardexError
from shardex.meta.index_state import ACTIVE
from shardex.meta.state import StateContext

__all__ = ["ITEMS_DRIFT", "ITEMS_INTERVAL", "ItemsRecorder", "drifted"]

log = logging.getLogger(__name__)

# A tenth: an index's weight moves the plan only when its share of the load changes visibly.
ITEMS_DRIFT: Final = 0.1
# Seconds between two writes of one index's count, however fast it changes.
ITEMS_INTERVAL: Final = 30.0


def drifted(recorded: int, measured: int, drift: float = ITEMS_DRIFT) -> bool:
    """Whether ``measured`` entries differ from the ``recorded`` ones by more than ``drift``
    of them (any count differs from an unmeasured 0)."""
    return abs(measured - recorded) > drift * recorded


class ItemsRecorder:
    """The timekeeper's side: ``observe`` each published round's counts; a drifted index's
    count goes to the master in the background (the round's reply does not wait for it)."""

    def __init__(
        self,
        coordinator: Callable[[], Any | None],
        *,
        drift: float = ITEMS_DRIFT,
        interval: float = ITEMS_INTERVAL,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._coordinator = coordinator
        self.drift = drift
        self.interval = interval
        self._clock = clock
        self._asked: dict[str, float] = {}  # index id -> when its count was last sent
        self._tasks: dict[str, asyncio.Task[None]] = {}

    def observe(self, state: StateContext, counts: dict[str, int]) -> None:
        now = self._clock()
        for index_id in [i for i in self._asked if i not in state.indexes]:
            del self._asked[index_id]  # dropped: forget it
        for index_id, items in sorted(counts.items()):
            rec = state.indexes.get(index_id)
            if rec is None or rec.state != ACTIVE or index_id in self._tasks:
                continue
            if not drifted(rec.items_count, items, self.drift):
                continue
            asked = self._asked.get(index_id)
            if asked is not None and now - asked < self.interval:
                continue
            self._asked[index_id] = now
            task = asyncio.create_task(self._send(index_id, rec.items_count, items))
            self._tasks[index_id] = task

    async def _send(self, index_id: str, recorded: int, items: int) -> None:
        try:
            coord = self._coordinator()
            if coord is None:
                return
            await coord.submit(RecordIndexItems(index_id=index_id, items_count=items))
            log.debug("index %s: items_count %d -> %d recorded", index_id, recorded, items)
        except ShardexError as exc:  # the next drifted round after the interval retries
            log.info("index %s: recording items_count %d failed: %s", index_id, items, exc)
        except Exception:  # a bug must not surface in a later round
            log.exception("index %s: recording items_count", index_id)
        finally:
            del self._tasks[index_id]

    async def drain(self) -> None:
        """Return once every count sent so far has been answered (for tests)."""
        while self._tasks:
            await asyncio.gather(*self._tasks.values(), return_exceptions=True)

    async def stop(self) -> None:
        tasks = list(self._tasks.values())
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
