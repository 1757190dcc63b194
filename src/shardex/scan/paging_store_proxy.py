"""Paginated scans on real nodes: the proxy (``PageScan`` from a client) and the wiring.

The elastic-scan algorithm's proxy is the node the client talks to (any node): it decodes and checks
the continuation (HMAC under a key derived from the cluster secret), resolves the keyspace or index,
pins what the scan reads on its first page, and runs the protocol's ``PageCoordinator`` over
``ShardBatch`` calls to the shard nodes (a direct call when the shard is itself). It keeps no state
between pages: the continuation carries everything, so the next page may go to any node and a
retried page is harmless.

Consistency and stability of paged index scans (the choice this module makes):

* request_plus / at_plus (default stability "scan"): the first page waits until every
  indexer of the index holds a stability TS covering the keyspace's high seqnos (or the
  caller's TS), pins the oldest of their answers (the one all of them have a snapshot at) in
  the continuation, and *every* page reads exactly that snapshot: the pages together are one
  consistent state. The first page leases that snapshot on every slice of the topology it
  asked and pins that topology as the scan's base; later pages renew the lease there
  (``paging_leases``), so the indexers keep it beyond their last K, and read every partition
  there too, also one that moved meanwhile (its source keeps the leased slice; the new
  owner's copy is newer than the pinned TS). A snapshot released meanwhile (the lease
  expired, or too many leased) ends the scan with SNAPSHOT_TOO_OLD (restart it).
* not_bounded (default stability "none"): every page reads the slices' tips; with stability
  "scan" the first page pins the newest common stability TS without waiting.
* request_plus / at_plus with stability "none": the first page waits as above, then every
  page reads the tips.

Primary scans read documents at their owners, where every acknowledged write is visible, so
all three consistencies hold without waiting; pages read the current documents.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Awaitable
from typing import TYPE_CHECKING, Any, Final, TypeVar

from shardex.api.scan import (
    AT_PLUS,
    CONSISTENCIES,
    REQUEST_PLUS,
    STABILITY_NONE,
    STABILITY_SCAN,
    StabilityAt,
    WaitStability,
)
from shardex.api.spans import encode_spans, to_wire_spans
from shardex.core.timestamp import Timestamp
from shardex.core.topology import Topology
from shardex.errors import ErrorCode, ShardexError
from shardex.meta.index_state import IndexRecord
from shardex.net import Connection, ConnectionPool, RpcServer
from shardex.net.transport import Transport
from shardex.scan.at_plus import on_current_branches
from shardex.scan.continuation import Continuation, ContinuationCodec, scan_digest
from shardex.scan.coordinator import OPEN_ATTEMPTS, ScanCoordinator, oldest_common
from shardex.scan.elastic_adapters import (
    ARRIVAL_TIMEOUT,
    ElasticScanNode,
    HistoryLookup,
    has_topology,
)
from shardex.scan.failover import FAILOVER, failed_node
from shardex.scan.failover import placement as failover_placement
from shardex.scan.paging import PageCoordinator, check_page_size
from shardex.scan.paging_copies import fails_over, read_from_copies
from shardex.scan.paging_leases import (
    LEASE,
    RELEASE,
    RENEW,
    LeaseSnapshots,
    SnapshotsLeased,
    copy_placement,
    lease_on_nodes,
    serve_lease,
    spare_copies,
)
from shardex.scan.paging_store_spec import (
    PRIMARY,
    PageContext,
    PagedScanSpec,
    PageScan,
    PageScanReply,
    decode_context,
    decode_spec,
    encode_context,
    encode_spec,
    primary_spans,
    request_identity,
)
from shardex.scan.paging_wire import ShardBatch, ShardBatchResult
from shardex.scan.topology_retry import on_fresh_topology

if TYPE_CHECKING:
    from shardex.data.service import DataService
    from shardex.index.service import IndexService

__all__ = ["PagingService"]

T = TypeVar("T")

BATCH_TIMEOUT: Final = 2 * ARRIVAL_TIMEOUT + 15.0  # a shard may wait for both, then read
RPC_MARGIN: Final = 10.0
MAX_TIMEOUT: Final = 600.0
PAGE_STABILITIES: Final = (STABILITY_NONE, STABILITY_SCAN)


def _bad(message: str, **details: object) -> ShardexError:
    return ShardexError(message, code=ErrorCode.BAD_REQUEST, details=dict(details))


def check_page_request(msg: PageScan) -> str:
    """Validate ``msg``; returns its stability (the default resolved)."""
    check_page_size(msg.page_size)
    if msg.consistency not in CONSISTENCIES:
        raise _bad(
            f"consistency must be one of {', '.join(CONSISTENCIES)}, got {msg.consistency!r}",
            value=repr(msg.consistency),
        )
    stability = msg.stability
    if stability is None:
        stability = STABILITY_SCAN if msg.consistency in (REQUEST_PLUS, AT_PLUS) else "none"
    if stability not in PAGE_STABILITIES:
        raise _bad(
            f"a paginated scan's stability is one of {', '.join(PAGE_STABILITIES)}, "
            f"got {stability!r}",
            value=repr(stability),
            hint="query stability spans several scans: use client.query_context() with scan",
        )
    if msg.consistency == AT_PLUS and msg.at is None and msg.continuation is None:
        raise _bad("at_plus needs a timestamp (at=...)", hint="pass the writes' results")
    if not 0 < msg.timeout <= MAX_TIMEOUT:
        raise _bad(f"timeout must be in (0, {MAX_TIMEOUT}] seconds", value=msg.timeout)
    return stability


class PagingService:
    """The proxy on every node plus the shard-node side where data or index runs."""

    def __init__(
        self,
        *,
        name: str,
        secret: str,
        transport: Transport,
        scan: ScanCoordinator,
        data: DataService | None,
        index: IndexService | None,
    ) -> None:
        self.name = name
        self.codec = ContinuationCodec(secret)
        self.scan = scan
        self.view = scan.view
        self.pool = ConnectionPool(transport, secret, name=f"{name}/paging")
        self.shard = ElasticScanNode(name=name, view=scan.view, data=data, index=index)
        self.index = index

    def install(self, server: RpcServer) -> None:
        server.route(PageScan, self.on_page)
        server.route(ShardBatch, self.shard.on_batch)
        server.route(LeaseSnapshots, self.on_lease)

    async def on_lease(
        self, msg: LeaseSnapshots, conn: Connection | None = None
    ) -> SnapshotsLeased:
        if self.index is None:
            raise ShardexError(
                f"{self.name} runs no index service",
                code=ErrorCode.INDEX_NOT_FOUND,
                details={"node": self.name, "index": msg.index_id},
            )
        return await serve_lease(self.index, self.name, msg)

    async def _lease_call(self, node: str, msg: LeaseSnapshots) -> SnapshotsLeased:
        if node == self.name:
            return await self.on_lease(msg)
        return await self.pool.request(
            self.view.address(node), msg, BATCH_TIMEOUT, expect=SnapshotsLeased
        )

    async def stop(self) -> None:
        await self.pool.close()

    async def _call_once(self, node: str, req: ShardBatch) -> ShardBatchResult:
        if node == self.name:
            return await self.shard.on_batch(req)
        return await self.pool.request(
            self.view.address(node), req, BATCH_TIMEOUT, expect=ShardBatchResult
        )

    async def _call(self, node: str, req: ShardBatch) -> ShardBatchResult:
        """A shard's batch; if its node failed, a pinned scan's batch from the other copies
        of its partitions (``paging_copies``)."""
        try:
            return await self._call_once(node, req)
        except ShardexError as exc:
            spec = decode_spec(req.scan)
            if not fails_over(exc, spec):
                raise
            history = (await self.view.state()).index_topologies.get(spec.index_id) or []
            base = next((t for t in history if t.seq_num == req.base_topo), None)
            if base is None:
                raise
            return await read_from_copies(self._call_once, spec.index_id, base, req, exc)

    # --- one page --------------------------------------------------------------------------

    async def on_page(self, msg: PageScan, conn: Connection | None = None) -> PageScanReply:
        stability = check_page_request(msg)
        ident = request_identity(msg, stability)
        digest = scan_digest(ident + (b"/ordered" if msg.ordered else b"/unordered"))
        if msg.continuation is None:
            ck = Continuation(ordered=msg.ordered, scan_digest=digest)
        else:
            ck = self.codec.decode(msg.continuation, expect_digest=digest)
        desc: list[bool] = []
        lease = ""
        first_base: int | None = None
        if msg.index == PRIMARY:
            spec, history = await self._primary(msg, ck)
        else:
            rec, spec, history, first_base = await self._index(msg, ck, stability)
            desc = list(rec.definition.desc)
            lease = decode_context(ck.context).lease
        what = f"keyspace {msg.keyspace!r}" if spec.primary else f"index {msg.index!r}"
        coordinator = PageCoordinator(HistoryLookup(history, what), self._call, self.codec)
        base_topo = ck.base_topo
        page = coordinator.page_state(encode_spec(spec), msg.page_size, ck, first_base=first_base)
        if lease and base_topo >= 0:  # a later page of a pinned scan: renew its lease
            # Where the first page leased it: the base owners serve every page of a pinned
            # scan. A snapshot gone there fails this page (SNAPSHOT_TOO_OLD), rows and all.
            base = _base(history, base_topo)
            renew = lease_on_nodes(
                self._lease_call,
                copy_placement(base),
                spec.index_id,
                lease,
                RENEW,
                spec.snapshot,
                spare=spare_copies(base),
            )
            rows, nxt = await _with_renewal(page, renew)
        else:
            rows, nxt = await page
        if lease and nxt is None:  # the continuation ends: the indexers may let it go
            nodes = copy_placement(_base(history, ck.base_topo))
            await lease_on_nodes(self._lease_call, nodes, spec.index_id, lease, RELEASE, None)
        return PageScanReply(
            entries=[r.key for r in rows],
            continuation=None if nxt is None else self.codec.encode(nxt),
            primary=spec.primary,
            desc=desc,
            ts=spec.snapshot,
        )

    async def _primary(
        self, msg: PageScan, ck: Continuation
    ) -> tuple[PagedScanSpec, list[Topology]]:
        spans = primary_spans(msg.spans)  # BAD_REQUEST before any lookup
        state = await self.view.state()
        history = state.data_topologies.get(msg.keyspace) or []
        if not history or (ck.base_topo >= 0 and not has_topology(history, ck.base_topo)):
            state = await self.view.state(fresh=True)
            history = state.data_topologies.get(msg.keyspace) or []
        if msg.keyspace not in state.keyspaces or not history:
            raise ShardexError(
                f"keyspace {msg.keyspace!r} not found",
                code=ErrorCode.KEYSPACE_NOT_FOUND,
                details={"keyspace": msg.keyspace, "hint": "shardex keyspace list"},
            )
        return PagedScanSpec(keyspace=msg.keyspace, index_id="", spans=spans), history

    async def _index(
        self, msg: PageScan, ck: Continuation, stability: str
    ) -> tuple[IndexRecord, PagedScanSpec, list[Topology], int | None]:
        """(The index, the scan's spec, the index's topology history, the base topology a
        first page must pin: None for the newest)."""
        rec, topo = await self.scan.resolve(msg.keyspace, msg.index)
        spans = to_wire_spans(encode_spans(msg.spans, rec.definition))
        first_base: int | None = None
        if ck.base_topo >= 0:  # a later page: read what the first one pinned
            ctx = decode_context(ck.context)
            if ctx.index_id != rec.id:
                raise _bad(
                    f"index {msg.index!r} was dropped and re-created since the scan began",
                    index=msg.index,
                    hint="start a new scan (continuation=None)",
                )
            snapshot = ctx.snapshot
        else:
            snapshot, lease, leased_on = await self._first_snapshot(msg, rec, topo, stability)
            ck.context = encode_context(
                PageContext(index_id=rec.id, snapshot=snapshot, lease=lease)
            )
            if lease:  # the pages read where the snapshot is leased
                first_base = leased_on.seq_num
        needed = ck.base_topo if ck.base_topo >= 0 else first_base
        state = await self.view.state()
        history = state.index_topologies.get(rec.id) or []
        if needed is not None and not has_topology(history, needed):
            state = await self.view.state(fresh=True)
            history = state.index_topologies.get(rec.id) or []
        if not history:
            history = [topo]
        spec = PagedScanSpec(keyspace=msg.keyspace, index_id=rec.id, spans=spans, snapshot=snapshot)
        return rec, spec, history, first_base

    async def _first_snapshot(
        self, msg: PageScan, rec: IndexRecord, topo: Topology, stability: str
    ) -> tuple[dict[int, tuple[int, int]] | None, str, Topology]:
        """(The stability TS every page reads (None: the tips), after the first page's wait;
        the id of its lease on every slice, "" for none; the topology it was leased on).
        One deadline for the whole wait, topology retries included (as the scan
        coordinator's open): each attempt's ``WaitStability`` gets the time that is left."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + msg.timeout
        wait_for: Timestamp | None = None
        if msg.consistency == REQUEST_PLUS:
            wait_for = await self.view.high_seqnos(msg.keyspace)
        elif msg.consistency == AT_PLUS:
            assert msg.at is not None
            wait_for = await on_current_branches(
                self.view, msg.keyspace, Timestamp.from_wire(msg.at)
            )
        if stability == STABILITY_NONE and wait_for is None:
            return None, "", topo
        wire = None if wait_for is None else dict(wait_for.to_wire())

        async def ask(node: str, parts: list[int], left: float) -> Timestamp:
            req = WaitStability(index_id=rec.id, partitions=parts, wait_for=wire, timeout=left)
            try:
                reply = await self.pool.request(
                    self.view.address(node), req, left + RPC_MARGIN, expect=StabilityAt
                )
            except ShardexError as exc:
                if exc.code in FAILOVER:
                    exc.details.setdefault("indexer", node)  # another copy may stand in
                raise
            return Timestamp.from_wire(reply.ts)

        lease = uuid.uuid4().hex if stability != STABILITY_NONE else ""
        used = [topo]

        async def ask_all(t: Topology) -> dict[int, tuple[int, int]] | None:
            used[0] = t
            avoid: set[str] = set()  # indexers that failed: other copies answer for them
            while True:
                by_node = copy_choice(rec.name, t, avoid)
                left = deadline - loop.time()
                if left <= 0:
                    raise ShardexError(
                        f"the first page of a scan of index {rec.name!r} ran out of its "
                        f"{msg.timeout}s before every slice reached its TS (retries after "
                        "moved partitions included)",
                        code=ErrorCode.SCAN_TIMEOUT,
                        details={"index": rec.id, "timeout": msg.timeout, "hint": "retry the scan"},
                    )
                try:
                    tss = await asyncio.gather(*(ask(n, ps, left) for n, ps in by_node.items()))
                    break
                except ShardexError as exc:
                    node = failed_node(exc)
                    if node is None or node in avoid or not t.replicas:
                        raise
                    avoid.add(node)
                    try:
                        copy_choice(rec.name, t, avoid)
                    except ShardexError:
                        raise exc from None  # no other copy of one of its partitions
            if stability == STABILITY_NONE:
                return None  # waited until covered; the pages read the tips
            pin = dict(oldest_common(list(tss)).to_wire())
            # Every copy keeps the snapshot: a later page whose shard fails reads another
            # (``paging_copies``). Required where this page asked, best effort elsewhere.
            await lease_on_nodes(
                self._lease_call,
                copy_placement(t),
                rec.id,
                lease,
                LEASE,
                pin,
                spare=spare_copies(t, by_node),
            )
            return pin

        # A partition moved since this node's state was read: ask the new owner.
        pin = await on_fresh_topology(
            rec,
            topo,
            ask_all,
            lambda: self.scan.resolve(msg.keyspace, msg.index, fresh=True),
            attempts=OPEN_ATTEMPTS,
        )
        return pin, lease, used[0]


async def _with_renewal(page: Awaitable[T], renew: Awaitable[None]) -> T:
    """The page's result once the renewal succeeded too; the first failure of either
    cancels the other (a page whose snapshot is gone returns no row)."""
    tasks: list[asyncio.Future[Any]] = [asyncio.ensure_future(page), asyncio.ensure_future(renew)]
    try:
        await asyncio.wait(tasks, return_when=asyncio.FIRST_EXCEPTION)
        for t in tasks:
            if t.done() and not t.cancelled() and t.exception() is not None:
                raise t.exception()  # type: ignore[misc]
        result: T = tasks[0].result()
        return result
    finally:
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


def _base(history: list[Topology], base_topo: int) -> Topology:
    """A pinned scan's base topology: its lease lives on the copies there (the first page
    leased it there, and every page reads there)."""
    base = next((t for t in history if t.seq_num == base_topo), None)
    return base if base is not None else Topology(seq_num=base_topo, assignment={})


def copy_choice(index: str, topo: Topology, avoid: set[str]) -> dict[str, list[int]]:
    """Node -> partitions the first page asks: each partition's first copy not avoided."""
    return failover_placement(index, topo, sorted(topo.assignment), avoid)
