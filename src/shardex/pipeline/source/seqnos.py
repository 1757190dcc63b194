"""The stream readers' high seqnos, asked of every owner directly.

``Client.high_seqnos`` sends one ``HighSeqnos`` to a data node, which gathers the answer
from every owner (a task on that node, a request to each other owner, their replies, then
its own reply): two hops in a row, and on the gathering node two turns of its event loop.
Measured inside the running pipeline at 5,000 writes/s (``docs/decisions/
0064-latestoffset-from-owners.md``), that RPC is most of Spark's latestOffset phase at a
batch's start, when the
nodes are busiest (the previous batch's round and read-ahead start at that moment).

Here the reader asks each owner for its own partitions in parallel, as a gathering node
would (``HighSeqnos.partitions`` set): each owner answers from memory. One hop, no task on
a gathering node, the same number of messages. Any partition missing from the answers (moved
meanwhile, an owner down, a keyspace re-created) makes the caller fall back to the gathered
RPC, which retries with a fresh state on the node; the client's topology is refreshed then
(at most once a second) so the next direct ask follows the move.

An owner that cannot be reached at all (a node killed, before failover moves its partitions):
``partial=True`` (``latestOffset``'s use) returns what the other owners answered once the
gathered RPC also failed, and the caller keeps those partitions where the stream already is
(a batch may cover fewer partitions, never a wrong range), instead of failing the query.

Freshness is the gathered RPC's: each owner reads its in-memory high seqnos after the
request reached it, i.e. after ``latestOffset`` was called, so every write acknowledged
before the call is covered (a write is acknowledged after its seqno is in memory).
"""

from __future__ import annotations

import asyncio
import contextlib
import time

from shardex.api.data import HighSeqnos, HighSeqnosReply
from shardex.client import Client
from shardex.core.timestamp import Timestamp
from shardex.errors import ErrorCode, ShardexError
from shardex.net import Message

REFRESH_EVERY = 1.0  # seconds: at most one topology refresh per fallback burst
# What a down owner looks like to the gathered RPC (no node could answer for its partitions).
_UNREACHABLE = frozenset(
    {
        ErrorCode.NODE_UNAVAILABLE,
        ErrorCode.CONNECTION_CLOSED,
        ErrorCode.TIMEOUT,
        ErrorCode.NOT_MY_PARTITION,
    }
)


class OwnerSeqnos:
    """``high_seqnos`` for one keyspace: direct to the owners, the gathered RPC as fallback."""

    def __init__(self, client: Client, keyspace: str) -> None:
        self._client = client
        self.keyspace = keyspace
        self.direct = 0  # answers from the owners (tests and stats)
        self.fallbacks = 0  # answers from the gathered RPC
        self.partial = 0  # answers missing an unreachable owner's partitions (``partial``)
        self._refreshed = 0.0

    def __call__(self, *, partial: bool = False) -> Timestamp:
        """Every partition's high (seqno, uuid). ``partial``: when some owner cannot be
        reached by either way of asking, the partitions the others answered (the gathered
        RPC's error otherwise)."""
        client = self._client
        answered: dict[int, tuple[int, int]] = {}
        try:
            ts = client.rpc.run(self._ask_owners(answered))
        except ShardexError:
            ts = None
        if ts is not None:
            self.direct += 1
            return ts
        self.fallbacks += 1
        now = time.monotonic()
        if now - self._refreshed > REFRESH_EVERY:
            self._refreshed = now
            with contextlib.suppress(ShardexError):
                client.rpc.run(client.rpc.router.refresh())
        try:
            return client.high_seqnos(self.keyspace)
        except ShardexError as exc:
            if not partial or exc.code not in _UNREACHABLE or not answered:
                raise
            self.partial += 1
            return Timestamp.from_wire(answered)

    async def _ask_owners(self, answered: dict[int, tuple[int, int]]) -> Timestamp | None:
        """Every partition's (seqno, uuid) from its owner, or None if any is missing (what
        the owners that did answer said is left in ``answered``)."""
        router = self._client.rpc.router
        _, topo = await router.keyspace(self.keyspace)
        by_node: dict[str, list[int]] = {}
        for p, node in topo.assignment.items():
            by_node.setdefault(node, []).append(p)

        # Sent at once on each owner's pooled connection, as futures: no task per request
        # (this runs per trigger, several times a second, in Spark's runner process).
        asks: list[asyncio.Future[Message]] = []
        missing = False
        for node, parts in by_node.items():
            try:
                conn = await router.pool.get(await router.address(node), router.request_timeout)
            except ShardexError:  # unreachable: the others are still asked
                missing = True
                continue
            msg = HighSeqnos(keyspace=self.keyspace, partitions=sorted(parts))
            asks.append(conn.request_future(msg, router.request_timeout))
        replies = await asyncio.gather(*asks, return_exceptions=True)
        for reply in replies:
            if isinstance(reply, ShardexError):
                missing = True
                continue
            if isinstance(reply, BaseException):
                raise reply
            if not isinstance(reply, HighSeqnosReply):
                missing = True  # not what an owner answers: let the gathered RPC decide
                continue
            answered.update(reply.entries)
        if missing or len(answered) != len(topo.assignment):
            return None
        return Timestamp.from_wire(answered)
