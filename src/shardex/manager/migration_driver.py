"""One partition migration, driven by the coordinator master (steps in ``rebalance.py``).

``MigrationDriver.migrate`` runs steps 1-6 for one move; ``resolve`` settles a move whose
hand-over did not complete, from the source's own answer (``ResolveOutgoing``), which is
final because the source fences the migration when it answers "active". Every state change
goes through ``Coordinator.exclusive`` (the op lock, this master's term): a deposed master's
driver stops at its next commit, and data nodes refuse its commands once the new master has
spoken to them (the term fence).
"""

from __future__ import annotations

import abc
import asyncio
import logging
from typing import Any, TypeVar

import msgspec

from shardex.api.migration import (
    AbortIncoming,
    ActivateIncoming,
    CatchUp,
    CatchUpReply,
    DropOutgoing,
    FreezeOutgoing,
    FreezeReply,
    MigrateIn,
    MigrateInReply,
    Outcome,
    ReleaseOutgoing,
    ResolveOutgoing,
)
from shardex.errors import ErrorCode, ShardexError
from shardex.manager.keyspaces import data_members
from shardex.meta.rebalance_state import (
    DONE,
    FAILED,
    MOVING,
    UNRESOLVED,
    MoveRecord,
    RebalanceRecord,
    publish,
    resolution,
    with_move,
)
from shardex.net.messages import Message

log = logging.getLogger(__name__)

M = TypeVar("M", bound=Message)

COPY_TIMEOUT = 3600.0  # MigrateIn: the copy itself (a dead target closes the connection)
COMMAND_TIMEOUT = 10.0  # every other migration command
FREEZE_LEASE = 5.0  # a source unfreezes by itself after this if no release came


def deposed(exc: ShardexError) -> bool:
    """This master's term is over (its own commit, or a data node's term fence, says so)."""
    return exc.code is ErrorCode.NODE_UNAVAILABLE and exc.details.get("reason") == "deposed"


def member_address(coordinator: Any, node: str) -> str:
    """The address of cluster member ``node``; NODE_UNAVAILABLE if it is not one."""
    for m in coordinator.membership.members:
        if m.name == node:
            return str(m.address)
    raise ShardexError(
        f"node {node!r} is not a cluster member",
        code=ErrorCode.NODE_UNAVAILABLE,
        details={"node": node},
    )


async def ask_member(
    coordinator: Any, node: str, msg: Message, timeout: float, expect: type[M]
) -> M:
    """One request to member ``node`` over the coordinator's connection pool."""
    reply: M = await coordinator.pool.request(
        member_address(coordinator, node), msg, timeout, expect=expect
    )
    return reply


def _command_fields(move: MoveRecord, epoch: int) -> dict[str, Any]:
    """What every command of one move carries: the migration, this master's term (the data
    nodes' fence) and the partition."""
    return {
        "migration_id": move.migration_id,
        "epoch": epoch,
        "keyspace": move.keyspace,
        "partition": move.partition,
    }


class MoveDriverBase(abc.ABC):
    """What a data move's driver and an index move's driver share: commands to members over
    the coordinator's pool, and commits of one move's changes under the master's op lock."""

    def __init__(self, coordinator: Any, phases: dict[str, str]) -> None:
        self._c = coordinator
        self.phases = phases  # migration id -> live phase, shared with the Rebalancer

    @abc.abstractmethod
    def _with_changes(
        self, record: RebalanceRecord, migration_id: str, changes: dict[str, Any]
    ) -> RebalanceRecord | None:
        """``record`` with move ``migration_id`` changed; None if it holds no such move."""

    async def update(self, epoch: int, migration_id: str, **changes: Any) -> None:
        async def fn(ctx: Any) -> None:
            rec = ctx.state.rebalance
            rec = None if rec is None else self._with_changes(rec, migration_id, changes)
            if rec is not None:
                await ctx.commit(msgspec.structs.replace(ctx.state, rebalance=rec))

        await self._c.exclusive(epoch, fn)

    def _address(self, node: str) -> str:
        return member_address(self._c, node)

    async def _ask(self, node: str, msg: Message, timeout: float, expect: type[M]) -> M:
        return await ask_member(self._c, node, msg, timeout, expect)


class MigrationDriver(MoveDriverBase):
    """Node calls and commits of single migrations (module docstring)."""

    def __init__(self, coordinator: Any, phases: dict[str, str], on_unresolved: Any) -> None:
        super().__init__(coordinator, phases)
        self._on_unresolved = on_unresolved  # (epoch) -> None: make sure a resolver runs

    def _with_changes(
        self, record: RebalanceRecord, migration_id: str, changes: dict[str, Any]
    ) -> RebalanceRecord | None:
        try:
            record.move(migration_id)
        except KeyError:
            return None
        return with_move(record, migration_id, **changes)

    async def _tell(self, mid: str, node: str, msg: Message, failed: str) -> Outcome | None:
        """A command migration ``mid`` survives without: its outcome, or None once the
        failure is logged (``failed`` says what the node does about it); a deposed master
        stops."""
        try:
            return await self._ask(node, msg, COMMAND_TIMEOUT, Outcome)
        except ShardexError as exc:
            if deposed(exc):
                raise
            log.warning("migration %s: %s: %s", mid, failed, exc)
            return None

    async def migrate(self, move: MoveRecord, epoch: int, rate_limit: int) -> None:
        """One migration, steps 1-6 of the module docstring."""
        loop = asyncio.get_running_loop()
        mid, started = move.migration_id, loop.time()

        async def begin(ctx: Any) -> tuple[int, Any] | None:
            state = ctx.state
            meta = state.keyspaces.get(move.keyspace)
            history = state.data_topologies.get(move.keyspace) or []
            _members, up = data_members(ctx)
            problem = ""
            if meta is None or meta.uuid != move.keyspace_uuid:
                problem = "the keyspace was dropped"
            elif not history or history[-1].assignment.get(move.partition) != move.source:
                problem = "the partition is not on its source any more"
            elif move.target not in {m.name for m in up}:
                problem = f"{move.target} is down"
            rec = with_move(state.rebalance, mid, status=FAILED if problem else MOVING)
            if problem:
                rec = with_move(rec, mid, error=problem)
            committed = await ctx.commit(msgspec.structs.replace(state, rebalance=rec))
            return None if problem else (committed.cas, meta)

        begun = await self._c.exclusive(epoch, begin)
        if begun is None:
            return
        record_cas, meta = begun
        self.phases[mid] = "copying"
        common = _command_fields(move, epoch)
        stats: dict[str, Any] = {}
        release_sent = False
        try:
            try:
                copied = await self._ask(
                    move.target,
                    MigrateIn(
                        **common,
                        keyspace_uuid=meta.uuid,
                        created_cas=meta.created_cas,
                        num_partitions=meta.num_partitions,
                        source=move.source,
                        source_address=self._address(move.source),
                        base_seq=move.base_seq,
                        record_cas=record_cas,
                        rate_limit=rate_limit,
                    ),
                    COPY_TIMEOUT,
                    MigrateInReply,
                )
                stats = {
                    "bytes": copied.bytes,
                    "items": copied.items,
                    "docs": copied.docs,
                    "copy_seconds": round(copied.copy_seconds, 3),
                }
                self.phases[mid] = "hand-over"
                frozen_at = loop.time()
                frozen = await self._ask(
                    move.source,
                    FreezeOutgoing(**common, lease=FREEZE_LEASE),
                    COMMAND_TIMEOUT,
                    FreezeReply,
                )
                caught = await self._ask(
                    move.target,
                    CatchUp(
                        **common,
                        until=frozen.high_seqno,
                        source_address=self._address(move.source),
                    ),
                    COMMAND_TIMEOUT,
                    CatchUpReply,
                )
                if caught.high_seqno != frozen.high_seqno:
                    raise ShardexError(
                        f"target caught up to {caught.high_seqno}, source froze at "
                        f"{frozen.high_seqno}",
                        code=ErrorCode.INTERNAL,
                    )
                release_sent = True
                await self._ask(
                    move.source,
                    ReleaseOutgoing(**common, high_seqno=frozen.high_seqno),
                    COMMAND_TIMEOUT,
                    Outcome,
                )
            except ShardexError as exc:
                if deposed(exc):
                    raise
                log.warning(
                    "migration %s of %s/%d (%s -> %s) failed before the hand-over: %s",
                    mid,
                    move.keyspace,
                    move.partition,
                    move.source,
                    move.target,
                    exc,
                )
                await self.resolve(move, epoch, str(exc), stats, started, release_sent)
                return
            await self.roll_forward(move, epoch, frozen.high_seqno, stats, started, frozen_at)
        finally:
            self.phases.pop(mid, None)

    async def roll_forward(
        self,
        move: MoveRecord,
        epoch: int,
        high: int,
        stats: dict[str, Any],
        started: float | None,
        frozen_at: float | None,
    ) -> None:
        """The source has released: activate the target, publish, drop at the source."""
        loop = asyncio.get_running_loop()
        mid = move.migration_id
        self.phases[mid] = "publishing"
        common = _command_fields(move, epoch)
        # Its copy is complete and durable: it activates itself when it sees the topology.
        await self._tell(
            mid,
            move.target,
            ActivateIncoming(**common, high_seqno=high),
            f"activating on {move.target} failed (it activates from the topology)",
        )

        async def pub(ctx: Any) -> int:
            state = ctx.state
            meta = state.keyspaces.get(move.keyspace)
            if meta is None or meta.uuid != move.keyspace_uuid:
                rec = with_move(state.rebalance, mid, status=FAILED, error="keyspace dropped")
                await ctx.commit(msgspec.structs.replace(state, rebalance=rec))
                return 0
            history, topo = publish(state.data_topologies[move.keyspace], move)
            now = loop.time()
            rec = with_move(
                state.rebalance,
                mid,
                status=DONE,
                error="",
                topology_seq=topo.seq_num,
                pause_ms=round((now - frozen_at) * 1000, 1) if frozen_at else 0.0,
                seconds=round(now - started, 3) if started else 0.0,
                **stats,
            )
            topologies = {**state.data_topologies, move.keyspace: history}
            await ctx.commit(
                msgspec.structs.replace(state, data_topologies=topologies, rebalance=rec)
            )
            return topo.seq_num

        seq = await self._c.exclusive(epoch, pub)
        if not seq:
            return
        log.info(
            "migration %s: %s/%d now on %s (topology %d)",
            mid,
            move.keyspace,
            move.partition,
            move.target,
            seq,
        )
        await self._tell(
            mid,
            move.source,
            DropOutgoing(**common, topology_seq=seq),
            f"drop at {move.source} failed (it reconciles)",
        )

    async def resolve(
        self,
        move: MoveRecord,
        epoch: int,
        error: str,
        stats: dict[str, Any] | None = None,
        started: float | None = None,
        release_sent: bool = True,
    ) -> None:
        """Settle a move whose hand-over did not complete (``resolution``)."""
        mid = move.migration_id
        self.phases[mid] = "resolving"
        common = _command_fields(move, epoch)
        source = await self._tell(
            mid,
            move.source,
            ResolveOutgoing(**common),
            f"{move.source} did not answer how the hand-over ended",
        )
        history = self._c.state.data_topologies.get(move.keyspace) or []
        latest = history[-1] if history else None
        published = (
            latest is not None
            and latest.assignment.get(move.partition) == move.target
            and latest.seq_num > move.base_seq
        )
        action = resolution(None if source is None else source.state, published, release_sent)
        log.info("migration %s: resolved as %s (source %s)", mid, action, source)
        try:
            if action == "done":
                assert latest is not None
                await self.update(epoch, mid, status=DONE, error="", topology_seq=latest.seq_num)
            elif action == "roll_forward":
                assert source is not None
                await self.roll_forward(move, epoch, source.high_seqno, stats or {}, started, None)
            elif action == "abort":
                await self._tell(
                    mid,
                    move.target,
                    AbortIncoming(**common),
                    f"target {move.target} not told to abort (it drops its copy when it "
                    "reconciles: the move is failed)",
                )
                await self.update(epoch, mid, status=FAILED, error=error, **(stats or {}))
            elif move.status != UNRESOLVED:
                await self.update(
                    epoch, mid, status=UNRESOLVED, error=f"{error}; {move.source} unreachable"
                )
                self._on_unresolved(epoch)
        finally:
            self.phases.pop(mid, None)
