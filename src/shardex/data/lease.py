"""The serving lease of a data node's copies of keyspaces with replicas.

A node may serve such a keyspace only while a majority of the managers hear it
(``Membership.majority_heard``): cut off, it stops before the majority can fail it over,
since automatic failover waits longer than the failure timeout. Hearing the majority again
is not enough to serve again: meanwhile the majority may have failed the node over, and the
node learns that only from the cluster state. So once the lease has lapsed, the node serves
again only after a reconcile whose state was fetched after the lease came back
(``reconciled``); regaining it asks for that reconcile at once (``on_regained``).

``watch`` samples the lease on a timer, so a lapse is seen even when no request arrives
during it (a lapse lasts at least the failure timeout; the timer is much shorter).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

log = logging.getLogger(__name__)

WATCH_INTERVAL = 0.1
# How long one look at the managers' majority answers ``check``: every client request asks,
# and a look sorts the member list. Far below the margin between the lease (the failure
# timeout) and automatic failover (which waits longer), so a lapse is seen as surely.
HELD_FOR = 0.005


class ServingLease:
    """``check()`` says whether replicated copies may be served now (module docstring)."""

    def __init__(self, held: Callable[[], bool] | None, on_regained: Callable[[], None]) -> None:
        self._held = held
        self._on_regained = on_regained
        self.lapsed = False  # lost since the last reconcile that followed its return
        self._regained_at: float | None = None
        self._held_until = float("-inf")  # loop time until which the last look answers

    def check(self) -> bool:
        if self._held is None:
            return True
        now = asyncio.get_running_loop().time()
        if now < self._held_until and not self.lapsed:
            return True
        if not self._held():
            if not self.lapsed:
                log.warning("cannot hear a majority of the managers: replicated copies not served")
            self.lapsed, self._regained_at = True, None
            self._held_until = float("-inf")
            return False
        if self.lapsed:
            if self._regained_at is None:
                self._regained_at = asyncio.get_running_loop().time()
                log.info("the managers' majority is heard again: reconciling before serving")
                self._on_regained()
            return False
        self._held_until = now + HELD_FOR
        return True

    def reconciled(self, fetched_at: float) -> None:
        """A reconcile whose state was fetched at ``fetched_at`` (loop time) finished."""
        if self.lapsed and self._regained_at is not None and fetched_at >= self._regained_at:
            self.lapsed, self._regained_at = False, None
            log.info("serving replicated copies again")

    async def watch(self, interval: float = WATCH_INTERVAL) -> None:
        if self._held is None:
            return
        while True:
            self.check()
            await asyncio.sleep(interval)
