"""Requests answered in the receive callback (``Router.route_inline``), requests sent without
a task (``Connection.request_future``), and the data service's ``HighSeqnos`` answered
inline: the message path of a request_plus scan's high-seqno round."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from shardex.api.data import HighSeqnos, HighSeqnosReply
from shardex.errors import ConnectionClosed, ErrorCode, RequestTimeout, ShardexError
from shardex.net import Ack, Connection, Message, RpcServer, TcpTransport, connect
from shardex.net.router import Router
from tests.unit.data.test_data_service import running_service, state_with

pytestmark = pytest.mark.timeout(30)

SECRET = "s" * 32


class InlineEcho(Message):
    text: str
    mode: str = "reply"  # reply | none | await | future | shardex | boom | big


class SlowEcho(Message):
    text: str


class Inline:
    """A server whose ``InlineEcho`` handler is inline; records the task it ran in."""

    def __init__(self) -> None:
        self.transport = TcpTransport(max_frame=64 * 1024)
        self.server = RpcServer(self.transport, SECRET, name="srv")
        self.tasks: list[asyncio.Task[object] | None] = []
        self.gate = asyncio.Event()
        self.futures: list[asyncio.Future[Message]] = []
        self.address = ""
        self.server.router.route_inline(InlineEcho, self.on_echo)

        @self.server.route(SlowEcho)
        async def slow(msg: SlowEcho, conn: Connection) -> Message:
            await self.gate.wait()
            return SlowEcho(text=msg.text.upper())

    def on_echo(self, msg: InlineEcho, conn: Connection) -> object:
        self.tasks.append(asyncio.current_task())
        if msg.mode == "none":
            return None
        if msg.mode == "await":
            return self.later(msg)
        if msg.mode == "future":  # settled later by whoever holds it, no task
            fut: asyncio.Future[Message] = asyncio.get_running_loop().create_future()
            self.futures.append(fut)
            return fut
        if msg.mode == "shardex":
            raise ShardexError("no such thing", code=ErrorCode.KEYSPACE_NOT_FOUND, details={"k": 1})
        if msg.mode == "boom":
            raise ZeroDivisionError("kaboom")
        if msg.mode == "big":
            return InlineEcho(text="x" * 100_000)
        return InlineEcho(text=msg.text.upper())

    async def later(self, msg: InlineEcho) -> Message:
        await self.gate.wait()
        return InlineEcho(text=msg.text + " later")

    async def client(self) -> Connection:
        return await connect(self.transport, self.address, SECRET, name="cli", timeout=5)


@pytest.fixture
async def inline() -> AsyncIterator[Inline]:
    w = Inline()
    w.address = await w.server.start("127.0.0.1:0")
    yield w
    w.gate.set()
    await w.server.stop()


async def test_an_inline_handler_answers_in_the_receive_callback(inline: Inline) -> None:
    conn = await inline.client()
    assert await conn.request(InlineEcho(text="hi"), 5) == InlineEcho(text="HI")
    assert await conn.request(InlineEcho(text="x", mode="none"), 5) == Ack()
    # Called outside any task: no task was created for the request.
    assert inline.tasks == [None, None]
    await conn.close()


async def test_an_inline_handler_that_must_wait_is_finished_in_a_task(inline: Inline) -> None:
    conn = await inline.client()
    waiting = asyncio.ensure_future(conn.request(InlineEcho(text="a", mode="await"), 5))
    # Meanwhile the connection serves other requests inline.
    assert await conn.request(InlineEcho(text="b"), 5) == InlineEcho(text="B")
    assert not waiting.done()
    inline.gate.set()
    assert await waiting == InlineEcho(text="a later")
    await conn.close()


async def test_an_inline_handlers_future_is_answered_when_it_is_settled(inline: Inline) -> None:
    conn = await inline.client()
    before = asyncio.all_tasks()
    ok = asyncio.ensure_future(conn.request(InlineEcho(text="", mode="future"), 5))
    failed = asyncio.ensure_future(conn.request(InlineEcho(text="", mode="future"), 5))
    cancelled = asyncio.ensure_future(conn.request(InlineEcho(text="", mode="future"), 5))
    deadline = asyncio.get_running_loop().time() + 10
    while len(inline.futures) < 3:  # the three requests reach the handler
        assert asyncio.get_running_loop().time() < deadline, "a request never reached it"
        await asyncio.sleep(0.01)
    assert asyncio.all_tasks() - before == {ok, failed, cancelled}  # none on the server
    assert not ok.done()
    first, second, third = inline.futures
    first.set_result(InlineEcho(text="settled"))
    assert await ok == InlineEcho(text="settled")
    second.set_exception(ShardexError("gone", code=ErrorCode.KEYSPACE_NOT_FOUND))
    with pytest.raises(ShardexError) as info:
        await failed
    assert info.value.code is ErrorCode.KEYSPACE_NOT_FOUND
    third.cancel()
    with pytest.raises(ShardexError) as info:
        await cancelled
    assert info.value.code is ErrorCode.INTERNAL and "cancelled" in str(info.value)
    await conn.close()


async def test_inline_errors_are_answered_like_a_tasks(
    inline: Inline, caplog: pytest.LogCaptureFixture
) -> None:
    conn = await inline.client()
    with pytest.raises(ShardexError) as info:
        await conn.request(InlineEcho(text="", mode="shardex"), 5)
    assert info.value.code is ErrorCode.KEYSPACE_NOT_FOUND and info.value.details == {"k": 1}
    with (
        caplog.at_level(logging.ERROR, logger="shardex.net.connection"),
        pytest.raises(ShardexError) as info,
    ):
        await conn.request(InlineEcho(text="", mode="boom"), 5)
    assert info.value.code is ErrorCode.INTERNAL
    assert "ZeroDivisionError" in caplog.text and "Traceback" in caplog.text
    # A response over the frame limit: the error goes back instead, the connection stays.
    with pytest.raises(ShardexError) as info:
        await conn.request(InlineEcho(text="", mode="big"), 5)
    assert info.value.code is ErrorCode.FRAME_TOO_LARGE
    assert await conn.request(InlineEcho(text="ok"), 5) == InlineEcho(text="OK")
    await conn.close()


def test_a_message_type_is_routed_one_way_only() -> None:
    router = Router()

    async def handler(msg: Message, conn: Connection) -> None:
        return None

    router.route(SlowEcho, handler)
    with pytest.raises(ValueError, match="already routed"):
        router.route_inline(SlowEcho, lambda m, c: None)
    router.route_inline(InlineEcho, lambda m, c: None)
    with pytest.raises(ValueError, match="already routed"):
        router.route(InlineEcho, handler)
    with pytest.raises(TypeError):
        router.route_inline(int, lambda m, c: None)  # type: ignore[arg-type]
    assert InlineEcho in router and SlowEcho in router
    assert router.lookup(InlineEcho) is None and router.lookup_inline(SlowEcho) is None


async def test_request_future_sends_at_once_and_fails_as_request_raises(inline: Inline) -> None:
    conn = await inline.client()
    before = asyncio.all_tasks()
    fut = conn.request_future(InlineEcho(text="now"), 5)
    assert asyncio.all_tasks() == before  # no task: the frame left in this call
    assert await fut == InlineEcho(text="NOW")
    assert conn.pending_requests == 0
    with pytest.raises(ShardexError) as info:
        await conn.request_future(InlineEcho(text="", mode="shardex"), 5)
    assert info.value.code is ErrorCode.KEYSPACE_NOT_FOUND
    # A deadline fails it with RequestTimeout and forgets the request.
    slow = conn.request_future(SlowEcho(text="z"), 0.05)
    with pytest.raises(RequestTimeout, match="SlowEcho"):
        await slow
    assert conn.pending_requests == 0
    # Cancelled: forgotten too; a late response is dropped.
    cancelled = conn.request_future(SlowEcho(text="c"), 5)
    cancelled.cancel()
    await asyncio.sleep(0)
    assert conn.pending_requests == 0
    inline.gate.set()
    assert await conn.request(SlowEcho(text="y"), 5) == SlowEcho(text="Y")
    # Pending ones fail when the connection ends; a closed one refuses at once.
    inline.gate.clear()
    hanging = conn.request_future(SlowEcho(text="h"), 5)
    await conn.close()
    with pytest.raises(ConnectionClosed):
        await hanging
    with pytest.raises(ConnectionClosed):
        conn.request_future(InlineEcho(text="late"), 5)


async def test_the_data_services_high_seqnos_are_answered_inline(tmp_path: Path) -> None:
    async with running_service(tmp_path) as (ds, coord):
        coord.state = state_with(5, ("ks", "u1", 4, 5, ["n1"]))
        await ds.reconcile()
        await ds.writes.mutate("upsert", "ks", "doc", b"{}", None, "persist")
        tasks: list[asyncio.Task[object] | None] = []
        real = ds.gather.on_high_seqnos

        def spy(msg: HighSeqnos, conn: Connection) -> object:
            tasks.append(asyncio.current_task())
            return real(msg, conn)

        ds.gather.on_high_seqnos = spy  # type: ignore[method-assign]
        transport = TcpTransport()
        server = RpcServer(transport, SECRET, name="n1")
        ds.install(server)
        address = await server.start("127.0.0.1:0")
        try:
            conn = await connect(transport, address, SECRET, name="coord", timeout=5)
            want = ds.local_high_seqnos("ks", [0, 1, 2, 3])
            assert sum(seqno for seqno, _ in want.values()) == 1  # the write is counted
            reply = await conn.request(HighSeqnos(keyspace="ks", partitions=[0, 1, 2, 3]), 5)
            assert reply == HighSeqnosReply(entries=want)
            assert tasks == [None]  # answered in the receive callback
            with pytest.raises(ShardexError) as info:
                await conn.request(HighSeqnos(keyspace="nope", partitions=[0]), 5)
            assert info.value.code is ErrorCode.KEYSPACE_NOT_FOUND
            await conn.close()
        finally:
            await server.stop()
