"""The node side's view of partition migrations: the algorithm's MigrationManager and RCB.

A node (indexer for index scans, data node for primary scans) records here every partition
that arrives, leaves, or returns after a failed migration, and every batch of a paginated
scan registers a ``RuntimeControlBlock`` for its duration so a migration that happens *during*
the batch is noticed at its end. This class is also the node's partition manager as far as
scans are concerned: the store consults ``is_open`` per entry, so the local topology and the
set of open partitions change together, which is the algorithm's "partition manager consistent
with the local topology" wait condition holding by construction.

Pure and loop-agnostic except for the waits (``asyncio.Event``), so it runs in the simulator
and on a real node alike.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from shardex.core.topology import Topology


@dataclass
class RuntimeControlBlock:
    """Per-batch notifications (the algorithm's A.3): partitions that left, or came back,
    meanwhile."""

    migrated: set[int] = field(default_factory=set)
    restored: set[int] = field(default_factory=set)


class MigrationManager:
    """Which partitions this node holds, where the ones that left went, and the live RCBs."""

    def __init__(self, node: str, owned: Iterable[int] = (), known_topo: int = 0) -> None:
        self.node = node
        self._owned: set[int] = set(owned)
        # partition -> where it went, for partitions that left and did not come back; this is
        # the part of the node's local topology that may be ahead of the published history
        self._departed: dict[int, str] = {}
        self._rcbs: list[RuntimeControlBlock] = []
        self._known_topo = known_topo
        self._changed = asyncio.Event()  # binds to a loop at its first wait (3.10+)

    # ---- events recorded by the migration machinery --------------------------------------

    def partition_left(self, pid: int, to: str) -> None:
        """``pid`` was released to ``to`` (the source's point of no return)."""
        self._owned.discard(pid)
        self._departed[pid] = to
        for rcb in self._rcbs:
            rcb.migrated.add(pid)
        self._notify()

    def partition_arrived(self, pid: int) -> None:
        """``pid`` is complete and active here (every record copied)."""
        self._owned.add(pid)
        self._departed.pop(pid, None)
        self._notify()

    def partition_returned(self, pid: int) -> None:
        """A migration of ``pid`` away from here failed at its target: ``pid`` is back."""
        self._owned.add(pid)
        self._departed.pop(pid, None)
        for rcb in self._rcbs:
            rcb.restored.add(pid)
        self._notify()

    def redirect(self, pid: int, to: str) -> None:
        """Name (or correct) where a departed ``pid`` went, without notifying running batches:
        bookkeeping for a node that learns a release's target after the release itself."""
        if pid in self._departed:
            self._departed[pid] = to

    def departed(self) -> dict[int, str]:
        """Partitions that left and where they went ("" while not known yet)."""
        return dict(self._departed)

    def topology_published(self, seq_num: int) -> None:
        self._known_topo = max(self._known_topo, seq_num)
        self._notify()

    # ---- what a scan asks --------------------------------------------------------------

    def is_open(self, pid: int) -> bool:
        return pid in self._owned

    @property
    def known_topo(self) -> int:
        return self._known_topo

    def where_is(self, pid: int, official: Topology) -> str:
        """The owner of ``pid`` as this node sees it: itself, where it sent it, or the
        newest published topology's word for partitions it never held."""
        if pid in self._owned:
            return self.node
        if pid in self._departed:
            return self._departed[pid]
        where = official.assignment.get(pid, "")
        # The topology says "here" but the partition is not open here (a local view behind
        # the topology): unknown, so the scan fails clearly instead of skipping its entries.
        return "" if where == self.node else where

    def register(self, rcb: RuntimeControlBlock) -> None:
        self._rcbs.append(rcb)

    def unregister(self, rcb: RuntimeControlBlock) -> None:
        self._rcbs = [r for r in self._rcbs if r is not rcb]

    async def wait_until(self, predicate: Callable[[], bool], timeout: float) -> bool:
        """Wait until ``predicate()`` holds (re-checked at every recorded event)."""
        if predicate():
            return True
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while not predicate():
            left = deadline - loop.time()
            if left <= 0:
                return False
            event = self._changed
            try:
                await asyncio.wait_for(event.wait(), left)
            except TimeoutError:
                return predicate()
        return True

    def _notify(self) -> None:
        # One event per generation: wake every waiter, then arm a fresh event.
        self._changed.set()
        self._changed = asyncio.Event()
