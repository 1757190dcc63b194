"""Request deadlines of one connection, bounded by one timer.

An ``asyncio.timeout`` per request costs a Timeout object, two ``get_running_loop()`` pid
checks (a ``getpid`` syscall each) and a timer started and stopped, for a deadline that is
almost never reached. Here a connection keeps one timer, armed at the earliest deadline of
its pending requests and moved only for an earlier one; when it fires, it fails the requests
whose deadline has passed and re-arms at the earliest left.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping

from shardex.net.messages import Message

# A timer may fire up to the loop clock's resolution early; uvloop's timers are in ms.
SWEEP_SLACK = 1e-3


class Pending:
    """A request waiting for its reply; ``deadline`` is set while the sweep bounds it."""

    __slots__ = ("deadline", "fut", "timeout", "type_name")

    def __init__(self, fut: asyncio.Future[Message], type_name: str, timeout: float | None) -> None:
        self.fut = fut
        self.type_name = type_name
        self.timeout = timeout
        self.deadline: float | None = None


class DeadlineSweep:
    """One timer for the deadlines of ``pending`` (request id -> ``Pending``)."""

    def __init__(
        self,
        loop: asyncio.AbstractEventLoop,
        pending: Callable[[], Mapping[int, Pending]],
        expired: Callable[[Pending], BaseException],
    ) -> None:
        self._loop = loop
        self._pending = pending  # a getter: the connection swaps its dict when it closes
        self._expired = expired
        self._at: float | None = None
        self._handle: asyncio.TimerHandle | None = None

    @property
    def armed(self) -> bool:
        return self._handle is not None

    def arm(self, pending: Pending, timeout: float) -> None:
        """Bound ``pending`` by ``timeout`` seconds from now."""
        deadline = self._loop.time() + timeout
        pending.deadline = deadline
        if self._at is None or deadline < self._at:
            self._set(deadline)

    def cancel(self) -> None:
        if self._handle is not None:
            self._handle.cancel()
        self._handle = self._at = None

    def _set(self, deadline: float) -> None:
        if self._handle is not None:
            self._handle.cancel()
        self._at = deadline
        self._handle = self._loop.call_at(deadline, self._sweep)

    def _sweep(self) -> None:
        self._handle = self._at = None
        now = self._loop.time() + SWEEP_SLACK
        earliest: float | None = None
        for p in self._pending().values():
            d = p.deadline
            if d is None:
                continue
            if d <= now:
                p.deadline = None
                if not p.fut.done():
                    p.fut.set_exception(self._expired(p))
            elif earliest is None or d < earliest:
                earliest = d
        if earliest is not None:
            self._set(earliest)
