"""A SELECT whose index leaf lost its indexer, run again on other copies of its partitions.

A leaf fragment runs on the indexer that holds its slices and reads them in-process, so
when that node dies the fragment dies with it, and the query protocol cancels the query
naming the member it lost (``link_lost``, ``participant_left``, ``start_failed``). With index
replicas (decision 0085) another copy of each of its partitions holds every published TS,
so the statement is planned again without the nodes that failed (``plan_select``'s
``avoid``) and run again at the same pinned TS, within the statement's timeout:

* while the pinned TS is being chosen (``WaitStability`` to a leaf's node fails), and
* while the query runs, as long as no result row has left this node: the rows of an
  aggregate, a sort at the root or a small result all wait for every leaf, so a leaf lost
  mid-query is retried whole;
* after rows went to the client, when the plan is repeatable (``PhysicalPlan.repeatable``:
  a covering scan at a pinned TS whose ORDER BY is a total order, ending ties with
  ``META().id``): the re-run yields the very same rows in the same order, so the rows
  already handed on are skipped and the statement resumes where it was. Any other plan's
  error ends the statement then (rows sent cannot be taken back, a fetched document may have
  changed since, and a re-run's order is not guaranteed to repeat where ORDER BY has ties).

A late-materialized plan (decision 0111) whose root cannot fill its limit exactly (documents
gone or changed since the index was read) fails with ``LATE_REFILL`` before any row left;
it runs again the same way, with the leaves fetching (``rerun(None)``), at the same TS.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Final

from shardex.errors import ErrorCode, ShardexError
from shardex.sql.exec.late import LATE_REFILL
from shardex.sql.exec.plan import PhysicalPlan

__all__ = ["FAILOVER", "failed_leaf", "failing_over", "lost_participant", "or_else_when_lost"]

log = logging.getLogger(__name__)

# The query protocol's reasons for cancelling a query because a participant went away.
LOST: Final = frozenset({"link_lost", "participant_left", "start_failed"})
# Failures of a request to an indexer node (not of its slices).
FAILOVER: Final = frozenset(
    {ErrorCode.NODE_UNAVAILABLE, ErrorCode.CONNECTION_CLOSED, ErrorCode.TIMEOUT}
)


def lost_participant(exc: ShardexError) -> bool:
    """Whether ``exc`` is the loss of a node taking part in a query, whichever its role (a
    statement timeout is not: running again would outlive it)."""
    if exc.code is ErrorCode.QUERY_CANCELLED:
        return exc.details.get("reason") in LOST
    return exc.code in (ErrorCode.NODE_UNAVAILABLE, ErrorCode.CONNECTION_CLOSED)


async def or_else_when_lost(
    chunks: AsyncIterator[list[bytes]],
    fallback: Callable[[], Awaitable[AsyncIterator[list[bytes]]]],
    what: str,
) -> AsyncIterator[list[bytes]]:
    """``chunks``, or ``fallback()``'s rows when a node taking part is lost before any row
    was handed on. For plans whose fragments have no failover of their own (a join between
    fragments: its join fragments hold state no other copy has), the fallback is a plan whose
    parts do fail over; once rows have left, the loss is the statement's error."""
    sent = False
    try:
        async with contextlib.aclosing(chunks):
            async for chunk in chunks:
                sent = sent or bool(chunk)
                yield chunk
        return
    except ShardexError as exc:
        if sent or not lost_participant(exc):
            raise
        log.info("%s lost a node before any row was sent (%s); running it the other way", what, exc)
    rest = await fallback()
    async with contextlib.aclosing(rest):
        async for chunk in rest:
            yield chunk


def failed_leaf(exc: ShardexError, plan: PhysicalPlan) -> str | None:
    """The node of ``plan``'s leaves whose loss ``exc`` is (None: not a lost leaf node)."""
    if exc.code is ErrorCode.QUERY_CANCELLED and exc.details.get("reason") in LOST:
        member = exc.details.get("member")
        return next((leaf.node for leaf in plan.leaves if leaf.member == member), None)
    if exc.code is ErrorCode.NODE_UNAVAILABLE and "value" in exc.details:
        # the protocol refused to start: a participant (member id) is known down
        member = exc.details["value"]
        return next((leaf.node for leaf in plan.leaves if leaf.member == member), None)
    if exc.code in FAILOVER:
        node = exc.details.get("indexer")
        return node if any(leaf.node == node for leaf in plan.leaves) else None
    return None


async def failing_over(
    plan: PhysicalPlan,
    chunks: AsyncIterator[list[bytes]],
    rerun: Callable[[str | None], Awaitable[tuple[PhysicalPlan, AsyncIterator[list[bytes]]]]],
    deadline: float,
    *,
    repeatable: bool = False,
) -> AsyncIterator[list[bytes]]:
    """``chunks`` (the result rows, encoded), run again by ``rerun(failed node)`` when a
    leaf's node is lost before any row was handed on, or at any point when ``repeatable``
    (the re-run's first rows, those handed on already, are skipped), until ``deadline``
    (loop time). ``rerun`` raises when no copy is left; the lost leaf's error is the
    statement's then. ``rerun(None)``: the plan again without late materialization."""
    sent = 0  # rows handed on
    skip = 0  # rows of this run an earlier run handed on
    lost: set[str] = set()
    while True:
        try:
            async with contextlib.aclosing(chunks):
                async for chunk in chunks:
                    if skip:
                        n = min(skip, len(chunk))
                        chunk, skip = chunk[n:], skip - n
                        if not chunk:
                            continue
                    sent += len(chunk)
                    yield chunk
            if skip:  # cannot be with a repeatable plan: say so rather than lose rows
                raise ShardexError(
                    f"query {plan.query_id}: its run on other copies returned {skip} rows "
                    "fewer than were sent before an indexer was lost",
                    code=ErrorCode.INTERNAL,
                    details={"missing": skip, "sent": sent},
                )
            return
        except ShardexError as exc:
            if exc.details.get("reason") == LATE_REFILL and plan.late and not sent:
                plan, chunks = await rerun(None)
                continue
            node = failed_leaf(exc, plan)
            late = asyncio.get_running_loop().time() >= deadline
            if (sent and not repeatable) or node is None or node in lost or late:
                raise
            lost.add(node)
            try:
                plan, chunks = await rerun(node)
            except ShardexError as again:
                log.info("query %s lost %s; no copy took over: %s", plan.query_id, node, again)
                raise exc from again
            skip = sent
            log.info(
                "query lost the indexer %s (%s); run again on other copies%s",
                node,
                exc,
                f", resuming after the {sent} rows sent" if sent else "",
            )
