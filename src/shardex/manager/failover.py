"""Failover and recovery of a data node, as coordinator ops on the master.

Failover (``docs/decisions/0082-replicas-and-durability.md``):

1. validate: ``node`` is a data member, not the last one that is not failed over; a node
   already failed over gets the same answer again (idempotent);
2. ask every up replica node of the node's partitions where its copies stand
   (``CopySeqnos``, in parallel, one timeout);
3. ``plan_failover`` (pure): per partition the node held active, promote the replica copy in
   state "replica" with the highest seqno (ties: chain order); the node leaves every chain;
4. partitions with no replica to promote refuse the failover, unless ``allow_data_loss``:
   then they stay assigned to the failed node, unavailable, and are listed as lost;
5. one commit: every changed keyspace's topology (``seq_num`` + 1) and
   ``failed_over[node] = cas`` of that commit;
6. ``PromoteReplica`` to each promoted node, with retries; a node not reached promotes its
   copy when it reconciles with the state (the topology names it active).

Rebalances. A running rebalance refuses the failover: its migrations to or from a dead node
fail on their own and the rebalance ends, so the wait is bounded, and a topology changed under
a running plan would make it publish moves planned on the old one. After it ended, a move it
left unsettled (``unresolved``) is only in the way if it involves the node: as the target, or
as a source that is up, it settles by itself (the resolver asks the source), so the failover
is refused until then. As a source that is down it never settles (only that source can say
whether it released the partition), and the failover is exactly what ends it: the move is
marked failed in the failover's commit, so the node, once recovered, cannot roll it forward
over the promoted replica; its target drops its copy when it reconciles.

Recovery removes the node from ``failed_over``; the node rolls back ("delta") or drops
("full") its stale copies when it reconciles, and is then a normal member a rebalance fills.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping, Sequence
from typing import Any

import msgspec

from shardex.api.errors import BadRequest
from shardex.api.failover import (
    REASON_DATA_LOSS,
    REASON_REBALANCE,
    RECOVERY_KINDS,
    FailedOver,
    Failover,
    Recover,
    Recovered,
)
from shardex.api.replication import CopySeqno, CopySeqnos, CopySeqnosReply, PromoteReplica
from shardex.core.topology import Topology
from shardex.errors import ErrorCode, ShardexError
from shardex.manager.keyspaces import _tell, data_members
from shardex.meta.member_list import MemberInfo
from shardex.meta.rebalance_state import FAILED, RUNNING, in_flight, with_move
from shardex.meta.state import StateContext

log = logging.getLogger(__name__)

COPY_SEQNOS_TIMEOUT = 2.0  # one attempt: a replica that cannot answer in time is not promoted
REPLICA = "replica"  # the only copy state a failover promotes

# keyspace -> replica node -> the copies it reported
Copies = Mapping[str, Mapping[str, Sequence[CopySeqno]]]


def plan_failover(
    state: StateContext, node: str, copies: Copies
) -> tuple[dict[str, Topology], dict[str, dict[int, str]], dict[str, list[int]]]:
    """(new topologies by keyspace, promoted, lost) for failing ``node`` over.

    ``copies`` holds the answers of the replica nodes that were reached. Per partition whose
    active is ``node``: the candidates are its chain's replicas with a copy in state
    "replica"; the highest ``high_seqno`` wins, ties go to the earlier in the chain (the
    promotion order). The new topology (``seq_num`` + 1) names the winner active and keeps
    the rest of the chain as replicas; without a candidate the partition stays on ``node``
    (lost). Partitions where ``node`` is only a replica lose it from their chain. Keyspaces
    that do not involve ``node`` get no new topology. Pure: no I/O, no clock."""
    topologies: dict[str, Topology] = {}
    promoted: dict[str, dict[int, str]] = {}
    lost: dict[str, list[int]] = {}
    for name in sorted(state.data_topologies):
        history = state.data_topologies[name]
        if not history:
            continue
        topo = history[-1]
        reported = {(n, c.partition): c for n, cs in copies.get(name, {}).items() for c in cs}
        assignment = dict(topo.assignment)
        replicas: dict[int, list[str]] = {}
        changed = False
        for p in sorted(topo.assignment):
            chain = topo.chain(p)
            if node not in chain:
                if p in topo.replicas:
                    replicas[p] = list(topo.replicas[p])
                continue
            changed = True
            rest = [n for n in chain[1:] if n != node]
            if chain[0] != node:  # only a replica here: it leaves the chain
                if rest:
                    replicas[p] = rest
                continue
            best: tuple[int, int, str] | None = None  # (-high_seqno, chain position, node)
            for pos, candidate in enumerate(rest):
                copy = reported.get((candidate, p))
                if copy is None or copy.state != REPLICA:
                    continue
                key = (-copy.high_seqno, pos, candidate)
                if best is None or key < best:
                    best = key
            if best is None:
                lost.setdefault(name, []).append(p)
                if rest:
                    replicas[p] = rest
                continue
            winner = best[2]
            assignment[p] = winner
            promoted.setdefault(name, {})[p] = winner
            remaining = [n for n in rest if n != winner]
            if remaining:
                replicas[p] = remaining
        if changed:
            topologies[name] = Topology(
                seq_num=topo.seq_num + 1, assignment=assignment, replicas=replicas
            )
    return topologies, promoted, lost


def replica_nodes_to_ask(state: StateContext, node: str) -> dict[str, dict[str, list[int]]]:
    """keyspace -> replica node -> the partitions of ``node`` it may take over."""
    out: dict[str, dict[str, list[int]]] = {}
    for name, history in state.data_topologies.items():
        if not history:
            continue
        topo = history[-1]
        for p in topo.partitions_of(node):
            for r in topo.replicas.get(p, ()):
                if r != node and r not in state.failed_over:
                    out.setdefault(name, {}).setdefault(r, []).append(p)
    return out


def _member(ctx: Any, node: str) -> MemberInfo:
    members = {m.name: m for m in ctx.membership.members}
    member = members.get(node)
    if member is None:
        raise ShardexError(
            f"{node!r} is not a member of the cluster",
            code=ErrorCode.NOT_A_CLUSTER_MEMBER,
            details={"node": node, "members": sorted(members)},
        )
    if "data" not in member.services:
        raise BadRequest(
            f"{node} does not run the data service: there is nothing to fail over",
            details={"node": node, "services": list(member.services)},
        )
    return member


def _check_rebalance(state: StateContext, node: str, up: set[str]) -> list[str]:
    """Refuse while a rebalance is in the way (module docstring); else the migration ids
    of the unsettled moves the failover must end (``node`` is their source and down)."""
    record = state.rebalance
    if record is not None and record.state == RUNNING:
        raise BadRequest(
            f"a rebalance is running ({record.id}); fail {node} over when it has ended "
            "(its migrations to or from a dead node fail on their own)",
            details={
                "node": node,
                "reason": REASON_REBALANCE,
                "rebalance": record.id,
                "hint": "watch it with `shardex rebalance` status, then retry",
            },
        )
    to_end: list[str] = []
    for (ks, p), move in sorted(in_flight(record).items()):
        if move.source == node and node not in up:
            to_end.append(move.migration_id)
        elif node in (move.source, move.target):
            raise BadRequest(
                f"the move of {ks}/{p} from {move.source} to {move.target} is not settled "
                f"({move.status}); it settles when {move.source} answers, then retry",
                details={"node": node, "reason": REASON_REBALANCE, "move": f"{ks}/{p}"},
            )
    return to_end


async def _ask_copies(
    ctx: Any, targets: dict[str, dict[str, list[int]]], up: dict[str, MemberInfo]
) -> dict[str, dict[str, list[CopySeqno]]]:
    """Every (keyspace, up replica node) asked at once; a node that fails is left out."""
    asks = [(name, r, parts) for name, by_node in targets.items() for r, parts in by_node.items()]

    async def one(name: str, r: str, parts: list[int]) -> CopySeqnosReply | None:
        member = up.get(r)
        if member is None:
            return None
        try:
            reply = await ctx.pool.request(
                member.address,
                CopySeqnos(keyspace=name, partitions=sorted(parts)),
                COPY_SEQNOS_TIMEOUT,
            )
        except ShardexError as exc:
            log.warning("failover: %s did not report its copies of %r: %s", r, name, exc)
            return None
        return reply if isinstance(reply, CopySeqnosReply) else None

    replies = await asyncio.gather(*(one(*a) for a in asks))
    out: dict[str, dict[str, list[CopySeqno]]] = {}
    for (name, r, _parts), reply in zip(asks, replies, strict=True):
        if reply is not None:
            out.setdefault(name, {})[r] = list(reply.copies)
    return out


def _count(parts: Mapping[str, Sequence[int] | Mapping[int, str]]) -> int:
    return sum(len(v) for v in parts.values())


async def failover(msg: Failover, ctx: Any) -> FailedOver:
    state = ctx.state
    node = msg.node
    _member(ctx, node)
    if node in state.failed_over:
        return FailedOver(node=node, cas=state.failed_over[node])
    members, up_members = data_members(ctx)
    others = [m.name for m in members if m.name != node and m.name not in state.failed_over]
    if not others:
        raise BadRequest(
            f"{node} is the last data node that is not failed over: failing it over would "
            "leave no node to serve any partition",
            details={"node": node, "hint": "start or recover another data node first"},
        )
    up = {m.name: m for m in up_members if m.name not in state.failed_over}
    to_end = _check_rebalance(state, node, set(up))
    copies = await _ask_copies(ctx, replica_nodes_to_ask(state, node), up)
    topologies, promoted, lost = plan_failover(state, node, copies)
    if lost and not msg.allow_data_loss:
        shown = "; ".join(f"{ks}: {parts}" for ks, parts in sorted(lost.items()))
        raise BadRequest(
            f"failing {node} over would lose {_count(lost)} partition(s) that have no "
            f"reachable replica copy ({shown})",
            details={
                "node": node,
                "reason": REASON_DATA_LOSS,
                "lost": {ks: parts for ks, parts in lost.items()},
                "hint": "start the replica nodes, or accept the loss with --allow-data-loss "
                "(those partitions stay on the failed node, unavailable)",
            },
        )
    state = ctx.state  # unchanged: ops are serialized, and the asks above commit nothing
    record = state.rebalance
    for mid in to_end:
        assert record is not None
        record = with_move(record, mid, status=FAILED, error=f"source {node} failed over")
    new_cas = state.cas + 1
    new_state = msgspec.structs.replace(
        state,
        data_topologies={
            name: [*history, topologies[name]] if name in topologies else history
            for name, history in state.data_topologies.items()
        },
        rebalance=record,
        failed_over={**state.failed_over, node: new_cas},
    )
    reply = FailedOver(node=node, promoted=promoted, lost=lost, cas=new_cas)
    # An op commits after its master's resync commit, so its cas is exactly ``cas + 1``
    # (only that first commit of a term may jump): the recorded cas is this commit's.
    committed = await ctx.commit(new_state, reply=reply)
    log.warning(
        "failover of %s (cas %d): promoted %d partition(s) %s; lost %d %s",
        node,
        committed.cas,
        _count(promoted),
        {ks: dict(sorted(ps.items())) for ks, ps in sorted(promoted.items())},
        _count(lost),
        dict(sorted(lost.items())),
    )
    pending = await _promote(ctx, topologies, promoted, up)
    return msgspec.structs.replace(reply, pending=pending)


async def _promote(
    ctx: Any,
    topologies: dict[str, Topology],
    promoted: dict[str, dict[int, str]],
    up: dict[str, MemberInfo],
) -> dict[str, str]:
    """``PromoteReplica`` to every promoted copy (in parallel, retried); node -> last error
    for those not told (they promote themselves when they reconcile)."""
    sends: list[tuple[str, PromoteReplica]] = [
        (
            target,
            PromoteReplica(
                keyspace=ks, partition=p, epoch=ctx.epoch, seq_num=topologies[ks].seq_num
            ),
        )
        for ks, parts in sorted(promoted.items())
        for p, target in sorted(parts.items())
    ]

    async def one(target: str, req: PromoteReplica) -> str | None:
        member = up.get(target)
        if member is None:
            return "not up"
        return await _tell(ctx, member, req)

    errors = await asyncio.gather(*(one(t, r) for t, r in sends))
    pending: dict[str, str] = {}
    for (target, req), error in zip(sends, errors, strict=True):
        if error is not None:
            pending[target] = error
            log.warning(
                "failover: %s not told to promote %s/%d (%s); it does when it reconciles",
                target,
                req.keyspace,
                req.partition,
                error,
            )
    return pending


async def recover(msg: Recover, ctx: Any) -> Recovered:
    state = ctx.state
    node = msg.node
    if msg.kind not in RECOVERY_KINDS:
        raise BadRequest(
            f"unknown recovery kind {msg.kind!r}",
            details={"kind": msg.kind, "hint": f"one of {', '.join(RECOVERY_KINDS)}"},
        )
    _member(ctx, node)
    if node not in state.failed_over:
        raise BadRequest(
            f"{node} is not failed over: there is nothing to recover",
            details={"node": node, "failed_over": sorted(state.failed_over)},
        )
    _members, up = data_members(ctx)
    if node not in {m.name for m in up}:
        raise ShardexError(
            f"{node} is down: start it, then recover it (it must reconcile its copies)",
            code=ErrorCode.NODE_UNAVAILABLE,
            details={"node": node, "reason": "node_down"},
        )
    failed_over = {n: c for n, c in state.failed_over.items() if n != node}
    reply = Recovered(node=node, kind=msg.kind, cas=state.cas + 1)
    # ``recovering`` tells the node which kind to apply to its stale copies; the next
    # rebalance, which places copies on it again, clears it.
    committed = await ctx.commit(
        msgspec.structs.replace(
            state, failed_over=failed_over, recovering={**state.recovering, node: msg.kind}
        ),
        reply=reply,
    )
    log.warning(
        "%s recovered (%s recovery, cas %d): a rebalance can place partitions on it again",
        node,
        msg.kind,
        committed.cas,
    )
    return msgspec.structs.replace(reply, cas=committed.cas)


def register_failover_ops(coordinator: Any) -> None:
    """Install the failover and recovery ops on a ``Coordinator``."""
    coordinator.register_op(Failover, failover)
    coordinator.register_op(Recover, recover)
