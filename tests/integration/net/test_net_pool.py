"""ConnectionPool: one live connection per address, shared connect attempts, replacement."""

from __future__ import annotations

import asyncio
import socket
from collections.abc import AsyncIterator

import pytest

from shardex.errors import AuthFailed, ConnectionClosed, NodeUnavailable
from shardex.net import Connection, ConnectionPool, Message, RpcServer, TcpTransport
from shardex.net.transport import Comm, CommHandler, Listener, Transport

pytestmark = pytest.mark.timeout(30)

SECRET = "pool-secret"


class PoolEcho(Message):
    text: str


class PoolNote(Message):
    text: str


class CountingTransport(Transport):
    """TcpTransport that counts outgoing connects (the pool must not open extras)."""

    def __init__(self) -> None:
        self.inner = TcpTransport()
        self.max_frame = self.inner.max_frame
        self.connects = 0

    async def listen(self, address: str, handler: CommHandler) -> Listener:
        return await self.inner.listen(address, handler)

    async def connect(self, address: str, timeout: float) -> Comm:
        self.connects += 1
        return await self.inner.connect(address, timeout)


@pytest.fixture
async def server() -> AsyncIterator[RpcServer]:
    srv = RpcServer(TcpTransport(), SECRET, name="node-p")
    notes: list[str] = []
    srv.notes = notes  # type: ignore[attr-defined]

    @srv.route(PoolEcho)
    async def echo(msg: PoolEcho, conn: Connection) -> Message:
        return PoolEcho(text=msg.text + "!")

    @srv.route(PoolNote)
    async def note(msg: PoolNote, conn: Connection) -> None:
        notes.append(msg.text)

    await srv.start("127.0.0.1:0")
    yield srv
    await srv.stop()


async def test_pool_reuses_one_connection_and_shares_the_connect(server: RpcServer) -> None:
    transport = CountingTransport()
    pool = ConnectionPool(transport, SECRET, name="p")
    addr = server.address
    assert addr is not None
    conns = await asyncio.gather(*(pool.get(addr) for _ in range(20)))
    assert all(c is conns[0] for c in conns)
    assert transport.connects == 1
    replies = await asyncio.gather(
        *(pool.request(addr, PoolEcho(text=str(i)), 5) for i in range(10))
    )
    assert [r.text for r in replies] == [f"{i}!" for i in range(10)]  # type: ignore[attr-defined]
    await pool.send(addr, PoolNote(text="n"))
    assert await pool.get(addr) is conns[0]
    assert transport.connects == 1
    assert pool.connections == {addr: conns[0]}
    await pool.close()
    assert conns[0].closed


async def test_pool_replaces_a_closed_connection(server: RpcServer) -> None:
    pool = ConnectionPool(TcpTransport(), SECRET, name="p")
    addr = server.address
    assert addr is not None
    first = await pool.get(addr)
    await first.close()
    second = await pool.get(addr)
    assert second is not first and not second.closed
    assert await pool.request(addr, PoolEcho(text="a"), 5) == PoolEcho(text="a!")

    # Closed from the far side: the next get notices and reconnects.
    (server_side,) = [c for c in server.connections if c.peer_address == second.local_address]
    await server_side.close()
    await second.wait_closed()
    third = await pool.get(addr)
    assert third is not second
    assert await pool.request(addr, PoolEcho(text="b"), 5) == PoolEcho(text="b!")
    await pool.drop(addr)
    assert third.closed and pool.connections == {}
    await pool.close()


async def test_failed_connect_is_shared_then_retried(server: RpcServer) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        dead = f"127.0.0.1:{s.getsockname()[1]}"
    transport = CountingTransport()
    pool = ConnectionPool(transport, SECRET, name="p")
    results = await asyncio.gather(*(pool.get(dead) for _ in range(5)), return_exceptions=True)
    assert all(isinstance(r, NodeUnavailable) for r in results)
    assert transport.connects == 1
    with pytest.raises(NodeUnavailable):
        await pool.request(dead, PoolEcho(text="x"), 5)
    assert transport.connects == 2  # a failure is not cached
    await pool.close()


async def test_wrong_secret_surfaces_from_the_pool(server: RpcServer) -> None:
    pool = ConnectionPool(TcpTransport(), "nope", name="p")
    assert server.address is not None
    with pytest.raises(AuthFailed):
        await pool.get(server.address)
    await pool.close()


async def test_closed_pool_refuses_and_cancels_attempts_in_flight(server: RpcServer) -> None:
    # A listener that accepts but never speaks: the connect attempt hangs in the handshake.
    async def mute(comm: Comm) -> None:
        await asyncio.Event().wait()

    transport = TcpTransport()
    listener = await transport.listen("127.0.0.1:0", mute)
    pool = ConnectionPool(transport, SECRET, name="p", connect_timeout=30)
    waiter = asyncio.create_task(pool.get(listener.address))
    await asyncio.sleep(0)  # let the attempt start (not waiting for any outcome)
    await pool.close()
    with pytest.raises(ConnectionClosed, match="closed while connecting"):
        await waiter
    assert server.address is not None
    with pytest.raises(ConnectionClosed, match="closed"):
        await pool.get(server.address)
    await listener.stop()


async def test_get_timeout_bounds_the_wait(server: RpcServer) -> None:
    async def mute(comm: Comm) -> None:
        await asyncio.Event().wait()

    transport = TcpTransport()
    listener = await transport.listen("127.0.0.1:0", mute)
    pool = ConnectionPool(transport, SECRET, name="p", connect_timeout=0.1)
    with pytest.raises(NodeUnavailable):
        await pool.get(listener.address)
    await pool.close()
    await listener.stop()
