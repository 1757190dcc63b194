"""One round of ``ScanSlices`` of a scan: every indexer node's slices opened at once
(scan-request flow step 10), this node's own in-process.

``SliceOpens.run`` answers, per node, (node, the TS it read - encoded, as its reply carried
it or as the local slices' snapshot caches it -, its stream). When every other node has a
live pooled connection (the common case), their requests are sent at once without a task
per node (``Connection.request_future``), this node's slices are read in the scan's own
task meanwhile (the round trips overlap the local read), and the replies are taken as they
came. Otherwise each node is opened in a task of its own, connecting as needed. Either way
the first failure cancels the requests still out and every stream opened (a late reply
would leave its stream waiting for credit on the indexer), and a failure an indexer's copy
may stand in for names the node (``failover.failed_node``). With a ``SeqnoRide`` the nodes
of its plan read their high seqnos too, into ``ride.got``.
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, Any, Final

import msgspec

from shardex.api.scan import ScanSlices, SlicesOpened, packed_ts
from shardex.api.scan_streams import Inboxes, InStream, LocalStream, Source, cancel_all
from shardex.errors import ProtocolError, ShardexError
from shardex.net import Connection, ConnectionPool, Message
from shardex.scan.cluster_view import ClusterView
from shardex.scan.failover import FAILOVER, Resumable
from shardex.scan.request_plus import SeqnoRide

if TYPE_CHECKING:
    from shardex.index.scan_server import IndexScanServer

__all__ = ["RPC_MARGIN", "Opened", "PackedTs", "SliceOpens"]

RPC_MARGIN: Final = 10.0  # beyond the scan's own wait timeout

# A stability TS as the coordinator holds it: encoded (``Timestamp.packed``, canonical, so
# equal bytes are equal TSs), None for the tips (``scan_ts``).
PackedTs = bytes | None
# One node's open: (node, the TS it read, its stream).
Opened = tuple[str, PackedTs, Source]


class SliceOpens:
    """The opens of one round: ``base`` (the timeout already cut to what is left) with
    ``snapshot_ts`` / ``wait_for`` set per the pinned TS; ``sources`` collects every stream
    opened, so a failure can cancel them all."""

    def __init__(
        self,
        *,
        name: str,
        local_index: IndexScanServer | None,
        inboxes: Inboxes,
        pool: ConnectionPool,
        view: ClusterView,
        base: ScanSlices,
        snapshot_ts: dict[int, Any] | None,
        ride: SeqnoRide | None,
    ) -> None:
        self.name = name
        self.local_index = local_index
        self.inboxes = inboxes
        self.pool = pool
        self.view = view
        self.base = base
        self.snapshot_ts = snapshot_ts
        self.wait_for = None if snapshot_ts is not None else base.wait_for
        self.ride = ride
        self.sources: list[Source] = []

    async def run(self, by_node: dict[str, list[int]]) -> list[Opened]:
        try:
            if len(by_node) == 1:  # one node (a single-slice scan): no task to run it in
                [(node, parts)] = by_node.items()
                return [await self._one(node, parts, alone=True)]
            conns = self._live_conns(by_node)
            if conns is not None:
                return await self._sent(by_node, conns)
            return await self._in_tasks(by_node)
        except BaseException:
            await cancel_all(self.sources)
            raise

    def _is_local(self, node: str) -> bool:
        return node == self.name and self.local_index is not None

    def _live_conns(self, by_node: dict[str, list[int]]) -> dict[str, Connection] | None:
        """The live pooled connection of every other node of ``by_node``, or None when one
        has none yet (or its address is unknown): the opens then run in tasks."""
        pooled = self.pool.connections
        conns: dict[str, Connection] = {}
        for node in by_node:
            if self._is_local(node):
                continue
            try:
                conn = pooled.get(self.view.address(node))
            except ShardexError:
                return None
            if conn is None:
                return None
            conns[node] = conn
        return conns

    async def _sent(
        self, by_node: dict[str, list[int]], conns: dict[str, Connection]
    ) -> list[Opened]:
        """Every other node's request sent now, the local slices read meanwhile, then the
        replies as they came."""
        sent: list[tuple[str, list[int], InStream, asyncio.Future[Message]]] = []
        try:
            for node, conn in conns.items():
                parts = by_node[node]
                stream, req = self._request(node, parts)
                stream.attach(conn)
                try:
                    fut = conn.request_future(req, req.timeout + RPC_MARGIN)
                except ShardexError as exc:
                    raise _named(exc, node) from None
                sent.append((node, parts, stream, fut))
            opened: dict[str, Opened] = {}
            if self.name in by_node and self.name not in conns:
                opened[self.name] = await self._local(by_node[self.name])
            futs = [fut for *_, fut in sent]
            if futs:
                await asyncio.wait(futs, return_when=asyncio.FIRST_EXCEPTION)
            for node, *_, fut in sent:
                exc = None if not fut.done() or fut.cancelled() else fut.exception()
                if isinstance(exc, ShardexError):
                    raise _named(exc, node)
                if exc is not None:
                    raise exc
            for node, parts, stream, fut in sent:
                opened[node] = self._opened(node, parts, stream, fut.result())
            return [opened[node] for node in by_node]
        except BaseException:
            for *_, fut in sent:
                fut.cancel()
            raise

    async def _in_tasks(self, by_node: dict[str, list[int]]) -> list[Opened]:
        tasks = [asyncio.ensure_future(self._one(n, ps)) for n, ps in by_node.items()]
        try:
            if tasks:
                await asyncio.wait(tasks, return_when=asyncio.FIRST_EXCEPTION)
            for t in tasks:
                if t.done() and not t.cancelled() and t.exception() is not None:
                    raise t.exception()  # type: ignore[misc]
            return [t.result() for t in tasks]
        except BaseException:
            for t in tasks:
                t.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            raise

    async def _one(self, node: str, parts: list[int], alone: bool = False) -> Opened:
        if self._is_local(node):
            if not alone:
                # The local read runs on this loop without yielding (a 100-row scan: a
                # millisecond or two): the other opens (tasks) send first, so their round
                # trips overlap it.
                await asyncio.sleep(0)
            return await self._local(parts)
        stream, req = self._request(node, parts)
        try:
            conn = await self.pool.get(self.view.address(node))
            stream.attach(conn)
            reply = await conn.request(req, req.timeout + RPC_MARGIN, expect=SlicesOpened)
        except ShardexError as exc:
            raise _named(exc, node) from None
        return self._opened(node, parts, stream, reply)

    async def _local(self, parts: list[int]) -> Opened:
        assert self.local_index is not None
        req = _replace(
            self.base, partitions=parts, snapshot_ts=self.snapshot_ts, wait_for=self.wait_for
        )
        # ``timeout`` rather than ``wait_for``: no task per scan for the bound.
        async with asyncio.timeout(req.timeout + RPC_MARGIN):
            reply, rest, local_ts = await self.local_index.open_local(req)
        src = LocalStream(reply.entries, rest)
        self.sources.append(src)
        if self.ride is not None:
            self.ride.snapshot = local_ts  # checked against the seqnos without decoding
        # The snapshot's own TS object, its encoding cached on it: no wire round trip, and
        # encoded once per snapshot rather than per scan.
        return self.name, None if local_ts is None else local_ts.packed(), src

    def _request(self, node: str, parts: list[int]) -> tuple[InStream, ScanSlices]:
        """The stream the node's blocks will arrive on (opened before the request is sent:
        blocks may overtake the reply) and the request."""
        stream = self.inboxes.open()
        self.sources.append(stream)
        ride = self.ride
        seqnos_of = ride.plan.get(node) if ride is not None else None
        req = _replace(
            self.base,
            scan_id=stream.scan_id,
            partitions=parts,
            snapshot_ts=self.snapshot_ts,
            wait_for=self.wait_for,
            seqnos_keyspace=ride.keyspace if ride is not None and seqnos_of else "",
            seqnos_of=seqnos_of or [],
        )
        return stream, req

    def _opened(self, node: str, parts: list[int], stream: InStream, reply: Message) -> Opened:
        if not isinstance(reply, SlicesOpened):
            raise ProtocolError(
                f"{node} answered ScanSlices with {type(reply).__name__}, expected SlicesOpened",
                details={"type": "ScanSlices", "got": type(reply).__name__},
            )
        stream.put_head(reply.entries, reply.done)
        if self.ride is not None and reply.high_seqnos:
            self.ride.got.update(reply.high_seqnos)
        src = Resumable(node, parts, stream, self.base.limit)  # armed once streaming
        return node, packed_ts(reply.ts), src  # kept encoded (``scan_ts``)


def _named(exc: ShardexError, node: str) -> ShardexError:
    """``exc`` of an indexer's open, naming ``node`` when another copy may stand in
    (``failover.failed_node``)."""
    if exc.code in FAILOVER:
        exc.details.setdefault("indexer", node)
    return exc


def _replace(msg: ScanSlices, **changes: Any) -> ScanSlices:
    return msgspec.structs.replace(msg, **changes)
