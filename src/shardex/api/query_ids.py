"""Query ids: the initiator's member id plus an id unique on that member.

``initiator`` lets any participant find the member to ask about the query (check) or to
send its cancel to; ``local_id`` makes the pair unique cluster-wide, across restarts of the
initiator too (it is random, not a counter that restarts at zero).
"""

from __future__ import annotations

import itertools
from collections.abc import Callable

import msgspec

__all__ = ["QueryId", "QueryIdFactory"]


class QueryId(msgspec.Struct, frozen=True, array_like=True, order=True):
    """Hashable and ordered, so it keys dicts and sorts into replayable lists."""

    initiator: str
    local_id: str

    def __str__(self) -> str:
        return f"{self.initiator}/{self.local_id}"


class QueryIdFactory:
    """New query ids for one member: a process-local counter (readable in logs) plus random
    bytes drawn once per factory from ``nonce`` (the transport's source, seeded under
    simulation)."""

    def __init__(self, member_id: str, nonce: Callable[[int], bytes]) -> None:
        self.member_id = member_id
        # Drawn once: a restarted member draws a new one, so its ids never repeat an old
        # incarnation's (a draw per query cost more than the rest of a point lookup's id).
        self._epoch = nonce(6).hex()
        self._counter = itertools.count(1)

    def __call__(self) -> QueryId:
        return QueryId(self.member_id, f"{next(self._counter)}-{self._epoch}")
