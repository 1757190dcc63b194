"""Graceful removal of nodes: ``shardex rebalance --eject NODE`` (the master's side).

Why this order: ``docs/decisions/0084-graceful-eject.md``. A rebalance with ``eject`` set
(``RebalanceRecord.eject``), in the background on the master:

0. **index slices** first: every copy of an index partition (primary or replica) on an
   ejected indexer moves to another up indexer holding no copy of that partition, by the
   index rebalance's moves (``manager/index_rebalance.py``, planned by
   ``meta/index_copy_plan.py``). If one of them fails the eject stops here, nothing
   removed and no data moved;
1. **widen** (``widen``, towards ``chains_after_moves``): every chain gets *appended* the
   replicas it will need after the eject on the remaining nodes: replacements of its
   replicas on ejected nodes, and, for an active about to move onto one of its replicas'
   nodes, a replacement of that replica (the migration drops it when it starts). Nothing
   leaves a chain; one new topology per keyspace. The data nodes build the new copies by
   themselves;
2. **wait** until each new replica has caught up: its high seqno (``CopySeqnos`` at the
   replica node) reaches the active's high seqno read at the start of the wait, on the
   active's branch; bounded (``CATCH_UP_TIMEOUT``: the eject then fails, nothing removed);
3. **narrow** (``narrow``): the replicas the planned chains drop (the ejected ones, and
   any beyond the replica count) leave them;
4. the planned migrations move every active copy off the ejected nodes, each to the least
   loaded remaining node (``plan_eject_moves``, planned at the start: step 1 needs the
   targets), with the ordinary online migration (``migration_driver.py``);
5. chains restored over the remaining nodes (``restore_chains`` with the ejected excluded);
6. when every move is done and no committed topology names an ejected node, the node is
   removed from the member list (``Membership.remove``: a gossiped tombstone).

Steps 1-3 are shared with the rebalance (``rebalance.py``, "Replica chains"): ``widen``
takes the planned chains from a ``ChainPlan`` (``eject_plan`` here), ``narrow`` the chains
``widen`` returned, ``await_replicas`` the new replicas. A manager node also leaves the
coordinator's voters, in step 6's commit, before its tombstone (``voter_changes.py``).

Refused at the start, with the reason: a node that is not a member, more than one manager
node, a manager whose removal would leave no voter or no majority of voters up, a node
holding index slices that cannot move (no other up indexer without a copy of the partition,
the node is down, or the index is not ACTIVE: ``refuse_unplaced_slices``), a down node that
still holds active copies (fail it over first), and an eject that would leave no serving
data node.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Iterable, Mapping
from typing import Any

import msgspec

from shardex.api.errors import BadRequest
from shardex.api.records import STATE_REPLICA
from shardex.api.replication import CopySeqno, CopySeqnos, CopySeqnosReply
from shardex.core.topology import Topology
from shardex.errors import ErrorCode, ShardexError
from shardex.manager.keyspaces import data_members
from shardex.manager.migration_driver import ask_member
from shardex.manager.voter_changes import check_manager_eject
from shardex.meta.index_copy_plan import Unplaced
from shardex.meta.index_state import INIT, LIVE_STATES
from shardex.meta.replica_placement import added_replicas, chains_after_moves, narrowed, widened
from shardex.meta.state import StateContext

log = logging.getLogger(__name__)

CATCH_UP_TIMEOUT = 600.0  # a new replica copy this long behind: the eject fails
CATCH_UP_POLL = 0.2
ASK_TIMEOUT = 5.0

Waits = dict[str, dict[int, list[str]]]  # keyspace -> partition -> new replica nodes


def serving_data_nodes(ctx: Any) -> tuple[list[str], list[str], dict[str, str]]:
    """(data nodes, those up and not failed over, node -> server group) as the master sees
    them. A failed-over node serves nothing until it is recovered: it gets no copies."""
    members, up = data_members(ctx)
    failed = ctx.state.failed_over
    serving = [m.name for m in up if m.name not in failed]
    return [m.name for m in members], serving, {m.name: m.group for m in members}


def index_slices_on(state: StateContext, node: str) -> list[str]:
    """``keyspace.index/partition`` of every live index slice the latest topologies place on
    ``node``: primaries and replica copies."""
    out: list[str] = []
    for index_id in sorted(state.indexes):
        rec = state.indexes[index_id]
        history = state.index_topologies.get(index_id)
        if rec.state not in LIVE_STATES or rec.state == INIT or not history:
            continue
        for p in history[-1].copies_of(node):
            out.append(f"{rec.keyspace}.{rec.name}/{p}")
    return out


def holdings(state: StateContext, node: str) -> list[str]:
    """What the committed state still places on ``node``: data copies (``ks/p`` active or
    replica) and index slices. Empty once the node can leave."""
    out: list[str] = []
    for name in sorted(state.data_topologies):
        history = state.data_topologies[name]
        if not history or name not in state.keyspaces:
            continue
        latest = history[-1]
        out += [f"{name}/{p} (active)" for p in latest.partitions_of(node)]
        out += [f"{name}/{p} (replica)" for p in latest.replicas_of(node)]
    return out + [f"{s} (index slice)" for s in index_slices_on(state, node)]


def slices_left(state: StateContext, eject: Iterable[str]) -> list[str]:
    """The index slices the latest topologies still place on the ``eject`` nodes, each
    ``keyspace.index/partition on node``: none once step 0 is done."""
    return [f"{s} on {n}" for n in eject for s in index_slices_on(state, n)]


def refuse_unplaced_slices(unplaced: Iterable[Unplaced]) -> None:
    """BAD_REQUEST naming the ejected nodes and the index slices that cannot move off them
    (``plan_index_copies``'s ``unplaced``); nothing when every slice can move."""
    problems = list(unplaced)
    if not problems:
        return
    nodes = sorted({u.node for u in problems})
    raise BadRequest(
        f"cannot eject {', '.join(nodes)}: {len(problems)} index slice(s) cannot move off "
        f"({'; '.join(str(u) for u in problems[:10])})",
        details={
            "nodes": nodes,
            "slices": [u.slice for u in problems][:50],
            "hint": "start or add an indexer that holds no copy of those partitions, or "
            "lower the index's num_replica / drop it, then eject",
        },
    )


def check_eject(ctx: Any, names: Iterable[str]) -> list[str]:
    """The nodes to eject, validated (module docstring); BAD_REQUEST or NODE_UNAVAILABLE
    naming the node and why otherwise."""
    eject = sorted(dict.fromkeys(n.strip() for n in names))
    state = ctx.state
    members = {m.name: m for m in ctx.membership.members}
    _nodes, serving, _groups = serving_data_nodes(ctx)
    for name in eject:
        member = members.get(name)
        if member is None:
            raise BadRequest(
                f"cannot eject {name!r}: it is not a cluster member",
                details={"node": name, "members": sorted(members)},
            )
        actives = [
            f"{ks}/{p}"
            for ks, history in sorted(state.data_topologies.items())
            if history and ks in state.keyspaces
            for p in history[-1].partitions_of(name)
        ]
        if actives and name not in serving:
            raise ShardexError(
                f"cannot eject {name}: it is down (or failed over) and holds "
                f"{len(actives)} active cop(ies): they cannot be copied off it",
                code=ErrorCode.NODE_UNAVAILABLE,
                details={
                    "node": name,
                    "partitions": actives[:20],
                    "hint": "start it again, or fail it over (shardex failover) and then eject",
                },
            )
    check_manager_eject(ctx, eject, members)  # one manager, leaving a majority up
    if not [n for n in serving if n not in eject]:
        raise BadRequest(
            f"cannot eject {', '.join(eject)}: no serving data node would remain",
            details={"eject": eject, "serving": serving, "hint": "add a data node first"},
        )
    return eject


ChainPlan = Callable[[str, Topology, int], Mapping[int, list[str]] | None]
Chains = dict[str, Mapping[int, list[str]]]  # keyspace -> partition -> planned chain


async def widen(ctx: Any, plan: ChainPlan, why: str) -> tuple[Waits, Chains]:
    """Step 1, shared with the rebalance: ``plan`` (keyspace, its latest topology, its
    num_replicas) -> partition -> the chain (active first) the keyspace is steered to, or
    None to leave the keyspace alone. One commit per keyspace whose chains get replicas
    appended (``widened``). Returns the new replicas to wait for and the planned chains
    (for ``narrow``)."""
    waits: Waits = {}
    planned: Chains = {}
    for name in sorted(ctx.state.keyspaces):
        state = ctx.state
        history = state.data_topologies.get(name)
        if not history:
            continue
        latest = history[-1]
        chains = plan(name, latest, state.keyspaces[name].num_replicas)
        if chains is None:
            continue
        planned[name] = chains
        wide = widened(latest, chains)
        if wide is latest:
            continue
        topologies = {**state.data_topologies, name: [*history, wide]}
        await ctx.commit(msgspec.structs.replace(state, data_topologies=topologies))
        waits[name] = added_replicas(latest, wide)
        log.info(
            "%s: keyspace %s chains widened in topology %d (%d new replica copies)",
            why,
            name,
            wide.seq_num,
            sum(len(v) for v in waits[name].values()),
        )
    return waits, planned


def eject_plan(ctx: Any, eject: list[str], targets: Mapping[str, Mapping[int, str]]) -> ChainPlan:
    """The chains an eject steers to (``chains_after_moves`` over the serving nodes minus
    ``eject``; ``targets``: keyspace -> partition -> the planned target of its active): only
    keyspaces with a move or a replica on an ejected node (shortfalls elsewhere: the final
    restore)."""
    _nodes, serving, groups = serving_data_nodes(ctx)
    remaining = [n for n in serving if n not in eject]

    def plan(name: str, latest: Topology, num_replicas: int) -> Mapping[int, list[str]] | None:
        moved = targets.get(name, {})
        if not moved and not any(set(eject).intersection(r) for r in latest.replicas.values()):
            return None
        return chains_after_moves(latest, remaining, num_replicas, groups, moved)

    return plan


async def narrow(ctx: Any, planned: Chains, why: str) -> None:
    """Step 3, shared with the rebalance: the replicas their planned chains do not name
    leave them (``narrowed``), one commit per keyspace."""
    for name in sorted(planned):
        state = ctx.state
        history = state.data_topologies.get(name)
        if not history:
            continue
        narrow_topo = narrowed(history[-1], planned[name])
        if narrow_topo is history[-1]:
            continue
        topologies = {**state.data_topologies, name: [*history, narrow_topo]}
        await ctx.commit(msgspec.structs.replace(state, data_topologies=topologies))
        log.info("%s: keyspace %s chains narrowed (topology %d)", why, name, narrow_topo.seq_num)


def caught_up(
    targets: Mapping[int, tuple[int, int]], copies: Iterable[CopySeqno]
) -> dict[int, tuple[int, int]]:
    """The partitions of ``targets`` (partition -> (active's high seqno, its uuid)) that a
    replica node's ``copies`` do not hold yet: a replica copy on that branch at or past that
    seqno is caught up."""
    have = {c.partition: c for c in copies}
    left: dict[int, tuple[int, int]] = {}
    for p, (high, uuid) in targets.items():
        c = have.get(p)
        if c is None or c.state != STATE_REPLICA or c.uuid != uuid or c.high_seqno < high:
            left[p] = (high, uuid)
    return left


async def _copies(coordinator: Any, node: str, keyspace: str, parts: list[int]) -> list[CopySeqno]:
    reply = await ask_member(
        coordinator,
        node,
        CopySeqnos(keyspace=keyspace, partitions=sorted(parts)),
        ASK_TIMEOUT,
        CopySeqnosReply,
    )
    return list(reply.copies)


async def await_replicas(coordinator: Any, waits: Waits, timeout: float | None = None) -> None:
    """Step 2: until every new replica copy holds what its active held when the wait began.
    Raises TIMEOUT naming the copies still behind after ``timeout`` (``CATCH_UP_TIMEOUT``)."""
    timeout = CATCH_UP_TIMEOUT if timeout is None else timeout
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    # (keyspace, replica node) -> partition -> (active's high seqno, uuid)
    pending: dict[tuple[str, str], dict[int, tuple[int, int]]] = {}
    for name, parts in sorted(waits.items()):
        topo = coordinator.state.data_topologies[name][-1]
        by_active: dict[str, list[int]] = {}
        for p in parts:
            by_active.setdefault(topo.assignment[p], []).append(p)
        for active, ps in sorted(by_active.items()):
            marks = {}
            while True:
                try:
                    marks = {
                        c.partition: (c.high_seqno, c.uuid)
                        for c in await _copies(coordinator, active, name, ps)
                    }
                    break
                except ShardexError as exc:
                    if loop.time() > deadline:
                        raise
                    log.warning("chain wait: %s did not report its copies: %s", active, exc)
                    await asyncio.sleep(CATCH_UP_POLL)
            for p in ps:
                if p not in marks:
                    continue  # not active there any more: a failover moved it; nothing to wait
                for node in parts[p]:
                    pending.setdefault((name, node), {})[p] = marks[p]
    while pending:
        for (name, node), targets in sorted(pending.items()):
            try:
                left = caught_up(targets, await _copies(coordinator, node, name, list(targets)))
            except ShardexError as exc:
                log.warning("chain wait: %s did not report its replica copies: %s", node, exc)
                continue
            if left:
                pending[(name, node)] = left
            else:
                del pending[(name, node)]
        if not pending:
            return
        if loop.time() > deadline:
            behind = [f"{ks}/{p} on {n}" for (ks, n), t in sorted(pending.items()) for p in t]
            raise ShardexError(
                f"{len(behind)} new replica cop(ies) did not catch up within {timeout:g} s: "
                f"{', '.join(behind[:10])}",
                code=ErrorCode.TIMEOUT,
                details={"behind": behind[:50]},
            )
        await asyncio.sleep(CATCH_UP_POLL)


def remove_members(ctx: Any, eject: list[str]) -> list[str]:
    """Step 6: remove every ejected node the committed state no longer places anything on;
    returns what was left for the others (``node: what it holds``). A manager node is not
    removed here: it leaves the voters in the eject's final commit first
    (``voter_changes.retire_ejected``), and the master removes it after that commit."""
    problems: list[str] = []
    for name in eject:
        held = holdings(ctx.state, name)
        if held:
            problems.append(f"{name} still holds {', '.join(held[:5])}")
            continue
        member = next((m for m in ctx.membership.members if m.name == name), None)
        if member is not None and "manager" not in member.services:
            ctx.membership.remove(name)
    return problems
