"""Async core of the client's data path: topology cache, routing to owners, retries.

Runs on the client's private loop. The client keeps the manager state it last fetched
(``StateRequest`` through its control connection) and the member list's addresses
(``MembersRequest``); a document request goes straight to the node the keyspace's latest
topology names for ``partition_of(docid)``. A NOT_MY_PARTITION answer (stale topology, a
partition in hand-over, a node that has not opened its partitions yet) makes it refresh the
state and retry with exponential backoff, a bounded number of times.

Retry safety: a request is resent after a failure only when it cannot have been applied
(NOT_MY_PARTITION: the node refused it; no connection: it was never sent) or when it is
idempotent (reads). A mutation whose connection dies mid-flight raises: the client cannot
know whether it was applied, and resending an insert could report DOC_EXISTS for its own
write.

On TCP the sync client makes a document request's first attempt itself, from the calling
thread (``client/direct_kv.py``, with ``owner_address``), and hands anything this module
would retry to ``to_owner(..., after=...)``.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from operator import attrgetter
from typing import Any, TypeVar

from shardex.api.coordinator import StateReply, StateRequest
from shardex.api.data import StreamBatch, StreamEnd
from shardex.api.errors import WireError
from shardex.api.membership import MembersReply, MembersRequest
from shardex.api.validation import write_reply_timeout
from shardex.client.coalesce import WriteCoalescer, send_mutate_many
from shardex.core.topology import Topology
from shardex.errors import ErrorCode, NodeUnavailable, ShardexError
from shardex.meta.partitioning import partition_of
from shardex.meta.state import KeyspaceMeta, StateContext
from shardex.net import Connection, ConnectionPool
from shardex.net.credentials import Credentials
from shardex.net.credit_stream import Inboxes, InStream
from shardex.net.messages import Message
from shardex.net.transport import Transport

M = TypeVar("M", bound=Message)

SECTIONS = ["keyspaces", "data_topologies"]  # not the dedup table: it can be large
ROUTE_ATTEMPTS = 8  # with backoff 0.05 * 2^k capped at 1 s: about 4 s of trying
_RETRY_UNSENT = (ErrorCode.NODE_UNAVAILABLE,)
_RETRY_IDEMPOTENT = (
    ErrorCode.CONNECTION_CLOSED,
    ErrorCode.TIMEOUT,
    ErrorCode.SYNC_WRITE_IN_PROGRESS,
)
# Refusals that change nothing and mean "ask the current owner": a stale topology, a node
# failed over since (a replica was promoted in its place).
_RETRY_REFRESHED = (ErrorCode.NOT_MY_PARTITION, ErrorCode.NODE_FAILED_OVER)
# Failures of an owner after which the cached topology is refetched (``DataRouter.suspect``).
_SUSPECT = (ErrorCode.TIMEOUT, ErrorCode.CONNECTION_CLOSED)


def rerouted(code: ErrorCode, *, idempotent: bool) -> bool:
    """Whether ``to_partition`` answers an owner's error ``code`` with another attempt (a
    refresh of the topology, then the owner it names) rather than raising it: a refusal that
    applied nothing, or any failure of a read. The calling thread's requests
    (``client/direct_kv.py``) hand exactly these to the loop path."""
    if code in _RETRY_REFRESHED or code is ErrorCode.KEYSPACE_NOT_FOUND:
        return True
    return idempotent and code in _RETRY_IDEMPOTENT + _RETRY_UNSENT


Control = Callable[[Message, type[Any]], Awaitable[Any]]


def backoff(attempt: int) -> float:
    return min(0.05 * 2**attempt, 1.0)


class DataRouter:
    """Topology cache + connection pool to data nodes + stream inboxes."""

    def __init__(
        self,
        *,
        transport: Transport,
        secret: str | Credentials,
        name: str,
        control: Control,
        request_timeout: float,
        connect_timeout: float,
    ) -> None:
        self._control = control  # a request on the client's control connection (any node)
        self.request_timeout = request_timeout
        # Change streams' inboxes (``client/streams.py``): batches and ends by stream id.
        self.streams: Inboxes[InStream[StreamBatch | StreamEnd]] = Inboxes(
            new=InStream, key=attrgetter("stream_id"), lost=_stream_lost
        )
        handlers = self.streams.route(StreamBatch, StreamEnd)
        self.pool = ConnectionPool(
            transport, secret, name=name, connect_timeout=connect_timeout, handlers=handlers
        )
        self._state: StateContext | None = None
        self._forced: dict[str, Topology] = {}
        self._addresses: dict[str, str] = {}
        self._refreshing: asyncio.Lock | None = None
        self.refreshes = 0  # how often the topology was refetched (tests watch it)
        # Batched writes: one MutateMany in flight per node, later calls merged (coalesce.py).
        self.writes = WriteCoalescer(
            lambda node, keyspace, durability, timeout, ops: send_mutate_many(
                self, node, keyspace, durability, timeout, ops
            )
        )

    async def close(self) -> None:
        await self.writes.close()
        await self.pool.close()

    # --- state ------------------------------------------------------------------------------

    async def refresh(self) -> StateContext:
        """Fetch the manager state and member addresses; concurrent callers share one fetch."""
        if self._refreshing is None:
            self._refreshing = asyncio.Lock()
        seen = self.refreshes
        async with self._refreshing:
            if self.refreshes != seen and self._state is not None:
                return self._state  # someone refreshed while we waited
            reply = await self._control(StateRequest(sections=SECTIONS, fresh=True), StateReply)
            members = await self._control(MembersRequest(), MembersReply)
            self._addresses = {m.name: m.address for m in members.members}
            self._state = reply.state
            self._forced.clear()
            self.refreshes += 1
            return reply.state

    async def state(self) -> StateContext:
        return self._state if self._state is not None else await self.refresh()

    async def keyspace(self, name: str, *, refresh: bool = False) -> tuple[KeyspaceMeta, Topology]:
        state = await (self.refresh() if refresh else self.state())
        if name not in state.keyspaces and not refresh:
            state = await self.refresh()
        meta = state.keyspaces.get(name)
        history = state.data_topologies.get(name)
        if meta is None or not history:
            raise ShardexError(
                f"keyspace {name!r} not found",
                code=ErrorCode.KEYSPACE_NOT_FOUND,
                details={"keyspace": name},
            )
        return meta, self._forced.get(name, history[-1])

    def force_topology(self, keyspace: str, topology: Topology) -> None:
        """Pretend the cached topology is ``topology`` until the next refresh (tests)."""
        self._forced[keyspace] = topology

    def owner_address(self, keyspace: str, docid: str) -> str | None:
        """The address of ``docid``'s owner from the cached state alone, or None if that
        needs the loop (nothing cached for ``keyspace``, an unknown address). Safe from any
        thread: it only reads, one dict lookup at a time (atomic under the GIL), and a
        refresh replaces the state and the addresses whole."""
        state = self._state
        if state is None:
            return None
        meta = state.keyspaces.get(keyspace)
        history = state.data_topologies.get(keyspace)
        if meta is None or not history:
            return None
        forced = self._forced.get(keyspace)
        topo = forced if forced is not None else history[-1]
        node = topo.assignment.get(partition_of(docid, meta.num_partitions))
        return None if node is None else self._addresses.get(node)

    def suspect(self, exc: ShardexError) -> None:
        """After an owner's failure that may mean it is cut off (no answer in time, its
        connection lost), drop the cached state so the next request refetches the topology.
        A write that timed out is not resent (it may have applied), but without this every
        later write to that partition would go to the same silent node until something else
        refreshed: a node behind a cut link never answers NOT_MY_PARTITION once failed over.
        Safe from any thread: one attribute store."""
        if exc.code in _SUSPECT:
            self._state = None

    def forget(self, keyspace: str) -> None:
        if self._state is not None and keyspace in self._state.keyspaces:
            self._state = None

    async def address(self, node: str) -> str:
        addr = self._addresses.get(node)
        if addr is None:
            await self.refresh()
            addr = self._addresses.get(node)
        if addr is None:
            raise NodeUnavailable(f"node {node!r} is not a cluster member", details={"node": node})
        return addr

    # --- requests -------------------------------------------------------------------------------

    def write_timeout(self, durability_timeout: float | None) -> float | None:
        """Seconds to wait for a write's reply: None (``request_timeout``) unless the write's
        ``durability_timeout`` needs longer. The node answers DURABILITY_AMBIGUOUS when that
        ends, and that answer, not this client's own TIMEOUT, is what the caller should get:
        ``DURABILITY_REPLY_SLACK`` more."""
        timeout = write_reply_timeout(durability_timeout, self.request_timeout)
        return None if timeout == self.request_timeout else timeout

    async def to_node(self, node: str, msg: Message, expect: type[M]) -> M:
        conn = await self.pool.get(await self.address(node), self.request_timeout)
        return await conn.request(msg, self.request_timeout, expect=expect)

    async def to_owner(
        self,
        keyspace: str,
        docid: str,
        msg: Message,
        expect: type[M],
        *,
        idempotent: bool,
        after: ShardexError | None = None,
        timeout: float | None = None,
    ) -> M:
        """Send ``msg`` to the owner of ``docid``'s partition; re-route on NOT_MY_PARTITION.
        ``after``: a first attempt made elsewhere failed with this (see ``to_partition``).
        ``timeout``: seconds for each reply (None: ``request_timeout``)."""
        meta, _ = await self.keyspace(keyspace)
        partition = partition_of(docid, meta.num_partitions)
        return await self.to_partition(
            keyspace, partition, msg, expect, idempotent=idempotent, after=after, timeout=timeout
        )

    async def to_partition(
        self,
        keyspace: str,
        partition: int,
        msg: Message,
        expect: type[M],
        *,
        idempotent: bool,
        on_conn: Callable[[Connection], None] | None = None,
        after: ShardexError | None = None,
        timeout: float | None = None,
    ) -> M:
        """``msg`` to the owner of ``partition``, retried as the module says. ``after``: the
        first attempt was made by the caller (the calling thread's socket) and failed with
        this retryable error: carry on from the second, as if it had been this loop's."""
        last = after
        gone = after is not None and after.code is ErrorCode.KEYSPACE_NOT_FOUND
        for attempt in range(0 if after is None else 1, ROUTE_ATTEMPTS):
            if attempt:
                await asyncio.sleep(backoff(attempt - 1))
            _, topo = await self.keyspace(keyspace, refresh=attempt > 0 and last is not None)
            node = topo.assignment.get(partition)
            if node is None:
                raise ShardexError(
                    f"partition {partition} is not in topology {topo.seq_num} of {keyspace!r}",
                    code=ErrorCode.BAD_REQUEST,
                    details={"keyspace": keyspace, "partition": partition},
                )
            try:
                conn = await self.pool.get(await self.address(node), self.request_timeout)
            except ShardexError as exc:
                if exc.code not in _RETRY_UNSENT:
                    raise
                last = exc  # nothing was sent: safe to retry (the owner may be restarting)
                continue
            if on_conn is not None:
                on_conn(conn)
            try:
                return await conn.request(
                    msg, self.request_timeout if timeout is None else timeout, expect=expect
                )
            except ShardexError as exc:
                if exc.code is ErrorCode.KEYSPACE_NOT_FOUND:
                    # Our cached state still has it: dropped (the refresh raises), or dropped
                    # and re-created (the refresh finds the new incarnation). Once.
                    if gone:
                        raise
                    gone = True
                elif not rerouted(exc.code, idempotent=idempotent):
                    self.suspect(exc)
                    raise
                last = exc  # refused, nothing applied (a newer topology names another), or a read
                continue
        assert last is not None
        last.details.setdefault("attempts", ROUTE_ATTEMPTS)
        raise last

    async def to_any_copy(self, keyspace: str, docid: str, msg: Message, expect: type[M]) -> M:
        """``msg`` to every copy of ``docid``'s partition at once (the active and its
        replicas); the first answer wins. For reads that prefer availability to freshness."""
        meta, topo = await self.keyspace(keyspace)
        partition = partition_of(docid, meta.num_partitions)
        errors: list[ShardexError] = []

        async def ask(node: str) -> M:
            conn = await self.pool.get(await self.address(node), self.request_timeout)
            return await conn.request(msg, self.request_timeout, expect=expect)

        pending = {asyncio.ensure_future(ask(n)) for n in topo.chain(partition)}
        try:
            while pending:
                done, pending = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
                for task in done:
                    exc = task.exception()
                    if exc is None:
                        return task.result()
                    if not isinstance(exc, ShardexError):
                        raise exc
                    errors.append(exc)
        finally:
            for task in pending:
                task.cancel()
        found = [e for e in errors if e.code is ErrorCode.DOC_NOT_FOUND]
        raise (found or errors)[0]


def _stream_lost(stream_id: int, reason: ShardexError) -> StreamEnd:
    """The end a change stream gets when its connection dies: the connection's error."""
    code, message, details = reason.to_wire()
    return StreamEnd(stream_id=stream_id, error=WireError(code, message, details))
