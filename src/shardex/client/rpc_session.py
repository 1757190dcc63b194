"""The client's RPC machinery for shardex's own components: ``Client.rpc``.

The index pipeline (``shardex.pipeline``) talks to indexers, data nodes and the timekeeper
with messages the public API has no method for (deliveries, stabilise rounds, change
streams, build progress). It does so through the client it already holds, on the same loop
thread and the same connections as the client's own calls, but only through this narrow,
documented surface, never through the client's private parts. Users of the client have no
need of it.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine
from typing import TYPE_CHECKING, Any, TypeVar

from shardex.net.messages import Message

if TYPE_CHECKING:
    from shardex.client.routing import DataRouter
    from shardex.net import Connection

__all__ = ["RpcSession"]

T = TypeVar("T")
M = TypeVar("M", bound=Message)


class RpcSession:
    """The RPC parts of one ``Client``, handed over by the client itself (no reference back
    to it): its loop, its data router and connection pool, its connection to the node it
    talks to. Thread-safe as the client is."""

    __slots__ = ("_call", "_connection", "_ddl", "_is_closed", "_run", "loop", "router")

    def __init__(
        self,
        *,
        run: Callable[[Coroutine[Any, Any, Any]], Any],
        loop: asyncio.AbstractEventLoop,
        router: DataRouter,
        is_closed: Callable[[], bool],
        connection: Callable[[], Coroutine[Any, Any, Connection]],
        call: Callable[[Message, type[Any]], Any],
        ddl: Callable[[Message, type[Any]], Coroutine[Any, Any, Any]],
    ) -> None:
        self._run = run
        # The client's event loop (it runs on the client's thread): for callbacks scheduled
        # from other threads (``call_soon_threadsafe``) that must not wait for an answer.
        self.loop = loop
        # Named-node requests (``router.pool``, ``router.address``), keyspace topologies
        # (``router.keyspace``, ``router.refresh``): the client's own ``DataRouter``.
        self.router = router
        self._is_closed = is_closed
        self._connection = connection
        self._call = call
        self._ddl = ddl

    @property
    def closed(self) -> bool:
        """The client was closed: every ``run`` fails (CLIENT_CLOSED)."""
        return self._is_closed()

    def run(self, coro: Coroutine[Any, Any, T]) -> T:
        """Run ``coro`` on the client's loop and wait for its result in the calling thread
        (the hand-off every client call makes)."""
        result: T = self._run(coro)
        return result

    async def connection(self) -> Connection:
        """On the client's loop: the connection to the node the client talks to, reconnected
        (to the next address) if it is gone."""
        return await self._connection()

    def call(self, msg: Message, expect: type[M]) -> M:
        """One idempotent request to the node the client talks to (retried once on the next
        node if that one went away), from any thread."""
        reply: M = self._call(msg, expect)
        return reply

    async def ddl(self, msg: Message, expect: type[M]) -> M:
        """On the client's loop: a coordinator request carrying its request id, resent to the
        next node until one answers or refuses it (the retries of the client's index DDL)."""
        reply: M = await self._ddl(msg, expect)
        return reply
