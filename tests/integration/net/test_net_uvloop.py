"""The TCP transport and connections on uvloop (what nodes and clients run), and the receive
and timeout paths of ``shardex.net`` that cut per-message cost: frames cut in the protocol's
data callback, requests bounded by one sweep timer, unrouted pings answered inline.

The module's other tests (``test_net_tcp``, ``test_net_rpc``) run on pytest-asyncio's loop
(asyncio's); here the ones that depend on the transport run again inside a uvloop runner,
and the new tests run on both loops."""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import Awaitable, Callable
from typing import Any

import pytest
import uvloop

from shardex.errors import ConnectionClosed, RequestTimeout
from shardex.net import Connection, Message, Ping, Pong
from shardex.net.auth import client_handshake
from shardex.net.messages import Envelope, Kind, decode_frame, encode_frame
from shardex.net.tcp import TcpComm, TcpTransport
from shardex.net.tcp_comm import _READ_LIMIT
from tests.integration.net import test_net_rpc as rpc  # the module pytest collects: one tag set
from tests.integration.net import test_net_tcp as tcp

pytestmark = pytest.mark.timeout(60)

LOOPS = {"asyncio": asyncio.new_event_loop, "uvloop": uvloop.new_event_loop}


def run(factory: Callable[[], asyncio.AbstractEventLoop], coro: Awaitable[Any]) -> Any:
    with asyncio.Runner(loop_factory=factory) as runner:
        return runner.run(coro)  # type: ignore[arg-type]


async def _with_world(test: Callable[..., Awaitable[None]], **kw: Any) -> None:
    w = rpc.World()
    w.address = await w.server.start("127.0.0.1:0")
    try:
        await test(w, **kw)
    finally:
        for gate in w.gates.values():
            gate.set()
        await w.server.stop()


async def _with_echo(test: Callable[..., Awaitable[None]], **kw: Any) -> None:
    server = tcp.EchoServer(TcpTransport(max_frame=1024))
    await server.start()
    try:
        await test(server, **kw)
    finally:
        await server.listener.stop()


def _tests(module: Any) -> list[Any]:
    return [
        pytest.param(f, id=name)
        for name, f in vars(module).items()
        if name.startswith("test_") and inspect.iscoroutinefunction(f)
    ]


@pytest.mark.parametrize("test", _tests(tcp))
def test_tcp_on_uvloop(test: Any, caplog: pytest.LogCaptureFixture) -> None:
    params = inspect.signature(test).parameters
    kw = {"caplog": caplog} if "caplog" in params else {}
    if "echo" in params:
        run(uvloop.new_event_loop, _with_echo(test, **kw))
    else:
        run(uvloop.new_event_loop, test(**kw))


@pytest.mark.parametrize("test", _tests(rpc))
def test_rpc_on_uvloop(test: Any, caplog: pytest.LogCaptureFixture) -> None:
    params = inspect.signature(test).parameters
    kw: dict[str, Any] = {"caplog": caplog} if "caplog" in params else {}
    if "garbage" in params:
        kw["garbage"] = b"\x00\x00\x00\x05hello"
    if "world" in params:
        run(uvloop.new_event_loop, _with_world(test, **kw))
    else:
        run(uvloop.new_event_loop, test(**kw))


# --- the receive path: frames cut in the data callback -------------------------------------


async def _frames_split_anywhere(w: rpc.World) -> None:
    comm = await w.transport.connect(w.address, timeout=5)
    assert isinstance(comm, TcpComm)
    await client_handshake(comm, rpc.SECRET, name="raw")
    raw = comm._transport
    assert raw is not None
    frames = [
        encode_frame(Envelope(Kind.REQUEST, i, rpc.RpcEcho(text=f"m{i}" * i))) for i in range(1, 9)
    ]
    stream = b"".join(len(f).to_bytes(4, "big") + f for f in frames)
    # One byte per send for the first half (every boundary falls mid-header or mid-body),
    # the rest in one send (many frames in one recv).
    half = len(stream) // 2
    for i in range(half):
        raw.write(stream[i : i + 1])  # NODELAY: a segment each
        await asyncio.sleep(0)
    raw.write(stream[half:])
    got = {}
    while len(got) < len(frames):
        env = decode_frame(await comm.read())
        got[env.id] = env.body
    assert got == {i: rpc.RpcEcho(text=(f"m{i}" * i).upper()) for i in range(1, 9)}
    comm.abort()


@pytest.mark.parametrize("loop", LOOPS)
def test_frames_split_at_any_byte_or_packed_in_one_recv_are_all_answered(loop: str) -> None:
    run(LOOPS[loop], _with_world(_frames_split_anywhere))


async def _handlers_leave_no_task(w: rpc.World) -> None:
    conn = await w.client()
    await rpc.until(lambda: len(w.server.connections) == 1)
    (server_side,) = w.server.connections
    await asyncio.gather(*(conn.request(rpc.RpcEcho(text=str(i)), 5) for i in range(20)))
    await rpc.until(lambda: not server_side._tasks)
    # a handler still running is tracked, and cancelled when the connection closes
    slow = asyncio.ensure_future(conn.request(rpc.RpcWait(gate="g"), 5))
    await rpc.until(lambda: "g" in w.started)
    assert len(server_side._tasks) == 1
    await conn.close()
    await rpc.until(lambda: w.cancelled == ["g"])
    with pytest.raises(ConnectionClosed):
        await slow


@pytest.mark.parametrize("loop", LOOPS)
def test_request_handlers_are_tracked_until_they_end(loop: str) -> None:
    run(LOOPS[loop], _with_world(_handlers_leave_no_task))


async def _ping_inline_unless_routed(w: rpc.World) -> None:
    conn = await w.client()
    assert await conn.request(Ping(payload=b"abc"), 5) == Pong(payload=b"abc")
    (server_side,) = w.server.connections
    assert server_side._task_seq == 0  # answered in the receive callback, no handler task

    async def custom(msg: Ping, c: Connection) -> Message:
        return Pong(payload=b"routed " + msg.payload)

    w.server.route(Ping, custom)
    assert await conn.request(Ping(payload=b"x"), 5) == Pong(payload=b"routed x")
    await conn.close()


@pytest.mark.parametrize("loop", LOOPS)
def test_unrouted_ping_is_answered_inline_and_a_routed_one_by_its_handler(loop: str) -> None:
    run(LOOPS[loop], _with_world(_ping_inline_unless_routed))


# --- request timeouts: one sweep timer per connection --------------------------------------


async def _short_timeout_after_a_long_one(w: rpc.World) -> None:
    conn = await w.client()
    long = asyncio.ensure_future(conn.request(rpc.RpcWait(gate="long", text="L"), 30))
    await rpc.until(lambda: "long" in w.started)
    loop = asyncio.get_running_loop()
    start = loop.time()
    with pytest.raises(RequestTimeout) as info:
        await conn.request(rpc.RpcWait(gate="short"), 0.1)
    # The sweep was armed at the long request's deadline (30 s); the short one re-arms it.
    assert loop.time() - start < 5
    assert info.value.details == {"type": "RpcWait", "peer": conn.peer_label, "timeout": 0.1}
    assert not long.done()
    w.gate("long").set()
    assert await long == rpc.RpcEcho(text="L")
    # and after a sweep fired, later requests are still bounded
    with pytest.raises(RequestTimeout):
        await conn.request(rpc.RpcWait(gate="third"), 0.1)
    assert conn.pending_requests == 0
    await conn.close()


@pytest.mark.parametrize("loop", LOOPS)
def test_a_short_timeout_fires_on_time_behind_a_long_one(loop: str) -> None:
    run(LOOPS[loop], _with_world(_short_timeout_after_a_long_one))


async def _timeout_while_the_send_waits(w: rpc.World) -> None:
    conn = await w.client()
    comm = conn._comm
    assert isinstance(comm, TcpComm)
    comm.pause_writing()  # as the loop does when the peer stops reading
    with pytest.raises(RequestTimeout):
        await conn.request(rpc.RpcEcho(text="stuck"), 0.1)
    comm.resume_writing()
    assert await conn.request(rpc.RpcEcho(text="ok"), 5) == rpc.RpcEcho(text="OK")
    await conn.close()


@pytest.mark.parametrize("loop", LOOPS)
def test_the_timeout_also_bounds_a_send_held_by_back_pressure(loop: str) -> None:
    run(LOOPS[loop], _with_world(_timeout_while_the_send_waits))


async def _no_timeout_waits_for_the_reply(w: rpc.World) -> None:
    conn = await w.client()
    pending = asyncio.ensure_future(conn.request(rpc.RpcWait(gate="g", text="t"), None))
    await rpc.until(lambda: "g" in w.started)
    assert not conn._deadlines.armed  # nothing to bound
    w.gate("g").set()
    assert await pending == rpc.RpcEcho(text="t")
    await conn.close()


@pytest.mark.parametrize("loop", LOOPS)
def test_a_request_without_timeout_arms_no_timer(loop: str) -> None:
    run(LOOPS[loop], _with_world(_no_timeout_waits_for_the_reply))


# --- pull mode (before a receiver takes over): bounded buffering ---------------------------


async def _unread_frames_pause_the_socket() -> None:
    transport = TcpTransport()
    server = tcp.EchoServer(transport)
    received: asyncio.Queue[TcpComm] = asyncio.Queue()

    async def hold(comm: Any) -> None:
        await received.put(comm)
        await asyncio.Event().wait()  # never reads on its own

    listener = await transport.listen("127.0.0.1:0", hold)
    client = await transport.connect(listener.address, timeout=5)
    server_comm = await asyncio.wait_for(received.get(), 5)
    chunk = b"x" * (256 * 1024)
    n = (3 * _READ_LIMIT) // len(chunk)
    writer = asyncio.gather(*(client.write(chunk) for _ in range(n)))
    await rpc.until(lambda: server_comm._read_paused)
    assert server_comm._queued <= _READ_LIMIT + len(chunk)
    assert [await server_comm.read() for _ in range(n)] == [chunk] * n
    await writer
    assert not server_comm._read_paused
    client.abort()
    server_comm.abort()
    await listener.stop()
    del server


@pytest.mark.parametrize("loop", LOOPS)
def test_frames_nobody_reads_pause_the_socket_and_all_arrive_later(loop: str) -> None:
    run(LOOPS[loop], _unread_frames_pause_the_socket())


async def _receiver_takes_queued_frames_first() -> None:
    transport = TcpTransport()
    comms: asyncio.Queue[TcpComm] = asyncio.Queue()

    async def hold(comm: Any) -> None:
        await comms.put(comm)
        await asyncio.Event().wait()

    listener = await transport.listen("127.0.0.1:0", hold)
    client = await transport.connect(listener.address, timeout=5)
    server_comm = await asyncio.wait_for(comms.get(), 5)
    for i in range(3):
        await client.write(bytes([i]))
    await rpc.until(lambda: len(server_comm._frames) == 3)
    got: list[bytes] = []
    ended: list[Exception] = []
    assert server_comm.set_receiver(got.append, ended.append)
    await client.write(b"\x03")
    await rpc.until(lambda: len(got) == 4)
    assert got == [b"\x00", b"\x01", b"\x02", b"\x03"]
    client.abort()
    await rpc.until(lambda: bool(ended))
    assert isinstance(ended[0], ConnectionClosed)
    server_comm.abort()
    await listener.stop()


@pytest.mark.parametrize("loop", LOOPS)
def test_a_receiver_gets_queued_frames_first_then_the_end(loop: str) -> None:
    run(LOOPS[loop], _receiver_takes_queued_frames_first())
