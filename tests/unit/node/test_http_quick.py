"""The HTTP connection's protocol (``quick.py``) on real loopback sockets: a whole request
received while the connection's task waits is answered in the receive callback or handed to
the task parsed, never reaching the stream reader; everything else reaches the reader in
order; the wait ends at the connection's end and after the idle time, counted from the
last request answered in the callback."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field

import pytest

from shardex.node.http.quick import IDLE, QuickProtocol
from shardex.testing.procs import until


@dataclass
class Parsed:
    data: bytes


@dataclass
class Served:
    """What the server side saw: the answer callback's calls and the task's protocol."""

    offered: list[tuple[float, bytes]] = field(default_factory=list)
    protocol: QuickProtocol[Parsed] | None = None
    reader: asyncio.StreamReader | None = None
    connected: asyncio.Event = field(default_factory=asyncio.Event)


Answer = Callable[[bytes], "bytes | Parsed | None"]


@pytest.fixture
async def pair() -> AsyncIterator[Callable[[Answer], asyncio.Future[tuple[Served, Client]]]]:
    servers: list[asyncio.Server] = []
    clients: list[Client] = []
    loop = asyncio.get_running_loop()

    async def start(answer: Answer) -> tuple[Served, Client]:
        served = Served()

        def offered(data: bytes) -> bytes | Parsed | None:
            served.offered.append((loop.time(), data))
            return answer(data)

        async def connected(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            served.protocol = writer.transport.get_protocol()  # type: ignore[assignment]
            served.reader = reader
            served.connected.set()
            await asyncio.Event().wait()  # the test drives the protocol

        def protocol() -> QuickProtocol[Parsed]:
            return QuickProtocol(asyncio.StreamReader(), connected, offered)

        server = await loop.create_server(protocol, "127.0.0.1", 0)
        servers.append(server)
        port = server.sockets[0].getsockname()[1]
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        client = Client(reader, writer)
        clients.append(client)
        await served.connected.wait()
        return served, client

    yield start  # type: ignore[misc]
    for c in clients:
        c.writer.close()
    for s in servers:
        s.close()


@dataclass
class Client:
    reader: asyncio.StreamReader
    writer: asyncio.StreamWriter

    async def send(self, data: bytes) -> None:
        self.writer.write(data)
        await self.writer.drain()


async def test_a_whole_request_is_handed_to_the_waiting_task_or_answered_and_never_read(
    pair: Callable[[Answer], asyncio.Future[tuple[Served, Client]]],
) -> None:
    served, client = await pair(
        lambda data: b"answered:" + data if data.startswith(b"answer") else Parsed(data)
    )
    quick, reader = served.protocol, served.reader
    assert quick is not None and reader is not None
    waiting = asyncio.ensure_future(quick.next_request(60))
    await until(lambda: quick.between, what="the task waiting between requests")
    await client.send(b"answer me")
    # answered in the callback: written back, the task still waiting, its reader empty
    assert await client.reader.readexactly(len(b"answered:answer me")) == b"answered:answer me"
    assert not waiting.done() and quick.between
    await client.send(b"hand me")
    assert await waiting == Parsed(b"hand me")
    assert not quick.between and not reader._buffer  # the bytes never reached the reader
    assert [d for _, d in served.offered] == [b"answer me", b"hand me"]


async def test_bytes_not_taken_reach_the_reader_in_order(
    pair: Callable[[Answer], asyncio.Future[tuple[Served, Client]]],
) -> None:
    served, client = await pair(lambda data: Parsed(data) if data == b"whole" else None)
    quick, reader = served.protocol, served.reader
    assert quick is not None and reader is not None
    waiting = quick.next_request(60)
    await client.send(b"part of a request")  # declined: the reader's
    assert await waiting is None
    assert await reader.readexactly(17) == b"part of a request"
    # the task serves a request (not waiting): even a whole one goes to the reader unoffered
    await client.send(b"whole")
    assert await reader.readexactly(5) == b"whole"
    assert [d for _, d in served.offered] == [b"part of a request"]
    # bytes the reader holds already: the next wait does not wait, nor offer what follows
    await client.send(b"one")
    await until(lambda: len(reader._buffer) >= 3, what="the bytes in the reader")
    assert await quick.next_request(60) is None
    assert not quick.between
    assert await reader.readexactly(3) == b"one"


async def test_the_wait_ends_when_the_client_closes(
    pair: Callable[[Answer], asyncio.Future[tuple[Served, Client]]],
) -> None:
    served, client = await pair(Parsed)
    quick, reader = served.protocol, served.reader
    assert quick is not None and reader is not None
    waiting = quick.next_request(60)
    client.writer.close()
    assert await asyncio.wait_for(waiting, 10) is None
    assert await reader.read() == b""  # the reader tells how it ended
    assert await quick.next_request(60) is None


async def test_the_idle_wait_counts_from_the_last_request_answered_on_receive(
    pair: Callable[[Answer], asyncio.Future[tuple[Served, Client]]],
) -> None:
    served, client = await pair(lambda data: b"ok")
    quick = served.protocol
    assert quick is not None
    loop = asyncio.get_running_loop()
    idle = 0.2
    start = loop.time()
    waiting = asyncio.ensure_future(quick.next_request(idle))
    # answers on receive for twice the idle time: the connection is busy, not idle
    while loop.time() < start + 2 * idle and not waiting.done():
        await client.send(b"x")
        await client.reader.readexactly(2)
        await asyncio.sleep(idle / 4)
    assert await waiting is IDLE
    ended = loop.time()
    last = served.offered[-1][0]
    assert last > start + idle  # answers went on past the first idle deadline
    assert ended >= last + idle - 0.01  # the wait ended only an idle time after the last
