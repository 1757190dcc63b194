"""The synchronous Python client.

Users call plain methods; underneath, an asyncio loop runs in a background thread owned by
the client and every call is a coroutine submitted to it (``run_coroutine_threadsafe``). The
network code is therefore the same async code the nodes use, and the user never sees a loop.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import threading
from collections.abc import Coroutine, Sequence
from pathlib import Path
from types import TracebackType
from typing import Any, TypeVar

from shardex.client.types import ClusterStatus, NodeStatus, cluster_status_from, node_status_from
from shardex.errors import (
    AuthFailed,
    ConfigError,
    ConnectionClosed,
    NodeUnavailable,
    RequestTimeout,
    ShardexError,
)
from shardex.manager.membership import MembersReply, MembersRequest
from shardex.net import Connection
from shardex.net import connect as rpc_connect
from shardex.net.messages import Message
from shardex.net.tcp import TcpTransport
from shardex.net.transport import Transport
from shardex.node.server import StatusReply, StatusRequest

T = TypeVar("T")
M = TypeVar("M", bound=Message)

DEFAULT_CONNECT_TIMEOUT = 5.0
DEFAULT_REQUEST_TIMEOUT = 10.0

# Failures that say "this node, now" rather than "this request": worth trying another node.
_RETRYABLE = (NodeUnavailable, ConnectionClosed, RequestTimeout)


class _LoopThread:
    """A private event loop on a daemon thread."""

    def __init__(self, name: str) -> None:
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        asyncio.set_event_loop(self.loop)
        self.loop.run_forever()

    def run(self, coro: Coroutine[Any, Any, T], timeout: float | None = None) -> T:
        fut = asyncio.run_coroutine_threadsafe(coro, self.loop)
        try:
            return fut.result(timeout)
        except concurrent.futures.TimeoutError:
            fut.cancel()
            raise RequestTimeout(
                f"client call did not finish within {timeout}s", details={"timeout": timeout}
            ) from None
        except BaseException:
            fut.cancel()  # e.g. KeyboardInterrupt in the caller: do not leave work running
            raise

    def stop(self) -> None:
        if self.loop.is_closed():
            return

        async def cancel_rest() -> None:
            # Reader tasks of aborted connections etc.: end them here, not in a GC warning.
            me = asyncio.current_task()
            rest = [t for t in asyncio.all_tasks() if t is not me]
            for t in rest:
                t.cancel()
            await asyncio.gather(*rest, return_exceptions=True)

        with contextlib.suppress(Exception):
            self.run(cancel_rest(), timeout=5)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(timeout=5)
        if not self._thread.is_alive():
            self.loop.close()


class Client:
    """A connection to a shardex cluster through one node, failing over to the others.

    Build it with ``connect`` or ``connect_local``. Thread-safe: calls from several threads
    run concurrently on the client's loop. Use as a context manager or call ``close()``."""

    def __init__(
        self,
        addresses: Sequence[str],
        secret: str,
        *,
        name: str = "shardex-client",
        connect_timeout: float = DEFAULT_CONNECT_TIMEOUT,
        request_timeout: float = DEFAULT_REQUEST_TIMEOUT,
        transport: Transport | None = None,
    ) -> None:
        if not addresses:
            raise ConfigError("no node address given", details={"hint": "pass host:port"})
        self.addresses = list(addresses)
        self.name = name
        self.connect_timeout = connect_timeout
        self.request_timeout = request_timeout
        self._secret = secret
        self._transport = transport or TcpTransport()
        self._conn: Connection | None = None
        self._current = 0  # index into addresses of the node we talk to
        self._closed = False
        self._reconnecting: asyncio.Lock | None = None  # created on the client's loop
        self._io = _LoopThread(f"shardex-client-{name}")

    # -- lifecycle --

    def _connect(self) -> None:
        try:
            self._io.run(self._connect_any(self._current), timeout=None)
        except BaseException:
            self.close()
            raise

    async def _connect_any(self, start: int) -> None:
        """Connect to the first reachable address, starting at ``start`` and wrapping."""
        errors: dict[str, str] = {}
        n = len(self.addresses)
        for k in range(n):
            i = (start + k) % n
            address = self.addresses[i]
            try:
                conn = await rpc_connect(
                    self._transport,
                    address,
                    self._secret,
                    name=self.name,
                    timeout=self.connect_timeout,
                )
            except (AuthFailed, ConfigError):
                raise  # a wrong or empty secret: another node will not help
            except ShardexError as e:
                errors[address] = str(e)
                continue
            self._conn, self._current = conn, i
            return
        raise NodeUnavailable(
            f"no shardex node reachable (tried {', '.join(self.addresses)})",
            details={"errors": errors},
        )

    def close(self) -> None:
        """Close the connection and stop the client's thread. Idempotent."""
        if self._closed:
            return
        self._closed = True
        conn, self._conn = self._conn, None
        if conn is not None:
            with contextlib.suppress(Exception):
                self._io.run(conn.close(), timeout=5)
        self._io.stop()

    def __enter__(self) -> Client:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def __repr__(self) -> str:
        where = self.connected_address or "not connected"
        return f"<shardex.Client {self.name} -> {where}>"

    @property
    def connected_address(self) -> str | None:
        conn = self._conn
        return None if conn is None or conn.closed else self.addresses[self._current]

    # -- calls --

    async def _live_conn(self, failed: Connection | None = None) -> Connection:
        """The current connection, or a new one if it is gone (or is ``failed``); one
        reconnect at a time, so concurrent callers share it instead of racing."""
        if self._reconnecting is None:
            self._reconnecting = asyncio.Lock()
        async with self._reconnecting:
            conn = self._conn
            if conn is not None and not conn.closed and conn is not failed:
                return conn
            start = self._current
            if conn is not None and conn is failed:
                conn.abort()
                start += 1  # that node just failed us: begin with the next one
            await self._connect_any(start)
            assert self._conn is not None
            return self._conn

    async def _request(self, msg: Message, expect: type[M], idempotent: bool) -> M:
        conn = await self._live_conn()
        try:
            return await conn.request(msg, self.request_timeout, expect=expect)
        except _RETRYABLE:
            if not idempotent:
                raise
        # The node went away (or hung): move to the next one and try once more.
        conn = await self._live_conn(failed=conn)
        return await conn.request(msg, self.request_timeout, expect=expect)

    def _call(self, msg: Message, expect: type[M], *, idempotent: bool = True) -> M:
        if self._closed:
            raise ConnectionClosed("client is closed", details={"hint": "create a new client"})
        return self._io.run(self._request(msg, expect, idempotent))

    def ping(self) -> NodeStatus:
        """Authenticated round trip to the connected node; returns who answered and how fast."""

        async def go() -> tuple[StatusReply, float]:
            loop = asyncio.get_running_loop()
            start = loop.time()
            reply = await self._request(StatusRequest(), StatusReply, idempotent=True)
            return reply, loop.time() - start

        if self._closed:
            raise ConnectionClosed("client is closed", details={"hint": "create a new client"})
        reply, rtt = self._io.run(go())
        return node_status_from(reply, rtt)

    def cluster_status(self) -> ClusterStatus:
        """The membership view (members, up/down, versions) of the connected node."""
        return cluster_status_from(self._call(MembersRequest(), MembersReply))


def connect(
    address: str | Sequence[str],
    *,
    secret: str,
    name: str = "shardex-client",
    connect_timeout: float = DEFAULT_CONNECT_TIMEOUT,
    request_timeout: float = DEFAULT_REQUEST_TIMEOUT,
) -> Client:
    """Connect to a node (or the first reachable of several addresses)."""
    addresses = [address] if isinstance(address, str) else list(address)
    client = Client(
        addresses,
        secret,
        name=name,
        connect_timeout=connect_timeout,
        request_timeout=request_timeout,
    )
    client._connect()
    return client


def connect_local(
    cluster_dir: str | Path,
    *,
    name: str = "shardex-client",
    connect_timeout: float = DEFAULT_CONNECT_TIMEOUT,
    request_timeout: float = DEFAULT_REQUEST_TIMEOUT,
) -> Client:
    """Connect to the local cluster in ``cluster_dir`` (made by ``shardex cluster start``):
    reads cluster.json and the secret, connects to the first live node, then the next."""
    from shardex.node import cluster_dir as cdir

    path = Path(cluster_dir)
    spec = cdir.load(path)
    return connect(
        [n.address for n in spec.nodes],
        secret=cdir.read_secret(path, spec),
        name=name,
        connect_timeout=connect_timeout,
        request_timeout=request_timeout,
    )
