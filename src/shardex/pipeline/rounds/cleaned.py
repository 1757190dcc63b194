"""Which indexer nodes hold nothing queued above a round's start that this query does not
know of, and so which rounds must first drop what is queued there.

A round's rows are queued on an indexer before the round's stabilise applies them: the
frames of a round streamed while its batch is projected (``streamed.py``), a round's earlier
frames. A round that fails, a query that stops or a driver that dies leaves such rows
queued above every applied TS, possibly of a branch a rollback then cut off, and a queued
version wins over a re-delivered one with the same seqno. So a node is trusted only once a
round of this query dropped what was queued above its start there (``drop_above``, in the
engine call that queues the round's rows): a round whose plan names any other node drops
on every node of its plan first. The first round of a query is that rule with nobody
cleaned yet; a node entering a plan later (a move target, a new owner) is cleaned like the
first round's nodes. The argument: ``docs/decisions/0050-deliver-ahead.md`` ("A node
entering a plan later").
"""

from __future__ import annotations

import threading
from collections.abc import Iterable, Mapping
from typing import Any

from shardex.core.timestamp import Timestamp
from shardex.pipeline.rounds.plan import plan_nodes

__all__ = ["CleanedNodes"]


class CleanedNodes:
    """The nodes where a round of the current query dropped above its start. Empty for a
    new job (a driver restart, a rollback's new generation) and after ``restart`` (a new
    query), so the first round drops on all its nodes."""

    def __init__(self) -> None:
        self.nodes: set[str] = set()
        self._lock = threading.Lock()

    def drop_above(
        self, start: Timestamp, end: Timestamp, plan: Iterable[str]
    ) -> dict[int, int] | None:
        """For a round (start, end] over the nodes ``plan``: the queues to clear first
        (above ``start``, per data partition), or None when every node of ``plan`` is
        cleaned already."""
        with self._lock:
            if self.nodes.issuperset(plan):
                return None
        return {p: start.seqno(p) for p in set(start) | set(end)}

    def round_done(
        self,
        key: tuple[Any, ...],
        incarnations: Mapping[str, str],
        dropped: bool,
        *,
        missed: Iterable[str] = (),
    ) -> None:
        """A round with views key ``key`` succeeded; ``incarnations``: every node that
        answered it. A round that ``dropped`` did so on every node of its plan but those
        that ``missed`` it (they did not answer: not cleaned, whatever they hold)."""
        if dropped:
            with self._lock:
                self.nodes |= (set(incarnations) | plan_nodes(key)) - set(missed)

    def restart(self) -> None:
        """A new query: nothing recorded is known to hold any more."""
        with self._lock:
            self.nodes.clear()
