"""Validation of a ``QueryPlan`` before anything is sent, and the derived edge map."""

from __future__ import annotations

from dataclasses import dataclass

from shardex.api.sql_protocol import FragmentSpec, QueryPlan
from shardex.errors import ErrorCode, ShardexError

__all__ = ["EXCHANGES", "Edge", "PlanLayout", "layout_plan"]

# How an edge's rows reach the reading fragment's members (``FragmentSpec.exchange``).
GATHER, BROADCAST, HASH = "gather", "broadcast", "hash"
EXCHANGES = (GATHER, BROADCAST, HASH)


@dataclass(frozen=True)
class Edge:
    """One exchange: every member of ``senders`` streams to each of ``receivers`` (one
    stream per sender and receiver), as ``exchange`` says."""

    edge_id: int
    sender_fragment: int
    receiver_fragment: int
    senders: tuple[str, ...]
    receivers: tuple[str, ...]
    exchange: str = GATHER

    @property
    def receiver(self) -> str:
        """A gather's one receiver."""
        return self.receivers[0]


@dataclass(frozen=True)
class PlanLayout:
    root: FragmentSpec
    edges: dict[int, Edge]
    participants: tuple[str, ...]  # sorted: the same list on every member


def _bad(message: str, value: object, hint: str) -> ShardexError:
    return ShardexError(
        f"invalid query plan: {message}",
        code=ErrorCode.BAD_REQUEST,
        details={"value": value, "hint": hint},
    )


def layout_plan(plan: QueryPlan, initiator: str) -> PlanLayout:
    """Check the plan's shape (raises ``BAD_REQUEST`` naming the fault) and derive its edges.

    Rules: fragment ids unique; exactly one root (``output`` None) running only on the
    initiator; each edge written by exactly one fragment and read by exactly one fragment,
    which runs on exactly one member when the edge is a gather (a broadcast or hash edge
    reaches every member of its reader); every fragment reaches the root (no cycles, no
    orphans).
    """
    if not plan.fragments:
        raise _bad("no fragments", [], "a plan needs at least the root fragment")
    by_id: dict[int, FragmentSpec] = {}
    for f in plan.fragments:
        if f.fragment_id in by_id:
            raise _bad(f"fragment id {f.fragment_id} used twice", f.fragment_id, "unique ids")
        if not f.members or len(set(f.members)) != len(f.members):
            raise _bad(
                f"fragment {f.fragment_id} has members {f.members}",
                f.members,
                "list each member that runs the fragment once",
            )
        if f.exchange not in EXCHANGES:
            raise _bad(
                f"fragment {f.fragment_id} has exchange {f.exchange!r}",
                f.exchange,
                f"one of {', '.join(EXCHANGES)}",
            )
        by_id[f.fragment_id] = f
    roots = [f for f in plan.fragments if f.output is None]
    if len(roots) != 1:
        raise _bad(
            f"{len(roots)} root fragments",
            [f.fragment_id for f in roots],
            "exactly one fragment has no output: its rows go to the caller",
        )
    root = roots[0]
    if root.members != [initiator]:
        raise _bad(
            f"root fragment {root.fragment_id} runs on {root.members}",
            root.members,
            f"the root fragment runs on the initiator only ({initiator})",
        )
    writers: dict[int, FragmentSpec] = {}
    readers: dict[int, FragmentSpec] = {}
    for f in plan.fragments:
        if f.output is not None:
            if f.output in writers:
                raise _bad(f"edge {f.output} written by two fragments", f.output, "one writer")
            writers[f.output] = f
        for e in f.inputs:
            if e in readers:
                raise _bad(f"edge {e} read by two fragments", e, "one reader per edge")
            readers[e] = f
    if writers.keys() != readers.keys():
        dangling = sorted(set(writers) ^ set(readers))
        raise _bad(f"edges {dangling} lack a writer or a reader", dangling, "connect every edge")
    edges: dict[int, Edge] = {}
    for e, w in sorted(writers.items()):
        r = readers[e]
        if w.exchange == GATHER and len(r.members) != 1:
            raise _bad(
                f"edge {e} goes to fragment {r.fragment_id} on {r.members}",
                r.members,
                "a gather goes into one member: give the reader exactly one member, "
                "or make the edge a broadcast or hash exchange",
            )
        edges[e] = Edge(
            e, w.fragment_id, r.fragment_id, tuple(w.members), tuple(r.members), w.exchange
        )
    for f in plan.fragments:  # every fragment must reach the root
        seen: list[int] = []
        cur = f
        while cur.output is not None:
            if cur.fragment_id in seen:
                raise _bad(f"cycle through fragment {cur.fragment_id}", seen, "plans are trees")
            seen.append(cur.fragment_id)
            cur = readers[cur.output]
    participants = tuple(sorted({m for f in plan.fragments for m in f.members}))
    return PlanLayout(root=root, edges=edges, participants=participants)
