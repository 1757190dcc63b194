"""One stability round as a state machine: events in, instructions out, no I/O.

The round is the maintenance stream's exactly-once step (``docs/architecture.md``, "Index
pipeline"): every indexer of the round's plan gets its rows in frames, one after the other,
the last one a ``DeliverAndStabilise`` at the round's TS; every frame after the first names
the incarnation that took the first (a restarted indexer lost its queue and refuses with
STALE_DELIVERY); once every node has answered ``Stabilised``, the timekeeper gets the replies
in ``AdvanceStability.stabilised``, checks them and publishes the TS. ``RoundSender`` and
``advance_stability`` (``indexers.py``) do this with the client's loop and connections; this
module holds the same decisions apart from any transport, in the shape of Dask's
``worker_state_machine.py``: ``RoundMachine.start`` and ``RoundMachine.handle(event)``
return instructions (send this message to that node, ask the timekeeper, the round is
done or failed) and the caller performs them and feeds the outcomes back as events. The
simulator drives it over its network with crashes (``tests/sim/test_rounds_sim.py``), so a
failing seed replays the round exactly.

A failed round publishes nothing and says why: ``stale`` (an indexer restarted under the
round: deliver the whole round again) or not (a node or the timekeeper did not answer:
retry; stabilise is idempotent and re-delivered rows are dropped by seqno).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from shardex.api.delivery import (
    MAX_ROWS_PER_FRAME,
    DeliverAndStabilise,
    Delivered,
    DeliverKeyVersions,
    Stabilised,
)
from shardex.api.timekeeper import AdvanceStability, StabilityAdvanced
from shardex.core.timestamp import Timestamp
from shardex.errors import ErrorCode, ShardexError
from shardex.index.keyversion import KeyVersion
from shardex.pipeline.indexers import DeliveryReport

__all__ = [
    "AdvanceFailed",
    "Advanced",
    "AskTimekeeper",
    "Instruction",
    "NodeFailed",
    "NodeReplied",
    "RoundDone",
    "RoundEvent",
    "RoundFailed",
    "RoundMachine",
    "RoundSpec",
    "SendToIndexer",
]


# --- events (what happened) ------------------------------------------------------------------


@dataclass(frozen=True)
class NodeReplied:
    node: str
    reply: Delivered | Stabilised


@dataclass(frozen=True)
class NodeFailed:
    """A frame to ``node`` failed: a refusal, a timeout, a closed connection."""

    node: str
    error: ShardexError


@dataclass(frozen=True)
class Advanced:
    reply: StabilityAdvanced


@dataclass(frozen=True)
class AdvanceFailed:
    error: ShardexError


RoundEvent = NodeReplied | NodeFailed | Advanced | AdvanceFailed


# --- instructions (what to do) ---------------------------------------------------------------


@dataclass(frozen=True)
class SendToIndexer:
    """Send ``message`` to ``node`` and report its reply (``NodeReplied``) or failure
    (``NodeFailed``). A node has at most one frame out at a time."""

    node: str
    message: DeliverKeyVersions | DeliverAndStabilise

    @property
    def expect(self) -> type[Delivered] | type[Stabilised]:
        return Stabilised if isinstance(self.message, DeliverAndStabilise) else Delivered


@dataclass(frozen=True)
class AskTimekeeper:
    """Send ``message`` to the timekeeper; report ``Advanced`` or ``AdvanceFailed``."""

    message: AdvanceStability


@dataclass(frozen=True)
class RoundDone:
    """The timekeeper answered: ``published`` index ids are stable at ``ts``."""

    ts: Timestamp
    published: list[str]
    skipped: list[str]
    report: DeliveryReport


@dataclass(frozen=True)
class RoundFailed:
    """Nothing was published. ``stale``: an indexer restarted under the round."""

    error: ShardexError
    stale: bool


Instruction = SendToIndexer | AskTimekeeper | RoundDone | RoundFailed


# --- the round -------------------------------------------------------------------------------


@dataclass(frozen=True)
class RoundSpec:
    """What one round delivers and stabilises (the arguments of ``deliver_and_stabilise``).

    ``by_node``: routed rows per node; ``plan``: node -> the index ids it hosts (every node
    of the plan stabilises, rows or not); ``slices``: node -> index id -> the partitions the
    round stabilises there; ``moving``: node -> index id -> partitions it receives as a
    move's target; ``advance_moving``: index id -> partition -> target (for the
    timekeeper); ``early``: node -> the incarnation that took rows delivered ahead;
    ``drop_above``: data partition -> seqno above which each node first forgets its queue;
    ``drop_nodes``: nodes outside the round that took early rows and get the drop too, best
    effort (one unreachable either died, its queue with it, or is cut off: a later round
    naming it delivers its rows then), their replies left out of the timekeeper's check.
    """

    keyspace: str
    batch_id: int
    ts: Timestamp
    index_ids: Sequence[str]
    by_node: Mapping[str, Sequence[KeyVersion]]
    plan: Mapping[str, Sequence[str]]
    slices: Mapping[str, Mapping[str, list[int]]] | None = None
    moving: Mapping[str, Mapping[str, list[int]]] = field(default_factory=dict)
    advance_moving: Mapping[str, Mapping[int, str]] = field(default_factory=dict)
    early: Mapping[str, str] = field(default_factory=dict)
    drop_above: Mapping[int, int] | None = None
    drop_nodes: Sequence[str] = ()
    frame_rows: int = MAX_ROWS_PER_FRAME


class _NodeRound:
    """One node's frames, sent one after the other."""

    __slots__ = ("best_effort", "done", "frames", "incarnation", "next", "stabilised")

    def __init__(
        self, frames: list[Sequence[KeyVersion]], incarnation: str, best_effort: bool = False
    ) -> None:
        self.frames = frames  # never empty: the last one goes with the stabilise
        self.next = 0  # index of the frame to send next
        self.incarnation = incarnation  # what the next frame names ("" = any)
        self.stabilised: Stabilised | None = None
        self.best_effort = best_effort  # a drop-only node: its failure fails nothing
        self.done = False  # answered ``Stabilised`` (or, best effort, failed)


class RoundMachine:
    """One round's decisions (module docstring). Not thread-safe; one caller drives it."""

    def __init__(self, spec: RoundSpec) -> None:
        self.spec = spec
        self.report = DeliveryReport()
        self.state = "new"  # new -> delivering -> advancing -> done | failed
        self._wire = dict(spec.ts.to_wire())
        self._drop_sent: set[str] = set()
        size = max(1, spec.frame_rows)
        for node, incarnation in spec.early.items():
            if incarnation:
                # Another incarnation answering is STALE (``DeliveryReport.add``).
                self.report.incarnations[node] = incarnation
        self._nodes: dict[str, _NodeRound] = {}
        for node in sorted(set(spec.plan) | {n for n, rows in spec.by_node.items() if rows}):
            rows = spec.by_node.get(node, ())
            frames = [rows[i : i + size] for i in range(0, len(rows), size)] or [[]]
            self._nodes[node] = _NodeRound(frames, spec.early.get(node, ""))
        if spec.drop_above is not None:
            for node in sorted(set(spec.drop_nodes) - set(self._nodes)):
                self._nodes[node] = _NodeRound([[]], spec.early.get(node, ""), best_effort=True)

    @property
    def nodes(self) -> list[str]:
        return list(self._nodes)

    def start(self) -> list[Instruction]:
        if self.state != "new":
            raise RuntimeError(f"round already {self.state}")
        self.state = "delivering"
        return [self._next_frame(n) for n in self._nodes]

    def handle(self, event: RoundEvent) -> list[Instruction]:
        """The instructions that ``event`` leads to. Events after the round ended (a
        late reply of a failed round) change nothing."""
        if self.state in ("done", "failed"):
            return []
        if isinstance(event, NodeReplied):
            return self._on_reply(event.node, event.reply)
        if isinstance(event, NodeFailed):
            nr = self._nodes.get(event.node)
            if nr is not None and nr.best_effort and self.state == "delivering":
                nr.done = True
                return self._maybe_advance()
            return self._fail(event.error)
        if isinstance(event, Advanced):
            return self._on_advanced(event.reply)
        return self._fail(event.error)

    # -- transitions ----------------------------------------------------------------------

    def _next_frame(self, node: str) -> SendToIndexer:
        nr = self._nodes[node]
        rows = list(nr.frames[nr.next])
        last = nr.next == len(nr.frames) - 1
        nr.next += 1
        drop = None
        if self.spec.drop_above is not None and node not in self._drop_sent:
            self._drop_sent.add(node)  # the node's first frame forgets its queue above
            drop = dict(self.spec.drop_above)
        msg: DeliverKeyVersions | DeliverAndStabilise
        if not last:
            msg = DeliverKeyVersions(
                keyspace=self.spec.keyspace,
                batch_id=self.spec.batch_id,
                rows=rows,
                incarnation=nr.incarnation,
                drop_above=drop,
            )
        else:
            slices = self.spec.slices
            msg = DeliverAndStabilise(
                keyspace=self.spec.keyspace,
                batch_id=self.spec.batch_id,
                rows=rows,
                ts=self._wire,
                index_ids=list(self.spec.plan.get(node, ())),
                incarnation=nr.incarnation,
                moving=dict(self.spec.moving.get(node, {})),
                slices=None if slices is None else dict(slices.get(node, {})),
                drop_above=drop,
            )
        return SendToIndexer(node, msg)

    def _on_reply(self, node: str, reply: Delivered | Stabilised) -> list[Instruction]:
        nr = self._nodes.get(node)
        if nr is None or self.state != "delivering":
            return []
        try:
            self.report.add(reply)  # a second incarnation of one node: STALE_DELIVERY
        except ShardexError as exc:
            if nr.best_effort:
                nr.done = True
                return self._maybe_advance()
            return self._fail(exc)
        nr.incarnation = reply.incarnation
        if isinstance(reply, Stabilised):
            nr.stabilised = reply
            nr.done = True
        elif nr.next < len(nr.frames):
            return [self._next_frame(node)]
        return self._maybe_advance()

    def _maybe_advance(self) -> list[Instruction]:
        if not all(r.done for r in self._nodes.values()):
            return []
        self.state = "advancing"
        replies = {
            n: r.stabilised
            for n, r in self._nodes.items()
            if r.stabilised is not None and not r.best_effort
        }
        msg = AdvanceStability(
            keyspace=self.spec.keyspace,
            ts=self._wire,
            index_ids=list(self.spec.index_ids),
            batch_id=self.spec.batch_id,
            incarnations=dict(self.report.incarnations),
            moving={i: dict(m) for i, m in self.spec.advance_moving.items()},
            stabilised=replies,
        )
        return [AskTimekeeper(msg)]

    def _on_advanced(self, reply: StabilityAdvanced) -> list[Instruction]:
        if self.state != "advancing":
            return []
        self.state = "done"
        ts = Timestamp.from_wire(reply.ts)
        return [RoundDone(ts, list(reply.published), list(reply.skipped), self.report)]

    def _fail(self, error: ShardexError) -> list[Instruction]:
        self.state = "failed"
        return [RoundFailed(error, stale=error.code is ErrorCode.STALE_DELIVERY)]
