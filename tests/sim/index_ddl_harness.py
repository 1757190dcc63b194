"""Three real ``Node``s (manager + index services) in the simulator, for index DDL tests.

Each node keeps its coordinator record and its slices (``MemorySliceEngine``) in its
simulated disk, so both survive crashes. The harness records every state applied on every
node together with the slices its serving indexes lacked at that instant, for states not yet
superseded by a commit (the checker's invariant 1), and can crash the master at any of the
DDL flow's steps 1-17:

* 1, 2, 3, 8, 9, 10, 11, 12, 17: ``IndexDDL.step_hook`` on the master (3 and 12 fire when
  the master has persisted INIT / READY, before anything is sent);
* 4 / 13: the master's ``StateReplicate`` carrying INIT / READY is on the wire (crash one
  microsecond later: the frames die with it);
* 5 / 14: the first replica has persisted INIT / READY (crash from its apply callback);
* 6 / 15: the master has received the first replica's ACK (the second is still in flight);
* 7 / 16: the second replica has persisted it: every manager holds it, the master dies
  before it learns so;
* DROP INDEX (not numbered by the DDL flow): 103 the master has persisted DELETED, 105 / 107 the
  first / second replica has.

The crash is ``network.crash`` (kill -9: comms reset, tasks cancelled) called at exactly that
point; the op's own task is stopped by raising ``CancelledError`` from the hook.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import msgspec
from manager_cluster import HOSTS, ManagerCluster, version

from shardex.api.coordinator import StateReplicate, StateReplicateReply
from shardex.api.index_ddl import (
    BuildIndex,
    CreateIndex,
    DropIndex,
    IndexCreated,
    IndexDropped,
    IndexesBuilding,
)
from shardex.errors import ErrorCode, ShardexError
from shardex.manager.coordinator import Coordinator, OpContext
from shardex.meta.index_state import DELETED, INIT, READY
from shardex.meta.state import KeyspaceMeta, StateContext
from shardex.net.messages import Message
from shardex.sim import ClusterNode, NodeMain, Simulation
from shardex.testing.checkers_coordinator import Version, check_coordinator
from shardex.testing.checkers_index_ddl import Observation, check_index_ddl, missing_slices
from shardex.testing.index_fake import MemorySliceEngine

RETRY_REASONS = {"no_master", "not_master", "commit_failed", "deposed"}


class SeedKeyspace(Message, tag="idxtest.SeedKeyspace"):
    """Test op: a keyspace in the state without data nodes (the sim runs no data service)."""

    name: str
    request_id: str | None = None


class KeyspaceSeeded(Message, tag="idxtest.KeyspaceSeeded"):
    name: str


async def seed_keyspace(msg: SeedKeyspace, ctx: OpContext) -> KeyspaceSeeded:
    state = ctx.state
    meta = KeyspaceMeta(name=msg.name, num_partitions=8, uuid=ctx.new_id(), created_cas=1)
    reply = KeyspaceSeeded(name=msg.name)
    new = msgspec.structs.replace(state, keyspaces={**state.keyspaces, msg.name: meta})
    await ctx.commit(new, reply=reply)
    return reply


class IndexCluster(ManagerCluster):
    def __init__(
        self,
        sim: Simulation,
        hosts: tuple[str, ...] = HOSTS,
        engine: Callable[[ClusterNode], Any] | None = None,
    ) -> None:
        super().__init__(sim, hosts)
        self.commits: list[tuple[str, Version]] = []
        self.applies: dict[str, list[Version]] = {h: [] for h in hosts}
        self.observations: list[Observation] = []
        self._top = (0, 0)  # highest committed (epoch, cas) so far
        self.engine = engine
        self._last_slices: dict[str, set[tuple[str, int]]] = {}
        # crash-at-step machinery
        self.target: int | None = None
        self.fired = asyncio.Event()
        self.victim: str | None = None
        self.first_id: str | None = None  # the first index id seen in INIT
        # tests: called when a replica has persisted a state with an index in INIT/READY/...
        self.on_persist: Callable[[str, str], None] | None = None
        self._persisted: dict[str, list[str]] = {INIT: [], READY: [], DELETED: []}
        self._acks: dict[str, int] = {INIT: 0, READY: 0}
        self.add_hosts(self._main)

    # -- nodes ------------------------------------------------------------------------------

    def disk_slices(self, host: str) -> set[tuple[str, int]]:
        """The slices on ``host``'s disk: the in-memory engine's dict, or (real engine) what
        the live engine lists, remembered while the node is down."""
        if self.engine is None:
            return set(self.sim.cluster[host].disk.get("slices", {}))
        n = self.live.get(host)
        if n is not None and n.index is not None and n.index.host.is_open:
            self._last_slices[host] = {(s.index_id, s.partition) for s in n.index.engine.slices()}
        return set(self._last_slices.get(host, set()))

    def all_slices(self) -> dict[str, set[tuple[str, int]]]:
        return {h: self.disk_slices(h) for h in self.hosts}

    def _main(self, host: str, seeds: tuple[str, ...]) -> NodeMain:
        async def main(node: ClusterNode) -> None:
            if self.engine is not None:
                factory = lambda: self.engine(node)  # noqa: E731
            else:
                factory = lambda: MemorySliceEngine(node.disk.setdefault("slices", {}))  # noqa: E731
            services = ("manager", "index")
            n, coord = self.manager_node(node, host, seeds, services, index_engine=factory)
            assert n.index_ddl is not None
            coord.register_op(SeedKeyspace, seed_keyspace)
            coord.on_change(lambda s: self._applied(host, s))
            coord.on_commit(lambda s: self._committed(host, s))
            n.index_ddl.step_hook = lambda step, index_id: self._op_step(host, step, index_id)
            self._wrap_pool(host, coord)
            try:
                await self.serve(host, node, n)
            finally:
                if n.index is not None:
                    n.index.close_now()

        return main

    def _committed(self, host: str, state: StateContext) -> None:
        self.commits.append((host, version(state)))
        self._top = max(self._top, (state.epoch, state.cas))

    def _applied(self, host: str, state: StateContext) -> None:
        self.applies[host].append(version(state))
        # Checked for states not yet superseded by a commit: a replica catching up applies
        # old states (frames held at a partition) after a later, committed DROP has
        # removed slices that those old states still name.
        current = (state.epoch, state.cas) >= self._top
        missing = missing_slices(state, self.all_slices()) if current else {}
        self.observations.append((host, (state.epoch, state.cas), missing))
        if self.first_id is None:
            self.first_id = next((i for i, r in state.indexes.items() if r.state == INIT), None)
        coord = self.live[host].coordinator if host in self.live else None
        deleted = any(r.state == DELETED for r in state.indexes.values())
        if coord is not None and coord.is_master and deleted and self._is_target(103):
            # A DROP's DELETED persisted on the master only (nothing sent yet).
            self._crash_now(host)
            raise asyncio.CancelledError
        if coord is not None and not coord.is_master:
            for phase in (INIT, READY, DELETED):
                if any(r.state == phase for r in state.indexes.values()):
                    if self.on_persist is not None:
                        self.on_persist(host, phase)
                    seen = self._persisted[phase]
                    if host not in seen:
                        seen.append(host)
                        # INIT: 5 and 7; READY: 14 and 16; a DROP's DELETED: 105 and 107
                        step = {INIT: 5, READY: 14, DELETED: 105}[phase] + 2 * (len(seen) - 1)
                        self._replica_step(step)

    def _wrap_pool(self, host: str, coord: Coordinator) -> None:
        pool = coord.pool
        orig = pool.request

        async def request(address: str, msg: Message, timeout: float, **kw: Any) -> Any:
            phase = _phase_of(msg)
            if phase is not None and self._is_target({INIT: 4, READY: 13}[phase]):
                loop = asyncio.get_running_loop()
                loop.call_later(1e-5, self._crash_now, host)
            reply = await orig(address, msg, timeout, **kw)
            if phase is not None and isinstance(reply, StateReplicateReply) and reply.ok:
                self._acks[phase] += 1
                if self._acks[phase] == 1 and self._is_target({INIT: 6, READY: 15}[phase]):
                    self._crash_now(host)
                    raise asyncio.CancelledError
            return reply

        pool.request = request  # type: ignore[method-assign]

    # -- crashing at a step -----------------------------------------------------------------

    def _is_target(self, step: int) -> bool:
        return self.target == step and not self.fired.is_set()

    def _crash_now(self, host: str) -> None:
        if self.fired.is_set():
            return
        self.fired.set()
        self.victim = host
        self.sim.network.crash(host)

    def _op_step(self, host: str, step: int, index_id: str) -> None:
        if self.first_id is None and index_id:
            self.first_id = index_id
        if self._is_target(step):
            self._crash_now(host)
            raise asyncio.CancelledError

    def _replica_step(self, step: int) -> None:
        if self._is_target(step):
            master = self.master()
            assert master is not None
            self._crash_now(master)

    # -- cluster ops ------------------------------------------------------------------------

    async def start(self) -> None:
        await super().start()
        await self.request(SeedKeyspace(name="ks", request_id="seed-ks"), KeyspaceSeeded)

    def settled(self) -> bool:
        """Converged, and every indexer's slices match the state (reconciled)."""
        from shardex.testing.checkers_index_ddl import orphan_slices

        if not self.converged():
            return False
        state = self.coord(self.hosts[0]).state
        return not missing_slices(state, self.all_slices()) and not orphan_slices(
            state, self.all_slices()
        )

    async def request(
        self,
        msg: Message,
        expect: type[Any],
        hosts: tuple[str, ...] | None = None,
        attempts: int = 8,
        timeout: float = 30.0,
    ) -> Any:
        """Like the sync client: the same message (request id) to the next node after a
        failure whose outcome may be unknown; a refusal is raised at once."""
        order = list(hosts or self.hosts)
        last: ShardexError | None = None
        for i in range(attempts):
            host = order[i % len(order)]
            try:
                return await self.client.request(f"{host}:7000", msg, timeout, expect=expect)
            except ShardexError as exc:
                retry = exc.code in (ErrorCode.CONNECTION_CLOSED, ErrorCode.TIMEOUT) or (
                    exc.code is ErrorCode.NODE_UNAVAILABLE
                    and exc.details.get("reason") in RETRY_REASONS | {None}
                )
                if not retry:
                    raise
                last = exc
                await asyncio.sleep(0.5)
        assert last is not None
        raise last

    async def create(
        self,
        name: str,
        request_id: str,
        hosts: tuple[str, ...] | None = None,
        attempts: int = 8,
        timeout: float = 30.0,
        **kw: Any,
    ) -> IndexCreated:
        msg = CreateIndex(keyspace="ks", name=name, request_id=request_id, **kw)
        return await self.request(msg, IndexCreated, hosts, attempts, timeout)

    async def drop(self, name: str, request_id: str) -> IndexDropped:
        msg = DropIndex(keyspace="ks", name=name, request_id=request_id)
        return await self.request(msg, IndexDropped)

    async def build(self, *names: str, request_id: str) -> IndexesBuilding:
        msg = BuildIndex(keyspace="ks", names=list(names), request_id=request_id)
        return await self.request(msg, IndexesBuilding)

    def check(self, created: dict[str, str] | None = None) -> StateContext:
        final = self.coord(self.hosts[0]).state
        check_coordinator(
            commits=self.commits,
            applies=self.applies,
            finals={h: version(self.coord(h).state) for h in self.hosts},
            acked={},
            final_ops={},
        )
        check_index_ddl(
            final=final,
            slices=self.all_slices(),
            observations=self.observations,
            created=created,
        )
        self.sim.cluster.check()
        return final


def _phase_of(msg: Message) -> str | None:
    """INIT / READY when ``msg`` replicates a state with an index in that state."""
    if not isinstance(msg, StateReplicate):
        return None
    states = {r.state for r in msg.state.indexes.values()}
    if INIT in states:
        return INIT
    if READY in states:
        return READY
    return None
