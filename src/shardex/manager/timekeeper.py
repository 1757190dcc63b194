"""The timekeeper: the end of a micro-batch (the mutation flow's steps 12-16).

The pipeline driver has delivered a batch's key versions to the indexers; it then sends
``AdvanceStability(keyspace, ts, index_ids, incarnations)`` to a manager node, whose
timekeeper:

12. decides the stability TS: the batch's end offset ``ts``, for the listed indexes that
    exist in this node's replica of the coordinator state (the rest are ``skipped``);
13. sends ``StabiliseSlices`` to every indexer node the latest index topologies name, in
    parallel, each with the incarnation the batch was delivered to there and the slices
    (index, partition) the topologies give it: no other local slice advances (the maintenance
    stream does 13-15 itself with ``DeliverAndStabilise``, one round trip per indexer, and
    brings the replies in ``AdvanceStability.stabilised``: they are checked in 16 alike);
14. (the indexers apply their queues up to ``ts`` in one atomic write and snapshot it);
15. waits for every ACK. Any failure (no connection, timeout, ``STALE_DELIVERY`` from an
    indexer that restarted since the delivery, a refusal) fails the whole request and
    publishes nothing: ``STALE_DELIVERY`` keeps its code (the caller must re-deliver the
    batch), everything else becomes NODE_UNAVAILABLE naming the node. Stabilise is
    idempotent, so the caller simply retries;
16. checks that every partition of each index's topology has a copy (its primary or a
    replica) that acknowledged a slice in state ``active`` or ``created`` whose applied TS
    covers ``ts`` (an index with a partition whose copies are all loading, needing a rebuild
    or missing is ``skipped``; ``check_acks``); the copies of such a ready index that did not
    reach ``ts`` first leave the index topology (``DropIndexCopies``, committed by the master:
    they lack the round's rows, ``index_copies.py``), and the index moves whose target (a
    catching-up copy, not in the topology yet) did not answer the round fail, for the same
    reason, in the same commit; then it publishes ``ts`` as the
    stability TS of the ready indexes: held here in memory (monotonic per index), and the
    reply goes back at once. Their indexers are told with ``PublishStability`` after the
    reply (best effort: an indexer keeps it only as a hint for status; scans wait on the
    slices' own snapshots, ``index/scan_wait.py``), through one queue per indexer node whose
    sender waits for each answer before the next: an indexer takes any TS its held one does
    not cover (a new history branch after a rollback), so two publishes in flight at once
    could land in the wrong order and move it back.

This runs every micro-batch (a few times a second): it reads the local replica's state and
commits nothing, but for the copies left behind (above) and, at a low rate, an index's
entries when they moved away from the recorded ``items_count`` (``index_items.py``, in the
background after the reply). Requests for one keyspace are serialised (a later batch never
overtakes an earlier one's publication); keyspaces proceed independently.

The held stability TSs live in the memory of the node that ran the requests: the pipeline
must keep talking to the same manager node, and after a restart the held map starts empty
(``StabilityRequest`` answers with what is held).
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any, Final

from shardex.api.delivery import (
    PublishStability,
    SliceAck,
    Stabilised,
    StabiliseSlices,
    StabilityPublished,
    WireTs,
)
from shardex.api.index_ddl import DropIndexCopies
from shardex.api.timekeeper import (
    AdvanceStability,
    StabilityAdvanced,
    StabilityReply,
    StabilityRequest,
)
from shardex.core.tally import Tally
from shardex.core.timestamp import Timestamp
from shardex.core.topology import Topology
from shardex.errors import ErrorCode, NodeUnavailable, ShardexError
from shardex.manager.index_items import ItemsRecorder
from shardex.meta.index_state import INIT, LIVE_STATES, latest_index_topology
from shardex.meta.member_list import UP
from shardex.meta.state import StateContext
from shardex.net import Connection, ConnectionPool, RpcServer
from shardex.net.transport import Transport

__all__ = [
    "MAX_QUEUED_PUBLISHES",
    "PUBLISH_TIMEOUT",
    "STABILISE_TIMEOUT",
    "AckCheck",
    "StabilisePlan",
    "Timekeeper",
    "check_acks",
    "plan_stabilise",
    "verify_acks",
]

log = logging.getLogger(__name__)

# One stabilise fsyncs every local slice of the indexes: allow for a slow disk under load,
# but stay below the pipeline's own timeout for the whole request (30 s).
STABILISE_TIMEOUT: Final = 20.0
PUBLISH_TIMEOUT: Final = 5.0
# Publishes waiting per indexer node behind one in flight. A few rounds a second against a
# 5 s publish timeout: a hung indexer would queue ~25; past this the oldest goes (each
# publish is a hint the next one supersedes).
MAX_QUEUED_PUBLISHES: Final = 64
# Slice states whose applied TS is the slice's content (loading / needs_rebuild are not).
STABLE_SLICE_STATES: Final = frozenset({"active", "created"})
# Slice states that are expected to keep an index from being published (no warning).
_EXPECTED_SKIPS: Final = frozenset({"loading", "created"})


@dataclass
class StabilisePlan:
    """Which indexes to stabilise, on which nodes. ``by_node``: node -> index ids."""

    topologies: dict[str, Topology] = field(default_factory=dict)
    by_node: dict[str, list[str]] = field(default_factory=dict)
    skipped: dict[str, str] = field(default_factory=dict)  # index id -> why
    # node -> index id -> partitions it receives as an index move's target (not in the
    # topology yet: stabilised, never part of ``verify_acks``)
    moving: dict[str, dict[str, list[int]]] = field(default_factory=dict)
    # node -> index id -> the partitions the round stabilises there (the topology's and the
    # move targets'): an indexer leaves its other slices alone (``StabiliseSlices.slices``)
    slices: dict[str, dict[str, list[int]]] = field(default_factory=dict)


def plan_stabilise(
    state: StateContext,
    keyspace: str,
    index_ids: Iterable[str],
    moving: dict[str, dict[int, str]] | None = None,
) -> StabilisePlan:
    """Group the index partitions of ``index_ids`` by the indexer of their latest topology.
    Unknown ids, indexes of another keyspace, and indexes in INIT or DELETED (their slices
    may not exist) are skipped. ``moving``: index -> partition -> target of the moves the
    batch was routed to both ends of; each target joins the round for that index."""
    plan = StabilisePlan()
    nodes: dict[str, set[str]] = {}
    for index_id in dict.fromkeys(index_ids):
        rec = state.indexes.get(index_id)
        topo = latest_index_topology(state.index_topologies, index_id)
        if rec is None or rec.keyspace != keyspace:
            plan.skipped[index_id] = f"no index {index_id} on keyspace {keyspace!r}"
        elif rec.state not in LIVE_STATES or rec.state == INIT:
            plan.skipped[index_id] = f"index {rec.name!r} is {rec.state}"
        elif topo is None or not topo.assignment:
            plan.skipped[index_id] = f"index {rec.name!r} has no topology"
        else:
            plan.topologies[index_id] = topo
            for p in sorted(topo.assignment):
                for node in topo.chain(p):  # the primary and every replica copy
                    nodes.setdefault(node, set()).add(index_id)
                    plan.slices.setdefault(node, {}).setdefault(index_id, []).append(p)
            for p, target in sorted((moving or {}).get(index_id, {}).items()):
                nodes.setdefault(target, set()).add(index_id)
                plan.moving.setdefault(target, {}).setdefault(index_id, []).append(p)
                named = plan.slices.setdefault(target, {}).setdefault(index_id, [])
                if p not in named:
                    named.append(p)
    plan.by_node = {n: sorted(ids) for n, ids in sorted(nodes.items())}
    return plan


@dataclass
class AckCheck:
    """What a round's replies allow (``check_acks``)."""

    ready: dict[str, int] = field(default_factory=dict)  # index id -> items at the TS
    not_ready: dict[str, str] = field(default_factory=dict)  # index id -> why not
    # index id -> (partition, node) of the copies of a ready index that did not reach the TS
    # (with the reason): published without them, they must leave the topology first
    behind: dict[str, dict[tuple[int, str], str]] = field(default_factory=dict)
    # index id -> (partition, node) of the move targets of a ready index that did not answer
    # the round: their queues lack its rows, so their moves must fail first
    targets_behind: dict[str, list[tuple[int, str]]] = field(default_factory=dict)


def check_acks(plan: StabilisePlan, replies: dict[str, Stabilised], ts: Timestamp) -> AckCheck:
    """An index is ready at ``ts`` when every partition of its topology has a copy (the
    primary or a replica) whose slice acknowledged ``ts`` in a stable state; its copies that
    did not are ``behind``. Items are counted once per partition (the first stable copy:
    every copy holds the same entries). The move targets (``plan.moving``) of a ready index
    that sent no acknowledgement of their slice (in any state: a loading copy queues) are
    ``targets_behind``."""
    acks: dict[tuple[str, str, int], SliceAck] = {}
    missing: set[tuple[str, str]] = set()
    for node, reply in replies.items():
        for ack in reply.acks:
            acks[(node, ack.index_id, ack.partition)] = ack
        missing.update((node, index_id) for index_id in reply.missing)
    out = AckCheck()
    for index_id, topo in plan.topologies.items():
        items = 0
        blocked = None
        behind: dict[tuple[int, str], str] = {}
        for p in sorted(topo.assignment):
            good = None
            for node in topo.chain(p):
                ack = acks.get((node, index_id, p))
                if ack is None:
                    gone = (
                        "has no slices of the index" if (node, index_id) in missing else "did not"
                    )
                    why = f"missing: {node} {gone} acknowledge partition {p}"
                elif ack.state not in STABLE_SLICE_STATES:
                    why = f"{ack.state}: partition {p} on {node} is {ack.state}"
                elif not Timestamp.from_wire(ack.applied).covers(ts):
                    why = f"{ack.state}: partition {p} on {node} has not applied the TS"
                else:
                    good = good or ack
                    continue
                behind[(p, node)] = why
            if good is None:
                # No copy of p holds the TS: the first copy's reason (the primary's).
                blocked = next(w for (q, _n), w in behind.items() if q == p)
                break
            items += good.items_count
        if blocked is not None:
            out.not_ready[index_id] = blocked
            continue
        out.ready[index_id] = items
        if behind:
            out.behind[index_id] = behind
    for node, by_index in sorted(plan.moving.items()):
        for index_id, parts in sorted(by_index.items()):
            late = [(p, node) for p in parts if (node, index_id, p) not in acks]
            if late and index_id in out.ready:
                out.targets_behind.setdefault(index_id, []).extend(late)
    return out


def verify_acks(
    plan: StabilisePlan, replies: dict[str, Stabilised], ts: Timestamp
) -> tuple[dict[str, int], dict[str, str]]:
    """(index id -> items, for the indexes stable at ``ts``; index id -> why not, for the
    others): ``check_acks`` without the copies left behind."""
    check = check_acks(plan, replies, ts)
    return check.ready, check.not_ready


class Timekeeper:
    """The timekeeper of one manager node (every manager runs one; the pipeline picks one)."""

    def __init__(
        self,
        *,
        transport: Transport,
        secret: str,
        name: str,
        coordinator: Callable[[], Any | None],
        membership: Callable[[], Any | None],
        stabilise_timeout: float = STABILISE_TIMEOUT,
        publish_timeout: float = PUBLISH_TIMEOUT,
        items: ItemsRecorder | None = None,
    ) -> None:
        self.name = name
        # keeps the indexes' recorded entries (their slice weights) current in the state
        self.items = items or ItemsRecorder(coordinator)
        self._coordinator = coordinator
        self._membership = membership
        self.stabilise_timeout = stabilise_timeout
        self.publish_timeout = publish_timeout
        self.pool = ConnectionPool(transport, secret, name=f"{name}/timekeeper")
        self._locks: dict[str, asyncio.Lock] = {}
        # keyspace -> index id -> the stability TS published last (monotonic)
        self.published: dict[str, dict[str, Timestamp]] = {}
        # keyspace -> index id -> the skip reason logged last
        self._skip_seen: dict[str, dict[str, str]] = {}
        # node -> publishes not yet sent to it, in round order; its sender task (one at most)
        self._outbox: dict[str, deque[PublishStability]] = {}
        self._drops = Tally()  # publishes dropped from a full queue, per node (for the log)
        self._senders: dict[str, asyncio.Task[None]] = {}

    def install(self, server: RpcServer) -> None:
        server.route(AdvanceStability, self._on_advance)
        server.route(StabilityRequest, self._on_request)

    async def stop(self) -> None:
        senders = list(self._senders.values())
        for task in senders:
            task.cancel()
        await asyncio.gather(*senders, return_exceptions=True)
        self._outbox.clear()
        await self.items.stop()
        await self.pool.close()

    async def drain_publishes(self) -> None:
        """Return once every publish queued so far has been answered or given up on (for
        tests and callers that want the indexers told, not only the TS held)."""
        while self._senders:
            await asyncio.gather(*self._senders.values(), return_exceptions=True)

    # -- handlers -------------------------------------------------------------------------

    async def _on_advance(self, msg: AdvanceStability, conn: Connection) -> StabilityAdvanced:
        return await self.advance(msg)

    async def _on_request(self, msg: StabilityRequest, conn: Connection) -> StabilityReply:
        return StabilityReply(stability=self.stability(msg.keyspace))

    def stability(self, keyspace: str) -> dict[str, WireTs]:
        """Index id -> the stability TS held for the indexes of ``keyspace`` (dropped
        indexes are forgotten here)."""
        held = self.published.get(keyspace, {})
        state = self._state_or_none()
        if state is not None:
            for index_id in [i for i in held if i not in state.indexes]:
                del held[index_id]
        return {i: ts.to_wire() for i, ts in sorted(held.items())}

    async def advance(self, msg: AdvanceStability) -> StabilityAdvanced:
        lock = self._locks.get(msg.keyspace)
        if lock is None:
            lock = self._locks[msg.keyspace] = asyncio.Lock()
        async with lock:
            return await self._advance(msg)

    # -- the flow ---------------------------------------------------------------------------

    async def _advance(self, msg: AdvanceStability) -> StabilityAdvanced:
        loop = asyncio.get_running_loop()
        started = loop.time()
        ts = Timestamp.from_wire(msg.ts)  # BAD_REQUEST for a negative seqno
        wire = ts.to_wire()
        state = self._state()
        plan = plan_stabilise(state, msg.keyspace, msg.index_ids, msg.moving)
        if msg.stabilised is not None:
            # The pipeline's DeliverAndStabilise did steps 13-15: the replies it brings are
            # checked like our own (a node of the plan that did not answer keeps its indexes
            # from being published).
            replies = {n: r for n, r in msg.stabilised.items() if n in plan.by_node}
        else:
            replies = await self._stabilise_all(msg, plan, wire)
        stabilised = loop.time()
        check = check_acks(plan, replies, ts)
        ready, not_ready = check.ready, check.not_ready
        dropped = await self._drop_behind(msg.keyspace, check, wire)
        skipped = {**plan.skipped, **not_ready}
        self._log_skips(msg.keyspace, skipped, ready)
        if ready:
            held = self.published.setdefault(msg.keyspace, {})
            for index_id in ready:
                before = held.get(index_id)
                if before is None or not before.covers(ts):
                    held[index_id] = ts
            self._queue_publishes(msg.keyspace, plan, ready, wire)
            self.items.observe(state, ready)
        log.debug(
            "timekeeper %s: %s batch %d: stabilise on %d node(s) %.1f ms, check %.1f ms; "
            "published %d, skipped %d",
            self.name,
            msg.keyspace,
            msg.batch_id,
            len(plan.by_node),
            (stabilised - started) * 1e3,
            (loop.time() - stabilised) * 1e3,
            len(ready),
            len(skipped),
        )
        return StabilityAdvanced(
            keyspace=msg.keyspace,
            ts=wire,
            published=sorted(ready),
            items_count=dict(sorted(ready.items())),
            skipped=sorted(skipped),
            dropped_copies=dropped,
        )

    async def _drop_behind(
        self, keyspace: str, check: AckCheck, wire: WireTs
    ) -> dict[str, list[tuple[int, str]]]:
        """Before a TS is published for an index without some of its copies, those copies
        leave the topology (``manager/index_copies.py``): they lack the round's rows. An
        index whose copies cannot be dropped now is not published (moved to ``not_ready``).
        Returns index id -> the copies taken out."""
        out: dict[str, list[tuple[int, str]]] = {}
        coord = self._coordinator()
        for index_id in sorted({*check.behind, *check.targets_behind}):
            behind = check.behind.get(index_id, {})
            targets = sorted(check.targets_behind.get(index_id, []))
            msg = DropIndexCopies(
                index_id=index_id,
                copies=sorted(behind),
                ts=dict(wire),
                request_id=None if coord is None else coord.new_id(),
                targets=targets,
            )
            try:
                if coord is None:
                    raise NodeUnavailable(f"{self.name} runs no coordinator", details={})
                reply = await coord.submit(msg)
            except ShardexError as exc:
                check.ready.pop(index_id, None)
                check.not_ready[index_id] = (
                    f"copies behind: {sorted(behind)}, move targets behind: {targets} "
                    f"({exc.message})"
                )
                continue
            out[index_id] = list(reply.dropped)
            log.info(
                "timekeeper %s: %s: %s published without %s (%s); moves failed: %s",
                self.name,
                keyspace,
                index_id,
                sorted(behind),
                "; ".join(sorted(set(behind.values()))),
                reply.failed_moves,
            )
        return out

    async def _stabilise_all(
        self, msg: AdvanceStability, plan: StabilisePlan, wire: WireTs
    ) -> dict[str, Stabilised]:
        """Steps 13-15: every node in parallel; all must answer, or nothing is published."""
        nodes = list(plan.by_node)

        async def one(node: str) -> Stabilised | ShardexError:
            request = StabiliseSlices(
                keyspace=msg.keyspace,
                ts=wire,
                index_ids=plan.by_node[node],
                incarnation=msg.incarnations.get(node, ""),
                moving=plan.moving.get(node, {}),
                slices=plan.slices.get(node, {}),
            )
            try:
                address = self._address(node)
                return await self.pool.request(
                    address, request, self.stabilise_timeout, expect=Stabilised
                )
            except ShardexError as exc:
                return exc

        results = await asyncio.gather(*(one(n) for n in nodes))
        failed = {n: r for n, r in zip(nodes, results, strict=True) if isinstance(r, ShardexError)}
        if failed:
            raise self._failure(msg, failed)
        return {n: r for n, r in zip(nodes, results, strict=True) if isinstance(r, Stabilised)}

    def _failure(self, msg: AdvanceStability, failed: dict[str, ShardexError]) -> ShardexError:
        errors = {n: str(e) for n, e in failed.items()}
        stale = [n for n, e in failed.items() if e.code is ErrorCode.STALE_DELIVERY]
        if stale:
            node = stale[0]
            exc = failed[node]
            return ShardexError(
                f"indexer {node} did not stabilise {msg.keyspace!r} (batch {msg.batch_id}): "
                f"{exc.message}; nothing was published",
                code=ErrorCode.STALE_DELIVERY,
                details={
                    **exc.details,
                    "node": node,
                    "nodes": stale,
                    "failed": errors,
                    "hint": "re-deliver the batch to the restarted indexer(s), then retry",
                },
            )
        node, exc = next(iter(failed.items()))
        return NodeUnavailable(
            f"indexer {node} did not stabilise {msg.keyspace!r} (batch {msg.batch_id}): "
            f"{exc}; nothing was published",
            details={
                "node": node,
                "error": str(exc),
                "code": exc.code.value,
                "failed": errors,
                "hint": "retry the batch (stabilise is idempotent)",
            },
        )

    def _queue_publishes(
        self, keyspace: str, plan: StabilisePlan, ready: dict[str, int], wire: WireTs
    ) -> None:
        """Step 16 on the indexers, after the reply: each node's message joins its queue.
        Requests of a keyspace are serialised, so a queue holds them in round order."""
        for node, ids in plan.by_node.items():
            stability = {i: wire for i in ids if i in ready}
            if not stability:
                continue
            queue = self._outbox.setdefault(node, deque())
            if len(queue) >= MAX_QUEUED_PUBLISHES:
                dropped = queue.popleft()
                n = self._drops.hit(node)  # a node this far behind drops one per round
                if n:
                    log.info(
                        "timekeeper %s: %s is %d publishes behind: dropped the oldest (%s); "
                        "%d dropped since the last report (one every %.0f s at most)",
                        self.name,
                        node,
                        len(queue) + 1,
                        dropped.keyspace,
                        n,
                        self._drops.interval,
                    )
            queue.append(PublishStability(keyspace=keyspace, stability=stability))
            if node not in self._senders:
                task = asyncio.create_task(self._send_publishes(node))
                self._senders[node] = task

    async def _send_publishes(self, node: str) -> None:
        """Send ``node``'s queued publishes one at a time, each after the previous one's
        answer (or failure): the indexer sees them in round order. Ends with the queue."""
        queue = self._outbox[node]
        try:
            while queue:
                request = queue.popleft()
                try:
                    await self.pool.request(
                        self._address(node),
                        request,
                        self.publish_timeout,
                        expect=StabilityPublished,
                    )
                except ShardexError as exc:
                    log.info("timekeeper %s: publishing to %s failed: %s", self.name, node, exc)
                except Exception:  # a bug must not stop the node's later publishes
                    log.exception("timekeeper %s: publishing to %s", self.name, node)
        finally:
            del self._senders[node]
            if not queue:
                del self._outbox[node]

    # -- plumbing ---------------------------------------------------------------------------

    def _state_or_none(self) -> StateContext | None:
        coord = self._coordinator()
        return None if coord is None else coord.state

    def _state(self) -> StateContext:
        state = self._state_or_none()
        if state is None:
            raise NodeUnavailable(
                f"{self.name} runs no coordinator",
                details={"node": self.name, "hint": "ask a manager"},
            )
        return state

    def _address(self, node: str) -> str:
        """The member's address if it is up in this node's view (as the DDL addresses
        indexers); NODE_UNAVAILABLE otherwise, at once rather than after a timeout."""
        membership = self._membership()
        if membership is None:
            raise NodeUnavailable(f"{self.name} has not joined the cluster yet", details={})
        now = asyncio.get_running_loop().time()
        for m in membership.members:
            if m.name == node:
                if membership.state_of(m.member_id, now)[0] != UP:
                    raise NodeUnavailable(f"{node} is down", details={"node": node})
                return str(m.address)
        raise NodeUnavailable(f"{node} is not a cluster member", details={"node": node})

    def _log_skips(self, keyspace: str, skipped: dict[str, str], ready: Iterable[str]) -> None:
        """A skip reason is logged when it changes: loading slices skip every batch of an
        initial build, which must not flood the log."""
        seen = self._skip_seen.setdefault(keyspace, {})
        for index_id, why in skipped.items():
            if seen.get(index_id) == why:
                continue
            seen[index_id] = why
            level = logging.DEBUG if why.split(":", 1)[0] in _EXPECTED_SKIPS else logging.INFO
            log.log(
                level,
                "timekeeper %s: %s: not publishing %s: %s",
                self.name,
                keyspace,
                index_id,
                why,
            )
        for index_id in ready:
            seen.pop(index_id, None)
