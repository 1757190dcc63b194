"""TcpTransport: length-prefixed frames over asyncio streams."""

from __future__ import annotations

import asyncio
import logging
import socket
from collections.abc import AsyncIterator

import pytest

from shardex.errors import ConfigError, ConnectionClosed, FrameTooLarge, NodeUnavailable
from shardex.net.tcp import TcpTransport
from shardex.net.transport import Comm

pytestmark = pytest.mark.timeout(20)


class EchoServer:
    """Listener whose handler echoes frames and records what happened to each comm."""

    def __init__(self, transport: TcpTransport) -> None:
        self.transport = transport
        self.errors: asyncio.Queue[Exception] = asyncio.Queue()
        self.address = ""

    async def start(self) -> None:
        async def handle(comm: Comm) -> None:
            try:
                while True:
                    await comm.write(await comm.read())
            except Exception as e:
                await self.errors.put(e)

        self.listener = await self.transport.listen("127.0.0.1:0", handle)
        self.address = self.listener.address


@pytest.fixture
async def echo() -> AsyncIterator[EchoServer]:
    server = EchoServer(TcpTransport(max_frame=1024))
    await server.start()
    yield server
    await server.listener.stop()


async def test_frames_round_trip_in_order(echo: EchoServer) -> None:
    comm = await echo.transport.connect(echo.address, timeout=2)
    frames = [b"", b"a", bytes(range(256)), b"x" * 1024]
    for f in frames:
        await comm.write(f)
    assert [await comm.read() for _ in frames] == frames
    assert comm.peer_address == echo.address
    sock_nodelay = comm._transport.get_extra_info("socket").getsockopt(  # type: ignore[attr-defined]
        socket.IPPROTO_TCP, socket.TCP_NODELAY
    )
    assert sock_nodelay
    await comm.close()
    assert comm.closed
    await comm.close()  # idempotent


async def test_oversized_frame_announced_by_peer_is_refused_and_logged(
    echo: EchoServer, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.ERROR, logger="shardex.net.tcp_comm")
    reader, writer = await asyncio.open_connection(*echo.address.split(":"))
    writer.write((1025).to_bytes(4, "big") + b"zz")
    err = await asyncio.wait_for(echo.errors.get(), 5)
    assert isinstance(err, FrameTooLarge)
    assert err.details["size"] == 1025
    assert await asyncio.wait_for(reader.read(), 5) == b""  # the server hung up
    host, port = writer.get_extra_info("sockname")[:2]
    local = f"{host}:{port}"
    assert any(local in r.getMessage() and "1025" in r.getMessage() for r in caplog.records)
    writer.close()


async def test_writing_an_oversized_frame_fails_before_sending(echo: EchoServer) -> None:
    comm = await echo.transport.connect(echo.address, timeout=2)
    with pytest.raises(FrameTooLarge):
        await comm.write(b"x" * 1025)
    await comm.write(b"still fine")
    assert await comm.read() == b"still fine"
    await comm.close()


async def test_eof_mid_frame_and_after_frame_are_connection_closed(echo: EchoServer) -> None:
    _, writer = await asyncio.open_connection(*echo.address.split(":"))
    writer.write((10).to_bytes(4, "big") + b"abc")
    await writer.drain()
    writer.close()
    err = await asyncio.wait_for(echo.errors.get(), 5)
    assert isinstance(err, ConnectionClosed)

    comm = await echo.transport.connect(echo.address, timeout=2)
    comm.abort()
    err = await asyncio.wait_for(echo.errors.get(), 5)
    assert isinstance(err, ConnectionClosed)
    with pytest.raises(ConnectionClosed):
        await comm.write(b"after abort")
    with pytest.raises(ConnectionClosed):
        await comm.read()


async def test_connect_refused_is_node_unavailable() -> None:
    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with pytest.raises(NodeUnavailable) as info:
        await TcpTransport().connect(f"127.0.0.1:{port}", timeout=2)
    assert info.value.details["address"] == f"127.0.0.1:{port}"


async def test_bad_address_is_config_error() -> None:
    with pytest.raises(ConfigError):
        await TcpTransport().connect("localhost", timeout=1)


async def test_many_small_frames_and_a_large_one() -> None:
    transport = TcpTransport()
    server = EchoServer(transport)
    await server.start()
    comm = await transport.connect(server.address, timeout=2)
    big = bytes(range(256)) * 8192  # 2 MiB: crosses the read limit and write high-water mark

    async def writer() -> None:
        for i in range(2000):
            await comm.write(i.to_bytes(4, "big"))
        await comm.write(big)

    task = asyncio.create_task(writer())
    got = [int.from_bytes(await comm.read(), "big") for _ in range(2000)]
    assert got == list(range(2000))
    assert await comm.read() == big
    await task
    await comm.close()
    await server.listener.stop()
