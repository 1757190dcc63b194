"""The stream readers' high seqnos, asked of every owner directly.

``Client.high_seqnos`` sends one ``HighSeqnos`` to a data node, which gathers the answer
from every owner (a task on that node, a request to each other owner, their replies, then
its own reply): two hops in a row, and on the gathering node two turns of its event loop.
Measured inside the running pipeline at 5,000 writes/s (``docs/decisions.md``, "latestOffset
and planning"), that RPC is most of Spark's latestOffset phase at a batch's start, when the
nodes are busiest (the previous batch's round and read-ahead start at that moment).

Here the reader asks each owner for its own partitions in parallel, as a gathering node
would (``HighSeqnos.partitions`` set): each owner answers from memory. One hop, no task on
a gathering node, the same number of messages. Any partition missing from the answers (moved
meanwhile, an owner down, a keyspace re-created) makes the caller fall back to the gathered
RPC, which retries with a fresh state on the node; the client's topology is refreshed then
(at most once a second) so the next direct ask follows the move.

Freshness is the gathered RPC's: each owner reads its in-memory high seqnos after the
request reached it, i.e. after ``latestOffset`` was called, so every write acknowledged
before the call is covered (a write is acknowledged after its seqno is in memory).
"""

from __future__ import annotations

import asyncio
import contextlib
import time

from shardex.client import Client
from shardex.core.timestamp import Timestamp
from shardex.data.messages import HighSeqnos, HighSeqnosReply
from shardex.errors import ShardexError
from shardex.net import Message

REFRESH_EVERY = 1.0  # seconds: at most one topology refresh per fallback burst


class OwnerSeqnos:
    """``high_seqnos`` for one keyspace: direct to the owners, the gathered RPC as fallback."""

    def __init__(self, client: Client, keyspace: str) -> None:
        self._client = client
        self.keyspace = keyspace
        self.direct = 0  # answers from the owners (tests and stats)
        self.fallbacks = 0  # answers from the gathered RPC
        self._refreshed = 0.0

    def __call__(self) -> Timestamp:
        client = self._client
        try:
            ts = client._run(self._ask_owners())
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
                client._run(client._router.refresh())
        return client.high_seqnos(self.keyspace)

    async def _ask_owners(self) -> Timestamp | None:
        """Every partition's (seqno, uuid) from its owner, or None if any is missing."""
        router = self._client._router
        _, topo = await router.keyspace(self.keyspace)
        by_node: dict[str, list[int]] = {}
        for p, node in topo.assignment.items():
            by_node.setdefault(node, []).append(p)

        # Sent at once on each owner's pooled connection, as futures: no task per request
        # (this runs per trigger, several times a second, in Spark's runner process).
        asks: list[asyncio.Future[Message]] = []
        try:
            for node, parts in by_node.items():
                conn = await router.pool.get(await router.address(node), router.request_timeout)
                msg = HighSeqnos(keyspace=self.keyspace, partitions=sorted(parts))
                asks.append(conn.request_future(msg, router.request_timeout))
        except ShardexError:
            for f in asks:
                f.cancel()
            return None
        replies = await asyncio.gather(*asks, return_exceptions=True)
        entries: dict[int, tuple[int, int]] = {}
        for reply in replies:
            if isinstance(reply, ShardexError):
                return None
            if isinstance(reply, BaseException):
                raise reply
            if not isinstance(reply, HighSeqnosReply):
                return None  # not what an owner answers: let the gathered RPC decide
            entries.update(reply.entries)
        if len(entries) != len(topo.assignment):
            return None
        return Timestamp.from_wire(entries)
