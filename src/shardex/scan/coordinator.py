"""The scan coordinator (seed steps 5-15): any node, for any client.

``IndexScan`` from a client:

1. resolve the index in the coordinator state (INDEX_NOT_FOUND; INDEX_NOT_READY while it is
   READY/BUILDING or failed) and its latest topology; encode the spans with the index's DESC
   flags; eliminate partitions (``spans.eliminate``);
2. the consistency's TS to cover: none (not_bounded), the keyspace's high seqnos now
   (request_plus, ``ClusterView.high_seqnos``) or the caller's (at_plus);
3. stability: none reads the tips (after the wait), scan and query one stability TS for
   every slice. Over one indexer node that node picks it (its slices' newest common
   snapshot covering the TS); over several, phase one asks each node (``WaitStability``) and
   the oldest answer - one every node has a snapshot at - is pinned for all. A query context
   passes its TS as ``pinned``. A TS that a node released meanwhile (SNAPSHOT_TOO_OLD) is
   retried with a newer one unless the caller pinned it;
4. ``ScanSlices`` to every indexer node in parallel (each with the local partitions, the
   encoded spans, ``offset + limit`` as its limit); once all answered, the reply
   ``IndexScanStarted`` goes back with the TS read, and a task streams the rows: a k-way
   merge on the entry bytes (``merge.merge_ordered``) or blocks as they come
   (``merge.interleave``), offset and limit applied over the combination, credit flow
   control on both hops. A failing slice ends the client's stream with its error.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable
from typing import Any, Final

import msgspec

from shardex.core.timestamp import Timestamp
from shardex.core.topology import Topology
from shardex.errors import ErrorCode, ShardexError
from shardex.manager.index_state import (
    ACTIVE,
    BUILDING,
    ERROR,
    READY,
    IndexRecord,
    find_index,
    latest_index_topology,
)
from shardex.manager.member_list import MemberInfo
from shardex.net import Connection, ConnectionPool, RpcServer
from shardex.net.transport import Transport
from shardex.scan.cluster_view import ClusterView
from shardex.scan.merge import interleave, merge_ordered, pushdown_limit, window
from shardex.scan.messages import (
    AT_PLUS,
    CONSISTENCIES,
    REQUEST_PLUS,
    STABILITIES,
    STABILITY_NONE,
    IndexScan,
    IndexScanStarted,
    ScanSlices,
    SlicesOpened,
    StabilityAt,
    WaitStability,
)
from shardex.scan.spans import eliminate, encode_spans, to_wire_spans
from shardex.scan.streams import Inboxes, InStream, OutStream, OutStreams

__all__ = ["ScanCoordinator", "oldest_common"]

log = logging.getLogger(__name__)

OPEN_ATTEMPTS: Final = 3
RPC_MARGIN: Final = 10.0  # beyond the scan's own wait timeout
MAX_TIMEOUT: Final = 600.0
BLOCK_ROWS: Final = 1000
SLICE_CREDIT: Final = 4


def _bad(message: str, **details: Any) -> ShardexError:
    return ShardexError(message, code=ErrorCode.BAD_REQUEST, details=details)


def oldest_common(tss: list[Timestamp]) -> Timestamp:
    """The TS every other one covers (the oldest of one history); without one (diverged
    branches), the one with the fewest seqnos: its snapshot errors tell the caller."""
    for t in tss:
        if all(o.covers(t) for o in tss):
            return t
    return min(tss, key=lambda t: sum(e.seqno for e in t.values()))


def check_request(msg: IndexScan) -> None:
    if msg.consistency not in CONSISTENCIES:
        raise _bad(
            f"consistency must be one of {', '.join(CONSISTENCIES)}, got {msg.consistency!r}",
            value=repr(msg.consistency),
        )
    if msg.stability not in STABILITIES:
        raise _bad(
            f"stability must be one of {', '.join(STABILITIES)}, got {msg.stability!r}",
            value=repr(msg.stability),
        )
    if msg.consistency == AT_PLUS and msg.at is None:
        raise _bad("at_plus needs a timestamp (at=...)", hint="pass the writes' results")
    if msg.limit is not None and msg.limit < 0:
        raise _bad(f"limit must be >= 0, got {msg.limit}", value=msg.limit)
    if msg.offset < 0:
        raise _bad(f"offset must be >= 0, got {msg.offset}", value=msg.offset)
    if not 0 < msg.timeout <= MAX_TIMEOUT:
        raise _bad(f"timeout must be in (0, {MAX_TIMEOUT}] seconds", value=msg.timeout)


def check_servable(rec: IndexRecord | None, keyspace: str, index: str) -> IndexRecord:
    if rec is None:
        raise ShardexError(
            f"index {index!r} not found on keyspace {keyspace!r}",
            code=ErrorCode.INDEX_NOT_FOUND,
            details={"keyspace": keyspace, "index": index, "hint": "shardex index list"},
        )
    if rec.state in (READY, BUILDING, ERROR):
        why = {
            READY: "deferred: run BUILD INDEX",
            BUILDING: f"still building ({rec.progress:.0%})",
            ERROR: f"its build failed: {rec.error}",
        }[rec.state]
        raise ShardexError(
            f"index {index!r} on {keyspace!r} is {rec.state}: {why}",
            code=ErrorCode.INDEX_NOT_READY,
            details={
                "keyspace": keyspace,
                "index": index,
                "state": rec.state,
                "progress": rec.progress,
                "hint": "wait for ACTIVE (client.wait_for_index)",
            },
        )
    if rec.state != ACTIVE:  # INIT (being created) or DELETED (being dropped)
        raise ShardexError(
            f"index {index!r} on {keyspace!r} is {rec.state}",
            code=ErrorCode.INDEX_NOT_FOUND,
            details={"keyspace": keyspace, "index": index, "state": rec.state},
        )
    return rec


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
        self.view = ClusterView(pool=self.pool, coordinator=coordinator, members=members)

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
        self.streams.check_new(conn, msg.scan_id)
        check_request(msg)
        rec, topo = await self.resolve(msg.keyspace, msg.index)
        defn = rec.definition
        spans = to_wire_spans(encode_spans(msg.spans, defn))
        partitions = eliminate(msg.spans, defn)
        by_node = _placement(msg.index, topo, partitions)
        wait_for: Timestamp | None = None
        if msg.consistency == REQUEST_PLUS:
            wait_for = await self.view.high_seqnos(msg.keyspace)
        elif msg.consistency == AT_PLUS:
            assert msg.at is not None
            wait_for = Timestamp.from_wire(msg.at)
        base = ScanSlices(
            scan_id=0,
            index_id=rec.id,
            partitions=[],
            spans=spans,
            wait_for=None if wait_for is None else dict(wait_for.to_wire()),
            stability=msg.stability != STABILITY_NONE,
            timeout=msg.timeout,
            limit=pushdown_limit(msg.offset, msg.limit),
            ordered=msg.ordered,
            credit=SLICE_CREDIT,
            block_rows=BLOCK_ROWS,
        )
        if msg.limit == 0:
            by_node = {}  # nothing to read; still resolved and validated above
        for attempt in range(OPEN_ATTEMPTS):
            try:
                ts, sources = await self._open(msg, base, by_node, wait_for)
                break
            except ShardexError as exc:
                # An index partition moved (its old indexer refuses or dropped its slice):
                # read the topology again and retry against the new owner.
                if exc.code not in _MOVED or attempt + 1 == OPEN_ATTEMPTS:
                    raise
                now, newer = await self.resolve(msg.keyspace, msg.index, fresh=True)
                if now.id != rec.id:
                    raise
                if newer.seq_num <= topo.seq_num:
                    if exc.code is not ErrorCode.STALE_TOPOLOGY:
                        raise
                    await asyncio.sleep(0.05 * 2**attempt)  # the switch is being committed
                topo = newer
                by_node = _placement(msg.index, topo, partitions) if by_node else {}
                log.info("scan of %s: %s; retrying on topology %d", rec.id, exc, topo.seq_num)

        async def produce(out: OutStream) -> None:
            await self._stream(msg, sources, out)

        try:
            self.streams.start(conn, msg.scan_id, msg.credit, produce)
        except BaseException:
            await _cancel_all(sources)
            raise
        return IndexScanStarted(
            scan_id=msg.scan_id,
            index_id=rec.id,
            desc=list(defn.desc),
            ts=None if ts is None else dict(ts.to_wire()),
            partitions=partitions,
        )

    async def _open(
        self,
        msg: IndexScan,
        base: ScanSlices,
        by_node: dict[str, list[int]],
        wait_for: Timestamp | None,
    ) -> tuple[Timestamp | None, list[InStream]]:
        """Open every node's stream; returns (the TS read, the streams)."""
        for attempt in range(OPEN_ATTEMPTS):
            pinned: Timestamp | None = None
            if msg.pinned is not None:
                pinned = Timestamp.from_wire(msg.pinned)
            elif base.stability and len(by_node) > 1:
                pinned = await self._phase_one(base.index_id, by_node, wait_for, msg.timeout)
            try:
                return await self._open_all(base, by_node, pinned)
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

    async def _phase_one(
        self,
        index_id: str,
        by_node: dict[str, list[int]],
        wait_for: Timestamp | None,
        timeout: float,
    ) -> Timestamp:
        wire = None if wait_for is None else dict(wait_for.to_wire())

        async def ask(node: str, parts: list[int]) -> Timestamp:
            req = WaitStability(index_id=index_id, partitions=parts, wait_for=wire, timeout=timeout)
            reply = await self.pool.request(
                self.view.address(node), req, timeout + RPC_MARGIN, expect=StabilityAt
            )
            return Timestamp.from_wire(reply.ts)

        tss = await asyncio.gather(*(ask(n, ps) for n, ps in by_node.items()))
        return oldest_common(list(tss))

    async def _open_all(
        self, base: ScanSlices, by_node: dict[str, list[int]], pinned: Timestamp | None
    ) -> tuple[Timestamp | None, list[InStream]]:
        sources: list[InStream] = []

        async def open_one(node: str, parts: list[int]) -> SlicesOpened:
            src = self.inboxes.open()
            sources.append(src)
            conn = await self.pool.get(self.view.address(node))
            src.attach(conn)
            req = _replace(
                base,
                scan_id=src.scan_id,
                partitions=parts,
                snapshot_ts=None if pinned is None else dict(pinned.to_wire()),
                wait_for=None if pinned is not None else base.wait_for,
            )
            return await conn.request(req, base.timeout + RPC_MARGIN, expect=SlicesOpened)

        try:
            replies = await asyncio.gather(*(open_one(n, ps) for n, ps in by_node.items()))
        except BaseException:
            await _cancel_all(sources)
            raise
        tss = [Timestamp.from_wire(r.ts) for r in replies if r.ts is not None]
        return (pinned if pinned is not None else (tss[0] if tss else None)), sources

    async def _stream(self, msg: IndexScan, sources: list[InStream], out: OutStream) -> None:
        try:
            combined = merge_ordered(sources, BLOCK_ROWS) if msg.ordered else interleave(sources)
            async with (
                contextlib.aclosing(combined) as blocks,
                contextlib.aclosing(window(blocks, msg.offset, msg.limit)) as rows,
            ):
                async for block in rows:
                    await out.send(block)
        finally:
            await _cancel_all(sources)


_MOVED: Final = frozenset({ErrorCode.STALE_TOPOLOGY, ErrorCode.INDEX_NOT_FOUND})


def _placement(index: str, topo: Topology, partitions: list[int]) -> dict[str, list[int]]:
    """Indexer node -> the index partitions it serves in ``topo``."""
    by_node: dict[str, list[int]] = {}
    for p in partitions:
        node = topo.assignment.get(p)
        if node is None:
            raise ShardexError(
                f"index partition {p} of {index!r} has no indexer in topology {topo.seq_num}",
                code=ErrorCode.INDEX_NOT_READY,
                details={"index": index, "partition": p},
            )
        by_node.setdefault(node, []).append(p)
    return by_node


def _replace(msg: ScanSlices, **changes: Any) -> ScanSlices:
    return msgspec.structs.replace(msg, **changes)


async def _cancel_all(sources: list[InStream]) -> None:
    await asyncio.gather(*(s.cancel() for s in sources), return_exceptions=True)
