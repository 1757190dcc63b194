"""Index DDL as coordinator ops: CREATE / BUILD / DROP INDEX, the pipeline hooks, recovery.

CREATE follows ``index-ddl-flow.md``'s prepare phase step by step (the numbers are
the flow's; ``step_hook`` is called at each step the op itself passes, so the simulator can crash
the master exactly there):

 1. the master receives the request (``create_index``; a retry with a known request id gets
    the stored reply before the op runs at all);
 2. validation (``index_validate.validate_create``; nothing is created on refusal), then a
    new id, state INIT, the proposed topology (seq_num 1);
 3-7. ``ctx.commit``: cas + 1, persisted on the master, replicated synchronously to every
    manager, held by a majority (``replication.py``). Step 3 is reported from the master's
    apply (``_on_apply``); 4-7 happen inside the commit (the sim test reaches them through
    the coordinator's own hooks);
 8-11. ``AllocateSlices`` to each indexer of the topology (replica copies included) in name
    order: 8 / 10 before a request, 9 / 11 after its ACK (``_allocate``);
 12-16. state READY, committed the same way (12 reported from the master's apply);
 17. the reply (SUCCESS) - after the load phase has started: unless ``defer_build`` the
    index moves to BUILDING in one more commit, which also records the reply.

An indexer that cannot allocate (down, refusing, silent after ``node_attempts``) fails the
CREATE: the index goes INIT -> DELETED (commit), the slices already made are dropped, the
record is removed (commit), and the client gets NODE_UNAVAILABLE with
``reason="allocation_failed"``: nothing was created, retrying is safe. We remove rather than
mark ERROR because nothing about a half-allocated index is worth keeping, and the name stays
free for the retry; ERROR is kept for build failures reported by the pipeline.

DROP: DELETED (commit), ``DropSlices`` to every indexer that ever held a slice, removal
(commit, with the reply). Indexers that could not be told drop the slices when they
reconcile (``index/service.py``).

Recovery (``recover``, run by a newly promoted master before it serves ops, under the op
lock): INIT is *finished* - allocation re-sent (idempotent), READY, BUILDING unless
deferred, the reply recorded under the CREATE's request id so the client's retry gets it;
if allocation fails now, the index is removed as above. READY that was not deferred moves on
to BUILDING. DELETED is finished: drop slices, remove, reply recorded under the DROP's
request id. Everything is idempotent: a recovery that fails abandons the promotion and the
next one starts over.

The load phase belongs to the index pipeline: it calls ``IndexBuildProgress`` while
building, then ``MarkIndexActive`` (BUILDING -> ACTIVE) or ``MarkIndexError`` (-> ERROR).
Afterwards the timekeeper keeps an ACTIVE index's ``items_count`` current with
``RecordIndexItems`` (``index_items.py``).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Any

import msgspec

from shardex.api.errors import BadRequest, KeyspaceNotFound
from shardex.api.index import AllocateSlices, DropSlices
from shardex.api.index_ddl import (
    BuildIndex,
    CreateIndex,
    DropIndex,
    DropIndexCopies,
    IndexBuildProgress,
    IndexCreated,
    IndexDropped,
    IndexesBuilding,
    IndexUpdated,
    MarkIndexActive,
    MarkIndexError,
    RecordIndexItems,
)
from shardex.core.topology import Topology
from shardex.errors import ErrorCode, NodeUnavailable, ShardexError
from shardex.manager.index_copies import drop_index_copies
from shardex.manager.index_validate import validate_create
from shardex.meta.index_state import (
    ACTIVE,
    BUILDING,
    DELETED,
    ERROR,
    INIT,
    READY,
    IndexRecord,
    find_index,
    find_primary,
    latest_index_topology,
    make_index_id,
)
from shardex.meta.member_list import UP, MemberInfo
from shardex.meta.state import StateContext, record_reply
from shardex.net.messages import Message

__all__ = ["IndexDDL", "StepHook", "register_index_ddl"]

log = logging.getLogger(__name__)

StepHook = Callable[[int, str], None]  # (DDL flow step, index id); may raise to abort the op
NODE_ATTEMPTS = 3
NODE_TIMEOUT = 2.0
_TRANSIENT = frozenset(
    {
        ErrorCode.NODE_UNAVAILABLE,
        ErrorCode.TIMEOUT,
        ErrorCode.CONNECTION_CLOSED,
        ErrorCode.UNKNOWN_MESSAGE,  # a node between bind and route installation
    }
)


def index_not_found(keyspace: str, name: str | None, state: StateContext) -> ShardexError:
    known = sorted(r.name for r in state.indexes.values() if r.keyspace == keyspace)
    what = f"index {name!r}" if name is not None else "a primary index"
    return ShardexError(
        f"{what} not found on keyspace {keyspace!r}",
        code=ErrorCode.INDEX_NOT_FOUND,
        details={"keyspace": keyspace, "name": name, "indexes": known[:50]},
    )


def with_record(state: StateContext, rec: IndexRecord) -> StateContext:
    return msgspec.structs.replace(state, indexes={**state.indexes, rec.id: rec})


def without_index(state: StateContext, index_id: str) -> StateContext:
    return msgspec.structs.replace(
        state,
        indexes={k: v for k, v in state.indexes.items() if k != index_id},
        index_topologies={k: v for k, v in state.index_topologies.items() if k != index_id},
    )


async def commit_with_reply(
    ctx: Any, new_state: StateContext, reply: Message | None, request_id: str | None
) -> StateContext:
    """Commit, recording ``reply`` under ``request_id`` in the same commit (through the op's
    own context when it is the op's request, so the coordinator does not record it again)."""
    if reply is None or not request_id:
        return await ctx.commit(new_state)
    if ctx.request_id == request_id:
        return await ctx.commit(new_state, reply=reply)
    return await ctx.commit(record_reply(new_state, request_id, reply))


class IndexDDL:
    """The index DDL ops of one coordinator (registered on every manager node; they run on
    whichever is master)."""

    def __init__(
        self,
        coordinator: Any,
        *,
        node_attempts: int = NODE_ATTEMPTS,
        node_timeout: float = NODE_TIMEOUT,
    ) -> None:
        self.coordinator = coordinator
        self.node_attempts = node_attempts
        self.node_timeout = node_timeout
        self.step_hook: StepHook | None = None  # tests: crash the master at a DDL flow step
        self._seen: dict[str, str] = {}  # index id -> state at this node's last apply

    def register(self) -> IndexDDL:
        c = self.coordinator
        c.register_op(CreateIndex, self.create_index)
        c.register_op(BuildIndex, self.build_index)
        c.register_op(DropIndex, self.drop_index)
        c.register_op(IndexBuildProgress, self.build_progress)
        c.register_op(MarkIndexActive, self.mark_active)
        c.register_op(MarkIndexError, self.mark_error)
        c.register_op(RecordIndexItems, self.record_items)
        c.register_op(DropIndexCopies, drop_index_copies)
        c.register_recovery(self.recover)
        c.on_change(self._on_apply)
        return self

    # -- step hooks -------------------------------------------------------------------------

    def _step(self, step: int, index_id: str) -> None:
        if self.step_hook is not None:
            self.step_hook(step, index_id)

    def _on_apply(self, state: StateContext) -> None:
        """Steps 3 and 12: the master has persisted INIT / READY (nobody else has yet)."""
        prev = self._seen
        self._seen = {i: r.state for i, r in state.indexes.items()}
        if self.step_hook is None or not self.coordinator.is_master:
            return
        for index_id, rec in state.indexes.items():
            if prev.get(index_id) != rec.state and rec.state in (INIT, READY):
                self._step(3 if rec.state == INIT else 12, index_id)

    # -- talking to indexers ----------------------------------------------------------------

    def _member(self, ctx: Any, node: str) -> tuple[MemberInfo | None, bool]:
        """(member, up in the master's view)."""
        membership = ctx.membership
        now = asyncio.get_running_loop().time()
        for m in membership.members:
            if m.name == node:
                return m, membership.state_of(m.member_id, now)[0] == UP
        return None, False

    async def _tell(self, ctx: Any, node: str, msg: Message, attempts: int) -> str | None:
        """Send ``msg`` to ``node``, retrying transient failures while the node is up in the
        membership view; None on success, else why not."""
        last = "not attempted"
        for attempt in range(attempts):
            member, up = self._member(ctx, node)
            if member is None:
                return f"{node} is not a cluster member"
            if not up:
                return f"{node} is down"
            try:
                await ctx.pool.request(member.address, msg, self.node_timeout)
                return None
            except ShardexError as exc:
                last = str(exc)
                if exc.code not in _TRANSIENT:
                    return last  # a refusal: retrying says the same
            if attempt + 1 < attempts:
                await asyncio.sleep(0.2 * 2**attempt)
        return last

    async def _allocate(self, ctx: Any, rec: IndexRecord, topo: Topology) -> dict[str, str]:
        """DDL flow steps 8-11, one indexer at a time in name order; stops at the first failure."""
        for i, node in enumerate(topo.copy_nodes()):
            # Replica copies are slices like the primary's: same partition numbers.
            msg = AllocateSlices(definition=rec.definition, partitions=topo.copies_of(node))
            self._step(8 if i == 0 else 10, rec.id)
            err = await self._tell(ctx, node, msg, self.node_attempts)
            if err is not None:
                return {node: err}
            self._step(9 if i == 0 else 11, rec.id)
        return {}

    async def _drop_slices(self, ctx: Any, index_id: str) -> list[str]:
        """Best effort, in parallel: the nodes that did not confirm (they reconcile later)."""
        history = ctx.state.index_topologies.get(index_id, [])
        nodes = sorted({n for t in history for n in t.copy_nodes()})
        msg = DropSlices(index_id=index_id)
        results = await asyncio.gather(*(self._tell(ctx, n, msg, 2) for n in nodes))
        return [n for n, err in zip(nodes, results, strict=True) if err is not None]

    # -- CREATE -----------------------------------------------------------------------------

    async def create_index(self, msg: CreateIndex, ctx: Any) -> IndexCreated:
        self._step(1, "")
        state = ctx.state
        if msg.request_id:
            for rec in state.indexes.values():
                if rec.request_id == msg.request_id and rec.state != DELETED:
                    # The effect of this very request (its reply was evicted or not recorded).
                    if rec.state == INIT:
                        return await self._finish_create(ctx, rec.id)
                    topo = latest_index_topology(state.index_topologies, rec.id)
                    assert topo is not None
                    return IndexCreated(index=rec, topology=topo)
        members = [m for m in ctx.membership.members if "index" in m.services]
        up = [m.name for m in members if self._member(ctx, m.name)[1]]
        plan = validate_create(msg, state, [m.name for m in members], up)
        index_id = make_index_id(state.epoch, state.cas, ctx.new_id()[:12])
        rec = IndexRecord(
            definition=msgspec.structs.replace(plan.definition, id=index_id),
            state=INIT,
            defer_build=plan.defer_build,
            nodes=plan.nodes,
            request_id=msg.request_id,
            num_replica=plan.num_replica,
        )
        topo = Topology(seq_num=1, assignment=plan.assignment, replicas=plan.replicas)
        new_state = msgspec.structs.replace(
            with_record(state, rec),
            index_topologies={**state.index_topologies, index_id: [topo]},
        )
        self._step(2, index_id)
        await ctx.commit(new_state)  # steps 2-7
        return await self._finish_create(ctx, index_id)

    async def _finish_create(self, ctx: Any, index_id: str) -> IndexCreated:
        """Steps 8-17 for an index in INIT (the op, a retry, or recovery)."""
        rec = ctx.state.indexes[index_id]
        topo = latest_index_topology(ctx.state.index_topologies, index_id)
        assert topo is not None
        failed = await self._allocate(ctx, rec, topo)
        if failed:
            await self._drop_flow(ctx, index_id, None, error=f"allocation failed: {failed}")
            node, why = next(iter(failed.items()))
            raise NodeUnavailable(
                f"index {rec.name!r} on {rec.keyspace!r} was not created: indexer {node} did "
                f"not allocate its slices ({why}); nothing is left behind",
                details={
                    "reason": "allocation_failed",
                    "keyspace": rec.keyspace,
                    "name": rec.name,
                    "failed": failed,
                    "hint": "retry (the index is placed on the indexers that are up then), "
                    "or name other nodes",
                },
            )
        ready = msgspec.structs.replace(rec, state=READY)
        final = ready if rec.defer_build else msgspec.structs.replace(rec, state=BUILDING)
        reply = IndexCreated(index=final, topology=topo)
        if rec.defer_build:
            await commit_with_reply(ctx, with_record(ctx.state, ready), reply, rec.request_id)
        else:
            await ctx.commit(with_record(ctx.state, ready))  # steps 12-16
            await commit_with_reply(ctx, with_record(ctx.state, final), reply, rec.request_id)
        self._step(17, index_id)
        return reply

    # -- BUILD ------------------------------------------------------------------------------

    async def build_index(self, msg: BuildIndex, ctx: Any) -> IndexesBuilding:
        state = ctx.state
        if not msg.names:
            raise BadRequest("BUILD INDEX needs at least one index name", details={})
        recs: list[IndexRecord] = []
        for name in msg.names:
            rec = find_index(state.indexes, msg.keyspace, name)
            if rec is None or rec.state == DELETED:
                if msg.keyspace not in state.keyspaces:
                    raise KeyspaceNotFound(
                        f"keyspace {msg.keyspace!r} not found", details={"keyspace": msg.keyspace}
                    )
                raise index_not_found(msg.keyspace, name, state)
            if rec not in recs:
                recs.append(rec)
        started = [r for r in recs if r.state in (READY, ERROR)]
        new_state = state
        for r in started:
            new_state = with_record(
                new_state, msgspec.structs.replace(r, state=BUILDING, error="", progress=0.0)
            )
        reply = IndexesBuilding(
            indexes=[new_state.indexes[r.id] for r in recs], started=[r.name for r in started]
        )
        if started:
            await ctx.commit(new_state, reply=reply)
        return reply

    # -- DROP -------------------------------------------------------------------------------

    async def drop_index(self, msg: DropIndex, ctx: Any) -> IndexDropped:
        state = ctx.state
        if msg.is_primary and msg.name is None:
            rec = find_primary(state.indexes, msg.keyspace)
        else:
            rec = find_index(state.indexes, msg.keyspace, msg.name or "")
        if rec is None or rec.state == DELETED:
            if msg.keyspace not in state.keyspaces:
                raise KeyspaceNotFound(
                    f"keyspace {msg.keyspace!r} not found", details={"keyspace": msg.keyspace}
                )
            raise index_not_found(msg.keyspace, msg.name, state)
        if msg.is_primary and not rec.definition.is_primary:
            raise BadRequest(
                f"index {rec.name!r} is not a primary index",
                details={"name": rec.name, "hint": "DROP INDEX keyspace.name"},
            )
        return await self._drop_flow(ctx, rec.id, msg.request_id)

    async def _drop_flow(
        self, ctx: Any, index_id: str, request_id: str | None, *, error: str = ""
    ) -> IndexDropped:
        """DELETED (commit), drop the slices, remove (commit, reply recorded)."""
        rec = ctx.state.indexes[index_id]
        if rec.state != DELETED:
            rec = msgspec.structs.replace(
                rec, state=DELETED, drop_request_id=request_id, error=error or rec.error
            )
            await ctx.commit(with_record(ctx.state, rec))
        pending = await self._drop_slices(ctx, index_id)
        reply = IndexDropped(
            index_id=index_id, keyspace=rec.keyspace, name=rec.name, pending_nodes=pending
        )
        await commit_with_reply(ctx, without_index(ctx.state, index_id), reply, rec.drop_request_id)
        return reply

    # -- pipeline hooks ---------------------------------------------------------------------

    def _record(self, ctx: Any, index_id: str) -> IndexRecord:
        rec = ctx.state.indexes.get(index_id)
        if rec is None or rec.state == DELETED:
            raise ShardexError(
                f"index {index_id} not found",
                code=ErrorCode.INDEX_NOT_FOUND,
                details={"index_id": index_id},
            )
        return rec

    @staticmethod
    def _wrong_state(rec: IndexRecord, op: str, wanted: str) -> ShardexError:
        return BadRequest(
            f"{op}: index {rec.name!r} is {rec.state}, not {wanted}",
            details={"index_id": rec.id, "state": rec.state, "expected": wanted},
        )

    async def build_progress(self, msg: IndexBuildProgress, ctx: Any) -> IndexUpdated:
        rec = self._record(ctx, msg.index_id)
        if rec.state != BUILDING:
            raise self._wrong_state(rec, "IndexBuildProgress", BUILDING)
        if not 0.0 <= msg.progress <= 1.0 or msg.items_count < 0:
            raise BadRequest(
                "progress must be in 0..1 and items_count >= 0",
                details={"progress": msg.progress, "items_count": msg.items_count},
            )
        new = msgspec.structs.replace(
            rec,
            progress=float(msg.progress),
            items_count=msg.items_count,
            build_ts=msg.build_ts if msg.build_ts is not None else rec.build_ts,
        )
        reply = IndexUpdated(index=new)
        await ctx.commit(with_record(ctx.state, new), reply=reply)
        return reply

    async def mark_active(self, msg: MarkIndexActive, ctx: Any) -> IndexUpdated:
        rec = self._record(ctx, msg.index_id)
        if rec.state == ACTIVE and rec.build_ts == msg.build_ts:
            return IndexUpdated(index=rec)
        # ACTIVE with another build TS: a rebuild after a change-stream rollback (the index
        # stays ACTIVE meanwhile; its slices answer INDEX_IN_ROLLBACK until rebuilt).
        if rec.state not in (BUILDING, ACTIVE):
            raise self._wrong_state(rec, "MarkIndexActive", BUILDING)
        new = msgspec.structs.replace(
            rec,
            state=ACTIVE,
            build_ts=msg.build_ts,
            stability_ts=msg.stability_ts if msg.stability_ts is not None else msg.build_ts,
            items_count=msg.items_count,
            progress=1.0,
            error="",
        )
        reply = IndexUpdated(index=new)
        await ctx.commit(with_record(ctx.state, new), reply=reply)
        return reply

    async def record_items(self, msg: RecordIndexItems, ctx: Any) -> IndexUpdated:
        """An ACTIVE index's entries as the stability rounds see them (``index_items.py``);
        nothing is committed for another state (the build writes them) or the same count."""
        rec = self._record(ctx, msg.index_id)
        if msg.items_count < 0:
            raise BadRequest(
                f"items_count must be >= 0, not {msg.items_count}",
                details={"index_id": msg.index_id, "items_count": msg.items_count},
            )
        if rec.state != ACTIVE or rec.items_count == msg.items_count:
            return IndexUpdated(index=rec)
        new = msgspec.structs.replace(rec, items_count=msg.items_count)
        reply = IndexUpdated(index=new)
        await ctx.commit(with_record(ctx.state, new), reply=reply)
        return reply

    async def mark_error(self, msg: MarkIndexError, ctx: Any) -> IndexUpdated:
        rec = self._record(ctx, msg.index_id)
        if rec.state == ERROR and rec.error == msg.error:
            return IndexUpdated(index=rec)
        if rec.state != BUILDING:
            raise self._wrong_state(rec, "MarkIndexError", BUILDING)
        new = msgspec.structs.replace(rec, state=ERROR, error=msg.error or "build failed")
        reply = IndexUpdated(index=new)
        await ctx.commit(with_record(ctx.state, new), reply=reply)
        return reply

    # -- recovery ---------------------------------------------------------------------------

    async def recover(self, ctx: Any) -> None:
        """Finish or clean up the DDL a previous master left in flight (module docstring)."""
        for index_id in list(ctx.state.indexes):
            rec = ctx.state.indexes.get(index_id)
            if rec is None:
                continue
            if rec.state == INIT:
                log.info("recovery: finishing CREATE INDEX %s (%s)", rec.name, index_id)
                try:
                    await self._finish_create(ctx, index_id)
                except NodeUnavailable as exc:
                    if exc.details.get("reason") != "allocation_failed":
                        raise
                    log.warning("recovery: removed index %s: %s", index_id, exc.message)
            elif rec.state == READY and not rec.defer_build:
                topo = latest_index_topology(ctx.state.index_topologies, index_id)
                assert topo is not None
                final = msgspec.structs.replace(rec, state=BUILDING)
                reply = IndexCreated(index=final, topology=topo)
                await commit_with_reply(ctx, with_record(ctx.state, final), reply, rec.request_id)
            elif rec.state == DELETED:
                log.info("recovery: finishing DROP INDEX %s (%s)", rec.name, index_id)
                await self._drop_flow(ctx, index_id, rec.drop_request_id)


def register_index_ddl(coordinator: Any) -> IndexDDL:
    """Install the index DDL ops and recovery on a ``Coordinator``."""
    return IndexDDL(coordinator).register()
