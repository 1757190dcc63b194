"""One stability round as a state machine: events in, instructions out, no I/O.

The round is the maintenance stream's exactly-once step (``docs/architecture.md``, "Index
pipeline"): every indexer of the round's plan gets its rows in frames, one after the other,
the last one a ``DeliverAndStabilise`` at the round's TS; a node's first frame carries the
round's ``drop_above`` and every later one names the incarnation that took the first (a
restarted indexer lost its queue and refuses with STALE_DELIVERY); once every node has
answered ``Stabilised``, the timekeeper gets the replies in ``AdvanceStability.stabilised``,
checks them and publishes the TS.

The rules live here alone, in the shape of Dask's ``worker_state_machine.py``:
``RoundMachine.handle(event)`` returns instructions (send this message to that node, ask the
timekeeper, the round is done or failed) and its caller performs them and feeds the
outcomes back as events. A round opens before its end is known: ``MoreRows`` queues rows
while later ones are still read and projected (``streamed.py``), ``RoundEnds`` brings the
last rows, the TS and the plan. The pipeline's driver runs it on the client's loop
(``sender.py``); the simulator over its network with crashes (``tests/sim/test_rounds_sim.py``),
so a failing seed replays the round exactly.

A failed round publishes nothing and says why: ``stale`` (an indexer restarted under the
round: deliver the whole round again) or not (the timekeeper did not answer, or no node
did: retry; stabilise is idempotent and re-delivered rows are dropped by seqno).

A node that does not answer (NODE_UNAVAILABLE, a timeout, a closed connection, any refusal
but STALE_DELIVERY) no longer fails the round: its slices *missed* it. The machine stops
sending to it, and once every other node has answered the timekeeper checks the replies it
has: an index is published when each of its partitions has a copy that stabilised (index
replicas), after the copies that missed it left the topology; an index with a partition
that has no such copy is skipped, and the pipeline catches it up in a later round (its
applied TS stays behind, ``registry.py``). So a dead indexer stops only the indexes it holds
the last live copy of (``docs/decisions/0085-index-replicas.md``).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from shardex.api.delivery import (
    MAX_ROWS_PER_FRAME,
    DeliverAndStabilise,
    Delivered,
    DeliverKeyVersions,
    Stabilised,
    WireTs,
)
from shardex.api.timekeeper import AdvanceStability, StabilityAdvanced
from shardex.core.timestamp import Timestamp
from shardex.errors import ErrorCode, ShardexError
from shardex.index.keyversion import KeyVersion

__all__ = [
    "AdvanceFailed",
    "Advanced",
    "AskTimekeeper",
    "DeliveryReport",
    "Instruction",
    "MoreRows",
    "NodeFailed",
    "NodeReplied",
    "RoundDone",
    "RoundEnds",
    "RoundEvent",
    "RoundFailed",
    "RoundMachine",
    "RoundSpec",
    "SendToIndexer",
]


class DeliveryReport:
    """What one round's delivery did: node -> incarnation it reached, and row counts."""

    __slots__ = ("accepted", "dropped", "incarnations", "missed", "unknown")

    def __init__(self) -> None:
        self.incarnations: dict[str, str] = {}
        self.missed: dict[str, ShardexError] = {}  # nodes that missed the round: why
        self.accepted = 0
        self.dropped = 0
        self.unknown = 0

    def add(self, reply: Delivered | Stabilised) -> None:
        seen = self.incarnations.setdefault(reply.node, reply.incarnation)
        if seen != reply.incarnation:
            # The indexer restarted between two frames of this round: the first ones died
            # with the old process, and a stabilise naming the new one would not notice.
            raise ShardexError(
                f"indexer {reply.node} restarted during the delivery (incarnation {seen}, "
                f"then {reply.incarnation})",
                code=ErrorCode.STALE_DELIVERY,
                details={"node": reply.node, "hint": "deliver the whole batch again"},
            )
        self.accepted += reply.accepted
        self.dropped += reply.dropped
        self.unknown += reply.unknown


# --- events (what happened) ------------------------------------------------------------------


@dataclass(frozen=True)
class MoreRows:
    """More of the round's rows, routed (node -> rows), while the round is still open: each
    node's go after what it was given before."""

    by_node: Mapping[str, Sequence[KeyVersion]]


@dataclass(frozen=True)
class RoundEnds:
    """The round's last rows and its stabilise at ``ts`` (the arguments of
    ``deliver_and_stabilise``). ``plan``: node -> the index ids it hosts (every node of the
    plan stabilises, rows or not, and so does every node that took rows); ``slices``: node
    -> index id -> the partitions the round stabilises there; ``moving``: node -> index id
    -> partitions it receives as a move's target; ``index_ids``, ``advance_moving`` (index
    id -> partition -> target): for the timekeeper."""

    ts: Timestamp
    by_node: Mapping[str, Sequence[KeyVersion]]
    plan: Mapping[str, Sequence[str]]
    index_ids: Sequence[str]
    slices: Mapping[str, Mapping[str, list[int]]] | None = None
    moving: Mapping[str, Mapping[str, list[int]]] = field(default_factory=dict)
    advance_moving: Mapping[str, Mapping[int, str]] = field(default_factory=dict)


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


RoundEvent = MoreRows | RoundEnds | NodeReplied | NodeFailed | Advanced | AdvanceFailed


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
    # index id -> copies (index partition, node) taken out of the topology: they missed it
    dropped_copies: Mapping[str, list[tuple[int, str]]] = field(default_factory=dict)


@dataclass(frozen=True)
class RoundFailed:
    """Nothing was published. ``stale``: an indexer restarted under the round."""

    error: ShardexError
    stale: bool


Instruction = SendToIndexer | AskTimekeeper | RoundDone | RoundFailed


# --- the round -------------------------------------------------------------------------------


@dataclass(frozen=True)
class RoundSpec:
    """What a round knows when it opens. ``drop_above``: data partition -> seqno above
    which each node first forgets its queue (in the engine call that queues the node's first
    frame: ``rounds/cleaned.py``); ``frame_rows``: the most rows one frame carries."""

    keyspace: str
    batch_id: int
    drop_above: Mapping[int, int] | None = None
    frame_rows: int = MAX_ROWS_PER_FRAME


class _NodeRound:
    """One node's frames, sent one after the other."""

    __slots__ = ("busy", "dropped", "failed", "frames", "incarnation", "stabilise")

    def __init__(self) -> None:
        self.frames: deque[Sequence[KeyVersion]] = deque()  # not sent yet
        self.stabilise = False  # the round ended: the node's last frame goes with it
        self.busy = False  # a frame is out
        self.incarnation = ""  # what the next frame names ("" = any): the first's taker
        self.dropped = False  # the round's drop went with the node's first frame
        self.failed = False  # a frame failed: the node missed the round, nothing more goes


class RoundMachine:
    """One round's decisions (module docstring). Not thread-safe; one caller drives it."""

    def __init__(self, spec: RoundSpec) -> None:
        self.spec = spec
        self.report = DeliveryReport()
        self.state = "open"  # open -> delivering -> advancing -> done | failed
        self.end: RoundEnds | None = None
        self._size = max(1, spec.frame_rows)
        self._nodes: dict[str, _NodeRound] = {}
        self._stabilised: dict[str, Stabilised] = {}
        self._wire: WireTs = {}  # the end's TS on the wire, built once per round

    @property
    def nodes(self) -> list[str]:
        return list(self._nodes)

    def handle(self, event: RoundEvent) -> list[Instruction]:
        """The instructions that ``event`` leads to. Events after the round ended (a
        late reply of a failed round) change nothing."""
        if self.state in ("done", "failed"):
            return []
        if isinstance(event, NodeReplied):
            return self._on_reply(event.node, event.reply)
        if isinstance(event, MoreRows):
            return self._on_rows(event.by_node)
        if isinstance(event, RoundEnds):
            return self._on_end(event)
        if isinstance(event, Advanced):
            return self._on_advanced(event.reply)
        if isinstance(event, NodeFailed):
            return self._on_node_failed(event.node, event.error)
        return self._fail(event.error)  # AdvanceFailed

    # -- transitions ----------------------------------------------------------------------

    def _queue(self, node: str, rows: Sequence[KeyVersion]) -> _NodeRound:
        nr = self._nodes.get(node)
        if nr is None:
            nr = self._nodes[node] = _NodeRound()
        size = self._size
        nr.frames.extend(rows[i : i + size] for i in range(0, len(rows), size))
        return nr

    def _on_rows(self, by_node: Mapping[str, Sequence[KeyVersion]]) -> list[Instruction]:
        if self.state != "open":
            raise RuntimeError(f"rows for a round already {self.state}")
        out: list[Instruction] = []
        for node, rows in by_node.items():
            nr = self._queue(node, rows)
            if not nr.busy and nr.frames and not nr.failed:
                out.append(self._next_frame(node, nr))
        return out

    def _on_end(self, end: RoundEnds) -> list[Instruction]:
        if self.state != "open":
            raise RuntimeError(f"round already {self.state}")
        self.state = "delivering"
        self.end = end
        self._wire = dict(end.ts.to_wire())
        out: list[Instruction] = []
        for node in sorted(set(end.plan) | set(end.by_node) | set(self._nodes)):
            rows = end.by_node.get(node, ())
            nr = self._queue(node, rows)
            if not rows:
                nr.frames.append([])  # the stabilise goes alone, after the node's frames
            nr.stabilise = True
            if not nr.busy and not nr.failed:
                out.append(self._next_frame(node, nr))
        return out + self._maybe_advance()

    def _next_frame(self, node: str, nr: _NodeRound) -> SendToIndexer:
        """The node's next frame (it has one, or the round ended: then the stabilise)."""
        rows = list(nr.frames.popleft()) if nr.frames else []
        nr.busy = True
        drop = None
        if self.spec.drop_above is not None and not nr.dropped:
            nr.dropped = True  # the node's first frame forgets its queue above
            drop = dict(self.spec.drop_above)
        end = self.end
        if end is None or nr.frames:
            return SendToIndexer(
                node,
                DeliverKeyVersions(
                    keyspace=self.spec.keyspace,
                    batch_id=self.spec.batch_id,
                    rows=rows,
                    incarnation=nr.incarnation,
                    drop_above=drop,
                ),
            )
        slices = end.slices
        return SendToIndexer(
            node,
            DeliverAndStabilise(
                keyspace=self.spec.keyspace,
                batch_id=self.spec.batch_id,
                rows=rows,
                ts=self._wire,
                index_ids=list(end.plan.get(node, ())),
                incarnation=nr.incarnation,
                moving=dict(end.moving.get(node, {})),
                slices=None if slices is None else dict(slices.get(node, {})),
                drop_above=drop,
            ),
        )

    def _on_reply(self, node: str, reply: Delivered | Stabilised) -> list[Instruction]:
        nr = self._nodes.get(node)
        if nr is None or not nr.busy:
            return []
        nr.busy = False
        try:
            self.report.add(reply)  # a second incarnation of one node: STALE_DELIVERY
        except ShardexError as exc:
            return self._fail(exc)
        nr.incarnation = reply.incarnation
        if isinstance(reply, Stabilised):
            self._stabilised[node] = reply
            return self._maybe_advance()
        if nr.frames or nr.stabilise:
            return [self._next_frame(node, nr)]
        return []  # open: the node waits for more rows or the round's end

    def _on_node_failed(self, node: str, error: ShardexError) -> list[Instruction]:
        """A frame to ``node`` failed: the node missed the round (module docstring). An
        indexer that restarted under the round still fails it: deliver it all again."""
        nr = self._nodes.get(node)
        if nr is None or not nr.busy:
            return []
        if error.code is ErrorCode.STALE_DELIVERY:
            return self._fail(error)
        nr.busy = False
        nr.failed = True
        nr.frames.clear()
        self.report.missed[node] = error
        return self._maybe_advance()

    def _maybe_advance(self) -> list[Instruction]:
        end = self.end
        if end is None or self.state != "delivering":
            return []
        if len(self._stabilised) + len(self.report.missed) < len(self._nodes):
            return []
        if not self._stabilised:
            # Nobody stabilised: nothing can be published, the round is retried as a whole.
            return self._fail(next(iter(self.report.missed.values())))
        self.state = "advancing"
        msg = AdvanceStability(
            keyspace=self.spec.keyspace,
            ts=self._wire,
            index_ids=list(end.index_ids),
            batch_id=self.spec.batch_id,
            moving={i: dict(m) for i, m in end.advance_moving.items()},
            stabilised=dict(self._stabilised),
        )
        return [AskTimekeeper(msg)]

    def _on_advanced(self, reply: StabilityAdvanced) -> list[Instruction]:
        if self.state != "advancing":
            return []
        self.state = "done"
        ts = Timestamp.from_wire(reply.ts)
        done = RoundDone(
            ts,
            list(reply.published),
            list(reply.skipped),
            self.report,
            {i: [(int(p), str(n)) for p, n in c] for i, c in reply.dropped_copies.items()},
        )
        return [done]

    def _fail(self, error: ShardexError) -> list[Instruction]:
        self.state = "failed"
        return [RoundFailed(error, stale=error.code is ErrorCode.STALE_DELIVERY)]
