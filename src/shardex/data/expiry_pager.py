"""The expiry pager: deletes expired documents on this node's active copies.

Reads never return an expired document (``DocumentOps.get_raw``), but it stays stored, in
the indexes and absent from change streams until something deletes it. Two things do, both
through ``DataEngine.expire`` (a normal mutation per document: a new seqno, a tombstone and
a change record marked ``FLAG_EXPIRED``, then the replica senders are woken), so streams,
replicas and the index pipeline see the deletion like any other:

* on access: a read that finds a document expired tells the pager (``on_expired``, from any
  thread), which deletes it on its next turn, at once (a read never writes itself: reads run
  on the event loop and a write waits for an fsync);
* the walk: every ``interval`` seconds one tick reads at most ``walk_limit`` document
  records (each a decode, in the engine's threads), continuing from where the previous tick
  stopped, partition after partition, and deletes the expired ones it saw. A full pass over
  N documents takes about N / ``walk_limit`` ticks; the bound keeps a tick's cost fixed
  however large the node.

Only while the node serves the keyspace (``ServingGate.serves_now``): a node cut off from
the managers, or failed over, must not write to copies a failover may be replacing. A copy
frozen by a hand-over or no longer active refuses the deletion (NOT_MY_PARTITION), which is
dropped: the new owner's pager finds the document again.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
from collections.abc import Callable

from shardex.data.engine import DataEngine
from shardex.data.engine_io import EngineIO
from shardex.data.expiry import DEFAULT_WALK_LIMIT
from shardex.data.replication import Replication
from shardex.data.serving import ServingGate
from shardex.errors import ShardexError
from shardex.meta.node_defaults import DEFAULT_EXPIRY_PAGER_INTERVAL

log = logging.getLogger(__name__)

DEFAULT_PAGER_INTERVAL = DEFAULT_EXPIRY_PAGER_INTERVAL  # seconds between walk ticks
# Expired documents reads reported and not yet deleted, at most (past it the oldest reports
# are dropped: the walk finds those documents in its turn).
ACCESSED_MAX = 10_000

Key = tuple[str, int]


class ExpiryPager:
    """See the module docstring. ``run`` is the service's task; ``tick`` one walk step."""

    def __init__(
        self,
        *,
        engine: Callable[[], DataEngine],
        io: EngineIO,
        replication: Replication,
        gate: ServingGate,
        interval: float = DEFAULT_PAGER_INTERVAL,
        walk_limit: int = DEFAULT_WALK_LIMIT,
    ) -> None:
        self._engine = engine
        self.io = io
        self.replication = replication
        self.gate = gate
        self.interval = interval
        self.walk_limit = walk_limit
        # (keyspace, partition, docid, cas) reported by reads: appended by any thread
        self._accessed: collections.deque[tuple[str, int, str, int]] = collections.deque(
            maxlen=ACCESSED_MAX
        )
        self._wake = asyncio.Event()
        self._loop: asyncio.AbstractEventLoop | None = None
        # where the walk continues: the partition, and the last document key read in it
        self._position: Key | None = None
        self._after: bytes | None = None
        # documents deleted by expiry here since start, by how they were found ("access":
        # reported by a read, "walk"): the node's metrics
        self.expired_by = {"access": 0, "walk": 0}

    @property
    def expired(self) -> int:
        """Documents deleted by expiry here since start."""
        return sum(self.expired_by.values())

    def on_expired(self, keyspace: str, partition: int, docid: str, cas: int) -> None:
        """A read found ``docid`` expired (any thread): delete it soon."""
        self._accessed.append((keyspace, partition, docid, cas))
        loop = self._loop
        if loop is not None:
            # a closed loop: the service is stopping
            with contextlib.suppress(RuntimeError):
                loop.call_soon_threadsafe(self._wake.set)

    async def run(self) -> None:
        self._loop = asyncio.get_running_loop()
        next_tick = self._loop.time() + self.interval
        while True:
            left = next_tick - self._loop.time()
            if left > 0 and not self._accessed:
                try:
                    async with asyncio.timeout(left):
                        await self._wake.wait()
                except TimeoutError:
                    pass
            self._wake.clear()
            try:
                await self.expire_accessed()
                if self._loop.time() >= next_tick:
                    next_tick = self._loop.time() + self.interval
                    await self.tick()
            except Exception:
                log.exception("expiry pager failed")

    async def expire_accessed(self) -> int:
        """Delete the documents reads reported expired; how many went."""
        groups: dict[Key, list[tuple[str, int]]] = {}
        while self._accessed:
            ks, p, docid, cas = self._accessed.popleft()
            groups.setdefault((ks, p), []).append((docid, cas))
        n = 0
        for (ks, p), items in groups.items():
            n += await self._expire(ks, p, items, "access")
        return n

    async def tick(self) -> int:
        """One walk step: at most ``walk_limit`` document records read, continuing from the
        last step's position; the expired ones deleted. Returns how many went."""
        engine = self._engine()
        parts = engine.active_partitions()
        if not parts:
            return 0
        start = 0
        if self._position is not None:
            start = next((i for i, k in enumerate(parts) if k >= self._position), len(parts))
            if start == len(parts) or parts[start] != self._position:
                self._after = None  # that partition is gone: the next one from its start
            if start == len(parts):
                start = 0
        budget, deleted = self.walk_limit, 0
        for i in range(len(parts)):
            ks, p = parts[(start + i) % len(parts)]
            if budget <= 0:
                break
            after = self._after if i == 0 else None
            if not self._serves(ks):
                self._position, self._after = (ks, p), None
                continue
            try:
                found, after, seen = await self.io.run(engine.find_expired, ks, p, after, budget)
            except ShardexError:  # no longer active here: move on
                found, after, seen = [], None, 0
            budget -= max(seen, 1)
            if found:
                deleted += await self._expire(ks, p, found, "walk")
            if after is not None:  # the budget ran out inside this partition
                self._position, self._after = (ks, p), after
                return deleted
            nxt = parts[(start + i + 1) % len(parts)]
            self._position, self._after = nxt, None
        return deleted

    def _serves(self, keyspace: str) -> bool:
        try:
            return self.gate.serves_now(keyspace)
        except ShardexError:
            return False

    async def _expire(
        self, keyspace: str, partition: int, items: list[tuple[str, int]], how: str
    ) -> int:
        if not self._serves(keyspace):
            return 0
        try:
            n = await self.io.run(self._engine().expire, keyspace, partition, items)
        except ShardexError as exc:  # frozen, moved, dropped: the owner's pager finds them
            log.debug("expiry in %s/%d skipped: %s", keyspace, partition, exc)
            return 0
        if n:
            self.replication.wake(keyspace, partition)
            self.expired_by[how] += n
        return n
