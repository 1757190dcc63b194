"""``ReplicaSender``: feeds one replica node's copies of one keyspace from this active node.

One sender per (keyspace, replica node), one ``ReplicaApply`` in flight, so the replica gets
each partition's changes in order without any sequencing of its own. A round: take, for every
partition whose chain names the replica, the change records after what the replica last
acknowledged (the newest from the active's memory, ``Partition.recent_changes``, anything
older read from the change log: the steady state and the catch-up after a restart are the
same loop), send them in one message, record the acks (which is what durable writes
wait on, ``durability.py``). It runs when a commit wakes it, and every ``PROBE_INTERVAL``
otherwise, so a replica that was down or is being built is found again. Rounds batch by
themselves under load: whatever was committed while one was in flight goes in the next.

A commit names its partition (``wake(partition)``), and a round looks only at the partitions
named since the previous one and those its last answer left behind: under load a round
carries two or three changes, and looking at each of the sender's partitions every round
cost more than sending them. Every other reason to look - a new topology, a failed round,
an idle probe, an oversized backlog - looks at them all (``wake()``), and so does a busy
sender at least every ``PROBE_INTERVAL``, so a partition nothing named is never left behind
for longer.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable
from typing import Any

import shardex.data.replica as replica
from shardex.api.records import STATE_REPLICA
from shardex.api.replication import ReplicaAck, ReplicaApplied, ReplicaApply, ReplicaRun
from shardex.data.durability import DurabilityWaits
from shardex.data.engine import DataEngine
from shardex.errors import ErrorCode, ShardexError
from shardex.net import ConnectionPool

log = logging.getLogger(__name__)

PROBE_INTERVAL = 0.5  # an idle sender still checks its replica is reachable this often
APPLY_TIMEOUT = 10.0
RUN_ITEMS = 2_000  # changes per partition per round
ROUND_BYTES = 4 * 1024 * 1024  # about this much per ReplicaApply
SMALL_ROUND = 64  # changes read on the loop (cached, cheaper than a thread hop)
RETRY_BACKOFF = (0.05, 0.2, 0.5, 1.0)
ABSENT_RETRY = 0.02  # seconds before asking again about a copy not opened yet

RunInExecutor = Callable[..., Awaitable[Any]]


class ReplicaSender:
    """Feeds ``node``'s replica copies of ``keyspace`` (module docstring)."""

    def __init__(
        self,
        *,
        keyspace: str,
        node: str,
        me: str,
        engine: Callable[[], DataEngine],
        run: RunInExecutor,
        pool: ConnectionPool,
        address: Callable[[str], str],
        waits: DurabilityWaits,
    ) -> None:
        self.keyspace = keyspace
        self.node = node
        self.me = me
        self._engine = engine
        self._run = run
        self._pool = pool
        self._address = address
        self._waits = waits
        self.keyspace_uuid = ""
        self.seq_num = 0
        self.partitions: frozenset[int] = frozenset()
        self.healthy = True  # the last round reached the replica (or none was tried yet)
        self.rounds = 0
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._failures = 0
        self._warned: set[int] = set()
        # What the next round looks at: the partitions named since the last one, or all of
        # them when ``_full`` (module docstring); ``_full_at``: when all were last looked at.
        self._dirty: set[int] = set()
        self._full = True
        self._full_at = 0.0

    def update(self, partitions: frozenset[int], seq_num: int, keyspace_uuid: str) -> None:
        if partitions != self.partitions or seq_num != self.seq_num:
            self.partitions, self.seq_num = partitions, seq_num
            self.keyspace_uuid = keyspace_uuid
            self.wake()

    def start(self) -> None:
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(
                self._loop(), name=f"replica-sender {self.keyspace}->{self.node}"
            )

    async def stop(self) -> None:
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)

    def wake(self, partition: int | None = None) -> None:
        """Something to send: a commit to ``partition``, or (None) anything anywhere."""
        if partition is None:
            self._full = True
        elif partition in self.partitions:
            self._dirty.add(partition)
        else:
            return  # not a partition this replica copies
        self._wake.set()

    def reachable(self, partition: int) -> bool:
        """Whether this replica can acknowledge writes to ``partition`` soon: its node
        answers, and its copy is a replica or about to be one (absent: being opened, as for
        a keyspace just created); a copy being rebuilt or restarted cannot."""
        if not self.healthy or partition not in self.partitions:
            return False
        ack = self._waits.ack((self.keyspace, partition), self.node)
        return ack is None or ack.state in (STATE_REPLICA, replica.ACK_ABSENT)

    # --- the loop --------------------------------------------------------------------------------

    async def _loop(self) -> None:
        while True:
            idle = False
            # ``asyncio.timeout``, not ``wait_for``: Python 3.11's ``wait_for`` can swallow a
            # cancellation that lands as the event is set, and a busy sender's event is set
            # all the time (its ``stop`` then waited forever).
            if not self._wake.is_set():  # busy: no timer to arm and cancel per round
                try:
                    async with asyncio.timeout(PROBE_INTERVAL):
                        await self._wake.wait()
                except TimeoutError:
                    idle = True
            self._wake.clear()
            try:
                more = await self._round(probe=idle)
                if not self.healthy:
                    log.info("replica %s of %s reachable again", self.node, self.keyspace)
                self.healthy, self._failures = True, 0
                if more:
                    self._wake.set()
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                self._full = True  # what that round took is still to be sent
                if isinstance(exc, ShardexError) and exc.code is ErrorCode.TIMEOUT:
                    # nothing came back on it (a partition, say): reconnect on the next try
                    with contextlib.suppress(ShardexError):
                        await self._pool.drop(self._address(self.node))
                if self.healthy:
                    log.warning("replica %s of %s unreachable: %s", self.node, self.keyspace, exc)
                self.healthy = False
                pause = RETRY_BACKOFF[min(self._failures, len(RETRY_BACKOFF) - 1)]
                self._failures += 1
                await asyncio.sleep(pause)

    async def _round(self, *, probe: bool = False) -> bool:
        """One ReplicaApply; True when some partition still has changes to send. An idle
        ``probe`` round sends no run: it only finds out whether the replica is reachable,
        which is what a durable write checks before it writes."""
        if not self.partitions:
            return False
        engine = self._engine()
        now = asyncio.get_running_loop().time()
        if self._full or probe or now - self._full_at >= PROBE_INTERVAL:
            self._full, self._full_at = False, now
            self._dirty = set()
            parts = sorted(self.partitions)
        else:
            parts = sorted(self._dirty & self.partitions)
            self._dirty = set()
        pending = self._pending(engine, parts)
        if pending is None and not probe:
            return False
        runs, more = (
            ([], False)
            if pending is None
            else self._collect(engine, parts)
            if pending <= SMALL_ROUND
            else await self._run(self._collect, engine, parts)
        )
        if more:
            self._full = True  # a backlog left for the next round: look at everything
        if not runs and not probe:
            return more
        sync = any(self._waits.needs_persist((self.keyspace, r.partition), self.node) for r in runs)
        msg = ReplicaApply(
            keyspace=self.keyspace,
            keyspace_uuid=self.keyspace_uuid,
            source=self.me,
            seq_num=self.seq_num,
            runs=runs,
            sync=sync,
        )
        reply = await self._pool.request(
            self._address(self.node), msg, APPLY_TIMEOUT, expect=ReplicaApplied
        )
        self.rounds += 1
        # One pass over the acks (one per partition sent, each once), each looked at once:
        # this runs for every round, and under load a round's runs are one change each.
        waits, node, ks = self._waits, self.node, self.keyspace
        moved = behind = absent = False
        for ack in reply.acks:
            key = (ks, ack.partition)
            old = waits.ack(key, node)
            self._absorb(ack)
            lags = self._lags(engine, ack.partition, waits.ack(key, node))
            if ack.state != STATE_REPLICA or lags or waits.needs_persist(key, node):
                self._dirty.add(ack.partition)  # looked at again in the next round
            moved = moved or _advanced(old, ack)
            behind = behind or lags
            absent = absent or ack.state == replica.ACK_ABSENT
        if absent:
            # a copy about to be opened (a new keyspace): ask again shortly, not at the
            # next probe, since durable writes wait for it
            asyncio.get_running_loop().call_later(ABSENT_RETRY, self._wake.set)
        # Behind and moving: go on at once. Behind without moving (a refused run): wait for
        # the next wake or probe instead of asking the same again in a loop.
        return more or (moved and behind)

    def _absorb(self, ack: ReplicaAck) -> None:
        key = (self.keyspace, ack.partition)
        if (
            ack.state not in (STATE_REPLICA, replica.ACK_BEHIND)
            and ack.partition not in self._warned
        ):
            self._warned.add(ack.partition)
            log.info(
                "replica copy of %s/%d on %s is %s",
                self.keyspace,
                ack.partition,
                self.node,
                ack.state,
            )
        elif ack.state == STATE_REPLICA:
            self._warned.discard(ack.partition)
        self._waits.record(key, self.node, ack)

    def _lags(self, engine: DataEngine, partition: int, ack: ReplicaAck | None) -> bool:
        """The replica's copy, as ``ack`` (its recorded ack) says, lacks changes of the
        active's."""
        part = engine.replicas.active_part(self.keyspace, partition)
        return (
            part is not None
            and ack is not None
            and ack.state == STATE_REPLICA
            and ack.high < part.meta.high_seqno
        )

    def _pending(self, engine: DataEngine, parts: list[int]) -> int | None:
        """How many changes a round of ``parts`` would carry (roughly), or None if nothing
        at all: every known copy is level with its active and nothing needs a probe."""
        total = 0
        anything = False
        for p in parts:
            part = engine.replicas.active_part(self.keyspace, p)
            if part is None:
                continue
            ack = self._waits.ack((self.keyspace, p), self.node)
            if ack is None or ack.state != STATE_REPLICA or ack.uuid != part.meta.uuid:
                anything = True
                continue
            gap = part.meta.high_seqno - ack.high
            if gap > 0 or self._waits.needs_persist((self.keyspace, p), self.node):
                anything = True
                total += max(gap, 0)
        return total if anything else None

    def _collect(self, engine: DataEngine, parts: list[int]) -> tuple[list[ReplicaRun], bool]:
        runs: list[ReplicaRun] = []
        size = 0
        more = False
        for p in parts:
            part = engine.replicas.active_part(self.keyspace, p)
            if part is None:
                continue
            meta = part.meta
            ack = self._waits.ack((self.keyspace, p), self.node)
            if ack is None or ack.state != STATE_REPLICA:
                # unknown, behind, absent, diverged: a probe from seqno 0 with our history;
                # the answer says where the copy stands. Also a copy that says it is active:
                # either it was promoted (our topology will soon drop it from this chain) or
                # it is a node back from a failover that has not yet demoted its old copy
                # (its recovery will), and only asking again notices the second.
                after = 0 if ack is None or ack.state != replica.ACK_BEHIND else ack.high
                runs.append(ReplicaRun(p, meta.uuid, after, [], list(meta.failover_log)))
                continue
            uuid = meta.uuid  # a property: read once
            log_needed = ack.uuid != uuid
            if ack.high >= meta.high_seqno:
                if log_needed or self._waits.needs_persist((self.keyspace, p), self.node):
                    flog = list(meta.failover_log) if log_needed else None
                    runs.append(ReplicaRun(p, uuid, ack.high, [], flog))
                continue
            if ack.high < meta.purge_seqno:
                if p not in self._warned:
                    self._warned.add(p)
                    log.info(
                        "replica copy of %s/%d on %s is at seqno %d, below the purge seqno %d: "
                        "rebuilding it from a snapshot",
                        self.keyspace,
                        p,
                        self.node,
                        ack.high,
                        meta.purge_seqno,
                    )
                runs.append(ReplicaRun(p, uuid, ack.high, [], None, rebuild=True))
                continue
            if size >= ROUND_BYTES:
                more = True
                continue
            # From memory what the active just wrote; the change log for a copy further behind.
            recent = part.recent_changes(ack.high, meta.high_seqno, uuid)
            lives: list[bool] | None = None
            if recent is not None:
                changes, lives = recent
            else:
                changes = replica.read_run(part, ack.high, meta.high_seqno, RUN_ITEMS, ROUND_BYTES)
            if not changes:
                continue
            if changes[-1][0] < meta.high_seqno:
                more = True
            for c in changes:
                size += len(c[1]) + (len(c[4]) if c[4] else 0)
            flog = list(meta.failover_log) if log_needed else None
            runs.append(ReplicaRun(p, uuid, ack.high, changes, flog, live_before=lives))
        return runs, more


def _advanced(old: ReplicaAck | None, new: ReplicaAck) -> bool:
    """The copy moved on since the previous ack (or is heard of for the first time)."""
    return old is None or (new.high, new.uuid, new.state) != (old.high, old.uuid, old.state)
