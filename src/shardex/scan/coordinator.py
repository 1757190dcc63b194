"""The scan coordinator (scan-request flow steps 5-15): any node, for any client.

``IndexScan`` from a client:

1. resolve the index in the coordinator state (INDEX_NOT_FOUND; INDEX_NOT_READY while it is
   READY/BUILDING or failed) and its latest topology; encode the spans with the index's DESC
   flags; eliminate partitions (``spans.eliminate``);
2. the consistency's TS to cover: none (not_bounded), the keyspace's high seqnos now
   (request_plus, ``ClusterView.high_seqnos``) or the caller's (at_plus). A request_plus
   scan with scan stability fetches them while its slices are opened at their newest
   snapshot, and keeps that read if its TS covers them (``request_plus.Speculation``);
   the indexer nodes it opens read their own data partitions' seqnos on arrival
   (``request_plus.SeqnoRide``), the other data nodes are asked at once, or in a round
   shared by the scans that ask while one is out (``ClusterView.shared_partial_high_seqnos``);
3. stability: none reads the tips (after the wait), scan and query one stability TS for
   every slice, in one round in the common case: each node waits for and reads its slices'
   newest common snapshot covering the TS and names it in its reply; when the answers
   differ, the oldest - one every node holds (the ring keeps K) - is pinned and only the
   nodes that read another one are asked again (no separate ``WaitStability`` round). A
   query context passes its TS as ``pinned``. A TS that a node released meanwhile
   (SNAPSHOT_TOO_OLD) is retried with a newer one unless the caller pinned it;
4. ``ScanSlices`` to every indexer node in parallel (each with the local partitions, the
   encoded spans, ``offset + limit`` as its limit); this node's own slices are read
   in-process (``local_index``). A reply carries the first entries, and says when they are
   all. When every reply did (a small scan), the rows are merged here and go back inside
   ``IndexScanStarted`` itself: one request and one reply per hop, no stream. Otherwise the
   reply goes back with the TS read, and a task streams the rows: a k-way merge on the entry
   bytes (``merge.merge_ordered``) or blocks as they come (``merge.interleave``), offset and
   limit applied over the combination, credit flow control on both hops. A failing slice
   ends the client's stream with its error, unless another copy takes over (below).

Index replicas: each index partition is read from one copy, the primary unless it failed
this scan (``failover.placement``). An indexer that cannot be reached while the slices are
opened (NODE_UNAVAILABLE, a closed connection, a timeout) is avoided and its partitions
opened again on another copy, within the scan's one deadline; with no other copy the error
is the client's. A copy in the topology holds every published TS (``index_copies.py``), so
the copy read changes nothing in the rows. Once the rows stream, a scan at a TS (scan or
query stability) fails over too (``failover.Resumable``): each indexer's stream is read in
entry order (asked for even when the scan is unordered, when a partition has another copy),
so the stream that fails is reopened on its partitions' other copies at the same TS with its
spans narrowed to start strictly after the last entry read, and the new streams take its
place in the merge: no row twice, none missing. A copy without the TS (SNAPSHOT_TOO_OLD) or
no copy left ends the scan with the stream's own error, and so does any failure of a scan of
the tips (another copy's tip is another state).

The request's checks are ``scan_checks.py``; request_plus's speculative open and the
seqnos riding in ``ScanSlices`` are ``request_plus.py``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import Counter
from collections.abc import AsyncIterator, Callable
from typing import TYPE_CHECKING, Any, Final

import msgspec

from shardex.api.scan import (
    AT_PLUS,
    CONSISTENCIES,
    NO_TS,
    REQUEST_PLUS,
    STABILITY_NONE,
    IndexScan,
    IndexScanStarted,
    ScanSlices,
)
from shardex.api.scan_streams import (
    Inboxes,
    OutStream,
    OutStreams,
    Source,
    cancel_all,
)
from shardex.api.spans import (
    decode_user_spans,
    eliminate_decoded,
    encode_decoded,
    from_wire_spans,
    to_wire_spans,
)
from shardex.core.spans import spans_after
from shardex.core.timestamp import Timestamp
from shardex.core.topology import Topology
from shardex.errors import ErrorCode, ShardexError
from shardex.meta.index_state import (
    ACTIVE,
    IndexRecord,
    find_index,
    latest_index_topology,
)
from shardex.meta.member_list import MemberInfo
from shardex.net import Connection, ConnectionPool, RpcServer
from shardex.net.transport import Transport
from shardex.runtime.latency import Latencies
from shardex.scan.at_plus import on_current_branches
from shardex.scan.cluster_view import ClusterView
from shardex.scan.failover import Reopen, Resumable, failed_node, placement
from shardex.scan.merge import interleave, merge_heads, merge_ordered, pushdown_limit, window
from shardex.scan.request_plus import SeqnoRide, Speculation
from shardex.scan.scan_checks import check_request, check_servable
from shardex.scan.scan_ts import oldest_common, oldest_packed
from shardex.scan.slice_opens import Opened, PackedTs, SliceOpens
from shardex.scan.topology_retry import on_fresh_topology

if TYPE_CHECKING:
    from shardex.index.scan_server import IndexScanServer

__all__ = ["ScanCoordinator", "oldest_common"]

log = logging.getLogger(__name__)

OPEN_ATTEMPTS: Final = 3
BLOCK_ROWS: Final = 1000  # entries per block to the client
# Entries per block from the indexers: each block costs a fixed part on both ends (a read
# in the indexer's scan pool, a frame, a credit, the stream's wake-ups) that a large scan
# paid per 1,000 entries; blocks to the client stay at ``BLOCK_ROWS``. Two blocks of credit
# per indexer stream cost no more CPU per row than four and keep at most 8,000 entries
# in flight (decisions/0137).
SLICE_BLOCK_ROWS: Final = 4000
SLICE_CREDIT: Final = 2


class ScanCoordinator:
    """Serves ``IndexScan`` on one node."""

    def __init__(
        self,
        *,
        transport: Transport,
        secret: str,
        name: str,
        coordinator: Callable[[], Any | None],
        members: Callable[[], list[MemberInfo]],
        streams: OutStreams,
    ) -> None:
        self.name = name
        self.streams = streams
        self.inboxes = Inboxes()
        self.pool = ConnectionPool(
            transport, secret, name=f"{name}/scan", handlers=self.inboxes.handlers()
        )
        self.view = ClusterView(pool=self.pool, coordinator=coordinator, members=members, name=name)
        # This node's own indexer (set by the node when it runs the index service): its
        # slices are read in-process, not over a connection to ourselves.
        self.local_index: IndexScanServer | None = None
        # request_plus opened while its high seqnos are fetched (``request_plus.py``);
        # ``speculation`` counts the outcomes (hit, miss, skipped).
        self.speculative = Speculation(self.view)
        self.speculation: Counter[str] = self.speculative.counts
        # Slice streams continued on another copy after their indexer failed mid-stream.
        self.stream_failovers = 0
        # consistency -> time from an IndexScan's arrival to its first reply (resolve, the
        # consistency's wait, the first block), failures too; read by the node's metrics.
        self.latencies: Latencies[str] = Latencies()

    def install(self, server: RpcServer) -> None:
        server.route(IndexScan, self.on_scan)

    async def stop(self) -> None:
        await self.pool.close()

    # --- resolve -------------------------------------------------------------------------------

    async def resolve(
        self, keyspace: str, index: str, *, fresh: bool = False
    ) -> tuple[IndexRecord, Topology]:
        state = await self.view.state(fresh=fresh)
        rec = find_index(state.indexes, keyspace, index)
        if not fresh and (rec is None or rec.state != ACTIVE):  # a moment old? ask the master
            state = await self.view.state(fresh=True)
            rec = find_index(state.indexes, keyspace, index)
        if rec is None and keyspace not in state.keyspaces:
            raise ShardexError(
                f"keyspace {keyspace!r} not found",
                code=ErrorCode.KEYSPACE_NOT_FOUND,
                details={"keyspace": keyspace, "index": index},
            )
        rec = check_servable(rec, keyspace, index)
        topo = latest_index_topology(state.index_topologies, rec.id)
        if topo is None or not topo.assignment:
            raise ShardexError(
                f"index {index!r} on {keyspace!r} has no topology",
                code=ErrorCode.INDEX_NOT_READY,
                details={"keyspace": keyspace, "index": index},
            )
        return rec, topo

    # --- the request -----------------------------------------------------------------------------

    async def on_scan(self, msg: IndexScan, conn: Connection) -> IndexScanStarted:
        t0 = time.perf_counter()
        try:
            return await self._scan(msg, conn)
        finally:
            c = msg.consistency
            self.latencies.observe(c if c in CONSISTENCIES else "invalid", time.perf_counter() - t0)

    async def _scan(self, msg: IndexScan, conn: Connection) -> IndexScanStarted:
        self.streams.check_new(conn, msg.scan_id)
        check_request(msg)
        rec, topo = await self.resolve(msg.keyspace, msg.index)
        defn = rec.definition
        decoded = decode_user_spans(msg.spans, defn)  # once, for both uses
        spans = to_wire_spans(encode_decoded(decoded, defn))
        # One deadline for the whole open, retries included: every indexer request gets the
        # time that is left, so no retry can make the scan outlive its own timeout.
        deadline = asyncio.get_running_loop().time() + msg.timeout
        partitions = eliminate_decoded(decoded, defn)
        by_node = placement(msg.index, topo, partitions)
        if msg.limit == 0:
            by_node = {}  # nothing to read; still resolved and validated above
        wait_for: Timestamp | None = None
        seqnos: asyncio.Future[dict[int, tuple[int, int]]] | None = None
        ride: SeqnoRide | None = None
        if msg.consistency == REQUEST_PLUS:
            owners = await self.view.data_owners(msg.keyspace)
            if self.speculative.wanted(msg, rec.id, by_node):
                # The indexer nodes that own data partitions read their high seqnos on
                # arrival of their ScanSlices; only the other owners get a HighSeqnos.
                ride = SeqnoRide(
                    msg.keyspace,
                    {n: ps for n, ps in owners.items() if n in by_node and n != self.name},
                )
                # Sent now, before the slices are opened: the round overlaps every read.
                seqnos = self.view.shared_partial_high_seqnos(
                    msg.keyspace, skip=ride.plan, owners=owners
                )
            else:  # needed before any ScanSlices
                wait_for = await self.view.shared_high_seqnos(msg.keyspace)
        elif msg.consistency == AT_PLUS:
            assert msg.at is not None
            # tokens of a branch a failover replaced: read on the current one, or ROLLBACK
            wait_for = await on_current_branches(
                self.view, msg.keyspace, Timestamp.from_wire(msg.at)
            )
        base = ScanSlices(
            scan_id=0,
            index_id=rec.id,
            partitions=[],
            spans=spans,
            wait_for=None if wait_for is None else dict(wait_for.to_wire()),
            stability=msg.stability != STABILITY_NONE,
            timeout=msg.timeout,
            limit=pushdown_limit(msg.offset, msg.limit),
            # Each indexer's stream in entry order even for an unordered scan when another
            # copy may have to continue it after its last entry (``failover.py``).
            ordered=msg.ordered or resumable(msg, topo, partitions),
            credit=SLICE_CREDIT,
            block_rows=SLICE_BLOCK_ROWS,
        )
        placed = by_node
        placed_topo = topo

        async def open_with(
            req: ScanSlices, ride: SeqnoRide | None = None
        ) -> tuple[PackedTs, list[Source]]:
            async def open_on(t: Topology) -> tuple[PackedTs, list[Source]]:
                # An index partition moved: retried on the fresh topology's owners.
                nonlocal placed, placed_topo
                placed_topo = t
                nodes = by_node if t is topo else placement(msg.index, t, partitions)
                avoid: set[str] = set()  # indexers that failed this scan: other copies
                while True:
                    placed = nodes if by_node else {}
                    try:
                        return await self._open(msg, req, placed, deadline, ride)
                    except ShardexError as exc:
                        node = failed_node(exc)
                        left = deadline - asyncio.get_running_loop().time()
                        if node is None or node in avoid or left <= 0:
                            raise
                        avoid.add(node)
                        try:
                            nodes = placement(msg.index, t, partitions, avoid)
                        except ShardexError:
                            raise exc from None  # no other copy of one of its partitions
                        log.info(
                            "scan of %s: indexer %s failed (%s); its partitions go to other copies",
                            rec.id,
                            node,
                            exc.code,
                        )

            return await on_fresh_topology(
                rec,
                topo,
                open_on,
                lambda: self.resolve(msg.keyspace, msg.index, fresh=True),
                attempts=OPEN_ATTEMPTS,
            )

        if seqnos is None or ride is None:
            ts, sources = await open_with(base)
        else:
            ts, sources = await self.speculative.open(rec.id, base, seqnos, ride, open_with)
        started = IndexScanStarted(
            scan_id=msg.scan_id,
            index_id=rec.id,
            desc=list(defn.desc),
            ts=NO_TS if ts is None else msgspec.Raw(ts),  # the slices' bytes, not re-encoded
            partitions=partitions,
            prefer=self._prefer(placed),
        )
        if all(s.complete for s in sources):
            # Every slice answered in its reply (a small scan): merge here and answer in
            # ours; only what exceeds one block is streamed.
            rows = merge_heads([s.take_head() for s in sources], msg.ordered)
            rows = rows[msg.offset : None if msg.limit is None else msg.offset + msg.limit]
            started.entries = rows[:BLOCK_ROWS]
            started.done = len(rows) <= BLOCK_ROWS
            if started.done:
                return started
            rest = [rows[i : i + BLOCK_ROWS] for i in range(BLOCK_ROWS, len(rows), BLOCK_ROWS)]

            async def produce(out: OutStream) -> None:
                for block in rest:
                    await out.send(block)

        else:
            if ts is not None and resumable(msg, placed_topo, partitions):
                reopen = self._reopener(msg, base, ts, placed_topo)
                for src in sources:
                    if isinstance(src, Resumable):
                        src.arm(reopen, BLOCK_ROWS)

            async def produce(out: OutStream) -> None:
                await self._stream(msg, sources, out)

        try:
            self.streams.start(conn, msg.scan_id, msg.credit, produce)
        except BaseException:
            await cancel_all(sources)
            raise
        return started

    def _prefer(self, by_node: dict[str, list[int]]) -> str:
        """The address of the node holding the most of ``by_node``'s partitions if that is
        not this node (ties stay here): coordinating there reads them in-process."""
        if not by_node:
            return ""
        best = max(by_node, key=lambda n: (len(by_node[n]), n == self.name))
        if best == self.name:
            return ""
        try:
            return self.view.address(best)
        except ShardexError:  # not a member any more: no hint
            return ""

    async def _open(
        self,
        msg: IndexScan,
        base: ScanSlices,
        by_node: dict[str, list[int]],
        deadline: float,
        ride: SeqnoRide | None = None,
    ) -> tuple[PackedTs, list[Source]]:
        """Open every node's stream; returns (the TS read, encoded; the streams)."""
        for attempt in range(OPEN_ATTEMPTS):
            pinned = None if msg.pinned is None else Timestamp.from_wire(msg.pinned)
            try:
                return await self._open_stable(base, by_node, pinned, deadline, ride)
            except ShardexError as exc:
                retry = (
                    exc.code is ErrorCode.SNAPSHOT_TOO_OLD
                    and msg.pinned is None
                    and attempt + 1 < OPEN_ATTEMPTS
                )
                if not retry:
                    raise
                log.info("scan of %s: %s; picking a newer TS", base.index_id, exc)
        raise AssertionError("unreachable")

    async def _open_stable(
        self,
        base: ScanSlices,
        by_node: dict[str, list[int]],
        pinned: Timestamp | None,
        deadline: float,
        ride: SeqnoRide | None = None,
    ) -> tuple[PackedTs, list[Source]]:
        """Scan stability in one round in the common case: every node waits for (and reads)
        its own newest snapshot covering ``wait_for``; when they all name the same TS that
        is the scan's. Otherwise the oldest answer - a snapshot every node holds (the ring
        keeps K) - is pinned and only the nodes that read another one are asked again.
        The TSs stay encoded throughout (``scan_ts``); only differing ones are decoded."""
        opened = await self._open_all(base, by_node, pinned, deadline, ride)
        if pinned is not None or not base.stability or len(opened) <= 1:
            if pinned is not None:
                return pinned.packed(), _srcs(opened)
            tss = [ts for _, ts, _ in opened if ts is not None]
            return (tss[0] if tss else None), _srcs(opened)
        tss = [ts for _, ts, _ in opened if ts is not None]
        # The common case - every node read the same snapshot - is one bytes comparison
        # (a memcmp) per node: equal TSs have equal encodings (``Timestamp.packed``).
        if tss and all(ts == tss[0] for ts in tss):
            return tss[0], _srcs(opened)
        packed, pin = oldest_packed(tss)
        again = {node: by_node[node] for node, ts, _ in opened if ts != packed}
        if not again:
            return packed, _srcs(opened)
        kept = [src for node, _, src in opened if node not in again]
        await cancel_all([src for node, _, src in opened if node in again])
        log.debug("scan of %s: slices read different TSs; pinning %s", base.index_id, pin)
        try:
            reopened = await self._open_all(base, again, pin, deadline)
        except BaseException:
            await cancel_all(kept)
            raise
        return packed, kept + _srcs(reopened)

    async def _open_all(
        self,
        base: ScanSlices,
        by_node: dict[str, list[int]],
        pinned: Timestamp | None,
        deadline: float,
        ride: SeqnoRide | None = None,
    ) -> list[Opened]:
        """``ScanSlices`` to every node in parallel (``slice_opens.py``): (node, the TS it
        read, encoded; its stream)."""
        left = deadline - asyncio.get_running_loop().time()
        if left <= 0:
            raise ShardexError(
                f"scan of index {base.index_id} ran out of its {base.timeout}s before every "
                "slice was opened (retries after moved or released snapshots)",
                code=ErrorCode.SCAN_TIMEOUT,
                details={"index": base.index_id, "timeout": base.timeout},
            )
        opens = SliceOpens(
            name=self.name,
            local_index=self.local_index,
            inboxes=self.inboxes,
            pool=self.pool,
            view=self.view,
            base=_replace(base, timeout=left),
            snapshot_ts=None if pinned is None else dict(pinned.to_wire()),
            ride=ride,
        )
        return await opens.run(by_node)

    def _reopener(self, msg: IndexScan, base: ScanSlices, ts: bytes, topo: Topology) -> Reopen:
        """What re-opens a failed indexer's partitions on other copies mid-stream
        (``failover.Resumable``): at the scan's TS, after the last entry read, in ``topo``
        (the one the scan opened on: its copies hold the TS), each attempt within the
        scan's timeout. The nodes that failed are shared by every stream of the scan."""
        pinned = Timestamp.from_packed(ts)
        avoid: set[str] = set()

        async def reopen(
            failed: str, partitions: list[int], after: bytes | None, limit: int | None
        ) -> list[tuple[str, list[int], Source]]:
            avoid.add(failed)
            self.stream_failovers += 1
            if limit is not None and limit <= 0:
                return []
            spans = base.spans
            if after is not None:
                narrowed = spans_after(from_wire_spans(base.spans), after)
                if not narrowed:
                    return []  # every range read to its end
                spans = to_wire_spans(narrowed)
            req = _replace(base, spans=spans, limit=limit, stability=True)
            while True:
                by_node = placement(msg.index, topo, partitions, avoid)  # none left: raises
                deadline = asyncio.get_running_loop().time() + msg.timeout
                try:
                    opened = await self._open_all(req, by_node, pinned, deadline)
                except ShardexError as exc:
                    node = failed_node(exc)
                    if node is None or node in avoid:
                        raise
                    avoid.add(node)
                    continue
                return [(node, by_node[node], src) for node, _, src in opened]

        return reopen

    def _combine(self, msg: IndexScan, sources: list[Source]) -> AsyncIterator[list[bytes]]:
        combined = (
            merge_ordered(sources, BLOCK_ROWS) if msg.ordered else interleave(sources, BLOCK_ROWS)
        )
        return window(combined, msg.offset, msg.limit)

    async def _stream(self, msg: IndexScan, sources: list[Source], out: OutStream) -> None:
        try:
            async with contextlib.aclosing(self._combine(msg, sources)) as rows:
                async for block in rows:
                    await out.send(block)
        finally:
            await cancel_all(sources)


def resumable(msg: IndexScan, topo: Topology, partitions: list[int]) -> bool:
    """Whether the scan's streams may fail over mid-stream: it reads one stability TS
    (every copy holds it; another copy's tip is another state) and some partition it reads
    has another copy."""
    return msg.stability != STABILITY_NONE and any(topo.replicas.get(p) for p in partitions)


def _replace(msg: ScanSlices, **changes: Any) -> ScanSlices:
    return msgspec.structs.replace(msg, **changes)


def _srcs(opened: list[tuple[str, PackedTs, Source]]) -> list[Source]:
    return [src for _, _, src in opened]
