"""RpcServer, connect and Connection over loopback TCP."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator

import msgspec
import pytest

from shardex.errors import (
    AuthFailed,
    ConfigError,
    ConnectionClosed,
    ErrorCode,
    FrameTooLarge,
    ProtocolError,
    RequestTimeout,
    ShardexError,
)
from shardex.net import Ack, Connection, Message, Pong, RpcServer, TcpTransport, connect
from shardex.net.auth import client_handshake
from shardex.net.messages import TAG_FIELD, Envelope, ErrorReply, Kind, decode_frame
from shardex.net.tcp import TcpComm
from shardex.net.transport import Comm
from shardex.testing.procs import until

pytestmark = pytest.mark.timeout(30)


SECRET = "s3cret"
MAX_FRAME = 64 * 1024


class RpcEcho(Message):
    text: str


class RpcNote(Message):
    n: int


class RpcWait(Message):
    """Handled only once the test sets the event named ``gate``."""

    gate: str
    text: str = ""


class RpcFail(Message):
    code: str
    details: dict[str, str] = msgspec.field(default_factory=dict)


class RpcBoom(Message):
    pass


class RpcNobodyRoutes(Message):
    pass


class RpcBlob(Message):
    data: bytes = b""
    reply_size: int = 0


class RpcAskBack(Message):
    """Makes the server send a request back over the same connection."""

    text: str


class World:
    def __init__(self) -> None:
        self.transport = TcpTransport(max_frame=MAX_FRAME)
        self.server = RpcServer(self.transport, SECRET, name="node-1")
        self.gates: dict[str, asyncio.Event] = {}
        self.notes: list[int] = []
        self.started: list[str] = []
        self.cancelled: list[str] = []
        self.address = ""
        s = self.server

        @s.route(RpcEcho)
        async def echo(msg: RpcEcho, conn: Connection) -> Message:
            return RpcEcho(text=msg.text.upper())

        @s.route(RpcNote)
        async def note(msg: RpcNote, conn: Connection) -> None:
            self.notes.append(msg.n)
            await conn.send(RpcNote(n=msg.n * 10))

        @s.route(RpcWait)
        async def wait(msg: RpcWait, conn: Connection) -> Message:
            self.started.append(msg.gate)
            try:
                await self.gate(msg.gate).wait()
            except asyncio.CancelledError:
                self.cancelled.append(msg.gate)
                raise
            return RpcEcho(text=msg.text)

        @s.route(RpcFail)
        async def fail(msg: RpcFail, conn: Connection) -> None:
            raise ShardexError("it failed", code=ErrorCode(msg.code), details=msg.details)

        @s.route(RpcBoom)
        async def boom(msg: RpcBoom, conn: Connection) -> None:
            raise ZeroDivisionError("kaboom")

        @s.route(RpcBlob)
        async def blob(msg: RpcBlob, conn: Connection) -> Message:
            return RpcBlob(data=b"r" * msg.reply_size)

        @s.route(RpcAskBack)
        async def ask_back(msg: RpcAskBack, conn: Connection) -> Message:
            answer = await conn.request(RpcEcho(text=msg.text), timeout=5, expect=RpcEcho)
            return RpcEcho(text="client said " + answer.text)

    def gate(self, name: str) -> asyncio.Event:
        return self.gates.setdefault(name, asyncio.Event())

    async def client(self, name: str = "client", **kw: object) -> Connection:
        return await connect(self.transport, self.address, SECRET, name=name, timeout=5, **kw)  # type: ignore[arg-type]

    async def raw_authenticated(self) -> TcpComm:
        """A TCP comm past the handshake, for sending bytes no Connection would send."""
        comm = await self.transport.connect(self.address, timeout=2)
        await client_handshake(comm, SECRET, name="raw")
        assert isinstance(comm, TcpComm)
        return comm


@pytest.fixture
async def world() -> AsyncIterator[World]:
    w = World()
    w.address = await w.server.start("127.0.0.1:0")
    yield w
    for gate in w.gates.values():
        gate.set()
    await w.server.stop()


async def test_request_response_round_trip(world: World) -> None:
    conn = await world.client()
    assert conn.peer_name == "node-1"
    assert await conn.request(RpcEcho(text="hi"), timeout=5) == RpcEcho(text="HI")
    assert await conn.request(RpcEcho(text="x"), timeout=5, expect=RpcEcho) == RpcEcho(text="X")
    assert await conn.ping(timeout=5) >= 0
    await until(lambda: len(world.server.connections) == 1)
    (server_side,) = world.server.connections
    assert server_side.peer_name == "client"
    await conn.close()
    assert conn.closed
    with pytest.raises(ConnectionClosed):
        await conn.request(RpcEcho(text="late"), timeout=5)


async def test_handler_returning_none_answers_ack_and_expect_is_checked(world: World) -> None:
    conn = await world.client()
    with pytest.raises(ProtocolError, match="answered RpcEcho with RpcEcho, expected Pong"):
        await conn.request(RpcEcho(text="a"), timeout=5, expect=Pong)  # type: ignore[arg-type]
    world.server.route(RpcNobodyRoutes, lambda m, c: asyncio.sleep(0))
    assert await conn.request(RpcNobodyRoutes(), timeout=5) == Ack()
    await conn.close()


async def test_one_way_both_directions_in_order(world: World) -> None:
    back: list[int] = []

    async def on_note(msg: RpcNote, conn: Connection) -> None:
        back.append(msg.n)

    conn = await world.client(handlers={RpcNote: on_note})
    for i in range(200):
        await conn.send(RpcNote(n=i))
    await until(lambda: len(back) == 200)
    assert world.notes == list(range(200))
    assert back == [i * 10 for i in range(200)]
    await conn.close()


async def test_server_can_request_over_the_clients_connection(world: World) -> None:
    async def on_echo(msg: RpcEcho, conn: Connection) -> Message:
        return RpcEcho(text=msg.text[::-1])

    conn = await world.client(handlers={RpcEcho: on_echo})
    reply = await conn.request(RpcAskBack(text="abc"), timeout=5)
    assert reply == RpcEcho(text="client said cba")
    await conn.close()


async def test_slow_handler_does_not_block_a_fast_one(world: World) -> None:
    conn = await world.client()
    slow = asyncio.create_task(conn.request(RpcWait(gate="slow", text="slow"), timeout=5))
    await until(lambda: "slow" in world.started)
    # The fast requests complete while the slow one is still in its handler.
    assert await conn.request(RpcEcho(text="fast"), timeout=5) == RpcEcho(text="FAST")
    results = await asyncio.gather(*(conn.request(RpcEcho(text=str(i)), 5) for i in range(50)))
    assert results == [RpcEcho(text=str(i)) for i in range(50)]
    assert not slow.done()
    world.gate("slow").set()
    assert await slow == RpcEcho(text="slow")
    await conn.close()


async def test_timeout_names_type_and_peer_and_connection_stays_usable(world: World) -> None:
    conn = await world.client()
    with pytest.raises(RequestTimeout) as info:
        await conn.request(RpcWait(gate="never"), timeout=0.05)
    assert "RpcWait" in str(info.value) and "node-1@" + conn.peer_address in str(info.value)
    assert info.value.details["type"] == "RpcWait"
    assert conn.pending_requests == 0
    assert await conn.request(RpcEcho(text="ok"), timeout=5) == RpcEcho(text="OK")
    world.gate("never").set()  # the late reply is dropped quietly
    assert await conn.request(RpcEcho(text="ok2"), timeout=5) == RpcEcho(text="OK2")
    assert not conn.closed
    await conn.close()


async def test_wrong_secret_is_refused_logged_and_server_keeps_serving(
    world: World, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="shardex.net.auth")
    with pytest.raises(AuthFailed):
        await connect(world.transport, world.address, "not the secret", name="intruder")
    assert any(
        r.name == "shardex.net.auth" and "authentication failed for 127.0.0.1:" in r.getMessage()
        for r in caplog.records
    )
    assert not world.server.connections
    conn = await world.client()
    assert await conn.request(RpcEcho(text="a"), timeout=5) == RpcEcho(text="A")
    await conn.close()


async def drain_until_closed(comm: TcpComm) -> list[Envelope]:
    """Frames the server sends before hanging up (at most a notice)."""
    got: list[Envelope] = []
    async with asyncio.timeout(5):
        while True:
            try:
                got.append(decode_frame(await comm.read()))
            except ConnectionClosed:
                return got


@pytest.mark.parametrize(
    "garbage",
    [b"\x00\x00\x00\x05hello", b"\x00\x00\x00\x01\xc1", b"\x00\x00\x00\x03\x93\x00\x01"],
    ids=["bad-msgpack", "reserved-byte", "truncated-envelope"],
)
async def test_garbage_after_auth_closes_that_connection_only(
    world: World, caplog: pytest.LogCaptureFixture, garbage: bytes
) -> None:
    caplog.set_level(logging.ERROR, logger="shardex.net")
    good = await world.client()
    raw = await world.raw_authenticated()
    raw._transport.write(garbage)
    notices = await drain_until_closed(raw)
    assert [(e.kind, type(e.body)) for e in notices] == [(Kind.ERROR, ErrorReply)]
    assert notices[0].body.code == "PROTOCOL_ERROR"  # type: ignore[attr-defined]
    assert any(
        r.levelno == logging.ERROR and "raw@" + raw.local_address in r.getMessage()
        for r in caplog.records
    )
    assert await good.request(RpcEcho(text="still here"), timeout=5) == RpcEcho(text="STILL HERE")
    await until(lambda: len(world.server.connections) == 1)
    await good.close()


async def test_oversized_frame_after_auth_closes_that_connection_only(
    world: World, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.ERROR, logger="shardex.net")
    good = await world.client()
    raw = await world.raw_authenticated()
    raw._transport.write((MAX_FRAME + 1).to_bytes(4, "big") + b"xxxx")
    assert await drain_until_closed(raw) == []  # cut off at once, no payload is read
    assert any(
        raw.local_address in r.getMessage() and str(MAX_FRAME + 1) in r.getMessage()
        for r in caplog.records
        if r.name == "shardex.net.tcp_comm" and r.levelno == logging.ERROR
    )
    assert await good.request(RpcEcho(text="ok"), timeout=5) == RpcEcho(text="OK")
    await good.close()


async def test_unknown_message_types_get_an_error_and_the_connection_stays_up(
    world: World,
) -> None:
    conn = await world.client()
    with pytest.raises(ShardexError) as info:
        await conn.request(RpcNobodyRoutes(), timeout=5)
    assert info.value.code is ErrorCode.UNKNOWN_MESSAGE
    assert info.value.details == {"type": "RpcNobodyRoutes"}
    assert await conn.request(RpcEcho(text="a"), timeout=5) == RpcEcho(text="A")
    await conn.close()

    # A tag the server has never heard of (a newer peer), sent on a raw connection.
    raw = await world.raw_authenticated()
    await raw.write(msgspec.msgpack.encode([0, 77, {TAG_FIELD: "FromTheFuture", "x": 1}]))
    reply = decode_frame(await raw.read())
    assert (reply.kind, reply.id) == (Kind.ERROR, 77)
    assert isinstance(reply.body, ErrorReply) and reply.body.code == "UNKNOWN_MESSAGE"
    # Known type, wrong field types: BAD_REQUEST, still on the same connection.
    await raw.write(msgspec.msgpack.encode([0, 78, {TAG_FIELD: "RpcEcho", "text": 5}]))
    reply = decode_frame(await raw.read())
    assert (reply.kind, reply.id) == (Kind.ERROR, 78)
    assert isinstance(reply.body, ErrorReply) and reply.body.code == "BAD_REQUEST"
    await raw.write(msgspec.msgpack.encode([0, 79, {TAG_FIELD: "RpcEcho", "text": "z"}]))
    assert decode_frame(await raw.read()) == Envelope(Kind.RESPONSE, 79, RpcEcho(text="Z"))
    await raw.close()


async def test_shardex_error_arrives_with_same_code_and_details(world: World) -> None:
    conn = await world.client()
    with pytest.raises(ShardexError) as info:
        await conn.request(RpcFail(code="INDEX_NOT_FOUND", details={"index": "i1"}), 5)
    assert info.value.code is ErrorCode.INDEX_NOT_FOUND
    assert info.value.details == {"index": "i1"}
    assert info.value.message == "it failed"
    # Codes with a dedicated class come back as that class.
    with pytest.raises(ConfigError):
        await conn.request(RpcFail(code="CONFIG_ERROR"), timeout=5)
    await conn.close()


async def test_plain_exception_is_internal_and_logged_with_traceback(
    world: World, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.ERROR, logger="shardex.net")
    conn = await world.client()
    with pytest.raises(ShardexError) as info:
        await conn.request(RpcBoom(), timeout=5)
    assert info.value.code is ErrorCode.INTERNAL
    assert "kaboom" in info.value.message
    (record,) = [r for r in caplog.records if "RpcBoom" in r.getMessage()]
    assert record.exc_info is not None and record.exc_info[0] is ZeroDivisionError
    assert await conn.request(RpcEcho(text="a"), timeout=5) == RpcEcho(text="A")
    await conn.close()


async def test_pending_requests_fail_together_when_the_server_stops(world: World) -> None:
    conn = await world.client()
    closed: list[Connection] = []
    conn.add_close_callback(closed.append)
    pending = [
        asyncio.create_task(conn.request(RpcWait(gate=f"g{i}"), timeout=10)) for i in range(5)
    ]
    await until(lambda: len(world.started) == 5)
    await world.server.stop()
    results = await asyncio.gather(*pending, return_exceptions=True)
    assert all(isinstance(r, ConnectionClosed) for r in results), results
    assert "RpcWait" in str(results[0])
    assert sorted(world.cancelled) == [f"g{i}" for i in range(5)]  # handlers were cancelled
    await conn.wait_closed()
    assert closed == [conn] and isinstance(conn.close_reason, ConnectionClosed)


async def test_oversized_messages_fail_before_sending_in_both_directions(world: World) -> None:
    conn = await world.client()
    with pytest.raises(FrameTooLarge) as info:
        await conn.request(RpcBlob(data=b"x" * MAX_FRAME), timeout=5)
    assert info.value.details["type"] == "RpcBlob"
    with pytest.raises(FrameTooLarge):
        await conn.send(RpcBlob(data=b"x" * MAX_FRAME))
    # A response over the limit becomes an error reply; the connection survives both.
    with pytest.raises(FrameTooLarge):
        await conn.request(RpcBlob(reply_size=MAX_FRAME), timeout=5)
    assert await conn.request(RpcBlob(data=b"y" * 1000), timeout=5) == RpcBlob()
    assert not conn.closed
    await conn.close()


async def test_stop_does_not_wait_for_a_silent_unauthenticated_peer(world: World) -> None:
    reader, writer = await asyncio.open_connection(*world.address.split(":"))
    await reader.readexactly(4)  # the server sent its challenge; we never answer
    async with asyncio.timeout(2):
        await world.server.stop()
    assert await asyncio.wait_for(reader.read(), 2) is not None
    writer.close()


async def test_closing_inside_a_handler_and_many_connections(world: World) -> None:
    conns = await asyncio.gather(*(world.client(name=f"c{i}") for i in range(20)))
    replies = await asyncio.gather(*(c.request(RpcEcho(text=c.name), 5) for c in conns))
    assert [r.text for r in replies] == [f"C{i}" for i in range(20)]  # type: ignore[attr-defined]
    await until(lambda: len(world.server.connections) == 20)
    await asyncio.gather(*(c.close() for c in conns))
    await until(lambda: not world.server.connections)


async def test_peer_notice_before_hang_up_reaches_pending_requests() -> None:
    from shardex.net.auth import server_handshake
    from shardex.net.messages import encode_frame

    transport = TcpTransport()

    async def grumpy(comm: Comm) -> None:
        await server_handshake(comm, SECRET, name="grumpy")
        decode_frame(await comm.read())  # the request, never answered
        notice = ErrorReply(code="PROTOCOL_ERROR", message="you said something odd")
        await comm.write(encode_frame(Envelope(Kind.ERROR, 0, notice)))
        await comm.close()

    listener = await transport.listen("127.0.0.1:0", grumpy)
    conn = await connect(transport, listener.address, SECRET, name="c")
    with pytest.raises(ConnectionClosed) as info:
        await conn.request(RpcEcho(text="hello"), timeout=5)
    assert info.value.details["notice"] == "PROTOCOL_ERROR"
    assert "you said something odd" in str(info.value)
    await conn.close()
    await listener.stop()
