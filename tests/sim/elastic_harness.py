"""Paginated scans under random migrations, on the simulated network.

Every shard node runs an ``RpcServer`` that answers ``ShardBatch`` with its
``ElasticShardScanner``; a client host runs the ``PageCoordinator`` and calls the nodes over
a ``ConnectionPool``, so every batch crosses the simulated network (latency, reordering).
Storage and migrations are an ``ElasticMemoryCluster``: a move releases the partition at
its source at once and activates it at its target after a random delay (then publishes the
next topology); a move can fail instead, sending the partition back to its source.

``Chaos`` injects migrations between pages and *inside* batches (from the scanners' row
hook) and classifies each event at the moment it injects it, from the scan's own state (the
decoded continuation between pages, the batch in progress inside one):

* a partition's first move during the query: supported, the query must complete exactly;
* any move of a partition the query has finished with: harmless, must complete exactly;
* a failed move (return) of a partition the scan has handed to a virtual scan, or one that
  happens while its source shard's batch is running, and a second move of a partition
  whose virtual scan is not finished: unsupported, the query MUST end in QUERY_STATE;
* anything else (a second move the scan may or may not notice) is never generated, so
  every run has exactly one right answer.
"""

from __future__ import annotations

import asyncio
import random
from dataclasses import dataclass, field

from shardex.core.topology import Topology
from shardex.errors import ErrorCode, ShardexError
from shardex.net.rpc import ConnectionPool, RpcServer
from shardex.scan.continuation import Continuation, ContinuationCodec, scan_digest
from shardex.scan.elastic_node import BatchContext
from shardex.scan.paging import PageCoordinator
from shardex.scan.paging_wire import PageRow, ShardBatch, ShardBatchResult
from shardex.sim import ClusterNode, FaultConfig, Simulation
from shardex.testing.elastic_checker import check_paginated_scan
from shardex.testing.elastic_memory import ElasticMemoryCluster

SECRET = "elastic-sim-secret"
NODES = ("n1", "n2", "n3")
SPARE = "n4"  # joins empty, like the specification's S3
SPEC_ALL = b"all"
ARRIVAL_TIMEOUT = 10.0


@dataclass
class Params:
    queries: int = 2  # alternately unordered and ordered (which goes first is random)
    max_entries: int = 60
    max_page: int = 10
    unsupported_rate: float = 0.3  # share of queries allowed to contain unsupported events
    row_event_rate: float = 0.08  # chance of an event after a returned row
    page_event_rate: float = 0.5  # chance of events between two pages
    max_local_repeats: int = 1
    deaf_rcb: bool = False  # sabotage: nodes never notice moves during a batch
    max_pages: int = 5000


@dataclass
class QueryOutcome:
    ordered: bool
    pages: list[list[PageRow]]
    error: ShardexError | None
    fatal: str | None  # the unsupported event that must end the query, if any
    events: list[str]


@dataclass
class Stats:
    queries: int = 0
    completed: int = 0
    query_state: int = 0
    repeats: int = 0
    virtual_scans: int = 0
    kinds: dict[str, int] = field(default_factory=dict)


def key(ikey: int, doc: int) -> bytes:
    return ikey.to_bytes(2, "big") + doc.to_bytes(2, "big")


class Chaos:
    """Draws and classifies migration events for the query in progress."""

    def __init__(self, cluster: ElasticMemoryCluster, rng: random.Random, params: Params):
        self.cluster = cluster
        self.rng = rng
        self.params = params
        self.coord: PageCoordinator | None = None
        self.base: Topology | None = None
        self.allow_fatal = False
        self.fatal: str | None = None
        self.touched: set[int] = set()
        self.events: list[str] = []
        self._tokens: dict[int, int] = {}
        self._next_token = 0
        self.stats: Stats | None = None

    def start_query(self, allow_fatal: bool) -> None:
        self.allow_fatal = allow_fatal
        self.fatal = None
        self.base = None
        self.touched = set(self.cluster.inflight)  # moves still in flight count as moved
        self.events = []

    # ---- the scan's progress, as the classification needs it ---------------------------

    def _finished(self, pid: int, ck: Continuation, vsm: list, current: int | None) -> bool:
        """Has the scan returned every row of ``pid`` for sure? A partition handed to a
        virtual scan is read there only (its base stream skips it from the split on)."""
        assert self.base is not None
        shards = self.base.nodes()
        vs_index = next((i for i, v in enumerate(vsm) if v.pid == pid), None)
        idx = ck.shard_idx if current is None else current
        if vs_index is not None:
            return vsm[vs_index].done if ck.ordered else len(shards) + vs_index < idx
        base_index = shards.index(self.base.assignment[pid])
        return ck.cursors[base_index].done if ck.ordered else base_index < idx

    # ---- event injection -------------------------------------------------------------

    def between_pages(self, ck: Continuation) -> None:
        if self.base is None:
            self.base = self.cluster.history.get(ck.base_topo)
        if self.rng.random() < self.params.page_event_rate:
            for _ in range(self.rng.randint(1, 2)):
                self._one_event(ck, ck.vsm, None)

    async def on_row(self, ctx: BatchContext) -> None:
        coord = self.coord
        ck = coord.inflight if coord is not None else None
        if ck is not None and self.base is None:
            self.base = self.cluster.history.get(ck.base_topo)
        if ck is not None and self.rng.random() < self.params.row_event_rate:
            self._one_event(ck, ctx.vsm, ctx)
        if self.rng.random() < 0.2:  # let in-flight moves land mid-batch now and then
            await asyncio.sleep(self.rng.uniform(0.0, 0.02))

    def _one_event(self, ck: Continuation, vsm: list, ctx: BatchContext | None) -> None:
        if self.fatal is not None:
            return  # after the unsupported event nothing else may blur the verdict
        pids = sorted(self.cluster.owner)
        pid = self.rng.choice(pids)
        in_vsm = any(v.pid == pid for v in vsm)
        current = None if ctx is None else ctx.request.shard_idx
        if ck.ordered and ctx is not None:
            current = None  # ordered streams only finish at the end of a page
        nodes = [*NODES, SPARE]
        if pid in self.cluster.inflight:
            source, _ = self.cluster.inflight[pid]
            running_at_source = ctx is not None and ctx.node == source and ctx.request.vs_pid < 0
            finished = self.base is not None and self._finished(pid, ck, vsm, current)
            fatal = not finished and (in_vsm or running_at_source)
            if fatal and not self.allow_fatal:
                return
            self._fail(pid)
            self._record("fail-return", pid, fatal, ctx)
            return
        if pid not in self.touched:
            to = self.rng.choice([n for n in nodes if n != self.cluster.owner[pid]])
            self._begin(pid, to)
            self._record("first-move", pid, False, ctx)
            return
        # A later move of a partition that already moved during this query.
        if ck.ordered and ctx is not None:
            return  # mid-page ordered progress is not exact enough to classify
        if self.base is not None and self._finished(pid, ck, vsm, current):
            fatal = False
        elif in_vsm:
            fatal = True
        else:
            return  # ambiguous (the scan may or may not notice): never generated
        if fatal and not self.allow_fatal:
            return
        to = self.rng.choice([n for n in nodes if n != self.cluster.owner[pid]])
        self._begin(pid, to)
        self._record("second-move", pid, fatal, ctx)

    def _record(self, kind: str, pid: int, fatal: bool, ctx: BatchContext | None) -> None:
        where = "between pages" if ctx is None else f"in a batch on {ctx.node}"
        text = f"{kind} P{pid} {where}" + (" [unsupported]" if fatal else "")
        self.events.append(text)
        if self.stats is not None:
            name = kind + ("/unsupported" if fatal else "")
            self.stats.kinds[name] = self.stats.kinds.get(name, 0) + 1
        if fatal:
            self.fatal = text

    def _begin(self, pid: int, to: str) -> None:
        self.touched.add(pid)
        self.cluster.begin_move(pid, to)
        self._next_token += 1
        token = self._tokens[pid] = self._next_token
        delay = self.rng.uniform(0.0, 0.3)  # well inside ARRIVAL_TIMEOUT
        asyncio.get_running_loop().call_later(delay, self._land, pid, token)

    def _land(self, pid: int, token: int) -> None:
        if self._tokens.get(pid) == token and pid in self.cluster.inflight:
            del self._tokens[pid]
            self.cluster.finish_move(pid)

    def _fail(self, pid: int) -> None:
        self._tokens.pop(pid, None)
        self.cluster.fail_move(pid)


def build_cluster(
    rng: random.Random, max_entries: int
) -> tuple[ElasticMemoryCluster, list[tuple[bytes, int, int]]]:
    num_partitions = rng.randint(4, 12)
    assignment = {p: NODES[p % len(NODES)] for p in range(num_partitions)}
    entries = []
    for doc in range(rng.randint(10, max_entries)):
        entries.append((key(rng.randint(0, 40), doc), rng.randrange(num_partitions), doc))
    return ElasticMemoryCluster(assignment, entries, extra_nodes=[SPARE]), entries


async def run_scenario(sim: Simulation, params: Params, stats: Stats) -> list[QueryOutcome]:
    rng = sim.rng
    cluster, _ = build_cluster(rng, params.max_entries)
    chaos = Chaos(cluster, sim.fork_rng("chaos"), params)
    chaos.stats = stats
    for node in (*NODES, SPARE):
        scanner = cluster.scanner(
            node,
            max_local_repeats=params.max_local_repeats,
            arrival_timeout=ARRIVAL_TIMEOUT,
            on_row=chaos.on_row,
        )
        if params.deaf_rcb:
            scanner.migrations.register = lambda rcb: None  # type: ignore[method-assign]
        sim.cluster.add(node, _node_main(scanner, stats))
    await sim.cluster.start(*NODES, SPARE)
    addresses = {n: await sim.cluster[n].wait_serving() for n in (*NODES, SPARE)}
    pool = ConnectionPool(sim.network.transport("client"), SECRET, name="client")

    async def call(node: str, req: ShardBatch) -> ShardBatchResult:
        if req.vs_pid >= 0:
            stats.virtual_scans += 1
        return await pool.request(addresses[node], req, 60.0, expect=ShardBatchResult)

    codec = ContinuationCodec(SECRET)
    coord = PageCoordinator(cluster.history, call, codec)
    chaos.coord = coord
    outcomes = []
    first_ordered = rng.random() < 0.5
    for q in range(params.queries):
        ordered = first_ordered if q % 2 == 0 else not first_ordered
        chaos.start_query(rng.random() < params.unsupported_rate)
        outcomes.append(await _one_query(coord, codec, chaos, rng, ordered, params))
        stats.queries += 1
        # The verdict of this query, checked at once so a failure names its query.
        check_outcome(outcomes[-1], cluster)
        if outcomes[-1].error is None:
            stats.completed += 1
        else:
            stats.query_state += 1
    await pool.close()
    await sim.cluster.stop_all()
    return outcomes


async def _one_query(
    coord: PageCoordinator,
    codec: ContinuationCodec,
    chaos: Chaos,
    rng: random.Random,
    ordered: bool,
    params: Params,
) -> QueryOutcome:
    digest = scan_digest(SPEC_ALL + (b"/ordered" if ordered else b"/unordered"))
    pages: list[list[PageRow]] = []
    continuation: str | None = None
    error = None
    for _ in range(params.max_pages):
        try:
            page = await coord.page(
                SPEC_ALL, rng.randint(1, params.max_page), continuation, ordered=ordered
            )
        except ShardexError as e:
            if e.code != ErrorCode.QUERY_STATE:
                raise
            error = e
            break
        pages.append(page.rows)
        continuation = page.continuation
        if continuation is None:
            break
        chaos.between_pages(codec.decode(continuation, expect_digest=digest))
        await asyncio.sleep(rng.uniform(0.0, 0.05))
    else:
        raise AssertionError(f"scan did not finish in {params.max_pages} pages: livelock")
    return QueryOutcome(ordered, pages, error, chaos.fatal, list(chaos.events))


def check_outcome(outcome: QueryOutcome, cluster: ElasticMemoryCluster) -> None:
    kind = "ordered" if outcome.ordered else "unordered"
    story = "; ".join(outcome.events) or "no migrations"
    if outcome.error is not None:
        if outcome.fatal is None:
            raise AssertionError(
                f"{kind} scan ended in QUERY_STATE ({outcome.error}) although every "
                f"migration was supported: {story}"
            )
        return
    if outcome.fatal is not None:
        raise AssertionError(
            f"{kind} scan completed although an unsupported event happened "
            f"({outcome.fatal}): {story}"
        )
    check_paginated_scan(
        outcome.pages, cluster.expected(), ordered=outcome.ordered, context=f"{kind}: {story}"
    )


def _node_main(scanner, stats: Stats):  # type: ignore[no-untyped-def]
    async def main(node: ClusterNode) -> None:
        server = RpcServer(node.transport, SECRET, name=node.host)

        async def on_batch(msg: ShardBatch, conn: object) -> ShardBatchResult:
            res = await scanner.scan_batch(msg)
            stats.repeats += res.repeats
            return res

        server.route(ShardBatch, on_batch)
        node.serving(await server.start(node.listen_address))
        try:
            await asyncio.Event().wait()
        finally:
            await server.stop()

    return main


def sim_config() -> FaultConfig:
    # No drops: a lost reply would re-run a batch whose in-batch events were already
    # classified against the lost run. Retrying a read-only batch is safe by itself.
    return FaultConfig(trace_payloads=False)


def run_seed(seed: int, params: Params | None = None, stats: Stats | None = None):  # type: ignore[no-untyped-def]
    params = params or Params()
    stats = stats if stats is not None else Stats()
    sim = Simulation(seed, sim_config())

    async def main(sim: Simulation) -> list[QueryOutcome]:
        return await run_scenario(sim, params, stats)

    return sim.run(main), stats
