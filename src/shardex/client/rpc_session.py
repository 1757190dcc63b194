"""The client's RPC session: its loop thread, its connection to a node, failover, the data
router. ``Client.rpc``.

Everything a ``Client`` sends goes through one ``RpcSession``, and so does everything the
client's own modules send (``Keyspace``, scans, queries, index DDL, rebalance): they are
handed the session, never the ``Client``. shardex's own components use it too: the index
pipeline (``shardex.pipeline``) talks to indexers, data nodes and the timekeeper with
messages the public API has no method for (deliveries, stabilise rounds, change streams,
build progress), on the same loop thread and connections as the client's calls. Users of
the client have no need of it.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable, Coroutine, Sequence
from typing import Any, TypeVar

from shardex.client.loop_thread import LoopThread
from shardex.client.routing import DataRouter
from shardex.errors import (
    AuthFailed,
    ConfigError,
    ConnectionClosed,
    NodeUnavailable,
    RequestTimeout,
    ShardexError,
)
from shardex.net import Connection
from shardex.net import connect as rpc_connect
from shardex.net.credentials import Credentials
from shardex.net.messages import Message
from shardex.net.transport import Transport

__all__ = ["DDL_ATTEMPT_TIMEOUT", "DEFAULT_DDL_TIMEOUT", "RETRYABLE", "RpcSession", "client_closed"]

T = TypeVar("T")
M = TypeVar("M", bound=Message)

DEFAULT_DDL_TIMEOUT = 60.0
DDL_ATTEMPT_TIMEOUT = 30.0  # > the coordinator's failover wait (op_timeout) + allocation
# NodeUnavailable reasons after which a DDL's outcome is unknown: send it again.
_DDL_RETRY_REASONS = frozenset({"no_master", "not_master", "commit_failed", "deposed", None})

# Failures that say "this node, now" rather than "this request": worth trying another node.
RETRYABLE = (NodeUnavailable, ConnectionClosed, RequestTimeout)


def client_closed() -> ConnectionClosed:
    """What any call on a closed client raises (``RpcSession.run`` and both scan paths)."""
    return ConnectionClosed("client is closed", details={"hint": "create a new client"})


class RpcSession:
    """The connection side of one ``Client``: a loop thread, the connection to the node the
    client talks to (``addresses[current]``, the next one on failure), the data router and
    its pool. Thread-safe: calls from several threads run concurrently on the loop.

    ``transport``, ``secret``, ``name`` and ``connect_timeout`` are what the client's other
    connections (its scan sockets) are opened with."""

    def __init__(
        self,
        addresses: Sequence[str],
        secret: str | Credentials,
        *,
        name: str,
        connect_timeout: float,
        request_timeout: float,
        transport: Transport,
    ) -> None:
        self.addresses = list(addresses)
        self.secret = secret
        self.name = name
        self.connect_timeout = connect_timeout
        self.request_timeout = request_timeout
        self.ddl_timeout = DEFAULT_DDL_TIMEOUT
        self.transport = transport
        self.current = 0  # index into addresses of the node we talk to
        # Set once by ``close``; every ``run`` then fails (CLIENT_CLOSED). A plain attribute:
        # the calling-thread scan path reads it per block.
        self.closed = False
        self._conn: Connection | None = None
        self._reconnecting: asyncio.Lock | None = None  # created on the loop
        self._io = LoopThread(f"shardex-client-{name}")
        # The event loop (it runs on the session's thread): for callbacks scheduled from
        # other threads (``call_soon_threadsafe``) that must not wait for an answer.
        self.loop = self._io.loop
        # Named-node requests (``router.pool``, ``router.address``, ``router.to_node``),
        # documents by owner (``router.to_owner``), keyspace topologies (``router.keyspace``,
        # ``router.refresh``).
        self.router = DataRouter(
            transport=transport,
            secret=secret,
            name=name,
            control=lambda msg, expect: self.request(msg, expect, True),
            request_timeout=request_timeout,
            connect_timeout=connect_timeout,
        )

    # -- lifecycle --

    def connect(self) -> None:
        """Connect to the first reachable address (NodeUnavailable if none is)."""
        self._io.run(self._connect_any(self.current), timeout=None)

    async def _connect_any(self, start: int) -> None:
        """Connect to the first reachable address, starting at ``start`` and wrapping."""
        errors: dict[str, str] = {}
        n = len(self.addresses)
        for k in range(n):
            i = (start + k) % n
            address = self.addresses[i]
            try:
                conn = await rpc_connect(
                    self.transport,
                    address,
                    self.secret,
                    name=self.name,
                    timeout=self.connect_timeout,
                )
            except (AuthFailed, ConfigError):
                raise  # a wrong or empty secret: another node will not help
            except ShardexError as e:
                errors[address] = str(e)
                continue
            self._conn, self.current = conn, i
            return
        raise NodeUnavailable(
            f"no shardex node reachable (tried {', '.join(self.addresses)})",
            details={"errors": errors},
        )

    def close(
        self,
        *,
        first: Callable[[], None] | None = None,
        on_loop: Callable[[], Coroutine[Any, Any, None]] | None = None,
    ) -> None:
        """Close the router's and the node's connections and stop the thread. Idempotent.
        ``first`` runs once the session is marked closed, before anything is shut (the
        calling-thread scan sockets); ``on_loop`` runs on the loop after the router's pool
        has closed (the scan pool)."""
        if self.closed:
            return
        self.closed = True
        if first is not None:
            first()
        conn, self._conn = self._conn, None
        with contextlib.suppress(Exception):
            self._io.run(self.router.close(), timeout=5)
        if on_loop is not None:
            with contextlib.suppress(Exception):
                self._io.run(on_loop(), timeout=5)
        if conn is not None:
            with contextlib.suppress(Exception):
                self._io.run(conn.close(), timeout=5)
        self._io.stop()

    @property
    def connected_address(self) -> str | None:
        conn = self._conn
        return None if conn is None or conn.closed else self.addresses[self.current]

    # -- calls --

    def run(self, coro: Coroutine[Any, Any, T]) -> T:
        """Run ``coro`` on the loop and wait for its result in the calling thread (the
        hand-off every client call makes)."""
        if self.closed:
            coro.close()
            raise client_closed()
        return self._io.run(coro)

    def run_soon(self, coro: Coroutine[Any, Any, Any]) -> None:
        """Start ``coro`` on the loop without waiting for it (it handles its own errors):
        work the caller's next calls may use but this one need not wait for."""
        if self.closed:
            coro.close()
            return
        self._io.run_soon(coro)

    async def connection(self, failed: Connection | None = None) -> Connection:
        """On the loop: the connection to the node the client talks to, or a new one if it
        is gone (or is ``failed``: then to the next address); one reconnect at a time, so
        concurrent callers share it instead of racing."""
        if self._reconnecting is None:
            self._reconnecting = asyncio.Lock()
        async with self._reconnecting:
            conn = self._conn
            if conn is not None and not conn.closed and conn is not failed:
                return conn
            start = self.current
            if conn is not None and conn is failed:
                conn.abort()
                start += 1  # that node just failed us: begin with the next one
            await self._connect_any(start)
            assert self._conn is not None
            return self._conn

    async def request(self, msg: Message, expect: type[M], idempotent: bool) -> M:
        """On the loop: one request to the node the client talks to; if ``idempotent``,
        once more to the next node when that one went away (or hung)."""
        conn = await self.connection()
        try:
            return await conn.request(msg, self.request_timeout, expect=expect)
        except RETRYABLE:
            if not idempotent:
                raise
        conn = await self.connection(failed=conn)
        return await conn.request(msg, self.request_timeout, expect=expect)

    def call(self, msg: Message, expect: type[M], *, idempotent: bool = True) -> M:
        """``request`` from any thread."""
        return self.run(self.request(msg, expect, idempotent))

    async def ddl(self, msg: Message, expect: type[M]) -> M:
        """On the loop: a coordinator request carrying its request id, resent to the next
        node until one answers or refuses it, or ``ddl_timeout`` passes.

        A DDL call may outlive its node: the coordinator waits up to ~11 s for a new master
        during a failover, and a CREATE then allocates slices on every indexer. So each
        attempt has its own timeout (``DDL_ATTEMPT_TIMEOUT``, above the request timeout)
        and, when the outcome is unknown (connection lost, timeout, no master yet, commit
        failed), the *same* message goes again: the coordinator applies a request id once
        and returns its stored reply to a repeat, so a retried CREATE never creates twice.
        Refusals (INDEX_EXISTS, BAD_REQUEST, an allocation failure, ...) are raised at once."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + max(self.ddl_timeout, self.request_timeout)
        conn: Connection | None = None
        while True:
            try:
                if conn is None:
                    conn = await self.connection()
                remaining = deadline - loop.time()
                attempt = max(self.request_timeout, min(DDL_ATTEMPT_TIMEOUT, remaining))
                return await conn.request(msg, attempt, expect=expect)
            except (ConnectionClosed, RequestTimeout, NodeUnavailable) as exc:
                if isinstance(exc, NodeUnavailable) and exc.details.get("reason") not in (
                    _DDL_RETRY_REASONS
                ):
                    raise
                if loop.time() + 0.5 >= deadline:
                    raise
            await asyncio.sleep(0.5)
            try:
                conn = await self.connection(failed=conn)  # the next node
            except ShardexError:
                conn = None
