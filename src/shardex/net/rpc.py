"""The RPC layer's public API: servers, outgoing connections and the connection pool.

Everything above the transport seam: ``RpcServer`` accepts and authenticates connections and
routes their messages; ``connect`` opens one authenticated ``Connection``; ``ConnectionPool``
keeps one live connection per address. The ``Connection`` itself (symmetric request/response
and one-way messaging) lives in ``shardex.net.connection`` and is re-exported here.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping
from typing import Any, TypeVar, overload

from shardex.errors import AuthFailed, ConnectionClosed, ErrorCode, NodeUnavailable, ShardexError
from shardex.net.auth import (
    DEFAULT_AUTH_TIMEOUT,
    LoginObserver,
    check_secret,
    client_handshake,
    server_handshake,
)
from shardex.net.connection import (
    DEFAULT_REQUEST_TIMEOUT,
    CloseCallback,
    Connection,
    Handler,
    Router,
    as_router,
)
from shardex.net.credentials import (
    Authorizer,
    Credentials,
    NodeSecret,
    Principal,
    UserDirectory,
)
from shardex.net.messages import Envelope, ErrorReply, Kind, Message, encode_frame
from shardex.net.transport import Comm, Listener, Transport

log = logging.getLogger(__name__)

DEFAULT_CONNECT_TIMEOUT = 5.0
# How long telling a refused peer why may delay hanging up on it.
REFUSE_NOTICE_TIMEOUT = 1.0

M = TypeVar("M", bound=Message)

__all__ = [
    "DEFAULT_AUTH_TIMEOUT",
    "DEFAULT_CONNECT_TIMEOUT",
    "DEFAULT_REQUEST_TIMEOUT",
    "CloseCallback",
    "Connection",
    "ConnectionPool",
    "Handler",
    "Router",
    "RpcServer",
    "connect",
]


async def connect(
    transport: Transport,
    address: str,
    secret: str | Credentials,
    *,
    name: str,
    timeout: float = DEFAULT_CONNECT_TIMEOUT,
    handlers: Router | Mapping[type[Message], Handler] | None = None,
) -> Connection:
    """Open, authenticate (both ways) and start a connection to ``address``.

    ``secret``: the node secret (a string or ``NodeSecret``: nodes and internal tools) or a
    ``UserLogin``.

    ``handlers`` route requests/one-way messages the server sends back on this connection.
    Raises ``NodeUnavailable`` (cannot connect or handshake in ``timeout``), ``AuthFailed``,
    ``ProtocolError``.
    """
    check_secret(secret)
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    comm = await transport.connect(address, timeout)
    try:
        peer_name = await client_handshake(
            comm,
            secret,
            name=name,
            timeout=max(deadline - loop.time(), 0.0),
            nonce_source=transport.nonce,
        )
    except BaseException:
        comm.abort()
        raise
    conn = Connection(
        comm,
        name=name,
        peer_name=peer_name,
        router=as_router(handlers),
        max_frame=transport.max_frame,
    )
    conn.start()
    return conn


def _refuse_all(principal: Principal, msg: Message) -> None:
    """The authorizer of a server given none: users may send nothing."""
    name = type(msg).__name__
    raise AuthFailed(
        f"{name} is not allowed on a user's connection",
        details={"type": name, "user": principal.name},
    )


class RpcServer:
    """Accepts connections, authenticates them, routes their messages to handlers."""

    def __init__(
        self,
        transport: Transport,
        secret: str | NodeSecret,
        *,
        name: str,
        auth_timeout: float = DEFAULT_AUTH_TIMEOUT,
        router: Router | None = None,
        users: UserDirectory | None = None,
        authorizer: Authorizer | None = None,
        on_login: LoginObserver | None = None,
        max_connections: int | None = None,
    ) -> None:
        """``secret``: the node secret peers prove. ``users``: where user logins are
        checked (None: nodes only). ``authorizer``: what a user may send; without one a
        user may send nothing (only nodes are trusted by default). ``on_login`` hears
        every user login attempt (the audit log). ``max_connections``: users' connections
        open at once (None: no limit); one more is told TOO_MANY_CONNECTIONS and closed
        once it has authenticated. Nodes' connections are never refused: the cluster's
        own traffic (heartbeats, replication, fragments) must get through a full node."""
        creds = check_secret(secret)
        assert isinstance(creds, NodeSecret), "a server proves the node secret"
        self._transport = transport
        self._secret = creds
        self.name = name
        self._auth_timeout = auth_timeout
        self.router = router if router is not None else Router()
        self.users = users
        self.authorizer: Authorizer = authorizer if authorizer is not None else _refuse_all
        self.on_login = on_login
        self._listener: Listener | None = None
        # dicts, not sets: stop() closes in insertion order, which keeps simulations replayable
        self._conns: dict[Connection, None] = {}
        self._handshaking: dict[Comm, None] = {}
        self.max_connections = max_connections
        self._user_conns: dict[Connection, None] = {}
        self.refused_connections = 0
        self._stopping = False

    def route(self, msg_type: type[Message], handler: Handler | None = None) -> Any:
        """``server.route(T, handler)`` or ``@server.route(T)``."""
        return self.router.route(msg_type, handler)

    @property
    def address(self) -> str | None:
        return self._listener.address if self._listener else None

    @property
    def connections(self) -> frozenset[Connection]:
        return frozenset(self._conns)

    async def start(self, address: str) -> str:
        """Listen on ``address`` (port 0 picks a free port); return the bound address."""
        if self._listener is not None:
            raise RuntimeError(f"{self.name} is already listening on {self._listener.address}")
        self._stopping = False
        self._listener = await self._transport.listen(address, self._on_comm)
        return self._listener.address

    async def stop(self) -> None:
        """Stop accepting and close every connection (their pending requests fail with
        ConnectionClosed, running handlers are cancelled)."""
        self._stopping = True
        if self._listener is not None:
            await self._listener.stop()
            self._listener = None
        for comm in list(self._handshaking):
            comm.abort()
        conns = list(self._conns)
        await asyncio.gather(*(c.close() for c in conns), return_exceptions=True)

    async def _on_comm(self, comm: Comm) -> None:
        if self._stopping:
            comm.abort()
            return
        self._handshaking[comm] = None
        try:
            principal = await server_handshake(
                comm,
                self._secret,
                name=self.name,
                timeout=self._auth_timeout,
                nonce_source=self._transport.nonce,
                users=self.users,
                on_login=self.on_login,
            )
        except ShardexError:
            return  # logged and closed by the handshake
        finally:
            self._handshaking.pop(comm, None)
        if self._stopping:
            comm.abort()
            return
        user = not principal.is_node
        if user and self._full():
            await self._refuse(comm, principal)
            return
        conn = Connection(
            comm,
            name=self.name,
            peer_name=principal.name,
            router=self.router,
            max_frame=self._transport.max_frame,
            principal=principal,
            authorizer=self.authorizer,
            users=self.users,
        )
        self._conns[conn] = None
        conn.add_close_callback(lambda c: self._conns.pop(c, None))
        if user:
            self._user_conns[conn] = None
            conn.add_close_callback(lambda c: self._user_conns.pop(c, None))
        conn.start()

    def _full(self) -> bool:
        return self.max_connections is not None and len(self._user_conns) >= self.max_connections

    async def _refuse(self, comm: Comm, principal: Principal) -> None:
        """Tell a user's new connection why (an ErrorReply notice, id 0) and hang up: its
        client fails its request with the reason rather than a bare close."""
        self.refused_connections += 1
        limit = self.max_connections
        log.warning(
            "refused a connection of user %s from %s: %d connections open (max_connections)",
            principal.name,
            comm.peer_address,
            len(self._user_conns),
        )
        notice = ErrorReply(
            code=ErrorCode.TOO_MANY_CONNECTIONS.value,
            message=f"node {self.name} has {limit} user connections open, its limit "
            "(max_connections): close idle clients, connect to another node, or raise "
            "max_connections in the node's config",
            details={"limit": limit, "node": self.name},
        )
        try:
            async with asyncio.timeout(REFUSE_NOTICE_TIMEOUT):
                await comm.write(encode_frame(Envelope(Kind.ERROR, 0, notice)))
                await comm.close()
        except (TimeoutError, ShardexError, OSError):
            pass
        comm.abort()


class ConnectionPool:
    """Connections by address. Concurrent ``get`` calls for one address share a single
    connect attempt; a connection that has closed is replaced on the next ``get``. Nothing
    is retried implicitly: a request that fails because its connection died raises, since
    the pool cannot know whether resending is safe."""

    def __init__(
        self,
        transport: Transport,
        secret: str | Credentials,
        *,
        name: str,
        connect_timeout: float = DEFAULT_CONNECT_TIMEOUT,
        handlers: Router | Mapping[type[Message], Handler] | None = None,
    ) -> None:
        self._transport = transport
        self._secret = secret
        self.name = name
        self._connect_timeout = connect_timeout
        self._router = as_router(handlers)
        self._conns: dict[str, Connection] = {}
        self._connecting: dict[str, asyncio.Task[Connection]] = {}
        self._closed = False

    def __repr__(self) -> str:
        return f"<ConnectionPool {self.name} {sorted(self._conns)}>"

    @property
    def connections(self) -> dict[str, Connection]:
        """Live connections by address (a snapshot)."""
        return {a: c for a, c in self._conns.items() if not c.closed}

    def connect_soon(self, address: str) -> None:
        """Start connecting to ``address`` unless connected or connecting (on the loop; no
        wait, errors dropped: a later ``get`` reports its own): for a connection a caller
        knows it will want shortly."""
        if self._closed:
            return
        conn = self._conns.get(address)
        if (conn is None or conn.closed) and address not in self._connecting:
            self._start_connect(address)

    def _start_connect(self, address: str) -> asyncio.Task[Connection]:
        task = asyncio.get_running_loop().create_task(
            self._connect(address), name=f"shardex-pool-connect {address}"
        )
        # Waiters may all give up; the outcome must still be retrieved to avoid warnings.
        task.add_done_callback(lambda t: t.cancelled() or t.exception())
        self._connecting[address] = task
        return task

    async def get(self, address: str, timeout: float | None = None) -> Connection:
        """The live connection to ``address``, connecting if needed.

        Waits at most ``timeout`` (default: the pool's connect timeout); raises
        ``NodeUnavailable``, ``AuthFailed`` or ``ProtocolError`` from the connect attempt.
        """
        if self._closed:
            raise ConnectionClosed(f"pool {self.name} is closed", details={"address": address})
        conn = self._conns.get(address)
        if conn is not None and not conn.closed:
            return conn
        task = self._connecting.get(address)
        if task is None:
            task = self._start_connect(address)
        wait = self._connect_timeout if timeout is None else min(timeout, self._connect_timeout)
        try:
            async with asyncio.timeout(wait):
                # shield: one caller giving up must not cancel the attempt others share.
                return await asyncio.shield(task)
        except asyncio.CancelledError:
            current = asyncio.current_task()
            if task.cancelled() and current is not None and not current.cancelling():
                # The attempt was abandoned by close(), not this caller: say so plainly.
                raise ConnectionClosed(
                    f"pool {self.name} closed while connecting to {address}",
                    details={"address": address},
                ) from None
            raise
        except TimeoutError:
            raise NodeUnavailable(
                f"no connection to {address} within {wait}s",
                details={"address": address, "timeout": wait},
            ) from None

    async def _connect(self, address: str) -> Connection:
        try:
            conn = await connect(
                self._transport,
                address,
                self._secret,
                name=self.name,
                timeout=self._connect_timeout,
                handlers=self._router,
            )
        finally:
            self._connecting.pop(address, None)
        if self._closed:
            await conn.close()
            raise ConnectionClosed(f"pool {self.name} is closed", details={"address": address})
        self._conns[address] = conn
        conn.add_close_callback(lambda c: self._forget(address, c))
        return conn

    def _forget(self, address: str, conn: Connection) -> None:
        if self._conns.get(address) is conn:
            del self._conns[address]

    @overload
    async def request(
        self, address: str, msg: Message, timeout: float = ..., *, expect: type[M]
    ) -> M: ...
    @overload
    async def request(
        self, address: str, msg: Message, timeout: float = ..., *, expect: None = None
    ) -> Message: ...

    async def request(
        self,
        address: str,
        msg: Message,
        timeout: float = DEFAULT_REQUEST_TIMEOUT,
        *,
        expect: type[Message] | None = None,
    ) -> Message:
        """``conn.request`` on the pooled connection; ``timeout`` bounds connect + request."""
        conn = self._conns.get(address)
        if conn is not None and not conn.closed:  # the common case: no connect to bound
            return await conn.request(msg, timeout, expect=expect)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        conn = await self.get(address, timeout)
        return await conn.request(msg, max(deadline - loop.time(), 0.0), expect=expect)

    async def send(self, address: str, msg: Message, timeout: float | None = None) -> None:
        """One-way ``msg`` on the pooled connection to ``address``."""
        conn = await self.get(address, timeout)
        await conn.send(msg)

    async def drop(self, address: str) -> None:
        """Close the connection to ``address`` (the next ``get`` reconnects)."""
        conn = self._conns.pop(address, None)
        if conn is not None:
            await conn.close()

    async def close(self) -> None:
        """Close every connection and abandon connect attempts in progress."""
        self._closed = True
        tasks = list(self._connecting.values())
        for task in tasks:
            task.cancel()
        conns = list(self._conns.values())
        self._conns.clear()
        await asyncio.gather(*(c.close() for c in conns), return_exceptions=True)
        await asyncio.gather(*tasks, return_exceptions=True)
