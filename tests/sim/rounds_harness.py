"""The pipeline's stability rounds in the simulator: real indexers, a real timekeeper, a
driver that runs ``RoundMachine`` over the simulated network, and crashes.

Nodes:

* ``i1``..``i3``: indexers. Each runs the real ``IndexService`` (its ``IndexDelivery``
  routes, ``IndexerEngine``, slices, snapshots) on a ``MemoryStore`` over the node's
  simulated disk (``MemoryDisk`` in ``ClusterNode.disk``), so a crash loses the mutation
  queues and a new incarnation starts; a power-off also loses what was not synced. Its
  slices come from the service's own reconciliation against the cluster state.
* ``tk``: the real ``Timekeeper`` (checks the round's replies, holds and publishes the
  stability TS, tells the indexers with ``PublishStability``).
* ``drv``: the pipeline driver. Per round it reads the changes after its checkpoint from the
  keyspace's log (``FakeKeyspace``, the data service's stand-in), projects and routes them
  with the pipeline's projector and router, plans the round with ``rounds/plan.py``, decides
  where it drops first with the job's ``CleanedNodes`` and runs a ``RoundMachine``,
  performing its instructions over a ``ConnectionPool``. Its checkpoint (the last TS every
  index was published at) is on its disk: a restarted driver resumes there and delivers the
  range again (the indexers drop what they applied, by seqno). A failed round is retried
  by the job's policy (``rounds/retry.py``).

The cluster state (indexes ACTIVE, one topology each, with ``Params.num_replica`` replica
copies per index partition) changes only by ``DropIndexCopies`` (the timekeeper takes copies
that missed a round out of the topology before publishing without them): the coordinator is
one stand-in every node shares, which answers state requests and runs that op. The driver
routes each round by the latest topologies (as the job's registry refreshes after a round
some node missed). After every round the timekeeper published, ``World.check_published``
runs the oracle on every published index at that TS: its entries over all slices (live
engines at the snapshot, or a crashed node's disk) equal its definition over the documents
as of the TS, and every replica copy in the topology holds exactly its primary's entries.
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import msgspec

from shardex.api.coordinator import StateReply
from shardex.api.delivery import DeliverAndStabilise
from shardex.api.index_ddl import DropIndexCopies, IndexCopiesDropped
from shardex.api.timekeeper import StabilityAdvanced
from shardex.core.timestamp import Timestamp
from shardex.core.topology import Topology
from shardex.errors import NodeUnavailable, ShardexError
from shardex.index.oracle import check_index
from shardex.index.records import cf_names
from shardex.index.service import IndexService
from shardex.manager.index_copies import without_copies
from shardex.manager.timekeeper import Timekeeper
from shardex.meta.index_definition import IndexDefinition
from shardex.meta.index_state import ACTIVE, IndexRecord
from shardex.meta.member_list import UP, MemberInfo
from shardex.meta.state import StateContext
from shardex.net import ConnectionPool, RpcServer
from shardex.pipeline.project.projector import project
from shardex.pipeline.project.router import route
from shardex.pipeline.registry import IndexView
from shardex.pipeline.rounds.cleaned import CleanedNodes
from shardex.pipeline.rounds.machine import (
    Advanced,
    AdvanceFailed,
    AskTimekeeper,
    Instruction,
    NodeFailed,
    NodeReplied,
    RoundDone,
    RoundEnds,
    RoundEvent,
    RoundFailed,
    RoundMachine,
    RoundSpec,
    SendToIndexer,
)
from shardex.pipeline.rounds.plan import round_slices, stabilise_plan, views_key
from shardex.pipeline.rounds.retry import retry_pause, retryable
from shardex.scan.elastic_adapters_index import IndexScanMigrations
from shardex.sim import ClusterNode, Simulation
from shardex.storage.memory import MemoryDisk, MemoryStore
from shardex.testing.index import FakeKeyspace, random_workload, workload_definitions

SECRET = "sim-rounds-secret"
KEYSPACE = "ks"
INDEXERS = ("i1", "i2", "i3")
TIMEKEEPER = "tk"
DRIVER = "drv"
PORT = 7000
REQUEST_TIMEOUT = 2.0


def address(host: str) -> str:
    return f"{host}:{PORT}"


class StateStandIn:
    """The coordinator as the index service and the timekeeper see it: one state, changed
    only by ``DropIndexCopies`` (applied at once, as a commit on the master would be)."""

    def __init__(self, state: StateContext) -> None:
        self.state = state
        self.dropped: list[tuple[str, int, str]] = []  # (index id, partition, node), in order
        self.ids = 0

    def on_change(self, callback: Any) -> None:
        return None

    def new_id(self) -> str:
        self.ids += 1
        return f"tk-{self.ids}"

    async def submit(self, request: Any) -> StateReply | IndexCopiesDropped:
        if not isinstance(request, DropIndexCopies):
            return StateReply(node="coord", master="coord", is_master=True, state=self.state)
        history = self.state.index_topologies[request.index_id]
        nxt, dropped = without_copies(history[-1], request.copies)
        if dropped:
            topologies = {**self.state.index_topologies, request.index_id: [*history, nxt]}
            self.state = msgspec.structs.replace(
                self.state, cas=self.state.cas + 1, index_topologies=topologies
            )
            self.dropped.extend((request.index_id, p, n) for p, n in dropped)
        return IndexCopiesDropped(index_id=request.index_id, topology=nxt, dropped=dropped)


class MembersStandIn:
    """Every indexer is a member the timekeeper addresses (an unreachable one fails its
    request, as a real member whose failure is not detected yet)."""

    def __init__(self) -> None:
        self.members = [
            MemberInfo(member_id=f"id-{h}", name=h, address=address(h), services=("index",))
            for h in INDEXERS
        ]

    def state_of(self, member_id: str, now: float) -> tuple[str, float]:
        return UP, 0.0


@dataclass
class Params:
    frame_rows: int = 10  # rows per frame: rounds of several frames, so crashes hit between
    round_gap: float = 0.05  # the driver's pause between rounds
    frame_gap: float = 0.05  # the most a node's later frame waits (``drive_round``)
    writes: int = 40  # bursts of mutations
    chaos: bool = True
    frame_crash: float = 0.15  # chance an indexer restarts before a stabilise (``before_frame``)
    num_replica: int = 0  # replica copies of every index partition (on other indexers)


@dataclass
class World:
    """What the scenario shares: the keyspace's history, the definitions and placement, the
    live services, and what was checked."""

    sim: Simulation
    params: Params
    rng: random.Random
    ks: FakeKeyspace = field(default_factory=lambda: FakeKeyspace(num_partitions=4))
    definitions: list[IndexDefinition] = field(default_factory=workload_definitions)
    placement: dict[str, dict[int, str]] = field(default_factory=dict)
    services: dict[str, IndexService] = field(default_factory=dict)
    timekeeper: Timekeeper | None = None
    published: list[Timestamp] = field(default_factory=list)  # every checked stability TS
    rounds: int = 0
    failed: dict[str, int] = field(default_factory=dict)  # why rounds failed -> count
    crashes: list[str] = field(default_factory=list)
    checkpoint: Timestamp = field(default_factory=Timestamp)  # the driver's, as last saved
    missed_rounds: int = 0  # rounds done without some node (its copies missed them)
    # (virtual time, TS, index ids) of every publication checked
    publications: list[tuple[float, Timestamp, list[str]]] = field(default_factory=list)
    chaos_on: bool = False  # faults are injected (``chaos`` runs)

    def __post_init__(self) -> None:
        replicas: dict[str, dict[int, list[str]]] = {}
        for d in self.definitions:
            self.placement[d.id] = {p: self.rng.choice(INDEXERS) for p in range(d.num_partition)}
            replicas[d.id] = {
                p: self.rng.sample([n for n in INDEXERS if n != node], self.params.num_replica)
                for p, node in self.placement[d.id].items()
            }
        recs = {
            d.id: IndexRecord(definition=d, state=ACTIVE, num_replica=self.params.num_replica)
            for d in self.definitions
        }
        topos = {
            i: [Topology(seq_num=1, assignment=dict(a), replicas=replicas[i])]
            for i, a in self.placement.items()
        }
        self.coordinator = StateStandIn(
            StateContext(epoch=1, cas=1, indexes=recs, index_topologies=topos)
        )
        self.refresh_views()

    @property
    def state(self) -> StateContext:
        return self.coordinator.state

    def refresh_views(self) -> None:
        """Route by the latest topologies (the job's registry, refreshed)."""
        state = self.state
        self.views = [
            IndexView(record=state.indexes[d.id], topology=state.index_topologies[d.id][-1])
            for d in self.definitions
        ]
        self.routes = {v.id: v.route() for v in self.views}

    # -- nodes ---------------------------------------------------------------------------

    def add_nodes(self) -> None:
        for host in INDEXERS:
            self.sim.cluster.add(host, self._indexer_main)
        self.sim.cluster.add(TIMEKEEPER, self._timekeeper_main)
        self.sim.cluster.add(DRIVER, self._driver_main)

    async def _indexer_main(self, node: ClusterNode) -> None:
        disk: MemoryDisk = node.disk.setdefault("store", MemoryDisk())
        coordinator = self.coordinator
        svc = IndexService(
            node_name=node.host,
            transport=node.transport,
            secret=SECRET,
            path=Path(node.host),
            open_store=lambda _path: MemoryStore(disk),
            inline_io=True,
            coordinator=lambda: coordinator,
            reconcile_interval=0.5,
            scan_migrations=IndexScanMigrations(node.host),
        )
        server = RpcServer(node.transport, SECRET, name=node.host)
        svc.install(server)
        await svc.start()
        # The service picks a random incarnation; the simulator's is derived from the
        # node's start count (unique per process, the same in every replay). Set before
        # the server takes a request.
        svc.host.incarnation = f"{node.host}#{node.incarnation}"
        node.serving(await server.start(node.listen_address))
        self.services[node.host] = svc
        try:
            await asyncio.get_running_loop().create_future()
        finally:
            # kill -9: nothing graceful, the engine's objects just die with the process
            self.services.pop(node.host, None)
            svc.close_now()

    async def _timekeeper_main(self, node: ClusterNode) -> None:
        coordinator, members = self.coordinator, MembersStandIn()
        tk = Timekeeper(
            transport=node.transport,
            secret=SECRET,
            name=node.host,
            coordinator=lambda: coordinator,
            membership=lambda: members,
            stabilise_timeout=REQUEST_TIMEOUT,
            publish_timeout=REQUEST_TIMEOUT,
        )
        server = RpcServer(node.transport, SECRET, name=node.host)
        tk.install(server)
        node.serving(await server.start(node.listen_address))
        self.timekeeper = tk
        await asyncio.get_running_loop().create_future()

    async def _driver_main(self, node: ClusterNode) -> None:
        saved = node.disk.get("checkpoint")
        checkpoint = Timestamp() if saved is None else Timestamp.from_wire(saved)
        pool = self.driver_pool = ConnectionPool(node.transport, SECRET, name=node.host)
        batch_id = int(node.disk.get("batch_id", 0))
        # The nodes where a round of this process dropped what was queued above its start
        # (``rounds/cleaned.py``, the job's rule): none in a (re)started driver, so its first
        # round drops on every node, as a new query's first round does.
        cleaned = CleanedNodes()
        attempt = 0  # failed rounds in a row
        while True:
            end = self.ks.ts()
            if checkpoint.covers(end):
                await asyncio.sleep(self.params.round_gap)
                continue
            self.refresh_views()
            plan, _ = stabilise_plan(self.views)
            key = views_key(self.views)
            batch_id += 1
            node.disk["batch_id"] = batch_id
            drop = cleaned.drop_above(checkpoint, end, plan)
            machine = RoundMachine(
                RoundSpec(KEYSPACE, batch_id, drop_above=drop, frame_rows=self.params.frame_rows)
            )
            outcome = await drive_round(
                machine,
                self.round_end(checkpoint, end),
                pool,
                self.rng,
                self.params.frame_gap,
                self.before_frame,
            )
            self.rounds += 1
            if isinstance(outcome, RoundFailed):
                why = "stale" if outcome.stale else outcome.error.code.value
                self.failed[why] = self.failed.get(why, 0) + 1
                # The job's policy: what time can heal is retried with back-off (with no
                # deadline here: the job's would fail the query, to be restarted as this
                # driver is); anything else fails the batch, and so the scenario.
                if not retryable(outcome.error):
                    raise outcome.error
                attempt += 1
                await asyncio.sleep(retry_pause(attempt, self.rng))
                continue
            attempt = 0
            cleaned.round_done(
                key, outcome.report.incarnations, drop is not None, missed=outcome.report.missed
            )
            if outcome.report.missed:
                self.missed_rounds += 1
            if outcome.published:
                self.check_published(outcome.ts, outcome.published)
            if set(outcome.published) == {d.id for d in self.definitions}:
                checkpoint = end
                node.disk["checkpoint"] = end.to_wire()
                self.checkpoint = end
            await asyncio.sleep(self.params.round_gap)

    # -- the round -------------------------------------------------------------------------

    def round_end(self, start: Timestamp, end: Timestamp) -> RoundEnds:
        """The round of ``(start, end]``: projected and routed by the pipeline's code."""
        rows = project(self.definitions, self.ks.changes(start, end)).rows
        by_node = {n: v for n, v in route(rows, self.routes).by_node.items() if v}
        plan, moving = stabilise_plan(self.views)
        return RoundEnds(
            ts=end,
            by_node=by_node,
            plan=plan,
            index_ids=[d.id for d in self.definitions],
            slices=round_slices(self.views),
            moving=moving,
        )

    # -- checks ----------------------------------------------------------------------------

    def slice_entries(
        self, index_id: str, partition: int, ts: Timestamp, host: str | None = None
    ) -> list[bytes]:
        """The slice's entries at ``ts`` on ``host`` (default: the partition's primary in the
        latest topology): the live engine's snapshot (or its tip when it applied exactly
        ``ts``: a restarted slice snapshots only once active), or a crashed node's disk as a
        restart would find it."""
        if host is None:
            host = self.state.index_topologies[index_id][-1].owner(partition)
        svc = self.services.get(host)
        if svc is not None and svc.host.is_open:
            sl = svc.engine.slice(index_id, partition)
            applied = sl.applied_ts()
            if applied.covers(ts) and ts.covers(applied):
                return sl.entries(None)
            return sl.entries(ts)
        disk: MemoryDisk = self.sim.cluster[host].disk["store"]
        entries_cf, _, _ = cf_names(index_id, partition)
        store = MemoryStore(disk)
        return [k for k, _ in store.column_family(entries_cf, create=False).iterate()]

    def check_published(self, ts: Timestamp, index_ids: list[str]) -> None:
        """The oracle for every index just published at ``ts``."""
        docs = self.ks.documents_at(ts)
        for d in self.definitions:
            if d.id not in index_ids:
                continue
            topo = self.state.index_topologies[d.id][-1]
            entries = {p: self.slice_entries(d.id, p, ts) for p in range(d.num_partition)}
            check_index(d, entries, docs, context=f"stability TS {ts!r}")
            for p in range(d.num_partition):
                for host in topo.replicas.get(p, ()):
                    copy = self.slice_entries(d.id, p, ts, host)
                    assert copy == entries[p], f"{host}'s copy of {d.id}/{p} differs at {ts!r}"
        self.published.append(ts)
        now = asyncio.get_running_loop().time()
        self.publications.append((now, ts, sorted(index_ids)))

    # -- faults and load -------------------------------------------------------------------

    async def writer(self) -> None:
        """Bursts of mutations at random moments (the data service's side)."""
        for _ in range(self.params.writes):
            await asyncio.sleep(self.rng.uniform(0.05, 0.6))
            random_workload(self.ks, self.rng, self.rng.randint(1, 25), pool=40)

    async def chaos(self, until: float) -> None:
        """Crash and restart indexers (kill -9 or power-off), the driver and the timekeeper
        (which forgets the stability TSs it held), at random."""
        loop = asyncio.get_running_loop()
        cluster = self.sim.cluster
        self.chaos_on = True
        while loop.time() < until:
            await asyncio.sleep(self.rng.uniform(0.2, 2.0))
            host = self.rng.choice([*INDEXERS, *INDEXERS, DRIVER, TIMEKEEPER])
            power_off = host in INDEXERS and self.rng.random() < 0.4
            await cluster.crash(host, power_off=power_off)
            if host in INDEXERS:
                disk: MemoryDisk = cluster[host].disk["store"]
                disk.crash(power_off=power_off, rng=self.rng)
            self.crashes.append(f"{loop.time():.3f} {host}{' power-off' if power_off else ''}")
            # Half the restarts are quick: the new process answers the round's next frame.
            down = self.rng.uniform(0.0, 0.02) if self.rng.random() < 0.5 else 0.5
            await asyncio.sleep(down * self.rng.random())
            await cluster.restart(host)
        self.chaos_on = False

    async def before_frame(self, ins: SendToIndexer, first: bool) -> None:
        """Now and then restart the indexer a round's stabilise is about to reach after
        earlier frames (kill -9, back at once): the stabilise meets a new incarnation that
        lost those frames' rows, and must be refused (STALE_DELIVERY) rather than applied
        without them; only the indexer can tell. (Earlier frames meeting a restarted
        indexer are the driver's to catch: ``DeliveryReport``; ``chaos`` hits those.)"""
        if first or not isinstance(ins.message, DeliverAndStabilise) or not self.chaos_on:
            return
        if self.rng.random() >= self.params.frame_crash:
            return
        cluster = self.sim.cluster
        await cluster.crash(ins.node)
        cluster[ins.node].disk["store"].crash()
        self.crashes.append(f"{asyncio.get_running_loop().time():.3f} {ins.node} before a frame")
        await cluster.restart(ins.node)
        await cluster[ins.node].wait_serving()
        # The frame must go on a new link: wait until the driver has seen the old one reset.
        loop = asyncio.get_running_loop()
        deadline = loop.time() + REQUEST_TIMEOUT
        while address(ins.node) in self.driver_pool.connections:
            if loop.time() > deadline:
                raise AssertionError(f"the driver's link to {ins.node} outlived its restart")
            await asyncio.sleep(0.001)

    async def check_told(self) -> None:
        """After the last round: every indexer was told the last stability TS of each index
        it hosts (``PublishStability``, in round order, so never an older one last)."""
        assert self.timekeeper is not None
        await self.timekeeper.drain_publishes()
        last = self.published[-1]
        for host in INDEXERS:
            told = self.services[host].delivery.published
            hosted = {
                i for i, t in self.state.index_topologies.items() if host in t[-1].copy_nodes()
            }
            wrong = {i: told.get(i) for i in hosted if told.get(i) != last}
            assert not wrong, f"{host} holds {wrong}, not the last stability TS {last!r}"

    async def caught_up(self, timeout: float) -> None:
        """Wait (virtual time) until the driver's checkpoint is the keyspace's end."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while not self.checkpoint.covers(self.ks.ts()):
            if loop.time() > deadline:
                raise AssertionError(
                    f"the driver did not catch up: checkpoint {self.checkpoint!r}, end "
                    f"{self.ks.ts()!r}; rounds {self.rounds}, failed {self.failed}"
                )
            await asyncio.sleep(0.1)


async def drive_round(
    machine: RoundMachine,
    end: RoundEnds,
    pool: ConnectionPool,
    rng: random.Random | None = None,
    frame_gap: float = 0.0,
    before_frame: Callable[[SendToIndexer, bool], Awaitable[None]] | None = None,
) -> RoundDone | RoundFailed:
    """End ``machine``'s round with ``end``, perform its instructions over ``pool`` and feed
    it the outcomes, until the round is done or failed. Every send runs as its own task;
    replies arrive as events.
    ``frame_gap``: a node's later frames wait up to that long (drawn from ``rng``), as a
    streamed round's frames wait for the next group's projection: a crash can then fall
    between two frames of one node, and the next frame reaches the restarted process.
    ``before_frame(instruction, first)``: awaited before each frame (fault injection)."""
    events: asyncio.Queue[RoundEvent] = asyncio.Queue()
    tasks: list[asyncio.Task[None]] = []
    started: set[str] = set()

    async def perform(ins: SendToIndexer | AskTimekeeper) -> None:
        ev: RoundEvent
        try:
            if isinstance(ins, SendToIndexer):
                first = ins.node not in started
                started.add(ins.node)
                if not first and rng is not None and frame_gap > 0:
                    await asyncio.sleep(rng.uniform(0.0, frame_gap))
                if before_frame is not None:
                    await before_frame(ins, first)
                reply = await pool.request(
                    address(ins.node), ins.message, REQUEST_TIMEOUT, expect=ins.expect
                )
                ev = NodeReplied(ins.node, reply)
            else:
                reply = await pool.request(
                    address(TIMEKEEPER), ins.message, REQUEST_TIMEOUT, expect=StabilityAdvanced
                )
                ev = Advanced(reply)
        except (ShardexError, OSError) as exc:
            err = exc if isinstance(exc, ShardexError) else NodeUnavailable(str(exc))
            ev = NodeFailed(ins.node, err) if isinstance(ins, SendToIndexer) else AdvanceFailed(err)
        events.put_nowait(ev)

    pending: list[Instruction] = machine.handle(end)
    try:
        while True:
            for ins in pending:
                if isinstance(ins, RoundDone | RoundFailed):
                    return ins
                tasks.append(asyncio.get_running_loop().create_task(perform(ins)))
            pending = machine.handle(await events.get())
    finally:
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
