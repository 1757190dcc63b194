"""Checker of index DDL (``shardex.manager.index_ddl`` + ``shardex.index.service``).

Plain recorded data in, ``AssertionError`` with a precise message out (like
``checkers_coordinator``, which checks the replicated state itself and is run alongside).

*Slices* are ``(index id, index partition)`` pairs per node, as the node's durable engine
holds them.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence

from shardex.meta.index_state import (
    DELETED,
    INIT,
    LIVE_STATES,
    SERVING_STATES,
    latest_index_topology,
)
from shardex.meta.state import StateContext

__all__ = ["Observation", "SliceSet", "check_index_ddl", "missing_slices", "orphan_slices"]

SliceSet = set[tuple[str, int]]
# (node that applied the state, (epoch, cas), index id -> missing (node, partition) slices)
Observation = tuple[str, tuple[int, int], dict[str, list[tuple[str, int]]]]


def missing_slices(
    state: StateContext, slices: Mapping[str, Iterable[tuple[str, int]]]
) -> dict[str, list[tuple[str, int]]]:
    """For every index of ``state`` in READY, BUILDING or ACTIVE: the slices its latest
    topology names that their node does not hold."""
    held = {node: set(s) for node, s in slices.items()}
    out: dict[str, list[tuple[str, int]]] = {}
    for index_id, rec in state.indexes.items():
        if rec.state not in SERVING_STATES:
            continue
        topo = latest_index_topology(state.index_topologies, index_id)
        if topo is None:
            out[index_id] = [("<no topology>", -1)]
            continue
        gone = [
            (node, p)
            for p, node in sorted(topo.assignment.items())
            if (index_id, p) not in held.get(node, set())
        ]
        if gone:
            out[index_id] = gone
    return out


def orphan_slices(
    state: StateContext, slices: Mapping[str, Iterable[tuple[str, int]]]
) -> dict[str, list[tuple[str, int]]]:
    """Slices a node holds that no live index's latest topology gives it."""
    out: dict[str, list[tuple[str, int]]] = {}
    for node, held in slices.items():
        extra = []
        for index_id, p in sorted(held):
            rec = state.indexes.get(index_id)
            topo = latest_index_topology(state.index_topologies, index_id)
            live = rec is not None and rec.state in LIVE_STATES and topo is not None
            if not live or topo is None or topo.assignment.get(p) != node:
                extra.append((index_id, p))
        if extra:
            out[node] = extra
    return out


def check_index_ddl(
    *,
    final: StateContext,
    slices: Mapping[str, Iterable[tuple[str, int]]],
    observations: Sequence[Observation],
    created: Mapping[str, str] | None = None,
    settled: bool = True,
) -> None:
    """Invariants of one run (the replicas' convergence is ``check_coordinator``'s).

    ``final``: the converged state. ``slices``: node -> slices on its disk at the end.
    ``observations``: one per state applied on any node during the run, with the slices
    its serving indexes lacked at that instant (left empty by the recorder for a state
    already superseded by a commit: a replica catching up may apply an old state after a
    later DROP removed slices it names). ``created``: index name -> id for every
    CREATE a client saw succeed (and did not drop). ``settled``: reconciliation has run
    since the last change, so orphan slices are a failure.

    1. Never, on any node, a current state with an index in READY/BUILDING/ACTIVE whose
       slices are not all allocated on its indexers (the DDL flow's promise: READY only after
       all ACKs; and no slice of a live index is ever dropped).
    2. Nothing left in flight: no index in INIT or DELETED in the final state.
    3. Index names are unique per keyspace.
    4. Every index in the final state in READY or later has all its slices.
    5. Every acknowledged CREATE is in the final state under the id its reply named.
    6. (settled) No node keeps a slice of an index that is gone or not assigned to it.
    """
    for node, (epoch, cas), missing in observations:
        if missing:
            raise AssertionError(
                f"{node} applied epoch {epoch} cas {cas} with indexes serving without their "
                f"slices: {missing}"
            )
    stuck = {i: r.state for i, r in final.indexes.items() if r.state in (INIT, DELETED)}
    if stuck:
        raise AssertionError(f"DDL left in flight in the final state: {stuck}")
    names: dict[tuple[str, str], str] = {}
    for index_id, rec in final.indexes.items():
        key = (rec.keyspace, rec.name)
        if key in names:
            raise AssertionError(f"two indexes named {key}: {names[key]} and {index_id}")
        names[key] = index_id
    gone = missing_slices(final, slices)
    if gone:
        raise AssertionError(f"final state: indexes without their slices: {gone}")
    for name, index_id in (created or {}).items():
        rec = final.indexes.get(index_id)
        if rec is None or rec.name != name:
            raise AssertionError(
                f"CREATE INDEX {name} was acknowledged as {index_id}, but the final state has "
                f"{ {i: r.name for i, r in final.indexes.items()} }"
            )
    if settled:
        extra = orphan_slices(final, slices)
        if extra:
            raise AssertionError(f"orphan slices after reconciliation: {extra}")
