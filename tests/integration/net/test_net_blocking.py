"""The blocking connection (``shardex.net.blocking``) against the loop's own server: the same
handshake, the same frames and the same errors as ``shardex.net.connect``."""

from __future__ import annotations

import asyncio
import secrets
import time

import pytest

from shardex.errors import AuthFailed, ConnectionClosed, FrameTooLarge, NodeUnavailable
from shardex.net import Connection, Message, RpcServer, TcpTransport, connect
from shardex.net.blocking import BlockingConn
from shardex.net.framing import header
from shardex.net.messages import Kind, Ping

pytestmark = pytest.mark.timeout(20)

SECRET = "correct horse battery staple"


class Echo(Message, tag="test.blocking.Echo"):
    text: str


class Notify(Message, tag="test.blocking.Notify"):
    n: int


def _open(address: str, secret: str = SECRET, timeout: float = 2.0) -> BlockingConn:
    return BlockingConn.open(
        address,
        secret,
        name="blocking-client",
        timeout=timeout,
        max_frame=1 << 20,
        nonce=secrets.token_bytes,
    )


async def _server() -> tuple[RpcServer, str, list[Connection]]:
    server = RpcServer(TcpTransport(), SECRET, name="node-x")
    conns: list[Connection] = []

    async def echo(msg: Echo, conn: Connection) -> Echo:
        conns.append(conn)
        await conn.send(Notify(n=1))  # a one-way frame ahead of the response
        return Echo(text=msg.text.upper())

    server.route(Echo, echo)
    return server, await server.start("127.0.0.1:0"), conns


async def test_requests_one_way_frames_and_the_servers_ping() -> None:
    server, address, conns = await _server()
    conn = await asyncio.to_thread(_open, address)
    assert conn.peer_label == f"node-x@{conn.peer}"

    def exchange() -> list[tuple[Kind, int, Message]]:
        rid = conn.new_request_id()
        conn.send(Echo(text="hi"), rid, Kind.REQUEST)
        deadline = time.monotonic() + 5
        first, second = conn.read(deadline), conn.read(deadline)
        return [(e.kind, e.id, e.body) for e in (first, second)]

    got = await asyncio.to_thread(exchange)
    assert got == [(Kind.ONEWAY, 0, Notify(n=1)), (Kind.RESPONSE, 1, Echo(text="HI"))]
    # A node's Ping is answered by the blocking side itself, while its caller reads.
    ping = asyncio.create_task(conns[0].ping(timeout=5))

    def read_until_quiet() -> None:
        with pytest.raises(TimeoutError):
            conn.read(time.monotonic() + 0.3)

    await asyncio.to_thread(read_until_quiet)
    assert await ping >= 0
    conn.close()
    await server.stop()


async def test_a_wrong_secret_fails_with_the_loop_paths_error() -> None:
    server, address, _ = await _server()
    with pytest.raises(AuthFailed) as loop_err:
        await connect(TcpTransport(), address, "wrong", name="c")
    with pytest.raises(AuthFailed) as blocking_err:
        await asyncio.to_thread(_open, address, "wrong")
    assert blocking_err.value.message == loop_err.value.message
    await server.stop()


async def test_a_mute_server_times_the_handshake_out() -> None:
    accepted: list[asyncio.StreamWriter] = []

    async def mute(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        accepted.append(writer)

    srv = await asyncio.start_server(mute, "127.0.0.1", 0)
    host, port = srv.sockets[0].getsockname()[:2]
    with pytest.raises(NodeUnavailable, match="timed out"):
        await asyncio.to_thread(_open, f"{host}:{port}", SECRET, 0.2)
    for w in accepted:
        w.close()
    srv.close()
    await srv.wait_closed()


async def test_an_oversized_frame_closes_the_socket() -> None:
    server, address, conns = await _server()
    conn = await asyncio.to_thread(_open, address)
    await asyncio.to_thread(conn.send, Echo(text="x"), conn.new_request_id(), Kind.REQUEST)
    deadline = time.monotonic() + 5
    await asyncio.to_thread(conn.read, deadline)  # the Notify
    await asyncio.to_thread(conn.read, deadline)  # the reply
    # The node announces a frame far over the client's limit.
    comm = conns[0]._comm
    transport = comm._transport  # type: ignore[attr-defined]
    transport.write(header(1 << 30))
    with pytest.raises(FrameTooLarge):
        await asyncio.to_thread(conn.read, deadline)
    assert conn.closed
    with pytest.raises(ConnectionClosed):
        conn.send(Ping(), 0)
    await server.stop()
