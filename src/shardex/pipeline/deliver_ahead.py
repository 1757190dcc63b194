"""Deliver ahead: the read-ahead's key versions go to the indexers before their batch does.

A batch's round (``batch_tail.py``) spends part of its time sending rows the read-ahead had
projected long before (``read_ahead.py``). Once the read-ahead holds rows AND the previous
batch's round has ended, ``DeliverAhead.hook`` routes them by that round's views (the same
``route``, the same moving slices of index moves) and queues them on the indexers as
``DeliverKeyVersions`` naming the incarnation each node had in that round (queue only, no
stabilise). The batch then sends in its ``DeliverAndStabilize`` only what was not delivered,
if everything it would have routed them by is what the early deliveries used
(``DeliverAhead.usable``); otherwise it falls back to delivering all its rows after
every node forgot what was queued above the batch's start (``drop_above``).

Rows a previous job (or query) queued ahead are unknown to this one, so a node is trusted
only once a round of this query dropped above its start there (``DeliverAhead.cleaned``): a
round whose plan names any other node falls back as a whole, as the first round does (it is
that rule with nobody cleaned yet), so a node entering a plan later is cleaned like the
first round's nodes.

Rows beyond the batch's end that were delivered early stay queued on the indexers (a
stabilise takes only seqnos <= its TS) and stay recorded in the read-ahead (``Ahead.sent``),
so the next batch skips them too; a fallback drops them and delivers again. The argument
(nothing lost, nothing doubled) is in ``docs/decisions/0050-deliver-ahead.md``.
"""

from __future__ import annotations

import concurrent.futures
import logging
import threading
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from shardex.client import Client
from shardex.core.timestamp import Timestamp
from shardex.index.keyversion import ERROR, KeyVersion
from shardex.pipeline.gcpause import gc_paused
from shardex.pipeline.indexers import deliver_rows
from shardex.pipeline.read_ahead import Ahead, Deliver, Taken
from shardex.pipeline.registry import IndexView
from shardex.pipeline.router import IndexRoute, route

__all__ = ["DeliverAhead", "RoundInfo", "Skip", "plan_nodes", "views_key"]

log = logging.getLogger(__name__)


def views_key(views: Sequence[IndexView]) -> tuple[Any, ...]:
    """Everything a batch routes and stabilises by: definitions, topologies (version and
    assignment) and the moving slices of index moves. Two batches with equal keys route
    every row to the same slices and nodes."""
    return tuple(
        (
            v.id,
            v.definition,
            v.topology.seq_num,
            tuple(sorted(v.topology.assignment.items())),
            tuple(sorted(v.moving.items())),
        )
        for v in views
    )


def plan_nodes(key: tuple[Any, ...]) -> set[str]:
    """The nodes a round with views key ``key`` sends to and stabilises on: every owner of
    a topology and every move target (``round_plan.stabilize_plan``'s nodes)."""
    out: set[str] = set()
    for _id, _definition, _seq, assignment, moving in key:
        out.update(node for _p, node in assignment)
        out.update(node for _p, node in moving)
    return out


@dataclass(eq=False)
class RoundInfo:
    """A round that succeeded: its end, what it routed by, the incarnation of every node
    that answered, and the early deliveries it counted on (``confirmed``: their rows up to
    its end are applied, those beyond are still queued in the same processes)."""

    end: Timestamp
    key: tuple[Any, ...]
    routes: dict[str, IndexRoute]
    incarnations: dict[str, str]
    confirmed: _Tag | None = None


@dataclass(eq=False)
class _Tag:
    """Rows delivered after ``round`` ended, routed by its views, to its incarnations."""

    round: RoundInfo


@dataclass
class Skip:
    """What a batch may leave out of its round: of ``rows[:ahead]`` (the read-ahead's rows)
    those with seqno <= ``sent[partition]``, and the incarnations of the nodes they went
    to (the round's frames must reach the same processes)."""

    ahead: int
    sent: dict[int, int]
    incarnations: dict[str, str]
    tag: _Tag | None

    def rest(self, rows: list[KeyVersion]) -> list[KeyVersion]:
        sent = self.sent
        head = [r for r in rows[: self.ahead] if r[6] > sent.get(r[5], 0)]
        return head + rows[self.ahead :]


@dataclass
class DeliverAhead:
    """The early deliveries of one maintenance job (see the module doc)."""

    client: Client
    keyspace: str
    last_round: RoundInfo | None = None
    # Nodes that may hold rows queued above the last round's end (for a fallback's drop),
    # and per data partition the highest seqno they may hold (until a round applied or
    # dropped it). Early rows are only used while the read-ahead's record of what it sent
    # reaches these: rows queued by a read-ahead that was discarded are known to no one,
    # and a later delivery of the same seqnos would be dropped as their duplicates.
    nodes: set[str] = field(default_factory=set)
    queued_to: dict[int, int] = field(default_factory=dict)
    # Nodes where a round of this query dropped above its start (and none of this job's
    # early rows went unrecorded since): what they hold above the applied TS is known here.
    # Elsewhere a previous job (or query) may have queued rows ahead, possibly of a branch
    # a rollback then cut off; a round naming such a node drops first. Empty for a new job
    # or query, so its first round drops on all its nodes.
    cleaned: set[str] = field(default_factory=set)
    delivered: int = 0  # key versions sent early (routed), for the bench
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def hook(self, done: concurrent.futures.Future[None] | None) -> Deliver:
        """The read-ahead's ``deliver`` for the read-ahead started beside the round whose
        completion is ``done``."""

        def deliver(ahead: Ahead, stop: threading.Event, wait: float) -> bool:
            if done is not None:
                try:
                    done.result(timeout=wait)
                except concurrent.futures.TimeoutError:
                    return True  # the round still runs: nothing may overtake it
                except BaseException:
                    return False  # the round failed: the next batch fails and restarts
            if stop.is_set():
                return False
            r = self.last_round
            if r is None or r.end != ahead.start:
                return False
            tag = ahead.tag
            if tag is not None and tag.round is not r and r.confirmed is not tag:
                # Sent before this round, which did not count on them (a fallback dropped
                # them from the queues): send them again.
                ahead.sent, ahead.sent_to, ahead.tag = 0, None, None
            if ahead.sent == len(ahead.rows):
                return True
            if not self._recorded(ahead.sent_to, ahead.start):
                return False  # rows no record knows may be queued: the next round drops
            rows = ahead.rows[ahead.sent :]
            end = ahead.end
            with gc_paused():
                routed = route((x for x in rows if x[0] in r.routes or x[2] == ERROR), r.routes)
            by_node = {n: v for n, v in routed.by_node.items() if v}
            self._queueing(by_node, end)
            try:
                deliver_rows(
                    self.client,
                    self.keyspace,
                    -1,
                    by_node,
                    {n: r.incarnations.get(n, "") for n in by_node},
                )
            except Exception as exc:  # an optimisation: the batch delivers them itself
                log.info("early delivery to the indexers of %s: %s", self.keyspace, exc)
                return False
            self.delivered += sum(len(v) for v in by_node.values())
            ahead.sent, ahead.sent_to, ahead.tag = len(rows) + ahead.sent, end, _Tag(r)
            return True

        return deliver

    def usable(self, taken: Taken | None, key: tuple[Any, ...], start: Timestamp) -> Skip | None:
        """The batch (``start``, ...] with views ``key`` may skip the rows ``taken`` says
        were delivered early iff they were routed by the same views, after the round that
        ended at ``start`` (or before it, and that round counted on them), and every
        partition's early rows are on the batch's branch."""
        r = self.last_round
        if taken is None or not taken.sent or not taken.branch_ok or r is None:
            return None
        tag = taken.tag
        if not isinstance(tag, _Tag) or r.end != start:
            return None
        if not self._recorded(taken.sent_to, start):
            return None
        if tag.round is not r and r.confirmed is not tag:
            return None
        if tag.round.key != key or not self._all_cleaned(plan_nodes(key)):
            return None
        with self._lock:
            nodes = set(self.nodes)
        incarnations = {n: i for n, i in tag.round.incarnations.items() if n in nodes}
        return Skip(len(taken.rows), dict(taken.sent), incarnations, tag)

    def send_taken(
        self,
        taken: Taken | None,
        views: Sequence[IndexView],
        key: tuple[Any, ...],
        start: Timestamp,
    ) -> Callable[[], Skip | None]:
        """At the batch's start: deliver the read-ahead's rows the batch took that are not
        sent yet, on a thread, while the batch reads the rest (when the previous round ended
        just before the batch, the read-ahead had no time to). Returns what waits for it
        and says what the round may skip (None: deliver everything)."""
        r = self.last_round
        if taken is None or not taken.rows or not taken.branch_ok or r is None:
            return lambda: self.usable(taken, key, start)
        if r.end != start or not self._recorded(taken.sent_to if taken.sent else None, start):
            return lambda: None
        if not self._all_cleaned(plan_nodes(key)):
            # A node this query never dropped on may hold a previous job's rows, which would
            # win over these: the round falls back (drops there first, then sends all).
            return lambda: None
        if taken.sent and self.usable(taken, key, start) is None:
            return lambda: None  # earlier early rows not usable: the fallback drops them
        sent = taken.sent
        unsent = [x for x in taken.rows if x[6] > sent.get(x[5], 0)]
        if not unsent:
            return lambda: self.usable(taken, key, start)
        routes = {v.id: v.route() for v in views}
        result: list[Skip | None] = [None]

        def run() -> None:
            with gc_paused():
                routed = route((x for x in unsent if x[0] in routes or x[2] == ERROR), routes)
            by_node = {n: v for n, v in routed.by_node.items() if v}
            self._queueing(by_node, taken.covered)
            with self._lock:
                nodes = set(self.nodes)
            try:
                report = deliver_rows(
                    self.client,
                    self.keyspace,
                    -1,
                    by_node,
                    {n: r.incarnations.get(n, "") for n in nodes},
                )
            except Exception as exc:  # an optimisation: the round sends these rows itself
                log.info("early delivery to the indexers of %s: %s", self.keyspace, exc)
                result[0] = self.usable(taken, key, start)
                return
            self.delivered += sum(len(v) for v in by_node.values())
            covered = {p: e.seqno for p, e in taken.covered.items() if e.seqno > start.seqno(p)}
            incarnations = {n: i for n, i in report.incarnations.items() if i and n in nodes}
            result[0] = Skip(len(taken.rows), covered, incarnations, taken.tag)

        thread = threading.Thread(target=run, name="deliver-taken", daemon=True)
        thread.start()

        def wait() -> Skip | None:
            thread.join()
            return result[0]

        return wait

    def _queueing(self, by_node: dict[str, list[KeyVersion]], upto: Timestamp) -> None:
        """Before an early delivery: who may hold what afterwards (even if it fails)."""
        with self._lock:
            self.nodes.update(by_node)
            for p, e in upto.items():
                if e.seqno > self.queued_to.get(p, 0):
                    self.queued_to[p] = e.seqno

    def _recorded(self, sent_to: Timestamp | None, start: Timestamp) -> bool:
        """Every early row that may be queued above ``start`` is within ``sent_to`` (what
        the read-ahead in hand records as sent)."""
        with self._lock:
            return all(
                q <= start.seqno(p) or (sent_to is not None and sent_to.seqno(p) >= q)
                for p, q in self.queued_to.items()
            )

    def _all_cleaned(self, nodes: Iterable[str]) -> bool:
        with self._lock:
            return self.cleaned.issuperset(nodes)

    def drop_above(
        self, start: Timestamp, end: Timestamp, plan: Iterable[str]
    ) -> dict[int, int] | None:
        """For a round that does not skip, over the nodes ``plan``: the queues to clear
        first (above ``start``), when rows may have been queued ahead: by this job (recorded
        in ``nodes``), or by a previous one on a node of ``plan`` not ``cleaned`` yet."""
        with self._lock:
            if not self.nodes and self.cleaned.issuperset(plan):
                return None
        return {p: start.seqno(p) for p in set(start) | set(end)}

    def drop_nodes(self) -> list[str]:
        with self._lock:
            return sorted(self.nodes)

    def round_done(
        self,
        end: Timestamp,
        key: tuple[Any, ...],
        routes: dict[str, IndexRoute],
        incarnations: dict[str, str],
        skip: Skip | None,
        dropped: bool,
    ) -> None:
        """A round succeeded (called on the tail thread, before its future completes).
        ``incarnations``: every node that answered it. A round that ``dropped`` did so on
        every node of its plan (a node that failed fails the round) and on the nodes outside
        it that took early rows and answered."""
        with self._lock:
            if dropped:
                answered = set(incarnations) | plan_nodes(key)
                # A node that took early rows and missed the drop keeps rows no record will
                # know once ``queued_to`` is cleared: not cleaned until a round drops there.
                self.cleaned = (self.cleaned - (self.nodes - answered)) | answered
                self.queued_to.clear()
            else:  # applied by this round (or superseded): no longer only queued
                self.queued_to = {p: q for p, q in self.queued_to.items() if q > end.seqno(p)}
            if not self.queued_to:
                self.nodes.clear()
        self.last_round = RoundInfo(
            end, key, routes, incarnations, skip.tag if skip is not None else None
        )

    def restart(self) -> None:
        """A new query: nothing recorded is known to hold any more."""
        with self._lock:
            self.cleaned.clear()
        self.last_round = None
