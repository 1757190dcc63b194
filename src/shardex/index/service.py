"""The index service of an indexer node: the local ``IndexerEngine`` on the wire.

DDL here; the pipeline's routes (delivery, stabilise, publish, initial loads) are
``shardex.index.delivery.IndexDelivery`` and partition moves ``shardex.index.slice_copy.
SliceMoves``, which the service composes and installs. They share the engine through an
``EngineHost`` (``engine_host.py``: the engine, its I/O thread, the slice-set lock, the
listeners), not through the service. The host picks a random ``incarnation`` at every start:
the mutation queues live in memory, so a delivery is only good for the incarnation that
queued it.

One engine per node in ``<data-dir>/index`` (RocksDB). The DDL coordinator allocates and
drops slices here (``AllocateSlices``, ``DropSlices``: DDL flow steps 8-11 and DROP INDEX); both
are idempotent, so a retry or a new master's recovery re-sending them is harmless.

Reconciliation. A node may be down while its slices are allocated or dropped, so it also
brings its slices in line with the coordinator state at start, on every state change it sees
and every ``reconcile_interval`` (``plan_reconcile``):

* it creates the slices the latest topology of every index in READY, BUILDING, ACTIVE or
  ERROR assigns to it and that it lacks (an index in INIT gets its slices from the master's
  ``AllocateSlices`` only: a node that misses it makes the CREATE fail, and a state in INIT
  may be an old master's change that no majority ever held);
* it drops the slices of an index the state marks DELETED, or no longer has *and* the state
  is newer than the index's creation (the index id carries the version its CREATE was built
  on: ``index_state.creation_base``). A state that is merely older than the index - a lagging
  replica - proves nothing and drops nothing;
* it never drops a slice of an index in a live state, and never acts on drops from a state
  that may not be committed: a drop is confirmed against the master's last committed state
  first. A manager node's own replica can hold one uncommitted change (an old master's
  DELETED that a failover discards); dropping on it would leave a live index without its
  slice.

Slices of partitions the topology no longer gives this node are normally dropped by the move
that took them away; the copies a move's messages cannot reach (a target down when its move
aborted, a source restarted during the drop grace) are orphans, dropped here after a grace
period and only against the committed state (``shardex.index.orphans``).

The engine is synchronous: its calls run in one I/O thread (serialised with each other, and
the changes of the slice set under ``host.lock``), or inline on the loop when ``inline_io``
is set (the simulator forbids threads; its engine is in memory).
"""

from __future__ import annotations

import asyncio
import functools
import logging
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from shardex.api.coordinator import StateReply, StateRequest
from shardex.api.index import (
    AllocateSlices,
    DropSlices,
    ListSlices,
    SliceList,
    SlicesAllocated,
    SlicesDropped,
)
from shardex.errors import NodeUnavailable, ShardexError
from shardex.index.delivery import IndexDelivery, describe_slices
from shardex.index.engine_host import EngineHost, SliceEngine
from shardex.index.orphans import OrphanTracker, SliceKey, plan_orphans
from shardex.index.slice_copy import ScanMigrations, SliceMoves
from shardex.meta.index_definition import IndexDefinition
from shardex.meta.index_state import (
    DELETED,
    INIT,
    LIVE_STATES,
    creation_base,
    latest_index_topology,
)
from shardex.meta.member_list import MemberInfo
from shardex.meta.state import StateContext
from shardex.net import Connection, ConnectionPool, RpcServer
from shardex.net.transport import Transport
from shardex.runtime.reconcile_loop import reconcile_forever
from shardex.storage.interface import OpenStore

__all__ = ["IndexService", "ReconcilePlan", "plan_reconcile"]

log = logging.getLogger(__name__)

DEFAULT_RECONCILE_INTERVAL = 2.0
STATE_TIMEOUT = 2.0
SECTIONS = ["indexes", "index_topologies", "rebalance"]  # rebalance: moves in flight


@dataclass(frozen=True)
class ReconcilePlan:
    create: list[tuple[IndexDefinition, list[int]]] = field(default_factory=list)
    drop: list[str] = field(default_factory=list)
    orphans: list[SliceKey] = field(default_factory=list)  # slices of live indexes (orphans.py)


def plan_reconcile(node: str, state: StateContext, held: dict[str, set[int]]) -> ReconcilePlan:
    """What this node must create and drop to match ``state`` (module docstring). ``held``:
    index id -> partitions with a local slice."""
    create: list[tuple[IndexDefinition, list[int]]] = []
    for index_id, rec in state.indexes.items():
        if rec.state not in LIVE_STATES or rec.state == INIT:
            continue
        topo = latest_index_topology(state.index_topologies, index_id)
        mine = topo.copies_of(node) if topo is not None else []
        missing = [p for p in mine if p not in held.get(index_id, set())]
        if missing:
            create.append((rec.definition, missing))
    drop: list[str] = []
    version = (state.epoch, state.cas)
    for index_id in sorted(held):
        rec = state.indexes.get(index_id)
        if rec is not None:
            if rec.state == DELETED:
                drop.append(index_id)
            continue
        base = creation_base(index_id)
        if base is not None and version > base:
            drop.append(index_id)
    return ReconcilePlan(create=create, drop=drop, orphans=plan_orphans(node, state, held))


class IndexService:
    """Routes of the index service (DDL, and the pipeline's via ``delivery``) plus slice
    reconciliation."""

    def __init__(
        self,
        *,
        node_name: str,
        transport: Transport,
        secret: str,
        path: Path | None = None,
        engine_factory: Callable[[], SliceEngine] | None = None,
        inline_io: bool = False,
        coordinator: Callable[[], Any | None] = lambda: None,
        members: Callable[[], list[MemberInfo]] = list,
        reconcile_interval: float = DEFAULT_RECONCILE_INTERVAL,
        scan_migrations: ScanMigrations,
        open_store: OpenStore | None = None,
    ) -> None:
        if engine_factory is None:
            if path is None:
                raise ValueError("IndexService needs a path or an engine factory")
            # ``open_store``: the engine's store (RocksDB when None; the simulator passes a
            # memory store on the node's simulated disk)
            engine_factory = functools.partial(_open_engine, Path(path), open_store)
        self.name = node_name
        self.path = path
        self.host = EngineHost(node_name, engine_factory, inline_io=inline_io)
        self._coordinator = coordinator
        self._members = members
        self.reconcile_interval = reconcile_interval
        self.pool = ConnectionPool(transport, secret, name=f"{node_name}/index")
        self._reconcile_now = asyncio.Event()
        self._tasks: list[asyncio.Task[None]] = []
        self.reconciled = asyncio.Event()  # set after the first successful reconcile
        # Paginated scans' migration managers, one per index: the index rebalance calls
        # scan_migrations.partition_left / _arrived / _returned (``elastic_adapters_index``).
        self.scan_migrations = scan_migrations
        # Index partitions moving in or out (``shardex.index.slice_copy``).
        self.slice_moves = SliceMoves(self.host, self.pool, scan_migrations)
        self.delivery = IndexDelivery(self.host, note_routed=self.slice_moves.note_routed)
        # Slices left behind by moves (``orphans.py``), timed on the loop's clock: virtual
        # time in the simulator, so a seed replays exactly.
        self.orphans = OrphanTracker(clock=_loop_time)

    # --- lifecycle ---------------------------------------------------------------------------

    @property
    def engine(self) -> SliceEngine:
        """The engine (NODE_UNAVAILABLE while the service is not running)."""
        return self.host.engine

    @property
    def incarnation(self) -> str:
        """This start's id (``engine_host.py``): what deliveries are checked against."""
        return self.host.incarnation

    @property
    def inline_io(self) -> bool:
        return self.host.inline_io

    def install(self, server: RpcServer) -> None:
        server.route(AllocateSlices, self._on_allocate)
        server.route(DropSlices, self._on_drop)
        server.route(ListSlices, self._on_list)
        self.delivery.install(server)
        self.slice_moves.install(server)

    async def start(self) -> None:
        """Open the engine, then reconcile in the background; call before serving."""
        engine = await self.host.open()
        coord = self._coordinator()
        if coord is not None:
            coord.on_change(lambda *_args: self._reconcile_now.set())
        loop = asyncio.get_running_loop()
        self._tasks.append(loop.create_task(self._reconcile_loop(), name="index-reconcile"))
        log.info(
            "index service of %s (incarnation %s): %d slice(s)",
            self.name,
            self.incarnation,
            len(engine.slices()),
        )

    async def stop(self) -> None:
        for t in self._tasks:
            t.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        self._tasks.clear()
        await self.slice_moves.stop()
        await self.pool.close()
        await self.host.close()

    def close_now(self) -> None:
        """Close the engine synchronously (a simulated crash: tasks are already cancelled)."""
        self.host.close_now()

    # --- handlers ----------------------------------------------------------------------------

    def _held(self) -> dict[str, set[int]]:
        held: dict[str, set[int]] = {}
        for s in self.engine.slices():
            held.setdefault(s.definition.id, set()).add(s.partition)
        return held

    def _create(self, definition: IndexDefinition, partitions: Iterable[int]) -> list[int]:
        held = self._held().get(definition.id, set())
        created = []
        for p in partitions:
            self.engine.create_slice(definition, p)  # idempotent for the same definition
            if p not in held:
                created.append(p)
        return created

    async def _on_allocate(self, msg: AllocateSlices, conn: Connection) -> SlicesAllocated:
        async with self.host.lock:
            created = await self.host.run(self._create, msg.definition, msg.partitions)
            held = sorted(self._held().get(msg.definition.id, set()))
        if created:
            log.info("allocated slices %s of index %s", created, msg.definition.id)
        return SlicesAllocated(
            node=self.name, index_id=msg.definition.id, partitions=held, created=created
        )

    async def _on_drop(self, msg: DropSlices, conn: Connection) -> SlicesDropped:
        async with self.host.lock:
            dropped = await self.host.run(self.engine.drop_index, msg.index_id)
        self.delivery.forget(msg.index_id)
        if dropped:
            log.info("dropped %d slice(s) of index %s", dropped, msg.index_id)
        return SlicesDropped(node=self.name, index_id=msg.index_id, dropped=dropped)

    async def _on_list(self, msg: ListSlices, conn: Connection) -> SliceList:
        engine = self.engine
        infos = await self.host.run(
            describe_slices, engine, msg.index_id, self.delivery.published.get
        )
        return SliceList(node=self.name, slices=infos)

    # --- reconciliation ----------------------------------------------------------------------

    async def _state(self, fresh: bool) -> StateContext:
        """The local manager replica's state (``fresh``: the master's committed one), else
        the first manager that answers."""
        request = StateRequest(sections=SECTIONS, fresh=fresh)
        coord = self._coordinator()
        if coord is not None:
            if not fresh:
                state: StateContext = coord.state
                return state
            reply = await coord.submit(request)
            assert isinstance(reply, StateReply)
            return reply.state
        errors: dict[str, str] = {}
        managers = [m for m in self._members() if "manager" in m.services]
        for m in managers:
            try:
                answer = await self.pool.request(
                    m.address, request, STATE_TIMEOUT, expect=StateReply
                )
            except ShardexError as exc:
                errors[m.name] = str(exc)
                continue
            return answer.state
        raise NodeUnavailable(
            "no manager answered the state request",
            details={"managers": [m.name for m in managers], "errors": errors},
        )

    async def reconcile(self) -> ReconcilePlan:
        """One round (module docstring); returns what was done."""
        state = await self._state(fresh=False)
        async with self.host.lock:
            plan = plan_reconcile(self.name, state, self._held())
            for definition, partitions in plan.create:
                log.info("reconcile: creating slices %s of %s", partitions, definition.id)
                await self.host.run(self._create, definition, partitions)
        drops: list[str] = []
        orphans: list[SliceKey] = []
        # The tracker holds slices orphaned in an earlier round: each round confirms them
        # again (or forgets them), so their clocks only run while they stay orphans.
        if plan.drop or plan.orphans or self.orphans.since or self.slice_moves.awaiting_switch():
            committed = await self._state(fresh=True)
            async with self.host.lock:
                confirmed = plan_reconcile(self.name, committed, self._held())
                for index_id in confirmed.drop:
                    log.info("reconcile: dropping the slices of index %s", index_id)
                    await self.host.run(self.engine.drop_index, index_id)
                    self.delivery.forget(index_id)
                    drops.append(index_id)
                # A switch whose IndexPartitionSwitched never came: learnt from the state.
                # (A copy still incoming here is not an orphan: its arrival is learnt too.)
                self.slice_moves.switched_in_state(committed, confirmed.orphans)
                busy = self.slice_moves.busy_slices()  # read under the lock moves take too
                for index_id, p in self.orphans.due(confirmed.orphans, busy):
                    log.info("reconcile: dropping orphan slice %s/%d", index_id, p)
                    await self.host.run(self.engine.drop_slice, index_id, p)
                    self.orphans.dropped((index_id, p))
                    orphans.append((index_id, p))
            self.host.notify(sorted({k[0] for k in orphans}))  # scans waiting re-check
        return ReconcilePlan(create=plan.create, drop=drops, orphans=orphans)

    async def _reconcile_loop(self) -> None:
        await reconcile_forever(
            self.reconcile,
            wake=self._reconcile_now,
            ready=self.reconciled,
            interval=self.reconcile_interval,
            what="index",
        )


def _loop_time() -> float:
    return asyncio.get_running_loop().time()


def _open_engine(path: Path, open_store: OpenStore | None = None) -> SliceEngine:
    from shardex.index.engine import IndexerEngine  # RocksDB: only where the service runs

    if open_store is not None:
        return IndexerEngine(path, open_store=open_store)
    path.parent.mkdir(parents=True, exist_ok=True)
    return IndexerEngine(path)
