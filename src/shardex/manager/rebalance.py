"""Online partition migration and rebalance, orchestrated by the coordinator master.

``StartRebalance`` plans the fewest active moves that balance every keyspace over the up data
nodes, each onto a node outside its partition's chain where the counts allow
(``plan_actives``), and the replica chains that go with them (``final_chains``);
``MovePartition`` plans one move (admin, tests); both record the moves in the replicated
state and return at once, and a background task on the master migrates the partitions, a
few at a time (``max_parallel``). ``GetRebalance`` reports progress. The op lock is held only
for each commit (``Coordinator.exclusive``), so DDL keeps working during a rebalance, and a
forwarded op never has to outlive ``op_timeout``.

One migration, source S to target T (why each step is there:
``docs/decisions/0030-partition-migration-protocol.md``):

1. commit the move as ``moving`` (before any node hears of it);
2. T ``MigrateIn``: incoming marker, chunked snapshot copy pulled from S, catch-up rounds;
3. S ``FreezeOutgoing`` (writes refused, retryable, under a lease) -> frozen high seqno H;
4. T ``CatchUp`` to exactly H;
5. S ``ReleaseOutgoing`` at H: persisted, conditional: **the point of no return**;
6. T ``ActivateIncoming``; commit the new topology (seq_num + 1, appended to the history)
   and the move ``done`` in one commit; S ``DropOutgoing``.

Any failure before 5 is settled by ``ResolveOutgoing`` at S, which answers from S's own
state and fences the migration there: "active" -> abort (drop T's copy, move ``failed``; the
partition never stopped serving at S), "released" -> roll forward (6), no answer -> the move
stays ``unresolved`` (T's copy is kept) and is retried until S answers.

Replica chains (``docs/decisions/0086-replica-aware-rebalance.md``): a rebalance balances
replicas as well as actives, and never runs a chain below its configured size:

1. at the start, chains cut short (a failover) are filled at once (``restore_chains``: it
   only adds copies, and removes those on nodes down or failed over); the plan is made on
   the result;
2. before any active moves, the chains are steered to the planned ones with the eject's
   code (``eject.py``: ``widen``, ``await_replicas``, ``narrow``): the new replicas are
   appended (the data nodes build them from the topology), waited for until caught up,
   and only then do the replicas the plan drops leave. A replica on a move's target stays
   until its migration drops it; its replacement is already caught up;
3. the actives migrate (above);
4. a second widen / wait / narrow, planned on the result, places what only a move frees (a
   replica on the node an active left: only when no other node can hold it), then
   ``restore_chains`` again.

A replica that does not catch up within ``CATCH_UP_TIMEOUT`` stops the rebalance before its
moves (cancelled; chains left widened, nothing removed). An admin move steers only its own
partition's chain (its replica on the target replaced first).

Eject (``StartRebalance.eject``, ``shardex rebalance --eject NODE``): the moves are only
those off the ejected nodes, and before them the chains get their replacement replicas
(widened, caught up, then narrowed); at the end the ejected nodes leave the member list.
Steps and refusals: ``eject.py``; a manager node also leaves the coordinator's voters in the
final commit (``voter_changes.py``).

Master failover: the new master's recovery hook marks the interrupted rebalance over (moves
not started: ``cancelled``; moves in flight: ``unresolved``) and resolves every in-flight move
as above: finished if its source had released the partition, aborted otherwise. Run
``shardex rebalance`` again to finish the balancing; completed moves are not redone.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import msgspec

import shardex.manager.eject as eject_mod
from shardex.api.errors import BadRequest, KeyspaceNotFound
from shardex.api.rebalance import GetRebalance, MovePartition, RebalanceReply, StartRebalance
from shardex.core.topology import Topology
from shardex.errors import ErrorCode, ShardexError
from shardex.manager.index_rebalance import IndexMoveDriver, plan_into, settle_index_moves
from shardex.manager.migration_driver import MigrationDriver, deposed
from shardex.manager.voter_changes import retire_ejected
from shardex.meta.index_rebalance_state import interrupt_index_moves
from shardex.meta.rebalance_plan import final_chains
from shardex.meta.rebalance_state import (
    CANCELLED,
    DONE,
    FAILED,
    IN_FLIGHT,
    MOVING,
    PLANNED,
    RUNNING,
    UNRESOLVED,
    MoveRecord,
    RebalanceRecord,
    finish,
    new_record,
    plan_eject_moves,
    plan_moves,
    with_move,
)
from shardex.meta.replica_placement import (
    chains_after_moves,
    narrowed,
    restore_replicas,
    widened,
)

log = logging.getLogger(__name__)

RESOLVE_INTERVAL = 2.0  # retrying unresolved moves
MAX_PARALLEL = 8


_serving_data_nodes = eject_mod.serving_data_nodes


async def restore_chains(ctx: Any, exclude: Sequence[str] = ()) -> list[str]:
    """Bring every keyspace's chains back to its ``num_replicas`` on the serving data nodes
    (``restore_replicas``), ``exclude`` (nodes being ejected) left out: one commit per
    keyspace whose topology changes. Returns the keyspaces that got a new topology."""
    _nodes, serving, groups = _serving_data_nodes(ctx)
    serving = [n for n in serving if n not in exclude]
    if not serving:
        return []
    restored: list[str] = []
    for name in sorted(ctx.state.keyspaces):
        state = ctx.state  # after the previous keyspace's commit
        meta = state.keyspaces[name]
        history = state.data_topologies.get(name)
        if not history:
            continue
        latest = history[-1]
        topology = restore_replicas(latest, serving, meta.num_replicas, groups)
        if topology is latest:
            continue
        topologies = {**state.data_topologies, name: [*history, topology]}
        await ctx.commit(msgspec.structs.replace(state, data_topologies=topologies))
        restored.append(name)
        log.info("keyspace %s: replica chains restored in topology %d", name, topology.seq_num)
    back = [n for n in ctx.state.recovering if n in serving]
    if back:  # recovered nodes are placed again: their stale copies are settled by now
        recovering = {n: k for n, k in ctx.state.recovering.items() if n not in back}
        await ctx.commit(msgspec.structs.replace(ctx.state, recovering=recovering))
    return restored


def _targets(
    planned: Iterable[tuple[str, str, int, str, str, int]],
) -> dict[str, dict[int, str]]:
    """keyspace -> partition -> the planned target of its active."""
    out: dict[str, dict[int, str]] = {}
    for keyspace, _uuid, p, _source, target, _seq in planned:
        out.setdefault(keyspace, {})[p] = target
    return out


def _rebalance_plan(ctx: Any, targets: Mapping[str, Mapping[int, str]]) -> eject_mod.ChainPlan:
    """The chains a rebalance steers to: ``final_chains`` over the serving data nodes, with
    the planned active moves (``targets``) applied."""
    _nodes, serving, groups = _serving_data_nodes(ctx)

    def plan(name: str, latest: Topology, num_replicas: int) -> dict[int, list[str]]:
        return final_chains(latest, targets.get(name, {}), serving, num_replicas, groups)

    return plan


def _move_plan(ctx: Any, targets: Mapping[str, Mapping[int, str]]) -> eject_mod.ChainPlan:
    """The chains one admin move (``MovePartition``) steers: only the moved partition's, its
    replica on the target replaced first (``chains_after_moves``)."""
    _nodes, serving, groups = _serving_data_nodes(ctx)

    def plan(name: str, latest: Topology, num_replicas: int) -> dict[int, list[str]] | None:
        moved = targets.get(name)
        if not moved:
            return None
        chains = chains_after_moves(latest, serving, num_replicas, groups, moved)
        return {p: chains[p] for p in moved}

    return plan


def _chains_to_steer(ctx: Any, targets: Mapping[str, Mapping[int, str]]) -> list[str]:
    """The keyspaces whose chains a rebalance changes beyond its active moves."""
    plan = _rebalance_plan(ctx, targets)
    out: list[str] = []
    for name, meta in sorted(ctx.state.keyspaces.items()):
        history = ctx.state.data_topologies.get(name)
        if not history:
            continue
        latest = history[-1]
        chains = plan(name, latest, meta.num_replicas)
        if widened(latest, chains) is not latest or narrowed(latest, chains) is not latest:
            out.append(name)
    return out


def _busy(record: RebalanceRecord | None) -> None:
    """Refuse a new plan while a move is unresolved: its partition's owner is unknown."""
    stuck = [m for m in (record.moves if record else []) if m.status in IN_FLIGHT]
    if stuck:
        m = stuck[0]
        raise ShardexError(
            f"the move of {m.keyspace}/{m.partition} from {m.source} to {m.target} is not "
            f"settled yet ({m.status}: {m.error or 'in progress'}); it settles when "
            f"{m.source} answers",
            code=ErrorCode.NODE_UNAVAILABLE,
            details={"moves": [f"{x.keyspace}/{x.partition}" for x in stuck][:20]},
        )


class Rebalancer:
    """The rebalance ops and background migrations of one coordinator (master side)."""

    def __init__(self, coordinator: Any) -> None:
        self._c = coordinator
        self.phases: dict[str, str] = {}  # migration id -> live phase (this master only)
        self.replicas_placed: dict[str, int] = {}  # rebalance id -> replica copies built
        self._resolver: asyncio.Task[None] | None = None
        self.driver = MigrationDriver(coordinator, self.phases, self._ensure_resolver)
        self.index_driver = IndexMoveDriver(coordinator, self.phases)  # index partitions

    def register(self) -> None:
        self._c.register_op(StartRebalance, self.start)
        self._c.register_op(MovePartition, self.move)
        self._c.register_op(GetRebalance, self.status)
        self._c.register_recovery(self.recover)

    # --- ops ---------------------------------------------------------------------------------

    async def start(self, msg: StartRebalance, ctx: Any) -> RebalanceReply:
        state = ctx.state
        running = state.rebalance
        if running is not None and running.state == RUNNING:
            return RebalanceReply(record=running, phases=dict(self.phases), attached=True)
        _busy(running)
        if msg.eject:
            return await self._start_eject(msg, ctx)
        nodes, serving, groups = _serving_data_nodes(ctx)
        keyspaces = {
            name: (meta.uuid, state.data_topologies[name][-1])
            for name, meta in state.keyspaces.items()
            if state.data_topologies.get(name)
        }
        planned = plan_moves(keyspaces, nodes, serving, groups)  # refusals before any commit
        # Chains cut short (a failover) are filled now, before the record that carries the
        # reply is committed: that only adds copies. The plan is made on the filled chains.
        if await restore_chains(ctx):
            state = ctx.state
            keyspaces = {name: (uuid, state.data_topologies[name][-1]) for name, (uuid, _t)
                         in keyspaces.items()}  # fmt: skip
            planned = plan_moves(keyspaces, nodes, serving, groups)
        steer = _chains_to_steer(ctx, _targets(planned))
        record = new_record(
            ctx.new_id(),
            "rebalance",
            planned,
            [ctx.new_id() for _ in planned],
            time.time(),
            max_parallel=max(1, min(msg.max_parallel, MAX_PARALLEL)),
            rate_limit=max(0, msg.rate_limit),
        )
        if steer:  # replicas to move: the record runs even with no active to move
            record = msgspec.structs.replace(record, state=RUNNING, finished_at=0.0, message="")
        # index partitions over the up indexers too, and the index copies lost
        record, _copies = plan_into(ctx, record)
        return await self._begin(ctx, record)

    async def _start_eject(self, msg: StartRebalance, ctx: Any) -> RebalanceReply:
        """A rebalance that removes ``msg.eject`` from the cluster (``eject.py``): only the
        moves off the ejected nodes, planned on the chains as steps 1-3 will leave them,
        and the index moves off the ejected indexers (refused when a slice there has
        nowhere to go)."""
        eject = eject_mod.check_eject(ctx, msg.eject)
        state = ctx.state
        _nodes, serving, _groups = _serving_data_nodes(ctx)
        keyspaces = {
            name: (meta.uuid, state.data_topologies[name][-1])
            for name, meta in state.keyspaces.items()
            if state.data_topologies.get(name)
        }
        planned = plan_eject_moves(keyspaces, eject, [n for n in serving if n not in eject])
        record = new_record(
            ctx.new_id(),
            "eject",
            planned,
            [ctx.new_id() for _ in planned],
            time.time(),
            max_parallel=max(1, min(msg.max_parallel, MAX_PARALLEL)),
            rate_limit=max(0, msg.rate_limit),
        )
        record, copies = plan_into(ctx, record, eject)
        eject_mod.refuse_unplaced_slices(copies.unplaced)
        # Always run: chains to widen and the member removal come after the (maybe no) moves.
        record = msgspec.structs.replace(
            record, eject=eject, state=RUNNING, finished_at=0.0, message=""
        )
        return await self._begin(ctx, record)

    async def move(self, msg: MovePartition, ctx: Any) -> RebalanceReply:
        state = ctx.state
        if state.rebalance is not None and state.rebalance.state == RUNNING:
            raise ShardexError(
                "a rebalance is running; move partitions when it is done",
                code=ErrorCode.BAD_REQUEST,
                details={"rebalance": state.rebalance.id},
            )
        _busy(state.rebalance)
        meta = state.keyspaces.get(msg.keyspace)
        history = state.data_topologies.get(msg.keyspace)
        if meta is None or not history:
            raise KeyspaceNotFound(
                f"keyspace {msg.keyspace!r} not found", details={"keyspace": msg.keyspace}
            )
        topo = history[-1]
        source = topo.assignment.get(msg.partition)
        if source is None:
            raise BadRequest(
                f"partition {msg.partition} is outside 0..{meta.num_partitions - 1}",
                details={"partition": msg.partition},
            )
        _nodes, serving, _groups = _serving_data_nodes(ctx)
        up_names = set(serving)
        if msg.target not in up_names or source not in up_names:
            raise ShardexError(
                f"both {source} (owner) and {msg.target} (target) must be up data nodes "
                "(not failed over)",
                code=ErrorCode.NODE_UNAVAILABLE,
                details={"up": sorted(up_names)},
            )
        if msg.target == source:
            raise BadRequest(
                f"partition {msg.partition} of {msg.keyspace!r} is already on {source}",
                details={"partition": msg.partition, "node": source},
            )
        planned = [(msg.keyspace, meta.uuid, msg.partition, source, msg.target, topo.seq_num)]
        record = new_record(
            ctx.new_id(),
            "move",
            planned,
            [ctx.new_id()],
            time.time(),
            max_parallel=1,
            rate_limit=max(0, msg.rate_limit),
        )
        return await self._begin(ctx, record)

    async def status(self, msg: GetRebalance, ctx: Any) -> RebalanceReply:
        return RebalanceReply(record=ctx.state.rebalance, phases=dict(self.phases))

    async def _begin(self, ctx: Any, record: RebalanceRecord) -> RebalanceReply:
        reply = RebalanceReply(record=record)
        await ctx.commit(msgspec.structs.replace(ctx.state, rebalance=record), reply=reply)
        if record.state == RUNNING:
            log.info("rebalance %s: %d move(s) planned", record.id, len(record.moves))
            self._c.spawn(self._run(record.id, ctx.epoch))
        return reply

    # --- recovery (a newly promoted master) -----------------------------------------------------

    async def recover(self, ctx: Any) -> None:
        """Close an interrupted rebalance and resolve its in-flight moves (module docstring).
        Commits only from the state; node calls happen in the background resolver."""
        record = ctx.state.rebalance
        if record is None:
            return
        if record.state == RUNNING:
            changed = record
            for m in record.moves:
                if m.status == PLANNED:
                    changed = with_move(changed, m.migration_id, status=CANCELLED)
                elif m.status == MOVING:
                    changed = with_move(
                        changed, m.migration_id, status=UNRESOLVED, error="master failover"
                    )
            # Index moves: nothing past a point of no return outside this state (the
            # switch and ``done`` are one commit), so a move still moving is aborted.
            stranded = [m for m in changed.index_moves if m.status == MOVING]
            changed = msgspec.structs.replace(
                changed, index_moves=interrupt_index_moves(changed.index_moves, "master failover")
            )
            changed = finish(changed, time.time(), "interrupted by a coordinator failover")
            await ctx.commit(msgspec.structs.replace(ctx.state, rebalance=changed))
            if stranded:  # their targets drop their copies (node calls: in the background)
                self._c.spawn(self.index_driver.cleanup(stranded))
            record = changed
            log.warning("rebalance %s was interrupted by a failover: resolving", record.id)
        if any(m.status in IN_FLIGHT for m in record.moves):
            self._ensure_resolver(ctx.epoch)

    def _ensure_resolver(self, epoch: int) -> None:
        if self._resolver is None or self._resolver.done():
            self._resolver = self._c.spawn(self._resolve_loop(epoch))

    def _unsettled(self) -> list[MoveRecord]:
        """In-flight moves no live migration task of this master is working on."""
        record = self._c.state.rebalance
        return [
            m
            for m in (record.moves if record else [])
            if m.status in IN_FLIGHT and m.migration_id not in self.phases
        ]

    async def _resolve_loop(self, epoch: int) -> None:
        while pending := self._unsettled():
            for m in pending:
                try:
                    await self.driver.resolve(m, epoch, m.error or "interrupted")
                except ShardexError as exc:
                    if deposed(exc):
                        return
                    log.warning("resolving %s/%d failed: %s", m.keyspace, m.partition, exc)
            if self._unsettled():
                await asyncio.sleep(RESOLVE_INTERVAL)

    # --- the background rebalance ---------------------------------------------------------------

    async def _run(self, rebalance_id: str, epoch: int) -> None:
        record = self._c.state.rebalance
        if record is None or record.id != rebalance_id:
            return
        limit = asyncio.Semaphore(record.max_parallel)
        try:
            if record.eject:  # the index slices first: one with nowhere to go stops it early
                await self.index_driver.run(record, epoch)
                left = eject_mod.slices_left(self._c.state, record.eject)
                if left:
                    raise ShardexError(
                        f"index slices not moved off: {', '.join(left[:10])}",
                        code=ErrorCode.NODE_UNAVAILABLE,
                        details={"slices": left[:50]},
                    )
            await self._steer_chains(record, epoch)
        except ShardexError as exc:
            if deposed(exc):
                log.warning("%s %s: no longer master; run it again", record.kind, rebalance_id)
                return
            log.error("%s %s: moving index slices or replicas failed: %s",
                      record.kind, rebalance_id, exc)  # fmt: skip
            why = f"{record.kind} stopped: {exc}"
            await self._c.exclusive(epoch, lambda ctx: self._give_up(ctx, rebalance_id, why))
            return

        async def one(move: MoveRecord) -> None:
            async with limit:
                await self.driver.migrate(move, epoch, record.rate_limit)

        todo = [m for m in record.moves if m.status == PLANNED]
        results = await asyncio.gather(*(one(m) for m in todo), return_exceptions=True)
        for r in results:
            if isinstance(r, ShardexError) and deposed(r):
                log.warning("rebalance %s: no longer master; the next one resolves it", epoch)
                return
            if isinstance(r, BaseException):
                log.error("rebalance %s: a migration crashed", rebalance_id, exc_info=r)
        # A move onto a node already in its chain (no node outside it was left) shortens the
        # chain once published; a failed move leaves a planned replica unplaced: restore.
        try:
            if todo and record.kind == "rebalance":
                await self._steer_chains(record, epoch, after_moves=True)
            await self._c.exclusive(epoch, lambda ctx: restore_chains(ctx, exclude=record.eject))
        except ShardexError as exc:
            if deposed(exc):
                log.warning("rebalance %s: no longer master; the next one resolves it", epoch)
                return
            log.error("rebalance %s: restoring replica chains failed: %s", rebalance_id, exc)
        try:  # then the index partitions (``index_rebalance``; an eject's ran first)
            current = self._c.state.rebalance  # an eject's moves ran: not planned any more
            if current is not None and current.id == rebalance_id:
                await self.index_driver.run(current, epoch)
        except ShardexError as exc:
            if deposed(exc):
                log.warning("rebalance %s: no longer master; the next one resolves it", epoch)
                return
            raise

        async def done(ctx: Any) -> None:
            rec = ctx.state.rebalance
            if rec is None or rec.id != rebalance_id or rec.state != RUNNING:
                return
            for m in rec.moves:  # a crashed migration task leaves its move to the resolver
                if m.status == MOVING:
                    rec = with_move(rec, m.migration_id, status=UNRESOLVED, error="crashed")
                elif m.status == PLANNED:
                    rec = with_move(rec, m.migration_id, status=CANCELLED)
            rec = settle_index_moves(rec, "crashed")
            rec = finish(rec, time.time())
            placed = self.replicas_placed.pop(rebalance_id, 0)
            if placed and rec.state == DONE:  # what the moves list does not show
                why = f"{placed} replica cop(ies) built, caught up before any replica left"
                rec = msgspec.structs.replace(rec, message=why)
            state = ctx.state
            if rec.eject:
                rec = self._remove_ejected(ctx, rec)
                if rec.state == DONE:  # an ejected manager leaves the voters in this commit
                    state, why = retire_ejected(ctx, rec.eject)
                    if why:
                        rec = msgspec.structs.replace(rec, state=FAILED, message=why)
            await ctx.commit(msgspec.structs.replace(state, rebalance=rec))
            log.info(
                "rebalance %s %s: %d moved, %d failed, %d unresolved",
                rebalance_id,
                rec.state,
                rec.count(DONE),
                rec.count(FAILED),
                rec.count(UNRESOLVED),
            )
            if rec.count(UNRESOLVED):
                self._ensure_resolver(epoch)

        await self._c.exclusive(epoch, done)

    # --- replica chains (the widen / wait / narrow of ``eject.py``) -----------------------------

    async def _steer_chains(
        self, record: RebalanceRecord, epoch: int, *, after_moves: bool = False
    ) -> None:
        """Every chain gets the replicas it will end with (added, waited for until caught
        up), and only then loses those it will not (an eject's: steps 1-3 of ``eject.py``; a
        rebalance's: ``final_chains``). Before the active moves, planned with them; a
        rebalance's second pass (``after_moves``) places what only a move could free: a
        replica on the node an active left."""
        targets = {} if after_moves else _targets(
            (m.keyspace, "", m.partition, m.source, m.target, 0) for m in record.moves
        )  # fmt: skip
        why = f"{record.kind} {record.id}"

        async def widen(ctx: Any) -> tuple[eject_mod.Waits, eject_mod.Chains]:
            if record.eject:
                plan = eject_mod.eject_plan(ctx, record.eject, targets)
            elif record.kind == "move":
                plan = _move_plan(ctx, targets)
            else:
                plan = _rebalance_plan(ctx, targets)
            return await eject_mod.widen(ctx, plan, why)

        waits, planned = await self._c.exclusive(epoch, widen)
        if waits:
            await eject_mod.await_replicas(self._c, waits)
        await self._c.exclusive(epoch, lambda ctx: eject_mod.narrow(ctx, planned, why))
        placed = sum(len(nodes) for parts in waits.values() for nodes in parts.values())
        self.replicas_placed[record.id] = self.replicas_placed.get(record.id, 0) + placed

    @staticmethod
    async def _give_up(ctx: Any, rebalance_id: str, why: str) -> None:
        """End a rebalance before its moves: they are cancelled, nobody is removed."""
        rec = ctx.state.rebalance
        if rec is None or rec.id != rebalance_id or rec.state != RUNNING:
            return
        for m in rec.moves:
            if m.status == PLANNED:
                rec = with_move(rec, m.migration_id, status=CANCELLED)
        rec = finish(settle_index_moves(rec, "the eject stopped"), time.time(), why)
        await ctx.commit(msgspec.structs.replace(ctx.state, rebalance=rec))

    @staticmethod
    def _remove_ejected(ctx: Any, rec: RebalanceRecord) -> RebalanceRecord:
        """Step 6: once every move is done, remove the ejected nodes that hold nothing."""
        if rec.state != DONE:
            return msgspec.structs.replace(
                rec, message=f"{rec.message}; {', '.join(rec.eject)} not removed (run again)"
            )
        problems = eject_mod.remove_members(ctx, rec.eject)
        if problems:
            return msgspec.structs.replace(
                rec, state=FAILED, message=f"not removed: {'; '.join(problems)}"
            )
        return msgspec.structs.replace(
            rec, message=f"removed {', '.join(rec.eject)} from the cluster"
        )
