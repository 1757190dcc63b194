"""Admission control: at most ``cap`` units of work run at once on a node, at most ``queue``
more wait for a slot (first come, first served), and past either the caller gets
QUERY_OVERLOADED at once or after its wait, instead of the node taking on more than it can
finish (docs/decisions/0104-admission-control.md).

A slot is handed from the releaser straight to the oldest waiter, so a newcomer never
overtakes the queue. ``Slot.release`` is idempotent: a statement releases on every exit path
(finish, error, cancel, lost connection) and a second release is harmless.
"""

from __future__ import annotations

import asyncio
import collections
import os
from typing import Final

from shardex.errors import ErrorCode, ShardexError

__all__ = [
    "DEFAULT_QUEUED",
    "FRAGMENT_SLOTS_PER_CPU",
    "SLOTS_PER_CPU",
    "AdmissionGate",
    "Slot",
    "default_cap",
    "overloaded",
]

# Slots per CPU when no cap is configured: statements mostly wait on other nodes (scans,
# fetches), so a few per core keep the CPUs busy without unbounded interleaving.
SLOTS_PER_CPU: Final = 4
# Executions of other nodes' queries per CPU when no cap is configured: every other node's
# statements may fan out here, so four times a node's own statement slots.
FRAGMENT_SLOTS_PER_CPU: Final = 4 * SLOTS_PER_CPU
# Waiting places when none are configured: enough to ride out a burst of a few hundred
# clients without refusing, few enough that a waiter's turn comes within its wait.
DEFAULT_QUEUED: Final = 128


def default_cap(per_cpu: int = SLOTS_PER_CPU) -> int:
    """``per_cpu`` times the CPUs this process may run on."""
    try:
        cpus = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # not on every platform
        cpus = os.cpu_count() or 1
    return per_cpu * max(cpus, 1)


class Slot:
    """One admitted unit of work; ``release`` it when the work ends (any number of times)."""

    __slots__ = ("_gate",)

    def __init__(self, gate: AdmissionGate) -> None:
        self._gate: AdmissionGate | None = gate

    def release(self) -> None:
        gate, self._gate = self._gate, None
        if gate is not None:
            gate._release()

    @property
    def held(self) -> bool:
        return self._gate is not None


class AdmissionGate:
    """``cap`` running, ``queue`` waiting. ``what`` names the work in errors ("SQL
    statements"); ``cap_key`` / ``queue_key`` are the config keys an operator raises."""

    def __init__(self, what: str, cap: int, queue: int, *, cap_key: str, queue_key: str) -> None:
        if cap < 1 or queue < 0:
            raise ValueError(f"cap must be >= 1 and queue >= 0, got {cap}, {queue}")
        self.what = what
        self.cap = cap
        self.queue = queue
        self.cap_key = cap_key
        self.queue_key = queue_key
        self.running = 0
        self._waiters: collections.deque[asyncio.Future[None]] = collections.deque()
        self.rejected = 0

    @property
    def queued(self) -> int:
        return sum(1 for f in self._waiters if not f.done())

    def try_enter(self) -> Slot | None:
        """A slot now, or None (the gate is full or others wait): never queues."""
        if self.running < self.cap and not self._waiters:
            self.running += 1
            return Slot(self)
        return None

    async def enter(self, wait: float) -> Slot:
        """A slot: now if one is free and nobody waits, else after the waiters before this
        one, within ``wait`` seconds. QUERY_OVERLOADED when the queue is full or the wait
        runs out."""
        slot = self.try_enter()
        if slot is not None:
            return slot
        if self.queued >= self.queue:
            raise self._overloaded("its queue is full", wait)
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiters.append(fut)
        try:
            async with asyncio.timeout(wait):
                await fut
        except BaseException as exc:
            if fut.done() and not fut.cancelled():
                self._release()  # handed a slot just as the wait ended: pass it on
            else:
                fut.cancel()
                if fut in self._waiters:
                    self._waiters.remove(fut)
            if isinstance(exc, TimeoutError):
                raise self._overloaded(f"no slot came free within {wait:g} s", wait) from None
            raise
        return Slot(self)

    def _release(self) -> None:
        while self._waiters:
            fut = self._waiters.popleft()
            if not fut.done():  # the slot goes to the oldest live waiter, still counted
                fut.set_result(None)
                return
        self.running -= 1

    def _overloaded(self, why: str, wait: float) -> ShardexError:
        self.rejected += 1
        return overloaded(
            f"{self.cap} {self.what} running and {self.queue} queued (the limits), {why}",
            keys=(self.cap_key, self.queue_key),
            cap=self.cap,
            queue=self.queue,
            running=self.running,
            queued=self.queued,
            wait=wait,
        )


def overloaded(state: str, *, keys: tuple[str, ...], **details: object) -> ShardexError:
    """QUERY_OVERLOADED: the node is full (``state`` says of what, with its limits);
    ``keys`` are the config keys that raise the limits."""
    return ShardexError(
        f"node overloaded: {state}",
        code=ErrorCode.QUERY_OVERLOADED,
        details={
            **details,
            "hint": f"retry later (with backoff), or raise {' / '.join(keys)} in the node's config",
        },
    )
