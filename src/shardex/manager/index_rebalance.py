"""Index-partition moves, driven by the coordinator master (the index side of a rebalance).

``Rebalancer.start`` plans them with the data moves (``plan_into``): moves that balance the
indexers (``plan_index_moves``), moves off ejected indexers and *additions* that restore
every chain to ``1 + num_replica`` copies (``meta/index_copy_plan.py``). ``Rebalancer._run``
runs them after the data moves (before them for an eject: ``IndexMoveDriver.run``), the moves
of one index partition one after the other (a partition is routed to one target at a time).
One move of index partition p from indexer S to indexer T (node side:
``shardex.index.slice_copy``):

1. commit the move ``moving`` (before any node hears of it);
2. T ``PrepareIncomingSlice``: the slice exists, catching up (queues, applies nothing);
3. commit ``routing``: the pipeline's router (which reads the rebalance record with the index
   state it refreshes) now sends p's key versions to S and T, and tells the timekeeper, which
   includes T in that index's stabilise rounds but not in its publish check;
4. T ``CopySliceIn``: waits for a round routed to it (TS E1), pulls S's slice at S's applied
   TS T1 >= E1 (entries + back index, chunked) and bulk-loads it with applied TS T1;
5. wait until T's applied TS covers the published stability TS (T takes part in rounds);
6. commit the new index topology (seq_num + 1, appended to the history) and the move
   ``done`` in ONE commit: scans now go to T;
7. ``IndexPartitionSwitched`` to S and T (re-sent until acknowledged, or the node is down,
   or this master's term ended: ``tell_switched``): paginated scans' migration managers learn
   the partition left S / arrived at T; S refuses new scans on its slice (retryable
   STALE_TOPOLOGY) and drops it after a grace period. A node that missed it learns the
   switch from the committed state at its next reconciliation
   (``SliceMoves.switched_in_state``).

An addition (``kind`` ADD) is the same move with two differences: in step 6 T joins p's
chain as a replica and S keeps its copy, and in step 7 only T is told (S serves on). Its
source is a surviving copy of p: re-chosen in step 1 if the planned one left the chain or is
down (an earlier move of p, in an eject, may have replaced it). A move's source may be a
replica copy: T takes its place in the chain.

Failures before 6 abort: commit ``failed`` (the router stops sending to T), then tell T to
drop its copy; S served the partition throughout. T dying mid-copy fails its RPC; S dying
fails the copy (and the partition is unavailable as it would be without a move). A new master
(``interrupt_index_moves`` in ``Rebalancer.recover``) fails every move still ``moving``: the
switch and ``done`` are one commit, so those never switched; it then tells their targets to
drop their copies (``cleanup``).
"""

from __future__ import annotations

import asyncio
import logging
from collections import Counter
from collections.abc import Iterable, Sequence
from typing import Any

import msgspec

from shardex.api.index import ListSlices, SliceList
from shardex.api.slice_copy import (
    AbortIncomingSlice,
    CopySliceIn,
    IncomingSliceReady,
    IndexPartitionSwitched,
    PrepareIncomingSlice,
    SliceCopied,
    SliceMoveDone,
)
from shardex.core.timestamp import Timestamp
from shardex.errors import ErrorCode, ShardexError
from shardex.index.records import STATE_ACTIVE, STATE_LOADING
from shardex.index.slice_copy import SWITCH_DROP_GRACE
from shardex.manager.migration_driver import MoveDriverBase, deposed
from shardex.meta.index_copy_plan import CopyPlan, plan_index_copies, slice_load
from shardex.meta.index_rebalance_state import (
    ADD,
    CANCELLED,
    DONE,
    FAILED,
    MOVING,
    PLANNED,
    IndexMoveRecord,
    new_index_moves,
    plan_index_moves,
    publish_index_move,
    replace_index_move,
)
from shardex.meta.index_state import ACTIVE
from shardex.meta.member_list import UP
from shardex.meta.rebalance_state import RUNNING, RebalanceRecord
from shardex.meta.slice_weight import slice_weights

__all__ = ["IndexMoveDriver", "indexer_members", "plan_into", "settle_index_moves"]

log = logging.getLogger(__name__)

COMMAND_TIMEOUT = 10.0
COPY_TIMEOUT = 3600.0  # the copy itself (a dead target or source fails it sooner)
ROUTED_TIMEOUT = 60.0  # for the first stabilise round routed to the target
CATCH_UP_TIMEOUT = 120.0
CATCH_UP_POLL = 0.1
DROP_GRACE = SWITCH_DROP_GRACE  # the source keeps its slice this long after the switch
SWITCH_RETRY = (0.2, 2.0)  # IndexPartitionSwitched re-sent after these pauses (doubling)


def indexer_members(ctx: Any) -> tuple[list[str], list[str]]:
    """(every index-service member, those up) as the master observes them."""
    membership = ctx.membership
    now = asyncio.get_running_loop().time()
    members = [m for m in membership.members if "index" in m.services]
    up = [m.name for m in members if membership.state_of(m.member_id, now)[0] == UP]
    return [m.name for m in members], up


def _groups(ctx: Any) -> dict[str, str]:
    return {m.name: m.group for m in ctx.membership.members if "index" in m.services}


def plan_into(
    ctx: Any, record: RebalanceRecord, eject: Sequence[str] = ()
) -> tuple[RebalanceRecord, CopyPlan]:
    """``record`` (a new rebalance) with its index moves, and the copy plan they came from
    (its ``unplaced`` copies refuse an eject, ``eject.refuse_unplaced_slices``). A plain
    rebalance balances the indexers, then adds the missing copies; an eject (``eject``:
    the nodes leaving) only moves their copies off (the next rebalance adds any missing). A
    record ``new_record`` finished for lack of data moves runs again when there are index
    moves."""
    state = ctx.state
    members, up = indexer_members(ctx)
    planned = [] if eject else plan_index_moves(state.indexes, state.index_topologies, members, up)
    load = slice_load(state.indexes, state.index_topologies)
    weights = slice_weights(state.indexes)
    for m in planned:  # the additions are placed by the load after the balancing moves
        load[m.source] -= weights[m.index_id]
        load[m.target] += weights[m.index_id]
    # An eject only drains its nodes: a failed addition would keep them in the cluster.
    copies = plan_index_copies(
        state.indexes, state.index_topologies, up, _groups(ctx), eject, Counter(load),
        restore=not eject,
    )  # fmt: skip
    for short in copies.short:
        log.warning("rebalance: a copy of index partition %s cannot be added: %s",
                    short.slice, short.why)  # fmt: skip
    planned = [*planned, *copies.moves]
    if not planned:
        return record, copies
    moves = new_index_moves(planned, [ctx.new_id() for _ in planned])
    record = msgspec.structs.replace(
        record, index_moves=moves, state=RUNNING, finished_at=0.0, message=""
    )
    return record, copies


def settle_index_moves(record: RebalanceRecord, why: str) -> RebalanceRecord:
    """The rebalance ends: moves never started are cancelled, a move still ``moving`` (its
    task crashed) failed."""
    moves = [
        msgspec.structs.replace(m, status="cancelled")
        if m.status == PLANNED
        else msgspec.structs.replace(m, status=FAILED, routing=False, error=why)
        if m.status == MOVING
        else m
        for m in record.index_moves
    ]
    return msgspec.structs.replace(record, index_moves=moves)


def _find(record: RebalanceRecord | None, migration_id: str) -> IndexMoveRecord | None:
    for m in record.index_moves if record else []:
        if m.migration_id == migration_id:
            return m
    return None


def _begin_check(state: Any, move: IndexMoveRecord, up: list[str]) -> tuple[str, str, str]:
    """(the source to copy from, why the move cannot start ("" if it can), its status now)
    against the committed ``state``. A move needs its source still in the partition's
    chain; an addition takes any up copy of the chain (the planned one first, a copy not
    being ejected next) and is cancelled, not needed any more, once the chain is full."""
    source, problem = _begin_problem(state, move, up)
    if not problem:
        return source, "", MOVING
    return source, problem, CANCELLED if problem.startswith(_FULL) else FAILED


_FULL = "the partition has its copies"


def _begin_problem(state: Any, move: IndexMoveRecord, up: list[str]) -> tuple[str, str]:
    rec = state.indexes.get(move.index_id)
    history = state.index_topologies.get(move.index_id) or []
    if rec is None or rec.state != ACTIVE:
        return move.source, "the index is not ACTIVE any more (dropped or rebuilding)"
    topo = history[-1] if history else None
    chain = topo.chain(move.partition) if topo and move.partition in topo.assignment else []
    source = move.source
    if move.kind == ADD:
        leaving = set(state.rebalance.eject if state.rebalance else ())
        live = sorted((n for n in chain if n in up), key=lambda n: (n != move.source, n in leaving))
        if len(chain) >= 1 + rec.num_replica:
            return source, f"{_FULL} already ({', '.join(chain)})"
        if not live:
            return source, "no copy of the partition is up to copy from"
        source = live[0]
    elif source not in chain:
        return source, "the index partition is not on its source any more"
    if move.target in chain:
        return source, f"{move.target} holds a copy of the partition already"
    down = [n for n in (move.target, source) if n not in up]
    if down:
        return source, f"{down[0]} is down"
    return source, ""


class IndexMoveDriver(MoveDriverBase):
    """Node calls and commits of index moves (module docstring)."""

    def __init__(self, coordinator: Any, phases: dict[str, str]) -> None:
        super().__init__(coordinator, phases)
        self.grace = DROP_GRACE
        self.switch_retry = SWITCH_RETRY  # (first pause, longest pause) between re-sends

    def _with_changes(
        self, record: RebalanceRecord, migration_id: str, changes: dict[str, Any]
    ) -> RebalanceRecord | None:
        if _find(record, migration_id) is None:
            return None
        moves = replace_index_move(record.index_moves, migration_id, **changes)
        return msgspec.structs.replace(record, index_moves=moves)

    async def run(self, record: RebalanceRecord, epoch: int) -> None:
        """Every planned index move of ``record``, ``max_parallel`` at a time, the moves of
        one index partition one after the other in plan order: the pipeline routes a
        partition to one move target at a time (``routed_targets``), and a later move of it
        (an addition after an eject's move) copies from the chain the earlier one left."""
        limit = asyncio.Semaphore(record.max_parallel)
        by_partition: dict[tuple[str, int], list[IndexMoveRecord]] = {}
        for m in record.index_moves:
            if m.status == PLANNED:
                by_partition.setdefault((m.index_id, m.partition), []).append(m)

        async def one(moves: list[IndexMoveRecord]) -> None:
            for move in moves:
                async with limit:
                    await self.migrate(move, epoch)

        groups = list(by_partition.values())
        results = await asyncio.gather(*(one(g) for g in groups), return_exceptions=True)
        for r in results:
            if isinstance(r, ShardexError) and deposed(r):
                raise r
            if isinstance(r, BaseException):
                log.error("rebalance %s: an index move crashed", record.id, exc_info=r)

    async def migrate(self, move: IndexMoveRecord, epoch: int) -> None:
        """One index move, steps 1-7 of the module docstring."""
        loop = asyncio.get_running_loop()
        mid, started = move.migration_id, loop.time()

        async def begin(ctx: Any) -> Any:
            state = ctx.state
            _members, up = indexer_members(ctx)
            source, problem, status = _begin_check(state, move, up)
            changes: dict[str, Any] = {"status": status}
            if problem:
                changes["error"] = problem
            elif source != move.source:  # an addition copies from another surviving copy
                changes["source"] = source
            moves = replace_index_move(state.rebalance.index_moves, mid, **changes)
            rebalance = msgspec.structs.replace(state.rebalance, index_moves=moves)
            await ctx.commit(msgspec.structs.replace(state, rebalance=rebalance))
            if problem:
                return None
            return state.indexes[move.index_id].definition, source

        begun = await self._c.exclusive(epoch, begin)
        if begun is None:
            return
        definition, source = begun
        move = msgspec.structs.replace(move, source=source, status=MOVING)
        stats: dict[str, Any] = {}
        common = {"migration_id": mid, "index_id": move.index_id, "partition": move.partition}
        try:
            self.phases[mid] = "preparing"
            ready = await self._ask(
                move.target,
                PrepareIncomingSlice(
                    migration_id=mid, definition=definition, partition=move.partition
                ),
                COMMAND_TIMEOUT,
                IncomingSliceReady,
            )
            await self.update(epoch, mid, routing=True)
            self.phases[mid] = "copying"
            copied = await self._ask(
                move.target,
                CopySliceIn(
                    **common,
                    source=move.source,
                    source_address=self._address(move.source),
                    incarnation=ready.incarnation,
                    routed_timeout=ROUTED_TIMEOUT,
                ),
                COPY_TIMEOUT,
                SliceCopied,
            )
            stats = {
                "copy_ts": copied.ts,
                "items": copied.items,
                "bytes": copied.bytes,
                "copy_seconds": round(copied.seconds, 3),
            }
            self.phases[mid] = "catching up"
            await self._caught_up(move, Timestamp.from_wire(copied.ts))
            self.phases[mid] = "switching"
            seq = await self._switch(move, epoch, stats, loop.time() - started)
        except ShardexError as exc:
            if deposed(exc):
                raise
            log.warning(
                "index move %s of %s/%d (%s -> %s) failed: %s",
                mid, move.index_name, move.partition, move.source, move.target, exc,
            )  # fmt: skip
            await self.abort(move, epoch, str(exc), stats)
            return
        finally:
            self.phases.pop(mid, None)
        log.info(
            "index %s %s: %s/%d now on %s (index topology %d)",
            "copy" if move.kind == ADD else "move",
            mid, move.index_name, move.partition, move.target, seq,
        )  # fmt: skip
        switched = IndexPartitionSwitched(
            **common, source=move.source, target=move.target, topology_seq=seq, grace=self.grace
        )
        # The target first, as before: it owns the partition once the source lets go. An
        # addition's source keeps its copy: it hears nothing.
        for node in (move.target,) if move.kind == ADD else (move.target, move.source):
            await self.tell_switched(node, switched, epoch)

    async def tell_switched(self, node: str, msg: IndexPartitionSwitched, epoch: int) -> bool:
        """Send ``msg`` to ``node`` until it acknowledges (True), or it is not up any more or
        this master's term ended (False). The source must hear it: until then it serves the
        slice and its paginated scans never learn the partition left. A node declared down
        learns the switch from the state at its next reconciliation instead
        (``SliceMoves.switched_in_state``), as does every node after a failover."""
        pause = self.switch_retry[0]
        while True:
            try:
                await self._ask(node, msg, COMMAND_TIMEOUT, SliceMoveDone)
                return True
            except ShardexError as exc:
                if deposed(exc):
                    raise
                error = exc
            if self._c.epoch != epoch:
                log.info("index move %s: term %d over; %s learns the switch from the state",
                         msg.migration_id, epoch, node)  # fmt: skip
                return False
            if node not in indexer_members(self._c)[1]:
                log.warning("index move %s: %s is down (%s); it learns the switch from the "
                            "state", msg.migration_id, node, error)  # fmt: skip
                return False
            log.info("index move %s: telling %s of the switch failed (%s), again in %.1f s",
                     msg.migration_id, node, error, pause)  # fmt: skip
            await asyncio.sleep(pause)
            pause = min(self.switch_retry[1], pause * 2)

    async def _caught_up(self, move: IndexMoveRecord, copy_ts: Timestamp) -> None:
        """Until T's slice is active, a round at or after the copy was published to it, and
        its applied TS covers that published stability TS."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + CATCH_UP_TIMEOUT
        last = "no answer"
        while loop.time() < deadline:
            # The timekeeper fails a move whose target missed a published round
            # (``index_copies.fail_late_targets``): it must not be switched in.
            current = _find(self._c.state.rebalance, move.migration_id)
            if current is not None and current.status != MOVING:
                raise ShardexError(
                    f"index move {move.migration_id} is {current.status}: {current.error}",
                    code=ErrorCode.STALE_TOPOLOGY,
                    details={"migration_id": move.migration_id},
                )
            reply = await self._ask(
                move.target, ListSlices(index_id=move.index_id), COMMAND_TIMEOUT, SliceList
            )
            mine = [s for s in reply.slices if s.partition == move.partition]
            if not mine:
                raise ShardexError(
                    f"{move.target} lost its copy of {move.index_name}/{move.partition}",
                    code=ErrorCode.INDEX_NOT_FOUND,
                    details={"node": move.target, "index": move.index_id},
                )
            s = mine[0]
            if s.state not in (STATE_ACTIVE, STATE_LOADING):
                raise ShardexError(
                    f"the copy of {move.index_name}/{move.partition} on {move.target} is "
                    f"{s.state} (the indexer restarted?)",
                    code=ErrorCode.INDEX_IN_ROLLBACK,
                    details={"node": move.target, "state": s.state},
                )
            applied = Timestamp.from_wire(s.applied)
            stable = None if s.stability is None else Timestamp.from_wire(s.stability)
            if (
                s.state == STATE_ACTIVE
                and stable is not None
                and stable.covers(copy_ts)
                and applied.covers(stable)
            ):
                return
            last = f"{s.state}, applied {applied!r}, published {stable!r}"
            await asyncio.sleep(CATCH_UP_POLL)
        raise ShardexError(
            f"the copy of {move.index_name}/{move.partition} on {move.target} did not catch "
            f"up within {CATCH_UP_TIMEOUT:.0f} s ({last})",
            code=ErrorCode.TIMEOUT,
            details={"node": move.target, "hint": "is the pipeline running?"},
        )

    async def _switch(
        self, move: IndexMoveRecord, epoch: int, stats: dict[str, Any], seconds: float
    ) -> int:
        """The new index topology and the move ``done``, in one commit."""

        async def fn(ctx: Any) -> int:
            state = ctx.state
            current = _find(state.rebalance, move.migration_id)
            if current is None or current.status != MOVING:
                raise ShardexError(
                    f"index move {move.migration_id} is {current.status if current else 'gone'}",
                    code=ErrorCode.STALE_TOPOLOGY,
                    details={"migration_id": move.migration_id},
                )
            rec = state.indexes.get(move.index_id)
            if rec is None or rec.state != ACTIVE:
                raise ShardexError(
                    f"index {move.index_name!r} was dropped or is rebuilding",
                    code=ErrorCode.INDEX_NOT_FOUND,
                    details={"index": move.index_id},
                )
            history, topo = publish_index_move(state.index_topologies[move.index_id], move)
            moves = replace_index_move(
                state.rebalance.index_moves,
                move.migration_id,
                status=DONE,
                routing=False,
                error="",
                topology_seq=topo.seq_num,
                seconds=round(seconds, 3),
                **stats,
            )
            await ctx.commit(
                msgspec.structs.replace(
                    state,
                    index_topologies={**state.index_topologies, move.index_id: history},
                    rebalance=msgspec.structs.replace(state.rebalance, index_moves=moves),
                )
            )
            return topo.seq_num

        seq: int = await self._c.exclusive(epoch, fn)
        return seq

    async def abort(
        self, move: IndexMoveRecord, epoch: int, error: str, stats: dict[str, Any] | None = None
    ) -> None:
        """Fail the move (the router stops sending to T), then drop T's copy."""
        self.phases[move.migration_id] = "aborting"
        try:
            await self.update(
                epoch, move.migration_id, status=FAILED, routing=False, error=error,
                **(stats or {}),
            )  # fmt: skip
            await self.cleanup([move])
        finally:
            self.phases.pop(move.migration_id, None)

    async def cleanup(self, moves: Iterable[IndexMoveRecord]) -> None:
        """Tell the targets of failed moves to drop their copies (best effort: a target that
        is down holds a copy in ``needs_rebuild`` the pipeline never routes to)."""
        for m in moves:
            msg = AbortIncomingSlice(
                migration_id=m.migration_id, index_id=m.index_id, partition=m.partition
            )
            try:
                await self._ask(m.target, msg, COMMAND_TIMEOUT, SliceMoveDone)
            except ShardexError as exc:
                log.info("index move %s: %s not told to drop its copy: %s", m.migration_id,
                         m.target, exc)  # fmt: skip
